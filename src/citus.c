/*-------------------------------------------------------------------------
 *
 * citus.c
 *		What the extension does differently in a database with Citus.
 *
 * Keyed on whether Citus is loaded and installed in the current database,
 * and whether the outbox is distributed there (docs/citus.md):
 *
 * - The plan mode of the saved plans (OutboxPlanOptions, read by
 *   plans.c).  Without Citus every statement is saved as a generic plan.
 *   On a distributed table Citus makes a generic plan that fails on purpose
 *   for every statement it cannot route at execution time (one with a
 *   subquery, a CTE or a stable function over the table's columns), and
 *   relies on the plan cache to replace it by a custom plan: forced
 *   generic, the statement fails.  With Citus the plans are custom, planned
 *   for each call's values, so that Citus's router planner sees the run_id
 *   of the call and sends the statement to the one shard that holds it.
 *
 * - The claim of a distributed outbox (src/lease.c) runs on the node that
 *   holds the shards: OutboxCitusLocalShards lists this node's shards of
 *   outbox.commands from Citus's metadata, and OutboxCitusShardPlan makes
 *   the claim statement's plan for one of them, against the shard's own
 *   table (a plain table on its node), where FOR NO KEY UPDATE SKIP
 *   LOCKED works as on a single server.  Citus refuses row locks in a
 *   statement over several shards.
 *
 * - Whether the outbox is distributed (OutboxCitusDistributed, asked by
 *   every API call and worker round) and whether this node is the
 *   coordinator: read from pg_dist_partition once per backend, kept until
 *   a relcache invalidation of outbox.events, which Citus sends on every
 *   node whenever the table's metadata is added or removed.
 *
 * - The trigger outbox.distribute() puts on the reference table
 *   outbox.lease_key (outbox_citus_lease_key_changed): a rotation of the
 *   key invalidates the key's cache (src/leasekey.c) on every node.
 *
 * - Two more pieces of a distributed outbox live elsewhere: the trigger
 *   on the shards of outbox.commands that wakes a node's worker at the
 *   commit of a decision routed from the coordinator
 *   (outbox_citus_commands_inserted, src/shared.c, which owns the
 *   wake-ups), and the worker's duty that gives a node added after
 *   distribute() the distributed outbox's keys (citus_keys, src/duties.c).
 *
 * - DROP EXTENSION outbox on the coordinator of a distributed outbox (a
 *   utility hook, installed whenever the library is loaded): Citus leaves
 *   an extension's shards behind when the extension is dropped, so the hook
 *   first runs outbox._before_drop() (src/sql/50_citus.sql), which
 *   undistributes the tables, in the DROP's own transaction.
 *
 * A bottom layer: it calls no other file of the extension (plans.c,
 * lease.c, producer.c and duties.c call it).
 *
 * Locking: none of its own; _before_drop() takes the locks of the DDL and
 * of Citus's metadata functions it runs.  The cached answers are
 * backend-local.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <ctype.h>

#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_citus_lease_key_changed);

static ProcessUtility_hook_type ci_prev_process_utility = NULL;

static void ci_process_utility(PlannedStmt *pstmt, const char *queryString,
							   bool readOnlyTree, ProcessUtilityContext context,
							   ParamListInfo params, QueryEnvironment *queryEnv,
							   DestReceiver *dest, QueryCompletion *qc);

/* Install the utility hook (from _PG_init, preloaded or not). */
void
OutboxCitusInit(void)
{
	ci_prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = ci_process_utility;
}

/*
 * True when Citus is loaded in this process: it must be preloaded, and
 * defines citus.version then.  Asked of the settings once the preloaded
 * libraries are all loaded, and then kept for the process's life (the API
 * asks in every call).
 */
bool
OutboxCitusLoaded(void)
{
	static int	loaded = -1;
	bool		now;

	if (loaded >= 0)
		return loaded;
	now = GetConfigOption("citus.version", true, false) != NULL;
	if (process_shared_preload_libraries_done)
		loaded = now;
	return now;
}

/*
 * True when Citus is loaded in this process and the extension citus is
 * installed in the current database.
 */
bool
OutboxCitusInstalled(void)
{
	return OutboxCitusLoaded() &&
		OidIsValid(get_extension_oid("citus", true));
}

/*
 * Prepare and keep a plan in *cache, unless there is one (as OutboxPrepare
 * does; plans.c is not called, as it calls this file): the queries of
 * Citus's catalogs, without parameters (cursor options 0: a plan without
 * parameters is generic anyway), and the plans against a shard.
 */
static SPIPlanPtr
ci_keep(SPIPlanPtr *cache, const char *sql, int nargs, const Oid *argtypes,
		int cursor_options)
{
	SPIPlanPtr	plan;

	if (*cache != NULL)
		return *cache;
	plan = SPI_prepare_cursor(sql, nargs, (Oid *) argtypes, cursor_options);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s",
			 sql, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	*cache = plan;
	return plan;
}

/*
 * Whether the outbox of the current database is distributed, and whether
 * this node is the coordinator, as last read from Citus's metadata; valid
 * until a relcache invalidation of outbox.events or of pg_dist_partition
 * (or a reset of the whole relcache).  Citus sends one for a table
 * whenever it adds or removes the table's row of pg_dist_partition, on the
 * coordinator and, through the metadata sync, on every worker
 * (distribute(), undistribute(), a node added later); the invalidation
 * reaches every backend at its next transaction or lock.  A backend so
 * reads the catalog once, not in every API call and worker round.
 */
static bool ci_cache_valid = false;
static bool ci_cache_registered = false;
static bool ci_distributed = false;
static bool ci_coordinator = false;
static Oid	ci_events_relid = InvalidOid;
static Oid	ci_partition_relid = InvalidOid;

/*
 * This node's shards (OutboxCitusLocalShards), kept likewise until a
 * relcache invalidation of outbox.commands or outbox.policies: Citus sends
 * one for a table whenever a shard or placement of it is added, moved or
 * removed, on every node that has the metadata.
 */
static OutboxShard *ci_shards = NULL;
static int	ci_nshards = 0;
static bool ci_shards_valid = false;
static bool ci_shards_on_coordinator = false;
static Oid	ci_commands_relid = InvalidOid;
static Oid	ci_policies_relid = InvalidOid;

/*
 * Invalidations seen: a read that saw one arrive while it ran (its own
 * catalog reads take them in) keeps its answer for the one call only.
 */
static uint64 ci_invalidations = 0;

/* Relcache invalidation callback: forget the answers when they may change. */
static void
ci_relcache_callback(Datum arg, Oid relid)
{
	ci_invalidations++;
	if (relid == InvalidOid || relid == ci_events_relid ||
		relid == ci_partition_relid)
		ci_cache_valid = false;
	if (relid == InvalidOid || relid == ci_events_relid ||
		relid == ci_partition_relid || relid == ci_commands_relid ||
		relid == ci_policies_relid)
		ci_shards_valid = false;
}

/*
 * Read the answers of OutboxCitusDistributed and OutboxCitusCoordinator
 * from Citus's metadata (inside SPI), unless the cached ones still hold.
 */
static void
ci_read_metadata(void)
{
	static SPIPlanPtr plan = NULL;
	bool		isnull;
	Oid			nsp;
	Datum		v;
	uint64		seen;

	if (ci_cache_valid)
		return;
	if (!ci_cache_registered)
	{
		CacheRegisterRelcacheCallback(ci_relcache_callback, (Datum) 0);
		ci_cache_registered = true;
	}
	seen = ci_invalidations;
	nsp = get_namespace_oid("outbox", true);
	ci_events_relid = OidIsValid(nsp) ? get_relname_relid("events", nsp) : InvalidOid;
	ci_partition_relid = get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE);
	ci_distributed = false;
	ci_coordinator = false;
	if (!OidIsValid(ci_events_relid))
		return;					/* no outbox: not cached */
	if (!OidIsValid(ci_partition_relid))
	{
		/* no Citus here: distribute() would invalidate outbox.events */
		ci_cache_valid = (seen == ci_invalidations);
		return;
	}
	if (SPI_execute_plan(ci_keep(&plan,
								 "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition p"
								 " WHERE p.logicalrelid OPERATOR(pg_catalog.=)"
								 "       'outbox.events'::pg_catalog.regclass),"
								 " COALESCE((SELECT g.groupid OPERATOR(pg_catalog.=) 0"
								 "             FROM pg_catalog.pg_dist_local_group g), true)",
								 0, NULL, 0),
						 NULL, NULL, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "outbox: could not read Citus's metadata");
	v = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	ci_distributed = !isnull && DatumGetBool(v);
	v = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
	ci_coordinator = !isnull && DatumGetBool(v);
	ci_cache_valid = (seen == ci_invalidations);
}

/*
 * True when the outbox of the current database is distributed (Citus's
 * metadata, synced to every node, lists outbox.events).  Called by the API
 * inside SPI; without Citus it costs a look at a static, with it a look at
 * the cached answer (see above).
 */
bool
OutboxCitusDistributed(void)
{
	if (!OutboxCitusLoaded())
		return false;
	ci_read_metadata();
	return ci_distributed;
}

/*
 * True when the outbox is distributed and this node is Citus's coordinator
 * (which holds no shard of it).  Inside SPI, like OutboxCitusDistributed.
 */
bool
OutboxCitusCoordinator(void)
{
	return OutboxCitusDistributed() && ci_coordinator;
}

/*
 * This node's shards of outbox.commands, in shard id order, each with this
 * node's copy of outbox.policies; *n of them (palloc'd in the caller's
 * context).  Read from Citus's metadata when a relcache invalidation said
 * they changed (see above), so that a shard moved here or away
 * (citus_move_shard_placement, the rebalancer) is served from the next
 * transaction on.  On the coordinator, which holds no shard of a
 * distributed outbox, none, or with coordinator_error an error (55000)
 * that says where to claim.  Inside SPI.
 */
OutboxShard *
OutboxCitusLocalShards(int *n, bool coordinator_error)
{
	static SPIPlanPtr plan = NULL;
	OutboxShard *shards;
	uint64		i;
	bool		isnull;
	bool		on_coordinator = false;
	int			found = 0;
	Oid			nsp;
	uint64		seen = ci_invalidations;

	if (!ci_shards_valid)
	{
		if (!ci_cache_registered)
		{
			CacheRegisterRelcacheCallback(ci_relcache_callback, (Datum) 0);
			ci_cache_registered = true;
		}
		nsp = get_namespace_oid("outbox", false);
		ci_commands_relid = get_relname_relid("commands", nsp);
		ci_policies_relid = get_relname_relid("policies", nsp);
		if (SPI_execute_plan(ci_keep(&plan,
									 "SELECT s.shardid,"
									 "       (SELECT r.shardid FROM pg_catalog.pg_dist_shard r"
									 "          JOIN pg_catalog.pg_dist_placement q ON q.shardid OPERATOR(pg_catalog.=) r.shardid"
									 "         WHERE r.logicalrelid OPERATOR(pg_catalog.=) 'outbox.policies'::pg_catalog.regclass"
									 "           AND q.groupid OPERATOR(pg_catalog.=) g.groupid),"
									 "       g.groupid OPERATOR(pg_catalog.=) 0"
									 "  FROM pg_catalog.pg_dist_local_group g"
									 "  LEFT JOIN (pg_catalog.pg_dist_shard s"
									 "             JOIN pg_catalog.pg_dist_placement p"
									 "               ON p.shardid OPERATOR(pg_catalog.=) s.shardid"
									 "              AND s.logicalrelid OPERATOR(pg_catalog.=) 'outbox.commands'::pg_catalog.regclass)"
									 "    ON p.groupid OPERATOR(pg_catalog.=) g.groupid"
									 " ORDER BY s.shardid", 0, NULL, 0),
							 NULL, NULL, true, 0) != SPI_OK_SELECT || SPI_processed < 1)
			elog(ERROR, "outbox: could not read Citus's shard placements");
		shards = MemoryContextAlloc(TopMemoryContext, sizeof(OutboxShard) * SPI_processed);
		for (i = 0; i < SPI_processed; i++)
		{
			HeapTuple	tup = SPI_tuptable->vals[i];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			bool		nopolicies;

			shards[found].commands = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
			if (isnull)
			{
				if (DatumGetBool(SPI_getbinval(tup, desc, 3, &isnull)))
					on_coordinator = true;
				continue;
			}
			shards[found].policies = DatumGetInt64(SPI_getbinval(tup, desc, 2, &nopolicies));
			if (nopolicies)
			{
				pfree(shards);
				ereport(ERROR,
						(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("this node has no copy of the reference table outbox.policies"),
						 errhint("Replicate the reference tables to it: SELECT replicate_reference_tables(); on the coordinator.")));
			}
			found++;
		}
		if (ci_shards != NULL)
			pfree(ci_shards);
		ci_shards = shards;
		ci_nshards = found;
		ci_shards_on_coordinator = on_coordinator;
		ci_shards_valid = (seen == ci_invalidations);
	}
	if (ci_nshards == 0 && coordinator_error && ci_shards_on_coordinator)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the coordinator holds no shard of the distributed outbox"),
				 errhint("Claim on the worker nodes: each claims from the shards it holds.")));
	*n = ci_nshards;
	shards = palloc(sizeof(OutboxShard) * Max(ci_nshards, 1));
	memcpy(shards, ci_shards, sizeof(OutboxShard) * ci_nshards);
	return shards;
}

/* A plan per shard: the statement and the shard it was made for. */
typedef struct CiShardPlan
{
	int64		commands;
	const char *sql;
	SPIPlanPtr	plan;
} CiShardPlan;

static CiShardPlan *ci_plans = NULL;
static int	ci_nplans = 0;
static int	ci_maxplans = 0;

/* Append src to buf, each "outbox.<table>" followed by "_<shard id>". */
static void
ci_append_renamed(StringInfo buf, const char *src, const OutboxShard *shard)
{
	while (*src)
	{
		if (strncmp(src, "outbox.commands", 15) == 0 && !(src[15] == '_' || isalnum((unsigned char) src[15])))
		{
			appendStringInfo(buf, "outbox.commands_" INT64_FORMAT, shard->commands);
			src += 15;
		}
		else if (strncmp(src, "outbox.policies", 15) == 0 && !(src[15] == '_' || isalnum((unsigned char) src[15])))
		{
			appendStringInfo(buf, "outbox.policies_" INT64_FORMAT, shard->policies);
			src += 15;
		}
		else
			appendStringInfoChar(buf, *src++);
	}
}

/*
 * The saved plan of sql run against one shard: outbox.commands and
 * outbox.policies renamed to this node's shard and copy, which are plain
 * tables here, so the plan is an ordinary (generic) one and takes row
 * locks with SKIP LOCKED as on a single server.  Kept per shard and
 * statement for the backend's life; a shard that moved away is not asked
 * for again, and one that comes back is re-planned by the plan cache.
 */
SPIPlanPtr
OutboxCitusShardPlan(const OutboxShard *shard, const char *sql, int nargs,
					 const Oid *argtypes)
{
	int			i;
	StringInfoData buf;
	SPIPlanPtr	plan = NULL;
	MemoryContext old;

	for (i = 0; i < ci_nplans; i++)
		if (ci_plans[i].commands == shard->commands && ci_plans[i].sql == sql)
			return ci_plans[i].plan;
	initStringInfo(&buf);
	ci_append_renamed(&buf, sql, shard);
	(void) ci_keep(&plan, buf.data, nargs, argtypes, CURSOR_OPT_GENERIC_PLAN);
	old = MemoryContextSwitchTo(TopMemoryContext);
	if (ci_nplans == ci_maxplans)
	{
		ci_maxplans = ci_maxplans ? ci_maxplans * 2 : 16;
		ci_plans = ci_plans ? repalloc(ci_plans, sizeof(CiShardPlan) * ci_maxplans)
			: palloc(sizeof(CiShardPlan) * ci_maxplans);
	}
	MemoryContextSwitchTo(old);
	ci_plans[ci_nplans].commands = shard->commands;
	ci_plans[ci_nplans].sql = sql;
	ci_plans[ci_nplans].plan = plan;
	ci_nplans++;
	return plan;
}

/*
 * The cursor options of a saved plan: generic without Citus (see
 * OutboxPrepare), custom with it (see the file's header).
 */
int
OutboxPlanOptions(void)
{
	return OutboxCitusInstalled() ? CURSOR_OPT_CUSTOM_PLAN : CURSOR_OPT_GENERIC_PLAN;
}

/* Whether a DROP statement drops the extension outbox. */
static bool
ci_drops_outbox(Node *parsetree)
{
	DropStmt   *drop;
	ListCell   *lc;

	if (!IsA(parsetree, DropStmt))
		return false;
	drop = (DropStmt *) parsetree;
	if (drop->removeType != OBJECT_EXTENSION)
		return false;
	foreach(lc, drop->objects)
	{
		if (strcmp(strVal(lfirst(lc)), "outbox") == 0)
			return true;
	}
	return false;
}

/*
 * Before DROP EXTENSION outbox, in a database with Citus and the outbox:
 * outbox._before_drop(), which undistributes a distributed outbox on the
 * coordinator and does nothing elsewhere.
 */
static void
ci_process_utility(PlannedStmt *pstmt, const char *queryString,
				   bool readOnlyTree, ProcessUtilityContext context,
				   ParamListInfo params, QueryEnvironment *queryEnv,
				   DestReceiver *dest, QueryCompletion *qc)
{
	if (ci_drops_outbox(pstmt->utilityStmt) &&
		OidIsValid(get_extension_oid("outbox", true)) &&
		OutboxCitusInstalled())
	{
		SPI_connect();
		if (SPI_execute("SELECT outbox._before_drop()", false, 0) != SPI_OK_SELECT)
			elog(ERROR, "outbox: _before_drop failed");
		SPI_finish();
	}
	if (ci_prev_process_utility)
		ci_prev_process_utility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
}

/*
 * outbox._citus_lease_key_changed(): the statement trigger that
 * outbox.distribute() puts on the reference table outbox.lease_key, and
 * Citus on each node's copy (shard) of it.  A rotation of the key writes
 * every node's copy in the rotating transaction; on each node the trigger
 * invalidates the relcache entry of outbox.lease_key there, the table whose
 * invalidation tells that node's backends to read the key again
 * (src/leasekey.c), at the commit of that node's part of the transaction.
 * Without it the nodes where the key was not rotated would keep accepting
 * the old key's tokens.
 */
Datum
outbox_citus_lease_key_changed(PG_FUNCTION_ARGS)
{
	Oid			nsp;
	Oid			relid;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("outbox._citus_lease_key_changed() must be called as a trigger")));
	nsp = get_namespace_oid("outbox", true);
	relid = OidIsValid(nsp) ? get_relname_relid("lease_key", nsp) : InvalidOid;
	if (OidIsValid(relid))
		CacheInvalidateRelcacheByRelid(relid);
	return PointerGetDatum(NULL);
}
