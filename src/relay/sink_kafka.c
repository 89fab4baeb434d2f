/*-------------------------------------------------------------------------
 *
 * sink_kafka.c
 *		The Kafka sink (librdkafka): kafka://HOST:PORT[,HOST:PORT...]/TOPIC.
 *
 * One idempotent producer (enable.idempotence, so acks=all and a bounded,
 * ordered, duplicate-free retry of every message inside librdkafka).  Each
 * command is one message: the key is its ordering key, else its run_id, so
 * the commands of one key (or run) go to one partition in the order the
 * relay produced them; the value is the command's JSON object; the headers
 * are command_id, run_id, seq, kind, deliveries, content-type and
 * ordering_key (when it has one), then the producer's headers (a name the
 * relay sets itself keeps the relay's value).  A batch is produced at once (at most `window` messages in
 * flight) and deliver returns once librdkafka has settled every message
 * with a delivery report: a command is delivered only when its report is
 * a success.  --timeout bounds the wait for one message
 * (message.timeout.ms).
 *
 * Delivery reports that fail are sorted:
 *	 the broker is unreachable, the message timed out, the topic does not
 *	 exist, authentication or authorization failed, the producer hit a
 *	 fatal error (it is then recreated)		unavailable: the batch is held;
 *	 the message itself is refused (too large, invalid or corrupt record)
 *											fatal;
 *	 anything else							retryable.
 * librdkafka's own log goes to the relay's debug log (-v); its errors
 * are kept for the messages of the failed commands.
 *
 * Options (?key=value): config=PATH, a file of librdkafka properties
 * (key=value lines, # comments) for TLS and SASL, so that secrets stay
 * off the command line; window=N, messages in flight (default 10000).
 *
 * Deliver now, confirm later (sink.h: submit, settle): each batch handed
 * over is a round with a generation of its own, carried in every message's
 * opaque with its command's index, so that the delivery reports of the two
 * rounds at most in flight (the batch the relay waits for and the one it
 * claimed ahead) are kept apart; settle returns once its own round is
 * settled, whatever the other's state.  A report of a round that is gone
 * (settled, or abandoned at close) is ignored.  The window counts the
 * messages of both rounds.
 *
 * The relay stays single-threaded: librdkafka runs threads of its own,
 * but its callbacks run in rd_kafka_poll, called from the relay's thread.
 *
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "sink.h"

/*
 * One batch handed to the producer (submit) and not settled yet: at most
 * two at once, the one the relay waits for and the one claimed ahead.
 */
#define KAFKA_ROUNDS 2
typedef struct KafkaRound
{
	RelayBatch *batch;			/* NULL: the slot is free */
	uint32_t	gen;			/* in each of its messages' opaque */
	int			next;			/* the next command to produce */
	int			pending;		/* its messages not settled yet */
	bool		unavailable;	/* a report said the broker is unavailable */
} KafkaRound;

typedef struct KafkaSink
{
	Sink		base;
	rd_kafka_t *rk;
	rd_kafka_topic_t *rkt;		/* the topic, known from the producer's start */
	char	   *brokers;
	char	   *topic;
	char	   *config;			/* path of a properties file, or NULL */
	long		window;
	uint32_t	gen;			/* the last round's generation */
	KafkaRound	rounds[KAFKA_ROUNDS];
	KafkaRound *waiting;		/* the round settle waits for, or NULL */
	int			inflight;		/* messages of all rounds not settled yet */
	bool		fatal;			/* the producer hit a fatal error */
	char		lasterr[512];	/* the last error librdkafka reported */
	char		shown[600];		/* describe() */
} KafkaSink;

static const char *const kafka_schemes[] = {"kafka", NULL};
static const char *const kafka_options[] = {"config", "window", NULL};

/* Set one property; false with *err. */
static bool
kafka_set(rd_kafka_conf_t *conf, const char *key, const char *value, const char *where, char **err)
{
	char		errstr[512];

	if (rd_kafka_conf_set(conf, key, value, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
	{
		*err = sink_errorf("invalid kafka sink configuration%s%s: %s", where ? " in " : "",
						   where ? where : "", errstr);
		return false;
	}
	return true;
}

/* Read a properties file into conf; false with *err. */
static bool
kafka_read_config(rd_kafka_conf_t *conf, const char *path, char **err)
{
	FILE	   *f = fopen(path, "r");
	char		line[4096];
	int			lineno = 0;

	if (f == NULL)
	{
		*err = sink_errorf("invalid kafka sink URL: could not open config file \"%s\": %s",
						   path, strerror(errno));
		return false;
	}
	while (fgets(line, sizeof(line), f) != NULL)
	{
		char	   *p = line;
		char	   *eq;
		char	   *end;
		char		where[600];

		lineno++;
		while (isspace((unsigned char) *p))
			p++;
		end = p + strlen(p);
		while (end > p && isspace((unsigned char) end[-1]))
			*--end = '\0';
		if (*p == '\0' || *p == '#')
			continue;
		eq = strchr(p, '=');
		snprintf(where, sizeof(where), "\"%s\" line %d", path, lineno);
		if (eq == NULL)
		{
			fclose(f);
			*err = sink_errorf("invalid kafka sink configuration in %s: key=value expected", where);
			return false;
		}
		*eq = '\0';
		end = eq;
		while (end > p && isspace((unsigned char) end[-1]))
			*--end = '\0';
		eq++;
		while (isspace((unsigned char) *eq))
			eq++;
		if (!kafka_set(conf, p, eq, where, err))
		{
			fclose(f);
			return false;
		}
	}
	fclose(f);
	return true;
}

/* Sort a failed delivery (or produce call) out. */
static SinkResult
kafka_classify(rd_kafka_resp_err_t err)
{
	switch (err)
	{
		case RD_KAFKA_RESP_ERR_NO_ERROR:
			return SINK_OK;

			/* the message itself */
		case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_INVALID_RECORD:
		case RD_KAFKA_RESP_ERR_INVALID_MSG:
		case RD_KAFKA_RESP_ERR__BAD_MSG:
		case RD_KAFKA_RESP_ERR__INVALID_ARG:
			return SINK_FATAL;

			/* the broker, the topic or the relay's rights */
		case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
		case RD_KAFKA_RESP_ERR__TIMED_OUT:
		case RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE:
		case RD_KAFKA_RESP_ERR__TRANSPORT:
		case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
		case RD_KAFKA_RESP_ERR__RESOLVE:
		case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
		case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
		case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
		case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
		case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
		case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
		case RD_KAFKA_RESP_ERR__AUTHENTICATION:
		case RD_KAFKA_RESP_ERR__SSL:
		case RD_KAFKA_RESP_ERR__FATAL:
		case RD_KAFKA_RESP_ERR__FENCED:
		case RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH:
		case RD_KAFKA_RESP_ERR_PRODUCER_FENCED:
		case RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER:
		case RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID:
		case RD_KAFKA_RESP_ERR_TOPIC_DELETION_DISABLED:
		case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
			return SINK_UNAVAILABLE;

		default:
			return SINK_RETRY;
	}
}

/* librdkafka's log: the relay's debug log. */
static void
kafka_log_cb(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
	(void) rk;
	(void) level;
	relay_debug("kafka: %s: %s", fac, buf);
}

/* librdkafka's errors: remember the last one; a fatal one dooms the producer. */
static void
kafka_error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	KafkaSink  *s = opaque;

	snprintf(s->lasterr, sizeof(s->lasterr), "%s", reason);
	relay_debug("kafka: error: %s", reason);
	if (err == RD_KAFKA_RESP_ERR__FATAL)
	{
		char		buf[512];

		rd_kafka_fatal_error(rk, buf, sizeof(buf));
		snprintf(s->lasterr, sizeof(s->lasterr), "fatal producer error: %s", buf);
		s->fatal = true;
	}
}

/* Delivery report of one message: the outcome of its command. */
static void
kafka_dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	KafkaSink  *s = opaque;
	uintptr_t	tag = (uintptr_t) m->_private;
	uint32_t	gen = (uint32_t) (tag >> 32);
	int			index = (int) (tag & 0xffffffff);
	RelayCommand *cmd;
	SinkResult	r;
	char		msg[1024];
	KafkaRound *rd = NULL;
	int			i;

	for (i = 0; i < KAFKA_ROUNDS; i++)
		if (s->rounds[i].batch != NULL && s->rounds[i].gen == gen)
			rd = &s->rounds[i];
	if (rd == NULL || index < 0 || index >= rd->batch->n)
		return;					/* a report of an earlier, abandoned batch */
	rd->pending--;
	s->inflight--;
	/* the round settle waits for is settled: end the flush that waits */
	if (rd == s->waiting && rd->pending == 0)
		rd_kafka_yield(rk);
	cmd = &rd->batch->cmds[index];
	r = kafka_classify(m->err);
	if (r == SINK_OK)
	{
		sink_outcome(cmd, SINK_OK, NULL);
		return;
	}
	if (m->err == RD_KAFKA_RESP_ERR__PURGE_QUEUE || m->err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT)
	{
		sink_outcome(cmd, SINK_RETRY, "delivery interrupted: the relay was stopped");
		return;
	}
	snprintf(msg, sizeof(msg), "kafka %s: %s%s%s", s->topic, rd_kafka_err2str(m->err),
			 s->lasterr[0] && r == SINK_UNAVAILABLE ? " (last error: " : "",
			 s->lasterr[0] && r == SINK_UNAVAILABLE ? s->lasterr : "");
	if (s->lasterr[0] && r == SINK_UNAVAILABLE)
		strncat(msg, ")", sizeof(msg) - strlen(msg) - 1);
	if (r == SINK_UNAVAILABLE)
		rd->unavailable = true;
	sink_outcome(cmd, r, msg);
}

/* Create the producer; NULL with *err. */
static rd_kafka_t *
kafka_producer(KafkaSink *s, char **err)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_t *rk;
	char		errstr[512];
	char		timeout[32];

	snprintf(timeout, sizeof(timeout), "%ld", (long) (relay_opts.timeout * 1000));
	if (!kafka_set(conf, "bootstrap.servers", s->brokers, NULL, err) ||
		!kafka_set(conf, "client.id", RELAY_NAME, NULL, err) ||
		(s->config != NULL && !kafka_read_config(conf, s->config, err)) ||
		/* after the file: these are not up to it */
		!kafka_set(conf, "enable.idempotence", "true", NULL, err) ||
		!kafka_set(conf, "acks", "all", NULL, err) ||
		!kafka_set(conf, "message.timeout.ms", timeout, NULL, err) ||
		!kafka_set(conf, "linger.ms", "2", NULL, err))
	{
		rd_kafka_conf_destroy(conf);
		return NULL;
	}
	rd_kafka_conf_set_opaque(conf, s);
	rd_kafka_conf_set_dr_msg_cb(conf, kafka_dr_cb);
	rd_kafka_conf_set_error_cb(conf, kafka_error_cb);
	rd_kafka_conf_set_log_cb(conf, kafka_log_cb);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
	{
		rd_kafka_conf_destroy(conf);
		*err = sink_errorf("invalid kafka sink configuration: %s", errstr);
		return NULL;
	}

	/*
	 * Name the topic now, before the first connection is up: its metadata
	 * then comes with the producer's first metadata request.  A topic first
	 * named by a produce call waits for librdkafka's next topic scan (1 s)
	 * with that message unpartitioned.
	 */
	s->rkt = rd_kafka_topic_new(rk, s->topic, NULL);
	if (s->rkt == NULL)
	{
		*err = sink_errorf("invalid kafka sink configuration: %s",
						   rd_kafka_err2str(rd_kafka_last_error()));
		rd_kafka_destroy(rk);
		return NULL;
	}
	return rk;
}

/* True when name is a legal Kafka topic name. */
static bool
kafka_topic_ok(const char *name)
{
	const char *p;

	if (name[0] == '\0' || strlen(name) > 249 || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return false;
	for (p = name; *p; p++)
		if (!isalnum((unsigned char) *p) && *p != '.' && *p != '_' && *p != '-')
			return false;
	return true;
}

/* Open kafka://HOST:PORT[,...]/TOPIC[?config=PATH&window=N]. */
static SinkOpenResult
kafka_open(const char *url, Sink **sink, char **err)
{
	SinkUrl		u;
	SinkHost   *hosts = NULL;
	int			nhosts;
	KafkaSink  *s;
	PQExpBufferData list;
	int			i;
	long		window = 10000;

	if (!sink_url_parse(url, &u, err))
		return SINK_OPEN_CONFIG;
	if (!sink_url_check_options(&u, kafka_options, err) ||
		!sink_url_int_option(&u, "window", 1, 1000000, &window, err))
		goto config;
	if (u.user != NULL)
	{
		*err = sink_errorf("invalid kafka sink URL: no user or password in the URL; put SASL settings in a config=PATH file");
		goto config;
	}
	if (!kafka_topic_ok(u.path))
	{
		*err = sink_errorf("invalid kafka sink URL: kafka://HOST:PORT[,HOST:PORT...]/TOPIC is expected, with a topic of letters, digits, '.', '_' and '-'");
		goto config;
	}
	nhosts = sink_url_hosts(&u, 9092, &hosts, err);
	if (nhosts < 0)
		goto config;

	s = relay_malloc(sizeof(KafkaSink));
	memset(s, 0, sizeof(KafkaSink));
	initPQExpBuffer(&list);
	for (i = 0; i < nhosts; i++)
		appendPQExpBuffer(&list, "%s%s%s%s:%d", i > 0 ? "," : "",
						  strchr(hosts[i].host, ':') ? "[" : "", hosts[i].host,
						  strchr(hosts[i].host, ':') ? "]" : "", hosts[i].port);
	s->brokers = relay_strdup(list.data);
	termPQExpBuffer(&list);
	sink_hosts_free(hosts, nhosts);
	s->topic = relay_strdup(u.path);
	s->config = sink_url_option(&u, "config") ? relay_strdup(sink_url_option(&u, "config")) : NULL;
	s->window = window;
	sink_url_free(&u);
	snprintf(s->shown, sizeof(s->shown), "kafka://%s/%s (librdkafka %s, idempotent, acks=all)",
			 s->brokers, s->topic, rd_kafka_version_str());

	s->rk = kafka_producer(s, err);
	if (s->rk == NULL)
	{
		free(s->brokers);
		free(s->topic);
		free(s->config);
		free(s);
		return SINK_OPEN_CONFIG;
	}
	*sink = &s->base;
	return SINK_OPEN_OK;

config:
	sink_url_free(&u);
	return SINK_OPEN_CONFIG;
}

/* Produce one command's message; a librdkafka error code. */
static rd_kafka_resp_err_t
kafka_produce(KafkaSink *s, KafkaRound *rd, RelayCommand *cmd, int index, PQExpBuffer body)
{
	static const char *const own[] = {"command_id", "run_id", "seq", "kind",
	"deliveries", "content-type", "ordering_key", NULL};
	const char *key = cmd->ordering_key ? cmd->ordering_key : cmd->run_id;
	char		deliveries[16];
	char		seq[24];
	uintptr_t	tag = ((uintptr_t) rd->gen << 32) | (uintptr_t) index;
	rd_kafka_headers_t *hdrs;
	rd_kafka_resp_err_t err;
	int			i;

	resetPQExpBuffer(body);
	sink_command_json(body, cmd);
	snprintf(deliveries, sizeof(deliveries), "%d", cmd->deliveries);
	snprintf(seq, sizeof(seq), "%lld", cmd->seq);
	hdrs = rd_kafka_headers_new(7 + cmd->nheaders);
	rd_kafka_header_add(hdrs, "command_id", -1, cmd->command_id, -1);
	rd_kafka_header_add(hdrs, "run_id", -1, cmd->run_id, -1);
	rd_kafka_header_add(hdrs, "seq", -1, seq, -1);
	rd_kafka_header_add(hdrs, "kind", -1, cmd->kind, -1);
	rd_kafka_header_add(hdrs, "deliveries", -1, deliveries, -1);
	rd_kafka_header_add(hdrs, "content-type", -1, "application/json", -1);
	if (cmd->ordering_key)
		rd_kafka_header_add(hdrs, "ordering_key", -1, cmd->ordering_key, -1);
	for (i = 0; i < cmd->nheaders; i++)
		if (!sink_header_reserved(cmd->headers[i].name) &&
			!sink_header_listed(cmd->headers[i].name, own))
			rd_kafka_header_add(hdrs, cmd->headers[i].name, -1, cmd->headers[i].value, -1);
	err = rd_kafka_producev(s->rk,
							RD_KAFKA_V_RKT(s->rkt),
							RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
							RD_KAFKA_V_KEY(key, strlen(key)),
							RD_KAFKA_V_VALUE(body->data, body->len),
							RD_KAFKA_V_HEADERS(hdrs),
							RD_KAFKA_V_OPAQUE((void *) tag),
							RD_KAFKA_V_END);
	/* on success the message owns the headers */
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		rd_kafka_headers_destroy(hdrs);
	return err;
}

/* The round of a batch, or NULL. */
static KafkaRound *
kafka_round(KafkaSink *s, RelayBatch *batch)
{
	return sink_round(s->rounds, sizeof(s->rounds[0]), KAFKA_ROUNDS, batch);
}

/*
 * Produce what the window allows of the round's commands still to do.  A
 * produce call refused outright settles its command at once.
 */
static void
kafka_produce_round(KafkaSink *s, KafkaRound *rd, PQExpBuffer body)
{
	RelayBatch *batch = rd->batch;

	while (!rd->unavailable && rd->next < batch->n && s->inflight < s->window)
	{
		RelayCommand *cmd = &batch->cmds[rd->next];
		rd_kafka_resp_err_t e;

		if (cmd->state != CMD_TODO)
		{
			rd->next++;
			continue;
		}
		e = kafka_produce(s, rd, cmd, rd->next, body);
		if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL)
			break;				/* poll, then try again */
		if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			char		msg[512];
			SinkResult	r = kafka_classify(e);

			snprintf(msg, sizeof(msg), "kafka %s: %s", s->topic, rd_kafka_err2str(e));
			if (r == SINK_UNAVAILABLE)
				rd->unavailable = true;
			sink_outcome(cmd, r, msg);
		}
		else
		{
			rd->pending++;
			s->inflight++;
		}
		rd->next++;
	}
}

/*
 * Start delivering the batch (sink.h: submit): produce its messages, as
 * many as the window allows, and return without waiting for a delivery
 * report; settle waits for them.  A producer that hit a fatal error is
 * replaced first when no other round needs it.
 */
static SinkResult
kafka_submit(Sink *base, RelayBatch *batch)
{
	KafkaSink  *s = (KafkaSink *) base;
	KafkaRound *rd = sink_free_round(s->rounds, sizeof(s->rounds[0]), KAFKA_ROUNDS, "kafka");
	PQExpBufferData body;

	if (s->fatal && s->rounds[0].batch == NULL && s->rounds[1].batch == NULL)
	{
		char	   *err = NULL;

		/* a producer that hit a fatal error is useless: start a new one */
		rd_kafka_topic_destroy(s->rkt);
		s->rkt = NULL;
		rd_kafka_destroy(s->rk);
		s->rk = kafka_producer(s, &err);
		if (s->rk == NULL)
		{
			relay_log("%s", err);
			exit(RELAY_EXIT_RUNTIME);
		}
		s->fatal = false;
	}
	memset(rd, 0, sizeof(*rd));
	rd->batch = batch;
	rd->gen = ++s->gen;
	if (s->fatal)
	{
		int			i;

		/* the old producer still settles another round: wait for it */
		rd->unavailable = true;
		for (i = 0; i < batch->n; i++)
			if (batch->cmds[i].state == CMD_TODO)
				sink_outcome(&batch->cmds[i], SINK_UNAVAILABLE, s->lasterr);
		return SINK_UNAVAILABLE;
	}
	initPQExpBuffer(&body);
	kafka_produce_round(s, rd, &body);
	termPQExpBuffer(&body);
	return rd->unavailable ? SINK_UNAVAILABLE : SINK_OK;
}

/*
 * Wait until every message of a submitted batch is settled by its delivery
 * report (sink.h: settle), producing the rest of it as the window frees
 * up; the reports of the other round are served meanwhile.
 */
static SinkResult
kafka_settle(Sink *base, RelayBatch *batch, SinkTick tick, void *arg)
{
	KafkaSink  *s = (KafkaSink *) base;
	KafkaRound *rd = kafka_round(s, batch);
	PQExpBufferData body;
	bool		stop = false;
	bool		unavailable;

	if (rd == NULL)
		return SINK_OK;			/* not submitted: nothing to wait for */
	initPQExpBuffer(&body);
	for (;;)
	{
		if (!stop)
			kafka_produce_round(s, rd, &body);
		if (rd->pending == 0 && (stop || rd->unavailable || rd->next >= batch->n))
			break;

		/*
		 * Once the batch is produced nothing more comes before its reports,
		 * so linger.ms would only be waited out: rd_kafka_flush sends what
		 * librdkafka holds at once, ignoring linger.ms, and serves the
		 * delivery reports as rd_kafka_poll does.  But it waits for the
		 * other round's messages too: while that one has messages in
		 * flight, rd_kafka_poll serves the reports instead, returning as
		 * soon as some came (and the one that settles this round ends it:
		 * rd_kafka_yield in kafka_dr_cb).  This round's messages were
		 * produced a batch earlier then, so linger.ms is behind them.
		 * 10 ms at a time: tick may submit the next batch (sink.h).
		 */
		s->waiting = rd;
		if ((stop || rd->unavailable || rd->next >= batch->n) && s->inflight == rd->pending)
			(void) rd_kafka_flush(s->rk, 10);
		else
			rd_kafka_poll(s->rk, 10);
		s->waiting = NULL;
		if (!stop && tick != NULL && !tick(arg))
		{
			/* interrupted: purge what librdkafka still holds, all rounds */
			stop = true;
			rd_kafka_purge(s->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
		}
	}
	termPQExpBuffer(&body);
	unavailable = rd->unavailable;
	memset(rd, 0, sizeof(*rd));
	return unavailable ? SINK_UNAVAILABLE : SINK_OK;
}

/* Deliver the batch: submit it, then settle it. */
static SinkResult
kafka_deliver(Sink *base, RelayBatch *batch, SinkTick tick, void *arg)
{
	SinkResult	r = kafka_submit(base, batch);
	SinkResult	r2 = kafka_settle(base, batch, tick, arg);

	return r == SINK_UNAVAILABLE ? r : r2;
}

/*
 * The idle probe: a metadata request for the topic (no message is
 * produced), bounded by --connect-timeout.  The broker must answer and
 * know the topic with a leader for each partition.
 */
static SinkResult
kafka_probe(Sink *base, char **err)
{
	KafkaSink  *s = (KafkaSink *) base;
	const struct rd_kafka_metadata *md = NULL;
	rd_kafka_resp_err_t e;
	int			i;

	if (s->fatal)
	{
		*err = sink_errorf("kafka %s: %s", s->topic, s->lasterr);
		return SINK_UNAVAILABLE;
	}
	rd_kafka_poll(s->rk, 0);
	e = rd_kafka_metadata(s->rk, 0, s->rkt, &md, (int) (relay_opts.connect_timeout * 1000));
	if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		*err = sink_errorf("kafka %s: metadata request: %s", s->topic, rd_kafka_err2str(e));
		return SINK_UNAVAILABLE;
	}
	if (md->topic_cnt < 1 || md->topics[0].err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		*err = sink_errorf("kafka %s: %s", s->topic,
						   md->topic_cnt < 1 ? "no metadata for the topic" :
						   rd_kafka_err2str(md->topics[0].err));
		rd_kafka_metadata_destroy(md);
		return SINK_UNAVAILABLE;
	}
	for (i = 0; i < md->topics[0].partition_cnt; i++)
		if (md->topics[0].partitions[i].leader < 0)
		{
			*err = sink_errorf("kafka %s: partition %d has no leader", s->topic,
							   md->topics[0].partitions[i].id);
			rd_kafka_metadata_destroy(md);
			return SINK_UNAVAILABLE;
		}
	rd_kafka_metadata_destroy(md);
	return SINK_OK;
}

/* Flush what is left (briefly) and destroy the producer. */
static void
kafka_close(Sink *base)
{
	KafkaSink  *s = (KafkaSink *) base;

	/* no report may reach a batch the relay has freed */
	memset(s->rounds, 0, sizeof(s->rounds));
	if (s->rk != NULL)
	{
		rd_kafka_flush(s->rk, 1000);
		if (s->rkt != NULL)
			rd_kafka_topic_destroy(s->rkt);
		rd_kafka_destroy(s->rk);
	}
	free(s->brokers);
	free(s->topic);
	free(s->config);
	free(s);
}

/* What the sink is, for the logs. */
static const char *
kafka_describe(Sink *base)
{
	return ((KafkaSink *) base)->shown;
}

const SinkOps sink_kafka_ops = {
	.name = "kafka",
	.schemes = kafka_schemes,
	.usage =
	"  kafka://HOST:PORT[,HOST:PORT...]/TOPIC[?config=PATH&window=N]\n"
	"                      idempotent producer, acks=all; key = ordering key,\n"
	"                      else run_id; headers command_id, run_id, seq, kind,\n"
	"                      deliveries, ordering_key and the producer's; acked on a\n"
	"                      successful delivery report (--timeout bounds the wait)\n",
	.open = kafka_open,
	.deliver = kafka_deliver,
	.submit = kafka_submit,
	.settle = kafka_settle,
	.probe = kafka_probe,
	.close = kafka_close,
	.describe = kafka_describe,
};
