/*-------------------------------------------------------------------------
 *
 * sink_redis.c
 *		The Redis Streams sink (hiredis):
 *		redis://HOST:PORT[/DB]?stream=KEY[&maxlen=N][&user=U][&password_file=PATH]
 *
 * Each command is one stream entry, XADD KEY [MAXLEN ~ N] * with the
 * fields command_id, run_id, seq, kind, deliveries and payload (the
 * payload's JSON text), then one field "header:NAME" per producer header
 * (the prefix keeps them apart from the relay's fields).  A batch is one pipeline: every XADD is written at once and
 * a command is delivered when its reply (the entry's id) has come back.
 * The connection is opened on the first batch (AUTH and SELECT ride at the
 * head of the pipeline) and kept; it is non-blocking, polled at most
 * 100 ms at a time so that tick renews the leases and a second SIGTERM
 * interrupts.  --connect-timeout bounds the connection, --timeout the
 * wait for the next reply.
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

/*
 * Deliver the batch as one pipeline of XADDs and wait for the replies
 * (see the file header).
 */
static SinkResult
redis_deliver(Sink *base, RelayBatch *batch, SinkTick tick, void *arg)
{
	RedisSink  *s = (RedisSink *) base;
	int		   *order = relay_malloc(sizeof(int) * (batch->n + 1));
	int			nsent = 0;
	int			nsetup = 0;		/* AUTH and SELECT replies to come first */
	int			got = 0;		/* replies received, setup ones included */
	bool		wdone = false;
	bool		unavailable = false;
	bool		fresh = false;
	char		lost[512] = "";
	double		deadline;
	int			i;

	if (s->c == NULL)
	{
		if (!redis_connect(s, lost, sizeof(lost)))
		{
			for (i = 0; i < batch->n; i++)
				sink_outcome(&batch->cmds[i], SINK_UNAVAILABLE, lost);
			free(order);
			return SINK_UNAVAILABLE;
		}
		fresh = true;
		if (s->password != NULL)
		{
			if (s->user != NULL)
				redisAppendCommand(s->c, "AUTH %s %s", s->user, s->password);
			else
				redisAppendCommand(s->c, "AUTH %s", s->password);
			nsetup++;
		}
		if (s->db != 0)
		{
			redisAppendCommand(s->c, "SELECT %ld", s->db);
			nsetup++;
		}
	}
	for (i = 0; i < batch->n; i++)
	{
		if (batch->cmds[i].state != CMD_TODO)
			continue;
		redis_append_xadd(s, &batch->cmds[i]);
		order[nsent++] = i;
	}

	/* a new connection has --connect-timeout until the pipeline is written */
	deadline = relay_now() + (fresh ? relay_opts.connect_timeout : relay_opts.timeout);
	while (got < nsetup + nsent)
	{
		struct pollfd pfd;
		void	   *r = NULL;
		int			rc;

		pfd.fd = s->c->fd;
		pfd.events = POLLIN | (wdone ? 0 : POLLOUT);
		pfd.revents = 0;
		rc = poll(&pfd, 1, 100);
		if (rc < 0 && errno != EINTR)
		{
			snprintf(lost, sizeof(lost), "redis %s:%d: poll failed: %s", s->host, s->port, strerror(errno));
			break;
		}
		if (rc > 0 && (pfd.revents & POLLOUT) && !wdone)
		{
			int			done = 0;

			if (redisBufferWrite(s->c, &done) == REDIS_OK && done)
			{
				wdone = true;
				if (fresh)
					deadline = relay_now() + relay_opts.timeout;
			}
		}
		if (s->c->err == 0 && rc > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR)))
			(void) redisBufferRead(s->c);
		if (s->c->err)
		{
			snprintf(lost, sizeof(lost), "redis %s:%d: %s", s->host, s->port,
					 s->c->errstr[0] ? s->c->errstr : "connection lost");
			break;
		}
		while (got < nsetup + nsent && redisGetReplyFromReader(s->c, &r) == REDIS_OK && r != NULL)
		{
			redisReply *reply = r;

			if (got < nsetup)
			{
				/* AUTH or SELECT: an error makes the whole batch wait */
				if (reply->type == REDIS_REPLY_ERROR)
					snprintf(lost, sizeof(lost), "redis %s:%d: %s: %s", s->host, s->port,
							 s->password && got == 0 ? "AUTH" : "SELECT", reply->str);
			}
			else
			{
				RelayCommand *cmd = &batch->cmds[order[got - nsetup]];

				if (lost[0] != '\0')
					sink_outcome(cmd, SINK_UNAVAILABLE, lost);
				else if (reply->type == REDIS_REPLY_ERROR)
				{
					char		msg[700];
					SinkResult	res = redis_classify(reply->str);

					snprintf(msg, sizeof(msg), "redis stream %s: %s", s->stream, reply->str);
					if (res == SINK_UNAVAILABLE)
						unavailable = true;
					sink_outcome(cmd, res, msg);
				}
				else
					sink_outcome(cmd, SINK_OK, NULL);
			}
			freeReplyObject(reply);
			got++;
			deadline = relay_now() + relay_opts.timeout;
		}
		if (s->c->err)
		{
			snprintf(lost, sizeof(lost), "redis %s:%d: %s", s->host, s->port, s->c->errstr);
			break;
		}
		if (got >= nsetup + nsent)
			break;
		if (relay_now() > deadline)
		{
			snprintf(lost, sizeof(lost), "redis %s:%d: no reply within %.1fs", s->host, s->port,
					 relay_opts.timeout);
			break;
		}
		if (tick != NULL && !tick(arg))
		{
			for (i = got - nsetup; i < nsent; i++)
				if (i >= 0)
					sink_outcome(&batch->cmds[order[i]], SINK_RETRY,
								 "delivery interrupted: the relay was stopped");
			redis_disconnect(s);
			free(order);
			return SINK_OK;
		}
	}

	if (lost[0] != '\0')
	{
		/* the connection is of no use: hold what is unanswered */
		for (i = got - nsetup; i < nsent; i++)
			if (i >= 0)
				sink_outcome(&batch->cmds[order[i]], SINK_UNAVAILABLE, lost);
		redis_disconnect(s);
		unavailable = true;
	}
	free(order);
	return unavailable ? SINK_UNAVAILABLE : SINK_OK;
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
	.probe = redis_probe,
	.close = redis_close,
	.describe = redis_describe,
};
