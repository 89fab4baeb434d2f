/*-------------------------------------------------------------------------
 *
 * sink_redis.c
 *		The Redis Streams sink (hiredis):
 *		redis://HOST:PORT[/DB]?stream=KEY[&maxlen=N][&user=U][&password_file=PATH]
 *
 * Each command is one stream entry, XADD KEY [MAXLEN ~ N] * with the
 * fields command_id, run_id, seq, kind, deliveries and payload (the
 * payload's JSON text), then one field "header:NAME" per producer header
 * (the prefix keeps them apart from the relay's fields).  A batch is one
 * pipeline: every XADD is written at once and a command is delivered when
 * its reply (the entry's id) has come back.  The connection is opened on
 * the first batch (AUTH and SELECT ride at the head of the pipeline) and
 * kept; it is non-blocking, polled at most 10 ms at a time so that tick
 * renews the leases, hands over the next batch and a second SIGTERM
 * interrupts.  --connect-timeout bounds the connection, --timeout the
 * wait for the next reply.
 *
 * Deliver now, confirm later (sink.h: submit, settle): submit appends a
 * batch's XADDs to the pipeline and writes them without waiting; settle
 * takes the replies in.  At most two batches (rounds) are on the
 * connection at once, the one the relay waits for and the one it claimed
 * ahead; Redis answers one connection's commands in the order they were
 * sent, so the replies are the oldest round's first, then the next one's,
 * and each reply settles exactly its own XADD.  A connection that breaks
 * holds what is unanswered in both rounds.
 *
 * Outcomes:
 *	 no connection, a lost connection, no reply within --timeout (e.g. a
 *	 CLIENT PAUSE), and the errors NOAUTH, WRONGPASS, NOPERM, LOADING, BUSY,
 *	 MASTERDOWN, READONLY, MISCONF, OOM, WRONGTYPE (the key is not a
 *	 stream), MOVED, ASK, CLUSTERDOWN, TRYAGAIN, or an error to AUTH or
 *	 SELECT											unavailable: held;
 *	 an entry too large for the server (proto-max-bulk-len)	fatal;
 *	 any other error reply							retryable.
 * When the connection is lost with XADDs unanswered, those commands are
 * held and sent again: an entry may then be in the stream twice, with the
 * same command_id.
 *
 * The password is never taken from the URL (it would show in ps): it is
 * read from password_file, or from the environment variable
 * OUTBOX_RELAY_REDIS_PASSWORD.
 *
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "sink.h"

/*
 * One batch whose XADDs were appended to the connection (submit) and not
 * settled yet: at most two at once, the one the relay waits for and the
 * one claimed ahead.  The replies come in the order the XADDs were sent:
 * the oldest round's first.
 */
#define REDIS_ROUNDS 2
typedef struct RedisRound
{
	RelayBatch *batch;			/* NULL: the slot is free */
	unsigned	order_no;		/* rounds are answered in this order */
	int		   *order;			/* command index of each XADD sent */
	int			nsent;
	int			got;			/* replies taken in */
	bool		unavailable;	/* a reply or the connection said so */
} RedisRound;

typedef struct RedisSink
{
	Sink		base;
	char	   *host;
	int			port;
	long		db;
	char	   *stream;
	long		maxlen;			/* 0: no MAXLEN */
	char	   *user;
	char	   *password;
	redisContext *c;			/* NULL: not connected */
	bool		fresh;			/* connected, pipeline not written yet */
	bool		wpending;		/* appended commands not written yet */
	int			nsetup;			/* AUTH and SELECT replies still to come */
	int			nsetup_sent;	/* AUTH and SELECT sent on this connection */
	char		setup_err[512];	/* AUTH's or SELECT's error, or "" */
	double		deadline;		/* the next reply is due by then */
	unsigned	order_no;		/* the last round's number */
	RedisRound	rounds[REDIS_ROUNDS];
	char		shown[600];
} RedisSink;

static const char *const redis_schemes[] = {"redis", NULL};
static const char *const redis_options[] = {"stream", "maxlen", "user", "password_file", NULL};

/* Open redis://HOST:PORT[/DB]?stream=KEY[&...]: parse and check only. */
static SinkOpenResult
redis_open(const char *url, Sink **sink, char **err)
{
	SinkUrl		u;
	SinkHost   *hosts = NULL;
	int			nhosts;
	RedisSink  *s;
	long		maxlen = 0;
	long		db = 0;
	const char *stream;
	const char *pwfile;
	const char *env = getenv("OUTBOX_RELAY_REDIS_PASSWORD");

	if (!sink_url_parse(url, &u, err))
		return SINK_OPEN_CONFIG;
	if (!sink_url_check_options(&u, redis_options, err) ||
		!sink_url_int_option(&u, "maxlen", 1, 1000000000000L, &maxlen, err))
		goto config;
	if (u.user != NULL)
	{
		*err = sink_errorf("invalid redis sink URL: no user or password in the URL (they would show in ps); use user=NAME and password_file=PATH or OUTBOX_RELAY_REDIS_PASSWORD");
		goto config;
	}
	stream = sink_url_option(&u, "stream");
	if (stream == NULL || stream[0] == '\0')
	{
		*err = sink_errorf("invalid redis sink URL: redis://HOST:PORT[/DB]?stream=KEY is expected (no stream given)");
		goto config;
	}
	if (u.path[0] != '\0')
	{
		char	   *end;

		errno = 0;
		db = strtol(u.path, &end, 10);
		if (errno != 0 || *end != '\0' || db < 0 || db > 1000000)
		{
			*err = sink_errorf("invalid redis sink URL: the path must be a database number");
			goto config;
		}
	}
	nhosts = sink_url_hosts(&u, 6379, &hosts, err);
	if (nhosts < 0)
		goto config;
	if (nhosts != 1)
	{
		sink_hosts_free(hosts, nhosts);
		*err = sink_errorf("invalid redis sink URL: one HOST:PORT is expected");
		goto config;
	}

	s = relay_malloc(sizeof(RedisSink));
	memset(s, 0, sizeof(RedisSink));
	s->host = relay_strdup(hosts[0].host);
	s->port = hosts[0].port;
	sink_hosts_free(hosts, nhosts);
	s->db = db;
	s->stream = relay_strdup(stream);
	s->maxlen = maxlen;
	if (sink_url_option(&u, "user") != NULL)
		s->user = relay_strdup(sink_url_option(&u, "user"));
	pwfile = sink_url_option(&u, "password_file");
	if (pwfile != NULL)
	{
		s->password = sink_read_secret("redis", pwfile, err);
		if (s->password == NULL)
		{
			free(s->host);
			free(s->stream);
			free(s->user);
			free(s);
			sink_url_free(&u);
			return SINK_OPEN_FAILED;	/* a file that cannot be read now */
		}
	}
	else if (env != NULL && env[0] != '\0')
		s->password = relay_strdup(env);
	snprintf(s->shown, sizeof(s->shown), "redis://%s:%d/%ld stream %s%s", s->host, s->port,
			 s->db, s->stream, s->password ? " (with AUTH)" : "");
	sink_url_free(&u);
	*sink = &s->base;
	return SINK_OPEN_OK;

config:
	sink_url_free(&u);
	return SINK_OPEN_CONFIG;
}

/* Drop the connection (a new one is made for the next batch). */
static void
redis_disconnect(RedisSink *s)
{
	if (s->c != NULL)
		redisFree(s->c);
	s->c = NULL;
	s->fresh = false;
	s->wpending = false;
	s->nsetup = 0;
	s->setup_err[0] = '\0';
}

/* Start connecting (non-blocking); false with msg. */
static bool
redis_connect(RedisSink *s, char *msg, size_t msglen)
{
	s->c = redisConnectNonBlock(s->host, s->port);
	if (s->c == NULL || s->c->err)
	{
		snprintf(msg, msglen, "redis %s:%d: could not connect: %s", s->host, s->port,
				 s->c ? s->c->errstr : "out of memory");
		redis_disconnect(s);
		return false;
	}
	return true;
}

/* Sort an error reply out. */
static SinkResult
redis_classify(const char *err)
{
	static const char *const held[] = {"NOAUTH", "WRONGPASS", "NOPERM", "LOADING", "BUSY",
		"MASTERDOWN", "READONLY", "MISCONF", "OOM", "WRONGTYPE", "MOVED", "ASK",
	"CLUSTERDOWN", "TRYAGAIN", NULL};
	int			i;

	for (i = 0; held[i] != NULL; i++)
	{
		size_t		len = strlen(held[i]);

		if (strncmp(err, held[i], len) == 0 && (err[len] == ' ' || err[len] == '\0'))
			return SINK_UNAVAILABLE;
	}
	if (strstr(err, "exceeds maximum allowed size") != NULL ||
		strstr(err, "invalid bulk length") != NULL)
		return SINK_FATAL;
	return SINK_RETRY;
}

/* Append one command's XADD to the pipeline. */
static void
redis_append_xadd(RedisSink *s, RelayCommand *cmd)
{
	const char *argv[20 + 2 * RELAY_MAX_HEADERS];
	size_t		argvlen[20 + 2 * RELAY_MAX_HEADERS];
	char	   *hnames[RELAY_MAX_HEADERS];
	char		maxlen[32];
	char		deliveries[16];
	char		seq[24];
	int			n = 0;
	int			j;

#define ARG(str) (argv[n] = (str), argvlen[n] = strlen(argv[n]), n++)
	ARG("XADD");
	ARG(s->stream);
	if (s->maxlen > 0)
	{
		snprintf(maxlen, sizeof(maxlen), "%ld", s->maxlen);
		ARG("MAXLEN");
		ARG("~");
		ARG(maxlen);
	}
	ARG("*");
	snprintf(deliveries, sizeof(deliveries), "%d", cmd->deliveries);
	ARG("command_id");
	ARG(cmd->command_id);
	ARG("run_id");
	ARG(cmd->run_id);
	snprintf(seq, sizeof(seq), "%lld", cmd->seq);
	ARG("seq");
	ARG(seq);
	ARG("kind");
	ARG(cmd->kind);
	ARG("deliveries");
	ARG(deliveries);
	if (cmd->ordering_key)
	{
		ARG("ordering_key");
		ARG(cmd->ordering_key);
	}
	ARG("payload");
	ARG(cmd->payload);
	/* the producer's headers: one field "header:NAME" each */
	for (j = 0; j < cmd->nheaders; j++)
	{
		size_t		len = strlen(cmd->headers[j].name);

		hnames[j] = relay_malloc(len + 8);
		memcpy(hnames[j], "header:", 7);
		memcpy(hnames[j] + 7, cmd->headers[j].name, len + 1);
		ARG(hnames[j]);
		ARG(cmd->headers[j].value);
	}
#undef ARG
	redisAppendCommandArgv(s->c, n, argv, argvlen);
	for (j = 0; j < cmd->nheaders; j++)
		free(hnames[j]);
}

/* The round of a batch, or NULL. */
static RedisRound *
redis_round(RedisSink *s, RelayBatch *batch)
{
	return sink_round(s->rounds, sizeof(s->rounds[0]), REDIS_ROUNDS, batch);
}

/* The oldest round with replies to come, or NULL. */
static RedisRound *
redis_oldest(RedisSink *s)
{
	RedisRound *best = NULL;
	int			i;

	for (i = 0; i < REDIS_ROUNDS; i++)
	{
		RedisRound *rd = &s->rounds[i];

		if (rd->batch != NULL && rd->got < rd->nsent &&
			(best == NULL || rd->order_no < best->order_no))
			best = rd;
	}
	return best;
}

/* Whether any round has replies to come. */
static bool
redis_awaiting(RedisSink *s)
{
	return redis_oldest(s) != NULL;
}

/*
 * The connection is of no use any more (lost, no reply in time, or the
 * relay stops): what is unanswered in every round gets r with msg, and the
 * connection is dropped.
 */
static void
redis_break(RedisSink *s, SinkResult r, const char *msg)
{
	int			i;
	int			k;

	for (i = 0; i < REDIS_ROUNDS; i++)
	{
		RedisRound *rd = &s->rounds[i];

		if (rd->batch == NULL)
			continue;
		for (k = rd->got; k < rd->nsent; k++)
			sink_outcome(&rd->batch->cmds[rd->order[k]], r, msg);
		rd->got = rd->nsent;
		if (r == SINK_UNAVAILABLE)
			rd->unavailable = true;
	}
	relay_debug("%s", msg);
	redis_disconnect(s);
}

/* One reply: the outcome of the next XADD of the oldest round (or setup). */
static void
redis_reply(RedisSink *s, redisReply *reply)
{
	RedisRound *rd;
	RelayCommand *cmd;

	if (s->nsetup > 0)
	{
		/* AUTH or SELECT: an error makes every XADD behind it wait */
		if (reply->type == REDIS_REPLY_ERROR && s->setup_err[0] == '\0')
			snprintf(s->setup_err, sizeof(s->setup_err), "redis %s:%d: %s: %s", s->host, s->port,
					 s->nsetup == s->nsetup_sent && s->password ? "AUTH" : "SELECT", reply->str);
		s->nsetup--;
		return;
	}
	rd = redis_oldest(s);
	if (rd == NULL)
		return;					/* not reached: one reply per command sent */
	cmd = &rd->batch->cmds[rd->order[rd->got++]];
	if (s->setup_err[0] != '\0')
	{
		rd->unavailable = true;
		sink_outcome(cmd, SINK_UNAVAILABLE, s->setup_err);
	}
	else if (reply->type == REDIS_REPLY_ERROR)
	{
		char		msg[700];
		SinkResult	res = redis_classify(reply->str);

		snprintf(msg, sizeof(msg), "redis stream %s: %s", s->stream, reply->str);
		if (res == SINK_UNAVAILABLE)
			rd->unavailable = true;
		sink_outcome(cmd, res, msg);
	}
	else
		sink_outcome(cmd, SINK_OK, NULL);
}

/*
 * Write what is buffered and read the replies that came, waiting at most
 * wait_ms for the socket.  False when the connection is of no use any more
 * (redis_break has settled what was unanswered).
 */
static bool
redis_pump(RedisSink *s, int wait_ms)
{
	struct pollfd pfd;
	char		lost[512];
	void	   *r = NULL;
	int			rc;

	pfd.fd = s->c->fd;
	pfd.events = POLLIN | (s->wpending ? POLLOUT : 0);
	pfd.revents = 0;
	rc = poll(&pfd, 1, wait_ms);
	if (rc < 0 && errno != EINTR)
	{
		snprintf(lost, sizeof(lost), "redis %s:%d: poll failed: %s", s->host, s->port, strerror(errno));
		redis_break(s, SINK_UNAVAILABLE, lost);
		return false;
	}
	if (rc > 0 && (pfd.revents & POLLOUT) && s->wpending)
	{
		int			done = 0;

		if (redisBufferWrite(s->c, &done) == REDIS_OK && done)
		{
			s->wpending = false;
			if (s->fresh)
			{
				/* written: from now on --timeout for the next reply */
				s->fresh = false;
				s->deadline = relay_now() + relay_opts.timeout;
			}
		}
	}
	if (s->c->err == 0 && rc > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR)))
		(void) redisBufferRead(s->c);
	while (s->c->err == 0 && (s->nsetup > 0 || redis_awaiting(s)) &&
		   redisGetReplyFromReader(s->c, &r) == REDIS_OK && r != NULL)
	{
		redis_reply(s, r);
		freeReplyObject(r);
		r = NULL;
		s->deadline = relay_now() + relay_opts.timeout;
	}
	if (s->c->err)
	{
		snprintf(lost, sizeof(lost), "redis %s:%d: %s", s->host, s->port,
				 s->c->errstr[0] ? s->c->errstr : "connection lost");
		redis_break(s, SINK_UNAVAILABLE, lost);
		return false;
	}
	if ((s->nsetup > 0 || redis_awaiting(s)) && relay_now() > s->deadline)
	{
		snprintf(lost, sizeof(lost), "redis %s:%d: no reply within %.1fs", s->host, s->port,
				 relay_opts.timeout);
		redis_break(s, SINK_UNAVAILABLE, lost);
		return false;
	}
	return true;
}

/*
 * Start delivering the batch (sink.h: submit): append one XADD per CMD_TODO
 * command to the connection's pipeline (connecting first when needed, AUTH
 * and SELECT at its head) and write what the socket takes now, without
 * waiting for a reply; settle takes the replies in.
 */
static SinkResult
redis_submit(Sink *base, RelayBatch *batch)
{
	RedisSink  *s = (RedisSink *) base;
	RedisRound *rd = sink_free_round(s->rounds, sizeof(s->rounds[0]), REDIS_ROUNDS, "redis");
	char		lost[512] = "";
	int			i;

	memset(rd, 0, sizeof(*rd));
	rd->batch = batch;
	rd->order_no = ++s->order_no;
	rd->order = relay_malloc(sizeof(int) * (batch->n + 1));
	if (s->c == NULL)
	{
		if (!redis_connect(s, lost, sizeof(lost)))
		{
			for (i = 0; i < batch->n; i++)
				sink_outcome(&batch->cmds[i], SINK_UNAVAILABLE, lost);
			rd->unavailable = true;
			return SINK_UNAVAILABLE;
		}
		s->fresh = true;
		s->nsetup = s->nsetup_sent = 0;
		s->setup_err[0] = '\0';
		if (s->password != NULL)
		{
			if (s->user != NULL)
				redisAppendCommand(s->c, "AUTH %s %s", s->user, s->password);
			else
				redisAppendCommand(s->c, "AUTH %s", s->password);
			s->nsetup++;
		}
		if (s->db != 0)
		{
			redisAppendCommand(s->c, "SELECT %ld", s->db);
			s->nsetup++;
		}
		s->nsetup_sent = s->nsetup;
		/* a new connection has --connect-timeout until the pipeline is written */
		s->deadline = relay_now() + relay_opts.connect_timeout;
	}
	else if (!redis_awaiting(s) && s->nsetup == 0)
		s->deadline = relay_now() + (s->fresh ? relay_opts.connect_timeout : relay_opts.timeout);
	for (i = 0; i < batch->n; i++)
	{
		if (batch->cmds[i].state != CMD_TODO)
			continue;
		redis_append_xadd(s, &batch->cmds[i]);
		rd->order[rd->nsent++] = i;
	}
	if (rd->nsent > 0)
		s->wpending = true;
	/* write now what the socket takes; the replies are settle's */
	if (s->wpending && !redis_pump(s, 0))
		return SINK_UNAVAILABLE;
	return rd->unavailable ? SINK_UNAVAILABLE : SINK_OK;
}

/*
 * Wait until every XADD of a submitted batch has its reply (sink.h:
 * settle), taking in the replies of the round before it on the connection
 * first (one connection answers in order); the other round's replies that
 * come meanwhile are kept for its own settle.
 */
static SinkResult
redis_settle(Sink *base, RelayBatch *batch, SinkTick tick, void *arg)
{
	RedisSink  *s = (RedisSink *) base;
	RedisRound *rd = redis_round(s, batch);
	bool		unavailable;

	if (rd == NULL)
		return SINK_OK;			/* not submitted: nothing to wait for */
	while (rd->got < rd->nsent && s->c != NULL)
	{
		if (!redis_pump(s, 10))
			break;
		if (rd->got >= rd->nsent)
			break;
		if (tick != NULL && !tick(arg))
		{
			redis_break(s, SINK_RETRY, "delivery interrupted: the relay was stopped");
			break;
		}
	}
	unavailable = rd->unavailable;
	free(rd->order);
	memset(rd, 0, sizeof(*rd));
	/* AUTH or SELECT failed: once nothing waits on it, a new connection */
	if (s->c != NULL && s->setup_err[0] != '\0' && !redis_awaiting(s))
		redis_disconnect(s);
	return unavailable ? SINK_UNAVAILABLE : SINK_OK;
}

/* Deliver the batch: submit it, then settle it. */
static SinkResult
redis_deliver(Sink *base, RelayBatch *batch, SinkTick tick, void *arg)
{
	SinkResult	r = redis_submit(base, batch);
	SinkResult	r2 = redis_settle(base, batch, tick, arg);

	return r == SINK_UNAVAILABLE ? r : r2;
}

/*
 * The idle probe: the delivery connection, if any, is dropped when the
 * server closed it (an idle connection has nothing to read but its end);
 * then a connection of its own, bounded by --connect-timeout, sends AUTH
 * and SELECT as a batch would, and PING, and is closed.  Nothing is
 * written to the stream.
 */
static SinkResult
redis_probe(Sink *base, char **err)
{
	RedisSink  *s = (RedisSink *) base;
	redisContext *c;
	redisReply *reply;
	struct timeval tv;
	const char *step = "PING";

	if (s->c != NULL)
	{
		struct pollfd pfd;

		pfd.fd = s->c->fd;
		pfd.events = POLLIN;
		pfd.revents = 0;
		if (poll(&pfd, 1, 0) != 0)
			redis_disconnect(s);
	}
	tv.tv_sec = (long) relay_opts.connect_timeout;
	tv.tv_usec = (long) ((relay_opts.connect_timeout - tv.tv_sec) * 1e6);
	c = redisConnectWithTimeout(s->host, s->port, tv);
	if (c == NULL || c->err)
	{
		*err = sink_errorf("redis %s:%d: could not connect: %s", s->host, s->port,
						   c ? c->errstr : "out of memory");
		if (c != NULL)
			redisFree(c);
		return SINK_UNAVAILABLE;
	}
	tv.tv_sec = (long) relay_opts.timeout;
	tv.tv_usec = (long) ((relay_opts.timeout - tv.tv_sec) * 1e6);
	(void) redisSetTimeout(c, tv);
	if (s->password != NULL)
	{
		step = "AUTH";
		reply = s->user != NULL ? redisCommand(c, "AUTH %s %s", s->user, s->password) :
			redisCommand(c, "AUTH %s", s->password);
		if (reply == NULL || reply->type == REDIS_REPLY_ERROR)
			goto fail;
		freeReplyObject(reply);
	}
	if (s->db != 0)
	{
		step = "SELECT";
		reply = redisCommand(c, "SELECT %ld", s->db);
		if (reply == NULL || reply->type == REDIS_REPLY_ERROR)
			goto fail;
		freeReplyObject(reply);
	}
	step = "PING";
	reply = redisCommand(c, "PING");
	if (reply == NULL || reply->type == REDIS_REPLY_ERROR)
		goto fail;
	freeReplyObject(reply);
	redisFree(c);
	return SINK_OK;

fail:
	*err = sink_errorf("redis %s:%d: %s: %s", s->host, s->port, step,
					   reply ? reply->str : (c->errstr[0] ? c->errstr : "no reply"));
	if (reply != NULL)
		freeReplyObject(reply);
	redisFree(c);
	return SINK_UNAVAILABLE;
}

/* Close the connection and free. */
static void
redis_close(Sink *base)
{
	RedisSink  *s = (RedisSink *) base;

	redis_disconnect(s);
	free(s->host);
	free(s->stream);
	free(s->user);
	sink_free_secret(s->password);
	free(s);
}

/* What the sink is, for the logs. */
static const char *
redis_describe(Sink *base)
{
	return ((RedisSink *) base)->shown;
}

const SinkOps sink_redis_ops = {
	.name = "redis",
	.schemes = redis_schemes,
	.usage =
	"  redis://HOST:PORT[/DB]?stream=KEY[&maxlen=N][&user=U][&password_file=PATH]\n"
	"                      XADD of the fields command_id, run_id, seq, kind,\n"
	"                      deliveries, payload, header:NAME, pipelined per batch,\n"
	"                      acked after the replies\n"
	"                      (password also from OUTBOX_RELAY_REDIS_PASSWORD)\n",
	.open = redis_open,
	.deliver = redis_deliver,
	.submit = redis_submit,
	.settle = redis_settle,
	.probe = redis_probe,
	.close = redis_close,
	.describe = redis_describe,
};
