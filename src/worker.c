/*-------------------------------------------------------------------------
 *
 * worker.c
 *		The per-database worker's loop.
 *
 * One worker per database with the extension, started by the launcher
 * (launcher.c) in a slot of OutboxShared.  Its loop runs the duty table of
 * duties.c: each duty takes a turn when its time has come (its interval
 * setting after its previous turn, or earlier when the duty says so), runs
 * one bounded step after another while the step asks for more and its
 * budget allows (a number of steps, or the round's time budget of one
 * nap), and between two steps the loop answers signals, gives way to DDL
 * and sends wake-ups, so that a long purge delays neither.  The loop then
 * sleeps until the earliest next turn in the table, its own next check, or
 * its latch: a committing producer sets it (shared.c).  A reload brings
 * every duty's next turn forward to at most one (new) interval away and
 * never postpones one.
 *
 * Never in the way of DDL.  DROP DATABASE, ALTER DATABASE RENAME / SET
 * TABLESPACE and CREATE DATABASE ... TEMPLATE take a lock on the database
 * object and then wait a few seconds for the other sessions in it to leave;
 * nothing tells a background worker to go.  So the worker tries, every
 * WK_CHECK_MS and between two steps, to take (conditionally, and release at
 * once) the lock every new connection takes on its database; when that
 * fails somebody is waiting for the database and the worker exits, and the
 * launcher retries only when the same conditional lock succeeds.  The same
 * check stops the worker when the extension is gone, runs the duties'
 * watches (the index upkeep's) and, as a backstop, publishes what finished
 * prepared transactions counted.
 *
 * Calls shared.c (prepared transactions), bgw.c (the database lock probe)
 * and duties.c (the table, the wake-ups between steps).
 *
 * Locking.  OutboxShared->lock, briefly, to update its slot; the lock of
 * its database object, conditionally and released at once.  A worker only
 * takes up a slot whose generation matches the one it was started for.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "outbox.h"

#define WK_CHECK_MS			500		/* database lock and extension check */

/* Worker state (process-local). */
static OutboxWorkerSlot *wk_slot = NULL;
static uint32 wk_generation = 0;
static bool wk_serving = false;		/* found the extension at start */
static TimestampTz wk_next_check = 0;
static TimestampTz *wk_next = NULL; /* next turn of each duty */
static TimestampTz wk_due = 0;	/* next time something becomes due, 0: none */
static TimestampTz wk_round_start = 0;	/* start of the current duties */

static void wk_check(void);

/* Leave the slot for the launcher: stopped, with the reason already set. */
static void
wk_on_exit(int code, Datum arg)
{
	Latch	   *latch = NULL;
	int			i;

	for (i = 0; i < OutboxNumDuties; i++)
		if (OutboxDuties[i].stop != NULL)
			OutboxDuties[i].stop();
	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	if (wk_slot->generation == wk_generation)
	{
		wk_slot->state = OBW_STOPPED;
		wk_slot->pid = 0;
		wk_slot->latch = NULL;
		latch = OutboxShared->launcher_latch;
	}
	LWLockRelease(OutboxShared->lock);
	if (latch != NULL)
		SetLatch(latch);
}

/* Exit, telling the launcher why. */
static void
wk_exit(OutboxWorkerExit reason)
{
	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	if (wk_slot->generation == wk_generation)
		wk_slot->exit_reason = reason;
	LWLockRelease(OutboxShared->lock);

	if (reason == OBX_NO_EXTENSION && wk_serving)
		ereport(LOG,
				(errmsg("outbox worker for database \"%s\" is stopping: the extension was dropped",
						MyOutboxDbName)));
	else if (reason == OBX_DATABASE_BUSY)
		ereport(LOG,
				(errmsg("outbox worker for database \"%s\" is stopping: another session needs the database to itself",
						MyOutboxDbName)));
	proc_exit(0);
}

/* A duty's interval in ms now (its setting, capped). */
static int
wk_interval(const OutboxDuty *duty)
{
	int			ms = *duty->interval_ms;

	if (duty->cap_ms > 0)
		ms = Min(ms, duty->cap_ms);
	return ms;
}

/*
 * Apply a configuration reload: no duty's next turn is further away than
 * its (new) interval.
 */
static void
wk_reload(void)
{
	TimestampTz now;
	int			i;

	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	now = GetCurrentTimestamp();
	for (i = 0; i < OutboxNumDuties; i++)
	{
		if (OutboxDuties[i].interval_ms != NULL)
			wk_next[i] = Min(wk_next[i],
							 TimestampTzPlusMilliseconds(now, wk_interval(&OutboxDuties[i])));
	}
	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	wk_slot->naptime_ms = outbox_naptime_ms;
	LWLockRelease(OutboxShared->lock);
}

/*
 * Between two steps of a duty: answer signals, give way to DDL on the
 * database and send wake-ups.  Returns false when the round's time budget
 * (one nap) is spent.
 */
static bool
wk_between_steps(void)
{
	TimestampTz hold;

	CHECK_FOR_INTERRUPTS();
	if (ConfigReloadPending)
		wk_reload();
	if (GetCurrentTimestamp() >= wk_next_check)
		wk_check();
	OutboxServeWakeups(&hold);
	return !TimestampDifferenceExceeds(wk_round_start, GetCurrentTimestamp(),
									   outbox_naptime_ms);
}

/* The same, for a step that runs several transactions (no time budget). */
static void
wk_between(void)
{
	(void) wk_between_steps();
}

/*
 * Give every duty whose time has come its turn, in table order.  Returns
 * the earliest next turn.
 */
static TimestampTz
wk_run_duties(TimestampTz now)
{
	bool		round = false;
	TimestampTz wake = DT_NOEND;
	int			i;

	wk_round_start = now;
	for (i = 0; i < OutboxNumDuties; i++)
	{
		const OutboxDuty *duty = &OutboxDuties[i];
		OutboxTurn	turn;
		bool		at_due = duty->at_due && wk_due != 0 && now >= wk_due;

		if (duty->interval_ms != NULL && now < wk_next[i] && !at_due)
		{
			wake = Min(wake, wk_next[i]);
			continue;
		}
		if (duty->round && !round)
		{
			round = true;
			LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
			wk_slot->state = OBW_RUNNING;
			LWLockRelease(OutboxShared->lock);
		}
		memset(&turn, 0, sizeof(turn));
		turn.now = now;
		turn.between = wk_between;
		turn.next = duty->interval_ms != NULL ?
			TimestampTzPlusMilliseconds(now, wk_interval(duty)) : DT_NOEND;
		turn.due = wk_due;
		for (;;)
		{
			bool		more = duty->step(&turn);

			turn.steps++;
			if (!more ||
				(duty->budget != OUTBOX_BUDGET_NAP && turn.steps >= duty->budget) ||
				!wk_between_steps())
				break;
		}
		wk_due = turn.due;
		wk_next[i] = turn.next;
		wake = Min(wake, turn.next);
	}
	if (wk_due != 0)
		wake = Min(wake, wk_due);
	if (round)
	{
		LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
		wk_slot->state = OBW_IDLE;
		wk_slot->last_run = GetCurrentTimestamp();
		wk_slot->runs++;
		LWLockRelease(OutboxShared->lock);
	}
	return wake;
}

/*
 * Give way to DDL on the database, and stop when the extension is gone.
 * Cheap: one conditional lock and one syscache look-up; then the duties'
 * watches, in the same transaction, and what finished prepared
 * transactions counted.
 */
static void
wk_check(void)
{
	bool		present;
	int			i;

	wk_next_check = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), WK_CHECK_MS);
	if (!OutboxDatabaseFree(MyDatabaseId))
		wk_exit(OBX_DATABASE_BUSY);
	StartTransactionCommand();
	present = OidIsValid(get_extension_oid("outbox", true));
	if (present && wk_serving)
	{
		for (i = 0; i < OutboxNumDuties; i++)
			if (OutboxDuties[i].watch != NULL)
				OutboxDuties[i].watch();
	}
	CommitTransactionCommand();
	if (!present)
		wk_exit(OBX_NO_EXTENSION);
	OutboxResolvePrepared();
}

/*
 * Worker entry point: serve one database (main_arg is the slot number;
 * bgw_extra holds the database and the slot's generation).
 */
void
OutboxWorkerMain(Datum main_arg)
{
	int			slotno = DatumGetInt32(main_arg);
	Oid			dboid;
	MemoryContext loopcxt;
	int			i;

	memcpy(&dboid, MyBgworkerEntry->bgw_extra, sizeof(Oid));
	memcpy(&wk_generation, MyBgworkerEntry->bgw_extra + sizeof(Oid), sizeof(uint32));

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	if (OutboxShared == NULL || slotno < 0 || slotno >= OutboxShared->nslots)
		proc_exit(0);
	wk_slot = &OutboxShared->slots[slotno];
	MyOutboxSlot = wk_slot;
	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	if (wk_slot->generation != wk_generation || wk_slot->dboid != dboid ||
		wk_slot->state != OBW_STARTING)
	{
		/* The launcher that started us is gone and the slot was reused. */
		LWLockRelease(OutboxShared->lock);
		proc_exit(0);
	}
	wk_slot->pid = MyProcPid;
	LWLockRelease(OutboxShared->lock);
	before_shmem_exit(wk_on_exit, (Datum) 0);

	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	StartTransactionCommand();
	MyOutboxDbName = MemoryContextStrdup(TopMemoryContext,
									get_database_name(MyDatabaseId));
	CommitTransactionCommand();

	/*
	 * The worker's own settings.  Its commits need not wait for the WAL
	 * flush: a sweep or purge lost in a crash is simply done again, and a
	 * notification is never durable anyway.  No lock wait may hold it up
	 * for long (it takes its table locks conditionally first), it reads no
	 * object through the search path, and its short statements never gain
	 * from JIT compilation (which would cost far more than they do).
	 */
	SetConfigOption("application_name", "outbox worker", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("synchronous_commit", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("lock_timeout", "1s", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("jit", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);

	/*
	 * With Citus loaded, a wait of the worker's statements on a shard (whose
	 * locks it does not take first) can close a cycle with a distributed
	 * transaction such as undistribute() or DROP EXTENSION, which Citus's
	 * deadlock detection (every two deadlock_timeouts) breaks by canceling
	 * that transaction: give up such a wait long before, and skip the turn.
	 */
	if (OutboxCitusLoaded())
		SetConfigOption("lock_timeout", "50ms", PGC_SUSET, PGC_S_OVERRIDE);

	wk_check();					/* exits at once if there is no extension */
	wk_serving = true;

	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	if (wk_slot->generation != wk_generation)
	{
		/* A restarted launcher gave the slot away while we connected. */
		LWLockRelease(OutboxShared->lock);
		proc_exit(0);
	}
	wk_slot->latch = MyLatch;
	wk_slot->state = OBW_IDLE;
	wk_slot->started_at = GetCurrentTimestamp();
	wk_slot->naptime_ms = outbox_naptime_ms;
	LWLockRelease(OutboxShared->lock);
	if (OutboxShared->launcher_latch != NULL)
		SetLatch(OutboxShared->launcher_latch);

	ereport(LOG,
			(errmsg("outbox worker for database \"%s\" started", MyOutboxDbName)));

	loopcxt = AllocSetContextCreate(TopMemoryContext, "outbox worker loop",
									ALLOCSET_DEFAULT_SIZES);
	wk_next = MemoryContextAllocZero(TopMemoryContext,
									 OutboxNumDuties * sizeof(TimestampTz));
	wk_next_check = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), WK_CHECK_MS);
	for (i = 0; i < OutboxNumDuties; i++)
	{
		/* Index upkeep waits one interval; the others start at once. */
		if (OutboxDuties[i].interval_ms == &outbox_index_check_interval_ms)
			wk_next[i] = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													 outbox_index_check_interval_ms);
	}

	for (;;)
	{
		TimestampTz now;
		TimestampTz wake;

		MemoryContextSwitchTo(loopcxt);
		MemoryContextReset(loopcxt);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
			wk_reload();

		now = GetCurrentTimestamp();
		if (now >= wk_next_check)
			wk_check();
		wake = wk_run_duties(now);
		wake = Min(wake, wk_next_check);
		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 OutboxMsUntil(GetCurrentTimestamp(), wake),
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
