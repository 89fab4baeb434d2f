/*-------------------------------------------------------------------------
 *
 * producer.c
 *		The producer API: commit_decision, commit_decisions, record_event.
 *
 * Everything runs in the caller's transaction, so an event and the command
 * it decides commit or roll back together with the caller's own writes.
 * The common decision (no ordering key, no stream, no deciders, Citus not
 * loaded), and the single decision of a kind with a stream while no kind
 * has deciders, are inserted without SQL, heap and index inserts as the
 * executor's helpers make them (pr_direct_open and pr_direct_stream say
 * how and when); every other case
 * runs SPI statements with saved plans, described here.  Both take
 * RowExclusiveLock on outbox.events and outbox.commands and their indexes,
 * held to the end of the transaction.
 *
 * Each call is one plain INSERT statement (the commands, then their events):
 * the unique indexes detect a taken key, waiting for a concurrent inserter
 * of the same key to finish as any insert does, and the unique violation is
 * re-raised as the API's 23505, which keeps the constraint's name
 * (events_pkey: the run's seq; commands_pkey or events_command_id_key: the
 * command id) and whose detail says nothing of the stored decision.  No ON
 * CONFLICT clause: its arbiter probes and speculative insertion cost more
 * than a tenth of a decision, for the rare case of a taken key.
 *
 * A decision is recorded with the role that made it (decided_by, the
 * caller OutboxCallAsOwner passes).  The single form inserts only when its
 * command id is not stored yet and its kind's deciders admit the caller
 * (two probes in the same statement); when it inserted nothing, a second
 * statement tells the cases apart: a forbidden kind (42501), the same
 * decision already recorded by the same role (an idempotent retry: false,
 * no error, no second row), or any other decision holding the id (23505
 * commands_pkey).  A retry racing the first attempt waits for it on the
 * unique index and, if it committed, gets the 23505; the next retry gets
 * false.  The set-based form reads a JSON array (of objects, or of arrays
 * of the values in commit_decision's order); it checks its elements for
 * repeats among themselves (naming both positions) and then, in one
 * query, for forbidden kinds and stored ids, before it inserts anything.
 * A batch without ordering keys, while no kind has deciders, skips that
 * query: its insert runs in a subtransaction, which a unique violation of
 * the extension's keys rolls back before the query and the insert of the
 * decisions that are not retries (pr_try_batch).
 * Any error aborts the caller's (sub)transaction, so the event of a
 * rejected decision never survives.
 *
 * A decision may carry headers (a JSON object of strings, checked by
 * OutboxCheckHeaders), stored with the command for the relay to pass on as
 * the broker's headers.  They are not part of "the same decision": a retry
 * may carry another traceparent and is still the caller's own retry (the
 * stored headers stay).  A call without headers stores NULL.
 *
 * A decision may carry an ordering key (or get its run_id as key, for a
 * kind ordered by run: OutboxOrderedByRun).  Such a decision first takes
 * the key's lock and reads the key's last command (src/keys.c, which
 * states the protocol); the command gets the next place in its key and
 * waits (due_at NULL) when that command is unfinished.  A batch locks all
 * its keys first, in one order.  A decision without a key runs the
 * statements it ran before keys existed, and takes no lock.
 *
 * A kind with a stream (docs/streams.md) is written once: its decision is
 * appended to the stream log with its event (pr_decide_stream, and the
 * batch form's two plans of src/stream.c), at one branch point in each
 * form; it takes no key lock (a stream keeps a key's order by partition),
 * refuses not_before, and a batch does not mix it with other kinds.  The
 * single decision is written without SQL by the stream writer
 * (pr_direct_stream) under the direct writer's conditions, else by
 * src/stream.c's statement; both lock the three log tables before they
 * take the snapshot under which they read which one is current (the
 * rotation's argument, src/sql/35_streams.sql).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "common/hashfn.h"
#include "common/int.h"
#include "executor/executor.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/numeric.h"
#include "utils/rel.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/xid8.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_commit_decision_1_0);
PG_FUNCTION_INFO_V1(outbox_commit_decisions_1_0);
PG_FUNCTION_INFO_V1(outbox_record_event);

static SPIPlanPtr plan_decide = NULL;
static SPIPlanPtr plan_decide_open = NULL;
static SPIPlanPtr plan_decide_keyed = NULL;
static SPIPlanPtr plan_decide_keyed_open = NULL;
static SPIPlanPtr plan_batch_keyed = NULL;
static SPIPlanPtr plan_decide_why = NULL;
static SPIPlanPtr plan_batch_why = NULL;
static SPIPlanPtr plan_event = NULL;
static SPIPlanPtr plan_batch = NULL;

/* Raise 22023 unless seq is non-negative. */
static void
pr_check_seq(int64 seq)
{
	if (seq < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("seq must not be negative"),
				 errdetail("The value was " INT64_FORMAT ".", seq)));
}

/*
 * Raise 22023 unless a not-before time is finite: -infinity would break
 * the age arithmetic of outbox.backlog for everyone, and infinity would
 * keep the command from ever being claimed.
 */
static void
pr_check_not_before(TimestampTz t)
{
	if (TIMESTAMP_NOT_FINITE(t))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("not_before must be a finite time")));
}

/*
 * What an insert of decisions writes, for the message of a taken key: one
 * decision (command_id set) or one event (command_id NULL) of run_id, or a
 * batch (run_id NULL).  rows is the number of rows the statement inserts.
 */
typedef struct PrWhat
{
	text	   *run_id;
	int64		seq;
	text	   *command_id;
	uint64		rows;
} PrWhat;

/*
 * Raise the API's 23505 for a unique violation (edata) of the extension's
 * keys: events_pkey is a run's (run_id, seq); commands_pkey and
 * events_command_id_key a command id (the events keep the id of a purged
 * command).  The error keeps the schema's, table's and constraint's names,
 * so a client tells the cases apart without reading the message.  Returns
 * for any other constraint.
 */
static void
pr_raise_taken(ErrorData *edata, const PrWhat *w)
{
	const char *con = edata->constraint_name;
	bool		event_key;

	if (con == NULL || edata->schema_name == NULL ||
		strcmp(edata->schema_name, "outbox") != 0)
		return;
	event_key = (strcmp(con, "events_pkey") == 0);
	if (!event_key && strcmp(con, "commands_pkey") != 0 &&
		strcmp(con, "events_command_id_key") != 0)
		return;

	if (w->run_id == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg(event_key ? "an event of the batch already exists"
						: "a command of the batch already exists"),
				 errdetail_internal("%s Nothing of this call was recorded.",
									edata->detail ? edata->detail : ""),
				 err_generic_string(PG_DIAG_SCHEMA_NAME, edata->schema_name),
				 err_generic_string(PG_DIAG_TABLE_NAME, edata->table_name),
				 err_generic_string(PG_DIAG_CONSTRAINT_NAME, con)));
	if (event_key)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("event %s of run \"%s\" already exists",
						DatumGetCString(DirectFunctionCall1(int8out, Int64GetDatum(w->seq))),
						text_to_cstring(w->run_id)),
				 errdetail("Each (run_id, seq) is recorded once; nothing of this call was recorded."),
				 err_generic_string(PG_DIAG_SCHEMA_NAME, edata->schema_name),
				 err_generic_string(PG_DIAG_TABLE_NAME, edata->table_name),
				 err_generic_string(PG_DIAG_CONSTRAINT_NAME, con)));
	if (w->command_id != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("command \"%s\" already exists", text_to_cstring(w->command_id)),
				 errdetail("A command id is decided once; nothing of this decision was recorded."),
				 err_generic_string(PG_DIAG_SCHEMA_NAME, edata->schema_name),
				 err_generic_string(PG_DIAG_TABLE_NAME, edata->table_name),
				 err_generic_string(PG_DIAG_CONSTRAINT_NAME, con)));
}

/*
 * In the PG_CATCH of an insert of decisions (the statements' or the direct
 * writer's): a unique violation is raised again as pr_raise_taken says,
 * any other error as it is.  Does not return.
 */
static void pr_insert_caught(MemoryContext cxt, const PrWhat *w) pg_attribute_noreturn();

static void
pr_insert_caught(MemoryContext cxt, const PrWhat *w)
{
	ErrorData  *edata;

	MemoryContextSwitchTo(cxt);
	edata = CopyErrorData();
	if (edata->sqlerrcode == ERRCODE_UNIQUE_VIOLATION)
	{
		FlushErrorState();
		pr_raise_taken(edata, w);
		ReThrowError(edata);
	}
	FreeErrorData(edata);
	PG_RE_THROW();
}

/*
 * Run a plain INSERT of decisions (or of an event), which must insert
 * w->rows rows, or none when none_ok (the single decision's filters).
 * Returns whether it inserted them.  A unique violation of the extension's
 * keys is re-raised as the API's 23505 (pr_raise_taken).  Nothing touches
 * the database between catching the error and raising the new one, so no
 * subtransaction is needed: the caller's (sub)transaction is aborting
 * either way.
 */
static bool
pr_insert(SPIPlanPtr plan, Datum *args, const char *nulls, const PrWhat *w,
		  bool none_ok)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile bool inserted = false;

	PG_TRY();
	{
		int			ret = OutboxExecute(plan, args, nulls, false, 0);

		if (ret != SPI_OK_INSERT ||
			(SPI_processed != w->rows && !(none_ok && SPI_processed == 0)))
			elog(ERROR, "outbox: insert of decisions failed: %s",
				 SPI_result_code_string(ret));
		inserted = (SPI_processed == w->rows);
	}
	PG_CATCH();
	{
		pr_insert_caught(cxt, w);
	}
	PG_END_TRY();
	return inserted;
}

/*
 * Raise 42501 for a decision of a kind the caller may not decide; elem is
 * the 1-based position in a batch, or 0.
 */
static void
pr_raise_forbidden(const char *kind, int elem)
{
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied to decide commands of kind \"%s\"", kind),
			 elem > 0 ? errdetail("Decision %d of the batch has this kind; nothing of this call was recorded.",
								  elem) : 0,
			 errhint("The kind's deciders (outbox.set_policy) do not include a role of yours.")));
}

/*
 * Raise the 23505 of a command id held by another decision (not the
 * caller's own retry): commands_pkey, and a detail that says nothing of
 * the stored decision.  elem is the 1-based position in a batch, or 0.
 */
static void
pr_raise_conflict(const char *command_id, int elem)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNIQUE_VIOLATION),
			 errmsg("command \"%s\" already exists", command_id),
			 elem > 0 ?
			 errdetail("Decision %d of the batch is not a retry of the decision that holds this command id; nothing of this call was recorded.",
					   elem) :
			 errdetail("This is not a retry of the decision that holds this command id; nothing of this decision was recorded."),
			 err_generic_string(PG_DIAG_SCHEMA_NAME, "outbox"),
			 err_generic_string(PG_DIAG_TABLE_NAME, "commands"),
			 err_generic_string(PG_DIAG_CONSTRAINT_NAME, "commands_pkey")));
}

/*
 * Raise the 0A000 of an ordered decision on a distributed outbox: a key's
 * lock and its look at the key's last command live on one node, and the
 * commands of a key may sit on several (docs/citus.md).  elem is the
 * 1-based position in a batch, or 0.
 */
static void
pr_raise_keyed_distributed(text *command_id, int elem)
{
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("ordered delivery is not supported on a distributed outbox"),
			 elem > 0 ?
			 errdetail("Decision %d of the batch (command \"%s\") has an ordering key, or its kind is ordered by run; nothing of this call was recorded.",
					   elem, text_to_cstring(command_id)) :
			 errdetail("Command \"%s\" has an ordering key, or its kind is ordered by run; nothing was recorded.",
					   text_to_cstring(command_id)),
			 errhint("Decide it without ordering_key, or set_policy(kind, ordered_by_run => false).")));
}

/*
 * The "same decision" test of a stored command c (and its event e) against
 * the decision of the parameters or of a batch element: same run, seq,
 * kinds and payload, decided by the calling role.
 */
#define PR_SAME_DECISION(run, seq, ekind, ckind, payload, caller) \
	"(c.run_id OPERATOR(pg_catalog.=) " run \
	" AND c.seq OPERATOR(pg_catalog.=) " seq \
	" AND c.kind OPERATOR(pg_catalog.=) " ckind \
	" AND c.payload OPERATOR(pg_catalog.=) " payload \
	" AND c.decided_by OPERATOR(pg_catalog.=) " caller \
	" AND EXISTS (SELECT 1 FROM outbox.events e" \
	"              WHERE e.run_id OPERATOR(pg_catalog.=) " run \
	"                AND e.seq OPERATOR(pg_catalog.=) " seq \
	"                AND e.kind OPERATOR(pg_catalog.=) " ekind \
	"                AND e.command_id OPERATOR(pg_catalog.=) c.command_id))"

/*
 * The single decision's statement: insert the command unless its id is
 * stored (or kind_filter, the deciders probe, says no), then its event.
 * Without any deciders in the policies the probe is left out
 * (OutboxAnyDeciders).  A decision with an ordering key also writes the
 * key ($12) and its place in the key ($13), and waits ($14: due_at NULL)
 * behind an unfinished command of its key (src/keys.c), or else is the
 * key's head and its last command (ordering_tail true, which keeps it in
 * commands_key_idx); one without a key runs the statement without them.
 */
#define PR_DECIDE(key_cols, key_vals, due, kind_filter) \
	"WITH c AS (" \
	"  INSERT INTO outbox.commands" \
	"    (command_id, run_id, seq, kind, payload, priority," \
	"     available_at, due_at, decided_by, headers" key_cols ")" \
	"  SELECT $4, $1, $2, $5, $6, $9," \
	"         COALESCE($8, pg_catalog.now())," \
	"         " due ", $10, $11" key_vals \
	"   WHERE NOT EXISTS (SELECT 1 FROM outbox.commands x" \
	"                      WHERE x.command_id OPERATOR(pg_catalog.=) $4)" \
	kind_filter \
	"  RETURNING 1)" \
	"INSERT INTO outbox.events (run_id, seq, kind, payload, command_id)" \
	"SELECT $1, $2, $3, $7, $4 FROM c"
#define PR_DUE			"COALESCE($8, pg_catalog.now())"
#define PR_DUE_KEYED	"CASE WHEN $14 THEN NULL ELSE COALESCE($8, pg_catalog.now()) END"
#define PR_KEY_COLS		", ordering_key, ordering_seq, ordering_tail"
#define PR_KEY_VALS		", $12, $13, CASE WHEN NOT $14 THEN true END"
#define PR_DECIDERS_FILTER \
	"     AND NOT EXISTS (SELECT 1 FROM outbox.policies p" \
	"                      WHERE p.kind OPERATOR(pg_catalog.=) $5" \
	"                        AND p.deciders IS NOT NULL" \
	"                        AND NOT outbox._may(p.deciders, $10))"

/*
 * Why a decision (args as commit_decision's statement takes them) was not
 * inserted: raise 42501 for a kind the caller may not decide, 23505 for a
 * conflict (ord names the decision of a batch, 0 a single one); return for
 * the caller's own retry.  Not read-only: the look must see a row that an
 * earlier call in the same statement inserted (two commit_decision calls of
 * one command in one SELECT), which the statement's snapshot does not.
 */
static void
pr_why_not(Datum *args, const char *nulls, int ord)
{
	static const Oid argtypes[11] = {TEXTOID, INT8OID, TEXTOID, TEXTOID, TEXTOID,
	JSONBOID, JSONBOID, TIMESTAMPTZOID, INT4OID, OIDOID, JSONBOID};
	bool		isnull;
	bool		forbidden;
	bool		stored;
	bool		same;

	if (OutboxExecute(OutboxPrepare(&plan_decide_why,
									"SELECT EXISTS (SELECT 1 FROM outbox.policies p"
									"                WHERE p.kind OPERATOR(pg_catalog.=) $5"
									"                  AND p.deciders IS NOT NULL"
									"                  AND NOT outbox._may(p.deciders, $10)),"
									"       c.command_id IS NOT NULL,"
									"       COALESCE(" PR_SAME_DECISION("$1", "$2", "$3", "$5", "$6", "$10") ", false)"
									"  FROM (SELECT 1) one"
									"  LEFT JOIN outbox.commands c ON c.command_id OPERATOR(pg_catalog.=) $4",
									11, argtypes),
					  args, nulls, false, 0) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "outbox: diagnosis of a decision failed");
	forbidden = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	stored = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	same = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &isnull));
	if (forbidden)
		pr_raise_forbidden(text_to_cstring(DatumGetTextPP(args[4])), ord);
	if (!stored)
		elog(ERROR, "outbox: decision of \"%s\" neither inserted nor found",
			 text_to_cstring(DatumGetTextPP(args[3])));
	if (!same)
		pr_raise_conflict(text_to_cstring(DatumGetTextPP(args[3])), ord);
}

/*
 * commit_decision on a distributed outbox (docs/citus.md): Citus cannot
 * route PR_DECIDE (a data-modifying CTE whose look for the command id
 * reads every shard), and runs it through intermediate results, touching
 * several nodes (then committed with two-phase commit).  Four statements
 * instead, each of one table and naming the run, so each goes to the one
 * shard group of the run: whether the run holds the command already,
 * whether the caller may not decide the kind (policies is a reference
 * table), the command, its event.  A kind the caller may not decide
 * inserts nothing.  Returns whether it
 * inserted; when not, the caller's diagnosis tells a retry from a conflict
 * or a forbidden kind.
 */
static bool
pr_decide_routed(Datum *args, const char *nulls, const PrWhat *what)
{
	static const Oid argtypes[11] = {TEXTOID, INT8OID, TEXTOID, TEXTOID, TEXTOID,
	JSONBOID, JSONBOID, TIMESTAMPTZOID, INT4OID, OIDOID, JSONBOID};
	static SPIPlanPtr plan_has = NULL;
	static SPIPlanPtr plan_forbidden = NULL;
	static SPIPlanPtr plan_command = NULL;
	static SPIPlanPtr plan_event_of = NULL;

	/* each statement one table, routed by run_id (OutboxPrepareRouted) */
	if (OutboxExecute(OutboxPrepareRouted(&plan_has,
										  "SELECT 1 FROM outbox.commands x"
										  " WHERE x.run_id OPERATOR(pg_catalog.=) $1"
										  "   AND x.command_id OPERATOR(pg_catalog.=) $4",
										  11, argtypes),
					  args, nulls, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "outbox: look for a decision failed");
	if (SPI_processed > 0)
		return false;
	if (OutboxExecute(OutboxPrepareRouted(&plan_forbidden,
										  "SELECT 1 FROM outbox.policies p"
										  " WHERE p.kind OPERATOR(pg_catalog.=) $5"
										  "   AND p.deciders IS NOT NULL"
										  "   AND NOT outbox._may(p.deciders, $10)",
										  11, argtypes),
					  args, nulls, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "outbox: look for a decision failed");
	if (SPI_processed > 0)
		return false;
	pr_insert(OutboxPrepareRouted(&plan_command,
								      "INSERT INTO outbox.commands"
								      "  (command_id, run_id, seq, kind, payload, priority,"
								      "   available_at, due_at, decided_by, headers)"
								      "VALUES ($4, $1, $2, $5, $6, $9,"
								      "        COALESCE($8, pg_catalog.now()),"
								      "        COALESCE($8, pg_catalog.now()), $10, $11)",
								      11, argtypes),
			  args, nulls, what, false);
	pr_insert(OutboxPrepareRouted(&plan_event_of,
								      "INSERT INTO outbox.events (run_id, seq, kind, payload, command_id)"
								      "VALUES ($1, $2, $3, $7, $4)",
								      11, argtypes),
			  args, nulls, what, false);
	return true;
}

/*
 * A decision of a kind with a stream (args as commit_decision's statement
 * takes them, with room for the key at args[11]): appended to the stream
 * log with its event (OutboxStreamDecidePlan, src/stream.c).  True when
 * recorded, false for the caller's own retry; raises as commit_decision
 * does for a forbidden kind or a conflict (ord: the place in a batch, or 0).
 */
static int	pr_direct_stream(Datum *args, const char *nulls, const PrWhat *w);

static bool
pr_decide_stream(Datum *args, char *nulls, text *key, const PrWhat *what, int ord)
{
	bool		deciders;
	int			direct = -1;

	OutboxStreamCheckDecision(DatumGetTextPP(args[3]), nulls[7] != 'n', ord);
	args[11] = key != NULL ? PointerGetDatum(key) : (Datum) 0;
	nulls[11] = key != NULL ? ' ' : 'n';
	deciders = OutboxAnyDeciders();
	/* written without SQL when it can be (pr_direct_stream), else by the statement */
	if (!deciders)
		direct = pr_direct_stream(args, nulls, what);
	if (direct > 0)
		return true;
	if (direct < 0 &&
		pr_insert(OutboxStreamDecidePlan(deciders), args, nulls, what, true))
		return true;
	switch (OutboxStreamWhyNot(args, nulls))
	{
		case OUTBOX_STREAM_FORBIDDEN:
			pr_raise_forbidden(text_to_cstring(DatumGetTextPP(args[4])), ord);
			break;
		case OUTBOX_STREAM_CONFLICT:
			pr_raise_conflict(text_to_cstring(DatumGetTextPP(args[3])), ord);
			break;
		case OUTBOX_STREAM_RETRY:
			break;
	}
	return false;
}

/*
 * The direct writer: the common decision (no ordering key, no stream, no
 * deciders in the policies, Citus not loaded) inserted without SQL.  The
 * two relations are opened once per call with RowExclusiveLock (the lock
 * the INSERT statements take), the tuples are formed with the columns'
 * defaults of src/sql/00_schema.sql (status 'pending', version 1,
 * deliveries 0, created_at now(); available_at and due_at the not-before
 * time or now()) and inserted with their index entries as the executor's
 * ExecSimpleRelationInsert does: table_tuple_insert, then
 * ExecInsertIndexTuples, whose unique checks wait for a concurrent
 * inserter of the same key and raise 23505 naming the constraint, as the
 * statement's insert does.  The command id is first looked for in
 * commands_pkey under the snapshot the statement would take (and its
 * predicate locks), as PR_DECIDE's NOT EXISTS does.
 *
 * Nothing the API promises differs from the statements (only the CONTEXT
 * of an error of a constraint that is not the extension's, and what
 * pg_stat_statements lists: docs/internals.md), so anything that could
 * make a difference sends the call to them instead: a trigger or a rule
 * on either table (the extension creates none outside Citus, but a
 * superuser could), row-level security, CHECK constraints other than
 * events_seq_check (checked by pr_check_seq before), a column the
 * writer does not know or a default on a column it leaves NULL, a
 * missing INSERT or SELECT privilege of the extension's owner (the
 * statements then raise the error), or a read-only transaction (25006).
 *
 * The stream writer (pr_direct_stream) uses the same machinery with the
 * current stream log table in the place of outbox.commands.
 */
typedef struct PrDirect
{
	Relation	commands;
	Relation	events;
	ResultRelInfo *crri;
	ResultRelInfo *erri;
	EState	   *estate;
	TupleTableSlot *cslot;
	TupleTableSlot *eslot;
} PrDirect;

/* The columns the direct writer fills, by name, in the tables' order. */
#define PR_CMD_NATTS	21
#define PR_EVT_NATTS	6
static const char *const pr_cmd_cols[PR_CMD_NATTS] = {"command_id", "run_id", "seq", "kind",
	"status", "version", "deliveries", "priority", "available_at", "due_at", "lease_until",
	"owner", "created_at", "published_at", "last_error", "payload", "decided_by", "headers",
"ordering_key", "ordering_seq", "ordering_tail"};
static const char *const pr_evt_cols[PR_EVT_NATTS] = {"run_id", "seq", "kind", "payload",
"command_id", "created_at"};

/* The columns with a default in 00_schema.sql: commands' and events'. */
static const bool pr_cmd_hasdef[PR_CMD_NATTS] = {false, false, false, false, true, true, true,
true, false, false, false, false, true};
static const bool pr_evt_hasdef[PR_EVT_NATTS] = {false, false, false, false, false, true};

/*
 * Their types in 00_schema.sql: status, version and deliveries are the
 * extension's domains over text, int8 and int4 (PR_DOMAIN: the base type).
 */
#define PR_DOMAIN(t)	(-(t))
static const int64 pr_cmd_types[PR_CMD_NATTS] = {TEXTOID, TEXTOID, INT8OID, TEXTOID,
	PR_DOMAIN(TEXTOID), PR_DOMAIN(INT8OID), PR_DOMAIN(INT4OID), INT4OID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTOID,
JSONBOID, OIDOID, JSONBOID, TEXTOID, INT8OID, BOOLOID};
static const int64 pr_evt_types[PR_EVT_NATTS] = {TEXTOID, INT8OID, TEXTOID, JSONBOID, TEXTOID,
TIMESTAMPTZOID};

#define PRC_COMMAND_ID	0
#define PRC_RUN_ID		1
#define PRC_SEQ			2
#define PRC_KIND		3
#define PRC_STATUS		4
#define PRC_VERSION		5
#define PRC_DELIVERIES	6
#define PRC_PRIORITY	7
#define PRC_AVAILABLE_AT 8
#define PRC_DUE_AT		9
#define PRC_CREATED_AT	12
#define PRC_PAYLOAD		15
#define PRC_DECIDED_BY	16
#define PRC_HEADERS		17
#define PRE_RUN_ID		0
#define PRE_SEQ			1
#define PRE_KIND		2
#define PRE_PAYLOAD		3
#define PRE_COMMAND_ID	4
#define PRE_CREATED_AT	5

/*
 * The tables' ids and the attribute number of each known column, read
 * once and forgotten at any invalidation of the relcache (ALTER TABLE,
 * DROP EXTENSION, a new trigger).
 */
static bool pr_direct_valid = false;
static bool pr_direct_registered = false;
static bool pr_direct_usable = false;
static Oid	pr_commands_relid = InvalidOid;
static Oid	pr_events_relid = InvalidOid;
static AttrNumber pr_cmd_attno[PR_CMD_NATTS];
static AttrNumber pr_evt_attno[PR_EVT_NATTS];

/*
 * The stream writer's tables (pr_direct_stream): the three log tables,
 * their columns (as 00_schema.sql makes them), the sequence of their ids,
 * and the tables and keys it reads: the kind's policy (policies_pkey), its
 * stream (streams_pkey), the current log table (stream_rotation's row) and
 * the events' command ids (events_command_id_key).  Looked at by the first
 * stream decision (pr_stream_lookup) and forgotten at any invalidation of
 * one of them or of the two tables above.
 */
#define PR_LOG_NATTS	13
static const char *const pr_log_cols[PR_LOG_NATTS] = {"id", "xid", "stream_id", "part",
	"command_id", "run_id", "seq", "kind", "payload", "headers", "ordering_key",
"decided_by", "created_at"};
static const bool pr_log_hasdef[PR_LOG_NATTS] = {false, false, false, false, false, false,
false, false, false, false, false, false, true};
static const int64 pr_log_types[PR_LOG_NATTS] = {INT8OID, XID8OID, INT4OID, INT4OID, TEXTOID,
TEXTOID, INT8OID, TEXTOID, JSONBOID, JSONBOID, TEXTOID, OIDOID, TIMESTAMPTZOID};

#define PRL_ID			0
#define PRL_XID			1
#define PRL_STREAM_ID	2
#define PRL_PART		3
#define PRL_COMMAND_ID	4
#define PRL_RUN_ID		5
#define PRL_SEQ			6
#define PRL_KIND		7
#define PRL_PAYLOAD		8
#define PRL_HEADERS		9
#define PRL_ORDERING_KEY 10
#define PRL_DECIDED_BY	11
#define PRL_CREATED_AT	12

/* the relations read: policies, streams, stream_rotation */
#define PR_READ_POLICIES	0
#define PR_READ_STREAMS		1
#define PR_READ_ROTATION	2
#define PR_NREAD			3

static bool pr_stream_valid = false;
static bool pr_stream_usable = false;
static Oid	pr_log_relid[3];
static AttrNumber pr_log_attno[3][PR_LOG_NATTS];
static Oid	pr_read_relid[PR_NREAD];
static Oid	pr_logseq_relid = InvalidOid;
static Oid	pr_policies_key = InvalidOid;
static Oid	pr_streams_key = InvalidOid;
static Oid	pr_events_cmd_key = InvalidOid;
static AttrNumber pr_pol_kind;
static AttrNumber pr_pol_stream;
static AttrNumber pr_st_stream;
static AttrNumber pr_st_id;
static AttrNumber pr_st_parts;
static AttrNumber pr_rot_current;
static AttrNumber pr_rot_base;
static AttrNumber pr_evt_command_attno;

/* Relcache callback: forget the direct writer's look at the tables. */
static void
pr_direct_forget(Datum arg, Oid relid)
{
	int			i;

	if (!OidIsValid(relid) || relid == pr_commands_relid || relid == pr_events_relid ||
		relid == pr_logseq_relid)
		pr_direct_valid = pr_stream_valid = false;
	for (i = 0; i < 3; i++)
		if (relid == pr_log_relid[i] || relid == pr_read_relid[i])
			pr_stream_valid = false;
}

/*
 * Map a relation's columns to the names the writer knows; false when it
 * has a column (not dropped) of another name, lacks one, has a default or
 * a generated or identity column where 00_schema.sql has none, or a column
 * of another type (the statements would convert the value; the writer
 * would store the datum as it is).
 */
static bool
pr_direct_map(Relation rel, const char *const *names, const bool *hasdef,
			  const int64 *types, int n, AttrNumber *attno)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			seen = 0;
	int			i;
	int			j;

	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped)
			continue;
		for (j = 0; j < n; j++)
			if (strcmp(NameStr(att->attname), names[j]) == 0)
				break;
		if (j == n || att->attgenerated || att->attidentity ||
			att->atthasdef != hasdef[j])
			return false;
		if (types[j] > 0 ? att->atttypid != (Oid) types[j] :
			(get_typtype(att->atttypid) != TYPTYPE_DOMAIN ||
			 getBaseType(att->atttypid) != (Oid) -types[j]))
			return false;
		attno[j] = att->attnum;
		seen++;
	}
	return seen == n;
}

/* The attribute number of column name of type typid in rel; 0 if none. */
static AttrNumber
pr_direct_column(Relation rel, const char *name, Oid typid)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			i;

	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (!att->attisdropped && strcmp(NameStr(att->attname), name) == 0)
			return att->atttypid == typid ? att->attnum : InvalidAttrNumber;
	}
	return InvalidAttrNumber;
}

/*
 * The id of index name of namespace nsp when it is a valid b-tree index of
 * the one column attno of the table relid; InvalidOid otherwise.
 */
static Oid
pr_direct_key(Oid nsp, const char *name, Oid relid, AttrNumber attno)
{
	Oid			indexid = get_relname_relid(name, nsp);
	Relation	irel;
	bool		ok;

	if (!OidIsValid(indexid) || attno == InvalidAttrNumber)
		return InvalidOid;
	irel = index_open(indexid, AccessShareLock);
	ok = irel->rd_index->indrelid == relid && irel->rd_index->indnatts == 1 &&
		irel->rd_index->indkey.values[0] == attno && irel->rd_index->indisvalid &&
		irel->rd_rel->relam == BTREE_AM_OID && irel->rd_opcintype[0] == TEXTOID;
	index_close(irel, NoLock);
	return ok ? indexid : InvalidOid;
}

/* Look at the stream writer's tables (pr_stream_usable); nsp is the extension's. */
static void
pr_direct_lookup_stream(Oid nsp)
{
	static const char *const logs[3] = {"stream_log_0", "stream_log_1", "stream_log_2"};
	static const char *const reads[PR_NREAD] = {"policies", "streams", "stream_rotation"};
	Relation	rel[PR_NREAD];
	int			i;

	pr_stream_usable = false;
	for (i = 0; i < 3; i++)
	{
		Relation	log;
		bool		ok;

		pr_log_relid[i] = get_relname_relid(logs[i], nsp);
		if (!OidIsValid(pr_log_relid[i]))
			return;
		log = table_open(pr_log_relid[i], AccessShareLock);
		ok = pr_direct_map(log, pr_log_cols, pr_log_hasdef, pr_log_types, PR_LOG_NATTS,
						   pr_log_attno[i]);
		table_close(log, NoLock);
		if (!ok)
			return;
	}
	for (i = 0; i < PR_NREAD; i++)
	{
		pr_read_relid[i] = get_relname_relid(reads[i], nsp);
		if (!OidIsValid(pr_read_relid[i]))
			return;
	}
	pr_logseq_relid = get_relname_relid("stream_log_id_seq", nsp);
	if (!OidIsValid(pr_logseq_relid) || get_rel_relkind(pr_logseq_relid) != RELKIND_SEQUENCE)
		return;
	for (i = 0; i < PR_NREAD; i++)
		rel[i] = table_open(pr_read_relid[i], AccessShareLock);
	pr_pol_kind = pr_direct_column(rel[PR_READ_POLICIES], "kind", TEXTOID);
	pr_pol_stream = pr_direct_column(rel[PR_READ_POLICIES], "stream", TEXTOID);
	pr_st_stream = pr_direct_column(rel[PR_READ_STREAMS], "stream", TEXTOID);
	pr_st_id = pr_direct_column(rel[PR_READ_STREAMS], "stream_id", INT4OID);
	pr_st_parts = pr_direct_column(rel[PR_READ_STREAMS], "partitions", INT4OID);
	pr_rot_current = pr_direct_column(rel[PR_READ_ROTATION], "current", INT4OID);
	pr_rot_base = pr_direct_column(rel[PR_READ_ROTATION], "xid_base", INT8OID);
	for (i = 0; i < PR_NREAD; i++)
		table_close(rel[i], NoLock);
	pr_evt_command_attno = pr_evt_attno[PRE_COMMAND_ID];
	pr_policies_key = pr_direct_key(nsp, "policies_pkey", pr_read_relid[PR_READ_POLICIES],
									pr_pol_kind);
	pr_streams_key = pr_direct_key(nsp, "streams_pkey", pr_read_relid[PR_READ_STREAMS],
								   pr_st_stream);
	pr_events_cmd_key = pr_direct_key(nsp, "events_command_id_key", pr_events_relid,
									  pr_evt_command_attno);
	pr_stream_usable = OidIsValid(pr_policies_key) && OidIsValid(pr_streams_key) &&
		OidIsValid(pr_events_cmd_key) && pr_pol_stream != InvalidAttrNumber &&
		pr_st_id != InvalidAttrNumber && pr_st_parts != InvalidAttrNumber &&
		pr_rot_current != InvalidAttrNumber && pr_rot_base != InvalidAttrNumber;
}

/* Look at the two tables once: their ids and columns (pr_direct_usable). */
static void
pr_direct_lookup(void)
{
	Oid			nsp;
	Relation	rel;

	if (pr_direct_valid)
		return;
	if (!pr_direct_registered)
	{
		CacheRegisterRelcacheCallback(pr_direct_forget, (Datum) 0);
		pr_direct_registered = true;
	}
	pr_direct_valid = true;
	pr_direct_usable = false;
	nsp = get_namespace_oid("outbox", false);
	pr_commands_relid = get_relname_relid("commands", nsp);
	pr_events_relid = get_relname_relid("events", nsp);
	if (!OidIsValid(pr_commands_relid) || !OidIsValid(pr_events_relid))
		return;
	rel = table_open(pr_commands_relid, AccessShareLock);
	pr_direct_usable = pr_direct_map(rel, pr_cmd_cols, pr_cmd_hasdef, pr_cmd_types,
									 PR_CMD_NATTS, pr_cmd_attno);
	table_close(rel, NoLock);
	rel = table_open(pr_events_relid, AccessShareLock);
	pr_direct_usable = pr_direct_usable &&
		pr_direct_map(rel, pr_evt_cols, pr_evt_hasdef, pr_evt_types, PR_EVT_NATTS,
						  pr_evt_attno);
	table_close(rel, NoLock);
}

/*
 * Look at the stream writer's tables once (pr_stream_usable), after the two
 * tables above: only a stream decision does, so that the row path never
 * opens the stream's tables.
 */
static void
pr_stream_lookup(void)
{
	pr_direct_lookup();
	if (pr_stream_valid)
		return;
	pr_stream_valid = true;
	pr_stream_usable = false;
	if (pr_direct_usable)
		pr_direct_lookup_stream(get_namespace_oid("outbox", false));
}

/* Whether a relation opened by the writer takes its rows as the statement would. */
static bool
pr_direct_plain(Relation rel, const char *check)
{
	TupleConstr *constr = rel->rd_att->constr;
	int			nchecks = constr == NULL ? 0 : constr->num_check;

	return rel->rd_rel->relkind == RELKIND_RELATION &&
		rel->trigdesc == NULL && rel->rd_rules == NULL &&
		!rel->rd_rel->relrowsecurity &&
		(check == NULL ? nchecks == 0 :
		 nchecks == 1 && strcmp(constr->check[0].ccname, check) == 0) &&
		pg_class_aclcheck(RelationGetRelid(rel), GetUserId(), ACL_INSERT) == ACLCHECK_OK;
}

/*
 * Prepare the predicates of the partial indexes ExecOpenIndices opened for
 * rri, in the executor state's memory, where ExecInsertIndexTuples would
 * prepare them at its first row (ExecPrepareQual) but without planning
 * them again: a predicate from the relcache (RelationGetIndexPredicate) has
 * been through eval_const_expressions and fix_opfuncids already, which is
 * all that expression_planner would do to it.
 */
static void
pr_direct_predicates(ResultRelInfo *rri, EState *estate)
{
	MemoryContext old = MemoryContextSwitchTo(estate->es_query_cxt);
	int			i;

	for (i = 0; i < rri->ri_NumIndices; i++)
	{
		IndexInfo  *ii = rri->ri_IndexRelationInfo[i];

		if (ii->ii_Predicate != NIL && ii->ii_PredicateState == NULL)
			ii->ii_PredicateState = ExecInitQual(ii->ii_Predicate, NULL);
	}
	MemoryContextSwitchTo(old);
}

/* Take the statement's snapshot and command id, as SPI takes them. */
static void
pr_direct_snapshot(void)
{
	PushActiveSnapshot(GetTransactionSnapshot());
	CommandCounterIncrement();
	UpdateActiveSnapshotCommandId();
}

/*
 * Open the indexes of d's two tables (d->commands, d->events, opened with
 * their locks) and make the executor state and the slots, under the
 * snapshot pr_direct_snapshot took.
 */
static void
pr_direct_start(PrDirect *d)
{
	d->estate = CreateExecutorState();
	d->crri = makeNode(ResultRelInfo);
	InitResultRelInfo(d->crri, d->commands, 1, NULL, 0);
	ExecOpenIndices(d->crri, false);
	pr_direct_predicates(d->crri, d->estate);
	d->erri = makeNode(ResultRelInfo);
	InitResultRelInfo(d->erri, d->events, 2, NULL, 0);
	ExecOpenIndices(d->erri, false);
	pr_direct_predicates(d->erri, d->estate);
	d->cslot = table_slot_create(d->commands, NULL);
	d->eslot = table_slot_create(d->events, NULL);
	d->estate->es_snapshot = GetActiveSnapshot();
	d->estate->es_output_cid = GetCurrentCommandId(true);
}

/*
 * Open the two tables and their indexes for the direct writer; false
 * (nothing open, the locks kept, as the statements would take them) when
 * the call must take the statements instead.
 */
static bool
pr_direct_open(PrDirect *d)
{
	/* (a read-only transaction: the statement raises 25006) */
	if (OutboxCitusLoaded() || XactReadOnly)
		return false;
	pr_direct_lookup();
	if (!pr_direct_usable)
		return false;
	d->commands = table_open(pr_commands_relid, RowExclusiveLock);
	d->events = table_open(pr_events_relid, RowExclusiveLock);

	/* the locks read invalidations: a change committed since the look counts */
	if (!pr_direct_valid)
		pr_direct_lookup();
	if (!pr_direct_usable || RelationGetRelid(d->commands) != pr_commands_relid ||
		RelationGetRelid(d->events) != pr_events_relid ||
		!pr_direct_plain(d->commands, NULL) || !pr_direct_plain(d->events, "events_seq_check") ||
		pg_class_aclcheck(pr_commands_relid, GetUserId(), ACL_SELECT) != ACLCHECK_OK ||
		!OidIsValid(RelationGetPrimaryKeyIndex(d->commands)))
	{
		table_close(d->events, NoLock);
		table_close(d->commands, NoLock);
		return false;
	}
	pr_direct_snapshot();
	pr_direct_start(d);
	return true;
}

/* Close what pr_direct_open opened, keeping the locks; make the rows visible. */
static void
pr_direct_close(PrDirect *d)
{
	PopActiveSnapshot();
	CommandCounterIncrement();
	ExecDropSingleTupleTableSlot(d->eslot);
	ExecDropSingleTupleTableSlot(d->cslot);
	ExecCloseIndices(d->erri);
	ExecCloseIndices(d->crri);
	FreeExecutorState(d->estate);
	table_close(d->events, NoLock);
	table_close(d->commands, NoLock);
}

static HeapTuple pr_direct_fetch(Relation rel, Oid indexid, AttrNumber attno, Datum value);

/* Whether commands holds command_id, under the statement's snapshot. */
static bool
pr_direct_stored(PrDirect *d, text *command_id)
{
	HeapTuple	tuple = pr_direct_fetch(d->commands, RelationGetPrimaryKeyIndex(d->commands),
										pr_cmd_attno[PRC_COMMAND_ID],
										PointerGetDatum(command_id));

	if (tuple == NULL)
		return false;
	heap_freetuple(tuple);
	return true;
}

/*
 * Refuse a NULL in a NOT NULL column of the slot's row as the executor
 * refuses it (a superuser may have made a column NOT NULL; the CHECK
 * constraint is pr_check_seq's, pr_direct_plain admits no other), and
 * store the row as the slot's virtual tuple.
 */
static void
pr_direct_ready(Relation rel, TupleTableSlot *slot)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			i;

	for (i = 0; i < desc->natts; i++)
		if (slot->tts_isnull[i] && TupleDescAttr(desc, i)->attnotnull)
			ereport(ERROR,
					(errcode(ERRCODE_NOT_NULL_VIOLATION),
					 errmsg("null value in column \"%s\" of relation \"%s\" violates not-null constraint",
							NameStr(TupleDescAttr(desc, i)->attname), RelationGetRelationName(rel)),
					 errtablecol(rel, i + 1)));
	ExecStoreVirtualTuple(slot);
}

/* Insert the index entries of the row just inserted from slot. */
static void
pr_direct_index(PrDirect *d, ResultRelInfo *rri, TupleTableSlot *slot)
{
	List	   *deferred;

	deferred = ExecInsertIndexTuples(rri, slot, d->estate, false, false, NULL, NIL);
	list_free(deferred);
	ResetPerTupleExprContext(d->estate);
}

/*
 * Insert the slot's row and its index entries, as ExecSimpleRelationInsert
 * (the NOT NULL check of pr_direct_ready first).
 */
static void
pr_direct_insert(PrDirect *d, ResultRelInfo *rri, TupleTableSlot *slot)
{
	pr_direct_ready(rri->ri_RelationDesc, slot);
	table_tuple_insert(rri->ri_RelationDesc, slot, d->estate->es_output_cid, 0, NULL);
	pr_direct_index(d, rri, slot);
}

/*
 * Fill the command slot c and the event slot e with one decision (args as
 * PR_DECIDE takes them; nulls[10], the headers, may be 'n'); pending is
 * the text 'pending'.
 */
static void pr_direct_fill_event(TupleTableSlot *e, Datum *args, const char *nulls,
								 TimestampTz now);

static void
pr_direct_fill(TupleTableSlot *c, TupleTableSlot *e, Datum *args, const char *nulls,
			   TimestampTz now, Datum pending)
{
	Datum		at = nulls[7] == 'n' ? TimestampTzGetDatum(now) : args[7];
	int			i;

	ExecClearTuple(c);
	for (i = 0; i < c->tts_tupleDescriptor->natts; i++)
		c->tts_isnull[i] = true;
#define PR_SETC(col, v) \
	do { c->tts_values[pr_cmd_attno[col] - 1] = (v); \
		 c->tts_isnull[pr_cmd_attno[col] - 1] = false; } while (0)
	PR_SETC(PRC_COMMAND_ID, args[3]);
	PR_SETC(PRC_RUN_ID, args[0]);
	PR_SETC(PRC_SEQ, args[1]);
	PR_SETC(PRC_KIND, args[4]);
	PR_SETC(PRC_STATUS, pending);
	PR_SETC(PRC_VERSION, Int64GetDatum(1));
	PR_SETC(PRC_DELIVERIES, Int32GetDatum(0));
	PR_SETC(PRC_PRIORITY, args[8]);
	PR_SETC(PRC_AVAILABLE_AT, at);
	PR_SETC(PRC_DUE_AT, at);
	PR_SETC(PRC_CREATED_AT, TimestampTzGetDatum(now));
	PR_SETC(PRC_PAYLOAD, args[5]);
	PR_SETC(PRC_DECIDED_BY, args[9]);
	if (nulls[10] != 'n')
		PR_SETC(PRC_HEADERS, args[10]);
#undef PR_SETC
	pr_direct_fill_event(e, args, nulls, now);
}

/* Fill the event slot e with a decision's event (args as pr_direct_fill takes them). */
static void
pr_direct_fill_event(TupleTableSlot *e, Datum *args, const char *nulls, TimestampTz now)
{
	int			i;

	ExecClearTuple(e);
	for (i = 0; i < e->tts_tupleDescriptor->natts; i++)
		e->tts_isnull[i] = true;
#define PR_SETE(col, v) \
	do { e->tts_values[pr_evt_attno[col] - 1] = (v); \
		 e->tts_isnull[pr_evt_attno[col] - 1] = false; } while (0)
	PR_SETE(PRE_RUN_ID, args[0]);
	PR_SETE(PRE_SEQ, args[1]);
	PR_SETE(PRE_KIND, args[2]);
	if (nulls[6] != 'n')
		PR_SETE(PRE_PAYLOAD, args[6]);
	PR_SETE(PRE_COMMAND_ID, args[3]);
	PR_SETE(PRE_CREATED_AT, TimestampTzGetDatum(now));
#undef PR_SETE
}

/*
 * Insert one decision (args as pr_direct_fill takes them), the command and
 * then its event; a unique violation of the extension's keys is re-raised
 * as pr_insert does.
 */
static void
pr_direct_decision(PrDirect *d, Datum *args, const char *nulls, TimestampTz now,
				   const PrWhat *w)
{
	MemoryContext cxt = CurrentMemoryContext;

	pr_direct_fill(d->cslot, d->eslot, args, nulls, now, CStringGetTextDatum("pending"));
	PG_TRY();
	{
		pr_direct_insert(d, d->crri, d->cslot);
		pr_direct_insert(d, d->erri, d->eslot);
	}
	PG_CATCH();
	{
		pr_insert_caught(cxt, w);
	}
	PG_END_TRY();
}

/*
 * Whether a relation the stream writer only reads is read as the
 * statement would read it (a plain table without row-level security that
 * the owner may SELECT).
 */
static bool
pr_direct_readable(Relation rel)
{
	return rel->rd_rel->relkind == RELKIND_RELATION && !rel->rd_rel->relrowsecurity &&
		pg_class_aclcheck(RelationGetRelid(rel), GetUserId(), ACL_SELECT) == ACLCHECK_OK;
}

/*
 * The first row of rel with column attno equal to the text value, through
 * the index indexid (InvalidOid: the first row of a scan of the table),
 * under the active snapshot, copied into the current memory context; NULL
 * when there is none.
 */
static HeapTuple
pr_direct_fetch(Relation rel, Oid indexid, AttrNumber attno, Datum value)
{
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;

	if (OidIsValid(indexid))
		ScanKeyInit(&key, attno, BTEqualStrategyNumber, F_TEXTEQ, value);
	scan = systable_beginscan(rel, indexid, OidIsValid(indexid), GetActiveSnapshot(),
							  OidIsValid(indexid) ? 1 : 0, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
		tuple = heap_copytuple(tuple);
	systable_endscan(scan);
	return tuple;
}

/*
 * Fill the log slot l with a decision (args as pr_decide_stream has them:
 * args[11] the ordering key or NULL), its log id, transaction id, stream
 * and partition; attno the table's columns.
 */
static void
pr_direct_fill_log(TupleTableSlot *l, const AttrNumber *attno, Datum *args,
				   const char *nulls, int64 id, uint64 xid, int32 stream_id,
				   int32 part, TimestampTz now)
{
	int			i;

	ExecClearTuple(l);
	for (i = 0; i < l->tts_tupleDescriptor->natts; i++)
		l->tts_isnull[i] = true;
#define PR_SETL(col, v) \
	do { l->tts_values[attno[col] - 1] = (v); \
		 l->tts_isnull[attno[col] - 1] = false; } while (0)
	PR_SETL(PRL_ID, Int64GetDatum(id));
	PR_SETL(PRL_XID, FullTransactionIdGetDatum(FullTransactionIdFromU64(xid)));
	PR_SETL(PRL_STREAM_ID, Int32GetDatum(stream_id));
	PR_SETL(PRL_PART, Int32GetDatum(part));
	PR_SETL(PRL_COMMAND_ID, args[3]);
	PR_SETL(PRL_RUN_ID, args[0]);
	PR_SETL(PRL_SEQ, args[1]);
	PR_SETL(PRL_KIND, args[4]);
	PR_SETL(PRL_PAYLOAD, args[5]);
	if (nulls[10] != 'n')
		PR_SETL(PRL_HEADERS, args[10]);
	if (nulls[11] != 'n')
		PR_SETL(PRL_ORDERING_KEY, args[11]);
	PR_SETL(PRL_DECIDED_BY, args[9]);
	PR_SETL(PRL_CREATED_AT, TimestampTzGetDatum(now));
#undef PR_SETL
}

/*
 * The stream writer: decisions of kinds with a stream, appended to the
 * current log table with their events without SQL, as src/stream.c's
 * statements write them (OutboxStreamDecidePlan for one, and
 * OutboxStreamBatchPlan for a batch), while no kind has deciders (the
 * callers' test).  The call takes the statement instead when Citus is
 * loaded, in a read-only transaction, when a table would take or give rows
 * differently (pr_direct_open's conditions, for the three log tables too,
 * and no row-level security on the tables read), or when a decision's
 * policy or stream, or the rotation's row, is not there under the
 * snapshot.
 *
 * The locks and the snapshot come in the statement's order, which the
 * rotation's safety rests on (src/sql/35_streams.sql, _stream_rotate): all
 * three log tables are locked (RowExclusiveLock, as the statement's plan
 * locks them when it is fetched) before the snapshot is taken, and only
 * then is stream_rotation.current read, under that snapshot.  So a
 * rotation holding one table's ACCESS EXCLUSIVE lock to truncate it is
 * waited for before the call can see which table is current, and a
 * rotation that asks for the lock after the call took it waits for the
 * caller's commit and then counts the row (test/isolation
 * stream_rotate_vs_append).
 *
 * A row: id from the log's sequence (in the batch's order), xid the top
 * transaction's id plus xid_base, the partition the hash of the ordering
 * key (else of the run_id), & 2147483647, modulo the stream's partitions
 * (hashtext, as the statements), created_at the transaction's now(); the
 * event as the row path's (pr_direct_fill_event).  The events go first,
 * as in the statements, whose log inserts run after their top INSERT: a
 * taken (run_id, seq) or command id raises 23505 on events_pkey or
 * events_command_id_key before any log row is written.
 */
typedef struct PrStream
{
	Relation	events;
	Relation	logs[3];
	Relation	reads[PR_NREAD];
	int32		current;		/* the current log table */
	int64		xid_base;
	int64		xid;			/* the rows' xid (xid_base added) */
	text	   *kind;			/* the last kind looked up, and its stream */
	int32		stream_id;
	int32		partitions;
} PrStream;

/* Close what pr_stream_open opened but the events and the current log table. */
static void
pr_stream_close_others(PrStream *s)
{
	int			i;

	for (i = 0; i < PR_NREAD; i++)
		if (s->reads[i] != NULL)
			table_close(s->reads[i], NoLock);
	for (i = 0; i < 3; i++)
		if (i != s->current)
			table_close(s->logs[i], NoLock);
}

/*
 * Lock and open the stream writer's tables, take the snapshot and read the
 * current log table under it; false (everything closed, the locks kept)
 * when the call must take the statement.
 */
static bool
pr_stream_open(PrStream *s)
{
	HeapTuple	tuple;
	bool		isnull;
	bool		ok;
	int			i;

	/* (a read-only transaction: the statement raises 25006) */
	if (OutboxCitusLoaded() || XactReadOnly)
		return false;
	pr_stream_lookup();
	if (!pr_direct_usable || !pr_stream_usable)
		return false;
	/* the statement's locks: the tables written, then those read */
	s->events = table_open(pr_events_relid, RowExclusiveLock);
	for (i = 0; i < 3; i++)
		s->logs[i] = table_open(pr_log_relid[i], RowExclusiveLock);
	for (i = 0; i < PR_NREAD; i++)
		s->reads[i] = table_open(pr_read_relid[i], AccessShareLock);
	s->current = -1;
	s->kind = NULL;

	/* the locks read invalidations: a change committed since the look counts */
	if (!pr_direct_valid || !pr_stream_valid)
		pr_stream_lookup();
	ok = pr_direct_usable && pr_stream_usable &&
		RelationGetRelid(s->events) == pr_events_relid &&
		pr_direct_plain(s->events, "events_seq_check") && pr_direct_readable(s->events);
	for (i = 0; i < 3 && ok; i++)
		ok = RelationGetRelid(s->logs[i]) == pr_log_relid[i] && pr_direct_plain(s->logs[i], NULL);
	for (i = 0; i < PR_NREAD && ok; i++)
		ok = RelationGetRelid(s->reads[i]) == pr_read_relid[i] && pr_direct_readable(s->reads[i]);

	/* then the snapshot, and under it the current table */
	if (ok)
	{
		pr_direct_snapshot();
		tuple = pr_direct_fetch(s->reads[PR_READ_ROTATION], InvalidOid, 0, (Datum) 0);
		ok = false;
		if (tuple != NULL)
		{
			TupleDesc	desc = RelationGetDescr(s->reads[PR_READ_ROTATION]);

			s->current = DatumGetInt32(heap_getattr(tuple, pr_rot_current, desc, &isnull));
			ok = !isnull && s->current >= 0 && s->current <= 2;
			s->xid_base = DatumGetInt64(heap_getattr(tuple, pr_rot_base, desc, &isnull));
			ok = ok && !isnull;
		}
		if (!ok)
		{
			s->current = -1;
			PopActiveSnapshot();
			CommandCounterIncrement();
		}
	}
	if (!ok)
	{
		pr_stream_close_others(s);
		table_close(s->events, NoLock);
		return false;
	}
	s->xid = 0;
	return true;
}

/* Give up a stream write before anything was written (pr_stream_open's tables). */
static void
pr_stream_abandon(PrStream *s)
{
	PopActiveSnapshot();
	CommandCounterIncrement();
	pr_stream_close_others(s);
	table_close(s->logs[s->current], NoLock);
	table_close(s->events, NoLock);
}

/*
 * The stream of kind under the snapshot (s->stream_id, s->partitions), as
 * the statement's join of policies and streams finds it; false when there
 * is none.  The last kind's is kept.
 */
static bool
pr_stream_of(PrStream *s, text *kind)
{
	HeapTuple	tuple;
	Datum		stream;
	bool		isnull;
	bool		nullid;

	if (s->kind != NULL && OutboxCompareIds(s->kind, kind) == 0 &&
		VARSIZE_ANY_EXHDR(s->kind) == VARSIZE_ANY_EXHDR(kind))
		return true;
	s->kind = NULL;
	tuple = pr_direct_fetch(s->reads[PR_READ_POLICIES], pr_policies_key, pr_pol_kind,
							PointerGetDatum(kind));
	if (tuple == NULL)
		return false;
	stream = heap_getattr(tuple, pr_pol_stream, RelationGetDescr(s->reads[PR_READ_POLICIES]),
						  &isnull);
	if (isnull)
		return false;
	tuple = pr_direct_fetch(s->reads[PR_READ_STREAMS], pr_streams_key, pr_st_stream, stream);
	if (tuple == NULL)
		return false;
	s->stream_id = DatumGetInt32(heap_getattr(tuple, pr_st_id,
											  RelationGetDescr(s->reads[PR_READ_STREAMS]), &nullid));
	s->partitions = DatumGetInt32(heap_getattr(tuple, pr_st_parts,
											   RelationGetDescr(s->reads[PR_READ_STREAMS]), &isnull));
	if (nullid || isnull || s->partitions < 1)
		return false;
	s->kind = kind;
	return true;
}

/*
 * Done reading: close the tables read and the log tables not written, and
 * make d the writer of the events and the current log table (in the place
 * of outbox.commands).
 */
static void
pr_stream_start(PrStream *s, PrDirect *d)
{
	int			i;

	for (i = 0; i < PR_NREAD; i++)
	{
		table_close(s->reads[i], NoLock);
		s->reads[i] = NULL;
	}
	pr_stream_close_others(s);
	d->commands = s->logs[s->current];
	d->events = s->events;
	pr_direct_start(d);
}

/*
 * Fill the log slot l with a decision (args as pr_decide_stream has them:
 * args[11] the ordering key, or nulls[11] 'n') of the stream s->kind's,
 * taking its log id; the events are inserted already (their transaction
 * id is assigned).
 */
static void
pr_stream_fill(PrStream *s, TupleTableSlot *l, Datum *args, const char *nulls,
			   TimestampTz now)
{
	int32		part;

	if (s->xid == 0 &&
		pg_add_s64_overflow((int64) U64FromFullTransactionId(GetTopFullTransactionId()),
							s->xid_base, &s->xid))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("bigint out of range")));
	part = (DatumGetInt32(DirectFunctionCall1Coll(hashtext, DEFAULT_COLLATION_OID,
												  nulls[11] != 'n' ? args[11] : args[0]))
			& 2147483647) % s->partitions;
	pr_direct_fill_log(l, pr_log_attno[s->current], args, nulls,
					   nextval_internal(pr_logseq_relid, true), (uint64) s->xid,
					   s->stream_id, part, now);
}

/*
 * One decision (args as pr_decide_stream has them) by the stream writer.
 * Returns 1 when it wrote it, 0 when an event holds the command id already
 * under the statement's snapshot (the caller then diagnoses,
 * OutboxStreamWhyNot), and -1, having written nothing, when the call must
 * take the statement.  A unique violation is raised as pr_insert does.
 */
static int
pr_direct_stream(Datum *args, const char *nulls, const PrWhat *w)
{
	PrStream	s;
	PrDirect	d;
	MemoryContext cxt = CurrentMemoryContext;
	TimestampTz now = GetCurrentTransactionStartTimestamp();

	if (!pr_stream_open(&s))
		return -1;
	if (!pr_stream_of(&s, DatumGetTextPP(args[4])))
	{
		pr_stream_abandon(&s);
		return -1;
	}
	/* a command id an event holds: not inserted (the caller diagnoses) */
	if (pr_direct_fetch(s.events, pr_events_cmd_key, pr_evt_command_attno, args[3]) != NULL)
	{
		pr_stream_abandon(&s);
		return 0;
	}
	pr_stream_start(&s, &d);
	PG_TRY();
	{
		pr_direct_fill_event(d.eslot, args, nulls, now);
		pr_direct_insert(&d, d.erri, d.eslot);
		pr_stream_fill(&s, d.cslot, args, nulls, now);
		pr_direct_insert(&d, d.crri, d.cslot);
	}
	PG_CATCH();
	{
		pr_insert_caught(cxt, w);
	}
	PG_END_TRY();
	pr_direct_close(&d);
	return 1;
}

/*
 * outbox.commit_decision(run_id, seq, event_kind, command_id, command_kind,
 *						  payload, event_payload, not_before, priority,
 *						  headers, ordering_key)
 *
 * Insert the event and the command it decides, in one statement; true when
 * recorded, false for the caller's own retry of a recorded decision.  With
 * an ordering key (given, or the run_id for a kind ordered by run), the
 * key is locked and its last command read first (src/keys.c).
 */
static Datum
pr_commit_decision(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid argtypes[14] = {TEXTOID, INT8OID, TEXTOID, TEXTOID, TEXTOID,
	JSONBOID, JSONBOID, TIMESTAMPTZOID, INT4OID, OIDOID, JSONBOID, TEXTOID, INT8OID, BOOLOID};
	text	   *run_id = OutboxArgId(fcinfo, 0, "run_id");
	int64		seq;
	text	   *event_kind;
	text	   *command_id;
	text	   *command_kind;
	Jsonb	   *payload;
	Jsonb	   *event_payload;
	Datum		args[14];
	char		nulls[14] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', 'n', ' ', ' ', ' '};
	text	   *key = NULL;
	SPIPlanPtr	plan;
	PrWhat		what;
	PrDirect	direct;

	OutboxArgNotNull(fcinfo, 1, "seq");
	seq = PG_GETARG_INT64(1);
	pr_check_seq(seq);
	event_kind = OutboxArgId(fcinfo, 2, "event_kind");
	command_id = OutboxArgId(fcinfo, 3, "command_id");
	command_kind = OutboxArgId(fcinfo, 4, "command_kind");
	payload = OutboxArgPayload(fcinfo, 5, "payload", false);
	event_payload = OutboxArgPayload(fcinfo, 6, "event_payload", true);
	if (!PG_ARGISNULL(7))
		pr_check_not_before(PG_GETARG_TIMESTAMPTZ(7));
	OutboxArgNotNull(fcinfo, 8, "priority");

	args[0] = PointerGetDatum(run_id);
	args[1] = Int64GetDatum(seq);
	args[2] = PointerGetDatum(event_kind);
	args[3] = PointerGetDatum(command_id);
	args[4] = PointerGetDatum(command_kind);
	args[5] = PointerGetDatum(payload);
	args[6] = event_payload ? PointerGetDatum(event_payload) : (Datum) 0;
	if (event_payload == NULL)
		nulls[6] = 'n';
	args[7] = PG_ARGISNULL(7) ? (Datum) 0 : PG_GETARG_DATUM(7);
	if (PG_ARGISNULL(7))
		nulls[7] = 'n';
	args[8] = PG_GETARG_DATUM(8);
	args[9] = ObjectIdGetDatum(caller);
	args[10] = (Datum) 0;
	if (PG_NARGS() > 9 && !PG_ARGISNULL(9))
	{
		Jsonb	   *headers = PG_GETARG_JSONB_P(9);

		OutboxCheckHeaders(headers, 0);
		args[10] = PointerGetDatum(headers);
		nulls[10] = ' ';
	}
	if (PG_NARGS() > 10 && !PG_ARGISNULL(10))
	{
		key = PG_GETARG_TEXT_PP(10);
		OutboxCheckKey(key, 0);
	}

	what.run_id = run_id;
	what.seq = seq;
	what.command_id = command_id;
	what.rows = 1;
	SPI_connect();
	if (key == NULL && OutboxOrderedByRun(command_kind))
		key = run_id;
	/* a kind with a stream: appended to its log (src/stream.c) */
	if (OutboxStreamKind(command_kind))
	{
		bool		recorded = pr_decide_stream(args, nulls, key, &what, 0);

		SPI_finish();
		if (recorded)
		{
			OutboxCountAtCommit(OBC_ENQUEUED, 1);
			OutboxDueAtCommit(OUTBOX_DUE_STREAM);
		}
		PG_RETURN_BOOL(recorded);
	}
	if (OutboxCitusDistributed())
	{
		/* the key's lock lives on one node: not yet on a distributed outbox */
		if (key != NULL)
			pr_raise_keyed_distributed(command_id, 0);
		plan = NULL;
	}
	else if (key == NULL && !OutboxAnyDeciders() && pr_direct_open(&direct))
	{
		/* the common decision: written without SQL (pr_direct_open) */
		if (!pr_direct_stored(&direct, command_id))
		{
			pr_direct_decision(&direct, args, nulls, GetCurrentTransactionStartTimestamp(),
							   &what);
			pr_direct_close(&direct);
			SPI_finish();
			OutboxCountAtCommit(OBC_ENQUEUED, 1);
			PG_RETURN_BOOL(true);
		}
		pr_direct_close(&direct);
		pr_why_not(args, nulls, 0);
		SPI_finish();
		PG_RETURN_BOOL(false);
	}
	else if (key == NULL)
		plan = OutboxAnyDeciders() ?
			OutboxPrepare(&plan_decide, PR_DECIDE("", "", PR_DUE, PR_DECIDERS_FILTER),
						  11, argtypes) :
			OutboxPrepare(&plan_decide_open, PR_DECIDE("", "", PR_DUE, ""), 11, argtypes);
	else
	{
		int64		last;
		bool		busy;

		OutboxLockKeys(caller, &key, 1);
		OutboxKeyTails(caller, &key, 1, &last, &busy);
		args[11] = PointerGetDatum(key);
		args[12] = Int64GetDatum(last + 1);
		args[13] = BoolGetDatum(busy);
		plan = OutboxAnyDeciders() ?
			OutboxPrepare(&plan_decide_keyed,
						  PR_DECIDE(PR_KEY_COLS, PR_KEY_VALS, PR_DUE_KEYED, PR_DECIDERS_FILTER),
						  14, argtypes) :
			OutboxPrepare(&plan_decide_keyed_open,
						  PR_DECIDE(PR_KEY_COLS, PR_KEY_VALS, PR_DUE_KEYED, ""),
						  14, argtypes);
	}
	if (plan == NULL ? pr_decide_routed(args, nulls, &what) :
		pr_insert(plan, args, nulls, &what, true))
	{
		SPI_finish();
		OutboxCountAtCommit(OBC_ENQUEUED, 1);
		PG_RETURN_BOOL(true);
	}

	/* Nothing inserted: a forbidden kind, a retry, or a conflict. */
	pr_why_not(args, nulls, 0);
	SPI_finish();
	PG_RETURN_BOOL(false);
}

/* outbox.commit_decision: the body, as the owner, told who called. */
Datum
outbox_commit_decision_1_0(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, pr_commit_decision);
}

/* outbox.record_event(run_id, seq, kind, payload): an event deciding nothing. */
static Datum
pr_record_event(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid argtypes[4] = {TEXTOID, INT8OID, TEXTOID, JSONBOID};
	text	   *run_id = OutboxArgId(fcinfo, 0, "run_id");
	int64		seq;
	text	   *kind;
	Jsonb	   *payload;
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	PrWhat		what;

	OutboxArgNotNull(fcinfo, 1, "seq");
	seq = PG_GETARG_INT64(1);
	pr_check_seq(seq);
	kind = OutboxArgId(fcinfo, 2, "kind");
	payload = OutboxArgPayload(fcinfo, 3, "payload", true);

	args[0] = PointerGetDatum(run_id);
	args[1] = Int64GetDatum(seq);
	args[2] = PointerGetDatum(kind);
	args[3] = payload ? PointerGetDatum(payload) : (Datum) 0;
	if (payload == NULL)
		nulls[3] = 'n';

	what.run_id = run_id;
	what.seq = seq;
	what.command_id = NULL;
	what.rows = 1;
	SPI_connect();
	pr_insert(OutboxPrepare(&plan_event,
							"INSERT INTO outbox.events (run_id, seq, kind, payload)"
							"VALUES ($1, $2, $3, $4)",
							4, argtypes),
			  args, nulls, &what, false);
	SPI_finish();
	PG_RETURN_VOID();
}

/* outbox.record_event: the body, as the owner, told who called. */
Datum
outbox_record_event(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, pr_record_event);
}

/* The keys of a decision of commit_decisions, in the order of its arrays. */
#define PR_NKEYS			11

static const char *const pr_keys[PR_NKEYS] = {"run_id", "seq", "event_kind", "command_id",
"command_kind", "payload", "event_payload", "not_before", "priority", "headers", "ordering_key"};
/* The lengths of pr_keys, for matching a JSON key without copying it. */
static const int pr_key_lens[PR_NKEYS] = {6, 3, 10, 10, 12, 7, 13, 10, 8, 7, 12};

#define PR_KEY_RUN_ID		0
#define PR_KEY_SEQ			1
#define PR_KEY_EVENT_KIND	2
#define PR_KEY_COMMAND_ID	3
#define PR_KEY_COMMAND_KIND 4
#define PR_KEY_PAYLOAD		5
#define PR_KEY_EVENT_PAYLOAD 6
#define PR_KEY_NOT_BEFORE	7
#define PR_KEY_PRIORITY		8
#define PR_KEY_HEADERS		9
#define PR_KEY_ORDERING_KEY 10

/*
 * The parameter of a key's array in the batch statements ($10 is the
 * caller; the ordered batch adds $13, the places in the keys, and $14,
 * whether each waits).
 */
#define PR_KEY_PARAM(j)		((j) < 9 ? (j) : (j) + 1)

/* The JSON type of a value, for messages. */
static const char *
pr_json_type(JsonbValue *v)
{
	switch (v->type)
	{
		case jbvNull:
			return "null";
		case jbvString:
			return "a string";
		case jbvNumeric:
			return "a number";
		case jbvBool:
			return "a boolean";
		default:
			return "an object or array";
	}
}

/* Raise 22023 for a value of the wrong JSON type in decision elem (1-based). */
static void
pr_raise_json_type(int elem, const char *key, JsonbValue *v, const char *wanted)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("%s of decision %d must be %s", key, elem, wanted),
			 errdetail("It is %s.", pr_json_type(v))));
}

/* A JSON string as text, or 22023. */
static Datum
pr_json_text(int elem, const char *key, JsonbValue *v)
{
	if (v->type != jbvString)
		pr_raise_json_type(elem, key, v, "a string");
	return PointerGetDatum(cstring_to_text_with_len(v->val.string.val, v->val.string.len));
}

/*
 * A JSON number that must be an integer (numeric_int8 would round it); a
 * number written without a fraction (display scale 0) is one at once.
 */
static Datum
pr_json_integer(int elem, const char *key, Numeric num)
{
	Datum		d = NumericGetDatum(num);

	if (!numeric_is_nan(num) && !numeric_is_inf(num) &&
		DatumGetInt32(DirectFunctionCall1(numeric_scale, d)) == 0)
		return d;
	if (!DatumGetBool(DirectFunctionCall2(numeric_eq, d,
										  DirectFunctionCall2(numeric_trunc, d, Int32GetDatum(0)))))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s of decision %d must be an integer", key, elem)));
	return d;
}

/*
 * Read the value v of key i (of pr_keys) of decision elem (1-based) into
 * values[i] and isnull[i]: a JSON null is an SQL NULL (payload and
 * event_payload keep it as the JSON null); values of the wrong type are
 * refused.  seq may be a number or a string (a driver's int8), not_before a
 * string in any input form of timestamptz.
 */
static void
pr_read_value(int elem, int i, JsonbValue *v, Datum *values, bool *isnull)
{
	const char *key = pr_keys[i];

	if (v->type == jbvNull && i != PR_KEY_PAYLOAD && i != PR_KEY_EVENT_PAYLOAD)
		return;
	isnull[i] = false;
	switch (i)
	{
		case PR_KEY_SEQ:
			if (v->type == jbvNumeric)
				values[i] = DirectFunctionCall1(numeric_int8,
												pr_json_integer(elem, key, v->val.numeric));
			else if (v->type == jbvString)
				values[i] = DirectFunctionCall1(int8in,
												CStringGetDatum(pnstrdup(v->val.string.val, v->val.string.len)));
			else
				pr_raise_json_type(elem, key, v, "a number or a string");
			break;
		case PR_KEY_PAYLOAD:
		case PR_KEY_EVENT_PAYLOAD:
			values[i] = PointerGetDatum(JsonbValueToJsonb(v));
			break;
		case PR_KEY_HEADERS:
			values[i] = PointerGetDatum(JsonbValueToJsonb(v));
			OutboxCheckHeaders(DatumGetJsonbP(values[i]), elem);
			break;
		case PR_KEY_NOT_BEFORE:
			if (v->type != jbvString)
				pr_raise_json_type(elem, key, v, "a string");
			values[i] = DirectFunctionCall3(timestamptz_in,
											CStringGetDatum(pnstrdup(v->val.string.val, v->val.string.len)),
											ObjectIdGetDatum(InvalidOid), Int32GetDatum(-1));
			break;
		case PR_KEY_PRIORITY:
			if (v->type != jbvNumeric)
				pr_raise_json_type(elem, key, v, "a number");
			values[i] = DirectFunctionCall1(numeric_int4,
											pr_json_integer(elem, key, v->val.numeric));
			break;
		default:
			values[i] = pr_json_text(elem, key, v);
			break;
	}
}

/*
 * Read one decision of commit_decisions into values and isnull, in the
 * order of pr_keys (pr_read_value): a JSON object of those keys, missing
 * keys being SQL NULLs and unknown keys refused, or a JSON array of their
 * values in that order (commit_decision's parameters), of 6 to 11 members,
 * the missing last ones being SQL NULLs.
 */
static void
pr_read_decision(int elem, JsonbValue *obj, Datum *values, bool *isnull)
{
	JsonbIterator *it;
	JsonbValue	k;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			i;

	for (i = 0; i < PR_NKEYS; i++)
	{
		values[i] = (Datum) 0;
		isnull[i] = true;
	}
	if (obj->type != jbvBinary)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("decision %d must be a JSON object or array", elem)));
	if (JsonContainerIsArray(obj->val.binary.data))
	{
		int			size = JsonContainerSize(obj->val.binary.data);

		if (size <= PR_KEY_PAYLOAD || size > PR_NKEYS)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("decision %d must have %d to %d values", elem,
							PR_KEY_PAYLOAD + 1, PR_NKEYS),
					 errdetail("It has %d.", size),
					 errhint("The values are run_id, seq, event_kind, command_id, command_kind, payload, event_payload, not_before, priority, headers and ordering_key, in this order.")));
		it = JsonbIteratorInit(obj->val.binary.data);
		tok = JsonbIteratorNext(&it, &v, true);
		Assert(tok == WJB_BEGIN_ARRAY);
		i = 0;
		while ((tok = JsonbIteratorNext(&it, &v, true)) == WJB_ELEM)
			pr_read_value(elem, i++, &v, values, isnull);
		return;
	}
	it = JsonbIteratorInit(obj->val.binary.data);
	tok = JsonbIteratorNext(&it, &k, true);
	Assert(tok == WJB_BEGIN_OBJECT);
	while ((tok = JsonbIteratorNext(&it, &k, true)) == WJB_KEY)
	{
		tok = JsonbIteratorNext(&it, &v, true);
		Assert(tok == WJB_VALUE);
		for (i = 0; i < PR_NKEYS; i++)
			if (k.val.string.len == pr_key_lens[i] &&
				memcmp(k.val.string.val, pr_keys[i], k.val.string.len) == 0)
				break;
		if (i == PR_NKEYS)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("decision %d has an unknown key \"%s\"", elem,
							pnstrdup(k.val.string.val, k.val.string.len)),
					 errhint("The keys are run_id, seq, event_kind, command_id, command_kind, payload, event_payload, not_before, priority, headers and ordering_key.")));
		pr_read_value(elem, i, &v, values, isnull);
	}
}

/* One element of a batch, for finding repeats within it (in batch order). */
typedef struct PrKey
{
	const char *id;				/* command_id, or run_id with seq */
	int			len;			/* id's length in bytes */
	int64		seq;
} PrKey;

/* Whether two keys are equal: the same bytes (as the "C" keys) and seq. */
static inline bool
pr_same_key(const PrKey *x, const PrKey *y)
{
	return x->len == y->len && x->seq == y->seq && memcmp(x->id, y->id, x->len) == 0;
}

/*
 * Find the repeat placed earliest in the batch: *second is its position
 * and *first that of its earliest twin (0-based), the keys being looked up
 * in batch order in an open-addressing hash table of their own.  Returns
 * false when the keys are all distinct.
 */
static bool
pr_find_repeat(PrKey *keys, int n, int *first, int *second)
{
	uint32		size = 16;
	uint32		mask;
	int		   *slots;
	int			i;

	while (size < (uint32) n * 2)
		size <<= 1;
	mask = size - 1;
	slots = palloc(sizeof(int) * size);
	memset(slots, -1, sizeof(int) * size);
	for (i = 0; i < n; i++)
	{
		uint32		h = hash_bytes_extended((const unsigned char *) keys[i].id,
											keys[i].len, (uint64) keys[i].seq);

		for (h &= mask; slots[h] >= 0; h = (h + 1) & mask)
			if (pr_same_key(&keys[slots[h]], &keys[i]))
			{
				*first = slots[h];
				*second = i;
				pfree(slots);
				return true;
			}
		slots[h] = i;
	}
	pfree(slots);
	return false;
}

/*
 * Raise 23505 if two decisions of a batch share a command id or a (run_id,
 * seq), naming both positions (1-based), before anything is inserted.
 */
static void
pr_check_repeats(Datum *run_ids, Datum *seqs, Datum *command_ids, int n)
{
	PrKey	   *keys = palloc(sizeof(PrKey) * n);
	int			first;
	int			second;
	int			i;

	for (i = 0; i < n; i++)
	{
		text	   *t = DatumGetTextPP(command_ids[i]);

		keys[i].id = VARDATA_ANY(t);
		keys[i].len = VARSIZE_ANY_EXHDR(t);
		keys[i].seq = 0;
	}
	if (pr_find_repeat(keys, n, &first, &second))
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("a decision is repeated within the batch"),
				 errdetail("Decisions %d and %d have the same command_id \"%s\"; nothing of this call was recorded.",
						   first + 1, second + 1,
						   text_to_cstring(DatumGetTextPP(command_ids[second])))));
	for (i = 0; i < n; i++)
	{
		text	   *t = DatumGetTextPP(run_ids[i]);

		keys[i].id = VARDATA_ANY(t);
		keys[i].len = VARSIZE_ANY_EXHDR(t);
		keys[i].seq = DatumGetInt64(seqs[i]);
	}
	if (pr_find_repeat(keys, n, &first, &second))
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("a decision is repeated within the batch"),
				 errdetail("Decisions %d and %d have the same run_id \"%s\" and seq " INT64_FORMAT "; nothing of this call was recorded.",
						   first + 1, second + 1,
						   text_to_cstring(DatumGetTextPP(run_ids[second])),
						   DatumGetInt64(seqs[second]))));
	pfree(keys);
}

/* A decision of a batch with an ordering key, while it is given its place. */
typedef struct PrPlace
{
	text	   *key;
	text	   *run;
	int64		seq;
	int			elem;			/* 0-based position among those inserted */
	int64		place;			/* its ordering_seq */
	int64		first;			/* the place of the key's first new command */
	bool		busy;			/* the key has an unfinished command already */
	bool		alone;			/* the key's only new command */
} PrPlace;

/* qsort comparator of PrPlace: key, then position. */
static int
pr_cmp_place(const void *a, const void *b)
{
	const PrPlace *x = (const PrPlace *) a;
	const PrPlace *y = (const PrPlace *) b;
	int			c = OutboxCompareIds(x->key, y->key);

	return c != 0 ? c : x->elem - y->elem;
}

/* qsort comparator of PrPlace: key, run, then position. */
static int
pr_cmp_place_run(const void *a, const void *b)
{
	const PrPlace *x = (const PrPlace *) a;
	const PrPlace *y = (const PrPlace *) b;
	int			c = OutboxCompareIds(x->key, y->key);

	if (c == 0)
		c = OutboxCompareIds(x->run, y->run);
	return c != 0 ? c : x->elem - y->elem;
}

/* qsort comparator of PrPlace: key, run, seq, then position. */
static int
pr_cmp_place_seq(const void *a, const void *b)
{
	const PrPlace *x = (const PrPlace *) a;
	const PrPlace *y = (const PrPlace *) b;
	int			c = OutboxCompareIds(x->key, y->key);

	if (c == 0)
		c = OutboxCompareIds(x->run, y->run);
	if (c == 0 && x->seq != y->seq)
		c = x->seq < y->seq ? -1 : 1;
	return c != 0 ? c : x->elem - y->elem;
}

/*
 * Place the n decisions of a batch about to be inserted in their ordering
 * keys: lock the keys, read each one's last command (src/keys.c), and set
 * $13 (ordering_seq) and $14 (whether the command waits) of the ordered
 * insert.  A key's new commands follow its last one in the order of the
 * batch, except that the commands of one run take their places in seq
 * order: the places the run's decisions hold in batch order go to them
 * sorted by seq.  The first new command of a key is its head when the key
 * had no unfinished command; every other one waits.  $15 marks a head
 * that is its key's only new command (ordering_tail: the key's last
 * command, src/keys.c).  Returns false, doing nothing, when no decision
 * has a key.
 */
static bool
pr_place_batch(Datum **elems, bool **elnulls, int n, Datum *args, char *nulls)
{
	PrPlace    *p = palloc(sizeof(PrPlace) * Max(n, 1));
	PrPlace    *q;
	text	  **keys;
	int64	   *last;
	bool	   *busy;
	Datum	   *places;
	bool	   *pnulls;
	Datum	   *waits;
	Datum	   *tails;
	int			k = 0;
	int			nk = 0;
	int			i;
	int			dims[1] = {n};
	int			lbs[1] = {1};

	for (i = 0; i < n; i++)
	{
		if (elnulls[PR_KEY_ORDERING_KEY][i])
			continue;
		p[k].key = DatumGetTextPP(elems[PR_KEY_ORDERING_KEY][i]);
		p[k].run = DatumGetTextPP(elems[PR_KEY_RUN_ID][i]);
		p[k].seq = DatumGetInt64(elems[PR_KEY_SEQ][i]);
		p[k].elem = i;
		k++;
	}
	if (k == 0)
	{
		pfree(p);
		return false;
	}

	/* The keys, each once; their locks; their last commands. */
	qsort(p, k, sizeof(PrPlace), pr_cmp_place);
	keys = palloc(sizeof(text *) * k);
	for (i = 0; i < k; i++)
		if (i == 0 || OutboxCompareIds(p[i].key, p[i - 1].key) != 0)
			keys[nk++] = p[i].key;
	/* a key belongs to the role that decides: the caller ($10) */
	OutboxLockKeys(DatumGetObjectId(args[9]), keys, nk);
	last = palloc(sizeof(int64) * nk);
	busy = palloc(sizeof(bool) * nk);
	OutboxKeyTails(DatumGetObjectId(args[9]), keys, nk, last, busy);

	/* Places in batch order within each key. */
	nk = -1;
	for (i = 0; i < k; i++)
	{
		bool		starts = (i == 0 || OutboxCompareIds(p[i].key, p[i - 1].key) != 0);

		if (starts)
		{
			nk++;
			p[i].place = last[nk] + 1;
		}
		else
		{
			p[i].place = p[i - 1].place + 1;
			p[i - 1].alone = false;
		}
		p[i].first = last[nk] + 1;
		p[i].busy = busy[nk];
		/* alone until the next decision turns out to share the key */
		p[i].alone = starts;
	}

	/* Within a key, a run's places go to its decisions in seq order. */
	q = palloc(sizeof(PrPlace) * k);
	memcpy(q, p, sizeof(PrPlace) * k);
	qsort(p, k, sizeof(PrPlace), pr_cmp_place_run);
	qsort(q, k, sizeof(PrPlace), pr_cmp_place_seq);
	places = palloc0(sizeof(Datum) * n);
	pnulls = palloc(sizeof(bool) * n);
	waits = palloc(sizeof(Datum) * n);
	tails = palloc(sizeof(Datum) * n);
	for (i = 0; i < n; i++)
	{
		pnulls[i] = true;
		waits[i] = BoolGetDatum(false);
		tails[i] = BoolGetDatum(false);
	}
	for (i = 0; i < k; i++)
	{
		places[q[i].elem] = Int64GetDatum(p[i].place);
		pnulls[q[i].elem] = false;
		waits[q[i].elem] = BoolGetDatum(p[i].busy || p[i].place != p[i].first);
		tails[q[i].elem] = BoolGetDatum(!p[i].busy && p[i].alone);
	}
	args[12] = PointerGetDatum(construct_md_array(places, pnulls, 1, dims, lbs, INT8OID,
												  sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	nulls[12] = ' ';
	args[13] = PointerGetDatum(construct_array(waits, n, BOOLOID, 1, true, TYPALIGN_CHAR));
	nulls[13] = ' ';
	args[14] = PointerGetDatum(construct_array(tails, n, BOOLOID, 1, true, TYPALIGN_CHAR));
	nulls[14] = ' ';
	return true;
}

/*
 * The batch's INSERT of decisions without ordering keys: one statement, the
 * events and the commands of the arrays (PR_KEY_PARAM), $10 the caller.
 */
#define PR_BATCH \
	"WITH u AS (" \
	"  SELECT * FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)," \
	"                            pg_catalog.unnest($3), pg_catalog.unnest($4)," \
	"                            pg_catalog.unnest($5), pg_catalog.unnest($6)," \
	"                            pg_catalog.unnest($7), pg_catalog.unnest($8)," \
	"                            pg_catalog.unnest($9), pg_catalog.unnest($11))" \
	"    AS u(run_id, seq, event_kind, command_id, command_kind, payload," \
	"         event_payload, not_before, priority, headers))," \
	" e AS (" \
	"  INSERT INTO outbox.events (run_id, seq, kind, payload, command_id)" \
	"  SELECT run_id, seq, event_kind, event_payload, command_id FROM u)" \
	"INSERT INTO outbox.commands" \
	"  (command_id, run_id, seq, kind, payload, priority," \
	"   available_at, due_at, decided_by, headers)" \
	"SELECT command_id, run_id, seq, command_kind, payload," \
	"       COALESCE(priority, 0)," \
	"       COALESCE(not_before, pg_catalog.now())," \
	"       COALESCE(not_before, pg_catalog.now()), $10, headers" \
	"  FROM u"

/*
 * One key of a batch's n decisions as an array of type, for the set-based
 * statement (a parameter of PR_KEY_PARAM's order).
 */
static Datum
pr_column_array(Datum *elems, bool *elnulls, int n, Oid type)
{
	int16		typlen;
	bool		typbyval;
	char		typalign;
	int			dims[1] = {n};
	int			lbs[1] = {1};

	get_typlenbyvalalign(type, &typlen, &typbyval, &typalign);
	return PointerGetDatum(construct_md_array(elems, elnulls, 1, dims, lbs,
											  type, typlen, typbyval, typalign));
}

/*
 * The parameters of decision i of a batch (the arrays of
 * pr_commit_decisions) in the single decision's order (PR_KEY_PARAM).
 */
static void
pr_elem_args(Datum **elems, bool **elnulls, int i, Datum *args, char *nulls)
{
	int			j;

	for (j = 0; j < PR_NKEYS; j++)
	{
		args[PR_KEY_PARAM(j)] = elems[j][i];
		nulls[PR_KEY_PARAM(j)] = elnulls[j][i] ? 'n' : ' ';
	}
}

/*
 * In the PG_CATCH of a batch's subtransaction: roll it back and go back to
 * cxt and owner; a unique violation of the extension's keys (a decision
 * taken already, or a retry) is forgotten, so that the caller falls back
 * to the decision-by-decision check; any other error is raised again.
 */
static void
pr_batch_caught(MemoryContext cxt, ResourceOwner owner)
{
	ErrorData  *edata;
	const char *con;

	MemoryContextSwitchTo(cxt);
	edata = CopyErrorData();
	FlushErrorState();
	RollbackAndReleaseCurrentSubTransaction();
	MemoryContextSwitchTo(cxt);
	CurrentResourceOwner = owner;
	con = edata->constraint_name;
	if (edata->sqlerrcode != ERRCODE_UNIQUE_VIOLATION || con == NULL ||
		edata->schema_name == NULL || strcmp(edata->schema_name, "outbox") != 0 ||
		(strcmp(con, "events_pkey") != 0 && strcmp(con, "commands_pkey") != 0 &&
		 strcmp(con, "events_command_id_key") != 0))
		ReThrowError(edata);
	FreeErrorData(edata);
}

/*
 * The common batch, in a subtransaction: no kind of the policies has
 * deciders, no decision has an ordering key, and no command id of the batch
 * is stored yet.  PR_BATCH runs at once, without the diagnosis, which is
 * needed only when the insert meets a stored key: then its unique violation
 * of the extension's keys rolls the subtransaction back (nothing of the call
 * stays) and this returns false for the diagnosis and the insert of the
 * decisions that are not retries, which see exactly what they saw before
 * this attempt.  Any other error is re-raised as it came.  Only the one
 * subtransaction per call: its transaction id is the only extra write.
 */
static bool
pr_try_batch(Datum *args, const char *nulls, uint64 rows, const Oid *argtypes)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	volatile bool inserted = false;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		int			ret = OutboxExecute(OutboxPrepare(&plan_batch, PR_BATCH, 11, argtypes),
										args, nulls, false, 0);

		if (ret != SPI_OK_INSERT || SPI_processed != rows)
			elog(ERROR, "outbox: insert of decisions failed: %s",
				 SPI_result_code_string(ret));
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
		inserted = true;
	}
	PG_CATCH();
	{
		pr_batch_caught(cxt, owner);
	}
	PG_END_TRY();
	return inserted;
}

/*
 * Write the n decisions of a batch (the arrays of pr_commit_decisions) as
 * COPY does: the rows of each table formed in slots of their own (over a
 * copy of the table's descriptor, which they need not pin), one
 * table_multi_insert per table (commands, then events: fewer page locks
 * and WAL records than a heap insert per row), then each row's index
 * entries, whose unique checks raise a taken key's 23505 as the
 * statements' insert does (pr_try_batch_direct catches it).
 */
static void
pr_direct_batch(PrDirect *d, Datum **elems, bool **elnulls, int n, Oid caller)
{
	TupleTableSlot **cs = palloc(sizeof(TupleTableSlot *) * n);
	TupleTableSlot **es = palloc(sizeof(TupleTableSlot *) * n);
	TupleDesc	cdesc = CreateTupleDescCopy(RelationGetDescr(d->commands));
	TupleDesc	edesc = CreateTupleDescCopy(RelationGetDescr(d->events));
	const TupleTableSlotOps *cops = table_slot_callbacks(d->commands);
	const TupleTableSlotOps *eops = table_slot_callbacks(d->events);
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	Datum		pending = CStringGetTextDatum("pending");
	int			i;

	for (i = 0; i < n; i++)
	{
		Datum		args[PR_NKEYS + 1];
		char		nulls[PR_NKEYS + 1];

		pr_elem_args(elems, elnulls, i, args, nulls);
		if (elnulls[PR_KEY_PRIORITY][i])
			args[PR_KEY_PARAM(PR_KEY_PRIORITY)] = Int32GetDatum(0);
		args[9] = ObjectIdGetDatum(caller);
		cs[i] = MakeSingleTupleTableSlot(cdesc, cops);
		es[i] = MakeSingleTupleTableSlot(edesc, eops);
		pr_direct_fill(cs[i], es[i], args, nulls, now, pending);
		pr_direct_ready(d->commands, cs[i]);
		pr_direct_ready(d->events, es[i]);
	}
	table_multi_insert(d->commands, cs, n, d->estate->es_output_cid, 0, NULL);
	for (i = 0; i < n; i++)
		pr_direct_index(d, d->crri, cs[i]);
	table_multi_insert(d->events, es, n, d->estate->es_output_cid, 0, NULL);
	for (i = 0; i < n; i++)
		pr_direct_index(d, d->erri, es[i]);
	for (i = 0; i < n; i++)
	{
		ExecDropSingleTupleTableSlot(cs[i]);
		ExecDropSingleTupleTableSlot(es[i]);
	}
	pfree(cs);
	pfree(es);
	FreeTupleDesc(cdesc);
	FreeTupleDesc(edesc);
}

/*
 * The common batch written without SQL (pr_direct_open), in a
 * subtransaction as pr_try_batch: each decision's command and then its
 * event.  Returns 1 when all are inserted, 0 when a unique violation of
 * the extension's keys rolled the subtransaction back (the caller then
 * diagnoses, as after pr_try_batch), and -1, having written nothing, when
 * the call must take the statements (pr_direct_open said no).  Any other
 * error is re-raised as it came.
 */
static int
pr_try_batch_direct(Datum **elems, bool **elnulls, int n, Oid caller)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	volatile int result = 1;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		PrDirect	d;

		if (pr_direct_open(&d))
		{
			pr_direct_batch(&d, elems, elnulls, n, caller);
			pr_direct_close(&d);
		}
		else
			result = -1;
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		pr_batch_caught(cxt, owner);
		result = 0;
	}
	PG_END_TRY();
	return result;
}

/*
 * A batch of decisions of kinds with a stream (the arrays of
 * pr_commit_decisions) by the stream writer, in a subtransaction as
 * pr_try_batch_direct: every event (one table_multi_insert, then each
 * one's index entries, whose unique checks raise a taken key's 23505),
 * then every log row in the batch's order.  Returns 1 when all are
 * written, 0 when a unique violation of the extension's keys rolled the
 * subtransaction back (the caller then diagnoses), and -1, having written
 * nothing, when the call must take the statements.  Any other error is
 * re-raised as it came.
 */
static int
pr_try_stream_batch_direct(Datum **elems, bool **elnulls, int n, Oid caller)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	volatile int result = 1;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		PrStream	s;
		PrDirect	d;
		TimestampTz now = GetCurrentTransactionStartTimestamp();
		TupleTableSlot **ls = NULL;
		TupleTableSlot **es = NULL;
		TupleDesc	ldesc = NULL;
		TupleDesc	edesc = NULL;
		int32	   *stream_ids = palloc(sizeof(int32) * n);
		int32	   *partitions = palloc(sizeof(int32) * n);
		int			i;

		if (!pr_stream_open(&s))
			result = -1;
		for (i = 0; i < n && result > 0; i++)
		{
			if (!pr_stream_of(&s, DatumGetTextPP(elems[PR_KEY_COMMAND_KIND][i])))
			{
				pr_stream_abandon(&s);
				result = -1;
				break;
			}
			stream_ids[i] = s.stream_id;
			partitions[i] = s.partitions;
		}
		if (result > 0)
		{
			const TupleTableSlotOps *lops;
			const TupleTableSlotOps *eops;

			pr_stream_start(&s, &d);
			ls = palloc(sizeof(TupleTableSlot *) * n);
			es = palloc(sizeof(TupleTableSlot *) * n);
			ldesc = CreateTupleDescCopy(RelationGetDescr(d.commands));
			edesc = CreateTupleDescCopy(RelationGetDescr(d.events));
			lops = table_slot_callbacks(d.commands);
			eops = table_slot_callbacks(d.events);
			for (i = 0; i < n; i++)
			{
				Datum		args[PR_NKEYS + 1];
				char		nulls[PR_NKEYS + 1];

				pr_elem_args(elems, elnulls, i, args, nulls);
				es[i] = MakeSingleTupleTableSlot(edesc, eops);
				pr_direct_fill_event(es[i], args, nulls, now);
				pr_direct_ready(d.events, es[i]);
			}
			table_multi_insert(d.events, es, n, d.estate->es_output_cid, 0, NULL);
			for (i = 0; i < n; i++)
				pr_direct_index(&d, d.erri, es[i]);
			for (i = 0; i < n; i++)
			{
				Datum		args[PR_NKEYS + 1];
				char		nulls[PR_NKEYS + 1];

				pr_elem_args(elems, elnulls, i, args, nulls);
				args[9] = ObjectIdGetDatum(caller);
				nulls[9] = ' ';
				s.stream_id = stream_ids[i];
				s.partitions = partitions[i];
				ls[i] = MakeSingleTupleTableSlot(ldesc, lops);
				pr_stream_fill(&s, ls[i], args, nulls, now);
				pr_direct_ready(d.commands, ls[i]);
			}
			table_multi_insert(d.commands, ls, n, d.estate->es_output_cid, 0, NULL);
			for (i = 0; i < n; i++)
				pr_direct_index(&d, d.crri, ls[i]);
			for (i = 0; i < n; i++)
			{
				ExecDropSingleTupleTableSlot(ls[i]);
				ExecDropSingleTupleTableSlot(es[i]);
			}
			pr_direct_close(&d);
			FreeTupleDesc(ldesc);
			FreeTupleDesc(edesc);
		}
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		pr_batch_caught(cxt, owner);
		result = 0;
	}
	PG_END_TRY();
	return result;
}

/*
 * commit_decisions on a distributed outbox: each decision as
 * commit_decision makes it there (pr_decide_routed), so that each goes to
 * its run's node; a batch of several runs writes several nodes, and Citus
 * commits it with two-phase commit.  Marks the retries in retry[] and
 * returns their count; raises as the batch does for a forbidden kind or a
 * conflict (nothing of the call is recorded then: the error aborts it).
 */
static int
pr_decide_each(Datum **elems, bool **elnulls, int n, Oid caller, bool *retry)
{
	int			i;
	int			m = 0;

	for (i = 0; i < n; i++)
	{
		Datum		args[PR_NKEYS + 1];
		char		nulls[PR_NKEYS + 1];
		PrWhat		what;

		pr_elem_args(elems, elnulls, i, args, nulls);
		if (elnulls[PR_KEY_PRIORITY][i])
		{
			args[PR_KEY_PARAM(PR_KEY_PRIORITY)] = Int32GetDatum(0);
			nulls[PR_KEY_PARAM(PR_KEY_PRIORITY)] = ' ';
		}
		args[9] = ObjectIdGetDatum(caller);
		nulls[9] = ' ';
		what.run_id = DatumGetTextPP(args[0]);
		what.seq = DatumGetInt64(args[1]);
		what.command_id = DatumGetTextPP(args[3]);
		what.rows = 1;
		if (!pr_decide_routed(args, nulls, &what))
		{
			pr_why_not(args, nulls, i + 1);
			retry[i] = true;
			m++;
		}
	}
	return m;
}

/*
 * outbox.commit_decisions(decisions jsonb) RETURNS SETOF decision_result
 *
 * The set-based form: a JSON array of decisions, recorded in one statement,
 * all or none.  One row per decision, in order: recorded, or false for the
 * caller's own retry of a recorded decision.
 */
static Datum
pr_commit_decisions(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid argtypes[15] = {TEXTARRAYOID, INT8ARRAYOID, TEXTARRAYOID,
		TEXTARRAYOID, TEXTARRAYOID, JSONBARRAYOID, JSONBARRAYOID,
		TIMESTAMPTZARRAYOID, INT4ARRAYOID, OIDOID, JSONBARRAYOID, TEXTARRAYOID,
	INT8ARRAYOID, BOOLARRAYOID, BOOLARRAYOID};
	static const Oid elemtypes[PR_NKEYS] = {TEXTOID, INT8OID, TEXTOID, TEXTOID, TEXTOID,
	JSONBOID, JSONBOID, TIMESTAMPTZOID, INT4OID, JSONBOID, TEXTOID};
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Jsonb	   *doc;
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	Datum	   *elems[PR_NKEYS];
	bool	   *elnulls[PR_NKEYS];
	bool	   *retry;
	Datum	   *ids;
	Datum		args[15];
	char		nulls[15];
	int			n;
	int			m;
	int			i;
	int			j;
	PrWhat		what;
	bool		stream_batch;
	bool		common;
	int			direct;

	OutboxArgNotNull(fcinfo, 0, "decisions");
	doc = PG_GETARG_JSONB_P(0);
	if (!JB_ROOT_IS_ARRAY(doc) || JB_ROOT_IS_SCALAR(doc))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("decisions must be a JSON array of decisions"),
				 errdetail("Each decision is a JSON object or a JSON array of its values.")));
	n = JB_ROOT_COUNT(doc);

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (n == 0)
		return (Datum) 0;
	if (n > outbox_max_batch)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("too many decisions in one call"),
				 errdetail("The call has %d decisions; outbox.max_batch is %d.",
						   n, outbox_max_batch)));

	for (j = 0; j < PR_NKEYS; j++)
	{
		elems[j] = palloc(sizeof(Datum) * n);
		elnulls[j] = palloc(sizeof(bool) * n);
	}
	retry = palloc0(sizeof(bool) * n);
	it = JsonbIteratorInit(&doc->root);
	tok = JsonbIteratorNext(&it, &v, true);
	Assert(tok == WJB_BEGIN_ARRAY);
	i = 0;
	while ((tok = JsonbIteratorNext(&it, &v, true)) == WJB_ELEM)
	{
		Datum		values[PR_NKEYS];
		bool		isnull[PR_NKEYS];

		pr_read_decision(i + 1, &v, values, isnull);
		for (j = 0; j < PR_NKEYS; j++)
		{
			elems[j][i] = values[j];
			elnulls[j][i] = isnull[j];
		}
		for (j = PR_KEY_RUN_ID; j <= PR_KEY_PAYLOAD; j++)
			if (isnull[j])
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("%s of decision %d must not be null", pr_keys[j], i + 1)));
		OutboxCheckId(DatumGetTextPP(values[PR_KEY_RUN_ID]), "run_id");
		pr_check_seq(DatumGetInt64(values[PR_KEY_SEQ]));
		OutboxCheckId(DatumGetTextPP(values[PR_KEY_EVENT_KIND]), "event_kind");
		OutboxCheckId(DatumGetTextPP(values[PR_KEY_COMMAND_ID]), "command_id");
		OutboxCheckId(DatumGetTextPP(values[PR_KEY_COMMAND_KIND]), "command_kind");
		OutboxCheckPayload(DatumGetJsonbP(values[PR_KEY_PAYLOAD]), "payload");
		if (!isnull[PR_KEY_EVENT_PAYLOAD])
			OutboxCheckPayload(DatumGetJsonbP(values[PR_KEY_EVENT_PAYLOAD]), "event_payload");
		if (!isnull[PR_KEY_NOT_BEFORE])
			pr_check_not_before(DatumGetTimestampTz(values[PR_KEY_NOT_BEFORE]));
		if (!isnull[PR_KEY_ORDERING_KEY])
			OutboxCheckKey(DatumGetTextPP(values[PR_KEY_ORDERING_KEY]), i + 1);
		i++;
	}
	Assert(i == n);

	pr_check_repeats(elems[PR_KEY_RUN_ID], elems[PR_KEY_SEQ], elems[PR_KEY_COMMAND_ID], n);
	/* the command ids in batch order, for the result (elems may be compacted) */
	ids = palloc(sizeof(Datum) * n);
	memcpy(ids, elems[PR_KEY_COMMAND_ID], sizeof(Datum) * n);

	/* A kind ordered by run: the decisions without a key get their run_id. */
	SPI_connect();
	if (OutboxOrderedByRun(NULL))
		for (i = 0; i < n; i++)
			if (elnulls[PR_KEY_ORDERING_KEY][i] &&
				OutboxOrderedByRun(DatumGetTextPP(elems[PR_KEY_COMMAND_KIND][i])))
			{
				elems[PR_KEY_ORDERING_KEY][i] = elems[PR_KEY_RUN_ID][i];
				elnulls[PR_KEY_ORDERING_KEY][i] = false;
			}

	/*
	 * Kinds with a stream (src/stream.c): the same two statements, a
	 * diagnosis and one INSERT of them all, on the stream log; a batch does
	 * not mix them with other kinds.
	 */
	stream_batch = false;
	if (OutboxStreamKind(NULL))
	{
		int			ns = 0;

		for (i = 0; i < n; i++)
			if (OutboxStreamKind(DatumGetTextPP(elems[PR_KEY_COMMAND_KIND][i])))
			{
				OutboxStreamCheckDecision(DatumGetTextPP(elems[PR_KEY_COMMAND_ID][i]),
										  !elnulls[PR_KEY_NOT_BEFORE][i], i + 1);
				ns++;
			}
		if (ns > 0 && ns < n)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("a batch of decisions must not mix kinds written to a stream with other kinds"),
					 errhint("Decide them in two calls of commit_decisions.")));
		stream_batch = (ns > 0);
	}

	/*
	 * A batch of kinds with a stream, while no kind has deciders: written
	 * without SQL when it can be (pr_try_stream_batch_direct), else by the
	 * diagnosis and the insert below.
	 */
	if (stream_batch && !OutboxAnyDeciders() &&
		pr_try_stream_batch_direct(elems, elnulls, n, caller) > 0)
	{
		SPI_finish();
		m = 0;
		goto done;
	}

	/* a distributed outbox: one routed decision at a time */
	if (!stream_batch && OutboxCitusDistributed())
	{
		for (i = 0; i < n; i++)
			if (!elnulls[PR_KEY_ORDERING_KEY][i])
				pr_raise_keyed_distributed(DatumGetTextPP(elems[PR_KEY_COMMAND_ID][i]), i + 1);
		m = pr_decide_each(elems, elnulls, n, caller, retry);
		SPI_finish();
		goto done;
	}

	/*
	 * The common batch: no stream, no kind with deciders, no ordering key.
	 * Written without SQL when it can be (pr_try_batch_direct), else
	 * inserted at once by pr_try_batch below.
	 */
	common = false;
	direct = -1;
	if (!stream_batch && !OutboxAnyDeciders())
	{
		for (i = 0; i < n; i++)
			if (!elnulls[PR_KEY_ORDERING_KEY][i])
				break;
		common = (i == n);
	}
	if (common)
	{
		direct = pr_try_batch_direct(elems, elnulls, n, caller);
		if (direct > 0)
		{
			SPI_finish();
			m = 0;
			goto done;
		}
	}

	for (j = 0; j < PR_NKEYS; j++)
	{
		args[PR_KEY_PARAM(j)] = pr_column_array(elems[j], elnulls[j], n, elemtypes[j]);
		nulls[PR_KEY_PARAM(j)] = ' ';
	}
	args[9] = ObjectIdGetDatum(caller);
	nulls[9] = ' ';

	/* The common batch, not written directly: inserted at once (pr_try_batch). */
	if (common && direct < 0 && pr_try_batch(args, nulls, n, argtypes))
	{
		SPI_finish();
		m = 0;
		goto done;
	}

	/*
	 * Before inserting: the first decision of a kind the caller may not
	 * decide, and every decision whose command id is stored, with whether
	 * it is the caller's own retry (in batch order).  Each table is read by
	 * the batch's keys and hash-joined to the elements (as the batch ack's
	 * diagnosis, OutboxExecuteHashJoin), whatever its statistics said when
	 * the plan was made; not read-only, so that it sees what an earlier
	 * call in the same statement recorded.
	 */
	if (OutboxExecuteHashJoin(stream_batch ? OutboxStreamBatchWhyPlan() :
							  OutboxPrepare(&plan_batch_why,
									"WITH u AS ("
									"  SELECT * FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2),"
									"                            pg_catalog.unnest($3), pg_catalog.unnest($4),"
									"                            pg_catalog.unnest($5), pg_catalog.unnest($6))"
									"    WITH ORDINALITY AS u(run_id, seq, event_kind, command_id, command_kind,"
									"                         payload, ord))"
									"SELECT * FROM ("
									" SELECT u.ord, true AS forbidden, false AS same FROM u"
									"  WHERE u.command_kind IN (SELECT p.kind FROM outbox.policies p"
									"                 WHERE p.kind OPERATOR(pg_catalog.=) ANY ($5)"
									"                   AND p.deciders IS NOT NULL"
									"                   AND NOT outbox._may(p.deciders, $10))"
									"  ORDER BY u.ord LIMIT 1) f "
									"UNION ALL "
									"SELECT * FROM ("
									" SELECT u.ord, false, "
									PR_SAME_DECISION("u.run_id", "u.seq", "u.event_kind", "u.command_kind", "u.payload", "$10")
									"   FROM u JOIN outbox.commands c"
									"     ON c.command_id OPERATOR(pg_catalog.=) u.command_id"
									"    AND c.command_id OPERATOR(pg_catalog.=) ANY ($4)"
									"  ORDER BY u.ord) s",
									11, argtypes),
					  args, nulls, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox: diagnosis of a batch of decisions failed");
	m = 0;
	for (j = 0; j < 2; j++)
		for (i = 0; i < (int) SPI_processed; i++)
		{
			HeapTuple	row = SPI_tuptable->vals[i];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			bool		isnull;
			int			ord = (int) DatumGetInt64(SPI_getbinval(row, desc, 1, &isnull));
			bool		forbidden = DatumGetBool(SPI_getbinval(row, desc, 2, &isnull));

			/* first pass: a forbidden kind; second: conflicts and retries */
			if (j == 0 && forbidden)
				pr_raise_forbidden(text_to_cstring(DatumGetTextPP(elems[PR_KEY_COMMAND_KIND][ord - 1])), ord);
			if (j == 0 || forbidden)
				continue;
			if (!DatumGetBool(SPI_getbinval(row, desc, 3, &isnull)))
				pr_raise_conflict(text_to_cstring(DatumGetTextPP(elems[PR_KEY_COMMAND_ID][ord - 1])), ord);
			retry[ord - 1] = true;
			m++;
		}

	/* Insert the decisions that are not retries. */
	if (m < n)
	{
		if (m > 0)
		{
			for (j = 0; j < PR_NKEYS; j++)
			{
				int			k = 0;

				for (i = 0; i < n; i++)
					if (!retry[i])
					{
						elems[j][k] = elems[j][i];
						elnulls[j][k] = elnulls[j][i];
						k++;
					}
				args[PR_KEY_PARAM(j)] = pr_column_array(elems[j], elnulls[j], k, elemtypes[j]);
			}
		}
		what.run_id = NULL;
		what.seq = 0;
		what.command_id = NULL;
		what.rows = n - m;
		if (stream_batch)
			pr_insert(OutboxStreamBatchPlan(), args, nulls, &what, false);
		else if (!pr_place_batch(elems, elnulls, n - m, args, nulls))
			pr_insert(OutboxPrepare(&plan_batch, PR_BATCH, 11, argtypes),
					  args, nulls, &what, false);
		else
			pr_insert(OutboxPrepare(&plan_batch_keyed,
									"WITH u AS ("
									"  SELECT * FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2),"
									"                            pg_catalog.unnest($3), pg_catalog.unnest($4),"
									"                            pg_catalog.unnest($5), pg_catalog.unnest($6),"
									"                            pg_catalog.unnest($7), pg_catalog.unnest($8),"
									"                            pg_catalog.unnest($9), pg_catalog.unnest($11),"
									"                            pg_catalog.unnest($12), pg_catalog.unnest($13),"
									"                            pg_catalog.unnest($14), pg_catalog.unnest($15))"
									"    AS u(run_id, seq, event_kind, command_id, command_kind, payload,"
									"         event_payload, not_before, priority, headers,"
									"         ordering_key, ordering_seq, waiting, tail)),"
									" e AS ("
									"  INSERT INTO outbox.events (run_id, seq, kind, payload, command_id)"
									"  SELECT run_id, seq, event_kind, event_payload, command_id FROM u)"
									"INSERT INTO outbox.commands"
									"  (command_id, run_id, seq, kind, payload, priority,"
									"   available_at, due_at, decided_by, headers, ordering_key, ordering_seq,"
									"   ordering_tail)"
									"SELECT command_id, run_id, seq, command_kind, payload,"
									"       COALESCE(priority, 0),"
									"       COALESCE(not_before, pg_catalog.now()),"
									"       CASE WHEN waiting THEN NULL ELSE COALESCE(not_before, pg_catalog.now()) END,"
									"       $10, headers, ordering_key, ordering_seq, CASE WHEN tail THEN true END"
									"  FROM u",
									15, argtypes),
					  args, nulls, &what, false);
	}
	SPI_finish();

done:
	/* One row per decision, in the batch's order. */
	for (i = 0; i < n; i++)
	{
		Datum		values[3];
		bool		isnull[3] = {false, false, false};

		values[0] = Int32GetDatum(i + 1);
		values[1] = ids[i];
		values[2] = BoolGetDatum(!retry[i]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, isnull);
	}
	if (n > m)
	{
		OutboxCountAtCommit(OBC_ENQUEUED, n - m);
		if (stream_batch)
			OutboxDueAtCommit(OUTBOX_DUE_STREAM);
	}
	return (Datum) 0;
}

/* outbox.commit_decisions: the body, as the owner, told who called. */
Datum
outbox_commit_decisions_1_0(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, pr_commit_decisions);
}
