/*-------------------------------------------------------------------------
 *
 * stream_log.c
 *		The stream's tables read and written from C, without a statement:
 *		the log tables' batch indexes (the tick's probes, src/stream.c, and
 *		the read of a batch, src/stream_claim.c, with the failures' primary
 *		key), the ticks' primary key (the last tick, and the ticks of a new
 *		batch), the claim's look at the stream, the subscription and its
 *		progress (their primary keys); the tick's lock of the streams' rows
 *		and the claim's of a progress row; and the rows the tick and the
 *		claim write (OutboxOpenRowWriter).
 *
 * A statement over the four log tables (outbox._stream_log) starts a plan
 * of four index scans, an append and a sort each time it runs, which costs
 * more than the rows it reads when a batch is a few commands; the reads
 * here open the tables and their indexes, take a snapshot, and scan the
 * indexes directly.
 *
 * The log tables (stream_log_0 to _2 and stream_kept) are locked before
 * any snapshot of the reads is taken (OutboxOpenStreamLogs): a rotation
 * that copies a command into stream_kept and truncates its table holds
 * that table's ACCESS EXCLUSIVE lock until it commits, so a snapshot taken
 * after the lock sees either the row or its copy, never neither (isolation
 * spec stream_tick_vs_truncate).  The tables' and indexes' shape is
 * checked when they are opened, and an index that is not valid is refused
 * (55000): it could lack rows.
 *
 * Locking: AccessShareLock on the log tables, stream_ticks,
 * stream_failures, stream_rotation, streams, subscriptions,
 * stream_progress and their indexes; RowShareLock on streams and
 * stream_progress and the tuple locks of their rows (OutboxLockStreams,
 * OutboxLockProgress); RowExclusiveLock on the tables written; all held
 * to the end of the transaction.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_index.h"
#include "executor/executor.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/xid8.h"

#include "outbox.h"

/* The log tables, with their batch indexes (stream_id, part, xid). */
#define SL_NLOGS 4

/* The columns a batch's read returns, by name, in OutboxLogRow's order. */
static const char *const sl_row_columns[] = {"command_id", "run_id", "seq", "kind", "payload",
"headers", "ordering_key"};

#define SL_ROW_COLS ((int) lengthof(sl_row_columns))

struct OutboxStreamLogs
{
	Relation	rel[SL_NLOGS];
	Relation	index[SL_NLOGS];	/* its batch index */
	IndexScanDesc scan[SL_NLOGS];	/* NULL: the table is empty */
	TupleTableSlot *slot[SL_NLOGS];
	AttrNumber	at_id[SL_NLOGS];
	AttrNumber	at_xid[SL_NLOGS];
	AttrNumber	at_row[SL_NLOGS][SL_ROW_COLS];
};

/* The attribute of rel named name; an error if it has none. */
static AttrNumber
sl_attnum(Relation rel, const char *name)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			i;

	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (!att->attisdropped && strcmp(NameStr(att->attname), name) == 0)
			return att->attnum;
	}
	elog(ERROR, "outbox: the table \"%s\" has no column \"%s\"",
		 RelationGetRelationName(rel), name);
	return InvalidAttrNumber;	/* keep the compiler quiet */
}

/*
 * sl_attnum, for a column of type type; one of another type (the
 * extension's table altered) is refused (55000).
 */
static AttrNumber
sl_attnum_typed(Relation rel, const char *name, Oid type)
{
	AttrNumber	at = sl_attnum(rel, name);

	if (TupleDescAttr(RelationGetDescr(rel), at - 1)->atttypid != type)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("column \"%s\" of relation \"outbox.%s\" is not of type %s",
						name, RelationGetRelationName(rel), format_type_be(type)),
				 errhint("The extension's tables must keep the definitions CREATE EXTENSION gave them.")));
	return at;
}

/* Refuse (55000) an index that may lack rows: it would hide them. */
static void
sl_check_valid(Relation idx, const char *name)
{
	if (!idx->rd_index->indisvalid || !idx->rd_index->indisready)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("index \"outbox.%s\" is not valid", name),
				 errhint("REINDEX INDEX outbox.%s", name)));
}

/* Open and lock (mode) the relation outbox.<name>; an error if it is missing. */
static Relation
sl_relation(const char *name, LOCKMODE mode, bool index)
{
	Oid			relid = get_relname_relid(name, get_namespace_oid("outbox", false));

	if (!OidIsValid(relid))
		elog(ERROR, "outbox: the relation outbox.%s is missing", name);
	return index ? index_open(relid, mode) : table_open(relid, mode);
}

/*
 * Open and lock outbox.<table> and its index <index> (AccessShareLock);
 * an error if either is missing.
 */
static void
sl_open(const char *table, const char *index, Relation *rel, Relation *idx)
{
	*rel = sl_relation(table, AccessShareLock, false);
	*idx = sl_relation(index, AccessShareLock, true);
	if ((*idx)->rd_index->indrelid != RelationGetRelid(*rel))
		elog(ERROR, "outbox: the index \"%s\" is not an index of outbox.%s", index, table);
}

/*
 * Open and lock the log tables and their batch indexes, before any
 * snapshot of the reads is taken (see the top of the file).
 */
OutboxStreamLogs *
OutboxOpenStreamLogs(void)
{
	static const char *const tables[SL_NLOGS] = {"stream_log_0", "stream_log_1",
	"stream_log_2", "stream_kept"};
	static const char *const indexes[SL_NLOGS] = {"stream_log_0_batch_idx",
		"stream_log_1_batch_idx", "stream_log_2_batch_idx",
	"stream_kept_batch_idx"};
	OutboxStreamLogs *logs = palloc0(sizeof(OutboxStreamLogs));
	int			i;

	for (i = 0; i < SL_NLOGS; i++)
	{
		Form_pg_index ix;
		int			c;

		sl_open(tables[i], indexes[i], &logs->rel[i], &logs->index[i]);
		logs->at_id[i] = sl_attnum(logs->rel[i], "id");
		logs->at_xid[i] = sl_attnum(logs->rel[i], "xid");
		for (c = 0; c < SL_ROW_COLS; c++)
			logs->at_row[i][c] = sl_attnum(logs->rel[i], sl_row_columns[c]);
		ix = logs->index[i]->rd_index;
		if (ix->indnkeyatts != 3 ||
			ix->indkey.values[0] != sl_attnum(logs->rel[i], "stream_id") ||
			ix->indkey.values[1] != sl_attnum(logs->rel[i], "part") ||
			ix->indkey.values[2] != logs->at_xid[i])
			elog(ERROR, "outbox: the index \"%s\" is not the stream log's batch index", indexes[i]);
		sl_check_valid(logs->index[i], indexes[i]);
	}
	return logs;
}

/*
 * Begin a scan with nkeys keys under snap of each log table that has a
 * block (a table without one has no row for any snapshot: a writer
 * extends the table before it commits).
 */
static void
sl_begin_scans(OutboxStreamLogs *logs, Snapshot snap, int nkeys)
{
	int			i;

	for (i = 0; i < SL_NLOGS; i++)
	{
		logs->scan[i] = NULL;
		logs->slot[i] = NULL;
		if (RelationGetNumberOfBlocks(logs->rel[i]) > 0)
		{
			logs->scan[i] = index_beginscan(logs->rel[i], logs->index[i], snap, nkeys, 0);
			logs->slot[i] = table_slot_create(logs->rel[i], NULL);
		}
	}
}

/* The tick's probes: their scans, under snap. */
void
OutboxBeginLogProbes(OutboxStreamLogs *logs, Snapshot snap)
{
	sl_begin_scans(logs, snap, 3);
}

void
OutboxEndLogScans(OutboxStreamLogs *logs)
{
	int			i;

	for (i = 0; i < SL_NLOGS; i++)
	{
		if (logs->scan[i] != NULL)
		{
			index_endscan(logs->scan[i]);
			ExecDropSingleTupleTableSlot(logs->slot[i]);
			logs->scan[i] = NULL;
			logs->slot[i] = NULL;
		}
	}
}

void
OutboxCloseStreamLogs(OutboxStreamLogs *logs)
{
	int			i;

	for (i = 0; i < SL_NLOGS; i++)
	{
		index_close(logs->index[i], NoLock);
		table_close(logs->rel[i], NoLock);
	}
	pfree(logs);
}

/*
 * Whether partition part of stream has a row visible in the probes'
 * snapshot in one of the log tables whose xid is >= xid (exact: equal).
 */
bool
OutboxLogPartHas(OutboxStreamLogs *logs, int32 stream, int32 part, uint64 xid, bool exact)
{
	int			i;

	for (i = 0; i < SL_NLOGS; i++)
	{
		ScanKeyData key[3];

		if (logs->scan[i] == NULL)
			continue;
		ScanKeyInit(&key[0], 1, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(stream));
		ScanKeyInit(&key[1], 2, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(part));
		ScanKeyInit(&key[2], 3,
					exact ? BTEqualStrategyNumber : BTGreaterEqualStrategyNumber,
					exact ? F_XID8EQ : F_XID8GE,
					FullTransactionIdGetDatum(FullTransactionIdFromU64(xid)));
		index_rescan(logs->scan[i], key, 3, NULL, 0);
		if (index_getnext_slot(logs->scan[i], ForwardScanDirection, logs->slot[i]))
			return true;
	}
	return false;
}

/* Whether xid is visible in snap, as pg_visible_in_snapshot(xid, snap). */
static bool
sl_visible(FullTransactionId xid, const OutboxSnapshot *snap)
{
	uint32		lo = 0;
	uint32		hi = snap->nxip;

	if (FullTransactionIdPrecedes(xid, snap->xmin))
		return true;
	if (!FullTransactionIdPrecedes(xid, snap->xmax))
		return false;
	/* the running ones are in order */
	while (lo < hi)
	{
		uint32		mid = lo + (hi - lo) / 2;

		if (FullTransactionIdEquals(snap->xip[mid], xid))
			return false;
		if (FullTransactionIdPrecedes(snap->xip[mid], xid))
			lo = mid + 1;
		else
			hi = mid;
	}
	return true;
}

static int
sl_cmp_rows(const void *a, const void *b)
{
	int64		x = ((const OutboxLogRow *) a)->id;
	int64		y = ((const OutboxLogRow *) b)->id;

	return x < y ? -1 : (x > y ? 1 : 0);
}

/*
 * Whether subscription sub has a row for command_id in stream_failures
 * (its primary key, subscription and command_id), under the scan's
 * snapshot.
 */
static bool
sl_failed(IndexScanDesc scan, TupleTableSlot *slot, text *sub, Datum command_id)
{
	ScanKeyData key[2];

	ScanKeyInit(&key[0], 1, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(sub));
	ScanKeyInit(&key[1], 2, BTEqualStrategyNumber, F_TEXTEQ, command_id);
	index_rescan(scan, key, 2, NULL, 0);
	return index_getnext_slot(scan, ForwardScanDirection, slot);
}

/*
 * The rows of partition part of stream in the log tables from sa's xmax on
 * and before sb's whose transaction sb sees committed and that have no row
 * of subscription sub in stream_failures, in log order (id), their values
 * copied; *nrows of them.  The scans' snapshot is taken here, after the
 * log tables were locked (OutboxOpenStreamLogs) and after the caller's
 * last statement: it is later than sb, so it sees every row sb sees (the
 * log's rows are removed only by a rotation, whose TRUNCATE waits for the
 * locks), and the failures the caller wrote.
 */
OutboxLogRow *
OutboxReadLogRange(OutboxStreamLogs *logs, int32 stream, int32 part,
				   const OutboxSnapshot *sa, const OutboxSnapshot *sb, text *sub,
				   int *nrows)
{
	Relation	frel;
	Relation	findex;
	IndexScanDesc fscan;
	TupleTableSlot *fslot;
	Snapshot	snap;
	OutboxLogRow *rows = NULL;
	int			n = 0;
	int			alloced = 0;
	int			i;

	sl_open("stream_failures", "stream_failures_pkey", &frel, &findex);
	if (findex->rd_index->indnkeyatts != 2 ||
		findex->rd_index->indkey.values[0] != sl_attnum(frel, "subscription") ||
		findex->rd_index->indkey.values[1] != sl_attnum(frel, "command_id"))
		elog(ERROR, "outbox: the index \"stream_failures_pkey\" is not the failures' primary key");
	snap = RegisterSnapshot(GetTransactionSnapshot());
	fscan = index_beginscan(frel, findex, snap, 2, 0);
	fslot = table_slot_create(frel, NULL);
	sl_begin_scans(logs, snap, 4);
	for (i = 0; i < SL_NLOGS; i++)
	{
		ScanKeyData key[4];
		TupleTableSlot *slot = logs->slot[i];
		TupleDesc	desc = RelationGetDescr(logs->rel[i]);

		if (logs->scan[i] == NULL)
			continue;
		ScanKeyInit(&key[0], 1, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(stream));
		ScanKeyInit(&key[1], 2, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(part));
		ScanKeyInit(&key[2], 3, BTGreaterEqualStrategyNumber, F_XID8GE,
					FullTransactionIdGetDatum(sa->xmax));
		ScanKeyInit(&key[3], 3, BTLessStrategyNumber, F_XID8LT,
					FullTransactionIdGetDatum(sb->xmax));
		index_rescan(logs->scan[i], key, 4, NULL, 0);
		while (index_getnext_slot(logs->scan[i], ForwardScanDirection, slot))
		{
			bool		isnull;
			FullTransactionId xid;
			OutboxLogRow *r;
			int			c;

			xid = DatumGetFullTransactionId(slot_getattr(slot, logs->at_xid[i], &isnull));
			if (!sl_visible(xid, sb))
				continue;
			/* (command_id is the first of the row's columns) */
			if (sl_failed(fscan, fslot, sub, slot_getattr(slot, logs->at_row[i][0], &isnull)))
				continue;
			if (n == alloced)
			{
				alloced = alloced == 0 ? 16 : 2 * alloced;
				rows = rows == NULL ? palloc(sizeof(OutboxLogRow) * alloced) :
					repalloc(rows, sizeof(OutboxLogRow) * alloced);
			}
			r = &rows[n++];
			r->id = DatumGetInt64(slot_getattr(slot, logs->at_id[i], &isnull));
			for (c = 0; c < SL_ROW_COLS; c++)
			{
				AttrNumber	at = logs->at_row[i][c];
				Form_pg_attribute att = TupleDescAttr(desc, at - 1);
				Datum		v = slot_getattr(slot, at, &r->isnull[c]);

				r->values[c] = r->isnull[c] ? (Datum) 0 :
					datumCopy(v, att->attbyval, att->attlen);
			}
		}
	}
	OutboxEndLogScans(logs);
	ExecDropSingleTupleTableSlot(fslot);
	index_endscan(fscan);
	UnregisterSnapshot(snap);
	index_close(findex, NoLock);
	table_close(frel, NoLock);
	if (n > 1)
		qsort(rows, n, sizeof(OutboxLogRow), sl_cmp_rows);
	*nrows = n;
	return rows;
}

/* A scan of one stream's ticks, in their primary key's order. */
typedef struct SlTickScan
{
	Relation	rel;
	Relation	index;
	Snapshot	snap;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	AttrNumber	at_tick;
	AttrNumber	at_snap;
	AttrNumber	at_last;
} SlTickScan;

/*
 * Begin a scan of the ticks of stream_id (from tick from on when ranged)
 * under a snapshot taken now.
 */
static void
sl_begin_ticks(SlTickScan *ts, int32 stream_id, bool ranged, int64 from)
{
	ScanKeyData key[2];

	sl_open("stream_ticks", "stream_ticks_pkey", &ts->rel, &ts->index);
	ts->at_tick = sl_attnum(ts->rel, "tick");
	ts->at_snap = sl_attnum(ts->rel, "snap");
	ts->at_last = sl_attnum(ts->rel, "last_id");
	if (ts->index->rd_index->indnkeyatts != 2 ||
		ts->index->rd_index->indkey.values[0] != sl_attnum(ts->rel, "stream_id") ||
		ts->index->rd_index->indkey.values[1] != ts->at_tick)
		elog(ERROR, "outbox: the index \"stream_ticks_pkey\" is not the ticks' primary key");
	ts->snap = RegisterSnapshot(GetTransactionSnapshot());
	ts->scan = index_beginscan(ts->rel, ts->index, ts->snap, ranged ? 2 : 1, 0);
	ts->slot = table_slot_create(ts->rel, NULL);
	ScanKeyInit(&key[0], 1, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(stream_id));
	ScanKeyInit(&key[1], 2, BTGreaterEqualStrategyNumber, F_INT8GE, Int64GetDatum(from));
	index_rescan(ts->scan, key, ranged ? 2 : 1, NULL, 0);
}

static void
sl_end_ticks(SlTickScan *ts)
{
	ExecDropSingleTupleTableSlot(ts->slot);
	index_endscan(ts->scan);
	UnregisterSnapshot(ts->snap);
	index_close(ts->index, NoLock);
	table_close(ts->rel, NoLock);
}

/*
 * The last tick of stream_id, in a snapshot taken now (the tick reads it
 * after it locked the stream's row): its number, its snapshot's xmax and
 * running transactions (palloc'd, *nxip of them); false when the stream
 * has no tick.
 */
bool
OutboxStreamLastTick(int32 stream_id, int64 *tick, uint64 *xmax, uint64 **xip, int *nxip)
{
	SlTickScan	ts;
	bool		found;

	sl_begin_ticks(&ts, stream_id, false, 0);
	found = index_getnext_slot(ts.scan, BackwardScanDirection, ts.slot);
	if (found)
	{
		bool		isnull;
		OutboxSnapshot *snap;
		uint32		i;

		*tick = DatumGetInt64(slot_getattr(ts.slot, ts.at_tick, &isnull));
		snap = (OutboxSnapshot *) PG_DETOAST_DATUM(slot_getattr(ts.slot, ts.at_snap, &isnull));
		*xmax = U64FromFullTransactionId(snap->xmax);
		*xip = palloc(sizeof(uint64) * (snap->nxip + 1));
		for (i = 0; i < snap->nxip; i++)
			(*xip)[i] = U64FromFullTransactionId(snap->xip[i]);
		*nxip = (int) snap->nxip;
	}
	sl_end_ticks(&ts);
	return found;
}

/*
 * The ticks of a new batch of stream_id whose partition's acked tick is
 * acked, in one scan of the ticks' primary key from it on, under a
 * snapshot taken now (after the partition's progress row was locked: the
 * tick its acked_tick names committed before): the batch ends at the first
 * tick whose log id is cap past the start tick's, or at the last tick (the
 * start tick itself when there is none after it).
 */
void
OutboxStreamBatchTicks(int32 stream_id, int64 acked, int64 cap, OutboxBatchTicks *t)
{
	SlTickScan	ts;
	int64		limit = 0;
	bool		started = false;
	bool		capped = false;

	sl_begin_ticks(&ts, stream_id, true, acked);
	t->last = true;
	while (index_getnext_slot(ts.scan, ForwardScanDirection, ts.slot))
	{
		bool		isnull;
		int64		tick = DatumGetInt64(slot_getattr(ts.slot, ts.at_tick, &isnull));
		int64		last_id = DatumGetInt64(slot_getattr(ts.slot, ts.at_last, &isnull));
		Datum		snapshot;

		if (capped)
		{
			/* a tick after the capped end */
			t->last = false;
			break;
		}
		snapshot = slot_getattr(ts.slot, ts.at_snap, &isnull);
		if (!started)
		{
			if (tick != acked)
				break;
			started = true;
			limit = last_id + cap;
			t->sa = (OutboxSnapshot *) PG_DETOAST_DATUM_COPY(snapshot);
			t->sb = t->sa;
			t->t_to = tick;
			continue;
		}
		if (t->sb != t->sa)
			pfree(t->sb);
		t->sb = (OutboxSnapshot *) PG_DETOAST_DATUM_COPY(snapshot);
		t->t_to = tick;
		capped = last_id >= limit;
	}
	sl_end_ticks(&ts);
	if (!started)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("tick " INT64_FORMAT " of stream %d is missing", acked, stream_id),
				 errdetail("A partition of a subscription of the stream has acked that tick; the ticks a subscription still needs are never removed by the extension.")));
}

/*
 * A snapshot taken as SPI takes one before a statement, after this
 * transaction's changes so far are made visible; registered.
 */
Snapshot
OutboxStatementSnapshot(void)
{
	CommandCounterIncrement();
	return RegisterSnapshot(GetTransactionSnapshot());
}

/*
 * Lock the row version at tid of rel (a copy of tid: the lock moves it
 * along the update chain) as FOR UPDATE SKIP LOCKED locks it, under snap,
 * into locked: its last version under READ COMMITTED, 40001 under
 * REPEATABLE READ when it changed since snap; false when another
 * transaction holds it, it is gone, or this command changed it.
 */
static bool
sl_lock_row(Relation rel, ItemPointer tid, Snapshot snap, TupleTableSlot *locked)
{
	uint8		flags = IsolationUsesXactSnapshot() ? 0 : TUPLE_LOCK_FLAG_FIND_LAST_VERSION;
	ItemPointerData at = *tid;
	TM_FailureData tmfd;
	TM_Result	res;

	res = table_tuple_lock(rel, &at, snap, locked, GetCurrentCommandId(true), LockTupleExclusive,
						   LockWaitSkip, flags, &tmfd);
	if ((res == TM_Updated || res == TM_Deleted) && IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update")));
	if (res == TM_WouldBlock || res == TM_Deleted || res == TM_SelfModified)
		return false;
	if (res != TM_Ok)
		elog(ERROR, "outbox: unexpected result %d locking a row of outbox.%s", (int) res,
			 RelationGetRelationName(rel));
	return true;
}

/* For qsort: locked streams by stream_id. */
static int
sl_cmp_stream(const void *a, const void *b)
{
	int32		x = ((const OutboxLockedStream *) a)->stream_id;
	int32		y = ((const OutboxLockedStream *) b)->stream_id;

	return (x > y) - (x < y);
}

/*
 * The tick's lock of the streams, as SELECT ... FROM outbox.streams FOR
 * UPDATE SKIP LOCKED does it: in a snapshot taken now, each row's latest
 * version is locked (FOR UPDATE's tuple lock), unless another transaction
 * holds a lock on it (skipped) or it is gone.  Returns the rows locked, in
 * stream_id order (*nlocked of them), the number of streams the snapshot
 * sees (*nall: more than *nlocked when one was skipped) and
 * outbox.stream_rotation's xid_base (read only when a row is locked).  In
 * a transaction that reads one snapshot (REPEATABLE READ, SERIALIZABLE),
 * a row changed since that snapshot is a serialization failure (40001), as
 * with the statement.
 *
 * Locking: RowShareLock on outbox.streams and the rows' tuple locks,
 * AccessShareLock on outbox.stream_rotation, to the end of the transaction.
 */
OutboxLockedStream *
OutboxLockStreams(int *nlocked, int *nall, int64 *base)
{
	Relation	rel = sl_relation("streams", RowShareLock, false);
	Snapshot	snap;
	TableScanDesc scan;
	TupleTableSlot *slot;
	TupleTableSlot *locked;
	AttrNumber	at_id;
	AttrNumber	at_parts;
	AttrNumber	at_ticks;
	OutboxLockedStream *out;
	int			cap = 8;
	int			n = 0;

	at_id = sl_attnum_typed(rel, "stream_id", INT4OID);
	at_parts = sl_attnum_typed(rel, "partitions", INT4OID);
	at_ticks = sl_attnum_typed(rel, "part_ticks", INT8ARRAYOID);
	out = palloc(sizeof(OutboxLockedStream) * cap);
	*nall = 0;
	snap = OutboxStatementSnapshot();
	scan = table_beginscan(rel, snap, 0, NULL);
	slot = table_slot_create(rel, NULL);
	locked = table_slot_create(rel, NULL);
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		ticks;

		(*nall)++;
		if (!sl_lock_row(rel, &slot->tts_tid, snap, locked))
			continue;			/* held by another, gone, or changed by us */
		if (n == cap)
		{
			cap *= 2;
			out = repalloc(out, sizeof(OutboxLockedStream) * cap);
		}
		out[n].stream_id = DatumGetInt32(slot_getattr(locked, at_id, &isnull));
		out[n].partitions = DatumGetInt32(slot_getattr(locked, at_parts, &isnull));
		ticks = slot_getattr(locked, at_ticks, &isnull);
		out[n].part_ticks = isnull ? (Datum) 0 : PointerGetDatum(PG_DETOAST_DATUM_COPY(ticks));
		out[n].tid = locked->tts_tid;
		n++;
	}
	ExecDropSingleTupleTableSlot(locked);
	ExecDropSingleTupleTableSlot(slot);
	table_endscan(scan);
	table_close(rel, NoLock);
	*base = 0;
	if (n > 0)
	{
		Relation	rot = sl_relation("stream_rotation", AccessShareLock, false);
		TableScanDesc rscan;
		TupleTableSlot *rslot;
		bool		found;
		bool		isnull;

		rscan = table_beginscan(rot, snap, 0, NULL);
		rslot = table_slot_create(rot, NULL);
		found = table_scan_getnextslot(rscan, ForwardScanDirection, rslot);
		if (found)
			*base = DatumGetInt64(slot_getattr(rslot, sl_attnum(rot, "xid_base"), &isnull));
		ExecDropSingleTupleTableSlot(rslot);
		table_endscan(rscan);
		table_close(rot, NoLock);
		if (!found)
			elog(ERROR, "outbox: outbox.stream_rotation has no row");
		qsort(out, n, sizeof(OutboxLockedStream), sl_cmp_stream);
	}
	UnregisterSnapshot(snap);
	*nlocked = n;
	return out;
}

/*
 * Rows of the stream's tables written from C (OutboxOpenRowWriter): the
 * tick's row of stream_ticks and its streams row, and a new batch's lease
 * in stream_progress, each a statement before.  A statement costs more to
 * start (its portal, snapshot and plan over the table) than the row it
 * writes, and a claim that cuts a tick ran three.  A row is written as
 * the executor's ExecSimpleRelationInsert and ExecSimpleRelationUpdate
 * write it (a logical replication worker's apply): the NOT NULL
 * constraints, the row version, its index entries (their unique checks
 * wait for a concurrent inserter and raise 23505) and the replica
 * identity's check, as the statement; the table's CHECK constraints must
 * be among those the caller names as unaffected (constraints on columns
 * it never writes, which the row it updates kept: evaluating them means
 * parsing them again on each write, more than half of an update's time).
 * A table with a trigger, a rule, row-level security, a generated column
 * or another CHECK constraint, or without the privilege, and a read-only
 * transaction, get NULL: the caller runs the statement instead (nothing
 * of this can change while the writer holds the table's lock).
 */
struct OutboxRowWriter
{
	Relation	rel;
	EState	   *estate;
	ResultRelInfo *rri;
	int			ncolumns;
	AttrNumber *attnums;		/* of the columns written, in their order */
	TupleTableSlot *slot;		/* the row written */
	TupleTableSlot *old;		/* the version an update replaces */
};

/*
 * Open outbox.<name> for rows written from C (RowExclusiveLock, kept to
 * the end of the transaction, as the statement takes it), with the
 * privilege mode; NULL when the statement must write instead.  columns are
 * those the writes give values, in that order, each of the type named (a
 * column of another type: the statement, which coerces the value or
 * refuses it); an insert names every column of the table, which would
 * otherwise take its default in the statement.  checks names the CHECK
 * constraints the writes cannot affect.  As SPI does before a statement,
 * this transaction's changes so far are made visible first.
 */
OutboxRowWriter *
OutboxOpenRowWriter(const char *name, AclMode mode, const OutboxColumn *columns, int ncolumns,
					bool insert, const char *const *checks, int nchecks)
{
	Relation	rel;
	TupleDesc	desc;
	TupleConstr *constr;
	OutboxRowWriter *w;
	MemoryContext old;
	AttrNumber *attnums;
	bool		ok;
	int			live = 0;
	int			i;

	if (XactReadOnly)
		return NULL;
	rel = sl_relation(name, RowExclusiveLock, false);
	desc = RelationGetDescr(rel);
	constr = desc->constr;
	ok = rel->rd_rel->relkind == RELKIND_RELATION && !rel->rd_rel->relispartition &&
		rel->trigdesc == NULL && rel->rd_rules == NULL && !rel->rd_rel->relrowsecurity &&
		(constr == NULL || !constr->has_generated_stored) &&
		pg_class_aclcheck(RelationGetRelid(rel), GetUserId(), mode) == ACLCHECK_OK;
	for (i = 0; ok && constr != NULL && i < constr->num_check; i++)
	{
		int			c;

		ok = false;
		for (c = 0; c < nchecks && !ok; c++)
			ok = strcmp(constr->check[i].ccname, checks[c]) == 0;
	}
	attnums = palloc(sizeof(AttrNumber) * Max(ncolumns, 1));
	for (i = 0; ok && i < ncolumns; i++)
	{
		attnums[i] = sl_attnum(rel, columns[i].name);
		ok = TupleDescAttr(desc, attnums[i] - 1)->atttypid == columns[i].type;
	}
	for (i = 0; i < desc->natts; i++)
		if (!TupleDescAttr(desc, i)->attisdropped)
			live++;
	if (!ok || (insert && live != ncolumns))
	{
		pfree(attnums);
		table_close(rel, NoLock);
		return NULL;
	}
	CommandCounterIncrement();
	w = palloc0(sizeof(OutboxRowWriter));
	w->rel = rel;
	w->ncolumns = ncolumns;
	w->attnums = attnums;
	w->estate = CreateExecutorState();
	/* (what the executor's state holds goes with it) */
	old = MemoryContextSwitchTo(w->estate->es_query_cxt);
	w->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(w->rri, rel, 0, NULL, 0);
	ExecOpenIndices(w->rri, false);
	w->slot = table_slot_create(rel, &w->estate->es_tupleTable);
	w->old = table_slot_create(rel, &w->estate->es_tupleTable);
	MemoryContextSwitchTo(old);
	w->estate->es_output_cid = GetCurrentCommandId(true);
	w->estate->es_snapshot = ActiveSnapshotSet() ? GetActiveSnapshot() : InvalidSnapshot;
	return w;
}

/* Set the writer's columns in the row to values (NULL where nulls). */
static void
sl_set(OutboxRowWriter *w, const Datum *values, const bool *nulls)
{
	int			i;

	for (i = 0; i < w->ncolumns; i++)
	{
		w->slot->tts_values[w->attnums[i] - 1] = values[i];
		w->slot->tts_isnull[w->attnums[i] - 1] = nulls[i];
	}
}

/*
 * Store the writer's row, refusing a NULL in a NOT NULL column as the
 * executor refuses it (23502).
 */
static void
sl_ready(OutboxRowWriter *w)
{
	TupleDesc	desc = RelationGetDescr(w->rel);
	int			i;

	for (i = 0; i < desc->natts; i++)
		if (w->slot->tts_isnull[i] && TupleDescAttr(desc, i)->attnotnull)
			ereport(ERROR,
					(errcode(ERRCODE_NOT_NULL_VIOLATION),
					 errmsg("null value in column \"%s\" of relation \"%s\" violates not-null constraint",
							NameStr(TupleDescAttr(desc, i)->attname),
							RelationGetRelationName(w->rel)),
					 errtablecol(w->rel, i + 1)));
	ExecStoreVirtualTuple(w->slot);
}

/* The index entries of the row just written (update: not a HOT update). */
static void
sl_index(OutboxRowWriter *w, bool update)
{
	if (w->rri->ri_NumIndices > 0)
		list_free(ExecInsertIndexTuples(w->rri, w->slot, w->estate, update, false, NULL, NIL));
	ResetPerTupleExprContext(w->estate);
}

/* Insert a row: the writer's columns (every column of the table) get values. */
void
OutboxRowInsert(OutboxRowWriter *w, const Datum *values, const bool *nulls)
{
	int			i;

	ExecClearTuple(w->slot);
	for (i = 0; i < RelationGetDescr(w->rel)->natts; i++)
		w->slot->tts_isnull[i] = true;
	sl_set(w, values, nulls);
	sl_ready(w);
	CheckCmdReplicaIdentity(w->rel, CMD_INSERT);
	simple_table_tuple_insert(w->rel, w->slot);
	sl_index(w, false);
}

/*
 * Update the row version at tid (locked by this transaction, so that no
 * one else changes it; a version that is not the last one is an error):
 * the writer's columns get values, the others keep theirs.
 */
void
OutboxRowUpdate(OutboxRowWriter *w, ItemPointer tid, const Datum *values, const bool *nulls)
{
	int			natts = RelationGetDescr(w->rel)->natts;
	bool		update_indexes;

	if (!table_tuple_fetch_row_version(w->rel, tid, SnapshotAny, w->old))
		elog(ERROR, "outbox: the row to update in \"%s\" is missing",
			 RelationGetRelationName(w->rel));
	slot_getallattrs(w->old);
	ExecClearTuple(w->slot);
	memcpy(w->slot->tts_values, w->old->tts_values, sizeof(Datum) * natts);
	memcpy(w->slot->tts_isnull, w->old->tts_isnull, sizeof(bool) * natts);
	sl_set(w, values, nulls);
	sl_ready(w);
	CheckCmdReplicaIdentity(w->rel, CMD_UPDATE);
	simple_table_tuple_update(w->rel, tid, w->slot, w->estate->es_snapshot, &update_indexes);
	if (update_indexes)
		sl_index(w, true);
}

/* Close the writer (the table's lock is kept); its rows become visible. */
void
OutboxCloseRowWriter(OutboxRowWriter *w)
{
	Relation	rel = w->rel;

	ExecCloseIndices(w->rri);
	ExecResetTupleTable(w->estate->es_tupleTable, false);
	FreeExecutorState(w->estate);
	table_close(rel, NoLock);
	pfree(w->attnums);
	pfree(w);
	CommandCounterIncrement();
}

/*
 * The claim's reads of the stream's metadata (src/stream_claim.c, steps 1
 * and 3), each a statement before: the stream's row and the
 * subscription's by their primary keys, the subscription's progress rows
 * (one per partition, by the first column of their primary key), whether
 * it has failures, and the lock of the progress row the claim picks.
 */

/* The columns of a progress row the claim reads (sl_progress_cols). */
typedef struct SlProgressCols
{
	AttrNumber	part;
	AttrNumber	batch_id;
	AttrNumber	acked_tick;
	AttrNumber	batch_to;
	AttrNumber	lease_until;
	AttrNumber	acked_at;
} SlProgressCols;

static void sl_progress_cols(Relation rel, SlProgressCols *c);
static void sl_progress_row(const SlProgressCols *cols, TupleTableSlot *slot,
							OutboxProgressRow *r);

/* An index scan of outbox.<table> by its index's first column, a text. */
typedef struct SlKeyScan
{
	Relation	rel;
	Relation	idx;
	IndexScanDesc scan;
	TupleTableSlot *slot;
} SlKeyScan;

static void
sl_key_begin(SlKeyScan *k, const char *table, const char *index, const char *column,
			 text *key, Snapshot snap)
{
	ScanKeyData sk;

	sl_open(table, index, &k->rel, &k->idx);
	if (k->idx->rd_rel->relam != BTREE_AM_OID ||
		k->idx->rd_index->indkey.values[0] != sl_attnum_typed(k->rel, column, TEXTOID) ||
		k->idx->rd_indcollation[0] != C_COLLATION_OID ||
		RelationGetIndexPredicate(k->idx) != NIL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("index \"outbox.%s\" is not a btree index beginning with column \"%s\"",
						index, column),
				 errhint("The extension's tables must keep the definitions CREATE EXTENSION gave them.")));
	sl_check_valid(k->idx, index);
	k->scan = index_beginscan(k->rel, k->idx, snap, 1, 0);
	k->slot = table_slot_create(k->rel, NULL);
	ScanKeyInit(&sk, 1, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(key));
	index_rescan(k->scan, &sk, 1, NULL, 0);
}

static bool
sl_key_next(SlKeyScan *k)
{
	return index_getnext_slot(k->scan, ForwardScanDirection, k->slot);
}

static void
sl_key_end(SlKeyScan *k)
{
	ExecDropSingleTupleTableSlot(k->slot);
	index_endscan(k->scan);
	index_close(k->idx, NoLock);
	table_close(k->rel, NoLock);
}

/*
 * Column name, of type type, of the scan's row (NULL: isnull); a value
 * passed by reference points into the scan's slot: the caller copies what
 * outlives sl_key_end.
 */
static Datum
sl_key_col(SlKeyScan *k, const char *name, Oid type, bool *isnull)
{
	Datum		d = slot_getattr(k->slot, sl_attnum_typed(k->rel, name, type), isnull);

	return *isnull ? (Datum) 0 : d;
}

/* Column name, of type type, of the scan's row, NOT NULL. */
static Datum
sl_key_req(SlKeyScan *k, const char *name, Oid type)
{
	bool		isnull;
	Datum		d = sl_key_col(k, name, type, &isnull);

	if (isnull)
		elog(ERROR, "outbox: a NULL in %s.%s", RelationGetRelationName(k->rel), name);
	return d;
}

/*
 * The stream's row and the subscription's (each found or not), the
 * subscription's progress rows in partition order, and whether it has
 * failures, under snap.
 */
void
OutboxReadClaimLook(text *stream, text *sub, Snapshot snap, OutboxClaimLook *look)
{
	SlKeyScan	k;
	SlProgressCols cols;
	int			cap = 0;
	bool		isnull;

	memset(look, 0, sizeof(OutboxClaimLook));
	sl_key_begin(&k, "streams", "streams_pkey", "stream", stream, snap);
	if (sl_key_next(&k))
	{
		look->stream_found = true;
		look->stream_id = DatumGetInt32(sl_key_req(&k, "stream_id", INT4OID));
		look->partitions = DatumGetInt32(sl_key_req(&k, "partitions", INT4OID));
		look->batch_size = DatumGetInt32(sl_key_req(&k, "batch_size", INT4OID));
		look->part_ticks = sl_key_col(&k, "part_ticks", INT8ARRAYOID, &isnull);
		if (!isnull)
			look->part_ticks = PointerGetDatum(PG_DETOAST_DATUM_COPY(look->part_ticks));
	}
	sl_key_end(&k);
	sl_key_begin(&k, "subscriptions", "subscriptions_pkey", "subscription", sub, snap);
	if (sl_key_next(&k))
	{
		look->sub_found = true;
		look->sub_stream = DatumGetTextPCopy(sl_key_req(&k, "stream", TEXTOID));
		look->claimers = sl_key_col(&k, "claimers", REGROLEARRAYOID, &isnull);
		if (!isnull)
			look->claimers = PointerGetDatum(PG_DETOAST_DATUM_COPY(look->claimers));
		look->created_at = DatumGetTimestampTz(sl_key_req(&k, "created_at", TIMESTAMPTZOID));
	}
	sl_key_end(&k);
	sl_key_begin(&k, "stream_progress", "stream_progress_pkey", "subscription", sub, snap);
	look->forced_rls = k.rel->rd_rel->relrowsecurity && k.rel->rd_rel->relforcerowsecurity;
	sl_progress_cols(k.rel, &cols);
	while (sl_key_next(&k))
	{
		OutboxProgressRow *r;

		if (look->nprogress == cap)
		{
			cap = cap == 0 ? 16 : 2 * cap;
			look->progress = look->progress == NULL ?
				palloc(sizeof(OutboxProgressRow) * cap) :
				repalloc(look->progress, sizeof(OutboxProgressRow) * cap);
		}
		r = &look->progress[look->nprogress++];
		sl_progress_row(&cols, k.slot, r);
	}
	sl_key_end(&k);
	sl_key_begin(&k, "stream_failures", "stream_failures_pkey", "subscription", sub, snap);
	look->failures = sl_key_next(&k);
	sl_key_end(&k);
}

/* Free what OutboxReadClaimLook allocated for look. */
void
OutboxFreeClaimLook(OutboxClaimLook *look)
{
	if (look->part_ticks != (Datum) 0)
		pfree(DatumGetPointer(look->part_ticks));
	if (look->claimers != (Datum) 0)
		pfree(DatumGetPointer(look->claimers));
	if (look->sub_stream != NULL)
		pfree(look->sub_stream);
	if (look->progress != NULL)
		pfree(look->progress);
	memset(look, 0, sizeof(OutboxClaimLook));
}

static void
sl_progress_cols(Relation rel, SlProgressCols *c)
{
	c->part = sl_attnum_typed(rel, "part", INT4OID);
	c->batch_id = sl_attnum_typed(rel, "batch_id", INT8OID);
	c->acked_tick = sl_attnum_typed(rel, "acked_tick", INT8OID);
	c->batch_to = sl_attnum_typed(rel, "batch_to", INT8OID);
	c->lease_until = sl_attnum_typed(rel, "lease_until", TIMESTAMPTZOID);
	c->acked_at = sl_attnum_typed(rel, "acked_at", TIMESTAMPTZOID);
}

/* A progress row's columns the claim reads (at c), from slot. */
static void
sl_progress_row(const SlProgressCols *cols, TupleTableSlot *slot, OutboxProgressRow *r)
{
	const SlProgressCols c = *cols;
	bool		isnull;

	r->part = DatumGetInt32(slot_getattr(slot, c.part, &isnull));
	r->batch_id = DatumGetInt64(slot_getattr(slot, c.batch_id, &isnull));
	r->acked_tick = DatumGetInt64(slot_getattr(slot, c.acked_tick, &isnull));
	(void) slot_getattr(slot, c.batch_to, &isnull);
	r->open = !isnull;
	r->lease_until = DatumGetTimestampTz(slot_getattr(slot, c.lease_until, &r->lease_null));
	r->acked_at = DatumGetTimestampTz(slot_getattr(slot, c.acked_at, &r->acked_null));
	r->tid = slot->tts_tid;
}

/*
 * Lock the progress row at tid as FOR UPDATE SKIP LOCKED does, under snap:
 * false when another transaction holds it, it is gone, or this command
 * changed it; else true, with *r its locked version (the last one under
 * READ COMMITTED, whose tid differs from tid when the row changed since
 * snap; a row changed since snap under REPEATABLE READ is 40001).
 */
bool
OutboxLockProgress(ItemPointer tid, Snapshot snap, OutboxProgressRow *r)
{
	Relation	rel = sl_relation("stream_progress", RowShareLock, false);
	TupleTableSlot *locked = table_slot_create(rel, NULL);
	bool		ok = sl_lock_row(rel, tid, snap, locked);

	if (ok)
	{
		SlProgressCols cols;

		sl_progress_cols(rel, &cols);
		sl_progress_row(&cols, locked, r);
	}
	ExecDropSingleTupleTableSlot(locked);
	table_close(rel, NoLock);
	return ok;
}
