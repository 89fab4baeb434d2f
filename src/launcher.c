/*-------------------------------------------------------------------------
 *
 * launcher.c
 *		The launcher: one per-database worker in every database that has the
 *		extension.
 *
 * One launcher, registered at preload, connects to no database (it reads
 * only the shared catalog pg_database).  It keeps a private table of the
 * databases that accept connections and are not templates, and starts one
 * dynamic worker per database (worker.c), in a slot of OutboxShared.  It
 * cannot see pg_extension of another database (nor pg_shdepend: a process
 * without a database can only open the shared catalogs that are nailed in
 * the relation cache), so the worker is also the probe: a worker that finds
 * no extension exits at once, saying so in its slot, and the launcher then
 * leaves that database alone until a request names it or the launcher
 * restarts.  Requests are queued in OutboxShared->requests (shared.c),
 * which sets the launcher's latch, so the worker starts at once, by every
 * way the extension can arrive: the commit of CREATE EXTENSION outbox (the
 * install script calls outbox._request_worker(); a restore runs it too);
 * COMMIT PREPARED of a transaction that installed it (the prepared
 * transaction's request is kept in shared memory until then); and COMMIT
 * PREPARED in a database that has the extension and no worker (a
 * transaction prepared before a restart, whose kept request is gone).  The
 * launcher rescans pg_database every LN_RESCAN_MS to find new databases
 * (say, copies of a template that has the extension) and forget dropped
 * ones, and takes requests at every wake-up.  Workers are registered with
 * BGW_NEVER_RESTART: the launcher owns the restart policy.  It restarts a
 * worker that died (killed, or failed) after a delay that grows with
 * repeated failures, does not restart one that found no extension, and
 * retries later one that gave way to a command on its database.  After a
 * crash of any backend the postmaster reinitialises shared memory and
 * restarts the launcher, which starts every worker again.
 *
 * Calls shared.c (the request queue, prepared transactions) and bgw.c
 * (registration, the database lock probe).
 *
 * Locking.  OutboxShared->lock, briefly, to assign, free and read slots and
 * to take the request queue; a slot's generation is bumped each time the
 * launcher assigns it, and a worker only takes up a slot whose generation
 * matches the one it was started for.  AccessShareLock on pg_database while
 * it reads it.  The lock of a database object,
 * conditionally and released at once, before it starts a worker there.
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
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
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

	if (!OutboxDatabaseFree(db->dboid))
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
		OutboxResolvePrepared();	/* may queue a request */
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
						 OutboxMsUntil(GetCurrentTimestamp(), wake),
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
