/*-------------------------------------------------------------------------
 *
 * lease.c
 *		The publisher API: claim, ack (single and batch), fail, renew, and
 *		the sweep of expired leases.
 *
 * Lease protocol.  A command's token is (command_id, version).  Every state
 * change is one UPDATE whose WHERE clause holds the whole token: status =
 * 'sending', owner = the caller, version = the caller's version (for the
 * batch ack, the row's (command_id, version) is one of the caller's pairs:
 * outbox._ack_token); it bumps version.  Two holders can therefore never
 * both change a row: whichever UPDATE runs second finds a different version
 * (READ COMMITTED re-checks the WHERE clause on the newest row version) and
 * changes nothing, and the caller is told lease_not_owned.  renew extends lease_until without
 * bumping version: the holder keeps its token.
 *
 * claim locks its candidates with FOR NO KEY UPDATE SKIP LOCKED, so
 * concurrent claimers never wait for each other and never lock the same
 * row; a row is claimable when it is pending and due (commands_claim_idx)
 * or sending with an expired lease (commands_lease_idx, a takeover).
 * Expired leases are taken over only while deliveries remain and the kind's
 * takeover mode is 'auto'; the others are settled by sweep (dead, or
 * uncertain for a manual kind), which the background worker runs.
 *
 * Times.  Leases and availability are computed from the clock at the
 * moment of the call (GetCurrentTimestamp), not from the transaction start:
 * a claim inside a long transaction never hands out a lease that has
 * already expired.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relation.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_type.h"
#include "common/pg_prng.h"
#include "executor/tuptable.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "nodes/primnodes.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/relcache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_claim);
PG_FUNCTION_INFO_V1(outbox_ack);
PG_FUNCTION_INFO_V1(outbox_ack_batch);
PG_FUNCTION_INFO_V1(outbox_ack_token);
PG_FUNCTION_INFO_V1(outbox_fail);
PG_FUNCTION_INFO_V1(outbox_renew);
PG_FUNCTION_INFO_V1(outbox_sweep);

static SPIPlanPtr plan_claim = NULL;
static SPIPlanPtr plan_claim_pending = NULL;
static SPIPlanPtr plan_ack = NULL;
static SPIPlanPtr plan_ack_batch = NULL;
static SPIPlanPtr plan_ack_why = NULL;
static SPIPlanPtr plan_state = NULL;
static SPIPlanPtr plan_fail_lock = NULL;
static SPIPlanPtr plan_fail_set = NULL;
static SPIPlanPtr plan_renew = NULL;
static SPIPlanPtr plan_sweep = NULL;

/*
 * "The row is sending", for the statements that find their row by
 * command_id.  Written plainly (status = 'sending'), the test matches the
 * predicate of commands_lease_idx, and a plan made while that index is small
 * (an empty table) reads the whole index, filtering on command_id, instead
 * of probing the primary key; inside a CASE the planner cannot match it.
 */
#define LE_SENDING(alias) \
	"CASE WHEN " alias "status OPERATOR(pg_catalog.=) 'sending' THEN true ELSE false END"

/* The row's kind's max deliveries, or dflt (outbox.max_deliveries). */
#define LE_MAX_DELIVERIES(alias, dflt) \
	"COALESCE((SELECT p.max_deliveries FROM outbox.policies p" \
	"           WHERE p.kind OPERATOR(pg_catalog.=) " alias "kind), " dflt ")"

/* "The row's kind is in manual takeover mode." */
#define LE_MANUAL(alias) \
	"EXISTS (SELECT 1 FROM outbox.policies p" \
	"         WHERE p.kind OPERATOR(pg_catalog.=) " alias "kind" \
	"           AND p.takeover OPERATOR(pg_catalog.=) 'manual')"

/* The lease the caller did not name: outbox.default_lease, into *iv. */
static Datum
le_default_lease(Interval *iv)
{
	iv->time = (int64) outbox_default_lease_ms * 1000;
	iv->day = 0;
	iv->month = 0;
	return IntervalPGetDatum(iv);
}

/* Fetch and check a batch_size argument: 1 to outbox.max_batch. */
static int32
le_arg_batch(FunctionCallInfo fcinfo, int argno)
{
	int32		batch;

	OutboxArgNotNull(fcinfo, argno, "batch_size");
	batch = PG_GETARG_INT32(argno);
	if (batch < 1 || batch > outbox_max_batch)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch_size must be between 1 and %d", outbox_max_batch),
				 errdetail("The value was %d.", batch)));
	return batch;
}

/* Fetch and check a version argument (a token is at least 1). */
static int64
le_arg_version(FunctionCallInfo fcinfo, int argno)
{
	int64		v;

	OutboxArgNotNull(fcinfo, argno, "version");
	v = PG_GETARG_INT64(argno);
	if (v < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("version must be positive"),
				 errdetail("The value was " INT64_FORMAT ".", v)));
	return v;
}

/*
 * Raise lease_not_owned for (command_id, worker, version), with a detail
 * that says what the row's state is now.  Counts the refusal.
 */
static void
le_raise_not_owned(text *command_id, text *worker, int64 version)
{
	static const Oid argtypes[1] = {TEXTOID};
	Datum		args[1];
	char	   *cid = text_to_cstring(command_id);
	char	   *wname = text_to_cstring(worker);
	char	   *detail;

	args[0] = PointerGetDatum(command_id);
	if (OutboxExecute(OutboxPrepare(&plan_state,
									   "SELECT status, owner, version FROM outbox.commands"
									   " WHERE command_id OPERATOR(pg_catalog.=) $1",
									   1, argtypes),
						 args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "outbox: state lookup failed");

	if (SPI_processed == 0)
		detail = psprintf("No command with id \"%s\" exists.", cid);
	else
	{
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		char	   *status = SPI_getvalue(tup, desc, 1);
		char	   *owner = SPI_getvalue(tup, desc, 2);
		char	   *cur = SPI_getvalue(tup, desc, 3);

		if (strcmp(status, "sending") == 0 && owner != NULL &&
			strcmp(owner, wname) != 0)
			detail = psprintf("The command was taken over by worker \"%s\" (version %s).",
							  owner, cur);
		else if (strcmp(status, "sending") == 0)
			detail = psprintf("The command was claimed again (version %s).", cur);
		else if (strcmp(status, "published") == 0)
			detail = psprintf("The command is already published (version %s).", cur);
		else if (strcmp(status, "dead") == 0)
			detail = psprintf("The command is dead (version %s).", cur);
		else if (strcmp(status, "uncertain") == 0)
			detail = psprintf("The command is held as uncertain for an administrator (version %s).", cur);
		else
			detail = psprintf("The command is %s (version %s).", status, cur);
	}

	OutboxCountNow(OBC_STALE_REFUSED, 1);
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("lease_not_owned: worker \"%s\" does not hold command \"%s\" at version " INT64_FORMAT,
					wname, cid, version),
			 errdetail_internal("%s", detail)));
}

/* A row a claim leased (its RETURNING columns, deformed once), in claim order. */
#define LE_CLAIM_COLS 11		/* 7 lease columns, takeover, priority, available_at, created_at */
typedef struct LeClaimed
{
	Datum		values[LE_CLAIM_COLS];
	bool		isnull[LE_CLAIM_COLS];
	bool		takeover;
	int32		priority;
	TimestampTz available_at;
	TimestampTz created_at;
} LeClaimed;

/* qsort comparator of LeClaimed: takeovers, priority (higher first), availability, age. */
static int
le_cmp_claimed(const void *a, const void *b)
{
	const LeClaimed *x = (const LeClaimed *) a;
	const LeClaimed *y = (const LeClaimed *) b;

	if (x->takeover != y->takeover)
		return x->takeover ? -1 : 1;
	if (x->priority != y->priority)
		return x->priority > y->priority ? -1 : 1;
	if (x->available_at != y->available_at)
		return x->available_at < y->available_at ? -1 : 1;
	if (x->created_at != y->created_at)
		return x->created_at < y->created_at ? -1 : 1;
	return 0;
}

/*
 * Whether idx is the index the extension made as commands_lease_idx: a
 * B-tree on lease_until alone, without expressions, over the rows that
 * satisfy status = 'sending'.  A different index under that name (made by
 * hand) could hold fewer rows, and the probe would then miss leases.
 */
static bool
le_is_lease_index(Relation rel, Relation idx)
{
	Form_pg_index ix = idx->rd_index;
	List	   *pred;
	OpExpr	   *op;
	Node	   *left;
	Var		   *var;
	Const	   *val;

	if (idx->rd_rel->relkind != RELKIND_INDEX || idx->rd_rel->relam != BTREE_AM_OID ||
		ix->indrelid != RelationGetRelid(rel) || !ix->indisvalid || ix->indcheckxmin ||
		ix->indnatts != 1 ||
		ix->indkey.values[0] != get_attnum(RelationGetRelid(rel), "lease_until") ||
		RelationGetIndexExpressions(idx) != NIL)
		return false;
	pred = RelationGetIndexPredicate(idx);
	if (list_length(pred) != 1 || !IsA(linitial(pred), OpExpr))
		return false;
	op = linitial_node(OpExpr, pred);
	if (op->opno != TextEqualOperator || list_length(op->args) != 2)
		return false;
	/* status is of the domain command_status: text = text on (status)::text */
	left = linitial(op->args);
	if (IsA(left, RelabelType))
		left = (Node *) ((RelabelType *) left)->arg;
	if (!IsA(left, Var) || !IsA(lsecond(op->args), Const))
		return false;
	var = (Var *) left;
	val = lsecond_node(Const, op->args);
	return var->varattno == get_attnum(RelationGetRelid(rel), "status") &&
		val->consttype == TEXTOID && !val->constisnull &&
		strcmp(TextDatumGetCString(val->constvalue), "sending") == 0;
}

/*
 * Whether outbox.commands holds a sending row, visible to a snapshot taken
 * now, whose lease ended at or before now: the first entry of
 * commands_lease_idx (sending rows by lease end) up to now.  A direct index
 * probe, because a query costs more to start than the takeover part it
 * saves.  When the index is not there to look at (dropped, being swapped by
 * a concurrent rebuild, or replaced by another index of that name), the
 * answer is yes and the claim runs the statement that looks.
 */
static bool
le_any_expired(TimestampTz now)
{
	static Oid	checked_idx = InvalidOid;	/* last index le_is_lease_index passed */
	Oid			nsp = get_namespace_oid("outbox", false);
	Oid			relid = get_relname_relid("commands", nsp);
	Oid			idxid = get_relname_relid("commands_lease_idx", nsp);
	Relation	rel;
	Relation	idx;
	IndexScanDesc scan;
	ScanKeyData key;
	TupleTableSlot *slot;
	bool		found;

	if (!OidIsValid(relid) || !OidIsValid(idxid))
		return true;
	rel = table_open(relid, AccessShareLock);

	/*
	 * An index upkeep's REINDEX CONCURRENTLY may rename and drop the index
	 * between the name lookup and this lock: then look no further.  The
	 * definition is checked once per index (a rebuild makes a new one).
	 */
	idx = try_relation_open(idxid, AccessShareLock);
	if (idx == NULL)
	{
		table_close(rel, AccessShareLock);
		return true;
	}
	if (idxid != checked_idx || !idx->rd_index->indisvalid)
	{
		if (!le_is_lease_index(rel, idx))
		{
			relation_close(idx, AccessShareLock);
			table_close(rel, AccessShareLock);
			return true;
		}
		checked_idx = idxid;
	}

	/*
	 * The snapshot the claim's statement would take (in READ COMMITTED a new
	 * one, not the one the calling statement started with).
	 */
	PushActiveSnapshot(GetTransactionSnapshot());
	ScanKeyInit(&key, 1, BTLessEqualStrategyNumber, F_TIMESTAMPTZ_LE,
				TimestampTzGetDatum(now));
	slot = table_slot_create(rel, NULL);
	scan = index_beginscan(rel, idx, GetActiveSnapshot(), 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	PopActiveSnapshot();
	relation_close(idx, NoLock);
	table_close(rel, NoLock);
	return found;
}

/*
 * The two claim statements share their pending part: pd locks up to limit
 * due pending commands of the asked, unpaused kinds, in claim order; the
 * UPDATE leases the rows whose ctids are tids to $1 and returns the
 * LE_CLAIM_COLS columns, takeover saying whether the row was taken over.
 */
#define LE_CLAIM_PENDING(limit) \
	" pd AS MATERIALIZED (SELECT ARRAY(" \
	"  SELECT c.ctid FROM outbox.commands c" \
	"   WHERE c.due_at OPERATOR(pg_catalog.<=) $5" \
	"     AND ($4 IS NULL OR c.kind OPERATOR(pg_catalog.=) ANY ($4))" \
	"     AND c.kind OPERATOR(pg_catalog.<>) ALL ((SELECT COALESCE(pg_catalog.array_agg(p.kind)," \
	"            '{}') FROM outbox.policies p WHERE p.paused)::pg_catalog.text[])" \
	"   ORDER BY c.priority DESC, c.due_at, c.created_at" \
	"   LIMIT " limit \
	"   FOR NO KEY UPDATE OF c SKIP LOCKED) AS tids)"
#define LE_CLAIM_UPDATE(tids, takeover) \
	"UPDATE outbox.commands t" \
	"   SET status = 'sending', owner = $1, due_at = NULL," \
	"       lease_until = $5 OPERATOR(pg_catalog.+) COALESCE($3," \
	"           (SELECT p.lease FROM outbox.policies p" \
	"             WHERE p.kind OPERATOR(pg_catalog.=) t.kind), $6)," \
	"       version = t.version OPERATOR(pg_catalog.+) 1," \
	"       deliveries = t.deliveries OPERATOR(pg_catalog.+) 1" \
	" WHERE t.ctid OPERATOR(pg_catalog.=) ANY (" tids ")" \
	" RETURNING t.command_id, t.run_id, t.kind, t.payload, t.version," \
	"           t.deliveries, t.lease_until, " takeover "," \
	"           t.priority, t.available_at, t.created_at"

/*
 * outbox.claim(worker, batch_size, lease, kinds)
 *
 * One statement locks up to batch_size expired leases (takeovers) and then
 * as many due pending commands as the batch still has room for, and leases
 * them all to worker.  A look at commands_lease_idx comes first; when no
 * lease has expired, the statement without the takeover part runs.
 *
 * The UPDATE finds the rows the index scans locked by their ctid (a TID
 * scan), not by a second primary-key lookup of each command_id.  A locked
 * row version cannot be updated, moved or removed by anyone else until this
 * transaction ends, so its ctid stays its own.  One case differs from a
 * lookup by key: when the row was changed by a transaction that committed
 * after this statement's snapshot (and still qualifies), the locking scan
 * locks and lists its newest version, which the UPDATE's snapshot cannot
 * see, so the UPDATE leaves it alone.  The command stays as it was, locked
 * until this transaction ends, and the claim returns fewer rows than it
 * locked (that row took a place in the batch); the next claim takes it.
 * Through the API this needs a commit that makes a row claimable again
 * (fail, requeue, resolve) between the snapshot and the lock: rare, and never
 * a loss or a second lease.
 */
static Datum
le_claim(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid argtypes[7] = {TEXTOID, INT4OID, INTERVALOID, TEXTARRAYOID,
	TIMESTAMPTZOID, INTERVALOID, INT4OID};
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *worker = OutboxArgId(fcinfo, 0, "worker");
	int32		batch;
	Interval   *lease;
	Interval	default_lease;
	Datum		args[7];
	char		nulls[7] = {' ', ' ', ' ', ' ', ' ', ' ', ' '};
	int			ret;
	uint64		i;
	int64		takeovers = 0;
	LeClaimed  *order;

	batch = le_arg_batch(fcinfo, 1);
	lease = OutboxArgLease(fcinfo, 2);
	if (!PG_ARGISNULL(3))
	{
		ArrayType  *kinds = PG_GETARG_ARRAYTYPE_P(3);

		if (ARR_NDIM(kinds) > 1)
			ereport(ERROR,
					(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
					 errmsg("kinds must be a one-dimensional array")));
		if (array_contains_nulls(kinds))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("kinds must not contain nulls")));
		args[3] = PointerGetDatum(kinds);
	}
	else
		nulls[3] = 'n';

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);

	args[0] = PointerGetDatum(worker);
	args[1] = Int32GetDatum(batch);
	args[2] = lease ? IntervalPGetDatum(lease) : (Datum) 0;
	if (lease == NULL)
		nulls[2] = 'n';
	args[4] = TimestampTzGetDatum(GetCurrentTimestamp());
	args[5] = le_default_lease(&default_lease);
	args[6] = Int32GetDatum(outbox_max_deliveries);

	SPI_connect();

	/*
	 * Is any lease expired?  Usually not, and then the claim runs the plan
	 * without the takeover part (leaving its start-up and run out gave 5-7%
	 * more throughput at a batch of 10).  A lease that expires or is
	 * committed after this look is taken over by the next claim.
	 */
	if (le_any_expired(DatumGetTimestampTz(args[4])))
		ret = OutboxExecute(OutboxPrepare(&plan_claim,
										  "WITH tk AS MATERIALIZED ("
										  " SELECT COALESCE(pg_catalog.array_agg(l.tid), '{}') AS tids,"
										  "        COALESCE(pg_catalog.array_agg(l.id), '{}') AS ids FROM ("
										  "  SELECT c.ctid AS tid, c.command_id AS id FROM outbox.commands c"
										  "   WHERE c.status OPERATOR(pg_catalog.=) 'sending'"
										  "     AND c.lease_until OPERATOR(pg_catalog.<=) $5"
										  "     AND ($4 IS NULL OR c.kind OPERATOR(pg_catalog.=) ANY ($4))"
										  "     AND c.deliveries OPERATOR(pg_catalog.<) " LE_MAX_DELIVERIES("c.", "$7")
										  "     AND NOT EXISTS (SELECT 1 FROM outbox.policies p"
										  "                      WHERE p.kind OPERATOR(pg_catalog.=) c.kind"
										  "                        AND (p.paused OR p.takeover OPERATOR(pg_catalog.=) 'manual'))"
										  "   ORDER BY c.lease_until"
										  "   LIMIT $2"
										  "   FOR NO KEY UPDATE OF c SKIP LOCKED) l),"
										  LE_CLAIM_PENDING("($2 OPERATOR(pg_catalog.-) pg_catalog.cardinality((SELECT ids FROM tk)))")
										  LE_CLAIM_UPDATE("(SELECT tids FROM tk) OPERATOR(pg_catalog.||) (SELECT tids FROM pd)",
														  "t.command_id OPERATOR(pg_catalog.=) ANY ((SELECT ids FROM tk)::pg_catalog.text[])"),
										  7, argtypes),
							args, nulls, false, 0);
	else
		ret = OutboxExecute(OutboxPrepare(&plan_claim_pending,
										  "WITH" LE_CLAIM_PENDING("$2")
										  LE_CLAIM_UPDATE("(SELECT tids FROM pd)::pg_catalog.tid[]", "false"),
										  7, argtypes),
							args, nulls, false, 0);
	if (ret != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "outbox: claim failed: %s", SPI_result_code_string(ret));

	/*
	 * Hand the batch out in claim order (the UPDATE returns it in physical
	 * order): takeovers first, then by priority, availability and age.
	 */
	if (SPI_tuptable->tupdesc->natts != LE_CLAIM_COLS)
		elog(ERROR, "outbox: claim returned %d columns", SPI_tuptable->tupdesc->natts);
	order = palloc(sizeof(LeClaimed) * (SPI_processed + 1));
	for (i = 0; i < SPI_processed; i++)
	{
		LeClaimed  *c = &order[i];

		heap_deform_tuple(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, c->values, c->isnull);
		c->takeover = DatumGetBool(c->values[7]);
		c->priority = DatumGetInt32(c->values[8]);
		c->available_at = DatumGetTimestampTz(c->values[9]);
		c->created_at = DatumGetTimestampTz(c->values[10]);
		if (c->takeover)
			takeovers++;
	}
	qsort(order, SPI_processed, sizeof(LeClaimed), le_cmp_claimed);
	/* the result type has the first 7 columns */
	for (i = 0; i < SPI_processed; i++)
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, order[i].values, order[i].isnull);
	OutboxCountAtCommit(OBC_CLAIMED, (int64) SPI_processed);
	if (takeovers > 0)
		OutboxCountAtCommit(OBC_TAKEN_OVER, takeovers);
	SPI_finish();

	return (Datum) 0;
}

/* outbox.claim: the body, as the owner, told who called. */
Datum
outbox_claim(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, le_claim);
}

/* outbox.ack(command_id, worker, version): mark one leased command published. */
static Datum
le_ack(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid argtypes[4] = {TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID};
	text	   *command_id = OutboxArgId(fcinfo, 0, "command_id");
	text	   *worker = OutboxArgId(fcinfo, 1, "worker");
	int64		version = le_arg_version(fcinfo, 2);
	Datum		args[4];
	int			ret;

	args[0] = PointerGetDatum(command_id);
	args[1] = PointerGetDatum(worker);
	args[2] = Int64GetDatum(version);
	args[3] = TimestampTzGetDatum(GetCurrentTimestamp());

	SPI_connect();
	ret = OutboxExecute(OutboxPrepare(&plan_ack,
										 "UPDATE outbox.commands"
										 "   SET status = 'published', published_at = $4, lease_until = NULL,"
										 "       version = version OPERATOR(pg_catalog.+) 1"
										 " WHERE command_id OPERATOR(pg_catalog.=) $1"
										 "   AND owner OPERATOR(pg_catalog.=) $2"
										 "   AND version OPERATOR(pg_catalog.=) $3"
										 "   AND " LE_SENDING(""),
										 4, argtypes),
						   args, NULL, false, 0);
	if (ret != SPI_OK_UPDATE)
		elog(ERROR, "outbox: ack failed: %s", SPI_result_code_string(ret));
	if (SPI_processed != 1)
		le_raise_not_owned(command_id, worker, version);
	SPI_finish();

	OutboxCountAtCommit(OBC_ACKED, 1);
	PG_RETURN_VOID();
}

/* outbox.ack: the body, as the owner, told who called. */
Datum
outbox_ack(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, le_ack);
}

/*
 * A token (command_id, version): one the batch ack's UPDATE took (used: it
 * was matched to an input already), or one of the pairs _ack_token tests.
 */
typedef struct LeTaken
{
	text	   *id;
	int64		version;
	bool		used;
} LeTaken;

/* qsort/bsearch comparator of LeTaken by (id, version). */
static int
le_cmp_taken(const void *a, const void *b)
{
	const LeTaken *x = (const LeTaken *) a;
	const LeTaken *y = (const LeTaken *) b;
	int			c = OutboxCompareIds(x->id, y->id);

	if (c != 0)
		return c;
	return (x->version > y->version) - (x->version < y->version);
}

/*
 * Why a batch ack did not take: the state of the row as it is now, in the
 * words of ack_result.reason.
 */
static const char *
le_reason(HeapTuple tup, TupleDesc desc, const char *worker)
{
	char	   *status = SPI_getvalue(tup, desc, 2);	/* NULL: no such row */
	char	   *owner;

	if (status == NULL)
		return "unknown_command";
	if (strcmp(status, "sending") != 0)
		return status;
	owner = SPI_getvalue(tup, desc, 3);
	if (owner == NULL || strcmp(owner, worker) != 0)
		return "taken_over";
	return "stale_version";
}

/*
 * outbox._ack_token(command_ids, versions, command_id, version): whether
 * (command_id, version) is one of the pairs of the two arrays.  The batch
 * ack's UPDATE tests each row with it, so that the statement reads the
 * rows by key alone (an index scan of commands_pkey, the arrays' keys) and
 * joins nothing: no plan of it can read the table once per element or the
 * elements once per row.  The test holds when the row is re-read after a
 * concurrent update (its new version no longer matches).
 *
 * Inside the batch ack's UPDATE (le_ack_batch_call set, its arrays passed
 * as parameters) the pairs are sorted once per call of outbox.ack, kept in
 * fn_extra, and each row costs a binary search.  Anywhere else each call
 * sorts its own arrays: a parameter is not always the same value for the
 * life of an expression (PL/pgSQL keeps a simple expression's state, and so
 * fn_extra, across the assignments of its variables).  Null elements match
 * nothing.
 */
typedef struct LeTokenSet
{
	uint64		call;			/* le_ack_batch_call it was built for */
	int			n;
	LeTaken    *pairs;			/* sorted by le_cmp_taken */
} LeTokenSet;

/* Which call of outbox.ack (batch) is running its UPDATE; 0: none. */
static uint64 le_ack_batch_call = 0;
static uint64 le_ack_batch_calls = 0;

/*
 * The elements of a batch ack's two arrays, checked to be one-dimensional
 * and of the same length (2202E otherwise).  Returns their number.
 */
static int
le_token_arrays(ArrayType *ids, ArrayType *versions, Datum **id_elems,
				bool **id_nulls, Datum **v_elems, bool **v_nulls)
{
	int			nids;
	int			nvers;

	if (ARR_NDIM(ids) > 1 || ARR_NDIM(versions) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("command_ids and versions must be one-dimensional arrays")));
	deconstruct_array(ids, TEXTOID, -1, false, TYPALIGN_INT, id_elems, id_nulls, &nids);
	deconstruct_array(versions, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
					  v_elems, v_nulls, &nvers);
	if (nids != nvers)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("command_ids and versions must have the same length"),
				 errdetail("command_ids has %d elements and versions has %d.", nids, nvers)));
	return nids;
}

static LeTokenSet *
le_token_set(ArrayType *ids, ArrayType *versions)
{
	LeTokenSet *set = palloc(sizeof(LeTokenSet));
	Datum	   *id_elems;
	bool	   *id_nulls;
	Datum	   *v_elems;
	bool	   *v_nulls;
	int			nids = le_token_arrays(ids, versions, &id_elems, &id_nulls, &v_elems, &v_nulls);
	int			i;

	set->call = 0;
	set->pairs = palloc(sizeof(LeTaken) * (nids + 1));
	set->n = 0;
	for (i = 0; i < nids; i++)
	{
		if (id_nulls[i] || v_nulls[i])
			continue;
		set->pairs[set->n].id = DatumGetTextPP(id_elems[i]);
		set->pairs[set->n].version = DatumGetInt64(v_elems[i]);
		set->pairs[set->n].used = false;
		set->n++;
	}
	qsort(set->pairs, set->n, sizeof(LeTaken), le_cmp_taken);
	return set;
}

Datum
outbox_ack_token(PG_FUNCTION_ARGS)
{
	LeTokenSet *set = (LeTokenSet *) fcinfo->flinfo->fn_extra;
	LeTaken		key;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2) || PG_ARGISNULL(3))
		PG_RETURN_BOOL(false);
	if (le_ack_batch_call == 0 || set == NULL || set->call != le_ack_batch_call)
	{
		if (le_ack_batch_call != 0 &&
			get_fn_expr_arg_stable(fcinfo->flinfo, 0) &&
			get_fn_expr_arg_stable(fcinfo->flinfo, 1))
		{
			MemoryContext old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);

			if (set != NULL)
			{
				pfree(set->pairs);
				pfree(set);
			}
			set = le_token_set(PG_GETARG_ARRAYTYPE_P_COPY(0), PG_GETARG_ARRAYTYPE_P_COPY(1));
			set->call = le_ack_batch_call;
			fcinfo->flinfo->fn_extra = set;
			MemoryContextSwitchTo(old);
		}
		else
			set = le_token_set(PG_GETARG_ARRAYTYPE_P(0), PG_GETARG_ARRAYTYPE_P(1));
	}
	key.id = PG_GETARG_TEXT_PP(2);
	key.version = PG_GETARG_INT64(3);
	PG_RETURN_BOOL(bsearch(&key, set->pairs, set->n, sizeof(LeTaken), le_cmp_taken) != NULL);
}

/*
 * outbox.ack(worker, command_ids, versions): the batch form.  One UPDATE
 * takes the rows that hold exactly one of the (id, version) tokens: it
 * reads them by key (commands_pkey, command_id = ANY) and tests each with
 * outbox._ack_token.  A second query, run only when some did not take,
 * says why for those; it joins the ids to their rows as a hash join (see
 * OutboxExecuteHashJoin).  The UPDATE tests the status with LE_SENDING:
 * written plainly, the test would match the predicate of
 * commands_lease_idx, and the planner could read the rows from a scan of
 * that whole index.
 */
static Datum
le_ack_batch(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid argtypes[4] = {TEXTOID, TEXTARRAYOID, INT8ARRAYOID, TIMESTAMPTZOID};
	static const Oid why_types[1] = {TEXTARRAYOID};
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *worker = OutboxArgId(fcinfo, 0, "worker");
	char	   *wname = NULL;
	ArrayType  *ids;
	ArrayType  *versions;
	Datum	   *id_elems;
	bool	   *id_nulls;
	Datum	   *v_elems;
	bool	   *v_nulls;
	int			nids;
	int			i;
	Datum		args[4];
	int			ret;
	uint64		nacked;
	LeTaken    *taken;
	bool	   *acked;
	int64		nok = 0;
	HeapTuple  *why = NULL;
	TupleDesc	why_desc = NULL;

	OutboxArgNotNull(fcinfo, 1, "command_ids");
	OutboxArgNotNull(fcinfo, 2, "versions");
	ids = PG_GETARG_ARRAYTYPE_P(1);
	versions = PG_GETARG_ARRAYTYPE_P(2);
	nids = le_token_arrays(ids, versions, &id_elems, &id_nulls, &v_elems, &v_nulls);
	if (nids > outbox_max_batch)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("too many commands in one ack"),
				 errdetail("The call has %d commands; outbox.max_batch is %d.",
						   nids, outbox_max_batch)));
	for (i = 0; i < nids; i++)
	{
		if (id_nulls[i] || v_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("command_ids and versions must not contain nulls"),
					 errdetail("Element %d is null.", i + 1)));
		OutboxCheckId(DatumGetTextPP(id_elems[i]), "command_id");
		if (DatumGetInt64(v_elems[i]) < 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("version must be positive"),
					 errdetail("Element %d is " INT64_FORMAT ".", i + 1,
							   DatumGetInt64(v_elems[i]))));
	}

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (nids == 0)
		return (Datum) 0;

	args[0] = PointerGetDatum(worker);
	args[1] = PointerGetDatum(ids);
	args[2] = PointerGetDatum(versions);
	args[3] = TimestampTzGetDatum(GetCurrentTimestamp());

	SPI_connect();
	le_ack_batch_call = ++le_ack_batch_calls;
	PG_TRY();
	{
		ret = OutboxExecute(OutboxPrepare(&plan_ack_batch,
										  "UPDATE outbox.commands t"
										  "   SET status = 'published', published_at = $4, lease_until = NULL,"
										  "       version = t.version OPERATOR(pg_catalog.+) 1"
										  " WHERE t.command_id OPERATOR(pg_catalog.=) ANY ($2)"
										  "   AND t.owner OPERATOR(pg_catalog.=) $1"
										  "   AND " LE_SENDING("t.")
										  "   AND outbox._ack_token($2, $3, t.command_id, t.version)"
										  " RETURNING t.command_id, t.version OPERATOR(pg_catalog.-) 1",
										  4, argtypes),
							args, NULL, false, 0);
	}
	PG_FINALLY();
	{
		le_ack_batch_call = 0;
	}
	PG_END_TRY();
	if (ret != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "outbox: batch ack failed: %s", SPI_result_code_string(ret));

	/*
	 * Which inputs took: look each (id, version) up among the sorted tokens
	 * the UPDATE returned.  A token is used up by its first occurrence, so a
	 * pair repeated in the input is acked once (the repeat reports the row's
	 * new state, published).
	 */
	nacked = SPI_processed;
	taken = palloc(sizeof(LeTaken) * (nacked + 1));
	for (i = 0; i < (int) nacked; i++)
	{
		bool		isnull;

		taken[i].id = DatumGetTextPP(SPI_getbinval(SPI_tuptable->vals[i],
												   SPI_tuptable->tupdesc, 1, &isnull));
		taken[i].version = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
													   SPI_tuptable->tupdesc, 2, &isnull));
		taken[i].used = false;
	}
	qsort(taken, nacked, sizeof(LeTaken), le_cmp_taken);
	acked = palloc(sizeof(bool) * nids);
	for (i = 0; i < nids; i++)
	{
		LeTaken		key;
		LeTaken    *hit = NULL;

		key.id = DatumGetTextPP(id_elems[i]);
		key.version = DatumGetInt64(v_elems[i]);
		if (nacked > 0)
			hit = bsearch(&key, taken, nacked, sizeof(LeTaken), le_cmp_taken);
		acked[i] = (hit != NULL && !hit->used);
		if (acked[i])
		{
			hit->used = true;
			nok++;
		}
	}

	/* Only when some did not take: read their state to say why. */
	if (nok < nids)
	{
		Datum		why_args[1];

		wname = text_to_cstring(worker);
		why_args[0] = PointerGetDatum(ids);
		if (OutboxExecuteHashJoin(OutboxPrepare(&plan_ack_why,
										   "SELECT i.ord, c.status, c.owner"
										   "  FROM pg_catalog.unnest($1) WITH ORDINALITY AS i(command_id, ord)"
										   "  LEFT JOIN outbox.commands c"
										   "         ON c.command_id OPERATOR(pg_catalog.=) i.command_id"
										   "        AND c.command_id OPERATOR(pg_catalog.=) ANY ($1)",
										   1, why_types),
							 why_args, NULL, false, 0) != SPI_OK_SELECT ||
			SPI_processed != (uint64) nids)
			elog(ERROR, "outbox: batch ack diagnosis failed");

		/*
		 * One row per element, put in place by its ordinality (the query has
		 * no ORDER BY: a sort would let the planner weigh a nested loop,
		 * which keeps the elements' order, against the hash join).
		 */
		why = palloc0(sizeof(HeapTuple) * nids);
		for (i = 0; i < nids; i++)
		{
			bool		isnull;
			int64		ord = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
														   SPI_tuptable->tupdesc, 1, &isnull));

			if (isnull || ord < 1 || ord > nids || why[ord - 1] != NULL)
				elog(ERROR, "outbox: batch ack diagnosis failed");
			why[ord - 1] = SPI_tuptable->vals[i];
		}
		why_desc = SPI_tuptable->tupdesc;
	}

	for (i = 0; i < nids; i++)
	{
		Datum		values[3];
		bool		isnull[3] = {false, false, false};

		values[0] = id_elems[i];
		values[1] = BoolGetDatum(acked[i]);
		if (acked[i])
		{
			values[2] = (Datum) 0;
			isnull[2] = true;
		}
		else
			values[2] = CStringGetTextDatum(le_reason(why[i], why_desc, wname));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, isnull);
	}
	SPI_finish();

	OutboxCountAtCommit(OBC_ACKED, nok);
	OutboxCountNow(OBC_STALE_REFUSED, nids - nok);
	return (Datum) 0;
}

/* outbox.ack (batch form): the body, as the owner, told who called. */
Datum
outbox_ack_batch(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, le_ack_batch);
}

/*
 * Backoff before retry number `deliveries`: base * 2^(deliveries - 1),
 * capped at max, then "equal jitter" (a random point in the upper half), so
 * a burst of failures does not come back as a burst.
 */
static int64
le_backoff_usec(int32 deliveries, int64 base_usec, int64 max_usec)
{
	double		delay = (double) base_usec;
	int			k;

	for (k = 1; k < deliveries && delay < (double) max_usec; k++)
		delay *= 2.0;
	if (delay > (double) max_usec)
		delay = (double) max_usec;
	return (int64) (delay / 2.0 + pg_prng_double(&pg_global_prng_state) * delay / 2.0);
}

/*
 * A backoff of the kind's policy (seconds, from date_part) in microseconds,
 * kept between 0 and 100 years: set_policy refuses longer ones, and the
 * clamp keeps a policy row written by other means from overflowing the
 * conversion or the new available_at.
 */
static int64
le_backoff_policy_usec(double seconds)
{
	double		usec = seconds * (double) USECS_PER_SEC;
	double		limit = (double) INT64CONST(36525) * (double) USECS_PER_DAY;

	if (!(usec > 0.0))			/* negative, or NaN */
		return 0;
	if (usec > limit)
		return (int64) limit;
	return (int64) usec;
}

/*
 * outbox.fail(command_id, worker, version, error, fatal)
 *
 * Lock the row by its token, then decide in C: dead when the failure is
 * fatal or the deliveries are used up, otherwise pending again after a
 * backoff.  Returns the new status.
 */
static Datum
le_fail(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid lock_types[3] = {TEXTOID, TEXTOID, INT8OID};
	static const Oid set_types[4] = {TEXTOID, TIMESTAMPTZOID, TEXTOID, INT8OID};
	text	   *command_id = OutboxArgId(fcinfo, 0, "command_id");
	text	   *worker = OutboxArgId(fcinfo, 1, "worker");
	int64		version = le_arg_version(fcinfo, 2);
	text	   *error;
	bool		fatal;
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	int32		deliveries;
	int32		max_deliveries;
	int64		base_usec;
	int64		max_usec;
	bool		dead;
	TimestampTz now = GetCurrentTimestamp();

	OutboxArgNotNull(fcinfo, 3, "error");
	error = PG_GETARG_TEXT_PP(3);
	/* Cut a long error at a character boundary, never inside one. */
	if (VARSIZE_ANY_EXHDR(error) > OUTBOX_MAX_ERROR_LEN)
		error = cstring_to_text_with_len(VARDATA_ANY(error),
										 pg_mbcliplen(VARDATA_ANY(error),
													  VARSIZE_ANY_EXHDR(error),
													  OUTBOX_MAX_ERROR_LEN));
	OutboxArgNotNull(fcinfo, 4, "fatal");
	fatal = PG_GETARG_BOOL(4);

	args[0] = PointerGetDatum(command_id);
	args[1] = PointerGetDatum(worker);
	args[2] = Int64GetDatum(version);

	SPI_connect();
	if (OutboxExecute(OutboxPrepare(&plan_fail_lock,
									   "SELECT c.deliveries, p.max_deliveries,"
									   "       pg_catalog.date_part('epoch', p.backoff_base),"
									   "       pg_catalog.date_part('epoch', p.backoff_max)"
									   "  FROM outbox.commands c"
									   "  LEFT JOIN outbox.policies p ON p.kind OPERATOR(pg_catalog.=) c.kind"
									   " WHERE c.command_id OPERATOR(pg_catalog.=) $1"
									   "   AND c.owner OPERATOR(pg_catalog.=) $2"
									   "   AND c.version OPERATOR(pg_catalog.=) $3"
									   "   AND " LE_SENDING("c.")
									   "   FOR NO KEY UPDATE OF c",
									   3, lock_types),
						 args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "outbox: fail lookup failed");
	if (SPI_processed != 1)
		le_raise_not_owned(command_id, worker, version);

	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	deliveries = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
	max_deliveries = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
	if (isnull)
		max_deliveries = outbox_max_deliveries;
	base_usec = le_backoff_policy_usec(DatumGetFloat8(SPI_getbinval(tup, desc, 3, &isnull)));
	if (isnull)
		base_usec = (int64) outbox_backoff_base_ms * 1000;
	max_usec = le_backoff_policy_usec(DatumGetFloat8(SPI_getbinval(tup, desc, 4, &isnull)));
	if (isnull)
		max_usec = (int64) outbox_backoff_max_ms * 1000;

	dead = fatal || deliveries >= max_deliveries;

	/* $1 stays the command_id; $2 is the new available_at, NULL when the command goes to dead. */
	args[1] = (Datum) 0;
	if (dead)
		nulls[1] = 'n';
	else
		args[1] = TimestampTzGetDatum(now + le_backoff_usec(deliveries, base_usec, max_usec));
	args[2] = PointerGetDatum(error);
	args[3] = Int64GetDatum(version);
	if (OutboxExecute(OutboxPrepare(&plan_fail_set,
									   "UPDATE outbox.commands"
									   "   SET status = CASE WHEN $2 IS NULL THEN 'dead' ELSE 'pending' END,"
									   "       last_error = $3, lease_until = NULL,"
									   "       owner = CASE WHEN $2 IS NULL THEN owner END,"
									   "       available_at = COALESCE($2, available_at),"
									   "       due_at = $2,"
									   "       version = version OPERATOR(pg_catalog.+) 1"
									   " WHERE command_id OPERATOR(pg_catalog.=) $1"
									   "   AND version OPERATOR(pg_catalog.=) $4",
									   4, set_types),
						 args, nulls, false, 0) != SPI_OK_UPDATE || SPI_processed != 1)
		elog(ERROR, "outbox: fail update failed");
	SPI_finish();

	OutboxCountAtCommit(OBC_FAILED, 1);
	if (dead)
		OutboxCountAtCommit(OBC_DEAD_LETTERED, 1);
	PG_RETURN_TEXT_P(cstring_to_text(dead ? "dead" : "pending"));
}

/* outbox.fail: the body, as the owner, told who called. */
Datum
outbox_fail(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, le_fail);
}

/*
 * outbox.renew(command_id, worker, version, lease): extend the lease held
 * with this token to now + lease.  Accepted while the token is current,
 * even if the lease has run out and nobody took the command over yet.
 */
static Datum
le_renew(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid argtypes[6] = {TEXTOID, TEXTOID, INT8OID, TIMESTAMPTZOID,
	INTERVALOID, INTERVALOID};
	text	   *command_id = OutboxArgId(fcinfo, 0, "command_id");
	text	   *worker = OutboxArgId(fcinfo, 1, "worker");
	int64		version = le_arg_version(fcinfo, 2);
	Interval   *lease = OutboxArgLease(fcinfo, 3);
	Interval	default_lease;
	Datum		args[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	bool		isnull;
	Datum		until;

	args[0] = PointerGetDatum(command_id);
	args[1] = PointerGetDatum(worker);
	args[2] = Int64GetDatum(version);
	args[3] = TimestampTzGetDatum(GetCurrentTimestamp());
	args[4] = lease ? IntervalPGetDatum(lease) : (Datum) 0;
	if (lease == NULL)
		nulls[4] = 'n';
	args[5] = le_default_lease(&default_lease);

	SPI_connect();
	if (OutboxExecute(OutboxPrepare(&plan_renew,
									   "UPDATE outbox.commands t"
									   "   SET lease_until = $4 OPERATOR(pg_catalog.+) COALESCE($5,"
									   "           (SELECT p.lease FROM outbox.policies p"
									   "             WHERE p.kind OPERATOR(pg_catalog.=) t.kind), $6)"
									   " WHERE t.command_id OPERATOR(pg_catalog.=) $1"
									   "   AND t.owner OPERATOR(pg_catalog.=) $2"
									   "   AND t.version OPERATOR(pg_catalog.=) $3"
									   "   AND " LE_SENDING("t.")
									   " RETURNING t.lease_until",
									   6, argtypes),
						 args, nulls, false, 0) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "outbox: renew failed");
	if (SPI_processed != 1)
		le_raise_not_owned(command_id, worker, version);
	until = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	SPI_finish();

	PG_RETURN_DATUM(until);
}

/* outbox.renew: the body, as the owner, told who called. */
Datum
outbox_renew(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, le_renew);
}

/*
 * outbox.sweep(batch_size): settle up to batch_size expired leases that
 * claim will not take over: to dead when the deliveries are used up, to
 * uncertain when the kind's takeover mode is manual.  Returns the number of
 * commands settled.  The UPDATE finds the rows it locked by their ctid (a
 * TID scan, the only plan there is), not through a join with
 * outbox.commands that a planner misled by the table's statistics could turn
 * into a read of the whole table.  As in claim, a row that a transaction
 * committed after the statement's snapshot changed is locked in its newest
 * version but not settled; the count is short, and the next sweep settles
 * it.
 */
static Datum
le_sweep(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid argtypes[3] = {INT4OID, TIMESTAMPTZOID, INT4OID};
	int32		batch;
	Datum		args[3];
	uint64		i;
	int64		dead = 0;
	uint64		n;

	batch = le_arg_batch(fcinfo, 0);
	args[0] = Int32GetDatum(batch);
	args[1] = TimestampTzGetDatum(GetCurrentTimestamp());
	args[2] = Int32GetDatum(outbox_max_deliveries);

	SPI_connect();
	if (OutboxExecute(OutboxPrepare(&plan_sweep,
									   "WITH x AS MATERIALIZED (SELECT ARRAY("
									   "  SELECT c.ctid FROM outbox.commands c"
									   "   WHERE c.status OPERATOR(pg_catalog.=) 'sending'"
									   "     AND c.lease_until OPERATOR(pg_catalog.<=) $2"
									   "     AND (c.deliveries OPERATOR(pg_catalog.>=) " LE_MAX_DELIVERIES("c.", "$3")
									   "          OR " LE_MANUAL("c.") ")"
									   "   ORDER BY c.lease_until"
									   "   LIMIT $1"
									   "   FOR NO KEY UPDATE OF c SKIP LOCKED) AS tids)"
									   "UPDATE outbox.commands t"
									   "   SET status = CASE WHEN " LE_MANUAL("t.") " THEN 'uncertain' ELSE 'dead' END,"
									   "       last_error = CASE WHEN " LE_MANUAL("t.")
									   "         THEN pg_catalog.format('lease of worker %s expired; kind %s needs a manual takeover',"
									   "                                t.owner, t.kind)"
									   "         ELSE pg_catalog.format('lease of worker %s expired after %s deliveries',"
									   "                                t.owner, t.deliveries) END,"
									   "       lease_until = NULL,"
									   "       version = t.version OPERATOR(pg_catalog.+) 1"
									   " WHERE t.ctid OPERATOR(pg_catalog.=) ANY ((SELECT tids FROM x)::pg_catalog.tid[])"
									   " RETURNING t.status",
									   3, argtypes),
						 args, NULL, false, 0) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "outbox: sweep failed");
	n = SPI_processed;
	for (i = 0; i < n; i++)
	{
		char	   *status = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);

		if (strcmp(status, "dead") == 0)
			dead++;
	}
	SPI_finish();

	OutboxCountAtCommit(OBC_DEAD_LETTERED, dead);
	PG_RETURN_INT32((int32) n);
}

/* outbox.sweep: the body, as the owner, told who called. */
Datum
outbox_sweep(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, le_sweep);
}
