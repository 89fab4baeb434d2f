/*-------------------------------------------------------------------------
 *
 * relay.h
 *		Shared declarations of outbox-relay, the reference publisher of the
 *		outbox extension.
 *
 * The relay is one single-threaded process: one libpq connection (claim,
 * ack, fail, renew, LISTEN) and one sink (a module behind the interface of
 * sink.h: stdout, a file, an HTTP(S) endpoint, or a message broker).  It
 * claims a batch, has the sink deliver its commands, and reports the
 * outcome of the whole batch: one array ack for the
 * delivered commands and one fail per failed command.  Every call carries
 * the token the claim returned (opaque text), so a relay whose lease was
 * taken over is refused (SQLSTATE OB001) and changes nothing.
 * With --stream the batch is one of a stream's subscription, leased,
 * acked (one ack_batch, naming the failed commands) and renewed as a whole
 * (db.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_RELAY_H
#define OUTBOX_RELAY_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#define RELAY_NAME			"outbox-relay"
/* RELAY_VERSION comes from outbox.control's default_version (Makefile). */
#ifndef RELAY_VERSION
#error "RELAY_VERSION must be defined (make sets it from outbox.control)"
#endif

/* Exit codes (documented in --help and in the README). */
#define RELAY_EXIT_OK		0	/* stopped by a signal, or --drain found no work */
#define RELAY_EXIT_RUNTIME	1	/* fatal database error, or the sink broke */
#define RELAY_EXIT_USAGE	2	/* bad command line or sink URL */

/* A growable string. */
typedef struct StrBuf
{
	char	   *data;
	size_t		len;
	size_t		cap;
} StrBuf;

/* Command line. */
typedef struct RelayOptions
{
	const char *dsn;			/* libpq conninfo, NULL: PG* environment */
	const char *sink;			/* the sink's URL (sink.h) */
	int			batch;			/* claim batch size */
	double		lease;			/* lease in seconds, 0: server default */
	const char *kinds;			/* text[] literal, NULL: all kinds */
	const char *stream;			/* --stream: claim batches of this stream */
	const char *subscription;	/* --subscription (set with --stream) */
	char	   *worker;			/* worker name (lease owner) */
	double		poll;			/* backstop poll interval, seconds */
	double		timeout;		/* HTTP total timeout, seconds */
	double		connect_timeout;	/* HTTP connect timeout, seconds */
	int			concurrency;	/* HTTP requests in flight at once */
	const char **headers;		/* extra HTTP headers */
	int			nheaders;
	bool		drain;			/* exit when a claim finds nothing */
	bool		claim_sync;		/* claims wait for their WAL flush */
	bool		ack_async;		/* acks do not wait for their WAL flush */
	bool		handover;		/* acks take the keys' next commands
								 * (ack_handover) */
	const char *metrics;		/* HOST:PORT of the /metrics endpoint, or NULL */
	double		probe_interval; /* idle seconds before the sink is probed, 0:
								 * never */
	bool		citus;			/* --citus: a relay per node (citus.c) */
	double		citus_refresh;	/* --citus: seconds between node lists */
	int			verbose;
} RelayOptions;

/* Where one claimed command stands within its batch. */
typedef enum CmdState
{
	CMD_TODO,					/* not delivered yet (or held: sink down) */
	CMD_DELIVERED,				/* the sink accepted it: ack it */
	CMD_FAILED,					/* the sink refused it: fail it */
	CMD_DONE					/* outcome reported, or the lease was lost */
} CmdState;

/* At most this many producer headers a command (the server's limit too). */
#define RELAY_MAX_HEADERS	32

/* A producer's header of a command (commit_decision's headers). */
typedef struct RelayHeader
{
	const char *name;			/* an RFC 9110 token, as the producer wrote it */
	const char *value;			/* no control characters (the server checks) */
} RelayHeader;

/* One claimed command. */
typedef struct RelayCommand
{
	char	   *command_id;
	char	   *run_id;
	char	   *kind;
	long long	seq;			/* the deciding event's seq in its run */
	const char *ordering_key;	/* the command's ordering key, or NULL when
								 * it is unordered */
	char	   *payload;		/* JSON text (jsonb output) */
	char	   *token;			/* the lease token (never logged) */
	int			deliveries;
	const char *headers_json;	/* the producer's headers as a JSON object, or
								 * NULL when it gave none */
	RelayHeader *headers;		/* the same, one by one (malloc'd) */
	int			nheaders;
	char	   *header_text;	/* what headers[] points into (malloc'd) */
	CmdState	state;
	bool		fatal;			/* CMD_FAILED: no retry */
	char	   *error;			/* CMD_FAILED: what went wrong */
} RelayCommand;

/* One claimed batch. */
typedef struct RelayBatch
{
	RelayCommand *cmds;
	int			n;
	double		lease_end;		/* monotonic time the first lease ends */
	double		renew_at;		/* monotonic time to renew the leases */
	PGresult   *res;			/* the claim result the strings point into */
	/* main.c: the batch's times, for the metrics and the -vv trace */
	double		claimed_at;		/* monotonic time of the claim's result */
	double		woke;			/* wall ms: a notification before the claim */
	double		claim_sent;		/* wall ms */
	double		claimed_wall;	/* wall ms */
	double		delivered_wall; /* wall ms: the sink returned */
	bool		submitted;		/* handed to the sink, not settled (sink.h) */
	double		submitted_at;	/* monotonic time it was handed over */
	double		settle_began;	/* monotonic time settle began, or 0 */
} RelayBatch;

/* Cumulative counters, printed in the summary line. */
typedef struct RelayStats
{
	long long	batches;
	long long	claimed;
	long long	handed;			/* of claimed: handed over by acks */
	long long	delivered;
	long long	acked;
	long long	stale;
	long long	retried;
	long long	dead;
	long long	renewed;
	long long	reconnects;
	long long	wakeups;
} RelayStats;

/* util.c */
extern RelayOptions relay_opts;
extern RelayStats relay_stats;
extern volatile sig_atomic_t relay_stop;		/* 1: stop claiming; 2: interrupt */
extern volatile sig_atomic_t relay_reopen;	/* SIGHUP: reopen a file sink */
extern double relay_now(void);
extern void relay_log(const char *fmt,...) __attribute__((format(printf, 1, 2)));
extern void relay_debug(const char *fmt,...) __attribute__((format(printf, 1, 2)));
extern void *relay_malloc(size_t size);
extern char *relay_strdup(const char *s);
extern char *relay_default_worker(void);
extern void sb_init(StrBuf *sb);
extern void sb_free(StrBuf *sb);
extern void sb_reset(StrBuf *sb);
extern void sb_append(StrBuf *sb, const char *s, size_t len);
extern void sb_puts(StrBuf *sb, const char *s);
extern void sb_printf(StrBuf *sb, const char *fmt,...) __attribute__((format(printf, 2, 3)));
extern void sb_json_string(StrBuf *sb, const char *s);
extern void sb_array_elem(StrBuf *sb, const char *s);
extern void relay_command_json(StrBuf *sb, const RelayCommand *cmd);
extern char *relay_clean_error(const char *s, size_t maxlen);
extern void relay_sleep(double seconds);
extern void relay_signal_init(void);
extern int	relay_signal_fd(void);
extern void relay_drain_signal_fd(void);
extern void relay_signal_reinit(void);

/* db.c */
typedef enum DbResult
{
	DB_OK,
	DB_RETRY,					/* transient; the connection may be gone */
	DB_FATAL					/* configuration error: exit 1 */
} DbResult;

extern PGconn *db_open(void);
extern bool db_connected(void);
extern DbResult db_connect(void);
extern void db_disconnect(void);
extern DbResult db_claim(RelayBatch *batch);
extern DbResult db_report(RelayBatch *batch);
extern DbResult db_renew(RelayBatch *batch);
extern bool db_wait(double timeout);
extern DbResult db_async_claim(RelayBatch *batch);
extern bool db_async_report(RelayBatch *batch, RelayBatch *handed);
extern bool db_async_pending(const RelayBatch *batch);
extern void db_async_collect(const RelayBatch *until, bool wait);
extern void batch_free(RelayBatch *batch);

/* citus.c */
extern void citus_supervise(void);

/* sink.c and the sink modules: see sink.h */

/* metrics.c */
typedef enum MetricsFailure
{
	METRICS_FAIL_RETRY,			/* SINK_RETRY */
	METRICS_FAIL_FATAL,			/* SINK_FATAL */
	METRICS_FAIL_OUTAGE,		/* SINK_UNAVAILABLE: held */
	METRICS_NFAILURES
} MetricsFailure;

extern bool metrics_parse(const char *spec, char **host, char **port);
extern bool metrics_start(const char *spec, char **errmsg);
extern void metrics_publish(void);
extern void metrics_claimed(int n);
extern void metrics_batch_done(int n, double seconds);
extern void metrics_sink_probed(bool available);
extern void metrics_sink_failure(MetricsFailure class);
extern void metrics_sink_done(bool available, double seconds);
extern void metrics_stop(void);

#endif							/* OUTBOX_RELAY_H */
