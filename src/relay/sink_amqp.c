/*-------------------------------------------------------------------------
 *
 * sink_amqp.c
 *		The AMQP 0-9-1 sink (RabbitMQ) of outbox-relay, through librabbitmq:
 *		amqp://USER@HOST[:PORT][/VHOST]?exchange=X&routing_key=K
 *
 * One connection and one channel in confirm mode.  Each command is a
 * persistent message (delivery_mode 2) published with the mandatory flag,
 * its message_id the command_id, its type the kind, and command_id, run_id,
 * seq, kind and deliveries in its headers table, followed by the
 * producer's headers as long strings under their own names (one the relay
 * sets itself keeps the relay's value); the producer's correlation-id,
 * reply-to and priority set those basic properties too (see
 * amqp_header_props); the body is the command's JSON object.  Up to `window` messages are unconfirmed at once; the batch
 * returns once every one of them is settled:
 *
 *	basic.ack			SINK_OK (the broker has taken responsibility: for a
 *						durable queue, written it to disk)
 *	basic.return		SINK_RETRY: unroutable (no queue bound for the routing
 *						key); the ack that follows it does not count
 *	basic.nack			SINK_RETRY: the broker could not store it
 *	channel closed		404 (no such exchange), 403 (access refused): the
 *						broker refuses the relay, SINK_UNAVAILABLE; any other
 *						code: SINK_RETRY for what was unconfirmed
 *	connection lost, refused, login refused, no confirm within --timeout
 *						SINK_UNAVAILABLE: the relay holds the batch, backs
 *						off and calls again; the sink reconnects
 *
 * Deliver now, confirm later (sink.h: submit, settle): submit publishes
 * what the window allows of a batch and returns; settle waits for its
 * confirms.  At most two batches (rounds) are on the channel at once, the
 * one the relay waits for and the one it claimed ahead; the window counts
 * both.  Rounds are published in the order they were submitted, each to
 * its end before the next begins, so each round owns one run of the
 * channel's delivery tags and a confirm (also a multiple one, which may
 * span both) settles exactly the messages it names; a return is matched by
 * its message_id.  A broken connection settles what is unconfirmed in
 * both rounds as below.
 *
 * A message that was published but not confirmed when the connection broke
 * may have reached the queue: it is published again later, with the same
 * message_id (at least once).  After a timeout or an interruption the
 * connection is dropped, so late confirms cannot be mistaken for those of
 * a later round.
 *
 * The password is never in the URL (ps would show it): it is read from the
 * file named by password_file=PATH, or from OUTBOX_RELAY_AMQP_PASSWORD.
 * Heartbeats are off (the relay's one thread cannot answer them while it
 * waits on the database); a dead peer is found by the socket or by the
 * confirm timeout.
 *
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>

#include "sink.h"

#define AMQP_DEFAULT_PORT	5672
#define AMQP_CHANNEL		1
#define AMQP_NHEADERS		5	/* the relay's own; the producer's follow */

/* Where each command of a round stands. */
typedef enum AmqpPending
{
	AP_NONE,					/* not published in this round */
	AP_WAIT,					/* published, not confirmed */
	AP_RETURNED,				/* returned as unroutable; its ack follows */
	AP_SETTLED
} AmqpPending;

/*
 * One batch handed to the channel (submit) and not settled yet: at most
 * two at once, the one the relay waits for and the one claimed ahead.
 * Rounds are published in the order they were submitted, an earlier one
 * to its end before a later one begins, so each round's delivery tags are
 * one run first_tag .. first_tag + ntags - 1.
 */
#define AMQP_ROUNDS 2
typedef struct AmqpRound
{
	RelayBatch *batch;			/* NULL: the slot is free */
	unsigned	order_no;		/* rounds are published in this order */
	AmqpPending *pending;		/* by command index */
	uint64_t	first_tag;		/* the channel's delivery tag of by_tag[0] */
	int		   *by_tag;			/* command index of delivery tag first_tag + i */
	int			ntags;
	int			inflight;		/* published, not settled */
	int			low;			/* lowest tag offset maybe unsettled */
	int			next;			/* the next command to publish */
	bool		ended;			/* nothing more is published of it */
	bool		unavailable;	/* the broker was found unavailable */
} AmqpRound;

typedef struct AmqpSink
{
	Sink		base;
	char	   *host;
	int			port;
	char	   *vhost;
	char	   *user;
	char	   *password;
	char	   *exchange;
	char	   *routing_key;
	long		window;
	amqp_connection_state_t conn;	/* NULL: not connected */
	uint64_t	next_tag;		/* delivery tag of the channel's next publish */
	unsigned	order_no;		/* the last round's number */
	AmqpRound	rounds[AMQP_ROUNDS];
	int			inflight;		/* unconfirmed messages of all rounds */
	double		last_progress;	/* when a frame came or the window opened */
	char	   *shown;
} AmqpSink;

static const char *const amqp_schemes[] = {"amqp", NULL};
static const char *const amqp_options[] = {"exchange", "routing_key", "window",
"password_file", NULL};

/* Parse and check the URL (sink.h: open). */
static SinkOpenResult
amqp_open(const char *url, Sink **out, char **err)
{
	SinkUrl		u;
	SinkHost   *hosts = NULL;
	AmqpSink   *s;
	const char *v;
	int			n = 0;
	PQExpBufferData shown;

	if (sink_url_one_host(url, "amqp", amqp_options, AMQP_DEFAULT_PORT,
						  "use password_file=PATH or OUTBOX_RELAY_AMQP_PASSWORD",
						  &u, &hosts, &n, err) != SINK_OPEN_OK)
		return SINK_OPEN_CONFIG;
	if (sink_url_option(&u, "exchange") == NULL)
	{
		*err = sink_errorf("invalid amqp sink URL: option \"exchange\" is required (\"exchange=\" for the default exchange)");
		goto config;
	}
	if (sink_url_option(&u, "routing_key") == NULL)
	{
		*err = sink_errorf("invalid amqp sink URL: option \"routing_key\" is required");
		goto config;
	}
	if (strlen(sink_url_option(&u, "exchange")) > 255 ||
		strlen(sink_url_option(&u, "routing_key")) > 255 ||
		strlen(u.path) > 255 || (u.user && strlen(u.user) > 255))
	{
		*err = sink_errorf("invalid amqp sink URL: exchange, routing_key, vhost and user are at most 255 bytes");
		goto config;
	}

	s = relay_malloc(sizeof(AmqpSink));
	memset(s, 0, sizeof(AmqpSink));
	s->window = 256;
	if (!sink_url_int_option(&u, "window", 1, 65535, &s->window, err))
	{
		free(s);
		goto config;
	}
	s->host = relay_strdup(hosts[0].host);
	s->port = hosts[0].port;
	/* no path is vhost "/", as RabbitMQ's clients have it; else the path */
	s->vhost = relay_strdup(u.path[0] != '\0' ? u.path : "/");
	s->user = relay_strdup(u.user != NULL ? u.user : "guest");
	s->exchange = relay_strdup(sink_url_option(&u, "exchange"));
	s->routing_key = relay_strdup(sink_url_option(&u, "routing_key"));
	if ((v = sink_url_option(&u, "password_file")) != NULL)
	{
		s->password = sink_read_secret("amqp", v, err);
		if (s->password == NULL)
		{
			free(s);
			sink_hosts_free(hosts, n);
			sink_url_free(&u);
			return SINK_OPEN_FAILED;
		}
	}
	else if ((v = getenv("OUTBOX_RELAY_AMQP_PASSWORD")) != NULL)
		s->password = relay_strdup(v);
	else
		s->password = relay_strdup(u.user != NULL ? "" : "guest");

	initPQExpBuffer(&shown);
	appendPQExpBuffer(&shown, "amqp://%s@%s:%d vhost \"%s\" exchange \"%s\" routing_key \"%s\"",
					  s->user, s->host, s->port, s->vhost, s->exchange, s->routing_key);
	s->shown = relay_strdup(shown.data);
	termPQExpBuffer(&shown);

	sink_hosts_free(hosts, n);
	sink_url_free(&u);
	*out = &s->base;
	return SINK_OPEN_OK;

config:
	if (hosts != NULL)
		sink_hosts_free(hosts, n);
	sink_url_free(&u);
	return SINK_OPEN_CONFIG;
}

/* Drop the connection (without waiting for the broker). */
static void
amqp_drop(AmqpSink *s)
{
	if (s->conn == NULL)
		return;
	amqp_destroy_connection(s->conn);
	s->conn = NULL;
}

/* Text of a failed RPC reply, into buf. */
static const char *
amqp_reply_text(amqp_rpc_reply_t r, char *buf, size_t size)
{
	switch (r.reply_type)
	{
		case AMQP_RESPONSE_NORMAL:
			snprintf(buf, size, "no error");
			break;
		case AMQP_RESPONSE_NONE:
			snprintf(buf, size, "no reply from the broker");
			break;
		case AMQP_RESPONSE_LIBRARY_EXCEPTION:
			snprintf(buf, size, "%s", amqp_error_string2(r.library_error));
			break;
		case AMQP_RESPONSE_SERVER_EXCEPTION:
			if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD)
			{
				amqp_connection_close_t *c = r.reply.decoded;

				snprintf(buf, size, "connection closed by the broker: %d %.*s", c->reply_code,
						 (int) c->reply_text.len, (char *) c->reply_text.bytes);
			}
			else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD)
			{
				amqp_channel_close_t *c = r.reply.decoded;

				snprintf(buf, size, "channel closed by the broker: %d %.*s", c->reply_code,
						 (int) c->reply_text.len, (char *) c->reply_text.bytes);
			}
			else
				snprintf(buf, size, "broker error (method 0x%08X)", r.reply.id);
			break;
	}
	return buf;
}

/*
 * Connect, log in, open the channel and put it in confirm mode.  False
 * with msg set when the broker cannot be had.
 */
static bool
amqp_connect(AmqpSink *s, char *msg, size_t size)
{
	amqp_socket_t *sock;
	struct timeval tv;
	amqp_rpc_reply_t r;
	char		buf[512];
	int			rc;

	s->conn = amqp_new_connection();
	if (s->conn == NULL)
	{
		snprintf(msg, size, "could not allocate an AMQP connection");
		return false;
	}
	sock = amqp_tcp_socket_new(s->conn);
	if (sock == NULL)
	{
		snprintf(msg, size, "could not allocate an AMQP socket");
		goto fail;
	}
	tv.tv_sec = (long) relay_opts.connect_timeout;
	tv.tv_usec = (long) ((relay_opts.connect_timeout - tv.tv_sec) * 1e6);
	rc = amqp_socket_open_noblock(sock, s->host, s->port, &tv);
	if (rc != AMQP_STATUS_OK)
	{
		snprintf(msg, size, "could not connect to %s:%d: %s", s->host, s->port,
				 amqp_error_string2(rc));
		goto fail;
	}
	/*
	 * The broker's replies to login and the channel calls are bounded too,
	 * and so is a write to a broker that stopped reading (librabbitmq's
	 * sends block): it fails instead of hanging the relay.
	 */
	tv.tv_sec = (long) relay_opts.timeout;
	tv.tv_usec = (long) ((relay_opts.timeout - tv.tv_sec) * 1e6);
	amqp_set_handshake_timeout(s->conn, &tv);
	amqp_set_rpc_timeout(s->conn, &tv);
	(void) setsockopt(amqp_get_sockfd(s->conn), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	r = amqp_login(s->conn, s->vhost, 0, AMQP_DEFAULT_FRAME_SIZE, 0,
				   AMQP_SASL_METHOD_PLAIN, s->user, s->password);
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		snprintf(msg, size, "could not log in to %s:%d as \"%s\" (vhost \"%s\"): %s",
				 s->host, s->port, s->user, s->vhost, amqp_reply_text(r, buf, sizeof(buf)));
		goto fail;
	}
	amqp_channel_open(s->conn, AMQP_CHANNEL);
	r = amqp_get_rpc_reply(s->conn);
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		snprintf(msg, size, "could not open a channel: %s", amqp_reply_text(r, buf, sizeof(buf)));
		goto fail;
	}
	amqp_confirm_select(s->conn, AMQP_CHANNEL);
	r = amqp_get_rpc_reply(s->conn);
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		snprintf(msg, size, "could not enable publisher confirms: %s", amqp_reply_text(r, buf, sizeof(buf)));
		goto fail;
	}
	s->next_tag = 1;
	relay_debug("connected to %s", s->shown);
	return true;

fail:
	amqp_drop(s);
	return false;
}

/* A string field of the headers table. */
static void
amqp_header_str(amqp_table_entry_t *e, const char *key, const char *value)
{
	e->key = amqp_cstring_bytes(key);
	e->value.kind = AMQP_FIELD_KIND_UTF8;
	e->value.value.bytes = amqp_cstring_bytes(value ? value : "");
}

/* The bytes of a buffer, for librabbitmq. */
static amqp_bytes_t
amqp_buffer_bytes(PQExpBuffer buf)
{
	amqp_bytes_t b;

	b.len = buf->len;
	b.bytes = buf->data;
	return b;
}

/*
 * The producer headers that also set an AMQP basic property: both
 * spellings of each name (the hyphenated one wins when both are given).
 * The header stays in the headers table as well.  content-type and
 * content-encoding are not among them: they describe the producer's
 * payload, and the body is the JSON object around it (content_type stays
 * application/json).  expiration is not either: a TTL would let the broker
 * drop a message the outbox reported published.
 */
static void
amqp_header_props(const RelayCommand *cmd, amqp_basic_properties_t *props)
{
	const char *corr = NULL;
	const char *reply = NULL;
	bool		corr_hyphen = false;
	bool		reply_hyphen = false;
	int			j;

	for (j = 0; j < cmd->nheaders; j++)
	{
		const char *name = cmd->headers[j].name;
		const char *value = cmd->headers[j].value;
		size_t		len = strlen(value);

		if (len > 255)
			continue;			/* a shortstr holds 255 bytes */
		if (strcasecmp(name, "correlation-id") == 0)
		{
			corr = value;
			corr_hyphen = true;
		}
		else if (strcasecmp(name, "correlation_id") == 0 && !corr_hyphen)
			corr = value;
		else if (strcasecmp(name, "reply-to") == 0)
		{
			reply = value;
			reply_hyphen = true;
		}
		else if (strcasecmp(name, "reply_to") == 0 && !reply_hyphen)
			reply = value;
		else if (strcasecmp(name, "priority") == 0 && len >= 1 && len <= 3 &&
				 strspn(value, "0123456789") == len && atoi(value) <= 255)
		{
			props->_flags |= AMQP_BASIC_PRIORITY_FLAG;
			props->priority = (uint8_t) atoi(value);
		}
	}
	if (corr != NULL)
	{
		props->_flags |= AMQP_BASIC_CORRELATION_ID_FLAG;
		props->correlation_id = amqp_cstring_bytes(corr);
	}
	if (reply != NULL)
	{
		props->_flags |= AMQP_BASIC_REPLY_TO_FLAG;
		props->reply_to = amqp_cstring_bytes(reply);
	}
}

/* Publish command i of the round.  False when the connection broke. */
static bool
amqp_publish(AmqpSink *s, AmqpRound *rd, int i, PQExpBuffer body, char *msg, size_t size)
{
	RelayCommand *cmd = &rd->batch->cmds[i];
	amqp_basic_properties_t props;
	static const char *const own[] = {"command_id", "run_id", "seq", "kind",
	"deliveries", "ordering_key", NULL};
	amqp_table_entry_t headers[AMQP_NHEADERS + 1 + RELAY_MAX_HEADERS];
	int			nh = AMQP_NHEADERS;
	int			rc;
	int			j;

	resetPQExpBuffer(body);
	sink_command_json(body, cmd);

	amqp_header_str(&headers[0], "command_id", cmd->command_id);
	amqp_header_str(&headers[1], "run_id", cmd->run_id);
	amqp_header_str(&headers[2], "kind", cmd->kind);
	headers[3].key = amqp_cstring_bytes("deliveries");
	headers[3].value.kind = AMQP_FIELD_KIND_I32;
	headers[3].value.value.i32 = cmd->deliveries;
	headers[4].key = amqp_cstring_bytes("seq");
	headers[4].value.kind = AMQP_FIELD_KIND_I64;
	headers[4].value.value.i64 = cmd->seq;
	if (cmd->ordering_key)
		amqp_header_str(&headers[nh++], "ordering_key", cmd->ordering_key);
	for (j = 0; j < cmd->nheaders; j++)
		if (!sink_header_reserved(cmd->headers[j].name) &&
			!sink_header_listed(cmd->headers[j].name, own))
			amqp_header_str(&headers[nh++], cmd->headers[j].name, cmd->headers[j].value);

	memset(&props, 0, sizeof(props));
	props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
		AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_APP_ID_FLAG |
		AMQP_BASIC_HEADERS_FLAG;
	props.content_type = amqp_cstring_bytes("application/json");
	props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
	props.message_id = amqp_cstring_bytes(cmd->command_id);
	props.type = amqp_cstring_bytes(cmd->kind ? cmd->kind : "");
	props.app_id = amqp_cstring_bytes(RELAY_NAME);
	props.headers.num_entries = nh;
	props.headers.entries = headers;
	amqp_header_props(cmd, &props);

	rc = amqp_basic_publish(s->conn, AMQP_CHANNEL, amqp_cstring_bytes(s->exchange),
							amqp_cstring_bytes(s->routing_key), 1, 0, &props,
							amqp_buffer_bytes(body));
	if (rc != AMQP_STATUS_OK)
	{
		snprintf(msg, size, "could not publish to %s:%d: %s", s->host, s->port,
				 amqp_error_string2(rc));
		return false;
	}
	if (rd->ntags == 0)
		rd->first_tag = s->next_tag;
	rd->by_tag[rd->ntags++] = i;
	s->next_tag++;
	rd->pending[i] = AP_WAIT;
	rd->inflight++;
	s->inflight++;
	return true;
}

/* Settle the message of the round's tag offset t with result r. */
static void
amqp_settle_one(AmqpSink *s, AmqpRound *rd, int t, SinkResult r, const char *error)
{
	int			i = rd->by_tag[t];
	RelayCommand *cmd = &rd->batch->cmds[i];
	char	   *saved = NULL;

	if (rd->pending[i] == AP_SETTLED || rd->pending[i] == AP_NONE)
		return;
	if (rd->pending[i] == AP_RETURNED && r == SINK_OK)
	{
		/* the ack of a returned message: it was not routed (error set) */
		r = SINK_RETRY;
		saved = relay_strdup(cmd->error);
		error = saved;
	}
	sink_outcome(cmd, r, error);
	free(saved);
	rd->pending[i] = AP_SETTLED;
	rd->inflight--;
	s->inflight--;
}

/*
 * A basic.ack or basic.nack for the channel's delivery tag `tag`, maybe
 * multiple (every unconfirmed tag up to it, in whichever round).
 */
static void
amqp_confirmed(AmqpSink *s, uint64_t tag, bool multiple, SinkResult r)
{
	const char *error = r == SINK_OK ? NULL : "the broker refused the message (basic.nack)";
	int			k;

	for (k = 0; k < AMQP_ROUNDS; k++)
	{
		AmqpRound  *rd = &s->rounds[k];
		int			t;
		int			j;

		if (rd->batch == NULL || rd->ntags == 0 || tag < rd->first_tag)
			continue;
		t = tag - rd->first_tag >= (uint64_t) rd->ntags ? rd->ntags - 1 : (int) (tag - rd->first_tag);
		if (multiple)
		{
			for (j = rd->low; j <= t; j++)
				amqp_settle_one(s, rd, j, r, error);
		}
		else if (tag - rd->first_tag < (uint64_t) rd->ntags)
			amqp_settle_one(s, rd, t, r, error);
		while (rd->low < rd->ntags && rd->pending[rd->by_tag[rd->low]] == AP_SETTLED)
			rd->low++;
	}
}

/* A basic.return: find the command by message_id and mark it returned. */
static bool
amqp_returned(AmqpSink *s, amqp_basic_return_t *ret, char *msg, size_t size)
{
	amqp_message_t m;
	amqp_rpc_reply_t r;
	char		err[600];
	int			k;
	int			t;

	snprintf(err, sizeof(err), "unroutable: exchange \"%s\" returned the message (%d %.*s) for routing key \"%s\"",
			 s->exchange, ret->reply_code, (int) ret->reply_text.len,
			 (char *) ret->reply_text.bytes, s->routing_key);
	r = amqp_read_message(s->conn, AMQP_CHANNEL, &m, 0);
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		amqp_reply_text(r, msg, size);
		return false;
	}
	for (k = 0; k < AMQP_ROUNDS; k++)
	{
		AmqpRound  *rd = &s->rounds[k];

		if (rd->batch == NULL)
			continue;
		for (t = rd->low; t < rd->ntags; t++)
		{
			int			i = rd->by_tag[t];
			RelayCommand *cmd = &rd->batch->cmds[i];

			if (rd->pending[i] == AP_WAIT &&
				(m.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) &&
				m.properties.message_id.len == strlen(cmd->command_id) &&
				memcmp(m.properties.message_id.bytes, cmd->command_id, m.properties.message_id.len) == 0)
			{
				rd->pending[i] = AP_RETURNED;
				free(cmd->error);
				cmd->error = relay_clean_error(err, 900);
				amqp_destroy_message(&m);
				return true;
			}
		}
	}
	amqp_destroy_message(&m);
	return true;
}

/*
 * Wait up to `wait` seconds for one frame and handle it.  Returns 1 when a
 * frame was handled, 0 on timeout, -1 when the connection or channel broke
 * (msg set, *unavailable set when the broker refuses the relay).
 */
static int
amqp_poll(AmqpSink *s, double wait, char *msg, size_t size, bool *unavailable)
{
	amqp_frame_t frame;
	struct timeval tv;
	int			rc;

	tv.tv_sec = (long) wait;
	tv.tv_usec = (long) ((wait - tv.tv_sec) * 1e6);
	rc = amqp_simple_wait_frame_noblock(s->conn, &frame, &tv);
	if (rc == AMQP_STATUS_TIMEOUT)
		return 0;
	if (rc != AMQP_STATUS_OK)
	{
		snprintf(msg, size, "lost the connection to %s:%d: %s", s->host, s->port,
				 amqp_error_string2(rc));
		*unavailable = true;
		return -1;
	}
	if (frame.frame_type != AMQP_FRAME_METHOD)
		return 1;
	switch (frame.payload.method.id)
	{
		case AMQP_BASIC_ACK_METHOD:
			{
				amqp_basic_ack_t *a = frame.payload.method.decoded;

				amqp_confirmed(s, a->delivery_tag, a->multiple, SINK_OK);
				break;
			}
		case AMQP_BASIC_NACK_METHOD:
			{
				amqp_basic_nack_t *a = frame.payload.method.decoded;

				amqp_confirmed(s, a->delivery_tag, a->multiple, SINK_RETRY);
				break;
			}
		case AMQP_BASIC_RETURN_METHOD:
			if (!amqp_returned(s, frame.payload.method.decoded, msg, size))
			{
				*unavailable = true;
				return -1;
			}
			break;
		case AMQP_CHANNEL_CLOSE_METHOD:
			{
				amqp_channel_close_t *c = frame.payload.method.decoded;
				amqp_channel_close_ok_t ok;

				snprintf(msg, size, "the broker closed the channel: %d %.*s",
						 c->reply_code, (int) c->reply_text.len, (char *) c->reply_text.bytes);
				/* 404: no such exchange; 403: not allowed; 320/5xx: going away */
				*unavailable = (c->reply_code == AMQP_NOT_FOUND ||
								c->reply_code == AMQP_ACCESS_REFUSED ||
								c->reply_code == AMQP_CONNECTION_FORCED ||
								c->reply_code >= 500);
				memset(&ok, 0, sizeof(ok));
				amqp_send_method(s->conn, AMQP_CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
				return -1;
			}
		case AMQP_CONNECTION_CLOSE_METHOD:
			{
				amqp_connection_close_t *c = frame.payload.method.decoded;
				amqp_connection_close_ok_t ok;

				snprintf(msg, size, "the broker closed the connection: %d %.*s",
						 c->reply_code, (int) c->reply_text.len, (char *) c->reply_text.bytes);
				*unavailable = true;
				memset(&ok, 0, sizeof(ok));
				amqp_send_method(s->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
				return -1;
			}
		default:
			break;
	}
	return 1;
}

/*
 * Cork the socket while a window is published (Linux TCP_CORK), and
 * uncork it to send what was corked: librabbitmq writes each message as
 * three frames, the last one pushed on its own, so a batch would reach the
 * broker as one small segment per message.
 */
static void
amqp_cork(AmqpSink *s, bool on)
{
#ifdef TCP_CORK
	int			fd = amqp_get_sockfd(s->conn);
	int			v = on ? 1 : 0;

	if (fd >= 0)
		(void) setsockopt(fd, IPPROTO_TCP, TCP_CORK, &v, sizeof(v));
#else
	(void) s;
	(void) on;
#endif
}

/*
 * The idle probe: connect (log in, open the channel in confirm mode) when
 * not connected, as the next batch would; then a passive exchange.declare
 * of the exchange, which only checks that it exists (the default exchange
 * always does: a basic.qos round trip, which a publishing channel does not
 * use, checks the connection instead).  Nothing is published.  A refusal
 * closes the channel: the connection is dropped, and the next batch makes
 * a new one.
 */
static SinkResult
amqp_probe(Sink *sink, char **err)
{
	AmqpSink   *s = (AmqpSink *) sink;
	amqp_rpc_reply_t r;
	char		msg[1024];
	char		buf[512];

	if (s->conn == NULL && !amqp_connect(s, msg, sizeof(msg)))
	{
		*err = sink_errorf("amqp %s:%d: %s", s->host, s->port, msg);
		return SINK_UNAVAILABLE;
	}
	if (s->exchange[0] != '\0')
		amqp_exchange_declare(s->conn, AMQP_CHANNEL, amqp_cstring_bytes(s->exchange),
							  amqp_cstring_bytes("direct"), 1, 0, 0, 0, amqp_empty_table);
	else
		amqp_basic_qos(s->conn, AMQP_CHANNEL, 0, 0, 0);
	r = amqp_get_rpc_reply(s->conn);
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		*err = sink_errorf("amqp %s:%d: %s \"%s\": %s", s->host, s->port,
						   s->exchange[0] ? "exchange" : "connection", s->exchange,
						   amqp_reply_text(r, buf, sizeof(buf)));
		amqp_drop(s);
		return SINK_UNAVAILABLE;
	}
	return SINK_OK;
}

/* The round of a batch, or NULL. */
static AmqpRound *
amqp_round(AmqpSink *s, RelayBatch *batch)
{
	return sink_round(s->rounds, sizeof(s->rounds[0]), AMQP_ROUNDS, batch);
}

/* The rounds in the order they were submitted (unused slots last). */
static void
amqp_rounds_in_order(AmqpSink *s, AmqpRound **out)
{
	AmqpRound  *a = &s->rounds[0];
	AmqpRound  *b = &s->rounds[1];

	if (a->batch == NULL || (b->batch != NULL && b->order_no < a->order_no))
	{
		out[0] = b;
		out[1] = a;
	}
	else
	{
		out[0] = a;
		out[1] = b;
	}
}

/*
 * The connection is of no use any more (lost, refused, no confirm in time,
 * or the relay stops): what is unconfirmed in every round gets r with msg,
 * as its fate is unknown (it is published again later); with hold, what
 * was not published yet is held too (SINK_UNAVAILABLE), else it stays to
 * do.  Nothing more of these rounds is published, and the connection is
 * dropped, so that late confirms cannot be mistaken for those of a later
 * round.
 */
static void
amqp_break(AmqpSink *s, SinkResult r, bool hold, const char *msg)
{
	int			k;
	int			t;
	int			i;

	for (k = 0; k < AMQP_ROUNDS; k++)
	{
		AmqpRound  *rd = &s->rounds[k];

		if (rd->batch == NULL)
			continue;
		for (t = rd->low; t < rd->ntags; t++)
			amqp_settle_one(s, rd, t, r, msg);
		rd->low = rd->ntags;
		if (hold)
			for (i = rd->next; i < rd->batch->n; i++)
				sink_outcome(&rd->batch->cmds[i], SINK_UNAVAILABLE, msg);
		if (r == SINK_UNAVAILABLE || hold)
			rd->unavailable = true;
		rd->ended = true;
	}
	s->inflight = 0;
	relay_debug("amqp: %s", msg);
	amqp_drop(s);
}

/*
 * Publish what the window allows, the rounds in the order they were
 * submitted (a later one only once the earlier one is published to its
 * end).  False when the connection broke (amqp_break has settled it).
 */
static bool
amqp_fill(AmqpSink *s, PQExpBuffer body)
{
	AmqpRound  *order[AMQP_ROUNDS];
	char		msg[1024];
	bool		corked = false;
	int			k;

	if (s->conn == NULL)
		return true;
	amqp_rounds_in_order(s, order);
	for (k = 0; k < AMQP_ROUNDS && s->inflight < s->window; k++)
	{
		AmqpRound  *rd = order[k];
		RelayBatch *batch = rd->batch;

		if (batch == NULL)
			break;
		if (rd->ended)
			continue;
		while (s->inflight < s->window && rd->next < batch->n)
		{
			RelayCommand *cmd = &batch->cmds[rd->next];

			if (cmd->state != CMD_TODO)
			{
				rd->next++;
				continue;
			}
			if (strlen(cmd->command_id) > 255)
			{
				sink_outcome(cmd, SINK_FATAL, "command_id is longer than an AMQP message_id (255 bytes)");
				rd->next++;
				continue;
			}
			if (!corked)
			{
				amqp_cork(s, true);
				corked = true;
			}
			if (s->inflight == 0)
				s->last_progress = relay_now();
			if (!amqp_publish(s, rd, rd->next, body, msg, sizeof(msg)))
			{
				amqp_break(s, SINK_UNAVAILABLE, true, msg);
				return false;
			}
			rd->next++;
		}
		if (rd->next < batch->n)
			break;				/* the window is full */
	}
	if (corked)
		amqp_cork(s, false);
	return true;
}

/*
 * Start delivering the batch (sink.h: submit): connect when needed and
 * publish what the window allows, without waiting for a confirm; settle
 * waits for them.
 */
static SinkResult
amqp_submit(Sink *sink, RelayBatch *batch)
{
	AmqpSink   *s = (AmqpSink *) sink;
	AmqpRound  *rd = sink_free_round(s->rounds, sizeof(s->rounds[0]), AMQP_ROUNDS, "amqp");
	PQExpBufferData body;
	char		msg[1024];
	int			i;

	memset(rd, 0, sizeof(*rd));
	rd->batch = batch;
	rd->order_no = ++s->order_no;
	rd->pending = relay_malloc(sizeof(AmqpPending) * (batch->n + 1));
	rd->by_tag = relay_malloc(sizeof(int) * (batch->n + 1));
	memset(rd->pending, 0, sizeof(AmqpPending) * (batch->n + 1));
	if (s->conn == NULL && !amqp_connect(s, msg, sizeof(msg)))
	{
		for (i = 0; i < batch->n; i++)
			sink_outcome(&batch->cmds[i], SINK_UNAVAILABLE, msg);
		rd->ended = true;
		rd->unavailable = true;
		return SINK_UNAVAILABLE;
	}
	initPQExpBuffer(&body);
	(void) amqp_fill(s, &body);
	termPQExpBuffer(&body);
	return rd->unavailable ? SINK_UNAVAILABLE : SINK_OK;
}

/*
 * Wait until every message of a submitted batch is confirmed, nacked or
 * returned (sink.h: settle), publishing the rest of it as the window frees
 * up; the confirms of the other round are taken in meanwhile.
 */
static SinkResult
amqp_settle(Sink *sink, RelayBatch *batch, SinkTick tick, void *arg)
{
	AmqpSink   *s = (AmqpSink *) sink;
	AmqpRound  *rd = amqp_round(s, batch);
	PQExpBufferData body;
	char		msg[1024];
	bool		unavailable;

	if (rd == NULL)
		return SINK_OK;			/* not submitted: nothing to wait for */
	initPQExpBuffer(&body);
	for (;;)
	{
		int			got;

		if (!amqp_fill(s, &body))
			continue;			/* broken: every round has ended */
		if (rd->inflight == 0 && (rd->ended || rd->next >= batch->n))
			break;
		if (s->conn == NULL)
			break;				/* not reached: a broken round has ended */

		unavailable = false;
		got = amqp_poll(s, 0.01, msg, sizeof(msg), &unavailable);
		/* take in what came with it before ticking */
		while (got > 0 && (amqp_frames_enqueued(s->conn) || amqp_data_in_buffer(s->conn)))
		{
			int			more = amqp_poll(s, 0, msg, sizeof(msg), &unavailable);

			if (more < 0)
				got = -1;
			if (more <= 0)
				break;
		}
		if (got < 0)
		{
			/* a channel closed for another reason: unconfirmed, retry */
			amqp_break(s, unavailable ? SINK_UNAVAILABLE : SINK_RETRY, unavailable, msg);
			continue;
		}
		if (got > 0)
			s->last_progress = relay_now();
		else if (s->inflight > 0 && relay_now() - s->last_progress > relay_opts.timeout)
		{
			snprintf(msg, sizeof(msg), "no publisher confirm from %s:%d within %g s",
					 s->host, s->port, relay_opts.timeout);
			amqp_break(s, SINK_UNAVAILABLE, true, msg);
			continue;
		}
		if (tick != NULL && !tick(arg))
		{
			/* what is unconfirmed is retried; what is unpublished stays */
			amqp_break(s, SINK_RETRY, false, "delivery interrupted: the relay was stopped");
			continue;
		}
	}
	termPQExpBuffer(&body);
	unavailable = rd->unavailable;
	free(rd->pending);
	free(rd->by_tag);
	memset(rd, 0, sizeof(*rd));
	if (s->conn != NULL && s->inflight == 0)
		amqp_maybe_release_buffers(s->conn);
	return unavailable ? SINK_UNAVAILABLE : SINK_OK;
}

/* Deliver the batch: submit it, then settle it. */
static SinkResult
amqp_deliver(Sink *sink, RelayBatch *batch, SinkTick tick, void *arg)
{
	SinkResult	r = amqp_submit(sink, batch);
	SinkResult	r2 = amqp_settle(sink, batch, tick, arg);

	return r == SINK_UNAVAILABLE ? r : r2;
}

/* Close the connection and free the sink. */
static void
amqp_close(Sink *sink)
{
	AmqpSink   *s = (AmqpSink *) sink;

	if (s->conn != NULL)
	{
		amqp_channel_close(s->conn, AMQP_CHANNEL, AMQP_REPLY_SUCCESS);
		amqp_connection_close(s->conn, AMQP_REPLY_SUCCESS);
		amqp_drop(s);
	}
	free(s->host);
	free(s->vhost);
	free(s->user);
	sink_free_secret(s->password);
	free(s->exchange);
	free(s->routing_key);
	free(s->shown);
	free(s);
}

/* What the sink is, for the logs (no password). */
static const char *
amqp_describe(Sink *sink)
{
	return ((AmqpSink *) sink)->shown;
}

const SinkOps sink_amqp_ops = {
	.name = "amqp",
	.schemes = amqp_schemes,
	.usage = "  amqp://[USER@]HOST[:PORT][/VHOST]?exchange=X&routing_key=K[&window=N][&password_file=PATH]\n"
	"                      RabbitMQ: persistent, mandatory, ack after the publisher\n"
	"                      confirm; password from password_file or\n"
	"                      OUTBOX_RELAY_AMQP_PASSWORD, never in the URL\n",
	.open = amqp_open,
	.deliver = amqp_deliver,
	.submit = amqp_submit,
	.settle = amqp_settle,
	.probe = amqp_probe,
	.confirm = NULL,
	.reopen = NULL,
	.close = amqp_close,
	.describe = amqp_describe,
};
