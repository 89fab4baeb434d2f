/*-------------------------------------------------------------------------
 *
 * sink_mqtt.c
 *		The MQTT sink of outbox-relay, through libmosquitto:
 *		mqtt://[USER@]HOST[:PORT]/TOPIC[?qos=1|2][&window=N][&client_id=ID]
 *
 * MQTT 5.  Each command is a PUBLISH to TOPIC at QoS 1 (or 2), not
 * retained, with the command's JSON object as its payload, content type
 * application/json, and the MQTT 5 user properties command_id, run_id,
 * seq, kind and deliveries, then the producer's headers (one user property
 * each, under its own name) (MQTT has no message id of its own: a consumer
 * detects a duplicate by the command_id property).  Up to `window`
 * messages are unacknowledged at once (libmosquitto holds back what the
 * broker's Receive Maximum does not allow yet); the batch returns once each
 * one is settled:
 *
 *	PUBACK (QoS 1) or PUBCOMP (QoS 2), reason < 0x80
 *						SINK_OK (0x10 "no matching subscribers" included: the
 *						broker took it)
 *	reason 0x87 (not authorized), 0x90 (topic name invalid), in the PUBACK
 *	or in a DISCONNECT (Mosquitto disconnects an MQTT 5 client whose publish
 *	its ACL denies)
 *						SINK_UNAVAILABLE: the broker refuses the relay
 *	reason 0x95 (packet too large), 0x99 (payload format invalid), or a
 *	message the library cannot send at all (too large)
 *						SINK_FATAL: the command itself
 *	any other reason >= 0x80
 *						SINK_RETRY
 *	connection refused or lost, CONNACK refused (e.g. bad user or
 *	password), no PUBACK within --timeout
 *						SINK_UNAVAILABLE: the relay holds the batch, backs
 *						off and calls again; the sink reconnects
 *
 * Deliver now, confirm later (sink.h: submit, settle): submit publishes
 * what the window allows of a batch and returns; settle waits for its
 * acknowledgements.  At most two batches (rounds) are in flight at once,
 * the one the relay waits for and the one it claimed ahead; the window
 * counts both, the rounds are published in the order they were submitted,
 * and each PUBACK or PUBCOMP settles the one message its packet id names
 * (libmosquitto numbers them on the connection, so the two rounds' ids
 * never meet).  A broken connection holds what is unacknowledged in both.
 *
 * The session is clean: what was unacknowledged when the connection broke
 * is published again by the relay on the next connection (at least once,
 * same command_id), from a new libmosquitto client, so that the old one
 * does not resend it as well.  The client id is outbox-relay-WORKER (the
 * --worker name), unique per relay unless client_id says otherwise.  The
 * network loop runs in the relay's thread (mosquitto_loop, 10 ms at a
 * time, so that tick can hand over the next batch), so the callbacks need
 * no locking; keepalive pings are sent while a batch is delivered, and a
 * connection the broker dropped while the relay was idle is reopened
 * before the next batch.
 *
 * The password is never in the URL: OUTBOX_RELAY_MQTT_PASSWORD, or the
 * file named by password_file=PATH.
 *
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mosquitto.h>
#include <mqtt_protocol.h>

#include "sink.h"

#define MQTT_DEFAULT_PORT	1883
#define MQTT_KEEPALIVE		60

#define MP_NONE		0			/* not published in this round */
#define MP_WAIT		1			/* published, awaiting PUBACK/PUBCOMP */
#define MP_SETTLED	2

/*
 * One batch handed to the client (submit) and not settled yet: at most two
 * at once, the one the relay waits for and the one claimed ahead.  Rounds
 * are published in the order they were submitted.
 */
#define MQTT_ROUNDS 2
typedef struct MqttRound
{
	RelayBatch *batch;			/* NULL: the slot is free */
	unsigned	order_no;		/* rounds are published in this order */
	char	   *state;			/* MP_* by command index */
	int		   *mid;			/* message id by command index */
	int			inflight;
	int			cursor;			/* where the next PUBACK is looked for */
	int			next;			/* the next command to publish */
	bool		ended;			/* nothing more is published of it */
	bool		unavailable;	/* the broker was found unavailable */
	bool		refused;		/* a PUBACK said the broker refuses the relay */
	char		refused_msg[512];
} MqttRound;

typedef struct MqttSink
{
	Sink		base;
	char	   *host;
	int			port;
	char	   *user;
	char	   *password;
	char	   *topic;
	char	   *client_id;
	long		qos;
	long		window;
	struct mosquitto *mosq;
	bool		connected;		/* CONNACK accepted, not disconnected since */
	int			disconnect_reason;	/* of the broker's DISCONNECT, or 0 */
	int			connack;		/* -1: no CONNACK yet */
	char	   *shown;
	MqttRound	rounds[MQTT_ROUNDS];
	unsigned	order_no;		/* the last round's number */
	int			inflight;		/* unacknowledged messages of all rounds */
	unsigned	acks;			/* PUBACKs and PUBCOMPs taken in */
	double		last_progress;	/* when one came or the window opened */
	bool		lost;			/* the connection broke during a round */
} MqttSink;

static const char *const mqtt_schemes[] = {"mqtt", NULL};
static const char *const mqtt_options[] = {"qos", "window", "client_id", "password_file", NULL};

/* True when s is a topic one can publish to (no wildcards). */
static bool
mqtt_topic_ok(const char *s)
{
	if (*s == '\0' || strlen(s) > 65535)
		return false;
	for (; *s; s++)
		if (*s == '+' || *s == '#')
			return false;
	return true;
}

/* Whether a round is being delivered. */
static bool
mqtt_active(MqttSink *s)
{
	int			k;

	for (k = 0; k < MQTT_ROUNDS; k++)
		if (s->rounds[k].batch != NULL)
			return true;
	return false;
}

/* libmosquitto: CONNACK. */
static void
mqtt_on_connect(struct mosquitto *mosq, void *obj, int rc, int flags,
				const mosquitto_property *props)
{
	MqttSink   *s = obj;

	(void) mosq;
	(void) flags;
	(void) props;
	s->connack = rc;
	s->connected = (rc == 0);
}

/* libmosquitto: the connection ended. */
static void
mqtt_on_disconnect(struct mosquitto *mosq, void *obj, int rc,
				   const mosquitto_property *props)
{
	MqttSink   *s = obj;

	(void) mosq;
	(void) props;
	/* an MQTT 5 reason code of the broker's DISCONNECT, else a MOSQ_ERR_* */
	if (rc >= 0x80)
		s->disconnect_reason = rc;
	s->connected = false;
	if (mqtt_active(s))
		s->lost = true;
}

/* libmosquitto: PUBACK (QoS 1) or PUBCOMP (QoS 2) of message mid. */
static void
mqtt_on_publish(struct mosquitto *mosq, void *obj, int mid, int reason,
				const mosquitto_property *props)
{
	MqttSink   *s = obj;
	int			r_k;
	int			k;

	(void) mosq;
	(void) props;
	for (r_k = 0; r_k < MQTT_ROUNDS; r_k++)
	{
		MqttRound  *rd = &s->rounds[r_k];
		int			n;

		if (rd->batch == NULL || rd->inflight == 0)
			continue;
		n = rd->batch->n;
		for (k = 0; k < n; k++)
		{
			int			i = (rd->cursor + k) % n;
			RelayCommand *cmd;
			char		err[600];
			SinkResult	r;

			if (rd->state[i] != MP_WAIT || rd->mid[i] != mid)
				continue;
			rd->cursor = (i + 1) % n;
			cmd = &rd->batch->cmds[i];
			rd->state[i] = MP_SETTLED;
			rd->inflight--;
			s->inflight--;
			s->acks++;
			if (reason < 0x80)
			{
				sink_outcome(cmd, SINK_OK, NULL);
				return;
			}
			snprintf(err, sizeof(err), "the broker refused the message: %s (reason 0x%02x)",
					 mosquitto_reason_string(reason), reason);
			switch (reason)
			{
				case MQTT_RC_NOT_AUTHORIZED:
				case MQTT_RC_TOPIC_NAME_INVALID:
					r = SINK_UNAVAILABLE;
					if (!rd->refused)
					{
						rd->refused = true;
						snprintf(rd->refused_msg, sizeof(rd->refused_msg), "%s", err);
					}
					break;
				case MQTT_RC_PACKET_TOO_LARGE:
				case MQTT_RC_PAYLOAD_FORMAT_INVALID:
					r = SINK_FATAL;
					break;
				default:
					r = SINK_RETRY;
					break;
			}
			sink_outcome(cmd, r, err);
			return;
		}
	}
}

/* Free the sink's own fields. */
static void
mqtt_free(MqttSink *s)
{
	if (s->mosq != NULL)
		mosquitto_destroy(s->mosq);
	free(s->host);
	free(s->user);
	sink_free_secret(s->password);
	free(s->topic);
	free(s->client_id);
	free(s->shown);
	free(s);
}

/*
 * (Re)create the libmosquitto client: a new one after a broken connection,
 * so that nothing it still queued from the old one is sent again under
 * message ids of its own.  False with *why (SINK_OPEN_CONFIG: a user name
 * that is not UTF-8; SINK_OPEN_FAILED: out of memory).
 */
static bool
mqtt_client_new(MqttSink *s, SinkOpenResult *why)
{
	if (s->mosq != NULL)
		mosquitto_destroy(s->mosq);
	s->connected = false;
	s->mosq = mosquitto_new(s->client_id, true, s);
	*why = SINK_OPEN_FAILED;
	if (s->mosq == NULL)
		return false;
	mosquitto_int_option(s->mosq, MOSQ_OPT_PROTOCOL_VERSION, MQTT_PROTOCOL_V5);
	mosquitto_int_option(s->mosq, MOSQ_OPT_SEND_MAXIMUM, (int) s->window);
	/* each PUBLISH leaves at once, not held for the ACK of the one before */
	mosquitto_int_option(s->mosq, MOSQ_OPT_TCP_NODELAY, 1);
	mosquitto_connect_v5_callback_set(s->mosq, mqtt_on_connect);
	mosquitto_disconnect_v5_callback_set(s->mosq, mqtt_on_disconnect);
	mosquitto_publish_v5_callback_set(s->mosq, mqtt_on_publish);
	if (s->user != NULL &&
		mosquitto_username_pw_set(s->mosq, s->user, s->password) != MOSQ_ERR_SUCCESS)
	{
		*why = SINK_OPEN_CONFIG;
		return false;
	}
	return true;
}

/* Parse and check the URL; create the client (sink.h: open). */
static SinkOpenResult
mqtt_open(const char *url, Sink **out, char **err)
{
	SinkUrl		u;
	SinkHost   *hosts = NULL;
	MqttSink   *s;
	const char *v;
	int			n = 0;
	PQExpBufferData buf;
	SinkOpenResult rc_open;

	if (sink_url_one_host(url, "mqtt", mqtt_options, MQTT_DEFAULT_PORT,
						  "use password_file=PATH or OUTBOX_RELAY_MQTT_PASSWORD",
						  &u, &hosts, &n, err) != SINK_OPEN_OK)
		return SINK_OPEN_CONFIG;
	if (!mqtt_topic_ok(u.path))
	{
		*err = sink_errorf("invalid mqtt sink URL: the path must be a topic to publish to (not empty, no + or # wildcards)");
		goto config;
	}

	s = relay_malloc(sizeof(MqttSink));
	memset(s, 0, sizeof(MqttSink));
	s->qos = 1;
	s->window = 256;
	s->connack = -1;
	if (!sink_url_int_option(&u, "qos", 1, 2, &s->qos, err) ||
		!sink_url_int_option(&u, "window", 1, 65535, &s->window, err))
	{
		if (sink_url_option(&u, "qos") != NULL && strcmp(sink_url_option(&u, "qos"), "0") == 0)
		{
			free(*err);
			*err = sink_errorf("invalid mqtt sink URL: qos=0 is refused (the broker would confirm nothing); use qos=1 or qos=2");
		}
		free(s);
		goto config;
	}
	s->host = relay_strdup(hosts[0].host);
	s->port = hosts[0].port;
	s->topic = relay_strdup(u.path);
	s->user = u.user ? relay_strdup(u.user) : NULL;
	if ((v = sink_url_option(&u, "client_id")) != NULL)
		s->client_id = relay_strdup(v);
	else
	{
		char		id[512];

		/* the worker name (HOST:PID by default) is unique per relay */
		snprintf(id, sizeof(id), "%s-%s", RELAY_NAME, relay_opts.worker ? relay_opts.worker : "");
		s->client_id = relay_strdup(id);
	}
	if ((v = sink_url_option(&u, "password_file")) != NULL)
	{
		s->password = sink_read_secret("mqtt", v, err);
		if (s->password == NULL)
		{
			mqtt_free(s);
			sink_hosts_free(hosts, n);
			sink_url_free(&u);
			return SINK_OPEN_FAILED;
		}
	}
	else if ((v = getenv("OUTBOX_RELAY_MQTT_PASSWORD")) != NULL)
		s->password = relay_strdup(v);
	if (s->password != NULL && s->user == NULL)
	{
		*err = sink_errorf("invalid mqtt sink URL: a password needs a user (mqtt://USER@HOST...)");
		mqtt_free(s);
		goto config;
	}

	initPQExpBuffer(&buf);
	appendPQExpBuffer(&buf, "mqtt://%s%s%s:%d topic \"%s\" (QoS %ld, client id \"%s\")",
					  s->user ? s->user : "", s->user ? "@" : "", s->host, s->port,
					  s->topic, s->qos, s->client_id);
	s->shown = relay_strdup(buf.data);
	termPQExpBuffer(&buf);
	sink_hosts_free(hosts, n);
	sink_url_free(&u);

	mosquitto_lib_init();
	if (!mqtt_client_new(s, &rc_open))
	{
		if (rc_open == SINK_OPEN_CONFIG)
			*err = sink_errorf("invalid mqtt sink URL: the user name is not valid UTF-8");
		else
			*err = sink_errorf("could not create an MQTT client: %s", strerror(errno));
		mqtt_free(s);
		return rc_open;
	}
	*out = &s->base;
	return SINK_OPEN_OK;

config:
	if (hosts != NULL)
		sink_hosts_free(hosts, n);
	sink_url_free(&u);
	return SINK_OPEN_CONFIG;
}

/* Connect and wait for the CONNACK.  False with msg set. */
static bool
mqtt_connect(MqttSink *s, SinkTick tick, void *arg, char *msg, size_t size)
{
	double		deadline = relay_now() + relay_opts.connect_timeout;
	int			rc;

	mosquitto_disconnect(s->mosq);
	s->connected = false;
	s->connack = -1;
	s->disconnect_reason = 0;
	rc = mosquitto_connect_bind_v5(s->mosq, s->host, s->port, MQTT_KEEPALIVE, NULL, NULL);
	if (rc != MOSQ_ERR_SUCCESS)
	{
		snprintf(msg, size, "could not connect to %s:%d: %s", s->host, s->port,
				 rc == MOSQ_ERR_ERRNO ? strerror(errno) : mosquitto_strerror(rc));
		return false;
	}
	while (s->connack < 0)
	{
		rc = mosquitto_loop(s->mosq, 100, 1);
		if (rc != MOSQ_ERR_SUCCESS && s->connack < 0)
		{
			snprintf(msg, size, "lost the connection to %s:%d before its CONNACK: %s",
					 s->host, s->port, mosquitto_strerror(rc));
			return false;
		}
		if (s->connack < 0 && relay_now() > deadline)
		{
			snprintf(msg, size, "no CONNACK from %s:%d within %g s", s->host, s->port,
					 relay_opts.connect_timeout);
			mosquitto_disconnect(s->mosq);
			return false;
		}
		if (tick != NULL && !tick(arg))
		{
			snprintf(msg, size, "delivery interrupted: the relay was stopped");
			mosquitto_disconnect(s->mosq);
			return false;
		}
	}
	if (s->connack != 0)
	{
		snprintf(msg, size, "the broker at %s:%d refused the connection: %s",
				 s->host, s->port, mosquitto_reason_string(s->connack));
		mosquitto_disconnect(s->mosq);
		s->connected = false;
		return false;
	}
	relay_debug("connected to %s", s->shown);
	return true;
}

/*
 * Describe a broken connection into msg: the reason of the broker's
 * DISCONNECT when it sent one (read what is left to read first), else err.
 */
static void
mqtt_lost(MqttSink *s, const char *what, int err, char *msg, size_t size)
{
	mosquitto_loop(s->mosq, 0, 1);
	if (s->disconnect_reason != 0)
		snprintf(msg, size, "the broker at %s:%d disconnected the relay: %s (reason 0x%02x)",
				 s->host, s->port, mosquitto_reason_string(s->disconnect_reason),
				 s->disconnect_reason);
	else
		snprintf(msg, size, "%s %s:%d: %s", what, s->host, s->port,
				 err == MOSQ_ERR_ERRNO ? strerror(errno) : mosquitto_strerror(err));
}

/*
 * Acknowledge what the broker sends at once from now on (Linux
 * TCP_QUICKACK, which the kernel clears again by itself, so it is set
 * before each wait).  Once the batch is written the relay sends nothing
 * more, so its TCP ACKs are no longer carried by a PUBLISH and would be
 * delayed (40 ms); a broker with Nagle's algorithm on (Mosquitto's
 * default, set_tcp_nodelay false) holds its last PUBACKs until that ACK
 * comes.
 */
static void
mqtt_quickack(MqttSink *s)
{
#ifdef TCP_QUICKACK
	int			fd = mosquitto_socket(s->mosq);
	int			one = 1;

	if (fd >= 0)
		(void) setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));
#else
	(void) s;
#endif
}

/* Publish command i of the round.  A mosquitto error code. */
static int
mqtt_publish(MqttSink *s, MqttRound *rd, int i, PQExpBuffer body)
{
	RelayCommand *cmd = &rd->batch->cmds[i];
	static const char *const own[] = {"command_id", "run_id", "seq", "kind",
	"deliveries", "ordering_key", NULL};
	mosquitto_property *props = NULL;
	char		deliveries[16];
	char		seq[24];
	int			mid = 0;
	int			rc;
	int			j;

	resetPQExpBuffer(body);
	sink_command_json(body, cmd);
	snprintf(deliveries, sizeof(deliveries), "%d", cmd->deliveries);
	snprintf(seq, sizeof(seq), "%lld", cmd->seq);
	rc = mosquitto_property_add_string(&props, MQTT_PROP_CONTENT_TYPE, "application/json");
	if (rc == MOSQ_ERR_SUCCESS)
		rc = mosquitto_property_add_byte(&props, MQTT_PROP_PAYLOAD_FORMAT_INDICATOR, 1);
	if (rc == MOSQ_ERR_SUCCESS)
		rc = mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, "command_id", cmd->command_id);
	if (rc == MOSQ_ERR_SUCCESS)
		rc = mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, "run_id", cmd->run_id ? cmd->run_id : "");
	if (rc == MOSQ_ERR_SUCCESS)
		rc = mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, "kind", cmd->kind ? cmd->kind : "");
	if (rc == MOSQ_ERR_SUCCESS)
		rc = mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, "seq", seq);
	if (rc == MOSQ_ERR_SUCCESS)
		rc = mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, "deliveries", deliveries);
	if (rc == MOSQ_ERR_SUCCESS && cmd->ordering_key)
		rc = mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, "ordering_key", cmd->ordering_key);
	/* the producer's headers, as user properties under their own names */
	for (j = 0; rc == MOSQ_ERR_SUCCESS && j < cmd->nheaders; j++)
		if (!sink_header_reserved(cmd->headers[j].name) &&
			!sink_header_listed(cmd->headers[j].name, own))
			rc = mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY,
													cmd->headers[j].name, cmd->headers[j].value);
	if (rc == MOSQ_ERR_SUCCESS)
		rc = mosquitto_publish_v5(s->mosq, &mid, s->topic, (int) body->len, body->data,
								  (int) s->qos, false, props);
	mosquitto_property_free_all(&props);
	if (rc == MOSQ_ERR_SUCCESS)
	{
		rd->mid[i] = mid;
		rd->state[i] = MP_WAIT;
		rd->inflight++;
		s->inflight++;
	}
	return rc;
}

/* The round of a batch, or NULL. */
static MqttRound *
mqtt_round(MqttSink *s, RelayBatch *batch)
{
	return sink_round(s->rounds, sizeof(s->rounds[0]), MQTT_ROUNDS, batch);
}

/*
 * The connection is of no use any more (lost, refused, no PUBACK in time,
 * or the relay stops): what is unacknowledged in every round gets r with
 * msg (its fate is unknown: it is published again later); with hold, what
 * was not published yet is held too (SINK_UNAVAILABLE), else it stays to
 * do.  Nothing more of these rounds is published.  A clean session
 * forgets what was in flight, and a new client starts afresh, so that the
 * old one does not resend it under message ids of its own.
 */
static void
mqtt_break(MqttSink *s, SinkResult r, bool hold, const char *msg)
{
	SinkOpenResult why;
	int			k;
	int			i;

	for (k = 0; k < MQTT_ROUNDS; k++)
	{
		MqttRound  *rd = &s->rounds[k];

		if (rd->batch == NULL)
			continue;
		for (i = 0; i < rd->batch->n; i++)
			if (rd->state[i] == MP_WAIT)
			{
				sink_outcome(&rd->batch->cmds[i], r, msg);
				rd->state[i] = MP_SETTLED;
			}
		if (hold)
			for (i = rd->next; i < rd->batch->n; i++)
				sink_outcome(&rd->batch->cmds[i], SINK_UNAVAILABLE, msg);
		if (hold || r == SINK_UNAVAILABLE)
			rd->unavailable = true;
		rd->inflight = 0;
		rd->ended = true;
	}
	s->inflight = 0;
	mosquitto_disconnect(s->mosq);
	s->connected = false;
	if (!mqtt_client_new(s, &why))
	{
		relay_log("could not create an MQTT client: %s", strerror(errno));
		exit(RELAY_EXIT_RUNTIME);
	}
	s->lost = false;
	s->disconnect_reason = 0;
	relay_debug("mqtt: %s", msg);
}

/*
 * Publish what the window allows, the rounds in the order they were
 * submitted (a round the broker refused publishes nothing more, nor does
 * the one after it; a round that has ended, its connection broken or the
 * other round's settle having found the broker unavailable, holds up none,
 * so that the relay's retry of a batch is published while the batch
 * submitted ahead of it still waits to be settled).  False when the
 * connection broke (mqtt_break has settled it).
 */
static bool
mqtt_fill(MqttSink *s, PQExpBuffer body)
{
	MqttRound  *order[MQTT_ROUNDS];
	char		msg[1024];
	int			k;
	int			rc;

	if (!s->connected || s->lost)
		return true;
	order[0] = &s->rounds[0];
	order[1] = &s->rounds[1];
	if (order[0]->batch == NULL ||
		(order[1]->batch != NULL && order[1]->order_no < order[0]->order_no))
	{
		order[0] = &s->rounds[1];
		order[1] = &s->rounds[0];
	}
	for (k = 0; k < MQTT_ROUNDS && s->inflight < s->window; k++)
	{
		MqttRound  *rd = order[k];
		RelayBatch *batch = rd->batch;

		if (batch == NULL)
			break;
		/* an ended round publishes nothing more, and holds up none */
		if (rd->ended)
			continue;
		if (rd->refused)
			break;
		while (!rd->refused && s->inflight < s->window && rd->next < batch->n)
		{
			RelayCommand *cmd = &batch->cmds[rd->next];

			if (cmd->state != CMD_TODO)
			{
				rd->next++;
				continue;
			}
			if (s->inflight == 0)
				s->last_progress = relay_now();
			rc = mqtt_publish(s, rd, rd->next, body);
			if (rc == MOSQ_ERR_PAYLOAD_SIZE || rc == MOSQ_ERR_OVERSIZE_PACKET ||
				rc == MOSQ_ERR_MALFORMED_UTF8)
			{
				snprintf(msg, sizeof(msg), "the message cannot be sent over MQTT: %s",
						 mosquitto_strerror(rc));
				sink_outcome(cmd, SINK_FATAL, msg);
			}
			else if (rc != MOSQ_ERR_SUCCESS)
			{
				mqtt_lost(s, "could not publish to", rc, msg, sizeof(msg));
				mqtt_break(s, SINK_UNAVAILABLE, true, msg);
				return false;
			}
			rd->next++;
		}
		if (rd->next < batch->n)
			break;				/* the window is full, or the broker refused */
	}
	return true;
}

/*
 * Start delivering the batch (sink.h: submit): publish what the window
 * allows, without waiting for a PUBACK; settle waits for them.  Without a
 * connection nothing is published here: settle connects (it can tick
 * while it waits for the CONNACK).
 */
static SinkResult
mqtt_submit(Sink *sink, RelayBatch *batch)
{
	MqttSink   *s = (MqttSink *) sink;
	MqttRound  *rd = sink_free_round(s->rounds, sizeof(s->rounds[0]), MQTT_ROUNDS, "mqtt");
	PQExpBufferData body;

	/* notice a connection the broker closed while the relay was idle */
	if (!mqtt_active(s))
	{
		if (s->connected && mosquitto_loop(s->mosq, 0, 1) != MOSQ_ERR_SUCCESS)
			s->connected = false;
		s->disconnect_reason = 0;
		s->lost = false;
	}
	memset(rd, 0, sizeof(*rd));
	rd->batch = batch;
	rd->order_no = ++s->order_no;
	rd->state = relay_malloc(batch->n + 1);
	memset(rd->state, MP_NONE, batch->n + 1);
	rd->mid = relay_malloc(sizeof(int) * (batch->n + 1));
	initPQExpBuffer(&body);
	(void) mqtt_fill(s, &body);
	termPQExpBuffer(&body);
	return rd->unavailable ? SINK_UNAVAILABLE : SINK_OK;
}

/*
 * Wait until every message of a submitted batch has its PUBACK or PUBCOMP
 * (sink.h: settle), connecting first when needed and publishing the rest
 * of it as the window frees up; the other round's acknowledgements are
 * taken in meanwhile.
 */
static SinkResult
mqtt_settle(Sink *sink, RelayBatch *batch, SinkTick tick, void *arg)
{
	MqttSink   *s = (MqttSink *) sink;
	MqttRound  *rd = mqtt_round(s, batch);
	PQExpBufferData body;
	char		msg[1024];
	unsigned	last_acks;
	bool		unavailable;
	int			i;
	int			k;
	int			rc;

	if (rd == NULL)
		return SINK_OK;			/* not submitted: nothing to wait for */
	if (!s->connected && !rd->ended && !mqtt_connect(s, tick, arg, msg, sizeof(msg)))
	{
		bool		stopped = strncmp(msg, "delivery interrupted", 20) == 0;

		/* nothing is in flight without a connection */
		mqtt_break(s, SINK_RETRY, !stopped, msg);
	}
	initPQExpBuffer(&body);
	last_acks = s->acks;
	for (;;)
	{
		(void) mqtt_fill(s, &body);
		if (rd->inflight == 0 && (rd->ended || rd->refused || rd->next >= batch->n))
			break;
		if (!s->connected)
		{
			/* not reached: a round without a connection has ended */
			mqtt_break(s, SINK_UNAVAILABLE, true, "not connected");
			continue;
		}

		mqtt_quickack(s);
		rc = mosquitto_loop(s->mosq, 10, 1);
		if (rc != MOSQ_ERR_SUCCESS || s->lost)
		{
			mqtt_lost(s, "lost the connection to", rc != MOSQ_ERR_SUCCESS ? rc : MOSQ_ERR_CONN_LOST,
					  msg, sizeof(msg));
			mqtt_break(s, SINK_UNAVAILABLE, true, msg);
			continue;
		}
		if (s->acks != last_acks)
		{
			last_acks = s->acks;
			s->last_progress = relay_now();
		}
		else if (s->inflight > 0 && relay_now() - s->last_progress > relay_opts.timeout)
		{
			if (rd->refused)
				snprintf(msg, sizeof(msg), "%s", rd->refused_msg);
			else
				snprintf(msg, sizeof(msg), "no PUBACK from %s:%d within %g s", s->host, s->port,
						 relay_opts.timeout);
			mqtt_break(s, SINK_UNAVAILABLE, true, msg);
			continue;
		}
		if (tick != NULL && !tick(arg))
		{
			/* what is unacknowledged is retried; what is unpublished stays */
			mqtt_break(s, SINK_RETRY, false, "delivery interrupted: the relay was stopped");
			continue;
		}
	}

	/* the broker refused the relay: hold what was not published */
	if (rd->refused)
	{
		rd->unavailable = true;
		for (i = rd->next; i < batch->n; i++)
			sink_outcome(&batch->cmds[i], SINK_UNAVAILABLE, rd->refused_msg);
	}

	/*
	 * The relay retries this batch before the other round's: that one
	 * publishes nothing more on this attempt (what it did not publish is
	 * held when it is settled), so it cannot hold up the retry nor go
	 * before it.  (Mosquitto disconnects at the first publish its ACL
	 * denies, which ends both rounds anyway; a broker that answers every
	 * such publish with a PUBACK "not authorized" leaves both refused.)
	 */
	if (rd->unavailable)
		for (k = 0; k < MQTT_ROUNDS; k++)
		{
			MqttRound  *other = &s->rounds[k];

			if (other == rd || other->batch == NULL || other->ended)
				continue;
			other->ended = true;
			other->unavailable = true;
		}
	unavailable = rd->unavailable;
	free(rd->state);
	free(rd->mid);
	memset(rd, 0, sizeof(*rd));
	termPQExpBuffer(&body);
	return unavailable ? SINK_UNAVAILABLE : SINK_OK;
}

/* Deliver the batch: submit it, then settle it. */
static SinkResult
mqtt_deliver(Sink *sink, RelayBatch *batch, SinkTick tick, void *arg)
{
	SinkResult	r = mqtt_submit(sink, batch);
	SinkResult	r2 = mqtt_settle(sink, batch, tick, arg);

	return r == SINK_UNAVAILABLE ? r : r2;
}

/*
 * The idle probe: libmosquitto's loop runs once (it reads what the broker
 * sent and sends the keepalive PINGREQ when due), which notices a
 * connection the broker closed; without a connection the sink connects as
 * the next batch would and waits for the CONNACK.  Nothing is published.
 */
static SinkResult
mqtt_probe(Sink *sink, char **err)
{
	MqttSink   *s = (MqttSink *) sink;
	char		msg[1024];

	if (s->connected && mosquitto_loop(s->mosq, 0, 1) != MOSQ_ERR_SUCCESS)
		s->connected = false;
	if (!s->connected && !mqtt_connect(s, NULL, NULL, msg, sizeof(msg)))
	{
		*err = sink_errorf("mqtt: %s", msg);
		return SINK_UNAVAILABLE;
	}
	return SINK_OK;
}

/* Disconnect and free the sink. */
static void
mqtt_close(Sink *sink)
{
	MqttSink   *s = (MqttSink *) sink;

	if (s->connected)
	{
		mosquitto_disconnect(s->mosq);
		mosquitto_loop(s->mosq, 100, 1);
	}
	mqtt_free(s);
	mosquitto_lib_cleanup();
}

/* What the sink is, for the logs. */
static const char *
mqtt_describe(Sink *sink)
{
	return ((MqttSink *) sink)->shown;
}

const SinkOps sink_mqtt_ops = {
	.name = "mqtt",
	.schemes = mqtt_schemes,
	.usage = "  mqtt://[USER@]HOST[:PORT]/TOPIC[?qos=1|2][&window=N][&client_id=ID][&password_file=PATH]\n"
	"                      MQTT 5, QoS 1 or 2: ack after PUBACK/PUBCOMP; metadata\n"
	"                      as user properties; password from password_file or\n"
	"                      OUTBOX_RELAY_MQTT_PASSWORD\n",
	.open = mqtt_open,
	.deliver = mqtt_deliver,
	.submit = mqtt_submit,
	.settle = mqtt_settle,
	.probe = mqtt_probe,
	.confirm = NULL,
	.reopen = NULL,
	.close = mqtt_close,
	.describe = mqtt_describe,
};
