/*-------------------------------------------------------------------------
 *
 * shared.c
 *		Shared state: counters, the commit, subtransaction and two-phase
 *		callbacks, the worker slots and request queue, outbox.stats and
 *		outbox.workers.
 *
 * When the library is in shared_preload_libraries it reserves one
 * OutboxSharedState: cumulative counters (atomics), one slot per
 * per-database worker, the queue of databases that asked for a worker, and
 * one entry per possible prepared transaction.  Without preloading
 * OutboxShared stays NULL: the API works, counters are not kept and no
 * worker runs.  A bottom layer: it calls no other file of the extension;
 * the launcher and the workers read and write the slots directly, under
 * the lock below.
 *
 * Counting and waking at commit.  API calls do not touch shared memory.
 * They add to backend-local pending counts, kept per subtransaction: when
 * a subtransaction (a savepoint, a PL/pgSQL block with an exception
 * handler) rolls back its counts are thrown away, when it is released they
 * join its parent's.  A transaction callback adds the top level's counts to
 * the shared counters when the transaction commits and throws them away
 * when it aborts, so rolled-back work is never counted.  Calls that change
 * when a command is due without counting anything say so the same way
 * (OutboxDueAtCommit, kept per subtransaction and at PREPARE TRANSACTION
 * like the counts): renew moved a lease_until (OUTBOX_DUE_MOVED); the
 * release of the next command of an ordering key, requeue and resolve as
 * retry made a command claimable now (OUTBOX_DUE_NOW); an append to a
 * stream's log (OUTBOX_DUE_STREAM) raises the slot's stream_pending, so
 * that the worker cuts a tick at its wake-up; a tick a claim cut
 * (OUTBOX_DUE_TICKED) is counted in the slot's tick_seq and announced as
 * OUTBOX_DUE_NOW only when a publisher other than the claim's waits
 * (idle_pid, below).  If the committed transaction enqueued
 * commands or made one claimable now, the callback also sets wake_pending
 * in the database's worker slot and sets the worker's latch; if it counted
 * anything or changed when a command is due, and began before the slot's
 * look_mark (where the worker's next look at what is due would begin), it
 * lowers the slot's due_floor to the transaction's start, so that the look
 * goes back far enough to see what this transaction made due (its due_at
 * and lease_until values are never older than its start).  That is all a
 * producer pays: no lock, no NOTIFY on its commit path.  On a distributed
 * outbox a decision routed from the coordinator runs none of the API on
 * the node it commits on; the statement trigger distribute() puts on the
 * shards of outbox.commands (outbox_citus_commands_inserted) says
 * OUTBOX_DUE_NOW there instead.
 *
 * Waiting publishers.  A claim of every kind that finds nothing writes the
 * time into the slot's idle_at (OutboxNoteIdleClaim): a publisher is now
 * waiting for a notification, and the worker sends the next one without
 * waiting out outbox.notify_interval (duties.c); it also records its
 * process in idle_pid, or that more than one process waits, until the
 * worker's next notification.  If a wake-up is already
 * pending then, the claim sets the worker's latch too: the commit that
 * raised it did so while the worker was holding it back.  A claim of some
 * kinds only does not count: it can find nothing while commands of other
 * kinds keep coming, and it would have every one of their commits
 * announced.
 *
 * Two-phase commit.  At PREPARE TRANSACTION the pending counts, the
 * request for a worker and the transaction's start are stored in a free
 * entry of OutboxShared->prepared, under its xid.  Whoever sees the
 * prepared transaction finished publishes or drops them (exactly once: the
 * process that clears the entry does it): the backend that runs COMMIT
 * PREPARED or ROLLBACK PREPARED, right after it (a ProcessUtility hook),
 * and, as a backstop, the per-database workers every half second.  A
 * transaction is finished when it is no longer in progress; it committed if
 * the commit log says so.  If the server restarts between PREPARE and
 * COMMIT PREPARED the entries are gone (like the counters, which start
 * again from zero): the transaction's counts are never added, and its
 * wake-up comes from the worker, which lists the prepared transactions it
 * has no entry for when it starts and looks back over everything once one
 * of them commits (duties.c).
 *
 * Locking.  The slots, the request queue, the prepared entries and
 * stats_reset are protected by OutboxShared->lock, which is never held
 * across anything that can fail or wait.  Counters, wake_pending,
 * stream_pending, due_floor, idle_at and nprepared are atomics, read and written without
 * it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/transam.h"
#include "access/twophase.h"
#include "access/xact.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "storage/ipc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "outbox.h"

OutboxSharedState *OutboxShared = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static ProcessUtility_hook_type prev_process_utility_hook = NULL;

/*
 * Pending counts of one (sub)transaction level that counted something.  The
 * frames form a stack in subtransaction order; the top level's has
 * TopSubTransactionId.
 */
typedef struct ObFrame
{
	SubTransactionId subid;
	bool		request_worker;
	int			due;			/* OUTBOX_DUE_* bits */
	int64		counts[OBC_NUM_COUNTERS];
} ObFrame;

static ObFrame *ob_frames = NULL;
static int	ob_nframes = 0;
static int	ob_maxframes = 0;
static bool ob_callbacks_registered = false;

PG_FUNCTION_INFO_V1(outbox_stats);
PG_FUNCTION_INFO_V1(outbox_stats_reset);
PG_FUNCTION_INFO_V1(outbox_count_purged);
PG_FUNCTION_INFO_V1(outbox_wake_at_commit);
PG_FUNCTION_INFO_V1(outbox_citus_commands_inserted);
PG_FUNCTION_INFO_V1(outbox_preloaded);
PG_FUNCTION_INFO_V1(outbox_workers);
PG_FUNCTION_INFO_V1(outbox_request_worker);

static void ob_shmem_request(void);
static void ob_shmem_startup(void);
static void ob_xact_callback(XactEvent event, void *arg);

/* This transaction took a stream tick (OutboxTakeStreamTick). */
static bool ob_tick_taken = false;
static void ob_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
								SubTransactionId parentSubid, void *arg);
static void ob_process_utility(PlannedStmt *pstmt, const char *queryString,
							   bool readOnlyTree, ProcessUtilityContext context,
							   ParamListInfo params, QueryEnvironment *queryEnv,
							   DestReceiver *dest, QueryCompletion *qc);

/* Install the shared-memory and utility hooks (from _PG_init, preloading). */
void
OutboxSharedInit(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = ob_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = ob_shmem_startup;
	prev_process_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = ob_process_utility;
}

/* Bytes of the shared state: the struct, its slots, the prepared entries. */
static Size
ob_shmem_size(void)
{
	Size		size;

	size = add_size(offsetof(OutboxSharedState, slots),
					mul_size(outbox_max_workers, sizeof(OutboxWorkerSlot)));
	size = MAXALIGN(size);
	return add_size(size, mul_size(max_prepared_xacts, sizeof(OutboxPrepared)));
}

static void
ob_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(ob_shmem_size());
	RequestNamedLWLockTranche("outbox", 1);
}

/* Create or attach to the shared state. */
static void
ob_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	OutboxShared = ShmemInitStruct("outbox", ob_shmem_size(), &found);
	if (!found)
	{
		int			i;

		memset(OutboxShared, 0, ob_shmem_size());
		OutboxShared->lock = &(GetNamedLWLockTranche("outbox"))->lock;
		OutboxShared->stats_reset = GetCurrentTimestamp();
		for (i = 0; i < OBC_NUM_COUNTERS; i++)
			pg_atomic_init_u64(&OutboxShared->counters[i], 0);
		pg_atomic_init_u32(&OutboxShared->nprepared, 0);
		OutboxShared->maxprepared = max_prepared_xacts;
		OutboxShared->prepared = (OutboxPrepared *)
			((char *) OutboxShared +
			 MAXALIGN(offsetof(OutboxSharedState, slots) +
					  outbox_max_workers * sizeof(OutboxWorkerSlot)));
		OutboxShared->nslots = outbox_max_workers;
		for (i = 0; i < outbox_max_workers; i++)
		{
			pg_atomic_init_u32(&OutboxShared->slots[i].wake_pending, 0);
			pg_atomic_init_u32(&OutboxShared->slots[i].stream_pending, 0);
			pg_atomic_init_u32(&OutboxShared->slots[i].release_pending, 0);
			pg_atomic_init_u64(&OutboxShared->slots[i].due_floor,
							   (uint64) OUTBOX_NO_FLOOR);
			pg_atomic_init_u64(&OutboxShared->slots[i].look_mark, 0);
			pg_atomic_init_u64(&OutboxShared->slots[i].idle_at, 0);
			pg_atomic_init_u32(&OutboxShared->slots[i].idle_pid, 0);
			pg_atomic_init_u32(&OutboxShared->slots[i].tick_seq, 0);
			pg_atomic_init_u64(&OutboxShared->slots[i].tick_fxid, 0);
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/* Register the transaction callbacks, once per backend. */
static void
ob_register(void)
{
	if (!ob_callbacks_registered)
	{
		RegisterXactCallback(ob_xact_callback, NULL);
		RegisterSubXactCallback(ob_subxact_callback, NULL);
		ob_callbacks_registered = true;
	}
}

/*
 * The pending counts of the current subtransaction level, created (and the
 * callbacks registered) on first use.
 */
static ObFrame *
ob_frame(void)
{
	SubTransactionId subid = GetCurrentSubTransactionId();
	ObFrame    *f;

	ob_register();
	if (ob_nframes > 0 && ob_frames[ob_nframes - 1].subid == subid)
		return &ob_frames[ob_nframes - 1];
	if (ob_nframes == ob_maxframes)
	{
		int			n = Max(4, ob_maxframes * 2);

		if (ob_frames == NULL)
			ob_frames = MemoryContextAlloc(TopMemoryContext, n * sizeof(ObFrame));
		else
			ob_frames = repalloc(ob_frames, n * sizeof(ObFrame));
		ob_maxframes = n;
	}
	f = &ob_frames[ob_nframes++];
	memset(f, 0, sizeof(ObFrame));
	f->subid = subid;
	return f;
}

/* Add n to a counter when (and only if) the current transaction commits. */
void
OutboxCountAtCommit(OutboxCounter c, int64 n)
{
	if (OutboxShared == NULL || n == 0)
		return;
	ob_frame()->counts[c] += n;
}

/*
 * Tell the worker, when (and only if) the current transaction commits, that
 * it changed when a command is due (what: OUTBOX_DUE_* bits): the due floor
 * is lowered as for a counted call, and for OUTBOX_DUE_NOW the worker is
 * woken as for an enqueue.
 */
void
OutboxDueAtCommit(int what)
{
	if (OutboxShared == NULL)
		return;
	ob_frame()->due |= what;
}

/* Ask the launcher for a worker in this database when the transaction commits. */
void
OutboxRequestWorkerAtCommit(void)
{
	if (OutboxShared == NULL)
		return;
	ob_frame()->request_worker = true;
}

/* Add n to a counter now (for refusals, which abort the transaction). */
void
OutboxCountNow(OutboxCounter c, int64 n)
{
	if (OutboxShared != NULL && n != 0)
		pg_atomic_fetch_add_u64(&OutboxShared->counters[c], (uint64) n);
}

/* Set the latch of the worker of slot, if it has one. */
static void
ob_set_latch(OutboxWorkerSlot *slot)
{
	Latch	   *latch = slot->latch;

	if (latch != NULL)
		SetLatch(latch);
}

/*
 * The slot of the worker serving dboid, or NULL.  Reads without the lock:
 * callers only use the result to set a latch or lower a floor, and a stale
 * answer costs at most one wake-up (the worker also polls every naptime).
 */
OutboxWorkerSlot *
OutboxFindSlot(Oid dboid)
{
	int			i;

	if (OutboxShared == NULL)
		return NULL;
	for (i = 0; i < OutboxShared->nslots; i++)
	{
		OutboxWorkerSlot *slot = &OutboxShared->slots[i];

		if (slot->state != OBW_FREE && slot->dboid == dboid)
			return slot;
	}
	return NULL;
}

/* Queue dboid for the launcher and wake it. */
void
OutboxRequestWorker(Oid dboid)
{
	Latch	   *latch;
	int			i;

	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	for (i = 0; i < OutboxShared->nrequests; i++)
		if (OutboxShared->requests[i] == dboid)
			break;
	if (i == OutboxShared->nrequests)
	{
		if (i < OUTBOX_MAX_REQUESTS)
			OutboxShared->requests[OutboxShared->nrequests++] = dboid;
		else
			OutboxShared->requests_overflow = true;
	}
	latch = OutboxShared->launcher_latch;
	LWLockRelease(OutboxShared->lock);
	if (latch != NULL)
		SetLatch(latch);
}

/*
 * Publish what a committed transaction of database dboid, started at
 * start, counted and did to due times (due): add to the counters, lower
 * the worker's due floor, wake the worker if commands were enqueued or made
 * claimable, queue a worker request.
 */
static void
ob_publish(const int64 *counts, int due, bool request_worker, Oid dboid,
		   TimestampTz start)
{
	OutboxWorkerSlot *slot;
	bool		any = (due != 0);
	bool		wake = false;
	int			i;

	for (i = 0; i < OBC_NUM_COUNTERS; i++)
	{
		if (counts[i] != 0)
		{
			pg_atomic_fetch_add_u64(&OutboxShared->counters[i], (uint64) counts[i]);
			any = true;
		}
	}
	slot = any ? OutboxFindSlot(dboid) : NULL;
	if (slot != NULL)
	{
		/*
		 * Only a transaction that began before where the next look begins
		 * can have written what that look would miss; the worker sets the
		 * mark before it takes its snapshot, and we read it after our
		 * commit.  Floors mostly grow, so this is mostly reads.
		 */
		pg_memory_barrier();
		if (start <= (int64) pg_atomic_read_u64(&slot->look_mark))
		{
			uint64		floor = pg_atomic_read_u64(&slot->due_floor);

			while ((int64) floor > start &&
				   !pg_atomic_compare_exchange_u64(&slot->due_floor, &floor,
												   (uint64) start))
				;
		}

		/*
		 * A tick a claim cut (claim_batch), or rows claims skipped
		 * (_wake_at_commit): recorded first (a claim that began before and
		 * finds nothing sees the record move, OutboxNoteIdleBatchClaim),
		 * then announced only if a publisher other than this one waits: a
		 * busy publisher claims again after its batch anyway, and this one
		 * is claiming.
		 */
		if ((due & OUTBOX_DUE_TICKED) != 0 &&
			OutboxTickCommitted(slot, GetTopFullTransactionIdIfAny(), 0))
			wake = true;

		/*
		 * Only the commit that raises a flag sets the latch: while the
		 * worker holds a wake-up back (see outbox.notify_interval) later
		 * commits cost one atomic exchange and no signal.  The latch is set
		 * once, after every flag this commit raises is up, and the wake-up
		 * before the stream's flag, so that the worker that wakes (or is
		 * awake and sees the stream's flag) also sees the wake-up, and
		 * sends it with the tick rather than in a second notification.
		 */
		if ((counts[OBC_ENQUEUED] > 0 || (due & OUTBOX_DUE_NOW) != 0) &&
			pg_atomic_exchange_u32(&slot->wake_pending, 1) == 0)
			wake = true;

		/*
		 * A release of an ordering key's next command (keys.c): the
		 * worker looks for it after outbox.notify_interval and wakes the
		 * publishers only if it is still claimable then (duties.c, "The
		 * release's wake-up").
		 */
		if ((due & OUTBOX_DUE_RELEASE) != 0 &&
			pg_atomic_exchange_u32(&slot->release_pending, 1) == 0)
			wake = true;

		/*
		 * An append to a stream: the worker cuts a tick (duties.c), even
		 * while it holds the notification back; the commits that come
		 * while the flag is up are in the next tick.
		 */
		if ((due & OUTBOX_DUE_STREAM) != 0 &&
			pg_atomic_exchange_u32(&slot->stream_pending, 1) == 0)
			wake = true;

		if (wake)
			ob_set_latch(slot);
	}
	if (request_worker)
		OutboxRequestWorker(dboid);
}

/*
 * Take the tick a commit that appended to a stream of this database waits
 * for (lower the worker's slot's stream_pending, as the worker does before
 * its tick): true if one was waiting, and the caller cuts it now
 * (claim_batch, src/stream.c).  If the caller's transaction or
 * subtransaction then rolls back, or its tick skips a stream, the flag is
 * raised again (OutboxStreamTickAgain), so that the worker cuts it.
 */
bool
OutboxTakeStreamTick(void)
{
	OutboxWorkerSlot *slot = OutboxFindSlot(MyDatabaseId);

	if (slot == NULL || pg_atomic_read_u32(&slot->stream_pending) == 0)
		return false;
	ob_register();
	if (pg_atomic_exchange_u32(&slot->stream_pending, 0) == 0)
		return false;
	ob_tick_taken = true;
	return true;
}

/* Raise stream_pending again, and wake the worker if it was down. */
void
OutboxStreamTickAgain(void)
{
	OutboxWorkerSlot *slot = OutboxFindSlot(MyDatabaseId);

	if (slot != NULL && pg_atomic_exchange_u32(&slot->stream_pending, 1) == 0)
		ob_set_latch(slot);
}

/*
 * A claim found nothing: tell this database's worker that a publisher is
 * waiting (see "Waiting publishers" above).
 */
void
OutboxNoteIdleClaim(void)
{
	OutboxWorkerSlot *slot = OutboxFindSlot(MyDatabaseId);
	uint32		pid;

	if (slot == NULL)
		return;
	/* which publisher waits: this one, or more than one */
	pid = pg_atomic_read_u32(&slot->idle_pid);
	while (pid != (uint32) MyProcPid && pid != OUTBOX_IDLE_MANY &&
		   !pg_atomic_compare_exchange_u32(&slot->idle_pid, &pid,
										   pid == 0 ? (uint32) MyProcPid : OUTBOX_IDLE_MANY))
		;
	pg_atomic_write_u64(&slot->idle_at, (uint64) GetCurrentTimestamp());
	pg_memory_barrier();
	if (pg_atomic_read_u32(&slot->wake_pending) != 0)
		ob_set_latch(slot);
}

/*
 * A committed change that can make a batch claimable, or that held rows a
 * claim skipped, and that sends no notification of its own (a tick a claim
 * cut, the worker's move on, a requeue or resolve): recorded (tick_seq,
 * and, when fxid is valid, tick_fxid: see OutboxNoteIdleBatchClaim), then, if a publisher waits
 * (idle_pid) that is not this process, and (since > 0) it found nothing
 * since then, the slot's wake-up is raised: true when this raised it, and
 * the caller sets the worker's latch.  The record comes first and the
 * waiting publishers are read after it: a claim that records itself
 * waiting after that read sees the record.
 */
bool
OutboxTickCommitted(OutboxWorkerSlot *slot, FullTransactionId fxid, TimestampTz since)
{
	uint32		idle;

	if (FullTransactionIdIsValid(fxid))
		pg_atomic_write_u64(&slot->tick_fxid, U64FromFullTransactionId(fxid));
	pg_atomic_fetch_add_u32(&slot->tick_seq, 1);
	idle = pg_atomic_read_u32(&slot->idle_pid);
	return idle != 0 && idle != (uint32) MyProcPid &&
		(since <= 0 || (TimestampTz) pg_atomic_read_u64(&slot->idle_at) >= since) &&
		pg_atomic_exchange_u32(&slot->wake_pending, 1) == 0;
}

/*
 * The count of committed ticks that claims cut in this database (0 without
 * a worker slot): claim_batch reads it before any snapshot, for
 * OutboxNoteIdleBatchClaim.
 */
uint32
OutboxTickSeq(void)
{
	OutboxWorkerSlot *slot = OutboxFindSlot(MyDatabaseId);
	uint32		seq;

	if (slot == NULL)
		return 0;
	seq = pg_atomic_read_u32(&slot->tick_seq);
	pg_memory_barrier();
	return seq;
}

/*
 * A claim_batch that found nothing (OutboxNoteIdleClaim): its publisher
 * waits.  A change recorded by OutboxTickCommitted after this claim began
 * (tick_seq: OutboxTickSeq then) may be one this claim's snapshots did not
 * see, and it may have looked for waiting publishers before this one was
 * recorded: then the worker is woken now, and its notification makes the
 * publisher claim again.  In a transaction that reads one snapshot
 * (REPEATABLE READ, SERIALIZABLE) that snapshot may be older than the
 * claim: there the last change's transaction (tick_fxid) not being
 * visible in it says the same.  (The record is written before the waiting
 * publishers are read, and this publisher is recorded before the record is
 * read: one of the two sees the other.)
 */
void
OutboxNoteIdleBatchClaim(uint32 tick_seq)
{
	OutboxWorkerSlot *slot = OutboxFindSlot(MyDatabaseId);
	bool		missed;

	OutboxNoteIdleClaim();
	if (slot == NULL)
		return;
	pg_memory_barrier();
	missed = pg_atomic_read_u32(&slot->tick_seq) != tick_seq;
	if (!missed && IsolationUsesXactSnapshot())
	{
		uint64		fx = pg_atomic_read_u64(&slot->tick_fxid);
		uint64		next = U64FromFullTransactionId(ReadNextFullTransactionId());

		/* (one older than 2^31 transactions is long visible) */
		missed = fx != 0 && next - fx < ((uint64) 1 << 31) &&
			XidInMVCCSnapshot(XidFromFullTransactionId(FullTransactionIdFromU64(fx)),
							  GetTransactionSnapshot());
	}
	if (missed && pg_atomic_exchange_u32(&slot->wake_pending, 1) == 0)
		ob_set_latch(slot);
}

/*
 * Keep what a transaction being prepared would publish, under its xid,
 * until it is finished.  When no entry is free (cannot happen: there is one
 * per possible prepared transaction) it is published at once, as if
 * committed.
 */
static void
ob_keep_prepared(const int64 *counts, int due, bool request_worker)
{
	TransactionId xid = GetTopTransactionIdIfAny();
	OutboxPrepared *e = NULL;
	int			i;

	/* (another process finishes it: a tick it cut is announced) */
	if ((due & OUTBOX_DUE_TICKED) != 0)
		due |= OUTBOX_DUE_NOW;
	if (TransactionIdIsValid(xid))
	{
		LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
		for (i = 0; i < OutboxShared->maxprepared; i++)
		{
			if (!TransactionIdIsValid(OutboxShared->prepared[i].xid))
			{
				e = &OutboxShared->prepared[i];
				e->xid = xid;
				e->dboid = MyDatabaseId;
				e->xact_start = GetCurrentTransactionStartTimestamp();
				e->request_worker = request_worker;
				e->due = due;
				memcpy(e->counts, counts, sizeof(e->counts));
				pg_atomic_fetch_add_u32(&OutboxShared->nprepared, 1);
				break;
			}
		}
		LWLockRelease(OutboxShared->lock);
	}
	if (e == NULL)
		ob_publish(counts, due, request_worker, MyDatabaseId,
				   GetCurrentTransactionStartTimestamp());
}

/*
 * Publish what the prepared transactions that committed since the last
 * call counted, and forget those that rolled back.  Cheap when no entry is
 * in use (one atomic read).
 */
void
OutboxResolvePrepared(void)
{
	int			i;

	if (OutboxShared == NULL ||
		pg_atomic_read_u32(&OutboxShared->nprepared) == 0)
		return;
	for (i = 0; i < OutboxShared->maxprepared; i++)
	{
		OutboxPrepared *e = &OutboxShared->prepared[i];
		OutboxPrepared copy;
		TransactionId xid;
		bool		committed;

		LWLockAcquire(OutboxShared->lock, LW_SHARED);
		xid = e->xid;
		LWLockRelease(OutboxShared->lock);

		/*
		 * In progress first: a finished transaction is marked in the commit
		 * log before it leaves the proc array.
		 */
		if (!TransactionIdIsValid(xid) || TransactionIdIsInProgress(xid))
			continue;
		committed = TransactionIdDidCommit(xid);

		LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
		if (!TransactionIdEquals(e->xid, xid))
		{
			/* Another process resolved it first. */
			LWLockRelease(OutboxShared->lock);
			continue;
		}
		copy = *e;
		e->xid = InvalidTransactionId;
		pg_atomic_fetch_sub_u32(&OutboxShared->nprepared, 1);
		LWLockRelease(OutboxShared->lock);

		if (committed)
			ob_publish(copy.counts, copy.due, copy.request_worker, copy.dboid,
					   copy.xact_start);
	}
}

/* True if xid is a prepared transaction whose counts are kept here. */
bool
OutboxPreparedKnown(TransactionId xid)
{
	bool		known = false;
	int			i;

	if (OutboxShared == NULL)
		return false;
	LWLockAcquire(OutboxShared->lock, LW_SHARED);
	for (i = 0; i < OutboxShared->maxprepared && !known; i++)
		known = TransactionIdEquals(OutboxShared->prepared[i].xid, xid);
	LWLockRelease(OutboxShared->lock);
	return known;
}

/*
 * A subtransaction ends: a released one's counts join its parent's, a
 * rolled-back one's are dropped.
 */
static void
ob_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					SubTransactionId parentSubid, void *arg)
{
	ObFrame    *top;
	int			i;

	/* (a rolled-back subtransaction may have held the taken tick) */
	if (ob_tick_taken && event == SUBXACT_EVENT_ABORT_SUB)
		OutboxStreamTickAgain();
	if (ob_nframes == 0 || ob_frames[ob_nframes - 1].subid != mySubid)
		return;
	top = &ob_frames[ob_nframes - 1];
	switch (event)
	{
		case SUBXACT_EVENT_COMMIT_SUB:
			if (ob_nframes >= 2 && ob_frames[ob_nframes - 2].subid == parentSubid)
			{
				ObFrame    *parent = &ob_frames[ob_nframes - 2];

				for (i = 0; i < OBC_NUM_COUNTERS; i++)
					parent->counts[i] += top->counts[i];
				parent->request_worker |= top->request_worker;
				parent->due |= top->due;
				ob_nframes--;
			}
			else
				top->subid = parentSubid;
			break;
		case SUBXACT_EVENT_ABORT_SUB:
			ob_nframes--;
			break;
		default:
			break;
	}
}

/*
 * The transaction ends: publish its counts at commit, keep them at
 * PREPARE, drop them at abort.
 */
static void
ob_xact_callback(XactEvent event, void *arg)
{
	int64		counts[OBC_NUM_COUNTERS];
	bool		request_worker = false;
	int			due = 0;
	int			i;
	int			f;

	/* a taken tick that is not committed goes back to the worker */
	if (ob_tick_taken &&
		(event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT ||
		 event == XACT_EVENT_PREPARE || event == XACT_EVENT_ABORT ||
		 event == XACT_EVENT_PARALLEL_ABORT))
	{
		ob_tick_taken = false;
		if (event != XACT_EVENT_COMMIT && event != XACT_EVENT_PARALLEL_COMMIT)
			OutboxStreamTickAgain();
	}
	if (ob_nframes == 0)
		return;
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			ob_nframes = 0;
			return;
		default:
			return;				/* not the end of the transaction yet */
	}

	/* At the end only the top level's frame is left; sum all the same. */
	memset(counts, 0, sizeof(counts));
	for (f = 0; f < ob_nframes; f++)
	{
		for (i = 0; i < OBC_NUM_COUNTERS; i++)
			counts[i] += ob_frames[f].counts[i];
		request_worker |= ob_frames[f].request_worker;
		due |= ob_frames[f].due;
	}
	ob_nframes = 0;
	if (OutboxShared == NULL)
		return;
	if (event == XACT_EVENT_PREPARE)
		ob_keep_prepared(counts, due, request_worker);
	else
		ob_publish(counts, due, request_worker, MyDatabaseId,
				   GetCurrentTransactionStartTimestamp());
}

/*
 * After COMMIT PREPARED or ROLLBACK PREPARED, publish or drop what that
 * transaction counted (the prepared transaction is finished when the
 * statement returns, even though the statement's own transaction has not
 * committed yet).
 */
static void
ob_process_utility(PlannedStmt *pstmt, const char *queryString,
				   bool readOnlyTree, ProcessUtilityContext context,
				   ParamListInfo params, QueryEnvironment *queryEnv,
				   DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *parsetree = pstmt->utilityStmt;
	bool		finishes = false;

	if (IsA(parsetree, TransactionStmt))
	{
		TransactionStmtKind kind = ((TransactionStmt *) parsetree)->kind;

		finishes = (kind == TRANS_STMT_COMMIT_PREPARED ||
					kind == TRANS_STMT_ROLLBACK_PREPARED);
	}
	if (prev_process_utility_hook)
		prev_process_utility_hook(pstmt, queryString, readOnlyTree, context,
								  params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
	if (finishes)
	{
		OutboxResolvePrepared();

		/*
		 * A transaction prepared before a restart may have installed the
		 * extension, and its request is gone with the shared memory: ask
		 * for a worker if the extension is here and none serves it.
		 */
		if (OutboxShared != NULL && OutboxFindSlot(MyDatabaseId) == NULL)
		{
			AcceptInvalidationMessages();
			InvalidateCatalogSnapshot();
			if (OidIsValid(get_extension_oid("outbox", true)))
				OutboxRequestWorker(MyDatabaseId);
		}
	}
}

/* outbox.preloaded(): true when the library was in shared_preload_libraries. */
Datum
outbox_preloaded(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(OutboxShared != NULL);
}

/*
 * outbox._stats(): one row of the shared counters.  When the library was
 * not preloaded the counters do not exist: the row is all NULL (unknown,
 * not zero), so that monitoring queries keep working; outbox.workers says
 * why.
 */
Datum
outbox_stats(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[OBC_NUM_COUNTERS + 1];
	bool		nulls[OBC_NUM_COUNTERS + 1];
	int			i;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	if (OutboxShared == NULL)
	{
		memset(nulls, true, sizeof(nulls));
		PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
	}

	/* A prepared transaction finished by a backend without us counts now. */
	OutboxResolvePrepared();
	memset(nulls, 0, sizeof(nulls));
	for (i = 0; i < OBC_NUM_COUNTERS; i++)
		values[i] = Int64GetDatum((int64) pg_atomic_read_u64(&OutboxShared->counters[i]));
	LWLockAcquire(OutboxShared->lock, LW_SHARED);
	values[OBC_NUM_COUNTERS] = TimestampTzGetDatum(OutboxShared->stats_reset);
	LWLockRelease(OutboxShared->lock);

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/* outbox.stats_reset(): zero the shared counters. */
Datum
outbox_stats_reset(PG_FUNCTION_ARGS)
{
	int			i;

	if (OutboxShared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox statistics are not available"),
				 errhint("Add outbox to shared_preload_libraries and restart the server.")));
	for (i = 0; i < OBC_NUM_COUNTERS; i++)
		pg_atomic_write_u64(&OutboxShared->counters[i], 0);
	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	OutboxShared->stats_reset = GetCurrentTimestamp();
	LWLockRelease(OutboxShared->lock);
	PG_RETURN_VOID();
}

/*
 * outbox._count_purged(n): add n to the purged counter when the calling
 * transaction commits.  outbox.purge() calls it, so that purges run by the
 * worker and by hand are counted alike (and a rolled-back purge is not).
 */
Datum
outbox_count_purged(PG_FUNCTION_ARGS)
{
	int32		n;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", "n")));
	n = PG_GETARG_INT32(0);
	if (n > 0)
		OutboxCountAtCommit(OBC_PURGED, n);
	PG_RETURN_VOID();
}

/*
 * outbox._wake_at_commit(): the calling transaction made a command
 * claimable now (requeue, resolve as retry), or held stream progress rows
 * that claims skip (a stream's requeue or resolve): when it commits, wake
 * the worker as an enqueue does, and record it for the claims that found
 * nothing meanwhile (OUTBOX_DUE_TICKED).
 */
Datum
outbox_wake_at_commit(PG_FUNCTION_ARGS)
{
	OutboxDueAtCommit(OUTBOX_DUE_NOW | OUTBOX_DUE_TICKED);
	PG_RETURN_VOID();
}

/*
 * outbox._citus_commands_inserted(): the statement trigger outbox.distribute()
 * puts on outbox.commands, which Citus creates on every shard.  A decision
 * routed from the coordinator inserts into a shard on a worker node without
 * running the outbox's code there; the trigger wakes that node's worker at
 * the commit, as commit_decision does on one server, so that the relays
 * LISTENing on the node hear of it then (and not at the worker's next look
 * at what is due).  On a shard moved in, the copy's insert wakes it too.
 */
Datum
outbox_citus_commands_inserted(PG_FUNCTION_ARGS)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("outbox._citus_commands_inserted() must be called as a trigger")));
	OutboxDueAtCommit(OUTBOX_DUE_NOW);
	return PointerGetDatum(NULL);
}

/*
 * outbox._request_worker(): ask the launcher to serve this database once
 * the calling transaction commits (or, inside a prepared transaction, once
 * it is committed).  The install script calls it, so that a new CREATE
 * EXTENSION is served at once instead of at the next rescan.  Does nothing
 * when the library is not preloaded.
 */
Datum
outbox_request_worker(PG_FUNCTION_ARGS)
{
	OutboxRequestWorkerAtCommit();
	PG_RETURN_VOID();
}

static const char *
ob_state_name(OutboxWorkerState state)
{
	switch (state)
	{
		case OBW_STARTING:
			return "starting";
		case OBW_IDLE:
			return "idle";
		case OBW_RUNNING:
			return "running";
		case OBW_STOPPED:
			return "stopped";
		case OBW_FREE:
			break;
	}
	return "free";
}

/*
 * outbox._workers(): one row per worker slot in use, in every database.
 * Without preloading there are no workers: one row for the current
 * database says so (state 'not preloaded').
 */
Datum
outbox_workers(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	OutboxWorkerSlot *copy;
	int			n;
	int			i;

	InitMaterializedSRF(fcinfo, 0);

	if (OutboxShared == NULL)
	{
		Datum		values[10];
		bool		nulls[10];

		memset(nulls, true, sizeof(nulls));
		values[0] = ObjectIdGetDatum(MyDatabaseId);
		nulls[0] = false;
		values[2] = CStringGetTextDatum("not preloaded");
		nulls[2] = false;
		values[8] = CStringGetTextDatum("outbox is not in shared_preload_libraries, so no background worker runs: add it and restart the server");
		nulls[8] = false;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		return (Datum) 0;
	}

	n = OutboxShared->nslots;
	copy = palloc(n * sizeof(OutboxWorkerSlot));
	LWLockAcquire(OutboxShared->lock, LW_SHARED);
	memcpy(copy, OutboxShared->slots, n * sizeof(OutboxWorkerSlot));
	LWLockRelease(OutboxShared->lock);

	for (i = 0; i < n; i++)
	{
		OutboxWorkerSlot *s = &copy[i];
		Datum		values[10];
		bool		nulls[10];
		Interval   *nap;

		if (s->state == OBW_FREE)
			continue;
		memset(nulls, false, sizeof(nulls));
		values[0] = ObjectIdGetDatum(s->dboid);
		values[1] = Int32GetDatum(s->pid);
		nulls[1] = (s->pid == 0);
		values[2] = CStringGetTextDatum(ob_state_name(s->state));
		values[3] = TimestampTzGetDatum(s->started_at);
		nulls[3] = (s->started_at == 0);
		values[4] = TimestampTzGetDatum(s->last_run);
		nulls[4] = (s->last_run == 0);
		values[5] = Int64GetDatum(s->runs);
		nap = palloc0(sizeof(Interval));
		nap->time = (int64) s->naptime_ms * 1000;
		values[6] = IntervalPGetDatum(nap);
		values[7] = Int64GetDatum(s->last_purged);
		nulls[7] = (s->last_run == 0);
		s->last_error[sizeof(s->last_error) - 1] = '\0';
		values[8] = CStringGetTextDatum(s->last_error);
		nulls[8] = (s->last_error[0] == '\0');
		values[9] = TimestampTzGetDatum(s->last_error_at);
		nulls[9] = (s->last_error_at == 0);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
