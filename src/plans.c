/*-------------------------------------------------------------------------
 *
 * plans.c
 *		Saved plans, and their execution with the planner steered to index
 *		plans.
 *
 * Every statement the API and the worker run is prepared once per backend
 * (OutboxPrepare; OutboxPrepareRouted for the statements Citus routes
 * with a generic plan) and run through OutboxExecute, which turns off the plan
 * shapes listed in OUTBOX_PLANNER_STEERING while a plan may be made
 * (OutboxExecuteGeneric also has the PL/pgSQL bodies it calls plan
 * generically).  Near
 * the bottom: it calls only citus.c (OutboxPlanOptions, the plan mode).
 *
 * Locking: none.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "jit/jit.h"
#include "optimizer/cost.h"
#include "utils/plancache.h"
#include "utils/snapmgr.h"

#include "outbox.h"

/*
 * Prepare and keep a plan once per backend.  The plan cache re-plans it
 * after DDL on the tables it reads (for example DROP and CREATE EXTENSION).
 *
 * The plan is generic: planned once, not for each call's parameter values.
 * Left to choose, the plan cache kept making a custom plan on every call
 * (planning was an eighth of a one-command claim + ack), because OutboxExecute
 * prices the paths it rules out so high that a generic plan never looks
 * cheaper; every statement here has one index plan, whatever its values.
 * In a database with Citus the plan is custom instead (src/citus.c).
 */
SPIPlanPtr
OutboxPrepare(SPIPlanPtr *cache, const char *sql, int nargs,
			  const Oid *argtypes)
{
	return OutboxPrepareWith(cache, sql, nargs, argtypes, OutboxPlanOptions());
}

/* OutboxPrepare with the cursor options given. */
SPIPlanPtr
OutboxPrepareWith(SPIPlanPtr *cache, const char *sql, int nargs,
				  const Oid *argtypes, int cursor_options)
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
 * OutboxPrepare for a statement that is generic even with Citus: a
 * statement over one table, distributed or reference, with no subquery,
 * CTE or join, whose condition on a distributed table's distribution
 * column is run_id = $n (and, for an INSERT, whose run_id is a
 * parameter).  Citus plans such a statement once and picks its shard at
 * each execution, and on the node that holds the shard it keeps the
 * shard's plan too: a custom plan instead would be planned twice per
 * call, by the distributed planner and then for the shard (most of a
 * routed decision's time on its node: docs/citus.md).
 */
SPIPlanPtr
OutboxPrepareRouted(SPIPlanPtr *cache, const char *sql, int nargs,
					const Oid *argtypes)
{
	return OutboxPrepareWith(cache, sql, nargs, argtypes, CURSOR_OPT_GENERIC_PLAN);
}

/*
 * SPI_execute_plan with the planner steered to index plans.
 *
 * Every statement of the API has an index that serves it, but its saved
 * plan may be (re)made while a table is empty or after an ANALYZE of a
 * small table, and claim's LIMIT is not a constant, so the planner could
 * settle on a sequential scan, a bitmap scan or a sort and keep it while the
 * table grows to millions of rows.  Turning those off while the plan may be
 * made leaves the index plan as the only choice; JIT is off because these
 * short statements never repay it (and the cost penalty of a disabled node
 * would trigger it).  The settings are plain planner variables, saved and
 * restored around the call, so this costs nothing per call.  The list is
 * OUTBOX_PLANNER_STEERING (outbox.h); outbox.purge() (src/sql/20_admin.sql)
 * turns the same settings off for its victims query, from the same list.
 */
static int
ob_execute(SPIPlanPtr plan, Datum *args, const char *nulls, bool read_only,
		   long count, bool hash_joins, bool latest, bool generic)
{
#define PL_SAVE(var, name) bool save_##var = var;
	OUTBOX_PLANNER_STEERING(PL_SAVE)
#undef PL_SAVE
	bool		save_nestloop = enable_nestloop;
	bool		save_mergejoin = enable_mergejoin;
	int			save_plan_cache_mode = plan_cache_mode;
	int			ret;

#define PL_OFF(var, name) var = false;
	OUTBOX_PLANNER_STEERING(PL_OFF)
#undef PL_OFF
	if (hash_joins)
	{
		enable_nestloop = false;
		enable_mergejoin = false;
	}
	if (generic)
		plan_cache_mode = PLAN_CACHE_MODE_FORCE_GENERIC_PLAN;
	PG_TRY();
	{
		if (latest)
			ret = SPI_execute_snapshot(plan, args, nulls, GetLatestSnapshot(),
									   InvalidSnapshot, read_only, false, count);
		else
			ret = SPI_execute_plan(plan, args, nulls, read_only, count);
	}
	PG_FINALLY();
	{
#define PL_RESTORE(var, name) var = save_##var;
		OUTBOX_PLANNER_STEERING(PL_RESTORE)
#undef PL_RESTORE
		enable_nestloop = save_nestloop;
		enable_mergejoin = save_mergejoin;
		plan_cache_mode = save_plan_cache_mode;
	}
	PG_END_TRY();
	return ret;
}

int
OutboxExecute(SPIPlanPtr plan, Datum *args, const char *nulls,
			  bool read_only, long count)
{
	return ob_execute(plan, args, nulls, read_only, count, false, false, false);
}

/*
 * OutboxExecute for a statement that joins the elements of an array
 * argument to outbox.commands.  Left free, the planner may take the table
 * as the outer side of a nested loop whenever its statistics make it look
 * tiny (an ANALYZE of a drained table, a selective-looking filter): the
 * saved plan then reads the whole table once for each element, or the
 * elements once for each row (seconds for a batch of thousands on a table
 * of tens of thousands, for the rest of the session).  Such a statement
 * also restricts the table to the array's keys (command_id = ANY (...)), and
 * runs with nested loops and merge joins off, which leaves a hash join of
 * the two sides: each read once, whatever the estimates.
 */
int
OutboxExecuteHashJoin(SPIPlanPtr plan, Datum *args, const char *nulls,
					  bool read_only, long count)
{
	return ob_execute(plan, args, nulls, read_only, count, true, false, false);
}

/*
 * OutboxExecute with the latest snapshot instead of the transaction's:
 * for the look-ups and updates made under an ordering key's lock
 * (src/keys.c), which must see what the lock's previous holder committed
 * even when the caller runs in REPEATABLE READ or SERIALIZABLE.  The
 * caller's own earlier changes are seen too.
 */
int
OutboxExecuteLatest(SPIPlanPtr plan, Datum *args, const char *nulls,
					bool read_only, long count)
{
	return ob_execute(plan, args, nulls, read_only, count, false, true, false);
}

/*
 * OutboxExecute for the streams' statements (the claim's and the tick's,
 * src/stream_claim.c and src/stream.c) and the PL/pgSQL bodies they call
 * (src/sql/35_streams.sql), whose own statements must run with generic
 * plans too: while it runs the plan cache makes no custom plan.  Left to choose, it re-planned some of them at every call, because
 * the settings above price a generic plan with unknown values above the
 * custom ones; their values are parameters that make index conditions, so
 * the generic plan is the custom one.  (A SET clause on the function would
 * do the same at about 0.1 ms per call.)
 */
int
OutboxExecuteGeneric(SPIPlanPtr plan, Datum *args, const char *nulls,
					 bool read_only, long count)
{
	return ob_execute(plan, args, nulls, read_only, count, false, false, true);
}

/*
 * Prepare (once) and run sql with generic plans (OutboxExecuteGeneric),
 * no argument NULL; an error naming what unless the SPI result is want.
 */
void
OutboxRunGeneric(SPIPlanPtr *cache, const char *sql, int nargs, const Oid *argtypes,
				 Datum *args, int want, const char *what)
{
	int			ret = OutboxExecuteGeneric(OutboxPrepare(cache, sql, nargs, argtypes),
										   args, NULL, false, 0);

	if (ret != want)
		elog(ERROR, "outbox: %s failed: %s", what, SPI_result_code_string(ret));
}
