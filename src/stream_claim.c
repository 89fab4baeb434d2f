/*-------------------------------------------------------------------------
 *
 * stream_claim.c
 *		The body of claim_batch (src/stream.c): lease the next batch of one
 *		partition of a stream's subscription, or take over an expired one,
 *		and return its commands (the caller adds the batch's token).
 *
 * Steps (docs/streams.md, "Batches and leases"):
 *
 *	1. the stream, the subscription and the subscription's progress rows,
 *	   read from C in one snapshot (OutboxReadClaimLook, src/stream_log.c),
 *	   with the errors of a missing stream or subscription (42704), of a
 *	   subscription of another stream (42704) and of a caller the
 *	   subscription's claimers do not admit (42501); the lease's end
 *	   (OutboxLeaseEnd, the row path's rules);
 *	2. an expired batch (the oldest lease end, SKIP LOCKED; looked for
 *	   when the first look saw one): unless its deliveries are used
 *	   up (SQL outbox._stream_takeover_cap, which may kill or halve it),
 *	   it is taken over with the same commands, version and deliveries
 *	   + 1, and a new nonce;
 *	3. else, in a loop, the next partition without a batch that has
 *	   commands after its acked tick (streams.part_ticks) or due retries,
 *	   the least recently acked first, picked and locked (from the look
 *	   and OutboxLockProgress, as FOR UPDATE SKIP LOCKED; by a statement
 *	   when the subscription has failures, for their due retries and keys);
 *	   the batch's end tick and both snapshots come from one scan of the
 *	   ticks' primary key from its acked tick on (OutboxStreamBatchTicks); the
 *	   commands of an ordering key with an unfinished failure are parked
 *	   as waiting, the due retries join the batch, and the batch is read
 *	   once (the range
 *	   of the partition's index between the two ticks' xmax, plus one
 *	   probe per transaction running at the start tick, plus the retries
 *	   marked with the batch; when there are neither, the range alone is
 *	   read from C, src/stream_log.c, with the failures' key probed per
 *	   row); the lease is written from C (OutboxRowUpdate).  A partition
 *	   whose batch is
 *	   empty (commands after a batch end capped by batch_size, or all
 *	   waiting) moves its acked tick on and is looked at again until it
 *	   reaches the last tick;
 *	4. nothing to claim: nothing else is written.  A partition that got
 *	   no commands since its acked tick keeps it; the worker moves
 *	   such partitions on to the last tick before each rotation step
 *	   (outbox._stream_move_on), and the lag view counts them caught up.
 *
 * The steps that are rare (a takeover, a subscription with failures) are
 * saved statements with generic plans (OutboxExecuteGeneric), run from
 * here rather than from a PL/pgSQL function: the function's own cost (its
 * call, its SET clause, the lease's checks in PL/pgSQL, its variables)
 * was about a third of a claim.  The common case runs none: a statement's
 * start cost more than the few rows each step reads or writes.  A table
 * the writer cannot write as the statement would (OutboxOpenRowWriter: a
 * trigger, a rule, row-level security, a read-only transaction) gets the
 * statement.
 *
 * Locking: the progress row of the batch (FOR UPDATE SKIP LOCKED, by
 * OutboxLockProgress or the pick's statement), and the row locks of the
 * statements and writes (the failures they write).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/xid8.h"

#include "outbox.h"

/* The statements; their parameters are named in each. */

/* $1 subscription, $2 now */
static const char sc_expired_sql[] =
"SELECT p.part, p.batch_id, p.acked_tick, p.batch_to FROM outbox.stream_progress p"
" WHERE p.subscription OPERATOR(pg_catalog.=) $1"
"   AND p.batch_to IS NOT NULL"
"   AND p.lease_until OPERATOR(pg_catalog.<=) $2"
" ORDER BY p.lease_until LIMIT 1"
"   FOR UPDATE SKIP LOCKED";

/* $1 subscription, $2 part, $3 stream_id, $4 now */
static const char sc_cap_sql[] =
"SELECT outbox._stream_takeover_cap($1, $2, $3, $4)";

/* $1 subscription, $2 part, $3 worker, $4 caller, $5 nonce, $6 until */
static const char sc_takeover_sql[] =
"UPDATE outbox.stream_progress p"
"   SET version = p.version OPERATOR(pg_catalog.+) 1, owner = $3, role = $4,"
"       claim_nonce = $5, lease_until = $6,"
"       deliveries = p.deliveries OPERATOR(pg_catalog.+) 1"
" WHERE p.subscription OPERATOR(pg_catalog.=) $1"
"   AND p.part OPERATOR(pg_catalog.=) $2"
" RETURNING p.version, p.deliveries";

/* $1 subscription, $2 part, $3 batch_id */
static const char sc_takeover_retries_sql[] =
"UPDATE outbox.stream_failures f"
"   SET deliveries = f.deliveries OPERATOR(pg_catalog.+) 1"
" WHERE f.subscription OPERATOR(pg_catalog.=) $1"
"   AND f.part OPERATOR(pg_catalog.=) $2"
"   AND f.batch_id OPERATOR(pg_catalog.=) $3";

/*
 * $1 subscription, $2 part, $3 batch_id, $4 stream_id, $5 acked tick,
 * $6 batch end tick, $7 deliveries, $8 version, $9 until
 */
static const char sc_takeover_rows_sql[] =
"SELECT r.command_id, r.run_id, r.seq, r.kind, r.payload, $8::pg_catalog.int8,"
"       r.deliveries, $9, r.headers, r.ordering_key, $3, $2"
"  FROM outbox._stream_batch_rows($1, $2, $3, $4,"
"        outbox._stream_snap($4, $5), outbox._stream_snap($4, $6), $7) r";

/*
 * $1 subscription, $2 stream_id, $3 the partitions tried, $4 now.  Columns:
 * part, batch_id, acked_tick, due, keyed, and the locked row's ctid (where
 * the lease or the skip writes from C).
 */
#define SC_DUE_EXISTS(alias, now) \
"EXISTS (SELECT 1 FROM outbox.stream_failures f" \
"         WHERE f.subscription OPERATOR(pg_catalog.=) " alias ".subscription" \
"           AND f.part OPERATOR(pg_catalog.=) " alias ".part" \
"           AND f.state OPERATOR(pg_catalog.=) 'retry'" \
"           AND f.available_at OPERATOR(pg_catalog.<=) " now ")"
static const char sc_pick_sql[] =
"SELECT p.part, p.batch_id, p.acked_tick, " SC_DUE_EXISTS("p", "$4") ","
"       EXISTS (SELECT 1 FROM outbox.stream_failures f"
"                WHERE f.subscription OPERATOR(pg_catalog.=) $1"
"                  AND f.ordering_key IS NOT NULL),"
"       p.ctid"
"  FROM outbox.stream_progress p"
" WHERE p.subscription OPERATOR(pg_catalog.=) $1"
"   AND p.batch_to IS NULL"
"   AND p.part OPERATOR(pg_catalog.<>) ALL ($3)"
"   AND (p.acked_tick OPERATOR(pg_catalog.<)"
"        COALESCE(((SELECT t.part_ticks FROM outbox.streams t"
"                    WHERE t.stream_id OPERATOR(pg_catalog.=) $2))[p.part OPERATOR(pg_catalog.+) 1], 0)"
"        OR " SC_DUE_EXISTS("p", "$4") ")"
" ORDER BY p.acked_at NULLS FIRST, p.part LIMIT 1"
"   FOR UPDATE OF p SKIP LOCKED";

enum
{
	SC_PART, SC_BATCH, SC_ACKED, SC_DUE, SC_KEYED, SC_CTID, SC_PICK_COLS
};

/*
 * The rows of partition $2 of stream $1 the batch's start snapshot does not
 * see: from its xmax on ($3), or of a transaction running then ($4, the
 * start snapshot's xip), up to the end snapshot's xmax ($5).
 */
#define SC_LOG_RANGE \
"SELECT l.* FROM outbox._stream_log l" \
" WHERE l.stream_id OPERATOR(pg_catalog.=) $1" \
"   AND l.part OPERATOR(pg_catalog.=) $2" \
"   AND l.xid OPERATOR(pg_catalog.>=) $3" \
"   AND l.xid OPERATOR(pg_catalog.<) $5"
#define SC_LOG_RUNNING \
"SELECT l.* FROM pg_catalog.unnest($4) AS r(xid)" \
" CROSS JOIN LATERAL (SELECT l.* FROM outbox._stream_log l" \
"                      WHERE l.stream_id OPERATOR(pg_catalog.=) $1" \
"                        AND l.part OPERATOR(pg_catalog.=) $2" \
"                        AND l.xid OPERATOR(pg_catalog.=) r.xid OFFSET 0) l"

/*
 * Park as waiting the batch's commands of an ordering key with an
 * unfinished failure in the subscription: $1 stream_id, $2 part, $3 sa's
 * xmax, $4 sa's xip, $5 sb's xmax, $6 sb, $7 subscription, $8 now.
 */
static const char sc_park_sql[] =
"INSERT INTO outbox.stream_failures AS f"
"    (subscription, command_id, part, state, batch_id, deliveries, available_at,"
"     log_id, xid, stream_id, run_id, seq, kind, payload, headers, ordering_key,"
"     decided_by, created_at)"
"SELECT $7, l.command_id, l.part, 'waiting', NULL, 0, $8,"
"       l.id, l.xid, l.stream_id, l.run_id, l.seq, l.kind, l.payload, l.headers,"
"       l.ordering_key, l.decided_by, l.created_at"
"  FROM (" SC_LOG_RANGE " UNION ALL " SC_LOG_RUNNING ") l"
" WHERE pg_catalog.pg_visible_in_snapshot(l.xid, $6)"
"   AND l.ordering_key IS NOT NULL"
"   AND EXISTS (SELECT 1 FROM outbox.stream_failures k"
"                WHERE k.subscription OPERATOR(pg_catalog.=) $7"
"                  AND k.ordering_key OPERATOR(pg_catalog.=) l.ordering_key"
"                  AND k.decided_by OPERATOR(pg_catalog.=) l.decided_by)"
"ON CONFLICT ON CONSTRAINT stream_failures_pkey DO NOTHING";

/* The due retries join batch $5: $1 subscription, $2 part, $3 now, $4 batch_size. */
static const char sc_retries_sql[] =
"WITH r AS ("
"    SELECT f.command_id FROM outbox.stream_failures f"
"     WHERE f.subscription OPERATOR(pg_catalog.=) $1"
"       AND f.part OPERATOR(pg_catalog.=) $2"
"       AND f.state OPERATOR(pg_catalog.=) 'retry'"
"       AND f.available_at OPERATOR(pg_catalog.<=) $3"
"     ORDER BY f.available_at LIMIT $4),"
" m AS ("
"    UPDATE outbox.stream_failures f"
"       SET batch_id = $5, deliveries = f.deliveries OPERATOR(pg_catalog.+) 1"
"      FROM r"
"     WHERE f.subscription OPERATOR(pg_catalog.=) $1"
"       AND f.command_id OPERATOR(pg_catalog.=) r.command_id"
"    RETURNING 1)"
"SELECT pg_catalog.count(*)::pg_catalog.int4 FROM m";

/*
 * The batch's commands in log order: $1 stream_id, $2 part, $3 sa's xmax,
 * $4 sa's xip, $5 sb's xmax, $6 sb, $7 subscription, $8 until, $9 batch id,
 * $10 the retries that joined it.  The range alone (no transaction was
 * running at the start tick, no retry joins) is read from C instead
 * (sc_read_range).
 */
#define SC_NOT_FAILED \
"   AND NOT EXISTS (SELECT 1 FROM outbox.stream_failures f" \
"                    WHERE f.subscription OPERATOR(pg_catalog.=) $7" \
"                      AND f.command_id OPERATOR(pg_catalog.=) l.command_id)"
static const char sc_rows_sql[] =
"SELECT x.command_id, x.run_id, x.seq, x.kind, x.payload, 1::pg_catalog.int8,"
"       x.deliveries, $8, x.headers, x.ordering_key, $9, $2"
"  FROM (SELECT l.id, l.command_id::pg_catalog.text AS command_id,"
"               l.run_id::pg_catalog.text AS run_id, l.seq, l.kind::pg_catalog.text AS kind,"
"               l.payload, 1 AS deliveries, l.headers,"
"               l.ordering_key::pg_catalog.text AS ordering_key"
"          FROM (" SC_LOG_RANGE " UNION ALL " SC_LOG_RUNNING ") l"
"         WHERE pg_catalog.pg_visible_in_snapshot(l.xid, $6)"
SC_NOT_FAILED
"        UNION ALL"
"        SELECT f.log_id, f.command_id, f.run_id, f.seq, f.kind, f.payload, f.deliveries,"
"               f.headers, f.ordering_key"
"          FROM outbox.stream_failures f"
"         WHERE $10 OPERATOR(pg_catalog.>) 0"
"           AND f.subscription OPERATOR(pg_catalog.=) $7"
"           AND f.part OPERATOR(pg_catalog.=) $2"
"           AND f.batch_id OPERATOR(pg_catalog.=) $9) x"
" ORDER BY x.id";

/*
 * The two writes of the row the pick locked, from C (sc_write_progress)
 * or else by these statements.
 *
 * An empty batch: the partition's acked tick moves on. $1 subscription, $2
 * part, $3 tick
 */
static const OutboxColumn sc_skip_cols[1] = {{"acked_tick", INT8OID}};
static const char sc_skip_sql[] =
"UPDATE outbox.stream_progress p SET acked_tick = $3"
" WHERE p.subscription OPERATOR(pg_catalog.=) $1"
"   AND p.part OPERATOR(pg_catalog.=) $2";

/*
 * The lease of the new batch: $1 subscription, $2 part, $3 batch id, $4 end
 * tick, $5 worker, $6 caller, $7 nonce, $8 until, $9 rows, $10 retries.
 */
static const OutboxColumn sc_lease_cols[10] = {{"batch_id", INT8OID}, {"batch_to", INT8OID},
{"owner", TEXTOID}, {"role", OIDOID}, {"claim_nonce", INT8OID}, {"lease_until", TIMESTAMPTZOID},
{"batch_rows", INT4OID}, {"batch_retries", INT4OID}, {"version", INT4OID},
{"deliveries", INT4OID}};
static const char sc_lease_sql[] =
"UPDATE outbox.stream_progress p"
"   SET batch_id = $3, batch_to = $4, version = 1, owner = $5, role = $6,"
"       claim_nonce = $7, lease_until = $8, deliveries = 1, batch_rows = $9,"
"       batch_retries = $10"
" WHERE p.subscription OPERATOR(pg_catalog.=) $1"
"   AND p.part OPERATOR(pg_catalog.=) $2";

/*
 * The descriptor of a batch's rows read from C (sc_read_range): the
 * columns of the statements' rows above.
 */
static TupleDesc
sc_rows_desc(void)
{
	static TupleDesc desc = NULL;
	static const Oid types[12] = {TEXTOID, TEXTOID, INT8OID, TEXTOID, JSONBOID, INT8OID,
	INT4OID, TIMESTAMPTZOID, JSONBOID, TEXTOID, INT8OID, INT4OID};

	if (desc == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
		TupleDesc	d = CreateTemplateTupleDesc(lengthof(types));
		int			i;

		for (i = 0; i < (int) lengthof(types); i++)
			TupleDescInitEntry(d, (AttrNumber) (i + 1), NULL, types[i], -1, 0);
		MemoryContextSwitchTo(old);
		desc = d;
	}
	return desc;
}

/*
 * The commands of a new batch when no transaction was running at its
 * start tick and no retry joins it: the range of the partition's index
 * between the two ticks' xmax, the rows visible in the end tick and not
 * in the subscription's failures, in log order, read without a statement
 * (src/stream_log.c), as rows of sc_rows_desc with version 1, deliveries
 * 1, the lease's end, the batch id and the partition.
 */
static void
sc_read_range(int32 stream_id, int32 part, const OutboxBatchTicks *ticks, text *sub,
			  TimestampTz until, int64 batch_id, OutboxBatchRows *out)
{
	OutboxStreamLogs *logs = OutboxOpenStreamLogs();
	OutboxLogRow *rows;
	int			n;
	int			i;

	rows = OutboxReadLogRange(logs, stream_id, part, ticks->sa, ticks->sb, sub, &n);
	OutboxCloseStreamLogs(logs);
	out->desc = sc_rows_desc();
	out->n = (uint64) n;
	out->vals = palloc(sizeof(HeapTuple) * (n + 1));
	for (i = 0; i < n; i++)
	{
		Datum		v[12];
		bool		nulls[12];
		int			c;

		/* command_id, run_id, seq, kind, payload */
		for (c = 0; c < 5; c++)
		{
			v[c] = rows[i].values[c];
			nulls[c] = rows[i].isnull[c];
		}
		v[5] = Int64GetDatum(1);
		v[6] = Int32GetDatum(1);
		v[7] = TimestampTzGetDatum(until);
		/* headers, ordering_key */
		v[8] = rows[i].values[5];
		nulls[8] = rows[i].isnull[5];
		v[9] = rows[i].values[6];
		nulls[9] = rows[i].isnull[6];
		v[10] = Int64GetDatum(batch_id);
		v[11] = Int32GetDatum(part);
		nulls[5] = nulls[6] = nulls[7] = nulls[10] = nulls[11] = false;
		out->vals[i] = heap_form_tuple(out->desc, v, nulls);
	}
}

/*
 * Write the progress row the pick locked (at tid): n columns (cols) get
 * values, from C; or, when the writer cannot (OutboxOpenRowWriter), the
 * statement sql with the arguments a does it.
 */
static void
sc_write_progress(ItemPointer tid, const OutboxColumn *cols, int n, const Datum *values,
				  SPIPlanPtr *plan, const char *sql, int nargs, const Oid *types, Datum *a)
{
	OutboxRowWriter *w = OutboxOpenRowWriter("stream_progress", ACL_UPDATE, cols, n, false,
											 NULL, 0);
	bool		nulls[10] = {false};

	if (w == NULL)
	{
		OutboxRunGeneric(plan, sql, nargs, types, a, SPI_OK_UPDATE, "claim_batch");
		if (SPI_processed != 1)
			elog(ERROR, "outbox: claim_batch updated %d progress rows", (int) SPI_processed);
		return;
	}
	OutboxRowUpdate(w, tid, values, nulls);
	OutboxCloseRowWriter(w);
}

/* The rows of the last statement, as a batch's rows. */
static void
sc_spi_rows(OutboxBatchRows *out)
{
	out->n = SPI_processed;
	out->desc = SPI_tuptable->tupdesc;
	out->vals = SPI_tuptable->vals;
}

/* Column col (1-based) of the first row of the last statement; NULL is an error. */
static Datum
sc_col(int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, col, &isnull);

	if (isnull)
		elog(ERROR, "outbox: claim_batch read a NULL in column %d", col);
	return d;
}

/* Whether text a equals text b, byte by byte (the columns' collation is C). */
static bool
sc_text_eq(text *a, text *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

/* The order of the pick: the least recently acked first (never acked before all), then part. */
static int
sc_cmp_pick(const void *a, const void *b)
{
	const OutboxProgressRow *x = *(OutboxProgressRow *const *) a;
	const OutboxProgressRow *y = *(OutboxProgressRow *const *) b;

	if (x->acked_null != y->acked_null)
		return x->acked_null ? -1 : 1;
	if (!x->acked_null && x->acked_at != y->acked_at)
		return x->acked_at < y->acked_at ? -1 : 1;
	return x->part < y->part ? -1 : (x->part > y->part ? 1 : 0);
}

/*
 * Whether the progress row r has commands after its acked tick: below
 * COALESCE(part_ticks[part + 1], 0), as sc_pick_sql.
 */
static bool
sc_has_work(const OutboxProgressRow *r, Datum part_ticks)
{
	int			idx = r->part + 1;
	bool		isnull;
	Datum		last;

	if (part_ticks == (Datum) 0)
		return false;
	last = array_get_element(part_ticks, 1, &idx, -1, sizeof(int64), FLOAT8PASSBYVAL,
							 TYPALIGN_DOUBLE, &isnull);
	return r->acked_tick < (isnull ? 0 : DatumGetInt64(last));
}

/*
 * The pick of step 3 without a statement, for a subscription without
 * failures (look, read under one snapshot): the partitions not tried, with
 * no batch and with commands after their acked tick, in sc_cmp_pick's
 * order, each locked as FOR UPDATE SKIP LOCKED does until one is; the
 * columns of sc_pick_sql (due and keyed false) into p, the locked
 * version's tid into *tid.  0: none; 1: picked; -1: the row locked has
 * changed since the look (the caller looks again; the lock is kept).
 */
static int
sc_pick_look(const OutboxClaimLook *look, Snapshot snap, const Datum *tried, int ntried,
			 Datum *p, ItemPointer tid)
{
	OutboxProgressRow **cand = palloc(sizeof(OutboxProgressRow *) * (look->nprogress + 1));
	int			ncand = 0;
	int			i;

	for (i = 0; i < look->nprogress; i++)
	{
		OutboxProgressRow *r = &look->progress[i];
		bool		was_tried = false;
		int			t;

		for (t = 0; t < ntried && !was_tried; t++)
			was_tried = DatumGetInt32(tried[t]) == r->part;
		if (!r->open && !was_tried && sc_has_work(r, look->part_ticks))
			cand[ncand++] = r;
	}
	qsort(cand, ncand, sizeof(OutboxProgressRow *), sc_cmp_pick);
	for (i = 0; i < ncand; i++)
	{
		OutboxProgressRow locked;

		if (!OutboxLockProgress(&cand[i]->tid, snap, &locked))
			continue;
		if (!ItemPointerEquals(&locked.tid, &cand[i]->tid))
		{
			pfree(cand);
			return -1;
		}
		p[SC_PART] = Int32GetDatum(locked.part);
		p[SC_BATCH] = Int64GetDatum(locked.batch_id);
		p[SC_ACKED] = Int64GetDatum(locked.acked_tick);
		p[SC_DUE] = BoolGetDatum(false);
		p[SC_KEYED] = BoolGetDatum(false);
		*tid = locked.tid;
		pfree(cand);
		return 1;
	}
	pfree(cand);
	return 0;
}

/*
 * Look at the stream, the subscription and its progress (OutboxReadClaimLook)
 * in a new snapshot, taken as a statement would (after this transaction's
 * changes so far), into *look; the snapshot, registered, is returned.
 */
static Snapshot
sc_look(text *stream, text *sub, OutboxClaimLook *look)
{
	Snapshot	snap = OutboxStatementSnapshot();

	OutboxReadClaimLook(stream, sub, snap, look);
	return snap;
}

/*
 * claim_batch's body (see the top of the file): the commands of the batch
 * leased to worker for caller, into *rows (kept until SPI_finish; none
 * when there is nothing to claim), and the subscription's created_at (its
 * tokens' since).  lease NULL: outbox.default_lease.  Each row:
 * command_id, run_id, seq, kind, payload, version, deliveries,
 * lease_until, headers, ordering_key, batch_id, part.  SPI must be
 * connected.
 */
void
OutboxStreamClaim(text *stream, text *sub, text *worker, Interval *lease, Oid caller,
				  int64 nonce, int64 *since, OutboxBatchRows *rows)
{
	static SPIPlanPtr expired_plan, cap_plan, takeover_plan,
				takeover_retries_plan, takeover_rows_plan, pick_plan, park_plan, retries_plan,
				rows_plan, skip_plan, lease_plan;
	static const Oid expired_types[2] = {TEXTOID, TIMESTAMPTZOID};
	static const Oid cap_types[4] = {TEXTOID, INT4OID, INT4OID, TIMESTAMPTZOID};
	static const Oid takeover_types[6] = {TEXTOID, INT4OID, TEXTOID, OIDOID, INT8OID,
	TIMESTAMPTZOID};
	static const Oid takeover_retries_types[3] = {TEXTOID, INT4OID, INT8OID};
	static const Oid takeover_rows_types[9] = {TEXTOID, INT4OID, INT8OID, INT4OID, INT8OID,
	INT8OID, INT4OID, INT4OID, TIMESTAMPTZOID};
	static const Oid pick_types[4] = {TEXTOID, INT4OID, INT4ARRAYOID, TIMESTAMPTZOID};
	static const Oid park_types[8] = {INT4OID, INT4OID, XID8OID, XID8ARRAYOID, XID8OID,
	PG_SNAPSHOTOID, TEXTOID, TIMESTAMPTZOID};
	static const Oid retries_types[5] = {TEXTOID, INT4OID, TIMESTAMPTZOID, INT4OID, INT8OID};
	static const Oid rows_types[10] = {INT4OID, INT4OID, XID8OID, XID8ARRAYOID, XID8OID,
	PG_SNAPSHOTOID, TEXTOID, TIMESTAMPTZOID, INT8OID, INT4OID};
	static const Oid skip_types[3] = {TEXTOID, INT4OID, INT8OID};
	static const Oid lease_types[10] = {TEXTOID, INT4OID, INT8OID, INT8OID, TEXTOID, OIDOID,
	INT8OID, TIMESTAMPTZOID, INT4OID, INT4OID};
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz until;
	Interval	dflt;
	Datum		a[12];
	Snapshot	snap;
	OutboxClaimLook look;
	bool		fresh;
	int			i;
	int32		stream_id;
	int32		partitions;
	int32		batch_size;
	bool		expired;
	Datum	   *tried;
	int			ntried = 0;

	/* 1. the stream, the subscription, the caller, the lease */
	snap = sc_look(stream, sub, &look);
	if (!look.stream_found)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("stream \"%s\" does not exist", text_to_cstring(stream))));
	stream_id = look.stream_id;
	partitions = look.partitions;
	batch_size = look.batch_size;
	if (!look.sub_found)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("subscription \"%s\" does not exist", text_to_cstring(sub))));
	if (!sc_text_eq(look.sub_stream, stream))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("subscription \"%s\" is not a subscription of stream \"%s\"",
						text_to_cstring(sub), text_to_cstring(stream))));
	if (!OutboxMay(look.claimers == (Datum) 0 ? NULL : DatumGetArrayTypeP(look.claimers),
				   caller))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to claim the batches of subscription \"%s\"",
						text_to_cstring(sub)),
				 errhint("The subscription's claimers (outbox.create_subscription) do not include a role of yours.")));
	*since = look.created_at;
	expired = false;
	for (i = 0; i < look.nprogress; i++)
		if (look.progress[i].open && !look.progress[i].lease_null &&
			look.progress[i].lease_until <= now)
			expired = true;
	if (lease == NULL)
		lease = OutboxDefaultLease(&dflt);
	until = OutboxLeaseEnd(lease, now);

	/* 2. an expired batch: the same commands, a new version (a new token) */
	if (expired)
	{
		a[0] = PointerGetDatum(sub);
		a[1] = TimestampTzGetDatum(now);
		OutboxRunGeneric(&expired_plan, sc_expired_sql, 2, expired_types, a,
						 SPI_OK_SELECT, "claim_batch");
	}
	if (expired && SPI_processed == 1)
	{
		Datum		part = sc_col(1);
		Datum		batch_id = sc_col(2);
		Datum		acked = sc_col(3);
		Datum		batch_to = sc_col(4);

		a[1] = part;
		a[2] = Int32GetDatum(stream_id);
		a[3] = TimestampTzGetDatum(now);
		OutboxRunGeneric(&cap_plan, sc_cap_sql, 4, cap_types, a, SPI_OK_SELECT,
						 "claim_batch");
		if (!DatumGetBool(sc_col(1)))
		{
			Datum		version;
			Datum		deliveries;

			a[2] = PointerGetDatum(worker);
			a[3] = ObjectIdGetDatum(caller);
			a[4] = Int64GetDatum(nonce);
			a[5] = TimestampTzGetDatum(until);
			OutboxRunGeneric(&takeover_plan, sc_takeover_sql, 6, takeover_types, a,
							 SPI_OK_UPDATE_RETURNING, "claim_batch");
			version = sc_col(1);
			deliveries = sc_col(2);
			a[2] = batch_id;
			OutboxRunGeneric(&takeover_retries_plan, sc_takeover_retries_sql, 3,
							 takeover_retries_types, a, SPI_OK_UPDATE, "claim_batch");
			a[3] = Int32GetDatum(stream_id);
			a[4] = acked;
			a[5] = batch_to;
			a[6] = deliveries;
			a[7] = version;
			a[8] = TimestampTzGetDatum(until);
			OutboxRunGeneric(&takeover_rows_plan, sc_takeover_rows_sql, 9,
							 takeover_rows_types, a, SPI_OK_SELECT, "claim_batch");
			sc_spi_rows(rows);
			UnregisterSnapshot(snap);
			return;
		}
	}

	/* 3. a new batch of the next partition with work */
	fresh = !expired;
	tried = palloc(sizeof(Datum) * (partitions + 1));
	for (;;)
	{
		Datum		part;
		Datum		nb;
		Datum		t_to;
		OutboxBatchTicks ticks;
		Datum	   *xip;
		ArrayType  *sa_xip;
		uint32		x;
		int32		n_retries = 0;
		uint64		n_rows;
		Datum		p[SC_PICK_COLS];
		bool		pnull[SC_PICK_COLS];
		ItemPointerData tid;

		/*
		 * the look of step 1 while nothing was written since, else a new
		 * one; a subscription with failures picks by the statement (its
		 * due retries and parked keys), else from the look
		 */
		if (!fresh)
		{
			UnregisterSnapshot(snap);
			OutboxFreeClaimLook(&look);
			snap = sc_look(stream, sub, &look);
			if (!look.stream_found || !look.sub_found)
				break;
		}
		fresh = false;
		/*
		 * (a read-only transaction: the statement raises 25006; row-level
		 * security forced on the owner: the statement applies it)
		 */
		if (!look.failures && !look.forced_rls && !XactReadOnly)
		{
			int			got = sc_pick_look(&look, snap, tried, ntried, p, &tid);

			if (got < 0)
				continue;
			if (got == 0)
				break;
		}
		else
		{
			SPITupleTable *pick;
			int			col;

			a[0] = PointerGetDatum(sub);
			a[1] = Int32GetDatum(stream_id);
			a[2] = PointerGetDatum(construct_array(tried, ntried, INT4OID, sizeof(int32), true,
												   TYPALIGN_INT));
			a[3] = TimestampTzGetDatum(now);
			OutboxRunGeneric(&pick_plan, sc_pick_sql, 4, pick_types, a,
							 SPI_OK_SELECT, "claim_batch");
			if (SPI_processed == 0)
				break;
			pick = SPI_tuptable;
			heap_deform_tuple(pick->vals[0], pick->tupdesc, p, pnull);
			for (col = 0; col < SC_PICK_COLS; col++)
				if (pnull[col])
					elog(ERROR, "outbox: claim_batch's pick read a NULL in column %d", col + 1);
			tid = *(ItemPointer) DatumGetPointer(p[SC_CTID]);
		}
		part = p[SC_PART];
		nb = Int64GetDatum(DatumGetInt64(p[SC_BATCH]) + 1);
		/* the batch's ticks (its snapshots) */
		OutboxStreamBatchTicks(stream_id, DatumGetInt64(p[SC_ACKED]),
							   (int64) batch_size * partitions, &ticks);
		t_to = Int64GetDatum(ticks.t_to);
		xip = palloc(sizeof(Datum) * (ticks.sa->nxip + 1));
		for (x = 0; x < ticks.sa->nxip; x++)
			xip[x] = FullTransactionIdGetDatum(ticks.sa->xip[x]);
		sa_xip = construct_array(xip, (int) ticks.sa->nxip, XID8OID, sizeof(FullTransactionId),
								 FLOAT8PASSBYVAL, TYPALIGN_DOUBLE);

		/* the stream's rows, for the statements below */
		a[0] = Int32GetDatum(stream_id);
		a[1] = part;
		a[2] = FullTransactionIdGetDatum(ticks.sa->xmax);
		a[3] = PointerGetDatum(sa_xip);
		a[4] = FullTransactionIdGetDatum(ticks.sb->xmax);
		a[5] = PointerGetDatum(ticks.sb);
		a[6] = PointerGetDatum(sub);
		/*
		 * Commands of an ordering key with an unfinished failure in this
		 * subscription wait behind it (in the failures, as waiting).
		 */
		if (DatumGetBool(p[SC_KEYED]))
		{
			a[7] = TimestampTzGetDatum(now);
			OutboxRunGeneric(&park_plan, sc_park_sql, 8, park_types, a,
							 SPI_OK_INSERT, "claim_batch");
		}
		/* the retries that are due join the batch */
		if (DatumGetBool(p[SC_DUE]))
		{
			Datum		r[5];

			r[0] = PointerGetDatum(sub);
			r[1] = part;
			r[2] = TimestampTzGetDatum(now);
			r[3] = Int32GetDatum(batch_size);
			r[4] = nb;
			OutboxRunGeneric(&retries_plan, sc_retries_sql, 5, retries_types, r,
							 SPI_OK_SELECT, "claim_batch");
			n_retries = DatumGetInt32(sc_col(1));
		}
		/* the batch's commands, read once */
		a[7] = TimestampTzGetDatum(until);
		a[8] = nb;
		a[9] = Int32GetDatum(n_retries);
		if (n_retries == 0 && ticks.sa->nxip == 0)
			sc_read_range(stream_id, DatumGetInt32(part), &ticks, sub, until,
						  DatumGetInt64(nb), rows);
		else
		{
			OutboxRunGeneric(&rows_plan, sc_rows_sql, 10, rows_types, a,
							 SPI_OK_SELECT, "claim_batch");
			sc_spi_rows(rows);
		}
		n_rows = rows->n;
		a[0] = PointerGetDatum(sub);
		a[1] = part;
		if (n_rows == 0)
		{
			/*
			 * nothing to deliver (the commands are after a batch end capped
			 * by batch_size, or wait behind their key): the partition's
			 * progress moves on, and it is looked at again from its new
			 * acked tick until it reaches the last one
			 */
			a[2] = t_to;
			sc_write_progress(&tid, sc_skip_cols, 1, &a[2], &skip_plan, sc_skip_sql, 3,
							  skip_types, a);
			if (ticks.last)
			{
				if (ntried >= partitions)
					elog(ERROR, "outbox: claim_batch tried more partitions than its stream has");
				tried[ntried++] = part;
			}
			continue;
		}
		a[2] = nb;
		a[3] = t_to;
		a[4] = PointerGetDatum(worker);
		a[5] = ObjectIdGetDatum(caller);
		a[6] = Int64GetDatum(nonce);
		a[7] = TimestampTzGetDatum(until);
		a[8] = Int32GetDatum((int32) n_rows);
		a[9] = Int32GetDatum(n_retries);
		/* (the lease's version and deliveries: 1) */
		a[10] = a[11] = Int32GetDatum(1);
		sc_write_progress(&tid, sc_lease_cols, 10, &a[2], &lease_plan, sc_lease_sql, 10,
						  lease_types, a);
		UnregisterSnapshot(snap);
		return;
	}

	/* 4. nothing to claim */
	UnregisterSnapshot(snap);
	rows->n = 0;
}
