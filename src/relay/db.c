/*-------------------------------------------------------------------------
 *
 * db.c
 *		outbox-relay's database side: connection, LISTEN, and the four
 *		publisher calls (claim, batch ack, fail, renew) as prepared
 *		statements, or with --stream the three of a stream's subscription
 *		(claim_batch, ack_batch, renew_batch).
 *
 * Each connection prepares its statements once.  Errors are sorted in
 * three: the connection is gone (reconnect with backoff and try again),
 * a configuration error that retrying cannot fix (SQLSTATE classes 42,
 * 3F, 22 and 0A, e.g. the extension is not installed, the role lacks the
 * database's publisher role, or the batch exceeds outbox.max_batch: the
 * relay exits 1), and anything else (log, back off, retry).  A refused
 * token (SQLSTATE OB001, lease_not_owned; matched by code, never by
 * message) is not an error for the relay: it means another worker owns the
 * command now, and it is only counted.  Tokens are never logged; command
 * ids and error texts, which producers and endpoints control, are logged
 * escaped (log_text), so that no id can forge a line of the log.
 *
 * Pipelined calls.  The main loop sends the next batch's claim, and a
 * delivered batch's report when it is one call (an ack_many, or with
 * --stream an ack_batch), without waiting (db_async_claim,
 * db_async_report): libpq's pipeline mode, each call followed by its own
 * sync so that it is a transaction of its own and an error of one aborts
 * no other.  db_async_collect takes the results in, in order, without
 * blocking or until a given batch's call is in; every synchronous call
 * first takes in whatever is pending and leaves pipeline mode.  A lost
 * connection abandons what is pending: an ack's commands stay delivered and
 * are reported again on the next connection, with the same tokens; a
 * claim's batch stays empty (its leases, if it committed, expire).
 *
 * Hand-over.  A pipelined ack of a batch with ordered commands may be an
 * ack_handover instead (db_async_report with a batch to fill): the server
 * leases each acked head's next command to this worker in the ack's own
 * transaction, and the leases come back in the ack's result, after its
 * rows of the tokens, in the columns of a claim.  They fill the batch
 * given, as a claim would: the main loop delivers it next.  A call lost
 * with its connection leaves that batch empty (the leases expire and are
 * taken over).  A server without outbox.ack_handover (SQLSTATE 42883 when
 * it is prepared) turns it off, as --handover off does.
 *
 * Streams.  claim_batch returns the commands of one batch with the same
 * first columns as claim (every row carries the batch's token), so a
 * batch is read as today.  The batch is leased and acked as a whole: its
 * outcome is reported once every command has one, in one ack_batch call
 * naming the commands the sink failed (with their errors and whether the
 * failure is fatal), and it is renewed with one renew_batch call.  A batch
 * whose commands are held (the sink is down) is not reported, only
 * renewed, until they have an outcome.
 *
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/select.h>

#include "relay.h"

#define OID_TEXT		25
#define OID_INT4		23
#define OID_INT8		20
#define OID_BOOL		16
#define OID_FLOAT8		701
#define OID_TEXTARRAY	1009
#define OID_BOOLARRAY	1000

/* The SQLSTATE of lease_not_owned. */
#define SQLSTATE_LEASE_NOT_OWNED "OB001"

static PGconn *conn = NULL;
static char *channel = NULL;

/*
 * Pipelined calls (libpq's pipeline mode): at most DB_MAX_ASYNC calls sent
 * and not yet taken in, each followed by its own sync, so that each is a
 * transaction of its own and one's error does not abort the next.
 */
typedef enum AsyncKind
{
	ASYNC_CLAIM,				/* claim or claim_batch into batch */
	ASYNC_ACK,					/* ack_many of batch's delivered commands */
	ASYNC_ACK_STREAM			/* ack_batch of a stream batch */
} AsyncKind;

typedef struct AsyncCall
{
	AsyncKind	kind;
	RelayBatch *batch;
	RelayBatch *handed;			/* ASYNC_ACK by ack_handover: filled with
								 * the leases handed over */
	int		   *idx;			/* ASYNC_ACK: the commands acked, in order */
	int			n;
	int			delivered;		/* ASYNC_ACK_STREAM: what it reports */
	int			failed;
	const char *first_error;
	PGresult   *res;			/* the call's result, once in */
} AsyncCall;

#define DB_MAX_ASYNC 4
static AsyncCall async_calls[DB_MAX_ASYNC];
static int	async_count = 0;

static bool db_settle(void);
static void async_abandon(void);

/*
 * Joined to a call, this one-row subquery makes the call's transaction
 * commit without waiting for its WAL flush (OFFSET 0 keeps the planner
 * from dropping it).  A claim committed that way and lost in a crash of the
 * server only delays its commands: they are pending again afterwards, and
 * a relay that delivered them meanwhile has its ack refused (its token's
 * version and owner no longer match), so they are delivered again.  The
 * first synchronous commit after it (the batch's ack, by default) flushes
 * it too.
 */
#define ASYNC_COMMIT_FROM \
	"(SELECT pg_catalog.set_config('synchronous_commit', 'off', true) OFFSET 0) AS async_commit, "

/*
 * The claim's columns: the headers come as JSON text and as name:value
 * lines; the subquery that makes the lines runs only for a command that has
 * headers (run for every row, it was about 1% of the backend's time at
 * B = 100).
 */
#define CLAIM_COLS \
"SELECT c.command_id, c.run_id, c.kind, c.payload, c.token, c.deliveries," \
"       pg_catalog.date_part('epoch', c.lease_until - pg_catalog.clock_timestamp())," \
"       c.seq, c.headers::pg_catalog.text," \
"       CASE WHEN c.headers IS NOT NULL THEN" \
"        (SELECT pg_catalog.string_agg(h.key OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) h.value, E'\\n')" \
"           FROM pg_catalog.jsonb_each_text(c.headers) h) END," \
"       c.ordering_key"
#define CLAIM_SELECT CLAIM_COLS "  FROM "
#define CLAIM_CALL "outbox.claim($1, $2, pg_catalog.make_interval(secs => $3), $4) AS c"

static const char *const claim_sql = CLAIM_SELECT CLAIM_CALL;
static const char *const claim_async_sql = CLAIM_SELECT ASYNC_COMMIT_FROM CLAIM_CALL;
static const Oid claim_types[4] = {OID_TEXT, OID_INT4, OID_FLOAT8, OID_TEXTARRAY};

#define ACK_SELECT "SELECT a.command_id, a.acked, a.reason FROM "
#define ACK_CALL "outbox.ack_many($1, $2) AS a"
static const char *const ack_sql = ACK_SELECT ACK_CALL;
static const char *const ack_async_sql = ACK_SELECT ASYNC_COMMIT_FROM ACK_CALL;
static const Oid ack_types[2] = {OID_TEXT, OID_TEXTARRAY};

/*
 * The ack that hands over: a claim's columns (the rows of the tokens have
 * NULL in them), then acked and reason (NULL in the rows of the leases).
 */
#define HANDOVER_ACKED	11
#define HANDOVER_REASON 12
#define HANDOVER_SELECT CLAIM_COLS ", c.acked, c.reason FROM "
#define HANDOVER_CALL \
	"outbox.ack_handover($1, $2, $3, pg_catalog.make_interval(secs => $4), $5) AS c"
static const char *const handover_sql = HANDOVER_SELECT HANDOVER_CALL;
static const char *const handover_async_sql = HANDOVER_SELECT ASYNC_COMMIT_FROM HANDOVER_CALL;
static const Oid handover_types[5] = {OID_TEXT, OID_TEXTARRAY, OID_INT4, OID_FLOAT8, OID_TEXTARRAY};
/* ack_handover is prepared on this connection */
static bool handover_ready = false;

static const char *const fail_sql =
"SELECT outbox.fail($1, $2, $3, $4)";
static const Oid fail_types[4] = {OID_TEXT, OID_TEXT, OID_TEXT, OID_BOOL};

static const char *const renew_sql =
"SELECT pg_catalog.date_part('epoch',"
"       outbox.renew($1, $2, pg_catalog.make_interval(secs => $3))"
"       - pg_catalog.clock_timestamp())";
static const Oid renew_types[3] = {OID_TEXT, OID_TEXT, OID_FLOAT8};

/* With --stream: a subscription's batches. */
#define CLAIM_BATCH_CALL \
	"outbox.claim_batch($1, $2, $3, pg_catalog.make_interval(secs => $4)) AS c"
static const char *const claim_batch_sql = CLAIM_SELECT CLAIM_BATCH_CALL;
static const char *const claim_batch_async_sql = CLAIM_SELECT ASYNC_COMMIT_FROM CLAIM_BATCH_CALL;
static const Oid claim_batch_types[4] = {OID_TEXT, OID_TEXT, OID_TEXT, OID_FLOAT8};

#define ACK_BATCH_SELECT "SELECT a.n FROM "
#define ACK_BATCH_CALL "outbox.ack_batch($1, $2, $3, $4, $5) AS a(n)"
static const char *const ack_batch_sql = ACK_BATCH_SELECT ACK_BATCH_CALL;
static const char *const ack_batch_async_sql = ACK_BATCH_SELECT ASYNC_COMMIT_FROM ACK_BATCH_CALL;
static const Oid ack_batch_types[5] = {OID_TEXT, OID_TEXT, OID_TEXTARRAY, OID_TEXTARRAY, OID_BOOLARRAY};

static const char *const renew_batch_sql =
"SELECT pg_catalog.date_part('epoch',"
"       outbox.renew_batch($1, $2, pg_catalog.make_interval(secs => $3))"
"       - pg_catalog.clock_timestamp())";

/*
 * Text a producer or an endpoint controls (a command id, an error), fit for
 * one log line: printable ASCII as it is, the backslash doubled, every
 * other byte as \xHH.  Up to four results are valid at once (a ring of
 * buffers), each cut to about 400 bytes of input.
 */
static const char *
log_text(const char *s)
{
	static char ring[4][1700];
	static int	next = 0;
	char	   *buf = ring[next];
	size_t		o = 0;
	size_t		i;

	next = (next + 1) % 4;
	for (i = 0; s != NULL && s[i] != '\0' && o + 8 < sizeof(ring[0]); i++)
	{
		unsigned char c = (unsigned char) s[i];

		if (i >= 400)
		{
			memcpy(buf + o, "...", 3);
			o += 3;
			break;
		}
		if (c == '\\')
		{
			buf[o++] = '\\';
			buf[o++] = '\\';
		}
		else if (c >= 0x20 && c < 0x7f)
			buf[o++] = (char) c;
		else
			o += snprintf(buf + o, sizeof(ring[0]) - o, "\\x%02X", c);
	}
	buf[o] = '\0';
	return buf;
}

/* Copy msg to a static buffer as one line (libpq messages span lines). */
static const char *
one_line(const char *msg)
{
	static char buf[512];
	size_t		i = 0;
	const char *p;

	for (p = msg ? msg : ""; *p && i < sizeof(buf) - 1; p++)
	{
		unsigned char uc = (unsigned char) *p;
		char		c = (uc < 0x20 || uc == 0x7f) ? ' ' : *p;

		if (c == ' ' && (i == 0 || buf[i - 1] == ' '))
			continue;
		buf[i++] = c;
	}
	while (i > 0 && buf[i - 1] == ' ')
		i--;
	buf[i] = '\0';
	return buf;
}

/* The primary message of a failed result, with its SQLSTATE. */
static const char *
result_error(const PGresult *res)
{
	static char buf[600];
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	const char *primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);

	if (primary == NULL)
		return one_line(PQresultErrorMessage(res));
	snprintf(buf, sizeof(buf), "%s (SQLSTATE %s)", one_line(primary),
			 state ? state : "?????");
	return buf;
}

/* True for the SQLSTATEs that retrying cannot fix. */
static bool
fatal_sqlstate(const char *state)
{
	if (state == NULL)
		return false;
	return strncmp(state, "42", 2) == 0 ||	/* undefined object, privilege */
		strncmp(state, "3F", 2) == 0 || /* invalid schema */
		strncmp(state, "22", 2) == 0 || /* bad argument */
		strncmp(state, "0A", 2) == 0;	/* feature not supported */
}

/* Is there a usable connection? */
bool
db_connected(void)
{
	return conn != NULL && PQstatus(conn) == CONNECTION_OK;
}

/* Drop the connection. */
void
db_disconnect(void)
{
	async_abandon();
	if (conn != NULL)
		PQfinish(conn);
	conn = NULL;
}

/* Sort out a failed call: log it and tell the caller what to do. */
static DbResult
db_failure(PGresult *res, const char *what)
{
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

	/* 08: connection exception; 57P: the server is shutting down */
	if (conn == NULL || PQstatus(conn) != CONNECTION_OK ||
		(state != NULL && (strncmp(state, "08", 2) == 0 || strncmp(state, "57P", 3) == 0)))
	{
		relay_log("connection lost during %s: %s", what,
				  res && PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) ? result_error(res) :
				  one_line(conn ? PQerrorMessage(conn) : "no connection"));
		db_disconnect();
		return DB_RETRY;
	}
	if (fatal_sqlstate(state))
	{
		relay_log("%s failed: %s", what, result_error(res));
		return DB_FATAL;
	}
	relay_log("%s failed, will retry: %s", what,
			  res ? result_error(res) : one_line(PQerrorMessage(conn)));
	return DB_RETRY;
}

/* Prepare one statement on the new connection. */
static DbResult
db_prepare(const char *name, const char *sql, int nparams, const Oid *types)
{
	PGresult   *res = PQprepare(conn, name, sql, nparams, types);
	DbResult	r = DB_OK;

	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		r = db_failure(res, "prepare");
	PQclear(res);
	return r;
}

/*
 * A new connection to the --dsn, made or failed (PQstatus says which):
 * the relay's connect_timeout (unless PGCONNECT_TIMEOUT is set), its
 * application_name, and UTF-8 (the sinks emit UTF-8 JSON).  Used by
 * db_connect and by the --citus supervisor (citus.c).
 */
PGconn *
db_open(void)
{
	const char *keys[5];
	const char *vals[5];
	int			k = 0;
	PGconn	   *c;

	if (getenv("PGCONNECT_TIMEOUT") == NULL)
	{
		keys[k] = "connect_timeout";
		vals[k++] = "10";
	}
	keys[k] = "fallback_application_name";
	vals[k++] = RELAY_NAME;
	if (relay_opts.dsn != NULL)
	{
		keys[k] = "dbname";
		vals[k++] = relay_opts.dsn;
	}
	/* last, so that it wins */
	keys[k] = "client_encoding";
	vals[k++] = "UTF8";
	keys[k] = NULL;
	vals[k] = NULL;

	c = PQconnectdbParams(keys, vals, 1);
	if (c == NULL)
	{
		relay_log("out of memory");
		exit(RELAY_EXIT_RUNTIME);
	}
	return c;
}

/*
 * Connect, prepare the statements, read outbox.notify_channel and LISTEN
 * on it.  DB_RETRY when the server cannot be reached (the caller backs off
 * and tries again), DB_FATAL when it answers with an error retrying cannot
 * fix.
 */
DbResult
db_connect(void)
{
	PGresult   *res;
	char	   *ident;
	char		sql[600];
	DbResult	r;

	db_disconnect();

	conn = db_open();
	if (PQstatus(conn) != CONNECTION_OK)
	{
		relay_log("could not connect: %s", one_line(PQerrorMessage(conn)));
		db_disconnect();
		return DB_RETRY;
	}

	if (relay_opts.stream != NULL)
	{
		if ((r = db_prepare("outbox_claim",
							relay_opts.claim_sync ? claim_batch_sql : claim_batch_async_sql,
							4, claim_batch_types)) != DB_OK ||
			(r = db_prepare("outbox_ack",
							relay_opts.ack_async ? ack_batch_async_sql : ack_batch_sql,
							5, ack_batch_types)) != DB_OK ||
			(r = db_prepare("outbox_renew", renew_batch_sql, 3, renew_types)) != DB_OK)
		{
			db_disconnect();
			return r;
		}
	}
	else if ((r = db_prepare("outbox_claim", relay_opts.claim_sync ? claim_sql : claim_async_sql,
							 4, claim_types)) != DB_OK ||
			 (r = db_prepare("outbox_ack", relay_opts.ack_async ? ack_async_sql : ack_sql,
							 2, ack_types)) != DB_OK ||
			 (r = db_prepare("outbox_fail", fail_sql, 4, fail_types)) != DB_OK ||
			 (r = db_prepare("outbox_renew", renew_sql, 3, renew_types)) != DB_OK)
	{
		db_disconnect();
		return r;
	}
	handover_ready = false;
	if (relay_opts.stream == NULL && relay_opts.handover)
	{
		res = PQprepare(conn, "outbox_handover",
						relay_opts.ack_async ? handover_async_sql : handover_sql,
						5, handover_types);
		if (PQresultStatus(res) == PGRES_COMMAND_OK)
			handover_ready = true;
		else if (strcmp(PQresultErrorField(res, PG_DIAG_SQLSTATE) ?
						PQresultErrorField(res, PG_DIAG_SQLSTATE) : "", "42883") == 0)
		{
			relay_log("the server has no outbox.ack_handover: acks hand nothing over");
			relay_opts.handover = false;
		}
		else
		{
			r = db_failure(res, "prepare");
			PQclear(res);
			db_disconnect();
			return r;
		}
		PQclear(res);
	}

	res = PQexec(conn,
				 "SELECT COALESCE(NULLIF(pg_catalog.current_setting('outbox.notify_channel', true), ''), 'outbox')");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		r = db_failure(res, "reading outbox.notify_channel");
		PQclear(res);
		db_disconnect();
		return r;
	}
	free(channel);
	channel = relay_strdup(PQgetvalue(res, 0, 0));
	PQclear(res);

	ident = PQescapeIdentifier(conn, channel, strlen(channel));
	if (ident == NULL)
	{
		relay_log("could not quote channel name: %s", one_line(PQerrorMessage(conn)));
		db_disconnect();
		return DB_RETRY;
	}
	snprintf(sql, sizeof(sql), "LISTEN %s", ident);
	PQfreemem(ident);
	res = PQexec(conn, sql);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		r = db_failure(res, "LISTEN");
		PQclear(res);
		db_disconnect();
		return r;
	}
	PQclear(res);

	relay_log("connected to database \"%s\" as worker \"%s\", listening on channel \"%s\"",
			  PQdb(conn), relay_opts.worker, channel);
	return DB_OK;
}

/* Release a batch. */
void
batch_free(RelayBatch *batch)
{
	int			i;

	for (i = 0; i < batch->n; i++)
	{
		free(batch->cmds[i].error);
		free(batch->cmds[i].headers);
		free(batch->cmds[i].header_text);
	}
	free(batch->cmds);
	if (batch->res)
		PQclear(batch->res);
	memset(batch, 0, sizeof(*batch));
}

/* Set the batch's lease end and renewal time from the shortest lease left. */
static void
batch_set_lease(RelayBatch *batch, double now, double left)
{
	if (left < 0)
		left = 0;
	batch->lease_end = now + left;
	batch->renew_at = now + left / 2;
}

/*
 * Take a command's headers apart: the claim sends them as lines
 * "name:value" (a name is a token, so it holds no ':', and a value holds no
 * newline: the server refuses control characters).
 */
static void
cmd_set_headers(RelayCommand *cmd, const char *json, const char *lines)
{
	char	   *p;
	int			n = 1;

	if (json == NULL || lines == NULL || lines[0] == '\0')
		return;
	cmd->headers_json = json;
	cmd->header_text = relay_strdup(lines);
	for (p = cmd->header_text; *p; p++)
		if (*p == '\n')
			n++;
	cmd->headers = relay_malloc(sizeof(RelayHeader) * n);
	p = cmd->header_text;
	while (p != NULL && *p)
	{
		char	   *nl = strchr(p, '\n');
		char	   *colon;

		if (nl)
			*nl = '\0';
		colon = strchr(p, ':');
		if (colon && cmd->nheaders < RELAY_MAX_HEADERS)
		{
			*colon = '\0';
			cmd->headers[cmd->nheaders].name = p;
			cmd->headers[cmd->nheaders].value = colon + 1;
			cmd->nheaders++;
		}
		p = nl ? nl + 1 : NULL;
	}
}

/*
 * The claim's parameters (the buffers are the caller's: they must live as
 * long as vals is used).
 */
static void
claim_params(const char **vals, char *batchbuf, size_t batchlen, char *leasebuf, size_t leaselen)
{
	snprintf(batchbuf, batchlen, "%d", relay_opts.batch);
	snprintf(leasebuf, leaselen, "%.3f", relay_opts.lease);
	if (relay_opts.stream != NULL)
	{
		/* the stream's batch_size sizes its batches */
		vals[0] = relay_opts.stream;
		vals[1] = relay_opts.subscription;
		vals[2] = relay_opts.worker;
		vals[3] = relay_opts.lease > 0 ? leasebuf : NULL;
	}
	else
	{
		vals[0] = relay_opts.worker;
		vals[1] = batchbuf;
		vals[2] = relay_opts.lease > 0 ? leasebuf : NULL;
		vals[3] = relay_opts.kinds;
	}
}

/*
 * Fill the batch from a claim's result (which the batch then owns), from
 * its row `first` on (an ack_handover's leases follow its rows of the
 * tokens).
 */
static void
claim_fill_from(RelayBatch *batch, PGresult *res, int first)
{
	double		now = relay_now();
	double		left = 1e9;
	int			i;

	batch->res = res;
	batch->n = PQntuples(res) - first;
	batch->cmds = relay_malloc(sizeof(RelayCommand) * (batch->n ? batch->n : 1));
	memset(batch->cmds, 0, sizeof(RelayCommand) * (batch->n ? batch->n : 1));
	for (i = 0; i < batch->n; i++)
	{
		RelayCommand *cmd = &batch->cmds[i];
		int			row = first + i;
		double		l = strtod(PQgetvalue(res, row, 6), NULL);

		cmd->command_id = PQgetvalue(res, row, 0);
		cmd->run_id = PQgetvalue(res, row, 1);
		cmd->kind = PQgetvalue(res, row, 2);
		cmd->payload = PQgetvalue(res, row, 3);
		cmd->token = PQgetvalue(res, row, 4);
		cmd->seq = strtoll(PQgetvalue(res, row, 7), NULL, 10);
		cmd->deliveries = atoi(PQgetvalue(res, row, 5));
		cmd->ordering_key = PQgetisnull(res, row, 10) ? NULL : PQgetvalue(res, row, 10);
		if (!PQgetisnull(res, row, 8))
			cmd_set_headers(cmd, PQgetvalue(res, row, 8), PQgetvalue(res, row, 9));
		cmd->state = CMD_TODO;
		if (l < left)
			left = l;
	}
	batch_set_lease(batch, now, left);
	if (batch->n > 0)
	{
		relay_stats.batches++;
		relay_stats.claimed += batch->n;
	}
}

/* Fill the batch from a claim's result (which the batch then owns). */
static void
claim_fill(RelayBatch *batch, PGresult *res)
{
	claim_fill_from(batch, res, 0);
}

/* Claim a batch.  On DB_OK, batch->n may be 0. */
DbResult
db_claim(RelayBatch *batch)
{
	char		batchbuf[16];
	char		leasebuf[32];
	const char *vals[4];
	PGresult   *res;

	memset(batch, 0, sizeof(*batch));
	if (!db_settle())
		return DB_RETRY;

	claim_params(vals, batchbuf, sizeof(batchbuf), leasebuf, sizeof(leasebuf));
	res = PQexecPrepared(conn, "outbox_claim", 4, vals, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		DbResult	r = db_failure(res, "claim");

		PQclear(res);
		return r;
	}
	claim_fill(batch, res);
	return DB_OK;
}

/*
 * The token array of the batch's delivered commands, and their indexes in
 * idx (as many as the batch has commands); the number of them.
 */
static int
ack_build(RelayBatch *batch, StrBuf *toks, int *idx)
{
	int			n = 0;
	int			i;

	sb_init(toks);
	sb_puts(toks, "{");
	for (i = 0; i < batch->n; i++)
	{
		if (batch->cmds[i].state != CMD_DELIVERED)
			continue;
		if (n > 0)
			sb_puts(toks, ",");
		sb_array_elem(toks, batch->cmds[i].token);
		idx[n++] = i;
	}
	sb_puts(toks, "}");
	return n;
}

/*
 * Take an ack's rows in: one per token, in the tokens' order, with acked
 * and reason in the columns given.
 */
static void
ack_process(RelayBatch *batch, PGresult *res, const int *idx, int n,
			int acked_col, int reason_col)
{
	int			r;
	int			stale = 0;
	const char *first_reason = NULL;

	for (r = 0; r < PQntuples(res) && r < n; r++)
	{
		bool		acked = PQgetvalue(res, r, acked_col)[0] == 't';
		RelayCommand *cmd = &batch->cmds[idx[r]];

		cmd->state = CMD_DONE;
		if (acked)
			relay_stats.acked++;
		else
		{
			relay_stats.stale++;
			if (stale++ == 0)
				first_reason = PQgetvalue(res, r, reason_col);
			relay_debug("ack of \"%s\" refused: %s",
						log_text(cmd->command_id), log_text(PQgetvalue(res, r, reason_col)));
		}
	}
	if (stale > 0)
		relay_log("%d of %d acks refused (first reason: %s); another worker owns them now",
				  stale, n, log_text(first_reason));
	/* anything the server did not mention stays to be reported */
}

/* Ack every delivered command of the batch in one call. */
static DbResult
db_ack(RelayBatch *batch)
{
	StrBuf		toks;
	int		   *idx;
	int			n;
	const char *vals[2];
	PGresult   *res;

	idx = relay_malloc(sizeof(int) * (batch->n ? batch->n : 1));
	n = ack_build(batch, &toks, idx);
	if (n == 0)
	{
		sb_free(&toks);
		free(idx);
		return DB_OK;
	}

	vals[0] = relay_opts.worker;
	vals[1] = toks.data;
	res = PQexecPrepared(conn, "outbox_ack", 2, vals, NULL, NULL, 0);
	sb_free(&toks);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		DbResult	dr = db_failure(res, "ack");

		PQclear(res);
		free(idx);
		return dr;
	}
	ack_process(batch, res, idx, n, 1, 2);
	PQclear(res);
	free(idx);
	return DB_OK;
}

/* Whether a failed call was refused as lease_not_owned (by its SQLSTATE). */
static bool
lease_not_owned(const PGresult *res)
{
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

	return state != NULL && strcmp(state, SQLSTATE_LEASE_NOT_OWNED) == 0;
}

/* Report one failed delivery. */
static DbResult
db_fail(RelayCommand *cmd)
{
	const char *vals[4];
	PGresult   *res;

	vals[0] = relay_opts.worker;
	vals[1] = cmd->token;
	vals[2] = cmd->error ? cmd->error : "delivery failed";
	vals[3] = cmd->fatal ? "t" : "f";
	res = PQexecPrepared(conn, "outbox_fail", 4, vals, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		DbResult	r;

		if (lease_not_owned(res))
		{
			relay_stats.stale++;
			relay_debug("fail of \"%s\" refused: another worker owns it now",
						log_text(cmd->command_id));
			cmd->state = CMD_DONE;
			PQclear(res);
			return DB_OK;
		}
		r = db_failure(res, "fail");
		PQclear(res);
		return r;
	}
	if (strcmp(PQgetvalue(res, 0, 0), "dead") == 0)
	{
		relay_stats.dead++;
		relay_log("command \"%s\" is dead after %d deliveries: %s",
				  log_text(cmd->command_id), cmd->deliveries, log_text(vals[2]));
	}
	else
	{
		relay_stats.retried++;
		relay_debug("command \"%s\" will be retried: %s",
					log_text(cmd->command_id), log_text(vals[2]));
	}
	cmd->state = CMD_DONE;
	PQclear(res);
	return DB_OK;
}

/* Log how many deliveries of a batch failed, with the first error. */
static void
log_failures(int failed, const char *first_error)
{
	if (failed > 0)
		relay_log("%d deliver%s failed (first error: %s)", failed,
				  failed == 1 ? "y" : "ies", first_error ? log_text(first_error) : "?");
}

/*
 * The token of a stream batch (every row carries it), or NULL when no
 * command of the batch is left to report or renew.
 */
static const char *
stream_batch_token(RelayBatch *batch)
{
	int			i;

	for (i = 0; i < batch->n; i++)
		if (batch->cmds[i].state != CMD_DONE)
			return batch->cmds[i].token;
	return NULL;
}

/* The lease of a stream batch is gone: nothing of it is reported any more. */
static void
stream_batch_lost(RelayBatch *batch, const char *what)
{
	int			i;
	int			n = 0;

	for (i = 0; i < batch->n; i++)
		if (batch->cmds[i].state != CMD_DONE)
		{
			batch->cmds[i].state = CMD_DONE;
			n++;
		}
	relay_stats.stale += n;
	relay_log("%s of a batch of %d command%s refused: another worker owns the batch now",
			  what, n, n == 1 ? "" : "s");
}

/*
 * Keep the order of an ordering key across a failure: the commands of the
 * batch after a failed one with the same ordering key are failed too
 * (retryable, with its error), so that they are published after it.  The
 * server parks the key's commands of later batches behind the failed one;
 * those of this batch were handed out already, so it is the relay's to name
 * them.
 */
static void
stream_fail_key_followers(RelayBatch *batch)
{
	int			i;
	int			j;

	for (i = 0; i < batch->n; i++)
	{
		RelayCommand *f = &batch->cmds[i];

		if (f->state != CMD_FAILED || f->ordering_key == NULL)
			continue;
		for (j = i + 1; j < batch->n; j++)
		{
			RelayCommand *c = &batch->cmds[j];

			if (c->state != CMD_DELIVERED || c->ordering_key == NULL ||
				strcmp(c->ordering_key, f->ordering_key) != 0)
				continue;
			c->state = CMD_FAILED;
			c->fatal = false;
			free(c->error);
			c->error = relay_strdup(f->error ? f->error : "delivery failed");
			relay_stats.delivered--;
			relay_debug("command \"%s\" goes back after the failure of \"%s\" (same ordering key)",
						log_text(c->command_id), log_text(f->command_id));
		}
	}
}

/* The arguments of a stream batch's ack_batch call, and what it reports. */
typedef struct StreamAck
{
	StrBuf		ids;
	StrBuf		errs;
	StrBuf		fatals;
	const char *vals[5];
	int			delivered;
	int			failed;
	const char *first_error;
} StreamAck;

/*
 * Build the ack_batch call of a stream batch whose commands all have an
 * outcome (delivered, or failed by the sink: those are named with their
 * errors, and so are the later commands of a failed one's ordering key).
 * False when there is nothing to report yet: a command is still to be
 * delivered (the batch's lease covers the held commands and those
 * delivered alike), or nothing of the batch is left.
 */
static bool
stream_ack_build(RelayBatch *batch, StreamAck *a)
{
	const char *token = stream_batch_token(batch);
	int			i;

	if (token == NULL)
		return false;
	for (i = 0; i < batch->n; i++)
		if (batch->cmds[i].state == CMD_TODO)
			return false;
	stream_fail_key_followers(batch);

	memset(a, 0, sizeof(*a));
	sb_init(&a->ids);
	sb_init(&a->errs);
	sb_init(&a->fatals);
	sb_puts(&a->ids, "{");
	sb_puts(&a->errs, "{");
	sb_puts(&a->fatals, "{");
	for (i = 0; i < batch->n; i++)
	{
		RelayCommand *cmd = &batch->cmds[i];

		if (cmd->state == CMD_DELIVERED)
			a->delivered++;
		if (cmd->state != CMD_FAILED)
			continue;
		if (a->failed > 0)
		{
			sb_puts(&a->ids, ",");
			sb_puts(&a->errs, ",");
			sb_puts(&a->fatals, ",");
		}
		sb_array_elem(&a->ids, cmd->command_id);
		sb_array_elem(&a->errs, cmd->error ? cmd->error : "delivery failed");
		sb_puts(&a->fatals, cmd->fatal ? "t" : "f");
		if (a->failed++ == 0)
			a->first_error = cmd->error;
	}
	sb_puts(&a->ids, "}");
	sb_puts(&a->errs, "}");
	sb_puts(&a->fatals, "}");

	a->vals[0] = relay_opts.worker;
	a->vals[1] = token;
	a->vals[2] = a->failed > 0 ? a->ids.data : NULL;
	a->vals[3] = a->failed > 0 ? a->errs.data : NULL;
	a->vals[4] = a->failed > 0 ? a->fatals.data : NULL;
	return true;
}

/* Free what stream_ack_build made. */
static void
stream_ack_free(StreamAck *a)
{
	sb_free(&a->ids);
	sb_free(&a->errs);
	sb_free(&a->fatals);
}

/*
 * Take the result of a stream batch's ack_batch in: every command of the
 * batch is reported (or, refused with OB001, another worker's now).
 */
static DbResult
stream_ack_process(RelayBatch *batch, PGresult *res, int delivered, int failed,
				   const char *first_error)
{
	int			i;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		if (lease_not_owned(res))
		{
			stream_batch_lost(batch, "ack");
			return DB_OK;
		}
		return db_failure(res, "ack_batch");
	}
	if (PQntuples(res) == 1 && atoll(PQgetvalue(res, 0, 0)) != delivered)
		relay_debug("ack_batch published %s of %d delivered commands",
					PQgetvalue(res, 0, 0), delivered);

	for (i = 0; i < batch->n; i++)
	{
		RelayCommand *cmd = &batch->cmds[i];

		if (cmd->state == CMD_DELIVERED)
			relay_stats.acked++;
		else if (cmd->state == CMD_FAILED)
		{
			/* the server decides retry or dead; a fatal failure is dead */
			if (cmd->fatal)
				relay_stats.dead++;
			else
				relay_stats.retried++;
			relay_debug("delivery of \"%s\" failed: %s",
						log_text(cmd->command_id), log_text(cmd->error));
		}
		cmd->state = CMD_DONE;
	}
	log_failures(failed, first_error);
	return DB_OK;
}

/*
 * With --stream: report the batch in one ack_batch call once every command
 * has an outcome (stream_ack_build).  Until then nothing is reported.
 */
static DbResult
db_report_stream(RelayBatch *batch)
{
	StreamAck	a;
	PGresult   *res;
	DbResult	r;

	if (!stream_ack_build(batch, &a))
		return DB_OK;
	res = PQexecPrepared(conn, "outbox_ack", 5, a.vals, NULL, NULL, 0);
	r = stream_ack_process(batch, res, a.delivered, a.failed, a.first_error);
	PQclear(res);
	stream_ack_free(&a);
	return r;
}

/* With --stream: renew the lease of the batch while it is not reported. */
static DbResult
db_renew_stream(RelayBatch *batch)
{
	char		leasebuf[32];
	const char *vals[3];
	const char *token = stream_batch_token(batch);
	PGresult   *res;
	double		left;

	if (token == NULL)
		return DB_OK;
	snprintf(leasebuf, sizeof(leasebuf), "%.3f", relay_opts.lease);
	vals[0] = relay_opts.worker;
	vals[1] = token;
	vals[2] = relay_opts.lease > 0 ? leasebuf : NULL;
	res = PQexecPrepared(conn, "outbox_renew", 3, vals, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		DbResult	r;

		if (lease_not_owned(res))
		{
			PQclear(res);
			stream_batch_lost(batch, "renewal");
			return DB_OK;
		}
		r = db_failure(res, "renew_batch");
		PQclear(res);
		return r;
	}
	left = strtod(PQgetvalue(res, 0, 0), NULL);
	PQclear(res);
	relay_stats.renewed++;
	batch_set_lease(batch, relay_now(), left);
	relay_debug("renewed the batch's lease for %.1fs", left);
	return DB_OK;
}

/*
 * Report the outcome of every finished command of the batch: one array ack
 * for the delivered ones, one fail per failed one (with --stream: one
 * ack_batch for the whole batch).  Reported commands become CMD_DONE; on
 * DB_RETRY the rest stays for the next attempt.
 */
DbResult
db_report(RelayBatch *batch)
{
	DbResult	r;
	int			i;
	int			failed = 0;
	const char *first_error = NULL;

	if (!db_settle())
		return DB_RETRY;
	if (relay_opts.stream != NULL)
		return db_report_stream(batch);
	if ((r = db_ack(batch)) != DB_OK)
		return r;
	for (i = 0; i < batch->n; i++)
	{
		RelayCommand *cmd = &batch->cmds[i];

		if (cmd->state != CMD_FAILED)
			continue;
		if (failed++ == 0)
			first_error = cmd->error;
		if ((r = db_fail(cmd)) != DB_OK)
			return r;
	}
	log_failures(failed, first_error);
	return DB_OK;
}

/*
 * Renew the leases of the commands not delivered yet (the one being
 * delivered among them).  A refused renewal means the lease was lost: the
 * command is dropped from the batch.  With --stream: the batch's lease, in
 * one call.
 */
DbResult
db_renew(RelayBatch *batch)
{
	char		leasebuf[32];
	const char *vals[3];
	double		left = 1e9;
	int			i;
	int			renewed = 0;

	if (!db_settle())
		return DB_RETRY;
	if (relay_opts.stream != NULL)
		return db_renew_stream(batch);
	snprintf(leasebuf, sizeof(leasebuf), "%.3f", relay_opts.lease);
	for (i = 0; i < batch->n; i++)
	{
		RelayCommand *cmd = &batch->cmds[i];
		PGresult   *res;
		double		l;

		if (cmd->state != CMD_TODO)
			continue;
		vals[0] = relay_opts.worker;
		vals[1] = cmd->token;
		vals[2] = relay_opts.lease > 0 ? leasebuf : NULL;
		res = PQexecPrepared(conn, "outbox_renew", 3, vals, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			DbResult	r;

			if (lease_not_owned(res))
			{
				relay_log("lease of \"%s\" lost: another worker owns it now",
						  log_text(cmd->command_id));
				relay_stats.stale++;
				cmd->state = CMD_DONE;
				PQclear(res);
				continue;
			}
			r = db_failure(res, "renew");
			PQclear(res);
			return r;
		}
		l = strtod(PQgetvalue(res, 0, 0), NULL);
		if (l < left)
			left = l;
		renewed++;
		PQclear(res);
	}
	relay_stats.renewed += renewed;
	if (renewed > 0)
	{
		batch_set_lease(batch, relay_now(), left);
		relay_debug("renewed %d lease%s for %.1fs", renewed, renewed == 1 ? "" : "s", left);
	}
	return DB_OK;
}

/* Drain the notifications libpq has queued; return how many there were. */
static int
db_drain_notifies(void)
{
	PGnotify   *n;
	int			count = 0;

	while ((n = PQnotifies(conn)) != NULL)
	{
		count++;
		PQfreemem(n);
	}
	return count;
}

/*
 * Wait up to `timeout` seconds for a notification, a signal or the end of
 * the connection.  True when woken by a notification.
 */
bool
db_wait(double timeout)
{
	int			sock;
	int			sfd = relay_signal_fd();
	fd_set		rfds;
	struct timeval tv;
	int			rc;

	if (!db_settle())
	{
		relay_sleep(timeout);
		return false;
	}
	/* a notification that arrived during the last call: no wait */
	if (db_drain_notifies() > 0)
	{
		relay_stats.wakeups++;
		return true;
	}
	if (timeout <= 0)
		return false;

	sock = PQsocket(conn);
	FD_ZERO(&rfds);
	FD_SET(sock, &rfds);
	FD_SET(sfd, &rfds);
	tv.tv_sec = (time_t) timeout;
	tv.tv_usec = (suseconds_t) ((timeout - (double) tv.tv_sec) * 1e6);
	rc = select((sock > sfd ? sock : sfd) + 1, &rfds, NULL, NULL, &tv);
	if (rc < 0)
		return false;
	if (FD_ISSET(sfd, &rfds))
		relay_drain_signal_fd();
	if (FD_ISSET(sock, &rfds))
	{
		if (!PQconsumeInput(conn) || PQstatus(conn) != CONNECTION_OK)
		{
			relay_log("connection lost: %s", one_line(PQerrorMessage(conn)));
			db_disconnect();
			return false;
		}
		if (db_drain_notifies() > 0)
		{
			relay_stats.wakeups++;
			return true;
		}
	}
	return false;
}

/*
 * Forget the pipelined calls not taken in (the connection is gone): an ack
 * leaves its commands delivered, to be reported again; a claim leaves its
 * batch empty (the leases it may have granted expire: the commands are
 * only delayed).
 */
static void
async_abandon(void)
{
	int			i;

	for (i = 0; i < async_count; i++)
	{
		free(async_calls[i].idx);
		if (async_calls[i].res != NULL)
			PQclear(async_calls[i].res);
	}
	async_count = 0;
}

/* Whether a pipelined call of the batch is still to be taken in. */
bool
db_async_pending(const RelayBatch *batch)
{
	int			i;

	for (i = 0; i < async_count; i++)
		if (async_calls[i].batch == batch || async_calls[i].handed == batch)
			return true;
	return false;
}

/* Ready the connection for one more pipelined call. */
static bool
async_begin(void)
{
	if (!db_connected() || async_count >= DB_MAX_ASYNC)
		return false;
	if (PQpipelineStatus(conn) == PQ_PIPELINE_OFF && !PQenterPipelineMode(conn))
	{
		relay_log("could not enter pipeline mode: %s", one_line(PQerrorMessage(conn)));
		return false;
	}
	return true;
}

/* Queue a call just sent (sent: what PQsendQueryPrepared returned). */
static DbResult
async_push(int sent, const AsyncCall *c)
{
	if (!sent || !PQpipelineSync(conn))
	{
		relay_log("connection lost sending a call: %s", one_line(PQerrorMessage(conn)));
		free(c->idx);
		db_disconnect();
		return DB_RETRY;
	}
	async_calls[async_count++] = *c;
	return DB_OK;
}

/*
 * Send the claim of the next batch without waiting for it; its result is
 * taken in by db_async_collect.  Until then the batch is empty.
 */
DbResult
db_async_claim(RelayBatch *batch)
{
	char		batchbuf[16];
	char		leasebuf[32];
	const char *vals[4];
	AsyncCall	c;

	memset(batch, 0, sizeof(*batch));
	if (!async_begin())
		return DB_RETRY;
	claim_params(vals, batchbuf, sizeof(batchbuf), leasebuf, sizeof(leasebuf));
	memset(&c, 0, sizeof(c));
	c.kind = ASYNC_CLAIM;
	c.batch = batch;
	return async_push(PQsendQueryPrepared(conn, "outbox_claim", 4, vals, NULL, NULL, 0), &c);
}

/*
 * Send the report of a batch without waiting for it, when it is one call:
 * an ack of its delivered commands (a batch with failed commands takes
 * db_report's way: a fail call each), or with --stream the batch's
 * ack_batch.  True when sent, or when there is nothing to report; false
 * when the batch must be reported by db_report.  With handed (an empty
 * batch) and the hand-over on, the ack is an ack_handover whose leases
 * fill handed when its result is taken in; db_async_pending(handed) says
 * whether that call went out.
 */
bool
db_async_report(RelayBatch *batch, RelayBatch *handed)
{
	AsyncCall	c;
	int			i;

	memset(&c, 0, sizeof(c));
	c.batch = batch;
	if (relay_opts.stream != NULL)
	{
		StreamAck	a;
		int			sent;

		for (i = 0; i < batch->n; i++)
			if (batch->cmds[i].state == CMD_TODO)
				return false;
		if (stream_batch_token(batch) == NULL)
			return true;
		if (!stream_ack_build(batch, &a))
			return true;		/* nothing to report */
		if (!async_begin())
		{
			stream_ack_free(&a);
			return false;
		}
		c.kind = ASYNC_ACK_STREAM;
		c.delivered = a.delivered;
		c.failed = a.failed;
		c.first_error = a.first_error;
		sent = PQsendQueryPrepared(conn, "outbox_ack", 5, a.vals, NULL, NULL, 0);
		stream_ack_free(&a);
		return async_push(sent, &c) == DB_OK;
	}
	else
	{
		StrBuf		toks;
		const char *vals[2];
		int			sent;

		for (i = 0; i < batch->n; i++)
			if (batch->cmds[i].state == CMD_FAILED || batch->cmds[i].state == CMD_TODO)
				return false;
		c.kind = ASYNC_ACK;
		c.idx = relay_malloc(sizeof(int) * (batch->n ? batch->n : 1));
		c.n = ack_build(batch, &toks, c.idx);
		if (c.n == 0 || !async_begin())
		{
			sb_free(&toks);
			free(c.idx);
			return c.n == 0;
		}
		vals[0] = relay_opts.worker;
		vals[1] = toks.data;
		if (handed != NULL && handover_ready && relay_opts.handover)
		{
			char		batchbuf[16];
			char		leasebuf[32];
			const char *hvals[5];

			snprintf(batchbuf, sizeof(batchbuf), "%d", relay_opts.batch);
			snprintf(leasebuf, sizeof(leasebuf), "%.3f", relay_opts.lease);
			hvals[0] = vals[0];
			hvals[1] = vals[1];
			hvals[2] = batchbuf;
			hvals[3] = relay_opts.lease > 0 ? leasebuf : NULL;
			hvals[4] = relay_opts.kinds;
			memset(handed, 0, sizeof(*handed));
			c.handed = handed;
			sent = PQsendQueryPrepared(conn, "outbox_handover", 5, hvals, NULL, NULL, 0);
		}
		else
			sent = PQsendQueryPrepared(conn, "outbox_ack", 2, vals, NULL, NULL, 0);
		sb_free(&toks);
		return async_push(sent, &c) == DB_OK;
	}
}

/* Take in the first pipelined call, whose result is c->res. */
static void
async_finish(AsyncCall *c)
{
	PGresult   *res = c->res;

	switch (c->kind)
	{
		case ASYNC_CLAIM:
			if (res != NULL && PQresultStatus(res) == PGRES_TUPLES_OK)
			{
				claim_fill(c->batch, res);
				res = NULL;		/* the batch's now */
			}
			else
			{
				/* a fatal error here comes again with the next claim */
				(void) db_failure(res, "claim");
			}
			break;
		case ASYNC_ACK:
			if (res != NULL && PQresultStatus(res) == PGRES_TUPLES_OK && c->handed != NULL)
			{
				ack_process(c->batch, res, c->idx, c->n, HANDOVER_ACKED, HANDOVER_REASON);
				if (PQntuples(res) > c->n)
				{
					/* the leases handed over: the handed batch's now */
					claim_fill_from(c->handed, res, c->n);
					relay_stats.handed += c->handed->n;
					res = NULL;
				}
			}
			else if (res != NULL && PQresultStatus(res) == PGRES_TUPLES_OK)
				ack_process(c->batch, res, c->idx, c->n, 1, 2);
			else
				(void) db_failure(res, "ack");
			break;
		case ASYNC_ACK_STREAM:
			if (res != NULL)
				(void) stream_ack_process(c->batch, res, c->delivered, c->failed,
										  c->first_error);
			else
				(void) db_failure(res, "ack_batch");
			break;
	}
	if (res != NULL)
		PQclear(res);
	free(c->idx);
	c->idx = NULL;
	c->res = NULL;
}

/*
 * Take in the results of pipelined calls that have come (wait false: never
 * blocks), or with wait until no call of `until` (NULL: none at all) is
 * left.  A call whose connection was lost leaves what db_async_claim and
 * async_abandon say.
 */
void
db_async_collect(const RelayBatch *until, bool wait)
{
	int			empty = 0;

	while (async_count > 0)
	{
		AsyncCall  *c = &async_calls[0];
		AsyncCall	done;
		PGresult   *res;

		if (wait && until != NULL && !db_async_pending(until))
			break;
		if (!db_connected())
		{
			db_disconnect();
			return;
		}
		if (!wait)
		{
			if (!PQconsumeInput(conn))
			{
				relay_log("connection lost: %s", one_line(PQerrorMessage(conn)));
				db_disconnect();
				return;
			}
			if (PQisBusy(conn))
				break;
		}
		res = PQgetResult(conn);
		if (res == NULL)
		{
			/* the end of a call's results; its sync comes next */
			if (++empty > 2)
			{
				relay_log("connection lost: %s", one_line(PQerrorMessage(conn)));
				db_disconnect();
				return;
			}
			continue;
		}
		empty = 0;
		if (PQresultStatus(res) != PGRES_PIPELINE_SYNC)
		{
			if (c->res == NULL)
				c->res = res;
			else
				PQclear(res);
			continue;
		}
		PQclear(res);
		/* off the queue first: a lost connection abandons the rest */
		done = *c;
		memmove(&async_calls[0], &async_calls[1], sizeof(AsyncCall) * (async_count - 1));
		async_count--;
		async_finish(&done);
		if (!db_connected())
		{
			db_disconnect();
			return;
		}
		if (async_count == 0 && !PQexitPipelineMode(conn))
		{
			relay_log("could not leave pipeline mode: %s", one_line(PQerrorMessage(conn)));
			db_disconnect();
			return;
		}
	}
}

/* Take every pipelined call in; whether there is a usable connection. */
static bool
db_settle(void)
{
	if (async_count > 0)
		db_async_collect(NULL, true);
	if (db_connected() && PQpipelineStatus(conn) != PQ_PIPELINE_OFF &&
		!PQexitPipelineMode(conn))
	{
		relay_log("could not leave pipeline mode: %s", one_line(PQerrorMessage(conn)));
		db_disconnect();
	}
	return db_connected();
}
