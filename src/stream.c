/*-------------------------------------------------------------------------
 *
 * stream.c
 *		Streams, the write-once path (docs/streams.md): the publisher's
 *		batch calls (claim_batch, ack_batch, renew_batch) with their
 *		tokens, the admin's tick_streams, and the producer's append to
 *		the stream log.
 *
 * A kind with a stream (outbox.set_policy(kind, stream => ...)) is written
 * once: commit_decision (src/producer.c, at its one branch point) inserts
 * the command into the current stream log table and its event into
 * outbox.events, and nothing into outbox.commands, without SQL while no
 * kind has deciders (producer.c's stream writer, pr_direct_stream), else
 * by OutboxStreamDecidePlan's statement; both lock the three log tables
 * before the snapshot under which they read the current one.  The event's
 * unique command_id (events_command_id_key) keeps command ids unique
 * across both paths.
 *
 * Batch tokens.  claim_batch (OutboxStreamClaim, src/stream_claim.c) leases one
 * partition's batch of a subscription; the token handed out with it is the
 * text
 *
 *		<mac: 32 hex digits>:<role oid>:<version>:<part>:<batch_id>:<nonce: 16 hex digits>:<subscription>
 *
 * where mac is the 128-bit SipHash-2-4 under the database's lease key
 * (src/leasekey.c, as the row leases' tokens of src/lease.c) of the
 * length-prefixed subscription and worker name, the subscription's
 * created_at (not in the text: a subscription dropped and created again
 * under its name, whose batch ids start at 1 again, refuses the old one's
 * tokens), the partition, the batch id, the version, the claim's nonce and
 * the claiming role.  The nonce is 64 random bits (pg_strong_random) drawn
 * by every claim and takeover and kept in the batch's row
 * (stream_progress.claim_nonce): a claim whose commit is lost (a crash
 * before an asynchronous commit reached the disk) is made again with the
 * same batch id and version, for the same worker name, possibly over more
 * commands, and without the nonce it would hand out the lost claim's
 * token again, which a late holder of the lost claim could then ack.
 * ack_batch and renew_batch compute the MAC again from the token's fields
 * and the caller's worker name and compare in constant time, check the
 * role against the caller (or the caller is an admin), and only then run
 * one statement on the batch's row, which must still hold that batch, at
 * that version and nonce, for that worker: a takeover (version + 1, a new
 * nonce), a claim made again or an ack moves it on and every older token
 * fails with OB001 (lease_not_owned), changing nothing.
 *
 * The set-based form (commit_decisions) is written by producer.c's stream
 * writer too (pr_try_stream_batch_direct) while no kind has deciders and
 * no command id is taken; else it runs the row path's two statements on
 * the log: a diagnosis of forbidden kinds and taken ids, then one INSERT
 * of them all (OutboxStreamBatchWhyPlan, OutboxStreamBatchPlan).  The
 * transaction id a row carries is the writer's plus the installation's
 * xid_base (outbox.stream_rotation), as are the ticks' snapshots, so that
 * a restore into another cluster keeps their order.
 *
 * Locking: the row locks of part 35's statements (see there); none here.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_claim_batch);
PG_FUNCTION_INFO_V1(outbox_ack_batch);
PG_FUNCTION_INFO_V1(outbox_renew_batch);
PG_FUNCTION_INFO_V1(outbox_tick_streams);
PG_FUNCTION_INFO_V1(outbox_stream_tick);

#define ST_MAC_LEN		16
#define ST_MAC_HEX		(2 * ST_MAC_LEN)
#define ST_NONCE_LEN	8
#define ST_NONCE_HEX	(2 * ST_NONCE_LEN)
#define ST_TOKEN_MAX	(ST_MAC_HEX + 1 + 10 + 1 + 10 + 1 + 3 + 1 + 19 + 1 + ST_NONCE_HEX + 1 + OUTBOX_MAX_ID_LEN)

/* A batch token taken apart (pointing into the token's text). */
typedef struct StToken
{
	unsigned char mac[ST_MAC_LEN];
	Oid			role;
	int32		version;
	int32		part;
	int64		batch_id;
	int64		nonce;			/* the claim's random value */
	const char *subscription;
	int			sub_len;
	int64		since;			/* the subscription's created_at (not in the text) */
} StToken;

static inline unsigned char *
st_put32(unsigned char *p, uint32 v)
{
	p[0] = (unsigned char) v;
	p[1] = (unsigned char) (v >> 8);
	p[2] = (unsigned char) (v >> 16);
	p[3] = (unsigned char) (v >> 24);
	return p + 4;
}

/* The MAC of a batch lease into mac. */
static void
st_mac(const unsigned char *key, const char *sub, int sub_len, int64 since,
	   int32 part, int64 batch_id, int32 version, int64 nonce, Oid role,
	   const char *worker, int worker_len, unsigned char *mac)
{
	unsigned char msg[4 + 4 + 2 * OUTBOX_MAX_ID_LEN + 8 + 4 + 8 + 4 + 8 + 4 + 4];
	unsigned char *p = msg;

	Assert(sub_len <= OUTBOX_MAX_ID_LEN && worker_len <= OUTBOX_MAX_ID_LEN);
	/* a tag, so that no row lease's message is a batch's */
	p = st_put32(p, 0x4F425354);
	p = st_put32(p, (uint32) sub_len);
	memcpy(p, sub, sub_len);
	p += sub_len;
	p = st_put32(p, (uint32) (((uint64) since) & 0xFFFFFFFF));
	p = st_put32(p, (uint32) (((uint64) since) >> 32));
	p = st_put32(p, (uint32) part);
	p = st_put32(p, (uint32) (((uint64) batch_id) & 0xFFFFFFFF));
	p = st_put32(p, (uint32) (((uint64) batch_id) >> 32));
	p = st_put32(p, (uint32) version);
	p = st_put32(p, (uint32) (((uint64) nonce) & 0xFFFFFFFF));
	p = st_put32(p, (uint32) (((uint64) nonce) >> 32));
	p = st_put32(p, (uint32) role);
	p = st_put32(p, (uint32) worker_len);
	memcpy(p, worker, worker_len);
	p += worker_len;
	OutboxSipHash(key, msg, p - msg, mac, ST_MAC_LEN);
}

/*
 * When subscription sub (the current one of that name) was created, in
 * microseconds (its created_at), into *since; false when there is none.
 * The MAC covers it, so that a token of a dropped subscription is refused
 * by one created again under its name, whose batch ids start again at 1.
 * The caller is connected to SPI.
 */
static bool
st_sub_since(const char *sub, int sub_len, int64 *since)
{
	static SPIPlanPtr plan = NULL;
	static const Oid argtypes[1] = {TEXTOID};
	Datum		args[1];
	bool		isnull;

	args[0] = PointerGetDatum(cstring_to_text_with_len(sub, sub_len));
	if (OutboxExecute(OutboxPrepare(&plan,
									"SELECT u.created_at FROM outbox.subscriptions u"
									" WHERE u.subscription OPERATOR(pg_catalog.=) $1",
									1, argtypes),
					  args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "outbox: the subscription's lookup failed");
	if (SPI_processed != 1)
		return false;
	*since = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0],
											   SPI_tuptable->tupdesc, 1, &isnull));
	return !isnull;
}

/* The token of a batch that claim_batch leased. */
static text *
st_make_token(text *sub, int64 since, int32 part, int64 batch_id, int32 version,
			  int64 nonce, Oid role, text *worker)
{
	unsigned char mac[ST_MAC_LEN];
	char		head[ST_MAC_HEX + 80 + ST_NONCE_HEX];
	int			hl;
	int			sl = VARSIZE_ANY_EXHDR(sub);
	text	   *t;

	st_mac(OutboxLeaseKey(), VARDATA_ANY(sub), sl, since, part, batch_id, version, nonce,
		   role, VARDATA_ANY(worker), VARSIZE_ANY_EXHDR(worker), mac);
	hex_encode((const char *) mac, ST_MAC_LEN, head);
	hl = ST_MAC_HEX + snprintf(head + ST_MAC_HEX, sizeof(head) - ST_MAC_HEX,
							   ":%u:%d:%d:" INT64_FORMAT ":%016" INT64_MODIFIER "x:",
							   role, version, part, batch_id, (uint64) nonce);
	t = palloc(VARHDRSZ + hl + sl);
	SET_VARSIZE(t, VARHDRSZ + hl + sl);
	memcpy(VARDATA(t), head, hl);
	memcpy(VARDATA(t) + hl, VARDATA_ANY(sub), sl);
	return t;
}

/* Take a batch token apart; false when it is not in the form claim_batch makes. */
static bool
st_parse_token(text *token, StToken *tok)
{
	const char *s = VARDATA_ANY(token);
	int			len = VARSIZE_ANY_EXHDR(token);
	int			pos = ST_MAC_HEX;
	uint64		v;
	unsigned char nb[ST_NONCE_LEN];
	int			i;

	if (len < ST_MAC_HEX + 10 || len > ST_TOKEN_MAX)
		return false;
	if (!OutboxTokenMac(s, tok->mac, ST_MAC_LEN))
		return false;
	if (s[pos++] != ':')
		return false;
	if (!OutboxTokenNumber(s, len, &pos, 10, PG_UINT32_MAX, &v) || v == InvalidOid)
		return false;
	tok->role = (Oid) v;
	if (!OutboxTokenNumber(s, len, &pos, 10, PG_INT32_MAX, &v) || v < 1)
		return false;
	tok->version = (int32) v;
	if (!OutboxTokenNumber(s, len, &pos, 3, 255, &v))
		return false;
	tok->part = (int32) v;
	if (!OutboxTokenNumber(s, len, &pos, 19, PG_INT64_MAX, &v) || v < 1)
		return false;
	tok->batch_id = (int64) v;
	/* the nonce: 16 hex digits, most significant first, then ':' */
	if (pos + ST_NONCE_HEX + 1 > len || !OutboxTokenMac(s + pos, nb, ST_NONCE_LEN) ||
		s[pos + ST_NONCE_HEX] != ':')
		return false;
	v = 0;
	for (i = 0; i < ST_NONCE_LEN; i++)
		v = (v << 8) | nb[i];
	tok->nonce = (int64) v;
	pos += ST_NONCE_HEX + 1;
	tok->subscription = s + pos;
	tok->sub_len = len - pos;
	if (tok->sub_len < 1 || tok->sub_len > OUTBOX_MAX_ID_LEN)
		return false;
	return pg_verifymbstr(tok->subscription, tok->sub_len, true);
}

/*
 * Whether a token (taken apart) is one claim_batch made for this worker,
 * and its role is the caller's (or one the caller has the privileges of),
 * or the caller is an admin.  The MAC is compared in constant time.
 */
static bool
st_token_holds(const StToken *tok, text *worker, Oid caller)
{
	unsigned char mac[ST_MAC_LEN];

	st_mac(OutboxLeaseKey(), tok->subscription, tok->sub_len, tok->since, tok->part,
		   tok->batch_id, tok->version, tok->nonce, tok->role, VARDATA_ANY(worker),
		   VARSIZE_ANY_EXHDR(worker), mac);
	if (timingsafe_bcmp(mac, tok->mac, ST_MAC_LEN) != 0)
		return false;
	return tok->role == caller || has_privs_of_role(caller, tok->role) ||
		OutboxIsAdmin(caller);
}

/* Raise OB001 for worker's call with a batch token it does not hold. */
static void
st_raise_not_owned(text *worker, const StToken *tok)
{
	char	   *wname = text_to_cstring(worker);

	OutboxCountNow(OBC_STALE_REFUSED, 1);
	if (tok == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUTBOX_LEASE_NOT_OWNED),
				 errmsg("lease_not_owned: worker \"%s\" does not hold the batch of an invalid token", wname),
				 errdetail("The token is not in the form outbox.claim_batch returns.")));
	ereport(ERROR,
			(errcode(ERRCODE_OUTBOX_LEASE_NOT_OWNED),
			 errmsg("lease_not_owned: worker \"%s\" does not hold batch " INT64_FORMAT " of partition %d of subscription \"%s\"",
					wname, tok->batch_id, tok->part,
					pnstrdup(tok->subscription, tok->sub_len)),
			 errdetail("The token is not that of a batch this worker and role hold: the batch was taken over or acked, or the token is wrong.")));
}

/* Fetch and check the worker and token arguments (0 and 1). */
static text *
st_args_token(FunctionCallInfo fcinfo, Oid caller, StToken *tok)
{
	text	   *worker = OutboxArgId(fcinfo, 0, "worker");

	OutboxArgNotNull(fcinfo, 1, "token");
	if (!st_parse_token(PG_GETARG_TEXT_PP(1), tok))
		st_raise_not_owned(worker, NULL);
	if (!st_sub_since(tok->subscription, tok->sub_len, &tok->since))
		st_raise_not_owned(worker, tok);
	if (!st_token_holds(tok, worker, caller))
		st_raise_not_owned(worker, tok);
	return worker;
}

static int
st_cmp_u64(const void *a, const void *b)
{
	uint64		x = *(const uint64 *) a;
	uint64		y = *(const uint64 *) b;

	return x < y ? -1 : (x > y ? 1 : 0);
}

/*
 * snap as pg_current_snapshot() gives it (each xid widened to 64 bits
 * against the next one, the running ones in order, once each), with base
 * added to each, as a pg_snapshot datum.
 */
static OutboxSnapshot *
st_snapshot_datum(Snapshot snap, int64 base)
{
	FullTransactionId next = ReadNextFullTransactionId();
	uint64		nextv = U64FromFullTransactionId(next);
	TransactionId nextx = XidFromFullTransactionId(next);
	uint64	   *xip = palloc(sizeof(uint64) * Max(snap->xcnt, 1));
	OutboxSnapshot *out;
	uint32		n = 0;
	uint32		i;

#define ST_WIDEN(x) (nextv - (uint64) (uint32) (nextx - (x)))
	for (i = 0; i < snap->xcnt; i++)
		xip[i] = ST_WIDEN(snap->xip[i]);
	qsort(xip, snap->xcnt, sizeof(uint64), st_cmp_u64);
	out = palloc(offsetof(OutboxSnapshot, xip) + sizeof(FullTransactionId) * Max(snap->xcnt, 1));
	out->xmin = FullTransactionIdFromU64(ST_WIDEN(snap->xmin) + (uint64) base);
	out->xmax = FullTransactionIdFromU64(ST_WIDEN(snap->xmax) + (uint64) base);
	for (i = 0; i < snap->xcnt; i++)
	{
		if (i > 0 && xip[i] == xip[i - 1])
			continue;
		out->xip[n++] = FullTransactionIdFromU64(xip[i] + (uint64) base);
	}
#undef ST_WIDEN
	out->nxip = n;
	SET_VARSIZE(out, offsetof(OutboxSnapshot, xip) + sizeof(FullTransactionId) * n);
	pfree(xip);
	return out;
}

/*
 * The last log id given (the log's sequence's last_value, as the tick's
 * statement read it; 0 before the first).
 */
static int64
st_last_id(void)
{
	Oid			seq = get_relname_relid("stream_log_id_seq", get_namespace_oid("outbox", false));
	LOCAL_FCINFO(fcinfo, 1);
	Datum		last;

	if (!OidIsValid(seq))
		elog(ERROR, "outbox: the sequence outbox.stream_log_id_seq is missing");
	InitFunctionCallInfoData(*fcinfo, NULL, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = ObjectIdGetDatum(seq);
	fcinfo->args[0].isnull = false;
	last = pg_sequence_last_value(fcinfo);
	return fcinfo->isnull ? 0 : DatumGetInt64(last);
}

/*
 * Write the tick of stream (locked by OutboxLockStreams): its row of
 * stream_ticks, args[0] stream_id, args[1] tick, args[2] snap, and the
 * stream's part_ticks args[3]; from C (OutboxOpenRowWriter) unless the
 * statement must write.  The number of streams rows updated (1).
 */
static int32
st_cut(const OutboxLockedStream *stream, Datum *args)
{
	static SPIPlanPtr cut_plan = NULL;
	static const Oid cut_types[4] = {INT4OID, INT8OID, PG_SNAPSHOTOID, INT8ARRAYOID};
	static const OutboxColumn tick_cols[5] = {{"stream_id", INT4OID}, {"tick", INT8OID},
	{"snap", PG_SNAPSHOTOID}, {"last_id", INT8OID}, {"made_at", TIMESTAMPTZOID}};
	static const OutboxColumn stream_cols[1] = {{"part_ticks", INT8ARRAYOID}};
	static const char *const stream_checks[2] = {"streams_batch_size_check",
	"streams_partitions_check"};
	OutboxRowWriter *ticks = OutboxOpenRowWriter("stream_ticks", ACL_INSERT, tick_cols, 5, true,
												 NULL, 0);
	OutboxRowWriter *streams = ticks == NULL ? NULL :
		OutboxOpenRowWriter("streams", ACL_UPDATE, stream_cols, 1, false, stream_checks, 2);
	Datum		v[5];
	bool		nulls[5] = {false, false, false, false, false};

	if (streams == NULL)
	{
		if (ticks != NULL)
			OutboxCloseRowWriter(ticks);
		OutboxRunGeneric(&cut_plan,
						 "WITH i AS ("
						 "  INSERT INTO outbox.stream_ticks (stream_id, tick, snap, last_id)"
						 "  SELECT $1, $2, $3, (SELECT q.last_value FROM outbox.stream_log_id_seq q))"
						 " UPDATE outbox.streams t SET part_ticks = $4"
						 "  WHERE t.stream_id OPERATOR(pg_catalog.=) $1", 4, cut_types,
						 args, SPI_OK_UPDATE, "the streams' tick");
		return (int32) SPI_processed;
	}
	v[0] = args[0];
	v[1] = args[1];
	v[2] = args[2];
	v[3] = Int64GetDatum(st_last_id());
	v[4] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	OutboxRowInsert(ticks, v, nulls);
	OutboxRowUpdate(streams, (ItemPointer) &stream->tid, &args[3], nulls);
	OutboxCloseRowWriter(streams);
	OutboxCloseRowWriter(ticks);
	return 1;
}

/*
 * The tick (docs/streams.md, "Ticks"): cut a tick of every stream with
 * commands its last tick does not see, committed since or by a
 * transaction that was running then.  The log tables are locked first,
 * before any snapshot of the tick: a rotation that copies a command into
 * stream_kept and truncates its table holds that table's ACCESS EXCLUSIVE
 * lock until it commits, and a snapshot taken before waiting for it would
 * see neither the copy nor the row (isolation spec
 * stream_tick_vs_truncate).  The streams' rows are locked from C
 * (OutboxLockStreams, src/stream_log.c: as FOR UPDATE SKIP LOCKED, a
 * stream another transaction is ticking is skipped); per stream, its last
 * tick is read (a scan of the ticks'
 * primary key, OutboxStreamLastTick) in a snapshot taken after the lock
 * (no one else cuts one while the row is held), then, in one new
 * snapshot, an index probe per
 * partition and log table (its batch index, stream_id, part, xid) for a
 * row from the last tick's xmax on, and one for each transaction that was
 * running at the last tick; a row is visible in that snapshot exactly when
 * its transaction committed before it.  If a partition has one, the tick
 * is written with that same snapshot (as pg_current_snapshot() would give
 * it, plus the installation's xid_base) and the partitions found become
 * its part_ticks.  The probes read the index directly (a probe is about a
 * microsecond; the statement that did the same took a tenth of a
 * millisecond, mostly to start its plan over four tables).
 *
 * Returns the number of ticks cut, -1 when there is no stream, and -2 - n
 * when n were cut and a stream was skipped.  SPI must be connected.
 */
int32
OutboxStreamTick(void)
{
	int			nstreams;
	int			nall;
	int64		base;
	OutboxLockedStream *streams;
	OutboxStreamLogs *logs;
	int32		n = 0;
	int			s;

	/* the log tables' locks before any of the tick's snapshots */
	logs = OutboxOpenStreamLogs();
	/*
	 * the streams' rows: a subscription being created waits (and the other
	 * way round); skip a stream someone else is ticking
	 */
	streams = OutboxLockStreams(&nstreams, &nall, &base);
	if (nstreams == 0)
	{
		OutboxCloseStreamLogs(logs);
		return nall == 0 ? -1 : -2;
	}
	for (s = 0; s < nstreams; s++)
	{
		Datum		args[4];
		int64		last_tick;
		uint64		last_xmax;
		uint64	   *xip = NULL;
		int			nxip = 0;
		Datum	   *ticks;
		int			nfound = 0;
		Snapshot	snap;
		int32		p;

		/* the last tick, in a snapshot taken after the lock */
		if (!OutboxStreamLastTick(streams[s].stream_id, &last_tick, &last_xmax, &xip, &nxip))
			continue;
		args[0] = Int32GetDatum(streams[s].stream_id);

		/* the probes and the tick, in one snapshot */
		snap = RegisterSnapshot(GetTransactionSnapshot());
		OutboxBeginLogProbes(logs, snap);
		/*
		 * the stream's part_ticks after the tick: the new tick for the
		 * partitions it gives commands, the last one with commands (0 for
		 * none) for the others
		 */
		ticks = palloc(sizeof(Datum) * Max(streams[s].partitions, 1));
		for (p = 0; p < streams[s].partitions; p++)
			ticks[p] = Int64GetDatum(0);
		if (streams[s].part_ticks != (Datum) 0)
		{
			Datum	   *old;
			bool	   *oldnull;
			int			nold;

			deconstruct_array(DatumGetArrayTypeP(streams[s].part_ticks), INT8OID, sizeof(int64),
							  FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &old, &oldnull, &nold);
			for (p = 0; p < streams[s].partitions && p < nold; p++)
				if (!oldnull[p])
					ticks[p] = old[p];
		}
		for (p = 0; p < streams[s].partitions; p++)
		{
			bool		has = OutboxLogPartHas(logs, streams[s].stream_id, p, last_xmax, false);
			int			x;

			for (x = 0; !has && x < nxip; x++)
				has = OutboxLogPartHas(logs, streams[s].stream_id, p, xip[x], true);
			if (has)
			{
				ticks[p] = Int64GetDatum(last_tick + 1);
				nfound++;
			}
		}
		OutboxEndLogScans(logs);
		if (nfound == 0)
		{
			UnregisterSnapshot(snap);
			continue;
		}
		args[1] = Int64GetDatum(last_tick + 1);
		args[2] = PointerGetDatum(st_snapshot_datum(snap, base));
		args[3] = PointerGetDatum(construct_array(ticks, streams[s].partitions, INT8OID, sizeof(int64),
												  FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
		UnregisterSnapshot(snap);
		/* the tick, and the partitions it gave commands */
		n += st_cut(&streams[s], args);
	}
	OutboxCloseStreamLogs(logs);
	return nall > nstreams ? -2 - n : n;
}

/*
 * Cut the ticks of the streams with new commands (OutboxStreamTick, as the
 * worker does, skipping a stream someone else is ticking); the number cut.
 */
static int32
st_tick(void)
{
	int32		n = OutboxStreamTick();

	if (n < -1)
	{
		/* a stream skipped (the worker is ticking it): its turn again */
		OutboxStreamTickAgain();
		return -2 - n;
	}
	return n;
}

/*
 * outbox.tick_streams(): cut the ticks now, as the worker does (st_tick,
 * with generic plans); the number cut.
 */
static Datum
st_tick_streams(FunctionCallInfo fcinfo, Oid caller)
{
	int32		n;

	SPI_connect();
	n = st_tick();
	SPI_finish();
	/* the publishers that wait are told at commit, as after a claim's tick */
	if (n > 0)
		OutboxDueAtCommit(OUTBOX_DUE_TICKED);
	/* (-1: there is no stream) */
	PG_RETURN_INT32(Max(n, 0));
}

Datum
outbox_tick_streams(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, st_tick_streams);
}

/*
 * outbox._stream_tick(unused): OutboxStreamTick for the owner (the number
 * cut, -1 without streams, -2 - n when a stream was skipped).
 */
Datum
outbox_stream_tick(PG_FUNCTION_ARGS)
{
	int32		n;

	SPI_connect();
	n = OutboxStreamTick();
	SPI_finish();
	PG_RETURN_INT32(n);
}

/*
 * outbox.claim_batch(stream, subscription, worker, lease): the commands of
 * one batch, each with the batch's token.
 */
static Datum
st_claim_batch(FunctionCallInfo fcinfo, Oid caller)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *stream = OutboxArgId(fcinfo, 0, "stream");
	text	   *sub = OutboxArgId(fcinfo, 1, "subscription");
	text	   *worker = OutboxArgId(fcinfo, 2, "worker");
	Interval   *lease = PG_ARGISNULL(3) ? NULL : PG_GETARG_INTERVAL_P(3);
	uint64		nonce;
	text	   *token = NULL;
	int64		since = 0;
	OutboxBatchRows rows;
	uint64		i;
	bool		may_tick;
	bool		ticked = false;
	uint32		tick_seq = OutboxTickSeq();

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	/* this claim's own value, so that its token is no other claim's */
	if (!pg_strong_random(&nonce, sizeof(nonce)))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate a random batch nonce")));
	/*
	 * Whether this claim may cut the ticks the commits wait for (taking
	 * them from the worker): not in a transaction that has written (its own
	 * decisions would be in the tick before they commit), nor in one that
	 * reads a single snapshot (REPEATABLE READ or SERIALIZABLE: the tick's
	 * snapshot would be older than the last one).  Asked before the claim,
	 * which locks rows.
	 */
	may_tick = !TransactionIdIsValid(GetTopTransactionIdIfAny()) &&
		!IsolationUsesXactSnapshot();
	SPI_connect();

	/*
	 * Commits wait for a tick: cut it here, then claim, rather than leave
	 * the worker to cut it (at most one per outbox.notify_interval while the
	 * publishers are busy) and a busy publisher to claim without what
	 * committed while it delivered: its claim takes all of it, as on the
	 * row path.  The other publishers that wait are told at commit
	 * (OUTBOX_DUE_TICKED: when a publisher other than this one waits, as
	 * after a decision; a busy one claims again after its batch); a tick
	 * that is rolled back goes back to the worker (OutboxTakeStreamTick).
	 */
	if (may_tick && OutboxTakeStreamTick() && st_tick() > 0)
	{
		OutboxDueAtCommit(OUTBOX_DUE_TICKED);
		ticked = true;
	}
	/* (the token's lease key may be read by SPI: the result is kept) */
	OutboxStreamClaim(stream, sub, worker, lease, caller, (int64) nonce, &since, &rows);
	/*
	 * Nothing, and a commit has raised a tick since (the worker's tick was
	 * under way when this claim began, or came after it): cut it too and
	 * claim again, rather than wait for the worker's tick to notify.
	 */
	if (rows.n == 0 && may_tick && OutboxTakeStreamTick() && st_tick() > 0)
	{
		if (!ticked)
			OutboxDueAtCommit(OUTBOX_DUE_TICKED);
		OutboxStreamClaim(stream, sub, worker, lease, caller, (int64) nonce, &since, &rows);
	}
	for (i = 0; i < rows.n; i++)
	{
		HeapTuple	row = rows.vals[i];
		TupleDesc	desc = rows.desc;
		Datum		values[13];
		bool		isnull[13];
		int			j;

		for (j = 0; j < 12; j++)
		{
			int			to = j < 5 ? j : j + 1;

			values[to] = SPI_getbinval(row, desc, j + 1, &isnull[to]);
		}
		if (token == NULL)
			token = st_make_token(sub, since, DatumGetInt32(values[12]), DatumGetInt64(values[11]),
								  (int32) DatumGetInt64(values[6]), (int64) nonce, caller,
								  worker);
		values[5] = PointerGetDatum(token);
		isnull[5] = false;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, isnull);
	}
	SPI_finish();
	/*
	 * nothing to do: a publisher waits for the next notification (and is
	 * sent one if a tick another claim cut committed meanwhile)
	 */
	if (rows.n == 0)
		OutboxNoteIdleBatchClaim(tick_seq);
	return (Datum) 0;
}

Datum
outbox_claim_batch(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, st_claim_batch);
}

/*
 * The batch's row while it holds the token's batch, at its version and
 * claim nonce, for the worker ($1 to $6 of st_batch_call's statement).
 */
#define ST_HELD_BATCH \
" WHERE p.subscription OPERATOR(pg_catalog.=) $1" \
"   AND p.part OPERATOR(pg_catalog.=) $2" \
"   AND p.batch_id OPERATOR(pg_catalog.=) $3" \
"   AND p.version OPERATOR(pg_catalog.=) $4" \
"   AND p.claim_nonce OPERATOR(pg_catalog.=) $6" \
"   AND p.owner OPERATOR(pg_catalog.=) $5" \
"   AND p.batch_to IS NOT NULL"

/* What $7 of st_batch_call's statement is. */
typedef enum StExtra
{
	ST_EXTRA_ARGS,				/* $7 on: the call's arguments from 2 on */
	ST_EXTRA_LEASE_END,			/* $7: the end of the lease of argument 2 */
	ST_EXTRA_NOW				/* $7: the current time */
} StExtra;

/*
 * The body of ack_batch and renew_batch: check the worker and token
 * arguments (0 and 1), then run sql on the batch's row with $1 to $6 the
 * token's subscription, partition, batch id, version, the worker and the
 * token's nonce, and $7 as extra says (ST_EXTRA_LEASE_END: the call's one
 * argument from 2 on is a lease, NULL for outbox.default_lease, and $7 is
 * the end of that lease if it starts now, checked by OutboxLeaseEnd after
 * the token); its first value, by value, or OB001 when it is NULL (the
 * batch is not held).  what names the call in the error of a failed
 * statement.
 */
static Datum
st_batch_call(FunctionCallInfo fcinfo, Oid caller, SPIPlanPtr *plan,
			  const char *sql, int nargs, const Oid *argtypes, StExtra extra,
			  const char *what)
{
	StToken		tok;
	text	   *worker;
	Datum		args[9];
	char		nulls[9];
	bool		isnull;
	Datum		result;
	int			j;

	Assert(nargs >= 6 && nargs <= lengthof(args));
	/* (the lease key is read through SPI) */
	SPI_connect();
	worker = st_args_token(fcinfo, caller, &tok);
	args[0] = PointerGetDatum(cstring_to_text_with_len(tok.subscription, tok.sub_len));
	args[1] = Int32GetDatum(tok.part);
	args[2] = Int64GetDatum(tok.batch_id);
	args[3] = Int32GetDatum(tok.version);
	args[4] = PointerGetDatum(worker);
	args[5] = Int64GetDatum(tok.nonce);
	memset(nulls, ' ', sizeof(nulls));
	for (j = 6; extra == ST_EXTRA_ARGS && j < nargs; j++)
	{
		args[j] = PG_ARGISNULL(j - 4) ? (Datum) 0 : PG_GETARG_DATUM(j - 4);
		if (PG_ARGISNULL(j - 4))
			nulls[j] = 'n';
	}
	if (extra == ST_EXTRA_NOW)
		args[6] = TimestampTzGetDatum(GetCurrentTimestamp());
	else if (extra == ST_EXTRA_LEASE_END)
	{
		Interval	dflt;

		args[6] = TimestampTzGetDatum(OutboxLeaseEnd(PG_ARGISNULL(2) ? OutboxDefaultLease(&dflt) :
													 PG_GETARG_INTERVAL_P(2),
													 GetCurrentTimestamp()));
		nulls[6] = ' ';
	}
	if (OutboxExecute(OutboxPrepare(plan, sql, nargs, argtypes),
					  args, nulls, false, 0) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "outbox: %s failed", what);
	result = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (isnull)
		st_raise_not_owned(worker, &tok);
	SPI_finish();
	return result;
}

/* Whether an optional array argument is NULL or has no element and no dimension. */
static bool
st_arg_empty(FunctionCallInfo fcinfo, int argno)
{
	return PG_ARGISNULL(argno) || ARR_NDIM(PG_GETARG_ARRAYTYPE_P(argno)) == 0;
}

/*
 * outbox.ack_batch(worker, token, failed, errors, fatal): the batch is
 * published but for the failed commands; returns how many were published.
 * Without failures, one statement here (one row, and the retries that
 * joined the batch leave the failures); with them, outbox._ack_batch.
 */
static Datum
st_ack_batch(FunctionCallInfo fcinfo, Oid caller)
{
	static SPIPlanPtr plan = NULL;
	static SPIPlanPtr happy_plan = NULL;
	static const Oid argtypes[9] = {TEXTOID, INT4OID, INT8OID, INT4OID, TEXTOID,
	INT8OID, TEXTARRAYOID, TEXTARRAYOID, BOOLARRAYOID};
	static const Oid happy_types[7] = {TEXTOID, INT4OID, INT8OID, INT4OID, TEXTOID,
	INT8OID, TIMESTAMPTZOID};
	Datum		n;

	if (st_arg_empty(fcinfo, 2) && st_arg_empty(fcinfo, 3) && st_arg_empty(fcinfo, 4))
		n = st_batch_call(fcinfo, caller, &happy_plan,
						  "WITH r AS (UPDATE outbox.stream_progress p"
						  "   SET acked_tick = p.batch_to, batch_to = NULL, owner = NULL,"
						  "       role = NULL, claim_nonce = NULL, lease_until = NULL,"
						  "       published = p.published OPERATOR(pg_catalog.+) p.batch_rows,"
						  "       acked_at = $7"
						  ST_HELD_BATCH
						  " RETURNING p.batch_rows, p.batch_retries)"
						  "SELECT (SELECT r.batch_rows::pg_catalog.int8 FROM r),"
						  "       (SELECT outbox._stream_published_retries($1, $2, $3, $7)"
						  "          FROM r WHERE r.batch_retries OPERATOR(pg_catalog.>) 0)",
						  7, happy_types, ST_EXTRA_NOW, "ack_batch");
	else
		n = st_batch_call(fcinfo, caller, &plan,
						  "SELECT outbox._ack_batch($1, $2, $3, $4, $5, $6, $7, $8, $9)",
						  9, argtypes, ST_EXTRA_ARGS, "ack_batch");
	OutboxCountNow(OBC_ACKED, DatumGetInt64(n));
	PG_RETURN_DATUM(n);
}

Datum
outbox_ack_batch(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, st_ack_batch);
}

/*
 * outbox.renew_batch(worker, token, lease): the new lease end.  One
 * statement on the batch's row, which must still hold the token's batch
 * at its version and nonce for worker.
 */
static Datum
st_renew_batch(FunctionCallInfo fcinfo, Oid caller)
{
	static SPIPlanPtr plan = NULL;
	static const Oid argtypes[7] = {TEXTOID, INT4OID, INT8OID, INT4OID, TEXTOID, INT8OID,
	TIMESTAMPTZOID};

	PG_RETURN_DATUM(st_batch_call(fcinfo, caller, &plan,
								  "WITH r AS (UPDATE outbox.stream_progress p"
								  "   SET lease_until = $7"
								  ST_HELD_BATCH
								  " RETURNING p.lease_until)"
								  "SELECT (SELECT r.lease_until FROM r)",
								  7, argtypes, ST_EXTRA_LEASE_END, "renew_batch"));
}

Datum
outbox_renew_batch(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, st_renew_batch);
}

/* ----------------------------------------------------------------
 * The producer's append (called by src/producer.c)
 * ----------------------------------------------------------------
 */

/*
 * The transaction id a log row carries: the writer's plus the
 * installation's xid_base (stream_rotation), so that a restore into
 * another cluster keeps the order of the ids (docs/streams.md).
 */
#define ST_XID(r) \
	"(pg_catalog.pg_current_xact_id()::pg_catalog.text::pg_catalog.int8" \
	" OPERATOR(pg_catalog.+) " r ".xid_base)::pg_catalog.text::pg_catalog.xid8"

#define ST_LOG_INSERT(n) \
	" l" #n " AS (" \
	"  INSERT INTO outbox.stream_log_" #n \
	"    (id, xid, stream_id, part, command_id, run_id, seq, kind, payload," \
	"     headers, ordering_key, decided_by)" \
	"  SELECT v.id, v.xid, v.stream_id, v.part, $4, $1, $2, $5, $6, $11, $12, $10" \
	"    FROM v WHERE v.current OPERATOR(pg_catalog.=) " #n " RETURNING 1)"
#define ST_DECIDE(filter) \
	"WITH i AS (" \
	"  SELECT s.stream_id, s.partitions, r.current, r.xid_base" \
	"    FROM outbox.policies p" \
	"    JOIN outbox.streams s ON s.stream OPERATOR(pg_catalog.=) p.stream" \
	"   CROSS JOIN outbox.stream_rotation r" \
	"   WHERE p.kind OPERATOR(pg_catalog.=) $5" \
	"     AND NOT EXISTS (SELECT 1 FROM outbox.events x" \
	"                      WHERE x.command_id OPERATOR(pg_catalog.=) $4)" \
	filter "), " \
	" v AS (" \
	"  SELECT pg_catalog.nextval('outbox.stream_log_id_seq'::pg_catalog.regclass) AS id," \
	"         " ST_XID("i") " AS xid, i.stream_id, i.current," \
	"         (pg_catalog.hashtext(COALESCE($12, $1)) OPERATOR(pg_catalog.&) 2147483647)" \
	"           OPERATOR(pg_catalog.%) i.partitions AS part" \
	"    FROM i)," \
	ST_LOG_INSERT(0) "," ST_LOG_INSERT(1) "," ST_LOG_INSERT(2) \
	"INSERT INTO outbox.events (run_id, seq, kind, payload, command_id)" \
	"SELECT $1, $2, $3, $7, $4 FROM v"

/*
 * The append of one decision to the current log table, with its event,
 * unless the command id is taken (or, with deciders, the kind's deciders
 * do not admit the caller): the parameters of producer.c's single
 * decision, $1 run_id, $2 seq, $3 event_kind, $4 command_id,
 * $5 command_kind, $6 payload, $7 event_payload, $8 not_before,
 * $9 priority, $10 the caller, $11 headers, and $12 the ordering key (NULL:
 * none).  The partition is a hash of the key, else of the run_id.  Its top
 * statement is the INSERT of the event, so the count is the events'.
 */
SPIPlanPtr
OutboxStreamDecidePlan(bool deciders)
{
	static SPIPlanPtr plan_open = NULL;
	static SPIPlanPtr plan_deciders = NULL;
	static const Oid argtypes[12] = {TEXTOID, INT8OID, TEXTOID, TEXTOID, TEXTOID,
		JSONBOID, JSONBOID, TIMESTAMPTZOID, INT4OID, OIDOID, JSONBOID, TEXTOID};

	if (deciders)
		return OutboxPrepare(&plan_deciders,
							 ST_DECIDE("     AND (p.deciders IS NULL OR outbox._may(p.deciders, $10))"),
							 12, argtypes);
	return OutboxPrepare(&plan_open, ST_DECIDE(""), 12, argtypes);
}

/*
 * The set-based form (commit_decisions of kinds with a stream): the
 * parameters of producer.c's batch statements, arrays of run_id ($1), seq,
 * event_kind, command_id, command_kind, payload, event_payload ($7),
 * not_before, priority, the caller ($10), headers ($11) and ordering keys
 * ($12).  The diagnosis: the first decision of a kind the caller may not
 * decide, then every decision whose command id an event holds, with
 * whether it is the caller's own retry (its event and its log row match),
 * as (ord, forbidden, same) in batch order.
 */
SPIPlanPtr
OutboxStreamBatchWhyPlan(void)
{
	static SPIPlanPtr plan = NULL;
	static const Oid argtypes[12] = {TEXTARRAYOID, INT8ARRAYOID, TEXTARRAYOID,
		TEXTARRAYOID, TEXTARRAYOID, JSONBARRAYOID, JSONBARRAYOID,
	TIMESTAMPTZARRAYOID, INT4ARRAYOID, OIDOID, JSONBARRAYOID, TEXTARRAYOID};

	return OutboxPrepare(&plan,
						 "WITH u AS ("
						 "  SELECT * FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2),"
						 "                            pg_catalog.unnest($3), pg_catalog.unnest($4),"
						 "                            pg_catalog.unnest($5), pg_catalog.unnest($6))"
						 "    WITH ORDINALITY AS u(run_id, seq, event_kind, command_id, command_kind,"
						 "                         payload, ord))"
						 "SELECT * FROM ("
						 " SELECT u.ord, true AS forbidden, false AS same FROM u"
						 "  WHERE u.command_kind IN (SELECT p.kind FROM outbox.policies p"
						 "                 WHERE p.kind OPERATOR(pg_catalog.=) ANY ($5)"
						 "                   AND p.deciders IS NOT NULL"
						 "                   AND NOT outbox._may(p.deciders, $10))"
						 "  ORDER BY u.ord LIMIT 1) f "
						 "UNION ALL "
						 "SELECT * FROM ("
						 " SELECT u.ord, false,"
						 "        COALESCE(e.run_id OPERATOR(pg_catalog.=) u.run_id"
						 "             AND e.seq OPERATOR(pg_catalog.=) u.seq"
						 "             AND e.kind OPERATOR(pg_catalog.=) u.event_kind"
						 "             AND EXISTS (SELECT 1 FROM outbox._stream_log l"
						 "                          WHERE l.command_id OPERATOR(pg_catalog.=) u.command_id"
						 "                            AND l.run_id OPERATOR(pg_catalog.=) u.run_id"
						 "                            AND l.seq OPERATOR(pg_catalog.=) u.seq"
						 "                            AND l.kind OPERATOR(pg_catalog.=) u.command_kind"
						 "                            AND l.payload OPERATOR(pg_catalog.=) u.payload"
						 "                            AND l.decided_by OPERATOR(pg_catalog.=) $10), false)"
						 "   FROM u JOIN outbox.events e"
						 "     ON e.command_id OPERATOR(pg_catalog.=) u.command_id"
						 "    AND e.command_id OPERATOR(pg_catalog.=) ANY ($4)"
						 "  ORDER BY u.ord) s",
						 12, argtypes);
}

/*
 * The set-based append: every decision to the current log table, in batch
 * order (log ids taken in that order), then their events (the top
 * statement, whose count is the caller's).
 */
#define ST_BATCH_LOG_INSERT(n) \
	" l" #n " AS (" \
	"  INSERT INTO outbox.stream_log_" #n \
	"    (id, xid, stream_id, part, command_id, run_id, seq, kind, payload," \
	"     headers, ordering_key, decided_by)" \
	"  SELECT v.id, v.xid, v.stream_id, v.part, v.command_id, v.run_id, v.seq," \
	"         v.command_kind, v.payload, v.headers, v.okey, $10" \
	"    FROM v WHERE v.current OPERATOR(pg_catalog.=) " #n " RETURNING 1)"
SPIPlanPtr
OutboxStreamBatchPlan(void)
{
	static SPIPlanPtr plan = NULL;
	static const Oid argtypes[12] = {TEXTARRAYOID, INT8ARRAYOID, TEXTARRAYOID,
		TEXTARRAYOID, TEXTARRAYOID, JSONBARRAYOID, JSONBARRAYOID,
	TIMESTAMPTZARRAYOID, INT4ARRAYOID, OIDOID, JSONBARRAYOID, TEXTARRAYOID};

	return OutboxPrepare(&plan,
						 "WITH u AS ("
						 "  SELECT * FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2),"
						 "                            pg_catalog.unnest($3), pg_catalog.unnest($4),"
						 "                            pg_catalog.unnest($5), pg_catalog.unnest($6),"
						 "                            pg_catalog.unnest($7), pg_catalog.unnest($11),"
						 "                            pg_catalog.unnest($12))"
						 "    WITH ORDINALITY AS u(run_id, seq, event_kind, command_id, command_kind,"
						 "                         payload, event_payload, headers, okey, ord)),"
						 " w AS ("
						 "  SELECT u.*, s.stream_id, r.current, r.xid_base,"
						 "         (pg_catalog.hashtext(COALESCE(u.okey, u.run_id)) OPERATOR(pg_catalog.&) 2147483647)"
						 "           OPERATOR(pg_catalog.%) s.partitions AS part"
						 "    FROM u"
						 "    JOIN outbox.policies p ON p.kind OPERATOR(pg_catalog.=) u.command_kind"
						 "    JOIN outbox.streams s ON s.stream OPERATOR(pg_catalog.=) p.stream"
						 "   CROSS JOIN outbox.stream_rotation r"
						 "   ORDER BY u.ord),"
						 " v AS ("
						 "  SELECT w.*, pg_catalog.nextval('outbox.stream_log_id_seq'::pg_catalog.regclass) AS id,"
						 "         " ST_XID("w") " AS xid"
						 "    FROM w),"
						 ST_BATCH_LOG_INSERT(0) "," ST_BATCH_LOG_INSERT(1) "," ST_BATCH_LOG_INSERT(2)
						 "INSERT INTO outbox.events (run_id, seq, kind, payload, command_id)"
						 "SELECT v.run_id, v.seq, v.event_kind, v.event_payload, v.command_id FROM v",
						 12, argtypes);
}

/*
 * Why the append of a decision (args as OutboxStreamDecidePlan takes them)
 * inserted nothing: a kind the caller may not decide, the same decision
 * recorded before by the same role (its event and its command in the log),
 * or another decision holding the command id.
 */
OutboxStreamNot
OutboxStreamWhyNot(Datum *args, const char *nulls)
{
	static SPIPlanPtr plan = NULL;
	static const Oid argtypes[12] = {TEXTOID, INT8OID, TEXTOID, TEXTOID, TEXTOID,
		JSONBOID, JSONBOID, TIMESTAMPTZOID, INT4OID, OIDOID, JSONBOID, TEXTOID};
	bool		isnull;
	bool		forbidden;
	bool		stored;
	bool		same;

	if (OutboxExecute(OutboxPrepare(&plan,
									"SELECT EXISTS (SELECT 1 FROM outbox.policies p"
									"                WHERE p.kind OPERATOR(pg_catalog.=) $5"
									"                  AND p.deciders IS NOT NULL"
									"                  AND NOT outbox._may(p.deciders, $10)),"
									"       e.command_id IS NOT NULL,"
									"       COALESCE(e.run_id OPERATOR(pg_catalog.=) $1"
									"            AND e.seq OPERATOR(pg_catalog.=) $2"
									"            AND e.kind OPERATOR(pg_catalog.=) $3"
									"            AND EXISTS (SELECT 1 FROM outbox._stream_log l"
									"                         WHERE l.command_id OPERATOR(pg_catalog.=) $4"
									"                           AND l.run_id OPERATOR(pg_catalog.=) $1"
									"                           AND l.seq OPERATOR(pg_catalog.=) $2"
									"                           AND l.kind OPERATOR(pg_catalog.=) $5"
									"                           AND l.payload OPERATOR(pg_catalog.=) $6"
									"                           AND l.decided_by OPERATOR(pg_catalog.=) $10), false)"
									"  FROM (SELECT 1) one"
									"  LEFT JOIN outbox.events e ON e.command_id OPERATOR(pg_catalog.=) $4",
									12, argtypes),
					  args, nulls, false, 0) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "outbox: diagnosis of a stream decision failed");
	forbidden = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	stored = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	same = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &isnull));
	if (forbidden)
		return OUTBOX_STREAM_FORBIDDEN;
	if (!stored)
		elog(ERROR, "outbox: stream decision of \"%s\" neither inserted nor found",
			 text_to_cstring(DatumGetTextPP(args[3])));
	return same ? OUTBOX_STREAM_RETRY : OUTBOX_STREAM_CONFLICT;
}

/*
 * Refuse what a stream does not do: a not-before time (a stream's
 * commands are delivered in log order, as soon as a batch holds them).
 * elem: the decision's place in a batch, or 0.
 */
void
OutboxStreamCheckDecision(text *command_id, bool has_not_before, int elem)
{
	if (has_not_before)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 elem > 0 ?
				 errmsg("decision %d: not_before is not supported for a kind written to a stream", elem) :
				 errmsg("not_before is not supported for a kind written to a stream"),
				 errdetail("Command \"%s\" is of a kind with a stream, whose commands are delivered in log order.",
						   text_to_cstring(command_id))));
}
