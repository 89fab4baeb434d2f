/*-------------------------------------------------------------------------
 *
 * broker_baseline.c
 *		The baseline of bench/brokers.sh: publish pre-generated messages to
 *		a broker with the client library and the confirmation mode of
 *		outbox-relay's sink for it, without any database.
 *
 *		broker-baseline kafka BOOTSTRAP TOPIC FILE
 *		broker-baseline redis HOST PORT STREAM FILE
 *		broker-baseline amqp HOST PORT EXCHANGE ROUTING_KEY FILE WINDOW
 *		broker-baseline nats URL SUBJECT FILE WINDOW
 *		broker-baseline mqtt HOST PORT TOPIC FILE WINDOW
 *		broker-baseline listen-amqp HOST PORT QUEUE
 *
 * FILE holds one message a line: the JSON object the relay sends as the
 * body, {"command_id":…,"run_id":…,"kind":…,"payload":…,"deliveries":N}
 * (bench/brokers.sh writes it with the relay's stdout sink).  Each message
 * carries the same headers or properties as the relay's sink sets (from
 * the line's fields), and is counted only once the broker confirmed it:
 *		kafka	acks=all, enable.idempotence, linger.ms=2, key run_id;
 *				delivery reports
 *		redis	XADD STREAM * command_id … payload P, pipelined by 100,
 *				then the 100 replies
 *		amqp	publisher confirms, mandatory, persistent; up to WINDOW
 *				unconfirmed messages
 *		nats	JetStream async publish with Nats-Msg-Id, up to WINDOW
 *				PubAcks pending
 *		mqtt	MQTT 5, QoS 1, up to WINDOW PUBACKs pending
 *
 * Prints "N SECONDS" (confirmed messages, seconds from before the connect
 * to the last confirmation) and exits 0, or 1 with a message when a
 * publish failed.  listen-amqp consumes QUEUE (no acks) and prints each
 * message's body on a line as it arrives, until it is killed: the latency
 * part of bench/brokers.sh stamps them.  One thread (librdkafka and cnats run their own).
 *
 *-------------------------------------------------------------------------
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <librdkafka/rdkafka.h>
#include <hiredis/hiredis.h>
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <nats/nats.h>
#include <mosquitto.h>
#include <mqtt_protocol.h>

typedef struct Msg
{
	char	   *body;			/* the whole line */
	size_t		len;
	char	   *command_id;
	char	   *run_id;
	char	   *kind;
	char	   *payload;
	char	   *deliveries;
} Msg;

static Msg *msgs;
static int	nmsgs;
static long confirmed;
static long failed;

static double
now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
die(const char *what)
{
	fprintf(stderr, "broker-baseline: %s\n", what);
	exit(1);
}

/* A malloc'd copy of the JSON string value after "key": in line. */
static char *
field_string(const char *line, const char *key)
{
	char		pat[64];
	const char *p;
	const char *e;
	char	   *v;

	snprintf(pat, sizeof(pat), "\"%s\":\"", key);
	p = strstr(line, pat);
	if (p == NULL)
		die("a message lacks a field");
	p += strlen(pat);
	e = strchr(p, '"');
	if (e == NULL)
		die("a message is malformed");
	v = malloc(e - p + 1);
	memcpy(v, p, e - p);
	v[e - p] = '\0';
	return v;
}

/* Read FILE into msgs. */
static void
read_messages(const char *path)
{
	FILE	   *fp = fopen(path, "r");
	char	   *line = NULL;
	size_t		cap = 0;
	ssize_t		len;
	int			size = 1024;

	if (fp == NULL)
		die("cannot open the messages file");
	msgs = malloc(sizeof(Msg) * size);
	while ((len = getline(&line, &cap, fp)) > 0)
	{
		Msg		   *m;
		const char *p;
		const char *e;

		if (line[len - 1] == '\n')
			line[--len] = '\0';
		if (len == 0)
			continue;
		if (nmsgs == size)
			msgs = realloc(msgs, sizeof(Msg) * (size *= 2));
		m = &msgs[nmsgs++];
		m->body = strdup(line);
		m->len = len;
		m->command_id = field_string(line, "command_id");
		m->run_id = field_string(line, "run_id");
		m->kind = field_string(line, "kind");
		p = strstr(line, ",\"payload\":");
		e = strstr(line, ",\"deliveries\":");
		if (p == NULL || e == NULL || e < p)
			die("a message lacks its payload");
		p += strlen(",\"payload\":");
		m->payload = strndup(p, e - p);
		m->deliveries = strndup(e + strlen(",\"deliveries\":"),
								strlen(e) - strlen(",\"deliveries\":") - 1);
	}
	free(line);
	fclose(fp);
	if (nmsgs == 0)
		die("no messages");
}

/* ---- Kafka ---- */

static void
kafka_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	if (m->err)
		failed++;
	else
		confirmed++;
}

static void
kafka_set(rd_kafka_conf_t *conf, const char *k, const char *v)
{
	char		errstr[512];

	if (rd_kafka_conf_set(conf, k, v, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
		die(errstr);
}

static void
run_kafka(const char *bootstrap, const char *topic)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_t *rk;
	char		errstr[512];
	int			i;

	kafka_set(conf, "bootstrap.servers", bootstrap);
	kafka_set(conf, "client.id", "broker-baseline");
	kafka_set(conf, "enable.idempotence", "true");
	kafka_set(conf, "acks", "all");
	kafka_set(conf, "message.timeout.ms", "30000");
	kafka_set(conf, "linger.ms", "2");
	rd_kafka_conf_set_dr_msg_cb(conf, kafka_dr);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
		die(errstr);
	for (i = 0; i < nmsgs; i++)
	{
		Msg		   *m = &msgs[i];
		rd_kafka_resp_err_t err;

		for (;;)
		{
			err = rd_kafka_producev(rk,
									RD_KAFKA_V_TOPIC(topic),
									RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
									RD_KAFKA_V_KEY(m->run_id, strlen(m->run_id)),
									RD_KAFKA_V_VALUE(m->body, m->len),
									RD_KAFKA_V_HEADER("command_id", m->command_id, -1),
									RD_KAFKA_V_HEADER("run_id", m->run_id, -1),
									RD_KAFKA_V_HEADER("kind", m->kind, -1),
									RD_KAFKA_V_HEADER("deliveries", m->deliveries, -1),
									RD_KAFKA_V_HEADER("content-type", "application/json", -1),
									RD_KAFKA_V_END);
			if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
				break;
			rd_kafka_poll(rk, 10);
		}
		if (err)
			die(rd_kafka_err2str(err));
		rd_kafka_poll(rk, 0);
	}
	while (confirmed + failed < nmsgs)
		rd_kafka_poll(rk, 100);
	rd_kafka_destroy(rk);
}

/* ---- Redis Streams ---- */

static void
run_redis(const char *host, int port, const char *stream)
{
	redisContext *c = redisConnect(host, port);
	int			i;

	if (c == NULL || c->err)
		die("cannot connect to redis");
	for (i = 0; i < nmsgs; i += 100)
	{
		int			n = nmsgs - i < 100 ? nmsgs - i : 100;
		int			j;

		for (j = 0; j < n; j++)
		{
			Msg		   *m = &msgs[i + j];
			const char *argv[13] = {"XADD", stream, "*", "command_id", m->command_id,
				"run_id", m->run_id, "kind", m->kind, "deliveries", m->deliveries,
			"payload", m->payload};
			size_t		argvlen[13];
			int			k;

			for (k = 0; k < 13; k++)
				argvlen[k] = strlen(argv[k]);
			redisAppendCommandArgv(c, 13, argv, argvlen);
		}
		for (j = 0; j < n; j++)
		{
			redisReply *r;

			if (redisGetReply(c, (void **) &r) != REDIS_OK)
				die("redis connection lost");
			if (r->type == REDIS_REPLY_ERROR)
				failed++;
			else
				confirmed++;
			freeReplyObject(r);
		}
	}
	redisFree(c);
}

/* ---- AMQP ---- */

static void
amqp_check(amqp_rpc_reply_t r, const char *what)
{
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
		die(what);
}

static void
amqp_header_str(amqp_table_entry_t *e, const char *key, const char *value)
{
	e->key = amqp_cstring_bytes(key);
	e->value.kind = AMQP_FIELD_KIND_UTF8;
	e->value.value.bytes = amqp_cstring_bytes(value);
}

/* Read one frame and count what it confirms. */
static void
amqp_read_confirm(amqp_connection_state_t conn, bool *acked, long *low)
{
	amqp_frame_t f;

	if (amqp_simple_wait_frame(conn, &f) != AMQP_STATUS_OK)
		die("amqp connection lost");
	if (f.frame_type != AMQP_FRAME_METHOD)
		return;
	if (f.payload.method.id == AMQP_BASIC_ACK_METHOD ||
		f.payload.method.id == AMQP_BASIC_NACK_METHOD)
	{
		uint64_t	tag;
		bool		multiple;
		bool		ok = f.payload.method.id == AMQP_BASIC_ACK_METHOD;
		long		t;

		if (ok)
		{
			amqp_basic_ack_t *a = f.payload.method.decoded;

			tag = a->delivery_tag;
			multiple = a->multiple;
		}
		else
		{
			amqp_basic_nack_t *a = f.payload.method.decoded;

			tag = a->delivery_tag;
			multiple = a->multiple;
		}
		for (t = multiple ? *low + 1 : (long) tag; t <= (long) tag; t++)
		{
			if (acked[t])
				continue;
			acked[t] = true;
			if (ok)
				confirmed++;
			else
				failed++;
		}
		while (acked[*low + 1])
			(*low)++;
	}
	else if (f.payload.method.id == AMQP_BASIC_RETURN_METHOD)
		die("amqp: a message was returned unroutable");
	else if (f.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD)
		die("amqp: the channel was closed");
}

static void
run_amqp(const char *host, int port, const char *exchange, const char *rkey, int window)
{
	amqp_connection_state_t conn = amqp_new_connection();
	amqp_socket_t *sock = amqp_tcp_socket_new(conn);
	bool	   *acked = calloc(nmsgs + 2, sizeof(bool));
	long		low = 0;
	int			i;

	if (sock == NULL || amqp_socket_open(sock, host, port) != AMQP_STATUS_OK)
		die("cannot connect to amqp");
	amqp_check(amqp_login(conn, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest"),
			   "amqp login");
	amqp_channel_open(conn, 1);
	amqp_check(amqp_get_rpc_reply(conn), "amqp channel");
	amqp_confirm_select(conn, 1);
	amqp_check(amqp_get_rpc_reply(conn), "amqp confirm.select");
	for (i = 0; i < nmsgs; i++)
	{
		Msg		   *m = &msgs[i];
		amqp_basic_properties_t props;
		amqp_table_entry_t headers[4];
		amqp_bytes_t body;

		while (i - (confirmed + failed) >= window)
			amqp_read_confirm(conn, acked, &low);
		amqp_header_str(&headers[0], "command_id", m->command_id);
		amqp_header_str(&headers[1], "run_id", m->run_id);
		amqp_header_str(&headers[2], "kind", m->kind);
		headers[3].key = amqp_cstring_bytes("deliveries");
		headers[3].value.kind = AMQP_FIELD_KIND_I32;
		headers[3].value.value.i32 = atoi(m->deliveries);
		memset(&props, 0, sizeof(props));
		props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
			AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TYPE_FLAG | AMQP_BASIC_APP_ID_FLAG |
			AMQP_BASIC_HEADERS_FLAG;
		props.content_type = amqp_cstring_bytes("application/json");
		props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
		props.message_id = amqp_cstring_bytes(m->command_id);
		props.type = amqp_cstring_bytes(m->kind);
		props.app_id = amqp_cstring_bytes("outbox-relay");
		props.headers.num_entries = 4;
		props.headers.entries = headers;
		body.bytes = m->body;
		body.len = m->len;
		if (amqp_basic_publish(conn, 1, amqp_cstring_bytes(exchange), amqp_cstring_bytes(rkey),
							   1, 0, &props, body) != AMQP_STATUS_OK)
			die("amqp publish failed");
	}
	while (confirmed + failed < nmsgs)
		amqp_read_confirm(conn, acked, &low);
	amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
}

static void
listen_amqp(const char *host, int port, const char *queue)
{
	amqp_connection_state_t conn = amqp_new_connection();
	amqp_socket_t *sock = amqp_tcp_socket_new(conn);

	if (sock == NULL || amqp_socket_open(sock, host, port) != AMQP_STATUS_OK)
		die("cannot connect to amqp");
	amqp_check(amqp_login(conn, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest"),
			   "amqp login");
	amqp_channel_open(conn, 1);
	amqp_check(amqp_get_rpc_reply(conn), "amqp channel");
	amqp_basic_consume(conn, 1, amqp_cstring_bytes(queue), amqp_empty_bytes, 0, 1, 0,
					   amqp_empty_table);
	amqp_check(amqp_get_rpc_reply(conn), "amqp basic.consume");
	for (;;)
	{
		amqp_envelope_t env;

		amqp_maybe_release_buffers(conn);
		amqp_check(amqp_consume_message(conn, &env, NULL, 0), "amqp consume");
		fwrite(env.message.body.bytes, 1, env.message.body.len, stdout);
		fputc('\n', stdout);
		fflush(stdout);
		amqp_destroy_envelope(&env);
	}
}

/* ---- NATS JetStream ---- */

static void
nats_ack(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure)
{
	if (pae != NULL)
		failed++;
	else
		confirmed++;
	natsMsg_Destroy(msg);
}

static void
run_nats(const char *url, const char *subject, int window)
{
	natsConnection *nc = NULL;
	jsCtx	   *js = NULL;
	jsOptions	jo;
	int			i;

	if (natsConnection_ConnectTo(&nc, url) != NATS_OK)
		die("cannot connect to nats");
	jsOptions_Init(&jo);
	jo.PublishAsync.MaxPending = window;
	jo.PublishAsync.AckHandler = nats_ack;
	if (natsConnection_JetStream(&js, nc, &jo) != NATS_OK)
		die("no JetStream context");
	for (i = 0; i < nmsgs; i++)
	{
		Msg		   *m = &msgs[i];
		natsMsg    *msg = NULL;
		natsStatus	st;

		st = natsMsg_Create(&msg, subject, NULL, m->body, (int) m->len);
		if (st == NATS_OK)
			st = natsMsgHeader_Set(msg, "Nats-Msg-Id", m->command_id);
		if (st == NATS_OK)
			st = natsMsgHeader_Set(msg, "Content-Type", "application/json");
		if (st == NATS_OK)
			st = natsMsgHeader_Set(msg, "Outbox-Command-Id", m->command_id);
		if (st == NATS_OK)
			st = natsMsgHeader_Set(msg, "Outbox-Run-Id", m->run_id);
		if (st == NATS_OK)
			st = natsMsgHeader_Set(msg, "Outbox-Kind", m->kind);
		if (st == NATS_OK)
			st = natsMsgHeader_Set(msg, "Outbox-Deliveries", m->deliveries);
		if (st == NATS_OK)
			st = js_PublishMsgAsync(js, &msg, NULL);
		if (st != NATS_OK)
			die(natsStatus_GetText(st));
	}
	if (js_PublishAsyncComplete(js, NULL) != NATS_OK)
		die("nats: PubAcks missing");
	jsCtx_Destroy(js);
	natsConnection_Destroy(nc);
}

/* ---- MQTT ---- */

static int	mqtt_inflight;
static bool mqtt_connected;

static void
mqtt_on_connect(struct mosquitto *mosq, void *obj, int rc, int flags,
				const mosquitto_property *props)
{
	if (rc != 0)
		die("mqtt connection refused");
	mqtt_connected = true;
}

static void
mqtt_on_publish(struct mosquitto *mosq, void *obj, int mid, int reason,
				const mosquitto_property *props)
{
	if (reason >= 128)
		failed++;
	else
		confirmed++;
	mqtt_inflight--;
}

static void
run_mqtt(const char *host, int port, const char *topic, int window)
{
	struct mosquitto *mosq;
	int			i;

	mosquitto_lib_init();
	mosq = mosquitto_new("broker-baseline", true, NULL);
	mosquitto_int_option(mosq, MOSQ_OPT_PROTOCOL_VERSION, MQTT_PROTOCOL_V5);
	mosquitto_int_option(mosq, MOSQ_OPT_SEND_MAXIMUM, window);
	mosquitto_connect_v5_callback_set(mosq, mqtt_on_connect);
	mosquitto_publish_v5_callback_set(mosq, mqtt_on_publish);
	if (mosquitto_connect_bind_v5(mosq, host, port, 60, NULL, NULL) != MOSQ_ERR_SUCCESS)
		die("cannot connect to mqtt");
	while (!mqtt_connected)
		if (mosquitto_loop(mosq, 100, 1) != MOSQ_ERR_SUCCESS)
			die("mqtt connection lost");
	for (i = 0; i < nmsgs; i++)
	{
		Msg		   *m = &msgs[i];
		mosquitto_property *props = NULL;
		int			mid;

		while (mqtt_inflight >= window)
			if (mosquitto_loop(mosq, 100, 1) != MOSQ_ERR_SUCCESS)
				die("mqtt connection lost");
		mosquitto_property_add_string(&props, MQTT_PROP_CONTENT_TYPE, "application/json");
		mosquitto_property_add_byte(&props, MQTT_PROP_PAYLOAD_FORMAT_INDICATOR, 1);
		mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, "command_id", m->command_id);
		mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, "run_id", m->run_id);
		mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, "kind", m->kind);
		mosquitto_property_add_string_pair(&props, MQTT_PROP_USER_PROPERTY, "deliveries", m->deliveries);
		if (mosquitto_publish_v5(mosq, &mid, topic, (int) m->len, m->body, 1, false, props)
			!= MOSQ_ERR_SUCCESS)
			die("mqtt publish failed");
		mosquitto_property_free_all(&props);
		mqtt_inflight++;
		if (mosquitto_loop(mosq, 0, 1) != MOSQ_ERR_SUCCESS)
			die("mqtt connection lost");
	}
	while (mqtt_inflight > 0)
		if (mosquitto_loop(mosq, 100, 1) != MOSQ_ERR_SUCCESS)
			die("mqtt connection lost");
	mosquitto_disconnect(mosq);
	mosquitto_destroy(mosq);
	mosquitto_lib_cleanup();
}

int
main(int argc, char **argv)
{
	double		start;
	const char *kind = argc > 1 ? argv[1] : "";

	if (strcmp(kind, "kafka") == 0 && argc == 5)
	{
		read_messages(argv[4]);
		start = now();
		run_kafka(argv[2], argv[3]);
	}
	else if (strcmp(kind, "redis") == 0 && argc == 6)
	{
		read_messages(argv[5]);
		start = now();
		run_redis(argv[2], atoi(argv[3]), argv[4]);
	}
	else if (strcmp(kind, "amqp") == 0 && argc == 8)
	{
		read_messages(argv[6]);
		start = now();
		run_amqp(argv[2], atoi(argv[3]), argv[4], argv[5], atoi(argv[7]));
	}
	else if (strcmp(kind, "nats") == 0 && argc == 6)
	{
		read_messages(argv[4]);
		start = now();
		run_nats(argv[2], argv[3], atoi(argv[5]));
	}
	else if (strcmp(kind, "mqtt") == 0 && argc == 7)
	{
		read_messages(argv[5]);
		start = now();
		run_mqtt(argv[2], atoi(argv[3]), argv[4], atoi(argv[6]));
	}
	else if (strcmp(kind, "listen-amqp") == 0 && argc == 5)
	{
		listen_amqp(argv[2], atoi(argv[3]), argv[4]);
		return 0;
	}
	else
	{
		fprintf(stderr, "usage: see the header of bench/broker_baseline.c\n");
		return 2;
	}
	if (failed > 0)
	{
		fprintf(stderr, "broker-baseline: %ld messages failed\n", failed);
		return 1;
	}
	printf("%ld %.6f\n", confirmed, now() - start);
	return 0;
}
