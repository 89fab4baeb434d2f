/*-------------------------------------------------------------------------
 *
 * amqp_peek.c
 *		An AMQP 0-9-1 reader for the tests (librabbitmq): takes up to COUNT
 *		messages from a queue with basic.get, acks them, and prints each
 *		one's properties and headers table, which amqp-consume and amqp-get
 *		of amqp-tools cannot show (they print the body only).
 *
 *		amqp-peek HOST PORT QUEUE COUNT
 *
 * Logs in as guest (password from OUTBOX_RELAY_AMQP_PASSWORD, default
 * "guest") to vhost "/".  One line per message on stdout:
 *		message_id=ID<TAB>type=T<TAB>[p:PROPERTY=VALUE<TAB>...]NAME=VALUE<TAB>...<TAB>body=BODY
 * with the basic properties content_type, correlation_id, reply_to,
 * priority and expiration when set (the "p:" prefix keeps them apart from
 * header names, which cannot hold a colon), then the headers table's long
 * strings and integers (the test's values hold no tab or newline).  Exit
 * 0, or 1 with a line on stderr.
 *
 *-------------------------------------------------------------------------
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <amqp.h>
#include <amqp_tcp_socket.h>

/* Print bytes as they are. */
static void
put_bytes(amqp_bytes_t b)
{
	fwrite(b.bytes, 1, b.len, stdout);
}

/* Exit 1 unless an RPC reply is normal. */
static void
check_reply(amqp_rpc_reply_t r, const char *what)
{
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		fprintf(stderr, "amqp-peek: %s failed (reply type %d)\n", what, (int) r.reply_type);
		exit(1);
	}
}

int
main(int argc, char **argv)
{
	amqp_connection_state_t conn;
	amqp_socket_t *sock;
	const char *password = getenv("OUTBOX_RELAY_AMQP_PASSWORD");
	int			count;
	int			i;

	if (argc != 5)
	{
		fprintf(stderr, "usage: amqp-peek HOST PORT QUEUE COUNT\n");
		return 1;
	}
	count = atoi(argv[4]);
	conn = amqp_new_connection();
	sock = amqp_tcp_socket_new(conn);
	if (sock == NULL || amqp_socket_open(sock, argv[1], atoi(argv[2])) != AMQP_STATUS_OK)
	{
		fprintf(stderr, "amqp-peek: could not connect to %s:%s\n", argv[1], argv[2]);
		return 1;
	}
	check_reply(amqp_login(conn, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest",
						   password ? password : "guest"), "login");
	amqp_channel_open(conn, 1);
	check_reply(amqp_get_rpc_reply(conn), "channel.open");

	for (i = 0; i < count; i++)
	{
		amqp_rpc_reply_t r = amqp_basic_get(conn, 1, amqp_cstring_bytes(argv[3]), 0);
		amqp_message_t msg;
		amqp_basic_get_ok_t *ok;
		int			j;

		check_reply(r, "basic.get");
		if (r.reply.id != AMQP_BASIC_GET_OK_METHOD)
			break;				/* the queue is empty */
		ok = (amqp_basic_get_ok_t *) r.reply.decoded;
		check_reply(amqp_read_message(conn, 1, &msg, 0), "read message");

		fputs("message_id=", stdout);
		if (msg.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG)
			put_bytes(msg.properties.message_id);
		fputs("\ttype=", stdout);
		if (msg.properties._flags & AMQP_BASIC_TYPE_FLAG)
			put_bytes(msg.properties.type);
		if (msg.properties._flags & AMQP_BASIC_CONTENT_TYPE_FLAG)
		{
			fputs("\tp:content_type=", stdout);
			put_bytes(msg.properties.content_type);
		}
		if (msg.properties._flags & AMQP_BASIC_CORRELATION_ID_FLAG)
		{
			fputs("\tp:correlation_id=", stdout);
			put_bytes(msg.properties.correlation_id);
		}
		if (msg.properties._flags & AMQP_BASIC_REPLY_TO_FLAG)
		{
			fputs("\tp:reply_to=", stdout);
			put_bytes(msg.properties.reply_to);
		}
		if (msg.properties._flags & AMQP_BASIC_PRIORITY_FLAG)
			printf("\tp:priority=%d", (int) msg.properties.priority);
		if (msg.properties._flags & AMQP_BASIC_EXPIRATION_FLAG)
		{
			fputs("\tp:expiration=", stdout);
			put_bytes(msg.properties.expiration);
		}
		if (msg.properties._flags & AMQP_BASIC_HEADERS_FLAG)
			for (j = 0; j < msg.properties.headers.num_entries; j++)
			{
				amqp_table_entry_t *e = &msg.properties.headers.entries[j];

				putchar('\t');
				put_bytes(e->key);
				putchar('=');
				switch (e->value.kind)
				{
					case AMQP_FIELD_KIND_UTF8:
					case AMQP_FIELD_KIND_BYTES:
						put_bytes(e->value.value.bytes);
						break;
					case AMQP_FIELD_KIND_I32:
						printf("%d", (int) e->value.value.i32);
						break;
					case AMQP_FIELD_KIND_I64:
						printf("%lld", (long long) e->value.value.i64);
						break;
					default:
						printf("(kind %d)", (int) e->value.kind);
						break;
				}
			}
		fputs("\tbody=", stdout);
		put_bytes(msg.body);
		putchar('\n');
		amqp_basic_ack(conn, 1, ok->delivery_tag, 0);
		amqp_destroy_message(&msg);
	}
	amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
	return 0;
}
