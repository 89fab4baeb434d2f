/*-------------------------------------------------------------------------
 *
 * upkeep.c
 *		Index upkeep: rebuild an index of the extension's tables that a long
 *		transaction left mostly empty.
 *
 * While any transaction holds back the xmin horizon, vacuum removes no row
 * version of the outbox, and every command that flows through in the
 * meantime leaves its versions in every index.  Once the horizon moves on,
 * vacuum empties those pages again, but a B-tree never gives pages back:
 * the indexes keep the size the longest hold made them take (the heap
 * mostly shrinks back, as the purge frees its oldest pages and vacuum
 * truncates them).
 *
 * So every outbox.index_check_interval the per-database worker measures
 * each index of outbox.commands, receipts and inbox, reading its pages (UP_STEP_PAGES per
 * transaction, answering wake-ups and DDL between steps): the bytes its
 * leaf pages use (entries, line pointers, high key) against the pages it
 * has.  An index of at least UP_MIN_PAGES pages that has outbox.index_bloat
 * times the pages its entries would need (leaf pages filled to the index's
 * fillfactor, plus its internal pages and meta page) is rebuilt.  The
 * measure counts entries of dead row versions that vacuum has not removed
 * yet as used, so an index is never rebuilt while a long transaction is
 * still open, only after vacuum has caught up.
 *
 * The rebuild runs REINDEX INDEX CONCURRENTLY, which never blocks producers
 * or publishers, in a separate short-lived background worker ("outbox
 * upkeep"), because it waits for older transactions and the per-database
 * worker must keep doing its duties meanwhile.  It must run at top level
 * (it commits several transactions), so the upkeep worker calls
 * ProcessUtility as a client's simple query would, not through SPI.  It
 * first drops what an interrupted rebuild left behind (an invalid
 * <index>_ccnew or <index>_ccold, when no rebuild holds its table), then
 * rebuilds what needs it, then exits.
 *
 * It gives way like the per-database worker does: that worker's index duty
 * (duties.c), at each of the loop's checks (every half second) while the
 * upkeep runs, looks in the lock table for any other session waiting for a
 * lock on the tables or their indexes (VACUUM, ANALYZE, DROP EXTENSION,
 * ALTER TABLE ... wait for the rebuild's lock), and the loop checks the
 * database lock of new connections; if either is taken the upkeep worker
 * is stopped, and its REINDEX is rolled back (the next upkeep drops its
 * leftover).  It is also stopped when the per-database worker exits.
 *
 * On a distributed outbox (docs/citus.md) a worker node looks after the
 * indexes of its shards of those tables (plain tables there, which REINDEX
 * CONCURRENTLY rebuilds as any other), and the coordinator after none.
 *
 * Calls bgw.c (registration) and citus.c (the shards); the transaction
 * runner it measures with is passed in by its caller.
 *
 * Locking.  AccessShareLock on the tables looked after and their indexes,
 * conditionally (what cannot be locked is skipped); ShareUpdateExclusiveLock
 * on a table, conditionally and released at once, to tell a leftover from
 * a rebuild in progress; the locks of REINDEX / DROP INDEX CONCURRENTLY in
 * the upkeep worker.  GetLockStatusData reads the lock table.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/nbtree.h"
#include "access/relation.h"
#include "access/xact.h"
#include "access/genam.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "nodes/plannodes.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/bufmgr.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "tcop/tcopprot.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "outbox.h"

/* Smaller indexes are never rebuilt: 1 MB. */
#define UP_MIN_PAGES		((BlockNumber) (1024 * 1024 / BLCKSZ))
/* Pages read in one transaction (1 MB): a step takes about a millisecond. */
#define UP_STEP_PAGES		128

/* One statement of upkeep work. */
typedef struct UpWork
{
	char	   *sql;
	char	   *index;			/* the index it is about, unqualified */
	bool		rebuild;		/* REINDEX (else a DROP of a leftover) */
} UpWork;

/*
 * The extension's tables whose indexes are looked after: those that rows
 * leave.  The event log and the tombstones only grow (nothing of the
 * extension deletes from them), and the policies are a handful of rows.
 * On a distributed outbox (docs/citus.md) these are a worker node's shards
 * of them, and none on the coordinator (its tables are empty shells).
 */
static const char *const up_tables[] = {"commands", "receipts", "inbox"};

#define UP_NTABLES	((int) lengthof(up_tables))

/* The extension's schema, or InvalidOid when the extension is not here. */
static Oid
up_schema(void)
{
	if (!OidIsValid(get_extension_oid("outbox", true)))
		return InvalidOid;
	return get_namespace_oid("outbox", true);
}

/* An index to look at, and what has been measured of it so far. */
typedef struct UpIndex
{
	Oid			tableid;
	Oid			indexid;
	BlockNumber next;			/* next block to read */
	BlockNumber inner;			/* internal pages seen */
	double		leaf_bytes;		/* bytes used on live leaf pages */
} UpIndex;

/* The state of a search for work (OutboxUpkeepFind). */
typedef struct UpFind
{
	MemoryContext cxt;			/* where the results go */
	List	   *indexes;		/* of UpIndex */
	UpIndex    *cur;			/* the one being measured */
	bool		done;			/* cur is measured (or skipped) */
	List	   *drops;			/* of UpWork */
	List	   *rebuilds;		/* of UpWork */
} UpFind;

/* The statement that rebuilds index, or drops it (a leftover). */
static UpWork *
up_work(Relation index, bool rebuild)
{
	UpWork	   *w = palloc(sizeof(UpWork));

	w->sql = psprintf("%s %s",
					  rebuild ? "REINDEX INDEX CONCURRENTLY" : "DROP INDEX CONCURRENTLY",
					  quote_qualified_identifier(get_namespace_name(RelationGetNamespace(index)),
												 RelationGetRelationName(index)));
	w->index = pstrdup(RelationGetRelationName(index));
	w->rebuild = rebuild;
	return w;
}

/*
 * The names of the tables looked after, in the caller's memory context: the
 * three of up_tables, or on a distributed outbox this node's shards of them
 * (outbox._citus_local_shards(), read through SPI, which may be nested).
 */
static List *
up_table_names(void)
{
	MemoryContext caller = CurrentMemoryContext;
	List	   *names = NIL;
	uint64		i;
	int			t;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (!OutboxCitusDistributed())
	{
		MemoryContextSwitchTo(caller);
		for (t = 0; t < UP_NTABLES; t++)
			names = lappend(names, pstrdup(up_tables[t]));
	}
	else if (!OutboxCitusCoordinator())
	{
		if (SPI_execute("SELECT (pg_catalog.parse_ident(s.commands))[2], (pg_catalog.parse_ident(s.receipts))[2],"
						"       (pg_catalog.parse_ident(s.inbox))[2]"
						"  FROM outbox._citus_local_shards() s", true, 0) != SPI_OK_SELECT)
			elog(ERROR, "outbox: could not list this node's shards");
		for (i = 0; i < SPI_processed; i++)
			for (t = 0; t < UP_NTABLES; t++)
			{
				char	   *name = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, t + 1);
				MemoryContext old = MemoryContextSwitchTo(caller);

				names = lappend(names, pstrdup(name));
				MemoryContextSwitchTo(old);
			}
	}
	SPI_finish();
	return names;
}

/*
 * Lock the tables looked after (AccessShareLock, conditionally) and read
 * their index lists: *relids and *indexes get one entry per table
 * (InvalidOid and NIL for a table that is missing or could not be locked).
 * False if any such table.
 */
static bool
up_lock_tables(Oid nsp, List **relids, List **indexes)
{
	bool		all = true;
	ListCell   *lc;

	*relids = NIL;
	*indexes = NIL;
	foreach(lc, up_table_names())
	{
		Oid			relid = get_relname_relid((const char *) lfirst(lc), nsp);
		Relation	rel = NULL;

		if (OidIsValid(relid) && ConditionalLockRelationOid(relid, AccessShareLock))
			rel = try_relation_open(relid, NoLock);
		if (rel == NULL)
		{
			all = false;
			*relids = lappend_oid(*relids, InvalidOid);
			*indexes = lappend(*indexes, NIL);
			continue;
		}
		*relids = lappend_oid(*relids, relid);
		*indexes = lappend(*indexes, RelationGetIndexList(rel));
		relation_close(rel, NoLock);
	}
	return all;
}

/* Duty: list the indexes of the tables looked after. */
static bool
up_list_duty(void *arg)
{
	UpFind	   *f = (UpFind *) arg;
	Oid			nsp = up_schema();
	List	   *relids;
	List	   *indexes;
	MemoryContext oldcxt;
	ListCell   *lr;
	ListCell   *li;

	if (!OidIsValid(nsp))
		return false;
	(void) up_lock_tables(nsp, &relids, &indexes);
	oldcxt = MemoryContextSwitchTo(f->cxt);
	forboth(lr, relids, li, indexes)
	{
		ListCell   *lc;

		foreach(lc, (List *) lfirst(li))
		{
			UpIndex    *ix = palloc0(sizeof(UpIndex));

			ix->tableid = lfirst_oid(lr);
			ix->indexid = lfirst_oid(lc);
			ix->next = BTREE_METAPAGE + 1;
			f->indexes = lappend(f->indexes, ix);
		}
	}
	MemoryContextSwitchTo(oldcxt);
	return true;
}

/*
 * Duty: one step of looking at f->cur.  An invalid index named like the
 * leftover of an interrupted concurrent rebuild is to be dropped, unless a
 * rebuild holds its table right now (it may be that rebuild's own new
 * index).  A valid B-tree of at least UP_MIN_PAGES is read UP_STEP_PAGES
 * pages at a time: the bytes its live leaf pages use (entries, line
 * pointers, high key) and its internal pages; deleted and half-dead pages
 * count as free.  When the last page is read, it is to be rebuilt if it has
 * outbox.index_bloat times the pages a fresh build would need (leaf pages
 * filled to the index's fillfactor).  Locks are taken conditionally: an
 * index that cannot be locked is skipped.
 */
static bool
up_step_duty(void *arg)
{
	UpFind	   *f = (UpFind *) arg;
	UpIndex    *ix = f->cur;
	BufferAccessStrategy strategy;
	Relation	index;
	BlockNumber nblocks;
	BlockNumber stop;
	BlockNumber blkno;
	double		usable;
	double		needed;
	MemoryContext oldcxt;

	f->done = true;
	if (!ConditionalLockRelationOid(ix->tableid, AccessShareLock) ||
		!ConditionalLockRelationOid(ix->indexid, AccessShareLock) ||
		(index = try_relation_open(ix->indexid, NoLock)) == NULL)
		return true;
	if (index->rd_rel->relkind != RELKIND_INDEX)
	{
		relation_close(index, NoLock);
		return true;
	}

	if (!index->rd_index->indisvalid)
	{
		const char *name = RelationGetRelationName(index);

		if ((strstr(name, "_ccnew") != NULL || strstr(name, "_ccold") != NULL) &&
			ConditionalLockRelationOid(ix->tableid, ShareUpdateExclusiveLock))
		{
			UnlockRelationOid(ix->tableid, ShareUpdateExclusiveLock);
			oldcxt = MemoryContextSwitchTo(f->cxt);
			f->drops = lappend(f->drops, up_work(index, false));
			MemoryContextSwitchTo(oldcxt);
		}
		relation_close(index, NoLock);
		return true;
	}

	nblocks = RelationGetNumberOfBlocks(index);
	if (index->rd_rel->relam != BTREE_AM_OID || nblocks < UP_MIN_PAGES)
	{
		relation_close(index, NoLock);
		return true;
	}

	usable = BLCKSZ - SizeOfPageHeaderData - MAXALIGN(sizeof(BTPageOpaqueData));
	stop = Min(nblocks, ix->next + UP_STEP_PAGES);
	strategy = GetAccessStrategy(BAS_BULKREAD);
	for (blkno = ix->next; blkno < stop; blkno++)
	{
		Buffer		buf;
		Page		page;

		CHECK_FOR_INTERRUPTS();
		buf = ReadBufferExtended(index, MAIN_FORKNUM, blkno, RBM_NORMAL, strategy);
		LockBuffer(buf, BUFFER_LOCK_SHARE);
		page = BufferGetPage(buf);
		if (!PageIsNew(page) &&
			PageGetSpecialSize(page) == MAXALIGN(sizeof(BTPageOpaqueData)))
		{
			BTPageOpaque opaque = BTPageGetOpaque(page);

			if (P_IGNORE(opaque))
				;				/* deleted or half-dead: free */
			else if (P_ISLEAF(opaque))
				ix->leaf_bytes += usable - PageGetExactFreeSpace(page);
			else
				ix->inner++;
		}
		UnlockReleaseBuffer(buf);
	}
	FreeAccessStrategy(strategy);
	ix->next = stop;

	if (stop < nblocks)
		f->done = false;
	else
	{
		needed = 1 + ix->inner +
			ceil(ix->leaf_bytes / (usable * BTGetFillFactor(index) / 100.0));
		if (nblocks >= outbox_index_bloat * needed)
		{
			oldcxt = MemoryContextSwitchTo(f->cxt);
			f->rebuilds = lappend(f->rebuilds, up_work(index, true));
			MemoryContextSwitchTo(oldcxt);
		}
	}
	relation_close(index, NoLock);
	return true;
}

/*
 * What index upkeep there is to do: a list of UpWork in the caller's memory
 * context, drops of rebuild leftovers first.  Each step runs in its own
 * transaction through run(); between steps (outside any transaction)
 * between(), if given, is called.  With first_only it ends at the first
 * thing found.
 */
List *
OutboxUpkeepFind(OutboxRunner run, void (*between) (void), bool first_only)
{
	UpFind		f;
	ListCell   *lc;

	memset(&f, 0, sizeof(f));
	f.cxt = CurrentMemoryContext;
	if (outbox_index_bloat <= 0 ||
		!run("outbox: listing indexes", up_list_duty, &f))
		return NIL;
	foreach(lc, f.indexes)
	{
		f.cur = (UpIndex *) lfirst(lc);
		do
		{
			if (!run("outbox: measuring indexes", up_step_duty, &f))
				f.done = true;
			if (between != NULL)
				between();
		} while (!f.done);
		if (first_only && (f.drops != NIL || f.rebuilds != NIL))
			break;
	}
	return list_concat(f.drops, f.rebuilds);
}

/*
 * Run one utility statement at top level, in transactions of its own, as
 * a client's simple query would.
 */
static void
up_run_toplevel(const char *sql)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	MemoryContext cxt = AllocSetContextCreate(TopMemoryContext, "outbox upkeep",
											  ALLOCSET_DEFAULT_SIZES);
	RawStmt    *raw;
	PlannedStmt *stmt;

	pgstat_report_activity(STATE_RUNNING, sql);
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	MemoryContextSwitchTo(cxt);
	raw = linitial_node(RawStmt, pg_parse_query(sql));
	stmt = makeNode(PlannedStmt);
	stmt->commandType = CMD_UTILITY;
	stmt->canSetTag = true;
	stmt->utilityStmt = raw->stmt;
	stmt->stmt_location = raw->stmt_location;
	stmt->stmt_len = raw->stmt_len;

	/* The statement keeps memory across its own commits here. */
	PortalContext = cxt;
	PushActiveSnapshot(GetTransactionSnapshot());
	ProcessUtility(stmt, sql, false, PROCESS_UTILITY_TOPLEVEL, NULL, NULL,
				   None_Receiver, NULL);
	if (ActiveSnapshotSet())
		PopActiveSnapshot();
	CommitTransactionCommand();
	PortalContext = NULL;
	MemoryContextSwitchTo(oldcxt);
	MemoryContextDelete(cxt);
	pgstat_report_activity(STATE_IDLE, NULL);
}

/* Size in kB of an index of the extension's schema, 0 if it is gone. */
static int64
up_size_kb(const char *name)
{
	Oid			nsp;
	Oid			relid;
	Relation	rel;
	int64		kb = 0;

	StartTransactionCommand();
	nsp = up_schema();
	relid = OidIsValid(nsp) ? get_relname_relid(name, nsp) : InvalidOid;
	if (OidIsValid(relid) && (rel = try_relation_open(relid, AccessShareLock)) != NULL)
	{
		kb = (int64) RelationGetNumberOfBlocks(rel) * (BLCKSZ / 1024);
		relation_close(rel, AccessShareLock);
	}
	CommitTransactionCommand();
	return kb;
}

/* Run one duty in a transaction of the upkeep worker (an error ends it). */
static bool
up_transaction(const char *what, OutboxTxnBody duty, void *arg)
{
	bool		ok;

	pgstat_report_activity(STATE_RUNNING, what);
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	ok = duty(arg);
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	return ok;
}

/*
 * Upkeep worker entry point: bgw_extra holds the database.  Finds the work
 * again (it may have changed since the per-database worker looked), does
 * it, and exits.
 */
void
OutboxUpkeepMain(Datum main_arg)
{
	Oid			dboid;
	List	   *work;
	ListCell   *lc;
	MemoryContext cxt;

	memcpy(&dboid, MyBgworkerEntry->bgw_extra, sizeof(Oid));
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	SetConfigOption("application_name", "outbox upkeep", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("jit", "off", PGC_SUSET, PGC_S_OVERRIDE);

	cxt = AllocSetContextCreate(TopMemoryContext, "outbox upkeep work",
								ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(cxt);
	work = OutboxUpkeepFind(up_transaction, NULL, false);

	foreach(lc, work)
	{
		UpWork	   *w = (UpWork *) lfirst(lc);
		int64		before = up_size_kb(w->index);

		up_run_toplevel(w->sql);
		if (w->rebuild)
			ereport(LOG,
					(errmsg("outbox upkeep rebuilt index \"%s\": " INT64_FORMAT " kB before, " INT64_FORMAT " kB after",
							w->index, before, up_size_kb(w->index))));
		else
			ereport(LOG,
					(errmsg("outbox upkeep dropped index \"%s\", left by an interrupted rebuild",
							w->index)));
	}
	proc_exit(0);
}

/*
 * Start an upkeep worker for the current database (called by its
 * per-database worker).  False if no background worker slot is free.
 */
bool
OutboxStartUpkeep(BackgroundWorkerHandle **handle)
{
	char		name[BGW_MAXLEN];

	snprintf(name, sizeof(name), "outbox upkeep for database %u", MyDatabaseId);
	return OutboxRegisterWorker("OutboxUpkeepMain", "outbox upkeep", name,
								(Datum) 0, &MyDatabaseId, sizeof(Oid), handle);
}

/*
 * True while no session but the upkeep worker (pid) waits for a lock on
 * one of the tables looked after or one of their indexes.  Never waits.
 * Call inside a transaction.  (The worker's loop checks the database lock
 * of new connections itself, in wk_check.)
 */
bool
OutboxUpkeepUnopposed(int pid)
{
	Oid			nsp = up_schema();
	List	   *relids;
	List	   *indexes;
	List	   *watched = NIL;
	LockData   *locks;
	ListCell   *lr;
	ListCell   *li;
	int			i;

	/* Locking fails as well when a waiter's lock would conflict with ours. */
	if (!OidIsValid(nsp) || !up_lock_tables(nsp, &relids, &indexes))
		return false;
	forboth(lr, relids, li, indexes)
		watched = list_concat(lappend_oid(watched, lfirst_oid(lr)), (List *) lfirst(li));

	locks = GetLockStatusData();
	for (i = 0; i < locks->nelements; i++)
	{
		LockInstanceData *l = &locks->locks[i];

		if (l->waitLockMode != NoLock && l->pid != pid &&
			l->locktag.locktag_type == LOCKTAG_RELATION &&
			l->locktag.locktag_field1 == MyDatabaseId &&
			list_member_oid(watched, l->locktag.locktag_field2))
			return false;
	}
	return true;
}
