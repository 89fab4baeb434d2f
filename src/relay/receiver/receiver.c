/*-------------------------------------------------------------------------
 *
 * receiver.c
 *		outbox-receiver: a small local webhook endpoint for outbox-relay's
 *		tests, benchmark and demo.  It is a consumer that lives in
 *		PostgreSQL: each POSTed command is applied exactly once.
 *
 * For each request (the body is the relay's JSON object, the
 * Idempotency-Key header its command_id) it runs, in one transaction:
 *
 *		SELECT outbox.inbox_accept(consumer, run_id, command_id);
 *		-- only when that returned true:
 *		INSERT INTO <table> (command_id, payload) VALUES (...);
 *		SELECT outbox.complete(run_id, command_id);
 *
 * (run_id is the body's; the consumer name, outbox-receiver unless
 * --consumer names another, must be registered to the receiver's role:
 * outbox.register_consumer.)
 *
 * so a redelivered command is answered 200 again but changes nothing.
 * Without --dsn it only logs and answers 200.  Errors: 503 when the
 * database is unavailable (the relay retries), 409 on an integrity error
 * or an outbox error of class OB, such as an unknown command (OB002) or an
 * unregistered consumer name (OB003): the relay gives up, retrying cannot
 * help.
 *
 * Test hooks, read from the command's payload, apply while the relay's
 * "deliveries" is at most "test_times" (default: always):
 *		"test_sleep_ms": N	 wait N ms before answering;
 *		"test_status": CODE	 answer CODE instead of applying the command.
 *
 * --log FILE gets one line per request, tab-separated: command_id,
 * deliveries, HTTP status, 1/0 for accepted/duplicate ("-" when nothing
 * was applied), and the wall-clock time in milliseconds, with three
 * decimals (microseconds), just before the answer is sent.
 *
 * One thread per connection, each with its own database connection
 * (opened on first use, reopened after an error).  HTTP/1.1 keep-alive;
 * Content-Length bodies only.
 *
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <libpq-fe.h>

#define MAX_HEADER	(64 * 1024)
#define MAX_BODY	(32 * 1024 * 1024)

static const char *opt_listen = "127.0.0.1";
static int	opt_port = 0;
static const char *opt_port_file = NULL;
static const char *opt_dsn = NULL;
static const char *opt_consumer = "outbox-receiver";
static const char *opt_table = NULL;
static long opt_delay_ms = 0;
static int	log_fd = -1;
static char insert_sql[512];

/* Log a line on stderr. */
static void
rlog(const char *fmt,...) __attribute__((format(printf, 1, 2)));
static void
rlog(const char *fmt,...)
{
	char		line[1024];
	int			n;
	va_list		ap;

	n = snprintf(line, sizeof(line), "outbox-receiver[%d]: ", (int) getpid());
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	va_end(ap);
	strcat(line, "\n");
	fputs(line, stderr);
}

/* Print usage and exit. */
static void
usage(int code)
{
	fprintf(code ? stderr : stdout,
			"outbox-receiver: a local webhook that applies outbox commands exactly once.\n\n"
			"Usage:\n  outbox-receiver [OPTION]...\n\n"
			"Options:\n"
			"  --listen=ADDR       address to listen on (default 127.0.0.1)\n"
			"  --port=N            port (default 0: any free port)\n"
			"  --port-file=FILE    write the port there once listening\n"
			"  --dsn=CONNINFO      database to apply commands in (default: none, just answer 200)\n"
			"  --consumer=NAME     inbox consumer name (default outbox-receiver)\n"
			"  --table=NAME        business table (command_id text, payload jsonb) to insert into\n"
			"  --delay-ms=N        wait N ms before answering each POST (a remote endpoint)\n"
			"  --log=FILE          append one line per request: id, deliveries, status,\n"
			"                      accepted (1/0/-), time in ms\n"
			"  --help              print this help\n");
	exit(code);
}

/* Find `"key"` in s and parse the integer after its colon. */
static bool
json_int(const char *s, const char *key, bool last, long *out)
{
	char		pat[64];
	const char *p = NULL;
	const char *q;
	char	   *end;

	snprintf(pat, sizeof(pat), "\"%s\"", key);
	for (q = strstr(s, pat); q != NULL; q = strstr(q + 1, pat))
	{
		p = q;
		if (!last)
			break;
	}
	if (p == NULL)
		return false;
	p += strlen(pat);
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	if (*p != ':')
		return false;
	p++;
	*out = strtol(p, &end, 10);
	return end != p;
}

/* Send all of buf. */
static bool
send_all(int fd, const char *buf, size_t len)
{
	while (len > 0)
	{
		ssize_t		n = send(fd, buf, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		buf += n;
		len -= (size_t) n;
	}
	return true;
}

/* Send a response. */
static bool
respond(int fd, int status, const char *body, bool keep_alive)
{
	char		head[256];
	const char *reason;
	int			n;

	switch (status)
	{
		case 200:
			reason = "OK";
			break;
		case 400:
			reason = "Bad Request";
			break;
		case 404:
			reason = "Not Found";
			break;
		case 405:
			reason = "Method Not Allowed";
			break;
		case 409:
			reason = "Conflict";
			break;
		case 413:
			reason = "Payload Too Large";
			break;
		case 415:
			reason = "Unsupported Media Type";
			break;
		case 503:
			reason = "Service Unavailable";
			break;
		default:
			reason = "Status";
			break;
	}
	n = snprintf(head, sizeof(head),
				 "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
				 "Content-Length: %zu\r\nConnection: %s\r\n\r\n",
				 status, reason, strlen(body), keep_alive ? "keep-alive" : "close");
	return send_all(fd, head, (size_t) n) && send_all(fd, body, strlen(body));
}

/* Append one line to the request log. */
static void
log_request(const char *key, long deliveries, int status, const char *accepted)
{
	char		line[1200];
	int			n;
	ssize_t		rc;
	struct timespec ts;

	if (log_fd < 0)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	n = snprintf(line, sizeof(line), "%s\t%ld\t%d\t%s\t%lld.%03ld\n", key, deliveries, status, accepted,
				 (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000,
				 (long) (ts.tv_nsec / 1000 % 1000));
	if (n >= (int) sizeof(line))
		n = sizeof(line) - 1;
	/* O_APPEND: each line lands whole */
	rc = write(log_fd, line, (size_t) n);
	(void) rc;
}

/* Fill err with the one-line error of res (or of the connection). */
static void
pg_error(PGconn *pg, PGresult *res, char *err, size_t errlen, int *status)
{
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	const char *msg = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
	char	   *p;

	snprintf(err, errlen, "%s", msg ? msg : PQerrorMessage(pg));
	for (p = err; *p; p++)
		if (*p == '\n' || *p == '"' || *p == '\\')
			*p = ' ';
	/* integrity errors and the outbox's own (OB) will not go away by retrying */
	*status = (state != NULL && (strncmp(state, "23", 2) == 0 || strncmp(state, "OB", 2) == 0)) ? 409 : 503;
}

/* Run one statement; false (with err and status) on error. */
static bool
pg_run(PGconn *pg, const char *sql, int nparams, const char *const *vals,
	   char **value, char *err, size_t errlen, int *status)
{
	PGresult   *res = PQexecParams(pg, sql, nparams, NULL, vals, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(res);

	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
	{
		pg_error(pg, res, err, errlen, status);
		PQclear(res);
		return false;
	}
	if (value != NULL)
		*value = (PQntuples(res) > 0) ? strdup(PQgetvalue(res, 0, 0)) : NULL;
	PQclear(res);
	return true;
}

/*
 * Apply one command in the database: inbox, business row, receipt, in one
 * transaction.  Returns the HTTP status; *accepted tells first time or not.
 */
static int
apply(PGconn **pgp, const char *key, const char *body, bool *accepted, char *err, size_t errlen)
{
	PGconn	   *pg = *pgp;
	const char *vals[3];
	char	   *v = NULL;
	int			status = 503;

	if (pg == NULL || PQstatus(pg) != CONNECTION_OK)
	{
		if (pg != NULL)
			PQfinish(pg);
		pg = *pgp = PQconnectdb(opt_dsn);
		if (PQstatus(pg) != CONNECTION_OK)
		{
			pg_error(pg, NULL, err, errlen, &status);
			PQfinish(pg);
			*pgp = NULL;
			return 503;
		}
	}

	if (!pg_run(pg, "BEGIN", 0, NULL, NULL, err, errlen, &status))
		return status;
	vals[0] = opt_consumer;
	vals[1] = key;
	vals[2] = body;
	if (!pg_run(pg, "SELECT outbox.inbox_accept($1, pg_catalog.jsonb_extract_path_text($3::pg_catalog.jsonb, 'run_id'), $2)",
				3, vals, &v, err, errlen, &status))
		goto fail;
	*accepted = (v != NULL && v[0] == 't');
	free(v);
	if (*accepted)
	{
		vals[0] = key;
		vals[1] = body;
		if (opt_table != NULL &&
			!pg_run(pg, insert_sql, 2, vals, NULL, err, errlen, &status))
			goto fail;
		if (!pg_run(pg, "SELECT outbox.complete(pg_catalog.jsonb_extract_path_text($2::pg_catalog.jsonb, 'run_id'), $1)",
					2, vals, NULL, err, errlen, &status))
			goto fail;
	}
	if (!pg_run(pg, "COMMIT", 0, NULL, NULL, err, errlen, &status))
		goto fail;
	return 200;

fail:
	if (PQstatus(pg) == CONNECTION_OK)
	{
		PGresult   *res = PQexec(pg, "ROLLBACK");

		PQclear(res);
	}
	return status;
}

/* Answer one POST. */
static int
handle_post(PGconn **pgp, const char *key, const char *body, int fd, bool keep_alive)
{
	long		deliveries = 0;
	long		times = LONG_MAX;
	long		v;
	bool		accepted = false;
	char		err[400];
	char		out[600];
	int			status;

	if (opt_delay_ms > 0)
	{
		struct timespec ts;

		ts.tv_sec = opt_delay_ms / 1000;
		ts.tv_nsec = (opt_delay_ms % 1000) * 1000000L;
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
	}
	(void) json_int(body, "deliveries", true, &deliveries);
	(void) json_int(body, "test_times", false, &times);
	if (deliveries <= times)
	{
		if (json_int(body, "test_sleep_ms", false, &v) && v > 0)
		{
			struct timespec ts;

			ts.tv_sec = v / 1000;
			ts.tv_nsec = (v % 1000) * 1000000L;
			while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
				;
		}
		if (json_int(body, "test_status", false, &v) && v >= 100 && v <= 999)
		{
			log_request(key, deliveries, (int) v, "-");
			respond(fd, (int) v, "{\"error\":\"test_status\"}", keep_alive);
			return (int) v;
		}
	}

	if (opt_dsn == NULL)
	{
		log_request(key, deliveries, 200, "-");
		respond(fd, 200, "{\"accepted\":null}", keep_alive);
		return 200;
	}

	status = apply(pgp, key, body, &accepted, err, sizeof(err));
	if (status == 200)
	{
		log_request(key, deliveries, 200, accepted ? "1" : "0");
		respond(fd, 200, accepted ? "{\"accepted\":true}" : "{\"accepted\":false}", keep_alive);
	}
	else
	{
		rlog("command \"%s\": %d: %s", key, status, err);
		log_request(key, deliveries, status, "-");
		snprintf(out, sizeof(out), "{\"error\":\"%s\"}", err);
		respond(fd, status, out, keep_alive);
	}
	return status;
}

/*
 * Receive more of a connection's bytes into *buf (holding *len of *cap),
 * first growing it to room for at least `room` bytes (plus a terminator).
 * False when the peer closed, on an error, or out of memory.
 */
static bool
recv_more(int fd, char **buf, size_t *len, size_t *cap, size_t room)
{
	ssize_t		n;

	if (*cap < room)
	{
		size_t		want = room > *cap * 2 ? room : *cap * 2;
		char	   *grown = realloc(*buf, want + 1);

		if (grown == NULL)
			return false;
		*buf = grown;
		*cap = want;
	}
	do
		n = recv(fd, *buf + *len, *cap - *len, 0);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		return false;
	*len += (size_t) n;
	return true;
}

/* Serve one connection until it closes. */
static void *
serve(void *arg)
{
	int			fd = (int) (intptr_t) arg;
	char	   *buf = NULL;
	size_t		len = 0;
	size_t		cap = 0;
	PGconn	   *pg = NULL;

	for (;;)
	{
		char	   *hdr_end = NULL;
		size_t		hdr_len;
		char	   *line;
		char	   *save = NULL;
		char		method[16] = "";
		char		path[256] = "";
		char		version[16] = "";
		long		clen = 0;
		char		key[1024] = "";
		bool		json = false;
		bool		keep_alive = true;
		bool		chunked = false;
		bool		expect = false;
		char	   *body;

		/* read the head */
		while ((hdr_end = (len > 0 ? memmem(buf, len, "\r\n\r\n", 4) : NULL)) == NULL)
		{
			if (len >= MAX_HEADER || !recv_more(fd, &buf, &len, &cap, len + 4096))
				goto done;
		}
		hdr_len = (size_t) (hdr_end - buf) + 4;
		*hdr_end = '\0';

		/* request line and headers */
		line = strtok_r(buf, "\r\n", &save);
		if (line == NULL || sscanf(line, "%15s %255s %15s", method, path, version) != 3)
			goto done;
		if (strcmp(version, "HTTP/1.0") == 0)
			keep_alive = false;
		while ((line = strtok_r(NULL, "\r\n", &save)) != NULL)
		{
			char	   *colon = strchr(line, ':');
			char	   *val;

			if (colon == NULL)
				continue;
			*colon = '\0';
			val = colon + 1;
			while (*val == ' ' || *val == '\t')
				val++;
			if (strcasecmp(line, "Content-Length") == 0)
				clen = strtol(val, NULL, 10);
			else if (strcasecmp(line, "Idempotency-Key") == 0)
				snprintf(key, sizeof(key), "%s", val);
			else if (strcasecmp(line, "Content-Type") == 0)
				json = strncasecmp(val, "application/json", 16) == 0;
			else if (strcasecmp(line, "Connection") == 0)
				keep_alive = keep_alive ? strcasecmp(val, "close") != 0 :
					strcasecmp(val, "keep-alive") == 0;
			else if (strcasecmp(line, "Transfer-Encoding") == 0)
				chunked = true;
			else if (strcasecmp(line, "Expect") == 0)
				expect = strcasecmp(val, "100-continue") == 0;
		}
		if (chunked)
		{
			respond(fd, 411, "{\"error\":\"Content-Length required\"}", false);
			goto done;
		}
		if (clen < 0 || clen > MAX_BODY)
		{
			respond(fd, 413, "{\"error\":\"body too large\"}", false);
			goto done;
		}
		if (expect && !send_all(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25))
			goto done;

		/* read the body */
		while (len < hdr_len + (size_t) clen)
		{
			if (!recv_more(fd, &buf, &len, &cap, hdr_len + (size_t) clen))
				goto done;
		}
		body = buf + hdr_len;
		{
			char		saved = body[clen];

			body[clen] = '\0';
			if (strcmp(method, "GET") == 0 && strcmp(path, "/health") == 0)
				respond(fd, 200, "{\"status\":\"ok\"}", keep_alive);
			else if (strcmp(method, "POST") != 0)
				respond(fd, 405, "{\"error\":\"POST expected\"}", keep_alive);
			else if (!json)
				respond(fd, 415, "{\"error\":\"application/json expected\"}", keep_alive);
			else if (key[0] == '\0')
				respond(fd, 400, "{\"error\":\"Idempotency-Key header missing\"}", keep_alive);
			else
				handle_post(&pg, key, body, fd, keep_alive);
			body[clen] = saved;
		}

		/* keep what follows for the next request */
		memmove(buf, buf + hdr_len + clen, len - hdr_len - (size_t) clen);
		len -= hdr_len + (size_t) clen;
		if (!keep_alive)
			break;
	}

done:
	if (pg != NULL)
		PQfinish(pg);
	free(buf);
	close(fd);
	return NULL;
}

/* Parse the options, listen, and serve each connection in its own thread. */
int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"listen", required_argument, NULL, 'a'},
		{"port", required_argument, NULL, 'p'},
		{"port-file", required_argument, NULL, 'f'},
		{"dsn", required_argument, NULL, 'd'},
		{"consumer", required_argument, NULL, 'c'},
		{"table", required_argument, NULL, 't'},
		{"log", required_argument, NULL, 'l'},
		{"delay-ms", required_argument, NULL, 'w'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}
	};
	struct sockaddr_in addr;
	socklen_t	alen = sizeof(addr);
	int			lfd;
	int			one = 1;
	int			c;
	const char *p;
	pthread_attr_t attr;

	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1)
	{
		switch (c)
		{
			case 'a':
				opt_listen = optarg;
				break;
			case 'p':
				opt_port = atoi(optarg);
				break;
			case 'f':
				opt_port_file = optarg;
				break;
			case 'd':
				opt_dsn = optarg;
				break;
			case 'c':
				opt_consumer = optarg;
				break;
			case 't':
				opt_table = optarg;
				break;
			case 'w':
				opt_delay_ms = atol(optarg);
				break;
			case 'l':
				log_fd = open(optarg, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
				if (log_fd < 0)
				{
					rlog("could not open \"%s\": %s", optarg, strerror(errno));
					return 1;
				}
				break;
			case 'h':
				usage(0);
				break;
			default:
				usage(2);
		}
	}
	if (opt_table != NULL)
	{
		for (p = opt_table; *p; p++)
			if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
				  (*p >= '0' && *p <= '9') || *p == '_' || *p == '.'))
			{
				rlog("invalid table name \"%s\"", opt_table);
				return 2;
			}
		snprintf(insert_sql, sizeof(insert_sql),
				 "INSERT INTO %s (command_id, payload) SELECT $1, ($2::jsonb) -> 'payload'",
				 opt_table);
	}
	signal(SIGPIPE, SIG_IGN);

	lfd = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&addr, 0, sizeof(addr));
	addr.sin_family = AF_INET;
	addr.sin_port = htons((uint16_t) opt_port);
	if (inet_pton(AF_INET, opt_listen, &addr.sin_addr) != 1)
	{
		rlog("invalid listen address \"%s\"", opt_listen);
		return 2;
	}
	if (bind(lfd, (struct sockaddr *) &addr, sizeof(addr)) != 0 || listen(lfd, 128) != 0)
	{
		rlog("could not listen on %s:%d: %s", opt_listen, opt_port, strerror(errno));
		return 1;
	}
	getsockname(lfd, (struct sockaddr *) &addr, &alen);
	rlog("listening on %s:%d%s", opt_listen, ntohs(addr.sin_port),
		 opt_dsn ? "" : " (no database: answering 200)");
	if (opt_port_file != NULL)
	{
		char		tmp[4096];
		FILE	   *f;

		snprintf(tmp, sizeof(tmp), "%s.tmp", opt_port_file);
		f = fopen(tmp, "w");
		if (f == NULL || fprintf(f, "%d\n", ntohs(addr.sin_port)) < 0 || fclose(f) != 0 ||
			rename(tmp, opt_port_file) != 0)
		{
			rlog("could not write \"%s\": %s", opt_port_file, strerror(errno));
			return 1;
		}
	}

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	for (;;)
	{
		int			fd = accept(lfd, NULL, NULL);
		pthread_t	th;

		if (fd < 0)
		{
			if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE)
				continue;
			rlog("accept failed: %s", strerror(errno));
			return 1;
		}
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (pthread_create(&th, &attr, serve, (void *) (intptr_t) fd) != 0)
			close(fd);
	}
	return 0;
}
