/*-------------------------------------------------------------------------
 *
 * producer.c
 *		The producer API: commit_decision, commit_decisions, record_event.
 *
 * Everything runs in the caller's transaction through SPI with saved
 * plans, so an event and the command it decides commit or roll back
 * together with the caller's own writes.
 *
 * Each call is one plain INSERT statement (the commands, then their events):
 * the unique indexes detect a taken key, waiting for a concurrent inserter
 * of the same key to finish as any insert does, and the unique violation is
 * re-raised as the API's 23505, whose message says what was taken and which
 * keeps the constraint's name (events_pkey: the run's seq; commands_pkey or
 * events_command_id_key: the command id).  No ON CONFLICT clause: its
 * arbiter probes and speculative insertion cost more than a tenth of a
 * decision, for the rare case of a taken key.  The set-based form first
 * checks its elements for repeats among themselves, and names both
 * positions.  Any error aborts the caller's (sub)transaction, so the event
 * of a rejected decision never survives.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_commit_decision);
PG_FUNCTION_INFO_V1(outbox_commit_decisions);
PG_FUNCTION_INFO_V1(outbox_record_event);

static SPIPlanPtr plan_decide = NULL;
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
 * Run a plain INSERT of decisions (or of an event), which must insert
 * w->rows rows.  A unique violation of the extension's keys is re-raised as
 * the API's 23505 (pr_raise_taken).  Nothing touches the database between
 * catching the error and raising the new one, so no subtransaction is
 * needed: the caller's (sub)transaction is aborting either way.
 */
static void
pr_insert(SPIPlanPtr plan, Datum *args, const char *nulls, const PrWhat *w)
{
	MemoryContext cxt = CurrentMemoryContext;

	PG_TRY();
	{
		int			ret = OutboxExecute(plan, args, nulls, false, 0);

		if (ret != SPI_OK_INSERT || SPI_processed != w->rows)
			elog(ERROR, "outbox: insert of decisions failed: %s",
				 SPI_result_code_string(ret));
	}
	PG_CATCH();
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
	PG_END_TRY();
}

/*
 * outbox.commit_decision(run_id, seq, event_kind, command_id, command_kind,
 *						  payload, event_payload, not_before, priority)
 *
 * Insert the event and the command it decides, in one statement.
 */
static Datum
pr_commit_decision(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid argtypes[9] = {TEXTOID, INT8OID, TEXTOID, TEXTOID, TEXTOID,
	JSONBOID, JSONBOID, TIMESTAMPTZOID, INT4OID};
	text	   *run_id = OutboxArgId(fcinfo, 0, "run_id");
	int64		seq;
	text	   *event_kind;
	text	   *command_id;
	text	   *command_kind;
	Jsonb	   *payload;
	Jsonb	   *event_payload;
	Datum		args[9];
	char		nulls[9] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	PrWhat		what;

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

	what.run_id = run_id;
	what.seq = seq;
	what.command_id = command_id;
	what.rows = 1;
	SPI_connect();
	pr_insert(OutboxPrepare(&plan_decide,
							"WITH c AS ("
							"  INSERT INTO outbox.commands"
							"    (command_id, run_id, seq, kind, payload, priority,"
							"     available_at, due_at)"
							"  VALUES ($4, $1, $2, $5, $6, $9,"
							"          COALESCE($8, pg_catalog.now()),"
							"          COALESCE($8, pg_catalog.now()))"
							"  RETURNING 1)"
							"INSERT INTO outbox.events (run_id, seq, kind, payload, command_id)"
							"SELECT $1, $2, $3, $7, $4 FROM c",
							9, argtypes),
			  args, nulls, &what);
	SPI_finish();

	OutboxCountAtCommit(OBC_ENQUEUED, 1);
	PG_RETURN_VOID();
}

/* outbox.commit_decision: the body, as the owner, told who called. */
Datum
outbox_commit_decision(PG_FUNCTION_ARGS)
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
			  args, nulls, &what);
	SPI_finish();
	PG_RETURN_VOID();
}

/* outbox.record_event: the body, as the owner, told who called. */
Datum
outbox_record_event(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, pr_record_event);
}

/*
 * Deconstruct a one-dimensional array argument.  Returns the element count;
 * *elems and *elnulls receive the elements.  A NULL array is an error unless
 * optional (then 0 elements and *elems = NULL).  NULL elements are an error
 * unless nulls_ok.
 */
static int
pr_array_arg(FunctionCallInfo fcinfo, int argno, const char *what,
			 bool optional, bool nulls_ok, Datum **elems, bool **elnulls)
{
	ArrayType  *arr;
	Oid			elemtype;
	int16		typlen;
	bool		typbyval;
	char		typalign;
	int			n;
	int			i;

	*elems = NULL;
	*elnulls = NULL;
	if (PG_ARGISNULL(argno))
	{
		if (optional)
			return -1;
		OutboxArgNotNull(fcinfo, argno, what);
	}
	arr = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s must be a one-dimensional array", what)));
	elemtype = ARR_ELEMTYPE(arr);
	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	deconstruct_array(arr, elemtype, typlen, typbyval, typalign,
					  elems, elnulls, &n);
	if (!nulls_ok)
		for (i = 0; i < n; i++)
			if ((*elnulls)[i])
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("%s must not contain nulls", what),
						 errdetail("Element %d is null.", i + 1)));
	return n;
}

/* Raise 2202E when an array's length differs from the first array's. */
static void
pr_check_len(int n, int expected, const char *what)
{
	if (n >= 0 && n != expected)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s has %d elements, but run_ids has %d", what, n, expected),
				 errdetail("All arrays of a set-based call must have the same length.")));
}

/* One element of a batch, for finding repeats within it. */
typedef struct PrKey
{
	text	   *id;				/* command_id, or run_id with seq */
	int64		seq;
	int			elem;			/* 0-based position in the batch */
} PrKey;

/* qsort comparator of PrKey: id byte by byte (as the "C" keys), seq, position. */
static int
pr_cmp_key(const void *a, const void *b)
{
	const PrKey *x = (const PrKey *) a;
	const PrKey *y = (const PrKey *) b;
	int			c = OutboxCompareIds(x->id, y->id);

	if (c != 0)
		return c;
	if (x->seq != y->seq)
		return x->seq < y->seq ? -1 : 1;
	return x->elem - y->elem;
}

/*
 * Sort n keys and find the repeat placed earliest in the batch: *second is
 * its position and *first that of its earliest twin (0-based).  Returns
 * false when the keys are all distinct.
 */
static bool
pr_find_repeat(PrKey *keys, int n, int *first, int *second)
{
	int			i;
	int			group = 0;
	bool		found = false;

	qsort(keys, n, sizeof(PrKey), pr_cmp_key);
	for (i = 1; i < n; i++)
	{
		PrKey		k = keys[i];

		k.elem = keys[i - 1].elem;
		if (pr_cmp_key(&k, &keys[i - 1]) != 0)
		{
			group = i;
			continue;
		}
		if (!found || keys[i].elem < *second)
		{
			*first = keys[group].elem;
			*second = keys[i].elem;
			found = true;
		}
	}
	return found;
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
		keys[i].id = DatumGetTextPP(command_ids[i]);
		keys[i].seq = 0;
		keys[i].elem = i;
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
		keys[i].id = DatumGetTextPP(run_ids[i]);
		keys[i].seq = DatumGetInt64(seqs[i]);
		keys[i].elem = i;
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

/*
 * outbox.commit_decisions(run_ids, seqs, event_kinds, command_ids,
 *						   command_kinds, payloads, event_payloads,
 *						   not_before, priorities)
 *
 * The set-based form: many decisions in one statement.  Returns the
 * number of decisions recorded, which is all of them or an error.
 */
static Datum
pr_commit_decisions(FunctionCallInfo fcinfo, Oid caller)
{
	static const char *names[9] = {"run_ids", "seqs", "event_kinds", "command_ids",
	"command_kinds", "payloads", "event_payloads", "not_before", "priorities"};
	static const Oid argtypes[9] = {TEXTARRAYOID, INT8ARRAYOID, TEXTARRAYOID,
		TEXTARRAYOID, TEXTARRAYOID, JSONBARRAYOID, JSONBARRAYOID,
	TIMESTAMPTZARRAYOID, INT4ARRAYOID};
	Datum	   *elems[9];
	bool	   *elnulls[9];
	int			counts[9];
	Datum		args[9];
	char		nulls[9];
	int			n;
	int			i;
	PrWhat		what;

	for (i = 0; i < 9; i++)
	{
		bool		optional = (i >= 6);

		counts[i] = pr_array_arg(fcinfo, i, names[i], optional,
								 i == 6 || i == 7, &elems[i], &elnulls[i]);
	}
	n = counts[0];
	for (i = 1; i < 9; i++)
		pr_check_len(counts[i], n, names[i]);
	if (n == 0)
		PG_RETURN_INT32(0);
	if (n > outbox_max_batch)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("too many decisions in one call"),
				 errdetail("The call has %d decisions; outbox.max_batch is %d.",
						   n, outbox_max_batch)));

	for (i = 0; i < n; i++)
	{
		OutboxCheckId(DatumGetTextPP(elems[0][i]), "run_id");
		pr_check_seq(DatumGetInt64(elems[1][i]));
		OutboxCheckId(DatumGetTextPP(elems[2][i]), "event_kind");
		OutboxCheckId(DatumGetTextPP(elems[3][i]), "command_id");
		OutboxCheckId(DatumGetTextPP(elems[4][i]), "command_kind");
		OutboxCheckPayload(DatumGetJsonbP(elems[5][i]), "payload");
		if (counts[6] > 0 && !elnulls[6][i])
			OutboxCheckPayload(DatumGetJsonbP(elems[6][i]), "event_payload");
		if (counts[7] > 0 && !elnulls[7][i])
			pr_check_not_before(DatumGetTimestampTz(elems[7][i]));
	}

	for (i = 0; i < 9; i++)
	{
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
		args[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
	}

	pr_check_repeats(elems[0], elems[1], elems[3], n);

	what.run_id = NULL;
	what.seq = 0;
	what.command_id = NULL;
	what.rows = n;
	SPI_connect();
	pr_insert(OutboxPrepare(&plan_batch,
							"WITH u AS ("
							"  SELECT * FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2),"
							"                            pg_catalog.unnest($3), pg_catalog.unnest($4),"
							"                            pg_catalog.unnest($5), pg_catalog.unnest($6),"
							"                            pg_catalog.unnest($7), pg_catalog.unnest($8),"
							"                            pg_catalog.unnest($9))"
							"    AS u(run_id, seq, event_kind, command_id, command_kind, payload,"
							"         event_payload, not_before, priority)),"
							" e AS ("
							"  INSERT INTO outbox.events (run_id, seq, kind, payload, command_id)"
							"  SELECT run_id, seq, event_kind, event_payload, command_id FROM u)"
							"INSERT INTO outbox.commands"
							"  (command_id, run_id, seq, kind, payload, priority,"
							"   available_at, due_at)"
							"SELECT command_id, run_id, seq, command_kind, payload,"
							"       COALESCE(priority, 0),"
							"       COALESCE(not_before, pg_catalog.now()),"
							"       COALESCE(not_before, pg_catalog.now())"
							"  FROM u",
							9, argtypes),
			  args, nulls, &what);
	SPI_finish();

	OutboxCountAtCommit(OBC_ENQUEUED, n);
	PG_RETURN_INT32(n);
}

/* outbox.commit_decisions: the body, as the owner, told who called. */
Datum
outbox_commit_decisions(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, pr_commit_decisions);
}
