/*-------------------------------------------------------------------------
 *
 * sink.h
 *		The interface between outbox-relay's loop and its sinks: stdout, a
 *		file, an HTTP(S) endpoint, and the message brokers.
 *
 * A sink is a module: one file src/relay/sink_NAME.c defining
 *
 *		const SinkOps sink_NAME_ops = {...};
 *
 * The registry (sink.c) lists the modules the relay was built with; the
 * Makefile builds sink_NAME.c, and adds NAME to the list, when its client
 * library is present: one line RELAY_PKG_NAME = PKG-CONFIG-MODULE (the
 * built-in sinks have no such line and are always built).  So a new broker
 * is one file plus one line.
 *
 * The relay uses a sink through these calls, all from its one thread:
 *
 *	open(url, &sink, &err)
 *		Parse the URL (sink_url_parse and sink_url_check_options do the
 *		common part), check every option, and allocate the sink.  A URL or
 *		option that is wrong is SINK_OPEN_CONFIG: the relay prints the one
 *		line `err` (no URL secrets in it: name the option, not its value)
 *		and exits 2 before touching the database.  A resource that cannot
 *		be had now (a file that cannot be created) is SINK_OPEN_FAILED: exit
 *		1.  Brokers should not connect here, or not wait for it: a broker
 *		that is down at start-up is an outage, not a configuration error,
 *		and deliver reports it as such.  `err` is a malloc'd string the
 *		relay frees.
 *
 *	deliver(sink, batch, tick, arg)
 *		Deliver every command of the batch whose state is CMD_TODO (others
 *		must be left alone: their lease was lost or their outcome is known)
 *		and record each one's outcome with sink_outcome():
 *		  SINK_OK      the broker confirmed it (Kafka delivery report, AMQP
 *		               confirm, JetStream PubAck, XADD reply, PUBACK, 2xx);
 *		               the relay acks it;
 *		  SINK_RETRY   this command failed for a reason that may pass (a
 *		               timeout, a 5xx): the relay fails it as retryable and
 *		               the server makes it available again after a backoff;
 *		  SINK_FATAL   the broker refused this command itself (too large, a
 *		               4xx about the body): it goes dead at once;
 *		  SINK_UNAVAILABLE  the broker is down, unreachable, or refuses the
 *		               relay (authentication, authorization, no such topic
 *		               or endpoint): not the command's fault.  The command
 *		               stays CMD_TODO (its error is kept for the logs).
 *		Commands never attempted stay CMD_TODO too.  Return SINK_OK, or
 *		SINK_UNAVAILABLE when the broker was found unavailable: the relay
 *		then acks and fails what has an outcome, keeps the rest of the
 *		batch (renewing its leases, so no delivery is spent on an outage),
 *		stops claiming, logs one line, backs off and calls deliver again
 *		with the same batch; on a stop request it hands them back as
 *		retryable failures.  Never report SINK_OK before the broker's
 *		confirmation: a sink keeps as many messages of the batch in flight
 *		as it likes (bounded by relay_opts.concurrency or its own window)
 *		and returns once every one of them is settled.  While waiting, call
 *		tick(arg) at least every 100 ms: it renews the batch's leases; when
 *		it returns false (a second SIGTERM), stop waiting, give what is
 *		still unsettled SINK_RETRY ("delivery interrupted") and return.
 *
 *	submit(sink, batch), settle(sink, batch, tick, arg)	(NULL: no overlap)
 *		Deliver now, confirm later: submit hands the batch's CMD_TODO
 *		commands to the broker (as many as the window allows) and returns
 *		without waiting for a confirmation; settle then does what deliver
 *		does for that batch (sends the rest, waits until every command is
 *		settled, returns the same results), serving the confirmations of
 *		another submitted batch meanwhile.  The relay submits the batch it
 *		claimed ahead while the current one waits for its confirmations
 *		(from tick, called within settle, so call tick often: every 10 ms
 *		or so while waiting): at most two batches are submitted and not
 *		settled, and every
 *		submitted batch is settled (also when the relay stops: tick returns
 *		false then), before the sink is closed.  deliver is submit and
 *		settle.  A sink whose library cannot keep two batches apart (a
 *		reply that names no message, a window per call) leaves both NULL
 *		and is delivered a batch at a time.
 *
 *	confirm(sink, &err)				(NULL: nothing to do)
 *		Called after deliver and before the acks.  For sinks that buffer
 *		what deliver accepted (stdout, a file: fflush and fdatasync).
 *		False with a malloc'd `err`: everything delivered since the last
 *		confirm becomes a retryable failure and the relay exits 1.
 *
 *	reopen(sink, &err)				(NULL: nothing to do)
 *		SIGHUP: reopen an output file.  False with `err`: exit 1.
 *
 *	probe(sink, &err)				(NULL: no probe)
 *		The relay is idle (no delivery for --probe-interval seconds): check
 *		cheaply, without publishing anything or causing any effect at the
 *		broker, that the broker is reachable and accepts the relay, waiting
 *		at most about --connect-timeout (the relay waits for nothing else
 *		meanwhile).  SINK_OK or SINK_UNAVAILABLE with a malloc'd `err`;
 *		outbox_relay_sink_up follows the answer.  A sink that connects
 *		lazily may connect here, and keep the connection for the next
 *		batch.
 *
 *	close(sink)
 *		Flush, disconnect and free.  Called once, also after a failed
 *		deliver.
 *
 *	describe(sink)					(NULL: the URL without its password)
 *		What the sink is, for the logs.
 *
 * Messages.  The body of a message is the command's JSON object (see
 * sink_command_json); brokers with headers or properties carry command_id,
 * run_id, kind and deliveries in them as well, and use command_id as the
 * message id where the broker has one, so that a redelivery is a
 * detectable duplicate.  They carry seq too, and the producer's headers
 * (RelayCommand.headers: names that are RFC 9110 tokens, values without
 * control characters, as the server checked them) as the broker's own
 * headers; sink_header_reserved names the ones no sink passes on.  Text that comes from producers (ids, kinds,
 * broker error strings) goes into error texts through sink_outcome, which
 * makes it printable.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_RELAY_SINK_H
#define OUTBOX_RELAY_SINK_H

#include <stdio.h>

/* libpq's string buffers; their header expects this macro of c.h */
#ifndef pg_attribute_printf
#define pg_attribute_printf(f, a) __attribute__((format(printf, f, a)))
#endif
#include <pqexpbuffer.h>

#include "relay.h"

/* Result of a delivery (per command) or of a batch (see deliver above). */
typedef enum SinkResult
{
	SINK_OK,					/* confirmed by the broker */
	SINK_RETRY,					/* failed; retry after a backoff */
	SINK_FATAL,					/* refused; do not retry */
	SINK_UNAVAILABLE			/* the broker is down or refuses the relay */
} SinkResult;

/* Result of open. */
typedef enum SinkOpenResult
{
	SINK_OPEN_OK,
	SINK_OPEN_CONFIG,			/* bad URL or option: exit 2 */
	SINK_OPEN_FAILED			/* could not be opened now: exit 1 */
} SinkOpenResult;

typedef struct Sink Sink;

/* Called while deliveries are in progress; false aborts them. */
typedef bool (*SinkTick) (void *arg);

/* A sink module. */
typedef struct SinkOps
{
	const char *name;			/* module name, as in RELAY_PKG_NAME */
	const char *const *schemes;	/* URL schemes it serves, NULL-terminated;
								 * "stdout" and "file" match without "//" */
	const char *usage;			/* --help lines: "  kafka://HOST:PORT/TOPIC ..." */
	SinkOpenResult (*open) (const char *url, Sink **sink, char **err);
	SinkResult	(*deliver) (Sink *sink, RelayBatch *batch, SinkTick tick, void *arg);
	SinkResult	(*submit) (Sink *sink, RelayBatch *batch);
	SinkResult	(*settle) (Sink *sink, RelayBatch *batch, SinkTick tick, void *arg);
	bool		(*confirm) (Sink *sink, char **err);
	bool		(*reopen) (Sink *sink, char **err);
	SinkResult	(*probe) (Sink *sink, char **err);
	void		(*close) (Sink *sink);
	const char *(*describe) (Sink *sink);
} SinkOps;

/*
 * Every module's sink begins with this header (its first member), which
 * sink_open fills in after the module's open.
 */
struct Sink
{
	const SinkOps *ops;
	char	   *url;			/* as given to --sink */
	char	   *shown;			/* the URL with its password masked */
};

/* A URL taken apart: scheme://[user[:password]@]hosts[/path][?query]. */
typedef struct SinkUrl
{
	char	   *scheme;
	char	   *user;			/* NULL when absent; percent-decoded */
	char	   *password;		/* NULL when absent; percent-decoded */
	char	   *hosts;			/* "HOST:PORT[,HOST:PORT...]", as given */
	char	   *path;			/* after the first '/', percent-decoded; "" */
	int			nopts;
	char	  **keys;			/* query options, percent-decoded */
	char	  **values;
} SinkUrl;

/* A host and port taken from SinkUrl.hosts. */
typedef struct SinkHost
{
	char	   *host;
	int			port;
} SinkHost;

/* sink.c: the registry and what every module may use */
extern SinkOpenResult sink_open(const char *url, Sink **sink, char **err);
extern SinkResult sink_deliver(Sink *sink, RelayBatch *batch, SinkTick tick, void *arg);
extern bool sink_can_submit(Sink *sink);
extern SinkResult sink_submit(Sink *sink, RelayBatch *batch);
extern SinkResult sink_settle(Sink *sink, RelayBatch *batch, SinkTick tick, void *arg);
extern bool sink_confirm(Sink *sink, char **err);
extern bool sink_reopen(Sink *sink, char **err);
extern SinkResult sink_probe(Sink *sink, char **err);
extern void sink_close(Sink *sink);
extern const char *sink_describe(Sink *sink);
extern void sink_print_usage(FILE *out);
extern const char *sink_names(void);

extern void sink_outcome(RelayCommand *cmd, SinkResult r, const char *error);
extern void sink_command_json(PQExpBuffer buf, const RelayCommand *cmd);
extern char *sink_errorf(const char *fmt,...) __attribute__((format(printf, 1, 2)));
extern bool sink_url_parse(const char *url, SinkUrl *u, char **err);
extern bool sink_url_check_options(const SinkUrl *u, const char *const *allowed, char **err);
extern const char *sink_url_option(const SinkUrl *u, const char *key);
extern bool sink_url_int_option(const SinkUrl *u, const char *key, long min, long max,
								long *value, char **err);
extern int	sink_url_hosts(const SinkUrl *u, int default_port, SinkHost **hosts, char **err);
extern void sink_url_free(SinkUrl *u);
extern char *sink_read_secret(const char *scheme, const char *path, char **err);
extern void sink_free_secret(char *secret);
extern void sink_hosts_free(SinkHost *hosts, int n);
extern SinkOpenResult sink_url_one_host(const char *url, const char *scheme,
										const char *const *allowed, int default_port,
										const char *password_hint, SinkUrl *u,
										SinkHost **hosts, int *n, char **err);
extern SinkResult sink_ndjson_deliver(FILE *fp, const char *what, RelayBatch *batch,
									  SinkTick tick, void *arg);
extern bool sink_ndjson_flush(FILE *fp, const char *what, bool sync, char **err);

/* Whether a producer header name is one no sink passes on (HTTP framing). */
extern bool sink_header_reserved(const char *name);
/* Whether name is in the NULL-terminated list (case-insensitively). */
extern bool sink_header_listed(const char *name, const char *const *list);

extern void *sink_round(void *rounds, size_t size, int n, const RelayBatch *batch);
extern void *sink_free_round(void *rounds, size_t size, int n, const char *sink);

#endif							/* OUTBOX_RELAY_SINK_H */
