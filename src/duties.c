/*-------------------------------------------------------------------------
 *
 * duties.c
 *		The per-database worker's duties, in one table.
 *
 * Each duty is one entry of OutboxDuties (outbox.h, OutboxDuty): a name, the
 * setting that spaces its turns, the function that runs one bounded step,
 * and its budget of steps per turn.  The loop (worker.c) gives a duty a
 * turn when its next time has come, runs steps while the step asks for
 * more and the budget allows, answering signals, DDL and wake-ups between
 * two steps, and sleeps until the earliest next time in the table.  Adding
 * a duty is one entry and one function (docs/worker.md has an example).
 * Every step runs fixed SQL text, never SQL read from a table, each in its
 * own short transaction with a saved plan (OutboxRunTransaction: an error
 * is logged and shown in outbox.workers, and the worker carries on).
 *
 * sweep		Settle expired leases (outbox.sweep: dead when the deliveries
 *				are used up, uncertain for a manual kind), a batch of
 *				outbox.purge_batch per step while batches come back full.
 * purge		Purge by the retention rule (outbox.purge), likewise; after a
 *				purge that found nothing the next waits WK_PURGE_IDLE_ROUNDS
 *				naps (or a reload).  Sweep and purge share the round's time
 *				budget of one nap.
 * due			Look at what became claimable with no commit to announce it
 *				(a not_before or retry backoff reaching its time, a lease
 *				expiring) and when the next will, and raise the wake-up flag
 *				if anything did.  Every nap, at most every DU_CHECK_MS, and
 *				when something reaches its time (then after a sweep).
 * index		Every outbox.index_check_interval, measure the indexes of the
 *				tables rows leave and start an upkeep worker when one is
 *				mostly empty (upkeep.c); while it runs, stop it when anyone
 *				waits for a lock it holds.
 * checks		Every outbox.check_interval, count the rows of each
 *				conservation check into outbox.check_results (SQL
 *				outbox._check_run), one check per step and transaction, so that
 *				wake-ups and signals are answered between two checks; the
 *				metrics read the counts (outbox.metrics_checks).  A count
 *				reads its tables whole (under a second per million
 *				commands): DDL that comes during one waits for that one.
 * streams		At a wake-up after a transaction that appended to a stream
 *				committed (the slot's stream_pending, raised at its commit,
 *				shared.c), cut a tick of each stream with commands its last
 *				tick does not see (OutboxStreamTick, src/stream.c;
 *				docs/streams.md) and send the pending wake-up from the same
 *				transaction (under the notify duty's rules: held back, it is
 *				left to that duty); and every outbox.naptime, as a backstop (a
 *				prepared transaction from before a restart, rows restored
 *				by hand).  Any other wake-up runs no transaction for it: the
 *				row path's wake-ups do not wait for a tick.
 * rotate		Every outbox.naptime, the stream partitions that got no
 *				commands since their acked tick move on to the last tick
 *				(SQL outbox._stream_move_on; a claim that finds nothing
 *				writes nothing), then one step of the stream log's rotation
 *				(SQL outbox._stream_rotate: truncate a log table whose
 *				commands are all done, or switch the appends to the next).
 * citus_keys	On a worker node of a distributed outbox, once: bring the
 *				node's copies of the tables to the distributed outbox's keys
 *				(SQL outbox._citus_keys) if they have a single server's.  A
 *				node added after outbox.distribute() gets the extension from
 *				Citus as CREATE EXTENSION makes it (docs/citus.md).
 * notify		Send the pending wake-up: one NOTIFY on outbox.notify_channel
 *				from the worker's own transaction, at most one per
 *				outbox.notify_interval (a commit arriving sooner leaves the
 *				flag up, and the notification goes out when the interval
 *				ends, covering every commit in between), unless a claim of
 *				every kind has found nothing since the last one: a
 *				publisher is waiting,
 *				and the notification goes out at once (at most one per
 *				outbox.notify_idle_interval; shared.c, "Waiting
 *				publishers").
 *
 * The release's wake-up.  A commit that released an ordering key's next
 * command (keys.c) raises the slot's release_pending instead of a wake-up:
 * the notify duty then sets the due check's next look at
 * outbox.notify_interval from now, and that look wakes the publishers only
 * if the released command is still claimable (the one that acked its
 * predecessor claims again at once and usually takes it first).  With
 * one hot key and several publishers, every ack would otherwise wake the
 * idle ones for an empty claim each.  The look finds the command however
 * late its transaction commits, by the due floor below.
 *
 * The due check.  Commands also become claimable with no commit to announce
 * them.  The check looks for them cheaply in the two claim indexes (per
 * priority, walking the distinct priorities of commands_claim_idx by index
 * probes, the earliest due_at after two bounds; and the same for
 * lease_until in commands_lease_idx): whether any became due in (lo, now],
 * and when the next one will.  lo is the later of its last look and the
 * last notification (a notification covers everything claimable when it
 * was sent), lowered to the slot's due_floor: the earliest start of a
 * transaction that committed work since the last look and began before it
 * (shared.c; the worker publishes that bound, look_mark, before each look
 * and notification).  A
 * transaction's due_at and lease_until values are never older than its
 * start, so a long transaction, or a prepared one committed later, that the
 * previous look could not see is seen by this one.  Prepared transactions
 * the worker has no entry for (those prepared before a restart) are listed
 * when the worker starts; when one of them commits, the next look goes
 * back over everything once.  The worker notifies for every kind: a paused
 * kind's command or a lease that the sweep will settle may cause a
 * notification that finds nothing to claim, which costs a listener one
 * empty claim.
 *
 * Never in the way of DDL: each step first takes its table locks
 * conditionally and skips its turn if that fails, so a DROP EXTENSION (or
 * any other lock holder) never waits for the worker.
 *
 * On a distributed outbox (docs/citus.md) each worker node's sweep, purge
 * (outbox.sweep, outbox.purge) and due check look at the shards that node
 * holds, the due check looking back DU_CITUS_LOOKBACK_MS further for the
 * decisions routed from the coordinator (they commit on the node without
 * lowering its due floor); the checks are counted on the coordinator, over
 * the whole cluster (the views are distributed queries there), and not on
 * the worker nodes; the coordinator, which holds no shard, neither purges
 * nor looks for due commands; the index duty measures a worker node's
 * shards and nothing on the coordinator (upkeep.c).
 *
 * Calls bgw.c (the transaction runner), plans.c (saved plans), shared.c
 * (counters, prepared transactions), upkeep.c and citus.c.
 *
 * Locking.  RowExclusiveLock on commands, receipts and purged and
 * AccessShareLock on policies (sweep, purge), AccessShareLock on commands
 * (due), AccessShareLock on events, commands, receipts and purged and
 * RowExclusiveLock on check_results (checks), AccessExclusiveLock on
 * events, commands, receipts, inbox and purged (citus_keys, on a worker
 * node whose keys are a single server's: their shells there, and
 * RowExclusiveLock on check_results), all conditional;
 * OutboxShared->lock, briefly, to write the slot's last_purged.  wake_pending,
 * stream_pending and due_floor are atomics of the slot.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>

#include "access/transam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "storage/lmgr.h"
#include "storage/procarray.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "outbox.h"

#define DU_CHECK_MS			500		/* longest time between two due checks */
#define DU_TICK_RETRY_MS	1		/* a tick that skipped a stream retries
									 * after this, doubling up to: */
#define DU_TICK_RETRY_MAX_MS 100
#define DU_TICK_HANDOFF_MS	2		/* a tick left to the claim a
									 * notification wakes is the worker's
									 * again after this */
#define WK_PURGE_IDLE_ROUNDS 10		/* naps between purges that find nothing */
#define DU_CITUS_LOOKBACK_MS 2000	/* on a distributed outbox, see du_due_txn */
#define DU_CHECKS_MAX		64		/* steps of a checks turn (more than the
									 * checks there are) */

static SPIPlanPtr du_plan_sweep = NULL;
static SPIPlanPtr du_plan_purge = NULL;
static SPIPlanPtr du_plan_tick = NULL;
static SPIPlanPtr du_plan_rotate = NULL;
static SPIPlanPtr du_plan_move_on = NULL;
static uint32 du_seq_notified = 0;	/* the slot's tick_seq at the last notification */
static SPIPlanPtr du_plan_due = NULL;
static SPIPlanPtr du_plan_prepared = NULL;
static SPIPlanPtr du_plan_check = NULL;
static SPIPlanPtr du_plan_citus_keys = NULL;

static TimestampTz du_last_notify = 0;
static TimestampTz du_last_tick = 0;	/* when the last tick began */
static int	du_tick_retry_ms = 0;	/* after a skipped stream (0: none) */
static TimestampTz du_tick_handoff = 0; /* when a tick was left to a claim
										 * (0: none is) */
static TimestampTz du_last_due_check = 0;
static int64 du_purged = 0;		/* purged in the current turn */
static BackgroundWorkerHandle *du_upkeep = NULL;	/* our upkeep worker */
static bool du_upkeep_stopped = false;	/* we asked it to stop */
static bool du_listed_prepared = false; /* unknown prepared xacts listed */
static bool du_citus_keys_done = false; /* this node's keys are those of
										 * the distributed outbox */
static List *du_unknown_prepared = NIL; /* their xids, as an OID list (no
										 * xid lists in 15) */

/*
 * The wake-up that goes out with a tick (du_streams): whether one was
 * pending when the tick began, its time, and whether the tick's
 * transaction sent it.
 */
static bool du_tick_wake = false;
static TimestampTz du_tick_at = 0;
static bool du_tick_notified = false;

static void du_set_mark(TimestampTz t);
static TimestampTz du_hold_until(TimestampTz now);

/* ----------------------------------------------------------------
 * Helpers of the steps
 * ----------------------------------------------------------------
 */

/*
 * Take the locks a step needs, without waiting: all four tables for the
 * duties that write (sweep, purge), commands alone for the look at what is
 * due.  False if the extension's tables are gone or anyone holds (or
 * waits for) a conflicting lock: the duty then skips its turn.
 */
static bool
du_lock_tables(bool write)
{
	static const char *const names[] = {"commands", "policies", "receipts", "purged"};
	Oid			nsp;
	int			i;

	nsp = get_namespace_oid("outbox", true);
	if (!OidIsValid(nsp))
		return false;
	for (i = 0; i < (write ? 4 : 1); i++)
	{
		LOCKMODE	mode = (write && i != 1) ? RowExclusiveLock : AccessShareLock;
		Oid			relid = get_relname_relid(names[i], nsp);

		if (!OidIsValid(relid) || !ConditionalLockRelationOid(relid, mode))
			return false;
	}
	return true;
}

/*
 * Take the locks of the stream duties' statements without waiting (ROW
 * EXCLUSIVE on every table of the streams, which also covers their reads,
 * and on the view and sequence they read): false if one is gone or anyone
 * holds or waits for a conflicting lock, such as DROP EXTENSION (then the
 * duty skips its turn; a lock it waited for behind DROP EXTENSION would be
 * a deadlock).
 */
static bool
du_lock_stream_tables(void)
{
	static const char *const names[] = {"streams", "subscriptions", "stream_ticks",
		"stream_log_0", "stream_log_1", "stream_log_2", "stream_kept",
		"stream_receipts_0", "stream_receipts_1", "stream_receipts_2",
		"stream_rotation", "stream_progress", "stream_failures",
	"_stream_log", "stream_log_id_seq"};
	Oid			nsp = get_namespace_oid("outbox", true);
	int			i;

	if (!OidIsValid(nsp))
		return false;
	for (i = 0; i < (int) lengthof(names); i++)
	{
		Oid			relid = get_relname_relid(names[i], nsp);

		if (!OidIsValid(relid) || !ConditionalLockRelationOid(relid, RowExclusiveLock))
			return false;
	}
	return true;
}

/* Run a saved one-int4-argument, one-int4-result statement. */
static int32
du_exec_int(SPIPlanPtr *cache, const char *sql, int32 arg)
{
	static const Oid argtypes[1] = {INT4OID};
	Datum		args[1];
	bool		isnull;
	Datum		d;

	args[0] = Int32GetDatum(arg);
	if (SPI_execute_plan(OutboxPrepare(cache, sql, 1, argtypes), args, NULL, false, 1)
		!= SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "outbox: \"%s\" failed", sql);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return isnull ? 0 : DatumGetInt32(d);
}

/* One statement of a step, with its int4 argument and result. */
typedef struct DuStatement
{
	SPIPlanPtr *plan;			/* where its saved plan is kept */
	const char *sql;			/* SELECT of one int4 from one int4 $1 */
	bool		write;			/* it writes (takes the write locks) */
	int32		arg;
	int32		result;
} DuStatement;

/* Transaction: take the tables' locks, run the statement. */
static bool
du_statement_txn(void *arg)
{
	DuStatement *st = (DuStatement *) arg;
	bool		streams = st->plan == &du_plan_rotate || st->plan == &du_plan_move_on;

	/*
	 * The tick reads and writes the streams' tables only: their locks, and
	 * nothing of the row path's (no distributed table of Citus either).
	 */
	if (st->plan == &du_plan_tick)
	{
		if (!du_lock_stream_tables())
			return false;
		st->result = OutboxStreamTick();
		/*
		 * The wake-up goes out with the tick, from this transaction: the
		 * publishers are told at its commit, when they can see it, with no
		 * second transaction in between (unless outbox.notify_interval
		 * holds it: then the notify duty sends it when the interval ends).
		 */
		if ((st->result > 0 || st->result < -1 || du_tick_wake) &&
			du_hold_until(GetCurrentTimestamp()) == 0)
		{
			pg_atomic_write_u32(&MyOutboxSlot->idle_pid, 0);
			du_seq_notified = pg_atomic_read_u32(&MyOutboxSlot->tick_seq);
			Async_Notify(outbox_notify_channel, "");
			du_tick_notified = true;
		}
		return true;
	}
	if (!du_lock_tables(st->write))
		return false;
	if (streams && !du_lock_stream_tables())
		return false;
	/*
	 * the coordinator holds no shard of a distributed outbox to purge, and a
	 * distributed outbox has no streams (docs/citus.md)
	 */
	if ((st->plan == &du_plan_purge && OutboxCitusCoordinator()) ||
		(streams && OutboxCitusDistributed()))
		return true;
	st->result = du_exec_int(st->plan, st->sql, st->arg);
	return true;
}

/*
 * Run a saved statement (one int4 argument, one int4 result) in a
 * transaction of its own, its table locks taken without waiting.  False if
 * it failed (logged, and kept in outbox.workers) or skipped its turn.
 */
static bool
du_run(const char *what, SPIPlanPtr *plan, const char *sql, bool write,
	   int32 arg, int32 *result)
{
	DuStatement st;

	st.plan = plan;
	st.sql = sql;
	st.write = write;
	st.arg = arg;
	st.result = 0;
	*result = 0;
	if (!OutboxRunTransaction(what, du_statement_txn, &st))
		return false;
	*result = st.result;
	return true;
}

/*
 * What became claimable in (lo, now], and when the next command will: the
 * earliest due_at after each bound, per priority (a loose index scan of
 * commands_claim_idx: one probe to find each distinct priority, two to
 * find its heads; at most 256 priorities are looked at), and the earliest
 * lease_until after each bound (commands_lease_idx).  Every probe reads
 * one index entry, whatever the backlog.
 */
static const char du_due_sql[] =
"WITH RECURSIVE pr(p) AS ("
"    SELECT (SELECT c.priority FROM outbox.commands c"
"             WHERE c.due_at IS NOT NULL"
"             ORDER BY c.priority DESC LIMIT 1)"
"  UNION ALL"
"    SELECT (SELECT c.priority FROM outbox.commands c"
"             WHERE c.due_at IS NOT NULL AND c.priority OPERATOR(pg_catalog.<) pr.p"
"             ORDER BY c.priority DESC LIMIT 1)"
"      FROM pr WHERE pr.p IS NOT NULL),"
" ps AS (SELECT pr.p FROM pr WHERE pr.p IS NOT NULL LIMIT 256),"
" heads(after_lo, after_now) AS ("
"    SELECT (SELECT c.due_at FROM outbox.commands c"
"             WHERE c.due_at IS NOT NULL AND c.priority OPERATOR(pg_catalog.=) ps.p"
"               AND c.due_at OPERATOR(pg_catalog.>) $1"
"             ORDER BY c.priority DESC, c.due_at LIMIT 1),"
"           (SELECT c.due_at FROM outbox.commands c"
"             WHERE c.due_at IS NOT NULL AND c.priority OPERATOR(pg_catalog.=) ps.p"
"               AND c.due_at OPERATOR(pg_catalog.>) $2"
"             ORDER BY c.priority DESC, c.due_at LIMIT 1)"
"      FROM ps"
"  UNION ALL"
"    SELECT (SELECT c.lease_until FROM outbox.commands c"
"             WHERE c.status OPERATOR(pg_catalog.=) 'sending'"
"               AND c.lease_until OPERATOR(pg_catalog.>) $1"
"             ORDER BY c.lease_until LIMIT 1),"
"           (SELECT c.lease_until FROM outbox.commands c"
"             WHERE c.status OPERATOR(pg_catalog.=) 'sending'"
"               AND c.lease_until OPERATOR(pg_catalog.>) $2"
"             ORDER BY c.lease_until LIMIT 1))"
" SELECT COALESCE(pg_catalog.bool_or(h.after_lo OPERATOR(pg_catalog.<=) $2), false),"
"        pg_catalog.min(h.after_now)"
"   FROM heads h";

typedef struct DuDue
{
	TimestampTz lo;				/* in */
	TimestampTz now;			/* in */
	bool		became;			/* out: something became claimable */
	TimestampTz next;			/* out: next moment, 0 if none */
} DuDue;

/* Fold the look's row (SPI_tuptable) into d: any became, the earliest next. */
static void
du_due_result(DuDue *d)
{
	bool		isnull;
	Datum		v;

	v = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull && DatumGetBool(v))
		d->became = true;
	v = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
	if (!isnull && (d->next == 0 || DatumGetTimestampTz(v) < d->next))
		d->next = DatumGetTimestampTz(v);
}

/* Transaction: the look at what is due. */
static bool
du_due_txn(void *arg)
{
	static const Oid argtypes[2] = {TIMESTAMPTZOID, TIMESTAMPTZOID};
	DuDue	   *d = (DuDue *) arg;
	Datum		args[2];

	if (!du_lock_tables(false))
		return false;
	d->became = false;
	d->next = 0;
	args[0] = TimestampTzGetDatum(d->lo);
	args[1] = TimestampTzGetDatum(d->now);
	if (OutboxCitusDistributed())
	{
		/*
		 * The distributed table's shell is empty: look at each of this
		 * node's shards (none on the coordinator), as the claim does.
		 */
		int			nshards;
		int			k;
		OutboxShard *shards = OutboxCitusLocalShards(&nshards, false);

		/*
		 * A decision routed from the coordinator commits here without
		 * lowering the due floor (it runs no outbox code on this node), and
		 * its due_at is the coordinator's start of its transaction: look
		 * back DU_CITUS_LOOKBACK_MS more for it.
		 */
		args[0] = TimestampTzGetDatum(Min(d->lo,
										  TimestampTzPlusMilliseconds(d->now, -DU_CITUS_LOOKBACK_MS)));
		for (k = 0; k < nshards; k++)
		{
			if (SPI_execute_plan(OutboxCitusShardPlan(&shards[k], du_due_sql, 2, argtypes),
								 args, NULL, true, 1) != SPI_OK_SELECT ||
				SPI_processed != 1)
				elog(ERROR, "outbox: due look-up failed");
			du_due_result(d);
		}
		return true;
	}
	if (SPI_execute_plan(OutboxPrepare(&du_plan_due, du_due_sql, 2, argtypes),
						 args, NULL, true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "outbox: due look-up failed");
	du_due_result(d);
	return true;
}

/*
 * Transaction: list the prepared transactions of this database whose
 * counts shared.c does not keep (prepared before a restart).
 */
static bool
du_prepared_txn(void *arg)
{
	MemoryContext oldcxt;
	uint64		i;

	if (SPI_execute_plan(OutboxPrepare(&du_plan_prepared,
									   "SELECT p.transaction FROM pg_catalog.pg_prepared_xacts p"
									   " WHERE p.database OPERATOR(pg_catalog.=) pg_catalog.current_database()",
									   0, NULL),
						 NULL, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox: prepared transactions look-up failed");
	oldcxt = MemoryContextSwitchTo(TopMemoryContext);
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		Datum		v = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
									  1, &isnull);
		TransactionId xid = isnull ? InvalidTransactionId : DatumGetTransactionId(v);

		if (TransactionIdIsValid(xid) && !OutboxPreparedKnown(xid))
			du_unknown_prepared = lappend_oid(du_unknown_prepared, (Oid) xid);
	}
	MemoryContextSwitchTo(oldcxt);
	return true;
}

/*
 * True if one of the unknown prepared transactions committed since the
 * last call (those finished are forgotten).
 */
static bool
du_unknown_committed(void)
{
	bool		committed = false;
	ListCell   *lc;

	foreach(lc, du_unknown_prepared)
	{
		TransactionId xid = (TransactionId) lfirst_oid(lc);

		if (TransactionIdIsInProgress(xid))
			continue;
		if (TransactionIdDidCommit(xid))
			committed = true;
		du_unknown_prepared = foreach_delete_current(du_unknown_prepared, lc);
	}
	return committed;
}

/*
 * Look at what became claimable since the last look, the last notification
 * or the earliest start of a transaction that committed work since (see
 * the file header), and remember when the next command will.  Something
 * new raises the wake-up flag, so that the notification obeys
 * outbox.notify_interval like any other.  Returns the next moment, 0 if
 * none is known.
 */
static TimestampTz
du_due_check(void)
{
	DuDue		d;
	TimestampTz floor;

	if (!du_listed_prepared)
	{
		du_listed_prepared = OutboxRunTransaction("outbox: listing prepared transactions",
												  du_prepared_txn, NULL);
		if (du_last_due_check == 0)
			du_last_due_check = GetCurrentTimestamp();
	}
	floor = (TimestampTz) pg_atomic_exchange_u64(&MyOutboxSlot->due_floor,
												 (uint64) OUTBOX_NO_FLOOR);
	if (du_unknown_prepared != NIL && du_unknown_committed())
		floor = DT_NOBEGIN;
	d.now = GetCurrentTimestamp();
	d.lo = Min(Max(du_last_due_check, du_last_notify), floor);
	du_set_mark(d.now);			/* before the look's snapshot */
	if (!OutboxRunTransaction("outbox: looking for due commands", du_due_txn, &d))
	{
		/* Look back as far next time. */
		if (floor != OUTBOX_NO_FLOOR)
		{
			uint64		cur = pg_atomic_read_u64(&MyOutboxSlot->due_floor);

			while ((int64) cur > floor &&
				   !pg_atomic_compare_exchange_u64(&MyOutboxSlot->due_floor,
												   &cur, (uint64) floor))
				;
		}
		return 0;
	}
	du_last_due_check = d.now;
	if (d.became)
		pg_atomic_write_u32(&MyOutboxSlot->wake_pending, 1);
	return d.next;
}

/*
 * Publish where the next look would begin (t: a look's now, or a
 * notification's), before that look or notification reads the table: a
 * transaction that began before it and commits after it then lowers the
 * floor (shared.c).
 */
static void
du_set_mark(TimestampTz t)
{
	if (t > (TimestampTz) pg_atomic_read_u64(&MyOutboxSlot->look_mark))
		pg_atomic_write_u64(&MyOutboxSlot->look_mark, (uint64) t);
	pg_memory_barrier();
}

/*
 * Send one notification on outbox.notify_channel.  Its time is taken
 * before its transaction: a listener's claim after it sees every command
 * committed before then.
 */
static void
du_notify(void)
{
	MemoryContext cxt = CurrentMemoryContext;
	TimestampTz at = GetCurrentTimestamp();

	du_set_mark(at);
	PG_TRY();
	{
		StartTransactionCommand();
		/* (the publishers that wait after it are counted afresh) */
		pg_atomic_write_u32(&MyOutboxSlot->idle_pid, 0);
		du_seq_notified = pg_atomic_read_u32(&MyOutboxSlot->tick_seq);
		Async_Notify(outbox_notify_channel, "");
		CommitTransactionCommand();
		OutboxCountNow(OBC_WAKEUPS, 1);
	}
	PG_CATCH();
	{
		OutboxRecover(cxt);
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	du_last_notify = at;
}

/*
 * Send the pending wake-up, unless the previous notification is less than
 * outbox.notify_interval old: then keep it pending (producers will not
 * signal again) and set *hold_until to when the interval ends (else 0).
 * When a claim (of every kind) has found nothing since the previous
 * notification, a publisher is waiting and nothing is gained by holding:
 * the wake-up goes out once the previous one is
 * outbox.notify_idle_interval old (or outbox.notify_interval, if shorter).
 * While every publisher is busy their claims are not empty, and the
 * interval coalesces the commits of a high rate into few notifications.
 * The loop also calls this between two steps of a long duty.
 */
void
OutboxServeWakeups(TimestampTz *hold_until)
{
	TimestampTz until;

	*hold_until = 0;
	if (pg_atomic_read_u32(&MyOutboxSlot->wake_pending) == 0)
		return;
	until = du_hold_until(GetCurrentTimestamp());
	if (until != 0)
	{
		*hold_until = until;
		return;
	}
	pg_atomic_write_u32(&MyOutboxSlot->wake_pending, 0);
	du_notify();
}

/*
 * When a wake-up may go out if it may not at now (0 if it may): the
 * previous one is less than outbox.notify_interval old, or, while a
 * publisher waits, less than outbox.notify_idle_interval.
 */
static TimestampTz
du_hold_until(TimestampTz now)
{
	TimestampTz until;

	if (du_last_notify == 0)
		return 0;
	until = TimestampTzPlusMilliseconds(du_last_notify, outbox_notify_interval_ms);
	if (now >= until)
		return 0;
	pg_memory_barrier();
	if ((TimestampTz) pg_atomic_read_u64(&MyOutboxSlot->idle_at) >= du_last_notify)
		until = TimestampTzPlusMilliseconds(du_last_notify,
											Min(outbox_notify_interval_ms,
												outbox_notify_idle_interval_ms));
	return now < until ? until : 0;
}

/*
 * True while our upkeep worker is starting or running; *pid is its process
 * (0 while it starts).
 */
static bool
du_upkeep_running(pid_t *pid)
{
	*pid = 0;
	if (du_upkeep == NULL)
		return false;
	switch (GetBackgroundWorkerPid(du_upkeep, pid))
	{
		case BGWH_STARTED:
		case BGWH_NOT_YET_STARTED:
			return true;
		default:
			pfree(du_upkeep);
			du_upkeep = NULL;
			return false;
	}
}

/* ----------------------------------------------------------------
 * The steps
 * ----------------------------------------------------------------
 */

/* sweep: one batch of expired leases; more while batches come back full. */
static bool
du_sweep(OutboxTurn *turn)
{
	int32		batch = Min(outbox_purge_batch, outbox_max_batch);
	int32		done;

	return du_run("outbox: settling expired leases", &du_plan_sweep,
				  "SELECT outbox.sweep($1)", true, batch, &done) &&
		done >= batch;
}

/*
 * purge: one batch by the retention rule; more while batches come back
 * full.  The look for old enough commands costs about the same whether it
 * finds any or not, so after a turn that found nothing the next one waits
 * WK_PURGE_IDLE_ROUNDS naps (or a reload).
 */
static bool
du_purge(OutboxTurn *turn)
{
	int32		done;
	bool		ok;

	if (turn->steps == 0)
		du_purged = 0;
	ok = du_run("outbox: purging", &du_plan_purge, "SELECT outbox.purge($1)",
				true, outbox_purge_batch, &done);
	du_purged += done;
	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	MyOutboxSlot->last_purged = du_purged;
	LWLockRelease(OutboxShared->lock);
	if (du_purged == 0)
		turn->next = TimestampTzPlusMilliseconds(turn->now,
												 WK_PURGE_IDLE_ROUNDS * outbox_naptime_ms);
	return ok && done >= outbox_purge_batch;
}

/* due: one look at what became claimable, and when the next will. */
static bool
du_due(OutboxTurn *turn)
{
	turn->due = du_due_check();
	return false;
}

/*
 * streams: cut the ticks of the streams with new commands, when a commit
 * that appended to a stream raised stream_pending, or every naptime.  While
 * every publisher is busy (no claim of every kind found nothing since the
 * last notification) the ticks are at most one per outbox.notify_interval,
 * as the notifications are: a busy publisher claims again anyway, and a
 * high commit rate then costs one tick per interval, not one per commit;
 * once a publisher waits, the tick is cut at once, or, when only one
 * waits, the notification goes out at once and the tick is left to the
 * claim it wakes, for DU_TICK_HANDOFF_MS (then the worker cuts it, as it
 * does at the backstop and while the notification is held by
 * outbox.notify_idle_interval).  The flag is cleared
 * before the tick's snapshot is taken, so a commit the snapshot misses
 * raises it again; a tick that failed or skipped its turn raises it again
 * too.
 */
static bool
du_streams(OutboxTurn *turn)
{
	int32		n;
	bool		backstop = du_last_tick == 0 ||
		TimestampDifferenceExceeds(du_last_tick, turn->now, outbox_naptime_ms);

	bool		idle;

	if (!backstop && pg_atomic_read_u32(&MyOutboxSlot->stream_pending) == 0)
	{
		/* (a claim took the tick left to it) */
		du_tick_handoff = 0;
		return false;
	}
	if (!backstop && du_tick_handoff != 0 &&
		!TimestampDifferenceExceeds(du_tick_handoff, turn->now, DU_TICK_HANDOFF_MS))
	{
		/* a tick left to a claim: the worker's again once the time is up */
		turn->next = TimestampTzPlusMilliseconds(du_tick_handoff, DU_TICK_HANDOFF_MS);
		return false;
	}
	pg_memory_barrier();
	idle = (TimestampTz) pg_atomic_read_u64(&MyOutboxSlot->idle_at) >= du_last_notify;
	if (!backstop && du_tick_handoff == 0 && du_last_notify != 0 && !idle &&
		!TimestampDifferenceExceeds(du_last_tick, turn->now, outbox_notify_interval_ms))
	{
		/* publishers busy: the flag stays up until the interval ends */
		turn->next = TimestampTzPlusMilliseconds(du_last_tick, outbox_notify_interval_ms);
		return false;
	}
	if (!backstop && du_tick_handoff == 0 && idle && du_hold_until(turn->now) == 0 &&
		pg_atomic_read_u32(&MyOutboxSlot->idle_pid) != OUTBOX_IDLE_MANY)
	{
		/*
		 * One publisher waits and a notification may go out now: it goes
		 * out first, and the tick is left to the claim it wakes
		 * (claim_batch cuts the tick a commit raised when it finds the flag
		 * up), so the waiting publisher does not wait for a transaction of
		 * the worker first.  If no claim has taken the flag
		 * DU_TICK_HANDOFF_MS later (the publisher that woke is not a
		 * stream's, or is slow), the worker cuts the tick.  When more than
		 * one waits, the worker cuts the tick first, as below: the claim
		 * that cut it would hide it from the others until it commits, and
		 * they would wait for the next notification.
		 */
		pg_atomic_write_u32(&MyOutboxSlot->wake_pending, 0);
		du_notify();
		du_tick_handoff = du_last_notify;
		turn->next = TimestampTzPlusMilliseconds(du_tick_handoff, DU_TICK_HANDOFF_MS);
		return false;
	}
	du_tick_handoff = 0;
	pg_atomic_write_u32(&MyOutboxSlot->stream_pending, 0);
	/*
	 * The pending wake-up, if any, goes out with the tick (du_statement_txn)
	 * at a time taken before the tick's transaction, as du_notify's.
	 */
	du_tick_wake = pg_atomic_exchange_u32(&MyOutboxSlot->wake_pending, 0) != 0;
	du_tick_at = GetCurrentTimestamp();
	du_tick_notified = false;
	du_set_mark(du_tick_at);
	du_last_tick = turn->now;
	/* (du_plan_tick only marks the tick: du_statement_txn runs it in C) */
	if (!du_run("outbox: cutting the stream ticks", &du_plan_tick, NULL, false, 0, &n))
	{
		pg_atomic_write_u32(&MyOutboxSlot->stream_pending, 1);
		if (du_tick_wake)
			pg_atomic_write_u32(&MyOutboxSlot->wake_pending, 1);
		return false;
	}
	if (n < -1)
	{
		/*
		 * a stream was skipped: a claim (or tick_streams()) was ticking it,
		 * and its snapshot may have missed the commit that raised the
		 * flag; look again shortly
		 */
		n = -2 - n;
		pg_atomic_write_u32(&MyOutboxSlot->stream_pending, 1);
		du_tick_retry_ms = du_tick_retry_ms == 0 ? DU_TICK_RETRY_MS :
			Min(2 * du_tick_retry_ms, Min(DU_TICK_RETRY_MAX_MS, outbox_naptime_ms));
		turn->next = TimestampTzPlusMilliseconds(turn->now, du_tick_retry_ms);
	}
	else
		du_tick_retry_ms = 0;
	if (du_tick_notified)
	{
		OutboxCountNow(OBC_WAKEUPS, 1);
		du_last_notify = du_tick_at;
	}
	else if (n > 0 || du_tick_wake)
	{
		/*
		 * what it cut is announced (by the notify duty, when the interval
		 * ends), even if a notification went out while the tick waited
		 */
		pg_atomic_write_u32(&MyOutboxSlot->wake_pending, 1);
	}
	return false;
}

/*
 * rotate: the partitions with nothing after their acked tick move on to
 * the last tick (a transaction of its own: its row locks, which claims
 * skip, are not held through the rotation's lock waits), then one step of
 * the stream log's rotation.  A claim that skipped a partition the move
 * held may have found nothing: once the move is committed, it is recorded
 * and the waiting publishers are notified (OutboxTickCommitted).
 */
static bool
du_rotate(OutboxTurn *turn)
{
	int32		n;
	TimestampTz began = GetCurrentTimestamp();
	TimestampTz idle_at;

	/*
	 * (only a claim that found nothing since the move began can have
	 * skipped its rows; no transaction id is recorded: a claim that began
	 * after the move committed, whatever its snapshot, skipped none)
	 */
	if (du_run("outbox: moving the stream partitions on", &du_plan_move_on,
			   "SELECT outbox._stream_move_on()", true, 0, &n) && n > 0 &&
		OutboxTickCommitted(MyOutboxSlot, InvalidFullTransactionId, began))
		SetLatch(MyLatch);
	/*
	 * The backstop of the above: a publisher has waited a nap without a
	 * notification and something was recorded since the last one (a claim
	 * under a transaction snapshot can miss a record, whose commit
	 * callbacks run out of order): one notification, at most one per
	 * outbox.naptime.
	 */
	idle_at = (TimestampTz) pg_atomic_read_u64(&MyOutboxSlot->idle_at);
	if (pg_atomic_read_u32(&MyOutboxSlot->idle_pid) != 0 &&
		idle_at >= du_last_notify &&
		idle_at <= TimestampTzPlusMilliseconds(began, -outbox_naptime_ms) &&
		pg_atomic_read_u32(&MyOutboxSlot->tick_seq) != du_seq_notified &&
		pg_atomic_exchange_u32(&MyOutboxSlot->wake_pending, 1) == 0)
		SetLatch(MyLatch);
	(void) du_run("outbox: rotating the stream log", &du_plan_rotate,
				  "SELECT outbox._stream_rotate($1)", true, 0, &n);
	return false;
}

/*
 * notify: send the pending wake-up, or come back when the interval ends;
 * after a release, have the due check look outbox.notify_interval later.
 */
static bool
du_wakeups(OutboxTurn *turn)
{
	TimestampTz hold;

	if (pg_atomic_exchange_u32(&MyOutboxSlot->release_pending, 0) != 0)
	{
		TimestampTz at = TimestampTzPlusMilliseconds(turn->now, outbox_notify_interval_ms);

		if (turn->due == 0 || at < turn->due)
			turn->due = at;
	}
	OutboxServeWakeups(&hold);
	if (hold != 0)
		turn->next = hold;
	return false;
}

/*
 * index: measure the indexes of the extension's tables (several short
 * transactions, with turn->between in between), and start an upkeep worker
 * if one needs a rebuild (or a rebuild left something behind).
 */
static bool
du_index(OutboxTurn *turn)
{
	pid_t		pid;

	if (outbox_index_bloat <= 0 || du_upkeep_running(&pid))
		return false;
	if (OutboxUpkeepFind(OutboxRunTransaction, turn->between, true) == NIL)
		return false;
	du_upkeep_stopped = false;
	if (!OutboxStartUpkeep(&du_upkeep))
		ereport(LOG,
				(errmsg("outbox worker for database \"%s\" could not start its index upkeep: no background worker slot is free",
						MyOutboxDbName)));
	return false;
}

/*
 * index, at each check: while an upkeep worker runs, stop it when anyone
 * waits for a lock on the extension's tables (see upkeep.c).
 */
static void
du_index_watch(void)
{
	pid_t		pid;

	if (du_upkeep_stopped || !du_upkeep_running(&pid) ||
		OutboxUpkeepUnopposed(pid))
		return;
	TerminateBackgroundWorker(du_upkeep);
	du_upkeep_stopped = true;
	ereport(LOG,
			(errmsg("outbox worker for database \"%s\" stopped its index upkeep: another session is waiting for a lock on the extension's tables",
					MyOutboxDbName)));
}

/* index, when the worker exits: its upkeep worker goes too. */
static void
du_index_stop(void)
{
	if (du_upkeep != NULL)
		TerminateBackgroundWorker(du_upkeep);
}

/*
 * checks, one step: take the locks without waiting, count check io[0]
 * (1-based, by name) into check_results; io[1] is set to the number of
 * checks.
 */
static bool
du_check_txn(void *arg)
{
	static const char *const names[] = {"events", "commands", "receipts", "purged",
	"check_results"};
	const int	nnames = (int) lengthof(names);
	int32	   *io = (int32 *) arg;
	Oid			nsp;
	int			i;

	nsp = get_namespace_oid("outbox", true);
	if (!OidIsValid(nsp))
		return false;
	for (i = 0; i < nnames; i++)
	{
		LOCKMODE	mode = (i == nnames - 1) ? RowExclusiveLock : AccessShareLock;
		Oid			relid = get_relname_relid(names[i], nsp);

		if (!OidIsValid(relid) || !ConditionalLockRelationOid(relid, mode))
			return false;
	}
	/*
	 * A distributed outbox is counted by the coordinator over the whole
	 * cluster (the views' distributed queries); a worker node would count
	 * the empty shells.
	 */
	if (OutboxCitusDistributed() && !OutboxCitusCoordinator())
		return true;
	io[1] = du_exec_int(&du_plan_check, "SELECT outbox._check_run($1)", io[0]);
	return true;
}

/* checks: count one conservation check; more while checks remain. */
static bool
du_checks(OutboxTurn *turn)
{
	int32		io[2];

	io[0] = turn->steps + 1;
	io[1] = 0;
	return OutboxRunTransaction("outbox: counting the conservation checks",
								du_check_txn, io) &&
		io[0] < io[1];
}

/*
 * citus_keys, in its transaction: on a worker node of a distributed
 * outbox whose commands_pkey is a single server's (command_id alone), take
 * the shells' locks without waiting and swap the keys, as distribute() does
 * on the nodes it knows; forget the checks the node counted of its own
 * tables (the coordinator counts the distributed outbox).  Done once per
 * worker process while the outbox stays distributed: a node in that shape
 * stays so until undistribute(), which puts every node's keys back.
 * undistribute() does that on the worker nodes before its own transaction
 * removes the metadata, so a worker process that makes its first check in
 * between (one started during the undistribute()) would give the node the
 * distributed keys again; a worker running since before has checked
 * already and does nothing.
 */
static bool
du_citus_keys_txn(void *arg)
{
	static const char *const names[] = {"events", "commands", "receipts", "inbox", "purged"};
	Oid			nsp;
	Oid			pkey;
	HeapTuple	tup;
	int			natts;
	int			i;

	if (!OutboxCitusDistributed())
	{
		du_citus_keys_done = false;
		return true;
	}
	if (OutboxCitusCoordinator())
	{
		du_citus_keys_done = true;
		return true;
	}
	nsp = get_namespace_oid("outbox", true);
	pkey = OidIsValid(nsp) ? get_relname_relid("commands_pkey", nsp) : InvalidOid;
	if (!OidIsValid(pkey))
		return false;
	tup = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(pkey));
	if (!HeapTupleIsValid(tup))
		return false;
	natts = ((Form_pg_index) GETSTRUCT(tup))->indnatts;
	ReleaseSysCache(tup);
	if (natts == 2)
	{
		du_citus_keys_done = true;
		return true;
	}
	for (i = 0; i <= (int) lengthof(names); i++)
	{
		Oid			relid = get_relname_relid(i < (int) lengthof(names) ?
											  names[i] : "check_results", nsp);

		if (!OidIsValid(relid) ||
			!ConditionalLockRelationOid(relid, i < (int) lengthof(names) ?
										AccessExclusiveLock : RowExclusiveLock))
			return false;
	}
	if (SPI_execute_plan(OutboxPrepare(&du_plan_citus_keys,
									   "SELECT outbox._citus_keys(true)", 0, NULL),
						 NULL, NULL, false, 1) != SPI_OK_SELECT ||
		SPI_execute("UPDATE outbox.check_results SET violations = NULL, computed_at = NULL,"
					" duration_seconds = NULL", false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "outbox: the distributed outbox's keys could not be set");
	ereport(LOG,
			(errmsg("outbox: this node's tables now have the keys of the distributed outbox"),
			 errdetail("The node's copies were keyed as on a single server (a node added after outbox.distribute()).")));
	du_citus_keys_done = true;
	return true;
}

/* citus_keys: one look, until this node's keys are right. */
static bool
du_citus_keys(OutboxTurn *turn)
{
	if (du_citus_keys_done || !OutboxCitusLoaded())
		return false;
	(void) OutboxRunTransaction("outbox: checking the keys of the distributed outbox",
								du_citus_keys_txn, NULL);
	return false;
}

/* ----------------------------------------------------------------
 * The table
 * ----------------------------------------------------------------
 */

const OutboxDuty OutboxDuties[] = {
	/* name, interval, cap_ms, step, budget, round, at_due, watch, stop */
	{"sweep", &outbox_naptime_ms, 0, du_sweep, OUTBOX_BUDGET_NAP, true, true},
	{"purge", &outbox_naptime_ms, 0, du_purge, OUTBOX_BUDGET_NAP, true, false},
	{"due", &outbox_naptime_ms, DU_CHECK_MS, du_due, 1, false, true},
	{"index", &outbox_index_check_interval_ms, 0, du_index, 1, false, false,
	du_index_watch, du_index_stop},
	{"checks", &outbox_check_interval_ms, 0, du_checks, DU_CHECKS_MAX, false, false},
	{"streams", NULL, 0, du_streams, 1, false, false},
	{"rotate", &outbox_naptime_ms, 0, du_rotate, 1, false, false},
	{"citus_keys", &outbox_naptime_ms, 0, du_citus_keys, 1, false, false},
	{"notify", NULL, 0, du_wakeups, 1, false, false},
};

const int	OutboxNumDuties = lengthof(OutboxDuties);
