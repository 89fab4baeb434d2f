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
 * each index of the extension's tables, reading its pages: the bytes its
 * leaf pages use (entries, line pointers, high key) against the pages it
 * has.  An index of at least UP_MIN_PAGES pages that has outbox.index_bloat
 * times the pages its entries would need (leaf pages filled to the B-tree's
 * default 90%, plus its internal pages and meta page) is rebuilt.  The
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
 * <index>_ccnew or <index>_ccold), then rebuilds what needs it, then exits.
 *
 * It gives way like the per-database worker does: that worker, every half
 * second while the upkeep runs, tries (conditionally, and releases at
 * once) a row-exclusive lock on each of the extension's tables and the
 * database lock of new connections; if anyone is waiting for a conflicting
 * lock (DROP EXTENSION, DROP DATABASE, ALTER TABLE ...) it stops the
 * upkeep worker, whose REINDEX is then rolled back (the next upkeep drops
 * its leftover).  It also stops it when it exits itself.
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
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "nodes/plannodes.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/bufmgr.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
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
/* The fill of a freshly built B-tree leaf page (BTREE_DEFAULT_FILLFACTOR). */
#define UP_LEAF_FILL		0.90

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
 */
static const char *const up_tables[] = {"commands", "receipts", "inbox"};

#define UP_NTABLES	((int) lengthof(up_tables))

/*
 * The pages of a B-tree: all of them, and how many its live pages would
 * need if packed as a new build packs them.
 */
static void
up_measure(Relation index, BlockNumber *pages, BlockNumber *needed)
{
	BufferAccessStrategy strategy = GetAccessStrategy(BAS_BULKREAD);
	BlockNumber nblocks = RelationGetNumberOfBlocks(index);
	BlockNumber blkno;
	BlockNumber inner = 0;
	double		leaf_bytes = 0;
	double		usable = 0;

	/* Block 0 is the meta page. */
	for (blkno = BTREE_METAPAGE + 1; blkno < nblocks; blkno++)
	{
		Buffer		buf;
		Page		page;
		BTPageOpaque opaque;

		CHECK_FOR_INTERRUPTS();
		buf = ReadBufferExtended(index, MAIN_FORKNUM, blkno, RBM_NORMAL, strategy);
		LockBuffer(buf, BUFFER_LOCK_SHARE);
		page = BufferGetPage(buf);
		if (!PageIsNew(page) &&
			PageGetSpecialSize(page) == MAXALIGN(sizeof(BTPageOpaqueData)))
		{
			opaque = BTPageGetOpaque(page);
			usable = ((PageHeader) page)->pd_special - SizeOfPageHeaderData;
			if (P_IGNORE(opaque))
				;				/* deleted or half-dead: free */
			else if (P_ISLEAF(opaque))
				leaf_bytes += usable - PageGetExactFreeSpace(page);
			else
				inner++;
		}
		UnlockReleaseBuffer(buf);
	}
	FreeAccessStrategy(strategy);

	*pages = nblocks;
	*needed = 1 + inner;
	if (usable > 0)
		*needed += (BlockNumber) ceil(leaf_bytes / (usable * UP_LEAF_FILL));
}

/* The extension's schema, or InvalidOid when the extension is not here. */
static Oid
up_schema(void)
{
	if (!OidIsValid(get_extension_oid("outbox", true)))
		return InvalidOid;
	return get_namespace_oid("outbox", true);
}

static UpWork *
up_work(const char *command, const char *qualified, Relation index)
{
	UpWork	   *w = palloc(sizeof(UpWork));

	w->sql = psprintf("%s %s", command, qualified);
	w->index = pstrdup(RelationGetRelationName(index));
	w->rebuild = command[0] == 'R';
	return w;
}

/*
 * What index upkeep there is to do: a list of UpWork (in the
 * current memory context), drops of rebuild leftovers first.  Takes every
 * lock conditionally and skips what it cannot lock.  Call inside a
 * transaction.
 */
List *
OutboxUpkeepWork(void)
{
	List	   *drops = NIL;
	List	   *rebuilds = NIL;
	Oid			nsp = up_schema();
	const char *nspname;
	int			t;

	if (!OidIsValid(nsp) || outbox_index_bloat <= 0)
		return NIL;
	nspname = get_namespace_name(nsp);
	for (t = 0; t < UP_NTABLES; t++)
	{
		Oid			relid = get_relname_relid(up_tables[t], nsp);
		Relation	rel;
		List	   *indexes;
		ListCell   *lc;

		if (!OidIsValid(relid) || !ConditionalLockRelationOid(relid, AccessShareLock))
			continue;
		rel = relation_open(relid, NoLock);
		indexes = RelationGetIndexList(rel);
		relation_close(rel, NoLock);

		foreach(lc, indexes)
		{
			Oid			indexid = lfirst_oid(lc);
			Relation	index;
			const char *name;
			BlockNumber pages;
			BlockNumber needed;

			if (!ConditionalLockRelationOid(indexid, AccessShareLock))
				continue;
			index = index_open(indexid, NoLock);
			name = quote_qualified_identifier(nspname, RelationGetRelationName(index));
			if (!index->rd_index->indisvalid)
			{
				/* Left by an interrupted rebuild (ours, or anyone's). */
				if (strstr(RelationGetRelationName(index), "_ccnew") != NULL ||
					strstr(RelationGetRelationName(index), "_ccold") != NULL)
					drops = lappend(drops, up_work("DROP INDEX CONCURRENTLY", name, index));
			}
			else if (index->rd_rel->relam == BTREE_AM_OID &&
					 RelationGetNumberOfBlocks(index) >= UP_MIN_PAGES)
			{
				up_measure(index, &pages, &needed);
				if (pages >= UP_MIN_PAGES &&
					pages >= outbox_index_bloat * needed)
					rebuilds = lappend(rebuilds,
									   up_work("REINDEX INDEX CONCURRENTLY", name, index));
			}
			index_close(index, NoLock);
		}
	}
	return list_concat(drops, rebuilds);
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
	StartTransactionCommand();
	MemoryContextSwitchTo(cxt);
	work = OutboxUpkeepWork();
	CommitTransactionCommand();
	MemoryContextSwitchTo(cxt);

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
	BackgroundWorker bgw;
	MemoryContext oldcxt;
	bool		ok;

	memset(&bgw, 0, sizeof(bgw));
	bgw.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	bgw.bgw_start_time = BgWorkerStart_RecoveryFinished;
	bgw.bgw_restart_time = BGW_NEVER_RESTART;
	strlcpy(bgw.bgw_library_name, "outbox", BGW_MAXLEN);
	strlcpy(bgw.bgw_function_name, "OutboxUpkeepMain", BGW_MAXLEN);
	snprintf(bgw.bgw_name, BGW_MAXLEN, "outbox upkeep for database %u", MyDatabaseId);
	strlcpy(bgw.bgw_type, "outbox upkeep", BGW_MAXLEN);
	memcpy(bgw.bgw_extra, &MyDatabaseId, sizeof(Oid));
	bgw.bgw_notify_pid = MyProcPid;

	oldcxt = MemoryContextSwitchTo(TopMemoryContext);
	ok = RegisterDynamicBackgroundWorker(&bgw, handle);
	MemoryContextSwitchTo(oldcxt);
	if (!ok)
		*handle = NULL;
	return ok;
}

/*
 * True while nobody waits for a lock on one of the extension's tables that
 * a row-exclusive one would conflict with, nor for the database.  Never
 * waits.  Call inside a transaction.
 */
bool
OutboxUpkeepUnopposed(void)
{
	Oid			nsp = up_schema();
	int			t;

	if (!OidIsValid(nsp))
		return false;
	for (t = 0; t < UP_NTABLES; t++)
	{
		Oid			relid = get_relname_relid(up_tables[t], nsp);

		if (!OidIsValid(relid))
			return false;
		if (!ConditionalLockRelationOid(relid, RowExclusiveLock))
			return false;
		UnlockRelationOid(relid, RowExclusiveLock);
	}
	return true;
}
