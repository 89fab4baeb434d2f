/*-------------------------------------------------------------------------
 *
 * sink_nats.c
 *		The NATS JetStream sink of outbox-relay, through libnats (cnats):
 *		nats://[USER@]HOST[:PORT]/SUBJECT[?window=N]
 *
 * Each command is a JetStream publish to SUBJECT with the header
 * Nats-Msg-Id = command_id, so that the stream's duplicate window drops a
 * redelivery, and Outbox-Command-Id, Outbox-Run-Id, Outbox-Seq, Outbox-Kind
 * and Outbox-Deliveries, then the producer's headers under their own names
 * (never a Nats-* one, nor one the relay sets itself); the body is the
 * command's JSON object.  Publishes are
 * asynchronous, up to `window` of them awaiting their PubAck at once; the
 * batch returns once each one is settled:
 *
 *	PubAck (also a Duplicate one)	SINK_OK: the stream stored it
 *	no responders					SINK_UNAVAILABLE: no stream captures the
 *									subject (it was removed)
 *	no PubAck within --timeout, connection lost or refused, authorization
 *									SINK_UNAVAILABLE: the relay holds the batch
 *	JetStream error 10054 (message exceeds the stream's maximum size), or
 *	a body over the server's max_payload
 *									SINK_FATAL: the command itself
 *	any other JetStream error		SINK_RETRY
 *
 * At start-up (open) the sink connects once and asks the server which
 * streams capture SUBJECT ($JS.API.STREAM.NAMES): none is a configuration
 * error (exit 2), since every publish would fail.  A server that cannot be
 * reached then is an outage, not an error: the check is repeated at each
 * connection and its failure held as an outage.
 *
 * Deliver now, confirm later (sink.h: submit, settle): submit publishes
 * what the window allows of a batch and returns; settle waits for its
 * PubAcks.  At most two batches (rounds) are in flight at once, the one
 * the relay waits for and the one it claimed ahead; the window counts
 * both, the rounds are published in the order they were submitted, and a
 * PubAck settles the one command its Nats-Msg-Id names (a command is in
 * one batch at a time, so the two rounds' ids never meet).  A broken
 * connection holds what awaits a PubAck in both rounds.
 *
 * Locking: libnats calls the PubAck handler from its own thread.  The
 * rounds (the outcome of each command and the numbers in flight) are
 * shared with that thread under `lock`; the relay's thread waits on `cond`
 * for acks, at most 10 ms at a time so that it can tick.  Rounds that are
 * abandoned (timeout, interruption, lost connection) are detached under
 * the lock before the connection is destroyed, so that a late PubAck can
 * never settle a command of a later batch.
 *
 * Passwords and tokens are never in the URL: OUTBOX_RELAY_NATS_PASSWORD
 * (with a user in the URL) or OUTBOX_RELAY_NATS_TOKEN; the sink's copies
 * are wiped before they are freed.
 *
 *-------------------------------------------------------------------------
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <nats/nats.h>

#include "sink.h"

#define NATS_DEFAULT_PORT	4222

/* Per-command state of the round (NatsRound.state). */
#define NP_NONE		0			/* not published in this round */
#define NP_WAIT		1			/* published, awaiting its PubAck */
#define NP_SETTLED	2

/*
 * One batch handed to JetStream (submit) and not settled yet, shared with
 * libnats' thread under NatsSink.lock: at most two at once, the one the
 * relay waits for and the one claimed ahead.
 */
#define NATS_ROUNDS 2
typedef struct NatsRound
{
	RelayBatch *batch;			/* NULL: the slot is free */
	unsigned	order_no;		/* rounds are published in this order */
	char	   *state;			/* NP_* by command index */
	int			inflight;
	int			cursor;			/* where the next PubAck is looked for */
	int			next;			/* the next command to publish */
	bool		ended;			/* nothing more is published of it */
	bool		unavailable;	/* a PubAck error said the stream is gone,
								 * or the connection broke */
	char		unavailable_msg[512];
} NatsRound;

typedef struct NatsSink
{
	Sink		base;
	char	   *server;			/* nats://HOST:PORT */
	char	   *user;
	char	   *password;
	char	   *token;
	char	   *subject;
	long		window;
	natsConnection *nc;			/* NULL: not connected */
	jsCtx	   *js;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	NatsRound	rounds[NATS_ROUNDS];	/* under lock */
	int			inflight;		/* awaiting a PubAck, all rounds; under lock */
	unsigned	order_no;		/* the last round's number */
	unsigned	acks;			/* PubAcks taken in; under lock */
	bool		broken;			/* the connection is to be dropped */
	double		last_progress;	/* when a PubAck came or the window opened */
	char	   *shown;
} NatsSink;

static const char *const nats_schemes[] = {"nats", NULL};
static const char *const nats_options[] = {"window", NULL};

/* True when s is a subject one can publish to (no wildcards, no spaces). */
static bool
nats_subject_ok(const char *s)
{
	const char *p;
	bool		token_start = true;

	if (*s == '\0')
		return false;
	for (p = s; *p; p++)
	{
		if (*p == '.')
		{
			if (token_start)
				return false;
			token_start = true;
			continue;
		}
		if ((unsigned char) *p <= ' ' || *p == 0x7f || *p == '*' || *p == '>' ||
			*p == '"' || *p == '\\')
			return false;
		token_start = false;
	}
	return !token_start;
}

/* True when s can be a NATS header value (no control characters). */
static bool
nats_header_ok(const char *s)
{
	for (; s && *s; s++)
		if ((unsigned char) *s < 0x20 || *s == 0x7f)
			return false;
	return true;
}

/*
 * Ask the server which streams capture the subject ($JS.API.STREAM.NAMES, a
 * read-only request).  False with msg set when none does (*no_stream) or
 * the server cannot say.
 */
static bool
nats_stream_check(NatsSink *s, char *msg, size_t size, bool *no_stream)
{
	natsStatus	st;
	natsMsg    *reply = NULL;
	char		req[1024];
	const char *data;

	*no_stream = false;
	snprintf(req, sizeof(req), "{\"subject\":\"%s\"}", s->subject);
	st = natsConnection_RequestString(&reply, s->nc, "$JS.API.STREAM.NAMES", req,
									  (int64_t) (relay_opts.timeout * 1000));
	if (st == NATS_NO_RESPONDERS)
	{
		snprintf(msg, size, "the NATS server at %s has no JetStream (start it with -js)", s->server);
		*no_stream = true;
		goto fail;
	}
	if (st != NATS_OK)
	{
		snprintf(msg, size, "could not list the JetStream streams of %s: %s", s->server,
				 natsStatus_GetText(st));
		goto fail;
	}
	data = natsMsg_GetData(reply);
	if (data == NULL || strstr(data, "\"error\"") != NULL)
	{
		snprintf(msg, size, "could not list the JetStream streams of %s: %.300s", s->server,
				 data ? data : "empty reply");
		goto fail;
	}
	if (strstr(data, "\"streams\":null") != NULL || strstr(data, "\"streams\":[]") != NULL)
	{
		snprintf(msg, size, "no JetStream stream captures subject \"%s\" on %s: a plain NATS subject is refused (create a stream for it)",
				 s->subject, s->server);
		*no_stream = true;
		goto fail;
	}
	natsMsg_Destroy(reply);
	return true;

fail:
	natsMsg_Destroy(reply);
	return false;
}

/*
 * Connect and check that a stream captures the subject.  False with msg
 * set; *no_stream is set when the server answered that none does.
 */
static bool
nats_connect(NatsSink *s, char *msg, size_t size, bool *no_stream)
{
	natsOptions *opts = NULL;
	natsStatus	st;

	*no_stream = false;
	if (natsOptions_Create(&opts) != NATS_OK ||
		natsOptions_SetURL(opts, s->server) != NATS_OK ||
		natsOptions_SetTimeout(opts, (int64_t) (relay_opts.connect_timeout * 1000)) != NATS_OK ||
		natsOptions_SetAllowReconnect(opts, false) != NATS_OK ||
		natsOptions_SetName(opts, RELAY_NAME) != NATS_OK ||
		natsOptions_SetSendAsap(opts, true) != NATS_OK ||
		natsOptions_SetWriteDeadline(opts, (int64_t) (relay_opts.timeout * 1000)) != NATS_OK ||
		(s->user != NULL &&
		 natsOptions_SetUserInfo(opts, s->user, s->password ? s->password : "") != NATS_OK) ||
		(s->token != NULL && natsOptions_SetToken(opts, s->token) != NATS_OK))
	{
		snprintf(msg, size, "could not set up the NATS connection options");
		natsOptions_Destroy(opts);
		return false;
	}
	st = natsConnection_Connect(&s->nc, opts);
	natsOptions_Destroy(opts);
	if (st != NATS_OK)
	{
		snprintf(msg, size, "could not connect to %s: %s", s->server, natsStatus_GetText(st));
		s->nc = NULL;
		return false;
	}

	if (!nats_stream_check(s, msg, size, no_stream))
	{
		natsConnection_Destroy(s->nc);
		s->nc = NULL;
		return false;
	}
	return true;
}

/* Find the command of a PubAck: by its Nats-Msg-Id, from the cursor on. */
static int
nats_find(NatsRound *rd, natsMsg *m)
{
	const char *id = NULL;
	int			n = rd->batch->n;
	int			k;

	if (natsMsgHeader_Get(m, "Nats-Msg-Id", &id) != NATS_OK || id == NULL)
		return -1;
	for (k = 0; k < n; k++)
	{
		int			i = (rd->cursor + k) % n;

		if (rd->state[i] == NP_WAIT && strcmp(rd->batch->cmds[i].command_id, id) == 0)
		{
			rd->cursor = (i + 1) % n;
			return i;
		}
	}
	return -1;
}

/* libnats' PubAck handler (its thread): settle one command. */
static void
nats_ack_handler(jsCtx *js, natsMsg *m, jsPubAck *pa, jsPubAckErr *pae, void *closure)
{
	NatsSink   *s = closure;
	NatsRound  *rd;
	int			i;
	int			k;

	(void) js;
	pthread_mutex_lock(&s->lock);
	rd = NULL;
	i = -1;
	for (k = 0; k < NATS_ROUNDS && i < 0; k++)
	{
		rd = &s->rounds[k];
		if (rd->batch != NULL && rd->inflight > 0)
			i = nats_find(rd, m);
	}
	if (i >= 0)
	{
		RelayCommand *cmd = &rd->batch->cmds[i];

		if (pa != NULL)
			sink_outcome(cmd, SINK_OK, NULL);
		else
		{
			char		err[600];
			SinkResult	r;
			natsStatus	st = pae ? pae->Err : NATS_ERR;
			int			code = pae ? (int) pae->ErrCode : 0;

			if (st == NATS_NO_RESPONDERS)
			{
				snprintf(err, sizeof(err), "no JetStream stream captures subject \"%s\" (no responders)",
						 s->subject);
				r = SINK_UNAVAILABLE;
			}
			else if (st == NATS_TIMEOUT || st == NATS_CONNECTION_CLOSED ||
					 st == NATS_CONNECTION_DISCONNECTED || st == NATS_STALE_CONNECTION)
			{
				snprintf(err, sizeof(err), "no PubAck from %s: %s", s->server, natsStatus_GetText(st));
				r = SINK_UNAVAILABLE;
			}
			else
			{
				snprintf(err, sizeof(err), "JetStream refused the message: %s%s%s (error %d)",
						 natsStatus_GetText(st), pae && pae->ErrText ? ": " : "",
						 pae && pae->ErrText ? pae->ErrText : "", code);
				r = (code == 10054) ? SINK_FATAL : SINK_RETRY;
			}
			if (r == SINK_UNAVAILABLE && !rd->unavailable)
			{
				rd->unavailable = true;
				snprintf(rd->unavailable_msg, sizeof(rd->unavailable_msg), "%s", err);
			}
			sink_outcome(cmd, r, err);
		}
		rd->state[i] = NP_SETTLED;
		rd->inflight--;
		s->inflight--;
		s->acks++;
		pthread_cond_signal(&s->cond);
	}
	pthread_mutex_unlock(&s->lock);
	natsMsg_Destroy(m);
}

/* Open the JetStream context of a new connection. */
static bool
nats_jetstream(NatsSink *s, char *msg, size_t size)
{
	jsOptions	jo;
	natsStatus	st;

	jsOptions_Init(&jo);
	jo.Wait = (int64_t) (relay_opts.timeout * 1000);
	jo.PublishAsync.AckHandler = nats_ack_handler;
	jo.PublishAsync.AckHandlerClosure = s;
	st = natsConnection_JetStream(&s->js, s->nc, &jo);
	if (st != NATS_OK)
	{
		snprintf(msg, size, "could not open a JetStream context: %s", natsStatus_GetText(st));
		return false;
	}
	return true;
}

/* Drop the connection; the round, if any, must be detached already. */
static void
nats_drop(NatsSink *s)
{
	if (s->js != NULL)
		jsCtx_Destroy(s->js);
	s->js = NULL;
	if (s->nc != NULL)
		natsConnection_Destroy(s->nc);
	s->nc = NULL;
}

/* Parse the URL; connect once to check the subject's stream (sink.h: open). */
static SinkOpenResult
nats_open(const char *url, Sink **out, char **err)
{
	SinkUrl		u;
	SinkHost   *hosts = NULL;
	NatsSink   *s;
	const char *v;
	int			n = 0;
	char		msg[1024];
	bool		no_stream;
	PQExpBufferData buf;

	if (sink_url_one_host(url, "nats", nats_options, NATS_DEFAULT_PORT,
						  "use OUTBOX_RELAY_NATS_PASSWORD",
						  &u, &hosts, &n, err) != SINK_OPEN_OK)
		return SINK_OPEN_CONFIG;
	if (!nats_subject_ok(u.path))
	{
		*err = sink_errorf("invalid nats sink URL: the path must be a subject to publish to (tokens separated by dots, no wildcards, no spaces)");
		goto config;
	}

	s = relay_malloc(sizeof(NatsSink));
	memset(s, 0, sizeof(NatsSink));
	s->window = 256;
	if (!sink_url_int_option(&u, "window", 1, 65535, &s->window, err))
	{
		free(s);
		goto config;
	}
	initPQExpBuffer(&buf);
	if (strchr(hosts[0].host, ':') != NULL)
		appendPQExpBuffer(&buf, "nats://[%s]:%d", hosts[0].host, hosts[0].port);
	else
		appendPQExpBuffer(&buf, "nats://%s:%d", hosts[0].host, hosts[0].port);
	s->server = relay_strdup(buf.data);
	resetPQExpBuffer(&buf);
	s->subject = relay_strdup(u.path);
	s->user = u.user ? relay_strdup(u.user) : NULL;
	if (s->user != NULL && (v = getenv("OUTBOX_RELAY_NATS_PASSWORD")) != NULL)
		s->password = relay_strdup(v);
	if ((v = getenv("OUTBOX_RELAY_NATS_TOKEN")) != NULL && *v != '\0')
		s->token = relay_strdup(v);
	appendPQExpBuffer(&buf, "%s subject \"%s\" (JetStream)", s->server, s->subject);
	s->shown = relay_strdup(buf.data);
	termPQExpBuffer(&buf);
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	sink_hosts_free(hosts, n);
	sink_url_free(&u);
	*out = &s->base;

	if (nats_connect(s, msg, sizeof(msg), &no_stream))
	{
		if (!nats_jetstream(s, msg, sizeof(msg)))
			nats_drop(s);
	}
	else if (no_stream)
	{
		*err = relay_strdup(msg);
		nats_drop(s);
		free(s->server);
		free(s->subject);
		free(s->user);
		sink_free_secret(s->password);
		sink_free_secret(s->token);
		free(s->shown);
		free(s);
		*out = NULL;
		return SINK_OPEN_CONFIG;
	}
	else
		relay_debug("%s (will retry)", msg);
	return SINK_OPEN_OK;

config:
	if (hosts != NULL)
		sink_hosts_free(hosts, n);
	sink_url_free(&u);
	return SINK_OPEN_CONFIG;
}

/* Build and publish the message of command i.  False with msg set on a failure. */
static natsStatus
nats_publish(NatsSink *s, NatsRound *rd, int i, PQExpBuffer body, char *msg, size_t size)
{
	RelayCommand *cmd = &rd->batch->cmds[i];
	natsMsg    *m = NULL;
	natsStatus	st;
	static const char *const own[] = {"Content-Type", "Outbox-Command-Id",
		"Outbox-Run-Id", "Outbox-Seq", "Outbox-Kind", "Outbox-Deliveries",
	"Outbox-Ordering-Key", NULL};
	char		deliveries[16];
	char		seq[24];
	jsPubOptions po;
	int			j;

	resetPQExpBuffer(body);
	sink_command_json(body, cmd);
	snprintf(deliveries, sizeof(deliveries), "%d", cmd->deliveries);
	snprintf(seq, sizeof(seq), "%lld", cmd->seq);
	st = natsMsg_Create(&m, s->subject, NULL, body->data, (int) body->len);
	if (st == NATS_OK)
		st = natsMsgHeader_Set(m, "Nats-Msg-Id", cmd->command_id);
	if (st == NATS_OK)
		st = natsMsgHeader_Set(m, "Content-Type", "application/json");
	if (st == NATS_OK)
		st = natsMsgHeader_Set(m, "Outbox-Command-Id", cmd->command_id);
	if (st == NATS_OK)
		st = natsMsgHeader_Set(m, "Outbox-Run-Id", cmd->run_id ? cmd->run_id : "");
	if (st == NATS_OK)
		st = natsMsgHeader_Set(m, "Outbox-Kind", cmd->kind ? cmd->kind : "");
	if (st == NATS_OK)
		st = natsMsgHeader_Set(m, "Outbox-Seq", seq);
	if (st == NATS_OK)
		st = natsMsgHeader_Set(m, "Outbox-Deliveries", deliveries);
	if (st == NATS_OK && cmd->ordering_key)
		st = natsMsgHeader_Set(m, "Outbox-Ordering-Key", cmd->ordering_key);

	/*
	 * The producer's headers, under their own names; never a Nats-* header
	 * (they steer JetStream: the message id, expected sequences, TTLs).
	 */
	for (j = 0; st == NATS_OK && j < cmd->nheaders; j++)
	{
		const char *name = cmd->headers[j].name;

		if (sink_header_reserved(name) || sink_header_listed(name, own) ||
			strncasecmp(name, "nats-", 5) == 0)
			continue;
		st = natsMsgHeader_Add(m, name, cmd->headers[j].value);
	}
	if (st != NATS_OK)
	{
		snprintf(msg, size, "could not build a NATS message: %s", natsStatus_GetText(st));
		natsMsg_Destroy(m);
		return st;
	}
	jsPubOptions_Init(&po);
	po.MaxWait = (int64_t) (relay_opts.timeout * 1000);

	/* the handler may run before js_PublishMsgAsync returns */
	pthread_mutex_lock(&s->lock);
	rd->state[i] = NP_WAIT;
	rd->inflight++;
	if (s->inflight++ == 0)
		s->last_progress = relay_now();
	pthread_mutex_unlock(&s->lock);
	st = js_PublishMsgAsync(s->js, &m, &po);
	natsMsg_Destroy(m);			/* no-op when the library took it */
	if (st != NATS_OK)
	{
		pthread_mutex_lock(&s->lock);
		if (rd->state[i] == NP_WAIT)
		{
			rd->state[i] = NP_NONE;
			rd->inflight--;
			s->inflight--;
		}
		pthread_mutex_unlock(&s->lock);
		snprintf(msg, size, "could not publish to %s: %s", s->server, natsStatus_GetText(st));
	}
	return st;
}

/* The round of a batch, or NULL; under lock. */
static NatsRound *
nats_round(NatsSink *s, RelayBatch *batch)
{
	return sink_round(s->rounds, sizeof(s->rounds[0]), NATS_ROUNDS, batch);
}

/*
 * The connection is of no use any more (lost, no PubAck in time, or the
 * relay stops); called with the lock held.  What awaits a PubAck in every
 * round gets r with msg (its fate is unknown: it is published again later);
 * with hold, what was not published yet is held too (SINK_UNAVAILABLE),
 * else it stays to do.  The rounds are detached from the connection under
 * the lock, so no late PubAck settles anything of them; the caller drops
 * the connection after unlocking.
 */
static void
nats_break(NatsSink *s, SinkResult r, bool hold, const char *msg)
{
	int			k;
	int			i;

	for (k = 0; k < NATS_ROUNDS; k++)
	{
		NatsRound  *rd = &s->rounds[k];

		if (rd->batch == NULL)
			continue;
		for (i = 0; i < rd->batch->n; i++)
			if (rd->state[i] == NP_WAIT)
			{
				sink_outcome(&rd->batch->cmds[i], r, msg);
				rd->state[i] = NP_SETTLED;
			}
		if (hold)
			for (i = rd->next; i < rd->batch->n; i++)
				sink_outcome(&rd->batch->cmds[i], SINK_UNAVAILABLE, msg);
		if (hold || r == SINK_UNAVAILABLE)
		{
			rd->unavailable = true;
			if (rd->unavailable_msg[0] == '\0')
				snprintf(rd->unavailable_msg, sizeof(rd->unavailable_msg), "%s", msg);
		}
		rd->inflight = 0;
		rd->ended = true;
	}
	s->inflight = 0;
	s->broken = true;
	relay_debug("nats: %s", msg);
}

/*
 * Publish what the window allows, the rounds in the order they were
 * submitted; called with the lock held (released around each publish).
 * A round a PubAck found unavailable publishes nothing more, nor does the
 * one after it; a round that has ended (its connection broke, or the other
 * round's settle found the broker unavailable) holds up none, so that the
 * relay's retry of a batch is published while the batch submitted ahead
 * of it still waits to be settled.  The connection sends each publish at
 * once (SendAsap): libnats' flusher thread would wait up to a millisecond
 * for more, and a flush of our own (natsConnection_FlushTimeout) waits for
 * a PONG, a round trip during which the relay's thread could not take
 * the other round's PubAcks in or hand over the next batch.  The writes
 * have --timeout as their deadline, so a server that stopped reading fails
 * the publish (the broker is unavailable) instead of holding the relay.
 */
static void
nats_fill(NatsSink *s, PQExpBuffer body)
{
	NatsRound  *order[NATS_ROUNDS];
	char		msg[1024];
	int			k;

	if (s->nc == NULL || s->broken)
		return;
	order[0] = &s->rounds[0];
	order[1] = &s->rounds[1];
	if (order[0]->batch == NULL ||
		(order[1]->batch != NULL && order[1]->order_no < order[0]->order_no))
	{
		order[0] = &s->rounds[1];
		order[1] = &s->rounds[0];
	}
	for (k = 0; k < NATS_ROUNDS && !s->broken && s->inflight < s->window; k++)
	{
		NatsRound  *rd = order[k];
		RelayBatch *batch = rd->batch;

		if (batch == NULL)
			break;
		/* an ended round publishes nothing more, and holds up none */
		if (rd->ended)
			continue;
		if (rd->unavailable)
			break;
		while (!s->broken && !rd->unavailable && s->inflight < s->window && rd->next < batch->n)
		{
			RelayCommand *cmd = &batch->cmds[rd->next];
			natsStatus	st;

			if (cmd->state != CMD_TODO)
			{
				rd->next++;
				continue;
			}
			if (!nats_header_ok(cmd->command_id) || !nats_header_ok(cmd->run_id) ||
				!nats_header_ok(cmd->kind))
			{
				sink_outcome(cmd, SINK_FATAL, "command_id, run_id or kind contains characters that cannot be sent in a NATS header");
				rd->next++;
				continue;
			}
			pthread_mutex_unlock(&s->lock);
			st = nats_publish(s, rd, rd->next, body, msg, sizeof(msg));
			pthread_mutex_lock(&s->lock);
			if (st == NATS_MAX_PAYLOAD)
				sink_outcome(cmd, SINK_FATAL, msg);
			else if (st != NATS_OK)
			{
				nats_break(s, SINK_UNAVAILABLE, true, msg);
				return;
			}
			rd->next++;
		}
		if (rd->next < batch->n)
			break;				/* the window is full, or the stream gone */
	}
}

/* Drop a connection found broken (no round is attached to it any more). */
static void
nats_drop_broken(NatsSink *s)
{
	if (!s->broken)
		return;
	nats_drop(s);
	s->broken = false;
}

/*
 * Start delivering the batch (sink.h: submit): connect when needed, and
 * publish what the window allows without waiting for a PubAck; settle
 * waits for them.
 */
static SinkResult
nats_submit(Sink *sink, RelayBatch *batch)
{
	NatsSink   *s = (NatsSink *) sink;
	NatsRound  *rd;
	PQExpBufferData body;
	char		msg[1024];
	bool		unavailable;
	int			i;

	pthread_mutex_lock(&s->lock);
	rd = sink_free_round(s->rounds, sizeof(s->rounds[0]), NATS_ROUNDS, "nats");
	memset(rd, 0, sizeof(*rd));
	rd->order_no = ++s->order_no;
	rd->state = relay_malloc(batch->n + 1);
	memset(rd->state, NP_NONE, batch->n + 1);
	rd->batch = batch;
	pthread_mutex_unlock(&s->lock);

	/* a connection the server closed while the relay was idle */
	if (s->nc != NULL && natsConnection_IsClosed(s->nc) &&
		s->rounds[0].inflight == 0 && s->rounds[1].inflight == 0)
		nats_drop(s);
	if (s->nc == NULL)
	{
		bool		no_stream;

		if (!nats_connect(s, msg, sizeof(msg), &no_stream) ||
			!nats_jetstream(s, msg, sizeof(msg)))
		{
			nats_drop(s);
			pthread_mutex_lock(&s->lock);
			for (i = 0; i < batch->n; i++)
				sink_outcome(&batch->cmds[i], SINK_UNAVAILABLE, msg);
			rd->ended = true;
			rd->unavailable = true;
			pthread_mutex_unlock(&s->lock);
			return SINK_UNAVAILABLE;
		}
	}

	initPQExpBuffer(&body);
	pthread_mutex_lock(&s->lock);
	nats_fill(s, &body);
	unavailable = rd->unavailable;
	pthread_mutex_unlock(&s->lock);
	nats_drop_broken(s);
	termPQExpBuffer(&body);
	return unavailable ? SINK_UNAVAILABLE : SINK_OK;
}

/*
 * Wait until every message of a submitted batch has its PubAck (sink.h:
 * settle), publishing the rest of it as the window frees up; libnats'
 * thread settles the other round's PubAcks meanwhile.
 */
static SinkResult
nats_settle(Sink *sink, RelayBatch *batch, SinkTick tick, void *arg)
{
	NatsSink   *s = (NatsSink *) sink;
	NatsRound  *rd;
	PQExpBufferData body;
	char		msg[1024];
	bool		unavailable;
	unsigned	last_acks;
	int			i;
	int			k;

	pthread_mutex_lock(&s->lock);
	rd = nats_round(s, batch);
	if (rd == NULL)
	{
		pthread_mutex_unlock(&s->lock);
		return SINK_OK;			/* not submitted: nothing to wait for */
	}
	initPQExpBuffer(&body);
	last_acks = s->acks;
	for (;;)
	{
		struct timespec ts;

		nats_fill(s, &body);
		if (rd->inflight == 0 && (rd->ended || rd->unavailable || rd->next >= batch->n))
			break;
		if (s->broken)
			break;				/* not reached: a broken round has ended */

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 10 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000)
		{
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		if (s->acks == last_acks)
			pthread_cond_timedwait(&s->cond, &s->lock, &ts);
		if (s->acks != last_acks)
		{
			last_acks = s->acks;
			s->last_progress = relay_now();
		}
		else if (s->inflight > 0 && relay_now() - s->last_progress > relay_opts.timeout + 1)
		{
			snprintf(msg, sizeof(msg), "no PubAck from %s within %g s", s->server, relay_opts.timeout);
			nats_break(s, SINK_UNAVAILABLE, true, msg);
			continue;
		}
		if (natsConnection_Status(s->nc) == NATS_CONN_STATUS_CLOSED)
		{
			snprintf(msg, sizeof(msg), "lost the connection to %s", s->server);
			nats_break(s, SINK_UNAVAILABLE, true, msg);
			continue;
		}
		if (tick != NULL)
		{
			bool		go;

			pthread_mutex_unlock(&s->lock);
			go = tick(arg);
			pthread_mutex_lock(&s->lock);
			if (!go)
			{
				/* what awaits a PubAck is retried; what is unpublished stays */
				nats_break(s, SINK_RETRY, false, "delivery interrupted: the relay was stopped");
				continue;
			}
		}
	}

	/* a PubAck said the stream is gone: hold what was not published */
	if (rd->unavailable)
	{
		NatsRound  *other;

		for (i = rd->next; i < batch->n; i++)
			if (batch->cmds[i].state == CMD_TODO)
				sink_outcome(&batch->cmds[i], SINK_UNAVAILABLE, rd->unavailable_msg);

		/*
		 * The relay retries this batch before the other round's: that one
		 * publishes nothing more on this attempt (its rest is held when it
		 * is settled), so it cannot hold up the retry nor go before it.
		 */
		for (k = 0; k < NATS_ROUNDS; k++)
		{
			other = &s->rounds[k];
			if (other == rd || other->batch == NULL || other->ended)
				continue;
			other->ended = true;
			if (!other->unavailable)
			{
				other->unavailable = true;
				snprintf(other->unavailable_msg, sizeof(other->unavailable_msg), "%s",
						 rd->unavailable_msg);
			}
		}
	}
	unavailable = rd->unavailable;
	free(rd->state);
	memset(rd, 0, sizeof(*rd));
	pthread_mutex_unlock(&s->lock);
	nats_drop_broken(s);
	termPQExpBuffer(&body);
	return unavailable ? SINK_UNAVAILABLE : SINK_OK;
}

/* Deliver the batch: submit it, then settle it. */
static SinkResult
nats_deliver(Sink *sink, RelayBatch *batch, SinkTick tick, void *arg)
{
	SinkResult	r = nats_submit(sink, batch);
	SinkResult	r2 = nats_settle(sink, batch, tick, arg);

	return r == SINK_UNAVAILABLE ? r : r2;
}

/*
 * The idle probe: a connection the server closed is dropped; without one,
 * the sink connects as the next batch would (which checks the subject's
 * stream); with one, a PING/PONG round trip (natsConnection_FlushTimeout)
 * and the stream check again.  Nothing is published.
 */
static SinkResult
nats_probe(Sink *sink, char **err)
{
	NatsSink   *s = (NatsSink *) sink;
	char		msg[1024];
	bool		no_stream;
	natsStatus	st;

	if (s->nc != NULL && natsConnection_IsClosed(s->nc))
		nats_drop(s);
	if (s->nc == NULL)
	{
		if (!nats_connect(s, msg, sizeof(msg), &no_stream) ||
			!nats_jetstream(s, msg, sizeof(msg)))
		{
			nats_drop(s);
			*err = sink_errorf("nats: %s", msg);
			return SINK_UNAVAILABLE;
		}
		return SINK_OK;
	}
	st = natsConnection_FlushTimeout(s->nc, (int64_t) (relay_opts.connect_timeout * 1000));
	if (st != NATS_OK)
	{
		*err = sink_errorf("nats: no PONG from %s: %s", s->server, natsStatus_GetText(st));
		nats_drop(s);
		return SINK_UNAVAILABLE;
	}
	if (!nats_stream_check(s, msg, sizeof(msg), &no_stream))
	{
		*err = sink_errorf("nats: %s", msg);
		return SINK_UNAVAILABLE;
	}
	return SINK_OK;
}

/* Close the connection and free the sink. */
static void
nats_close(Sink *sink)
{
	NatsSink   *s = (NatsSink *) sink;

	nats_drop(s);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
	free(s->server);
	free(s->subject);
	free(s->user);
	sink_free_secret(s->password);
	sink_free_secret(s->token);
	free(s->shown);
	free(s);
}

/* What the sink is, for the logs. */
static const char *
nats_describe(Sink *sink)
{
	return ((NatsSink *) sink)->shown;
}

const SinkOps sink_nats_ops = {
	.name = "nats",
	.schemes = nats_schemes,
	.usage = "  nats://[USER@]HOST[:PORT]/SUBJECT[?window=N]\n"
	"                      JetStream publish, Nats-Msg-Id: <command_id>; ack after\n"
	"                      the PubAck; a subject no stream captures exits 2;\n"
	"                      OUTBOX_RELAY_NATS_PASSWORD, OUTBOX_RELAY_NATS_TOKEN\n",
	.open = nats_open,
	.deliver = nats_deliver,
	.submit = nats_submit,
	.settle = nats_settle,
	.probe = nats_probe,
	.confirm = NULL,
	.reopen = NULL,
	.close = nats_close,
	.describe = nats_describe,
};
