/*-------------------------------------------------------------------------
 *
 * worker.c
 *		The launcher and the per-database background workers.
 *
 * Launcher.  One launcher, registered at preload, connects to no database
 * (it reads only the shared catalog pg_database).  It keeps a private table
 * of the databases that accept connections and are not templates, and starts
 * one dynamic worker per database, in a slot of OutboxShared.  It cannot see
 * pg_extension of another database, so the worker is also the probe: a
 * worker that finds no extension exits at once, saying so in its slot, and
 * the launcher then leaves that database alone until one of two things
 * happens: CREATE EXTENSION outbox commits there (the install script calls
 * outbox._request_worker(), whose commit callback queues the database in
 * OutboxShared->requests and sets the launcher's latch, so the worker starts
 * at once), or the launcher restarts.  The launcher rescans pg_database
 * every few seconds to find new databases (say, copies of a template that
 * has the extension) and forget dropped ones.  Workers are registered with
 * BGW_NEVER_RESTART: the launcher owns the restart policy.  It restarts a
 * worker that died (killed, or failed) after a delay that grows with
 * repeated failures, does not restart one that found no extension, and
 * retries later one that gave way to a command on its database.  After a
 * crash of any backend the postmaster reinitialises shared memory and
 * restarts the launcher, which starts every worker again.
 *
 * Never in the way of DDL.  DROP DATABASE, ALTER DATABASE RENAME / SET
 * TABLESPACE and CREATE DATABASE ... TEMPLATE take a lock on the database
 * object and then wait a few seconds for the other sessions in it to leave;
 * nothing tells a background worker to go.  So a worker tries, every
 * WK_CHECK_MS and between batches, to take (conditionally, and release at
 * once) the lock every new connection takes on its database; when that
 * fails somebody is waiting for the database and the worker exits, and the
 * launcher retries only when the same conditional lock succeeds.  Likewise
 * each duty first takes its table locks conditionally and skips its turn if
 * that fails, so a DROP EXTENSION (or any other lock holder) never waits
 * for the worker, and the worker never queues behind it; after the DROP
 * EXTENSION commits the worker sees the extension gone and exits.
 *
 * Worker.  Every outbox.naptime (a round) the worker, each step in its own
 * short transaction with a saved plan: settles expired leases
 * (outbox.sweep: dead when the deliveries are used up, uncertain for a
 * manual kind), purges by the retention rule (outbox.purge, in batches of
 * outbox.purge_batch while batches come back full, within a time budget of
 * one nap; after a purge that found nothing the next one waits
 * WK_PURGE_IDLE_ROUNDS rounds or a reload), and looks for commands that
 * became claimable.  It runs only fixed SQL text, never SQL read from a
 * table.  An error in a duty is logged and shown in outbox.workers; the
 * worker rolls back and carries on.
 *
 * Wake-ups.  A committing producer raises wake_pending in the slot and,
 * if it was the one to raise it, sets the worker's latch (outbox.c).  The
 * worker then sends one NOTIFY on outbox.notify_channel from its own
 * transaction and lowers the flag.  It sends at most one notification per
 * outbox.notify_interval: a commit arriving sooner leaves the flag up and
 * the notification goes out when the interval ends, covering every commit
 * in between (and costing those producers no signal at all).
 *
 * Commands also become claimable with no commit to announce them: a
 * not_before or a retry backoff reaches its time, or a lease expires.  The
 * worker looks for them cheaply in the two claim indexes (per priority,
 * walking the distinct priorities of commands_claim_idx by index probes,
 * the earliest due_at after two bounds; and the same for lease_until in
 * commands_lease_idx): whether any became due since its previous look or
 * notification, and when the next one will.  It notifies in the first case
 * and sleeps no longer than the second.  It looks after each round and
 * every WK_CHECK_MS (not after each notification: under a steady stream of
 * commits that would double the worker's transactions), so a command
 * becoming due more than WK_CHECK_MS after it was committed is announced
 * on time, and one due sooner (a short not_before, a short backoff after
 * fail(), a requeue) at most WK_CHECK_MS late.  The
 * worker notifies for every kind: a paused kind's command or a lease that
 * the sweep will settle may cause a notification that finds nothing to
 * claim, which costs a listener one empty claim.
 *
 * Index upkeep.  Every outbox.index_check_interval the worker measures the
 * indexes of the tables rows leave and, when one is mostly empty (as after
 * a long transaction held vacuum back), starts a short-lived upkeep worker
 * that rebuilds it concurrently; while that runs, wk_check also stops it
 * when anyone waits for a lock it holds (upkeep.c).
 *
 * Locking.  Slots are protected by OutboxShared->lock (never held across
 * anything that can fail or wait); wake_pending is an atomic.  A slot's
 * generation is bumped each time the launcher assigns it, and a worker
 * only takes up a slot whose generation matches the one it was started
 * for.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <signal.h>

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_database.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"

#include "outbox.h"

/* Launcher timing. */
#define LN_RESCAN_MS		5000	/* pg_database rescan */
#define LN_RESTART_MIN_MS	1000	/* first restart delay after a failure */
#define LN_RESTART_MAX_MS	60000	/* longest restart delay */
#define LN_HEALTHY_MS		60000	/* a worker up this long was not failing */
#define LN_BUSY_RETRY_MS	1000	/* retry delay after giving way to DDL */
#define LN_MAX_STARTING		2		/* workers connecting at once */

/* Worker timing. */
#define WK_CHECK_MS			500		/* database lock and extension check */
#define WK_PURGE_IDLE_ROUNDS 10		/* rounds between purges that find nothing */

PG_FUNCTION_INFO_V1(outbox_workers);
PG_FUNCTION_INFO_V1(outbox_request_worker);

/* What the launcher knows about one database. */
typedef enum LnDbState
{
	LNDB_WANTED,				/* start a worker at retry_at */
	LNDB_RUNNING,				/* a worker is registered in slotno */
	LNDB_ABSENT					/* no extension: wait for a request */
} LnDbState;

typedef struct LnDb
{
	Oid			dboid;			/* hash key */
	NameData	name;
	LnDbState	state;
	bool		seen;			/* found by the latest pg_database scan */
	bool		excluded;		/* not listed in outbox.databases */
	int			slotno;			/* -1 when it has no slot */
	BackgroundWorkerHandle *handle; /* NULL for a worker adopted at start */
	TimestampTz retry_at;
	TimestampTz started_at;
	int			failures;		/* consecutive failures, for the backoff */
	bool		warned;			/* a "cannot start" warning was logged */
} LnDb;

static HTAB *ln_dbs = NULL;

/* Worker state (process-local). */
static OutboxWorkerSlot *wk_slot = NULL;
static uint32 wk_generation = 0;
static bool wk_serving = false;		/* found the extension at start */
static char *wk_dbname = NULL;
static TimestampTz wk_last_notify = 0;
static TimestampTz wk_last_due_check = 0;
static TimestampTz wk_next_due = 0;	/* 0: nothing known to become due */
static TimestampTz wk_next_check = 0;
static TimestampTz wk_hold_until = 0;	/* a held wake-up goes out then */
static TimestampTz wk_round_start = 0;	/* start of the current duties */
static int	wk_purge_skip = 0;	/* rounds to skip the purge */
static TimestampTz wk_next_upkeep = 0;	/* next measure of the indexes */
static BackgroundWorkerHandle *wk_upkeep = NULL;	/* our upkeep worker */
static bool wk_upkeep_stopped = false;	/* we asked it to stop */

static SPIPlanPtr wk_plan_sweep = NULL;
static SPIPlanPtr wk_plan_purge = NULL;
static SPIPlanPtr wk_plan_due = NULL;

static void wk_check(void);
static void wk_serve_wakeups(void);

/* ----------------------------------------------------------------
 * Helpers shared by the launcher and the workers
 * ----------------------------------------------------------------
 */

/* Milliseconds from now until t, rounded up, at least 0. */
static long
ob_ms_until(TimestampTz now, TimestampTz t)
{
	if (t <= now)
		return 0;
	return (long) ((t - now + 999) / 1000);
}

/*
 * True when nobody holds or waits for a lock on database dboid that
 * conflicts with the one every new connection takes (DROP DATABASE, ALTER
 * DATABASE, CREATE DATABASE ... TEMPLATE hold one while they wait for the
 * sessions in the database to leave).  Never waits.
 */
static bool
ob_database_free(Oid dboid)
{
	LOCKTAG		tag;

	SET_LOCKTAG_OBJECT(tag, InvalidOid, DatabaseRelationId, dboid, 0);
	if (LockAcquire(&tag, RowExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
		return false;
	LockRelease(&tag, RowExclusiveLock, true);
	return true;
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

/* ----------------------------------------------------------------
 * Registration and the CREATE EXTENSION request
 * ----------------------------------------------------------------
 */

/*
 * Register a dynamic background worker of this library that connects to a
 * database, is never restarted by the postmaster, and reports its start
 * and exit to us (bgw_notify_pid).  The handle lives in TopMemoryContext.
 * False if no background worker slot is free.
 */
bool
OutboxRegisterWorker(const char *function, const char *type, const char *name,
					 Datum main_arg, const void *extra, Size extralen,
					 BackgroundWorkerHandle **handle)
{
	BackgroundWorker bgw;
	MemoryContext oldcxt;
	bool		ok;

	Assert(extralen <= BGW_EXTRALEN);
	memset(&bgw, 0, sizeof(bgw));
	bgw.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	bgw.bgw_start_time = BgWorkerStart_RecoveryFinished;
	bgw.bgw_restart_time = BGW_NEVER_RESTART;
	strlcpy(bgw.bgw_library_name, "outbox", BGW_MAXLEN);
	strlcpy(bgw.bgw_function_name, function, BGW_MAXLEN);
	strlcpy(bgw.bgw_name, name, BGW_MAXLEN);
	strlcpy(bgw.bgw_type, type, BGW_MAXLEN);
	bgw.bgw_main_arg = main_arg;
	memcpy(bgw.bgw_extra, extra, extralen);
	bgw.bgw_notify_pid = MyProcPid;

	oldcxt = MemoryContextSwitchTo(TopMemoryContext);
	ok = RegisterDynamicBackgroundWorker(&bgw, handle);
	MemoryContextSwitchTo(oldcxt);
	if (!ok)
		*handle = NULL;
	return ok;
}

/* Register the launcher (called from _PG_init when preloaded). */
void
OutboxRegisterLauncher(void)
{
	BackgroundWorker bgw;

	memset(&bgw, 0, sizeof(bgw));
	bgw.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	bgw.bgw_start_time = BgWorkerStart_RecoveryFinished;
	bgw.bgw_restart_time = 1;
	strlcpy(bgw.bgw_library_name, "outbox", BGW_MAXLEN);
	strlcpy(bgw.bgw_function_name, "OutboxLauncherMain", BGW_MAXLEN);
	strlcpy(bgw.bgw_name, "outbox launcher", BGW_MAXLEN);
	strlcpy(bgw.bgw_type, "outbox launcher", BGW_MAXLEN);
	RegisterBackgroundWorker(&bgw);
}

/*
 * outbox._request_worker(): ask the launcher to serve this database once
 * the calling transaction commits.  The install script calls it, so that a
 * new CREATE EXTENSION is served at once instead of at the next rescan.
 * Does nothing when the library is not preloaded.
 */
Datum
outbox_request_worker(PG_FUNCTION_ARGS)
{
	if (OutboxShared != NULL)
		OutboxRequestWorkerAtCommit();
	PG_RETURN_VOID();
}

/* ----------------------------------------------------------------
 * Launcher
 * ----------------------------------------------------------------
 */

/* Forget the launcher's latch when it exits. */
static void
ln_on_exit(int code, Datum arg)
{
	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	if (OutboxShared->launcher_pid == MyProcPid)
	{
		OutboxShared->launcher_pid = 0;
		OutboxShared->launcher_latch = NULL;
	}
	LWLockRelease(OutboxShared->lock);
}

/* Return a slot to the free pool. */
static void
ln_free_slot(int slotno)
{
	OutboxWorkerSlot *slot = &OutboxShared->slots[slotno];

	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	slot->state = OBW_FREE;
	slot->dboid = InvalidOid;
	slot->pid = 0;
	slot->latch = NULL;
	slot->generation++;
	LWLockRelease(OutboxShared->lock);
}

/*
 * Prepare a slot for a new worker of dboid: the entry's own slot when it has
 * one (a restart keeps the last error visible), else a free one.  Returns
 * the slot number and its new generation, or -1 when every slot is in use.
 */
static int
ln_take_slot(LnDb *db, uint32 *generation)
{
	int			slotno = db->slotno;
	OutboxWorkerSlot *slot;
	int			i;

	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	if (slotno < 0)
	{
		for (i = 0; i < OutboxShared->nslots; i++)
		{
			if (OutboxShared->slots[i].state == OBW_FREE)
			{
				slotno = i;
				break;
			}
		}
		if (slotno < 0)
		{
			LWLockRelease(OutboxShared->lock);
			return -1;
		}
		slot = &OutboxShared->slots[slotno];
		slot->last_error[0] = '\0';
		slot->last_error_at = 0;
	}
	slot = &OutboxShared->slots[slotno];
	slot->dboid = db->dboid;
	slot->generation++;
	slot->state = OBW_STARTING;
	slot->exit_reason = OBX_NONE;
	slot->pid = 0;
	slot->latch = NULL;
	slot->naptime_ms = outbox_naptime_ms;
	slot->started_at = 0;
	slot->last_run = 0;
	slot->last_purged = 0;
	slot->runs = 0;
	/* A new worker announces itself once: commits may have gone unheard. */
	pg_atomic_write_u32(&slot->wake_pending, 1);
	*generation = slot->generation;
	LWLockRelease(OutboxShared->lock);
	return slotno;
}

/* Note a failure to start in the slot, for outbox.workers. */
static void
ln_slot_error(int slotno, const char *msg)
{
	OutboxWorkerSlot *slot = &OutboxShared->slots[slotno];

	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	slot->state = OBW_STOPPED;
	strlcpy(slot->last_error, msg, sizeof(slot->last_error));
	slot->last_error_at = GetCurrentTimestamp();
	LWLockRelease(OutboxShared->lock);
}

/* The delay before the next start after a failure. */
static int
ln_backoff_ms(int failures)
{
	int			ms = LN_RESTART_MIN_MS;

	while (--failures > 0 && ms < LN_RESTART_MAX_MS)
		ms *= 2;
	return Min(ms, LN_RESTART_MAX_MS);
}

/* Start a worker for db.  Returns true if one was registered. */
static bool
ln_start_worker(LnDb *db, TimestampTz now)
{
	char		extra[sizeof(Oid) + sizeof(uint32)];
	char		name[BGW_MAXLEN];
	uint32		generation;
	int			slotno;
	bool		exists;

	if (!ob_database_free(db->dboid))
	{
		db->retry_at = TimestampTzPlusMilliseconds(now, LN_BUSY_RETRY_MS);
		return false;
	}
	/* It may have been dropped since the last scan (say, while we waited). */
	StartTransactionCommand();
	exists = SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(db->dboid));
	CommitTransactionCommand();
	if (!exists)
	{
		db->seen = false;		/* the next scan forgets it */
		db->retry_at = TimestampTzPlusMilliseconds(now, LN_RESCAN_MS);
		return false;
	}

	slotno = ln_take_slot(db, &generation);
	if (slotno < 0)
	{
		if (!db->warned)
			ereport(WARNING,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("no outbox worker slot is free for database \"%s\"",
							NameStr(db->name)),
					 errhint("Increase outbox.max_workers (currently %d), or limit outbox.databases.",
							 outbox_max_workers)));
		db->warned = true;
		db->retry_at = TimestampTzPlusMilliseconds(now, LN_RESCAN_MS);
		return false;
	}
	db->slotno = slotno;

	memcpy(extra, &db->dboid, sizeof(Oid));
	memcpy(extra + sizeof(Oid), &generation, sizeof(uint32));
	snprintf(name, sizeof(name), "outbox worker for database %s", NameStr(db->name));
	if (!OutboxRegisterWorker("OutboxWorkerMain", "outbox worker", name,
							  Int32GetDatum(slotno), extra, sizeof(extra),
							  &db->handle))
	{
		if (!db->warned)
			ereport(WARNING,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("could not start the outbox worker for database \"%s\"",
							NameStr(db->name)),
					 errhint("Increase max_worker_processes.")));
		db->warned = true;
		ln_slot_error(slotno, "could not register a background worker: max_worker_processes reached");
		db->retry_at = TimestampTzPlusMilliseconds(now, LN_RESCAN_MS);
		return false;
	}
	db->warned = false;
	db->state = LNDB_RUNNING;
	db->started_at = now;
	return true;
}

/* Ask a worker to stop (it is not wanted any more). */
static void
ln_stop_worker(LnDb *db)
{
	if (db->handle != NULL)
		TerminateBackgroundWorker(db->handle);
	else if (db->slotno >= 0)
	{
		int			pid;

		LWLockAcquire(OutboxShared->lock, LW_SHARED);
		pid = OutboxShared->slots[db->slotno].pid;
		LWLockRelease(OutboxShared->lock);
		if (pid != 0)
			kill(pid, SIGTERM);
	}
}

/*
 * Take over the slots of workers still running after a launcher restart
 * (not after a crash: that reinitialises shared memory).  Slots whose
 * worker is not running are freed; bumping the generation keeps a worker
 * the previous launcher registered but which has not started yet from
 * using its slot.
 */
static void
ln_adopt_slots(void)
{
	int			i;

	for (i = 0; i < OutboxShared->nslots; i++)
	{
		OutboxWorkerSlot *slot = &OutboxShared->slots[i];
		bool		alive;
		Oid			dboid;

		LWLockAcquire(OutboxShared->lock, LW_SHARED);
		alive = (slot->state == OBW_IDLE || slot->state == OBW_RUNNING) &&
			slot->pid != 0;
		dboid = slot->dboid;
		LWLockRelease(OutboxShared->lock);

		if (alive)
		{
			LnDb	   *db;
			bool		found;

			db = hash_search(ln_dbs, &dboid, HASH_ENTER, &found);
			NameStr(db->name)[0] = '\0';	/* filled in by the first scan */
			db->state = LNDB_RUNNING;
			db->seen = true;
			db->excluded = false;
			db->slotno = i;
			db->handle = NULL;
			db->retry_at = 0;
			db->started_at = GetCurrentTimestamp();
			db->failures = 0;
			db->warned = false;
		}
		else if (slot->state != OBW_FREE)
			ln_free_slot(i);
	}
}

/* Take the pending requests; true if one names a database not known yet. */
static bool
ln_take_requests(void)
{
	Oid			req[OUTBOX_MAX_REQUESTS];
	int			n;
	bool		overflow;
	bool		unknown = false;
	int			i;

	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	n = OutboxShared->nrequests;
	memcpy(req, OutboxShared->requests, n * sizeof(Oid));
	overflow = OutboxShared->requests_overflow;
	OutboxShared->nrequests = 0;
	OutboxShared->requests_overflow = false;
	LWLockRelease(OutboxShared->lock);

	if (overflow)
	{
		HASH_SEQ_STATUS seq;
		LnDb	   *db;

		hash_seq_init(&seq, ln_dbs);
		while ((db = hash_seq_search(&seq)) != NULL)
		{
			if (db->state == LNDB_ABSENT)
			{
				db->state = LNDB_WANTED;
				db->retry_at = 0;
			}
		}
		unknown = true;
	}
	for (i = 0; i < n; i++)
	{
		LnDb	   *db = hash_search(ln_dbs, &req[i], HASH_FIND, NULL);

		if (db == NULL)
			unknown = true;
		else if (db->state != LNDB_RUNNING)
		{
			db->state = LNDB_WANTED;
			db->retry_at = 0;
			db->failures = 0;
		}
	}
	return unknown;
}

/* Is name listed in outbox.databases (an empty list lists every database)? */
static bool
ln_database_listed(List *names, const char *name)
{
	ListCell   *lc;

	if (names == NIL)
		return true;
	foreach(lc, names)
	{
		if (strcmp((char *) lfirst(lc), name) == 0)
			return true;
	}
	return false;
}

/*
 * Read pg_database: add new databases (a worker will probe them), note
 * those outbox.databases leaves out, and stop serving dropped ones.
 */
static void
ln_scan_databases(void)
{
	HASH_SEQ_STATUS seq;
	LnDb	   *db;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	char	   *raw;
	List	   *names = NIL;

	hash_seq_init(&seq, ln_dbs);
	while ((db = hash_seq_search(&seq)) != NULL)
		db->seen = false;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	pgstat_report_activity(STATE_RUNNING, "scanning pg_database");

	raw = pstrdup(outbox_databases ? outbox_databases : "");
	if (!SplitIdentifierString(raw, ',', &names))
		names = NIL;			/* the check hook rejects this; be safe */

	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database form = (Form_pg_database) GETSTRUCT(tup);
		bool		found;

		if (!form->datallowconn || form->datistemplate ||
			database_is_invalid_form(form))
			continue;
		db = hash_search(ln_dbs, &form->oid, HASH_ENTER, &found);
		if (!found)
		{
			db->state = LNDB_WANTED;
			db->slotno = -1;
			db->handle = NULL;
			db->retry_at = 0;
			db->started_at = 0;
			db->failures = 0;
			db->warned = false;
		}
		db->seen = true;
		namestrcpy(&db->name, NameStr(form->datname));
		db->excluded = !ln_database_listed(names, NameStr(form->datname));
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);

	hash_seq_init(&seq, ln_dbs);
	while ((db = hash_seq_search(&seq)) != NULL)
	{
		if (!db->seen || db->excluded)
		{
			if (db->state == LNDB_RUNNING)
				ln_stop_worker(db); /* forgotten when it has exited */
			else if (!db->seen)
			{
				if (db->slotno >= 0)
					ln_free_slot(db->slotno);
				hash_search(ln_dbs, &db->dboid, HASH_REMOVE, NULL);
			}
		}
	}
}

/*
 * Look for workers that exited and decide what comes next.  Sets *rescan
 * when pg_database should be read again before restarting anything.
 */
static void
ln_reap_workers(TimestampTz now, bool *rescan)
{
	HASH_SEQ_STATUS seq;
	LnDb	   *db;

	hash_seq_init(&seq, ln_dbs);
	while ((db = hash_seq_search(&seq)) != NULL)
	{
		OutboxWorkerSlot *slot;
		OutboxWorkerExit reason;
		OutboxWorkerState state;
		bool		exited;

		if (db->state != LNDB_RUNNING)
			continue;
		slot = &OutboxShared->slots[db->slotno];
		if (db->handle != NULL)
		{
			pid_t		pid;
			BgwHandleStatus st = GetBackgroundWorkerPid(db->handle, &pid);

			if (st == BGWH_POSTMASTER_DIED)
				proc_exit(1);
			exited = (st == BGWH_STOPPED);
		}
		else
		{
			LWLockAcquire(OutboxShared->lock, LW_SHARED);
			exited = (slot->state == OBW_STOPPED);
			LWLockRelease(OutboxShared->lock);
		}
		if (!exited)
			continue;

		if (db->handle != NULL)
		{
			pfree(db->handle);
			db->handle = NULL;
		}
		LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
		reason = slot->exit_reason;
		state = slot->state;
		if (state == OBW_STARTING)
		{
			/* It never got as far as taking up its slot. */
			slot->state = OBW_STOPPED;
			strlcpy(slot->last_error, "worker exited before it started serving",
					sizeof(slot->last_error));
			slot->last_error_at = GetCurrentTimestamp();
		}
		LWLockRelease(OutboxShared->lock);

		if (!db->seen)
		{
			ln_free_slot(db->slotno);
			hash_search(ln_dbs, &db->dboid, HASH_REMOVE, NULL);
			continue;
		}
		if (db->excluded || reason == OBX_NO_EXTENSION)
		{
			ln_free_slot(db->slotno);
			db->slotno = -1;
			db->state = db->excluded ? LNDB_WANTED : LNDB_ABSENT;
			db->failures = 0;
			db->retry_at = 0;
			continue;
		}
		db->state = LNDB_WANTED;
		*rescan = true;
		if (reason == OBX_DATABASE_BUSY)
		{
			ln_free_slot(db->slotno);
			db->slotno = -1;
			db->retry_at = TimestampTzPlusMilliseconds(now, LN_BUSY_RETRY_MS);
		}
		else
		{
			/* Killed or failed: restart, backing off if it keeps failing. */
			if (TimestampDifferenceExceeds(db->started_at, now, LN_HEALTHY_MS))
				db->failures = 0;
			db->failures++;
			db->retry_at = TimestampTzPlusMilliseconds(now, ln_backoff_ms(db->failures));
		}
	}
}

/* Start the workers that are due.  Returns the earliest later retry. */
static TimestampTz
ln_start_workers(TimestampTz now)
{
	HASH_SEQ_STATUS seq;
	LnDb	   *db;
	TimestampTz next = 0;
	Oid		   *due;
	int			ndue = 0;
	int			starting = 0;
	int			i;

	LWLockAcquire(OutboxShared->lock, LW_SHARED);
	for (i = 0; i < OutboxShared->nslots; i++)
		if (OutboxShared->slots[i].state == OBW_STARTING)
			starting++;
	LWLockRelease(OutboxShared->lock);

	/*
	 * Collect first: starting a worker runs a transaction, which must not
	 * happen inside a scan of the table.
	 */
	due = palloc(hash_get_num_entries(ln_dbs) * sizeof(Oid) + 1);
	hash_seq_init(&seq, ln_dbs);
	while ((db = hash_seq_search(&seq)) != NULL)
	{
		if (db->state != LNDB_WANTED || !db->seen || db->excluded)
			continue;
		if (db->retry_at <= now)
			due[ndue++] = db->dboid;
		else if (next == 0 || db->retry_at < next)
			next = db->retry_at;
	}

	for (i = 0; i < ndue; i++)
	{
		db = hash_search(ln_dbs, &due[i], HASH_FIND, NULL);
		if (starting < LN_MAX_STARTING)
		{
			if (ln_start_worker(db, now))
			{
				starting++;
				continue;
			}
		}
		else
		{
			/* Too many starting: look again soon (a start sets our latch). */
			db->retry_at = TimestampTzPlusMilliseconds(now, 100);
		}
		if (next == 0 || db->retry_at < next)
			next = db->retry_at;
	}
	pfree(due);
	return next;
}

/*
 * Launcher entry point: keep one worker running in every database that
 * has the extension.
 */
void
OutboxLauncherMain(Datum main_arg)
{
	HASHCTL		ctl;
	TimestampTz next_rescan = 0;
	bool		rescan = true;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	SetConfigOption("application_name", "outbox launcher",
					PGC_SUSET, PGC_S_OVERRIDE);

	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	OutboxShared->launcher_pid = MyProcPid;
	OutboxShared->launcher_latch = MyLatch;
	LWLockRelease(OutboxShared->lock);
	before_shmem_exit(ln_on_exit, (Datum) 0);

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(LnDb);
	ln_dbs = hash_create("outbox launcher databases", 64, &ctl,
						 HASH_ELEM | HASH_BLOBS);

	ln_adopt_slots();
	ereport(LOG, (errmsg("outbox launcher started")));

	for (;;)
	{
		TimestampTz now;
		TimestampTz wake;
		TimestampTz retry;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			rescan = true;
		}
		if (ln_take_requests())
			rescan = true;

		now = GetCurrentTimestamp();
		ln_reap_workers(now, &rescan);
		if (rescan || now >= next_rescan)
		{
			ln_scan_databases();
			next_rescan = TimestampTzPlusMilliseconds(now, LN_RESCAN_MS);
			rescan = false;
		}
		retry = ln_start_workers(now);

		wake = next_rescan;
		if (retry != 0 && retry < wake)
			wake = retry;
		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 ob_ms_until(GetCurrentTimestamp(), wake),
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* ----------------------------------------------------------------
 * Worker
 * ----------------------------------------------------------------
 */

/* Leave the slot for the launcher: stopped, with the reason already set. */
static void
wk_on_exit(int code, Datum arg)
{
	Latch	   *latch = NULL;

	if (wk_upkeep != NULL)
		TerminateBackgroundWorker(wk_upkeep);
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
						wk_dbname)));
	else if (reason == OBX_DATABASE_BUSY)
		ereport(LOG,
				(errmsg("outbox worker for database \"%s\" is stopping: another session needs the database to itself",
						wk_dbname)));
	proc_exit(0);
}

/* Set the worker's state in its slot. */
static void
wk_set_state(OutboxWorkerState state)
{
	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	wk_slot->state = state;
	LWLockRelease(OutboxShared->lock);
}

/*
 * Take the locks a duty needs, without waiting: all four tables for the
 * duties that write (sweep, purge), commands alone for the look at what is
 * due.  False if the extension's tables are gone or anyone holds (or
 * waits for) a conflicting lock: the duty then skips its turn.
 */
static bool
wk_lock_tables(bool write)
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

/* Keep an error of the worker's duties in its slot for outbox.workers. */
static void
wk_record_error(const char *msg)
{
	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	strlcpy(wk_slot->last_error, msg, sizeof(wk_slot->last_error));
	wk_slot->last_error_at = GetCurrentTimestamp();
	LWLockRelease(OutboxShared->lock);
}

/*
 * Recover from an error caught in one of the worker's transactions: log it,
 * keep its message in the slot, roll the transaction back.  The worker then
 * carries on with its next duty.
 */
static void
wk_recover(MemoryContext cxt)
{
	ErrorData  *edata;

	HOLD_INTERRUPTS();
	MemoryContextSwitchTo(cxt);
	edata = CopyErrorData();
	EmitErrorReport();
	FlushErrorState();
	AbortCurrentTransaction();
	RESUME_INTERRUPTS();
	wk_record_error(edata->message);
	FreeErrorData(edata);
}

/*
 * Run one duty in its own transaction, with a snapshot and SPI.  An error
 * is logged and kept in the slot, the transaction is rolled back and the
 * worker carries on.  Returns false if the duty failed or skipped its turn.
 */
static bool
wk_transaction(const char *what, OutboxDuty duty, void *arg)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile bool ok = false;

	pgstat_report_activity(STATE_RUNNING, what);
	PG_TRY();
	{
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		ok = duty(arg);
		SPI_finish();
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		wk_recover(cxt);
		ok = false;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	pgstat_report_activity(STATE_IDLE, NULL);
	return ok;
}

/* Run a saved one-int4-argument, one-int4-result statement. */
static int32
wk_exec_int(SPIPlanPtr *cache, const char *sql, int32 arg)
{
	static const Oid argtypes[1] = {INT4OID};
	Datum		args[1];
	bool		isnull;
	Datum		d;

	args[0] = Int32GetDatum(arg);
	if (SPI_execute_plan(OutboxPrepare(cache, sql, 1, argtypes),
						 args, NULL, false, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "outbox: \"%s\" failed", sql);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return isnull ? 0 : DatumGetInt32(d);
}

typedef struct WkBatch
{
	int32		batch;			/* in: batch size */
	int32		done;			/* out: rows settled or purged */
} WkBatch;

/* One sweep batch: expired leases to dead or uncertain. */
static bool
wk_sweep_duty(void *arg)
{
	WkBatch    *b = (WkBatch *) arg;

	if (!wk_lock_tables(true))
		return false;
	b->done = wk_exec_int(&wk_plan_sweep, "SELECT outbox.sweep($1)", b->batch);
	return true;
}

/* One purge batch, by the retention rule of outbox.purge(). */
static bool
wk_purge_duty(void *arg)
{
	WkBatch    *b = (WkBatch *) arg;

	if (!wk_lock_tables(true))
		return false;
	b->done = wk_exec_int(&wk_plan_purge, "SELECT outbox.purge($1)", b->batch);
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
static const char wk_due_sql[] =
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

typedef struct WkDue
{
	TimestampTz lo;				/* in */
	TimestampTz now;			/* in */
	bool		became;			/* out: something became claimable */
	TimestampTz next;			/* out: next moment, 0 if none */
} WkDue;

static bool
wk_due_duty(void *arg)
{
	static const Oid argtypes[2] = {TIMESTAMPTZOID, TIMESTAMPTZOID};
	WkDue	   *d = (WkDue *) arg;
	Datum		args[2];
	bool		isnull;
	Datum		v;

	if (!wk_lock_tables(false))
		return false;
	args[0] = TimestampTzGetDatum(d->lo);
	args[1] = TimestampTzGetDatum(d->now);
	if (SPI_execute_plan(OutboxPrepare(&wk_plan_due, wk_due_sql, 2, argtypes),
						 args, NULL, true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "outbox: due look-up failed");
	v = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	d->became = !isnull && DatumGetBool(v);
	v = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
	d->next = isnull ? 0 : DatumGetTimestampTz(v);
	return true;
}

/*
 * Look at what became claimable since the last look or the last
 * notification (whichever is later: a notification covers everything
 * claimable when it was sent), and remember when the next command will.
 * Something new raises the wake-up flag, so that the notification obeys
 * outbox.notify_interval like any other.
 */
static void
wk_due_check(void)
{
	WkDue		d;

	d.now = GetCurrentTimestamp();
	d.lo = Max(wk_last_due_check, wk_last_notify);
	if (!wk_transaction("outbox: looking for due commands", wk_due_duty, &d))
		return;
	wk_last_due_check = d.now;
	wk_next_due = d.next;
	if (d.became)
		pg_atomic_write_u32(&wk_slot->wake_pending, 1);
}

/* Send one notification on outbox.notify_channel. */
static void
wk_notify(void)
{
	MemoryContext cxt = CurrentMemoryContext;

	PG_TRY();
	{
		StartTransactionCommand();
		Async_Notify(outbox_notify_channel, "");
		CommitTransactionCommand();
		OutboxCountNow(OBC_WAKEUPS, 1);
	}
	PG_CATCH();
	{
		wk_recover(cxt);
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	wk_last_notify = GetCurrentTimestamp();
}

/*
 * Send the pending wake-up, unless the previous notification is less than
 * outbox.notify_interval old: then keep it pending (producers will not
 * signal again) and come back when the interval ends.
 */
static void
wk_serve_wakeups(void)
{
	TimestampTz now;
	TimestampTz until;

	if (pg_atomic_read_u32(&wk_slot->wake_pending) == 0)
	{
		wk_hold_until = 0;
		return;
	}
	now = GetCurrentTimestamp();
	until = TimestampTzPlusMilliseconds(wk_last_notify, outbox_notify_interval_ms);
	if (wk_last_notify != 0 && now < until)
	{
		wk_hold_until = until;
		return;
	}
	wk_hold_until = 0;
	pg_atomic_write_u32(&wk_slot->wake_pending, 0);
	wk_notify();
}

/* Apply a configuration reload. */
static void
wk_reload(void)
{
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	wk_purge_skip = 0;			/* the retention may have changed */
	wk_next_upkeep = Min(wk_next_upkeep,
						 TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													 outbox_index_check_interval_ms));
	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	wk_slot->naptime_ms = outbox_naptime_ms;
	LWLockRelease(OutboxShared->lock);
}

/*
 * Between two batches of a long duty: answer signals, give way to DDL on
 * the database and send wake-ups, so that a long purge delays neither.
 * Returns false when the round's time budget (one nap) is spent.
 */
static bool
wk_between_batches(void)
{
	TimestampTz now;

	CHECK_FOR_INTERRUPTS();
	if (ConfigReloadPending)
		wk_reload();
	now = GetCurrentTimestamp();
	if (now >= wk_next_check)
		wk_check();
	wk_serve_wakeups();
	return !TimestampDifferenceExceeds(wk_round_start, GetCurrentTimestamp(),
									   outbox_naptime_ms);
}

/* Settle expired leases, in batches while they come back full. */
static void
wk_sweep(void)
{
	WkBatch		b;

	b.batch = Min(outbox_purge_batch, outbox_max_batch);
	for (;;)
	{
		b.done = 0;
		if (!wk_transaction("outbox: settling expired leases", wk_sweep_duty, &b))
			break;
		if (b.done < b.batch || !wk_between_batches())
			break;
	}
}

/* Purge by the retention rule, in batches; returns the count purged. */
static int64
wk_purge(void)
{
	WkBatch		b;
	int64		total = 0;

	b.batch = outbox_purge_batch;
	for (;;)
	{
		b.done = 0;
		if (!wk_transaction("outbox: purging", wk_purge_duty, &b))
			break;
		total += b.done;
		if (b.done < b.batch || !wk_between_batches())
			break;
	}
	return total;
}

/*
 * One round of duties.  The purge's look for old enough commands costs
 * about the same whether it finds any or not, so after a purge that found
 * nothing the next ones wait WK_PURGE_IDLE_ROUNDS rounds (or a reload);
 * while it finds work it runs every round.
 */
static void
wk_round(void)
{
	int64		purged = -1;

	wk_round_start = GetCurrentTimestamp();
	wk_set_state(OBW_RUNNING);
	wk_sweep();
	if (wk_purge_skip > 0)
		wk_purge_skip--;
	else
	{
		purged = wk_purge();
		if (purged == 0)
			wk_purge_skip = WK_PURGE_IDLE_ROUNDS - 1;
	}
	wk_due_check();

	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	wk_slot->state = OBW_IDLE;
	wk_slot->last_run = GetCurrentTimestamp();
	if (purged >= 0)
		wk_slot->last_purged = purged;
	wk_slot->runs++;
	LWLockRelease(OutboxShared->lock);
}

/*
 * True while our upkeep worker is starting or running; *pid is its process
 * (0 while it starts).
 */
static bool
wk_upkeep_running(pid_t *pid)
{
	*pid = 0;
	if (wk_upkeep == NULL)
		return false;
	switch (GetBackgroundWorkerPid(wk_upkeep, pid))
	{
		case BGWH_STARTED:
		case BGWH_NOT_YET_STARTED:
			return true;
		default:
			pfree(wk_upkeep);
			wk_upkeep = NULL;
			return false;
	}
}

/*
 * Give way to DDL on the database, and stop when the extension is gone.
 * Cheap: one conditional lock and one syscache look-up.  While an upkeep
 * worker runs, also stop it when anyone waits for a lock on the
 * extension's tables (see upkeep.c).
 */
static void
wk_check(void)
{
	bool		present;
	bool		opposed = false;
	pid_t		pid;

	wk_next_check = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), WK_CHECK_MS);
	if (!ob_database_free(MyDatabaseId))
		wk_exit(OBX_DATABASE_BUSY);
	StartTransactionCommand();
	present = OidIsValid(get_extension_oid("outbox", true));
	if (present && !wk_upkeep_stopped && wk_upkeep_running(&pid))
		opposed = !OutboxUpkeepUnopposed(pid);
	CommitTransactionCommand();
	if (!present)
		wk_exit(OBX_NO_EXTENSION);
	if (opposed)
	{
		TerminateBackgroundWorker(wk_upkeep);
		wk_upkeep_stopped = true;
		ereport(LOG,
				(errmsg("outbox worker for database \"%s\" stopped its index upkeep: another session is waiting for a lock on the extension's tables",
						wk_dbname)));
	}
}

/*
 * Between two steps of measuring the indexes: answer signals, give way to
 * DDL, send wake-ups (the round's time budget does not apply).
 */
static void
wk_between_steps(void)
{
	(void) wk_between_batches();
}

/*
 * Every outbox.index_check_interval, measure the indexes of the extension's
 * tables, and start an upkeep worker if one needs a rebuild (or a rebuild
 * left something behind).
 */
static void
wk_index_check(TimestampTz now)
{
	pid_t		pid;

	wk_next_upkeep = TimestampTzPlusMilliseconds(now, outbox_index_check_interval_ms);
	if (outbox_index_bloat <= 0 || wk_upkeep_running(&pid))
		return;
	if (OutboxUpkeepFind(wk_transaction, wk_between_steps, true) == NIL)
		return;
	wk_upkeep_stopped = false;
	if (!OutboxStartUpkeep(&wk_upkeep))
		ereport(LOG,
				(errmsg("outbox worker for database \"%s\" could not start its index upkeep: no background worker slot is free",
						wk_dbname)));
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
	TimestampTz next_round;
	TimestampTz last_round = 0;
	MemoryContext loopcxt;

	memcpy(&dboid, MyBgworkerEntry->bgw_extra, sizeof(Oid));
	memcpy(&wk_generation, MyBgworkerEntry->bgw_extra + sizeof(Oid), sizeof(uint32));

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	if (OutboxShared == NULL || slotno < 0 || slotno >= OutboxShared->nslots)
		proc_exit(0);
	wk_slot = &OutboxShared->slots[slotno];
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
	wk_dbname = MemoryContextStrdup(TopMemoryContext,
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
			(errmsg("outbox worker for database \"%s\" started", wk_dbname)));

	loopcxt = AllocSetContextCreate(TopMemoryContext, "outbox worker loop",
									ALLOCSET_DEFAULT_SIZES);
	next_round = 0;
	wk_last_due_check = GetCurrentTimestamp();
	wk_next_upkeep = TimestampTzPlusMilliseconds(wk_last_due_check,
												 outbox_index_check_interval_ms);

	for (;;)
	{
		TimestampTz now;
		TimestampTz wake;

		MemoryContextSwitchTo(loopcxt);
		MemoryContextReset(loopcxt);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			wk_reload();
			if (last_round != 0)
				next_round = TimestampTzPlusMilliseconds(last_round, outbox_naptime_ms);
		}

		now = GetCurrentTimestamp();
		if (now >= wk_next_check)
		{
			/*
			 * Also look at what is due: a retry backoff set by fail() or a
			 * command requeued by hand wakes nobody, so this bounds their
			 * announcement delay by WK_CHECK_MS whatever the nap time.
			 */
			wk_check();
			wk_due_check();
		}

		if (now >= wk_next_upkeep)
			wk_index_check(now);

		if (now >= next_round)
		{
			last_round = now;
			wk_round();
			next_round = TimestampTzPlusMilliseconds(last_round, outbox_naptime_ms);
		}
		else if (wk_next_due != 0 && now >= wk_next_due)
		{
			/* A delayed command or a lease reached its time. */
			wk_round_start = now;
			wk_sweep();
			wk_due_check();
		}
		wk_serve_wakeups();

		wake = Min(next_round, wk_next_check);
		wake = Min(wake, wk_next_upkeep);
		if (wk_next_due != 0)
			wake = Min(wake, wk_next_due);
		if (wk_hold_until != 0)
			wake = Min(wake, wk_hold_until);
		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 ob_ms_until(GetCurrentTimestamp(), wake),
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* ----------------------------------------------------------------
 * outbox.workers
 * ----------------------------------------------------------------
 */

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
