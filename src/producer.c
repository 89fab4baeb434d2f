/*-------------------------------------------------------------------------
 *
 * producer.c
 *		The producer API: commit_decision, commit_decisions, record_event.
 *
 * Everything runs in the caller's transaction through SPI with saved
 * plans, so an event and the command it decides commit or roll back
 * together with the caller's own writes.  Duplicates are detected with
 * INSERT ... ON CONFLICT DO NOTHING (which also waits for a concurrent
 * inserter of the same key to finish) and reported as 23505 after a
 * diagnostic query that says which key was taken; the error aborts the
 * caller's (sub)transaction, so the event of a rejected decision never
 * survives.
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
static SPIPlanPtr plan_diagnose = NULL;
static SPIPlanPtr plan_batch_events = NULL;
static SPIPlanPtr plan_batch_commands = NULL;

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
 * Raise 23505 naming what made a decision (or event, when command_id is
 * NULL) conflict.  Called after ON CONFLICT DO NOTHING inserted nothing.
 */
static void
pr_raise_duplicate(text *run_id, int64 seq, text *command_id)
{
	static const Oid argtypes[3] = {TEXTOID, INT8OID, TEXTOID};
	Datum		args[3];
	char		nulls[3] = {' ', ' ', ' '};
	bool		isnull;
	bool		event_exists;
	bool		command_exists = false;

	args[0] = PointerGetDatum(run_id);
	args[1] = Int64GetDatum(seq);
	args[2] = command_id ? PointerGetDatum(command_id) : (Datum) 0;
	if (command_id == NULL)
		nulls[2] = 'n';

	if (OutboxExecute(OutboxPrepare(&plan_diagnose,
									   "SELECT EXISTS (SELECT 1 FROM outbox.events"
									   "                WHERE run_id OPERATOR(pg_catalog.=) $1"
									   "                  AND seq OPERATOR(pg_catalog.=) $2),"
									   "       EXISTS (SELECT 1 FROM outbox.commands"
									   "                WHERE command_id OPERATOR(pg_catalog.=) $3)"
									   "    OR EXISTS (SELECT 1 FROM outbox.events"
									   "                WHERE command_id OPERATOR(pg_catalog.=) $3)"
									   "    OR EXISTS (SELECT 1 FROM outbox.purged"
									   "                WHERE command_id OPERATOR(pg_catalog.=) $3)",
									   3, argtypes),
						 args, nulls, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "outbox: duplicate diagnosis failed");
	event_exists = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
											  SPI_tuptable->tupdesc, 1, &isnull));
	if (command_id != NULL)
		command_exists = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
													SPI_tuptable->tupdesc, 2, &isnull));

	if (command_exists)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("command \"%s\" already exists", text_to_cstring(command_id)),
				 errdetail("A command id is decided once; nothing of this decision was recorded.")));
	if (event_exists)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("event %s of run \"%s\" already exists",
						DatumGetCString(DirectFunctionCall1(int8out, Int64GetDatum(seq))),
						text_to_cstring(run_id)),
				 errdetail("Each (run_id, seq) is recorded once; nothing of this call was recorded.")));
	/* A concurrent transaction inserted and then rolled back: still refuse. */
	ereport(ERROR,
			(errcode(ERRCODE_UNIQUE_VIOLATION),
			 errmsg("event %s of run \"%s\" conflicts with a concurrent decision",
					DatumGetCString(DirectFunctionCall1(int8out, Int64GetDatum(seq))),
					text_to_cstring(run_id))));
}

/*
 * outbox.commit_decision(run_id, seq, event_kind, command_id, command_kind,
 *						  payload, event_payload, not_before, priority)
 *
 * Insert the event and the command it decides, in one statement.
 */
Datum
outbox_commit_decision(PG_FUNCTION_ARGS)
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
	int			ret;

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

	SPI_connect();
	ret = OutboxExecute(OutboxPrepare(&plan_decide,
										 "WITH e AS ("
										 "  INSERT INTO outbox.events (run_id, seq, kind, payload, command_id)"
										 "  VALUES ($1, $2, $3, $7, $4)"
										 "  ON CONFLICT DO NOTHING RETURNING 1)"
										 "INSERT INTO outbox.commands"
										 "  (command_id, run_id, seq, kind, payload, priority,"
										 "   available_at, due_at)"
										 "SELECT $4, $1, $2, $5, $6, $9,"
										 "       COALESCE($8, pg_catalog.now()),"
										 "       COALESCE($8, pg_catalog.now())"
										 "  FROM e "
										 "ON CONFLICT DO NOTHING",
										 9, argtypes),
						   args, nulls, false, 0);
	if (ret != SPI_OK_INSERT)
		elog(ERROR, "outbox: commit_decision insert failed: %s",
			 SPI_result_code_string(ret));
	if (SPI_processed != 1)
		pr_raise_duplicate(run_id, seq, command_id);
	SPI_finish();

	OutboxCountAtCommit(OBC_ENQUEUED, 1);
	PG_RETURN_VOID();
}

/* outbox.record_event(run_id, seq, kind, payload): an event deciding nothing. */
Datum
outbox_record_event(PG_FUNCTION_ARGS)
{
	static const Oid argtypes[4] = {TEXTOID, INT8OID, TEXTOID, JSONBOID};
	text	   *run_id = OutboxArgId(fcinfo, 0, "run_id");
	int64		seq;
	text	   *kind;
	Jsonb	   *payload;
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	int			ret;

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

	SPI_connect();
	ret = OutboxExecute(OutboxPrepare(&plan_event,
										 "INSERT INTO outbox.events (run_id, seq, kind, payload)"
										 "VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
										 4, argtypes),
						   args, nulls, false, 0);
	if (ret != SPI_OK_INSERT)
		elog(ERROR, "outbox: record_event insert failed: %s",
			 SPI_result_code_string(ret));
	if (SPI_processed != 1)
		pr_raise_duplicate(run_id, seq, NULL);
	SPI_finish();
	PG_RETURN_VOID();
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

/*
 * Check the result of one step of commit_decisions: (rows inserted, first
 * refused run_id, seq, command_id).  Raise 23505 unless all n went in.
 */
static void
pr_check_batch_result(int ret, int n)
{
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	int64		inserted;

	if (ret != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "outbox: commit_decisions insert failed: %s",
			 SPI_result_code_string(ret));
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	inserted = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
	if (inserted == n)
		return;
	(void) SPI_getbinval(tup, desc, 2, &isnull);
	if (!isnull)
		pr_raise_duplicate(DatumGetTextPP(SPI_getbinval(tup, desc, 2, &isnull)),
						   DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull)),
						   DatumGetTextPP(SPI_getbinval(tup, desc, 4, &isnull)));
	ereport(ERROR,
			(errcode(ERRCODE_UNIQUE_VIOLATION),
			 errmsg("a decision is repeated within the batch"),
			 errdetail("%d of %d decisions were refused; nothing of this call was recorded.",
					   n - (int) inserted, n)));
}

/*
 * outbox.commit_decisions(run_ids, seqs, event_kinds, command_ids,
 *						   command_kinds, payloads, event_payloads,
 *						   not_before, priorities)
 *
 * The set-based form: many decisions in two statements.  Returns the
 * number of decisions recorded, which is all of them or an error.
 */
Datum
outbox_commit_decisions(PG_FUNCTION_ARGS)
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
	int			ret;

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

	SPI_connect();

	/* Events first; report the first decision whose event was refused. */
	ret = OutboxExecute(OutboxPrepare(&plan_batch_events,
										 "WITH u AS ("
										 "  SELECT * FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3),"
										 "                            pg_catalog.unnest($4), pg_catalog.unnest($7))"
										 "    WITH ORDINALITY AS u(run_id, seq, kind, command_id, payload, ord)),"
										 " e AS ("
										 "  INSERT INTO outbox.events (run_id, seq, kind, payload, command_id)"
										 "  SELECT run_id, seq, kind, payload, command_id FROM u"
										 "  ON CONFLICT DO NOTHING RETURNING run_id, seq, command_id)"
										 "SELECT (SELECT pg_catalog.count(*) FROM e), r.* FROM (SELECT) one"
										 "  LEFT JOIN LATERAL (SELECT u.run_id, u.seq, u.command_id FROM u"
										 "   WHERE NOT EXISTS (SELECT 1 FROM e"
										 "                      WHERE e.run_id OPERATOR(pg_catalog.=) u.run_id"
										 "                        AND e.seq OPERATOR(pg_catalog.=) u.seq"
										 "                        AND e.command_id OPERATOR(pg_catalog.=) u.command_id)"
										 "   ORDER BY u.ord LIMIT 1) r ON true",
										 9, argtypes),
						   args, nulls, false, 0);
	pr_check_batch_result(ret, n);

	ret = OutboxExecute(OutboxPrepare(&plan_batch_commands,
										 "WITH u AS ("
										 "  SELECT * FROM ROWS FROM (pg_catalog.unnest($4), pg_catalog.unnest($1), pg_catalog.unnest($2),"
										 "                            pg_catalog.unnest($5), pg_catalog.unnest($6), pg_catalog.unnest($8),"
										 "                            pg_catalog.unnest($9))"
										 "    WITH ORDINALITY AS u(command_id, run_id, seq, kind, payload,"
										 "                         not_before, priority, ord)),"
										 " c AS ("
										 "  INSERT INTO outbox.commands"
										 "    (command_id, run_id, seq, kind, payload, priority,"
										 "     available_at, due_at)"
										 "  SELECT command_id, run_id, seq, kind, payload,"
										 "         COALESCE(priority, 0),"
										 "         COALESCE(not_before, pg_catalog.now()),"
										 "         COALESCE(not_before, pg_catalog.now())"
										 "    FROM u"
										 "  ON CONFLICT DO NOTHING RETURNING command_id)"
										 "SELECT (SELECT pg_catalog.count(*) FROM c), r.* FROM (SELECT) one"
										 "  LEFT JOIN LATERAL (SELECT u.run_id, u.seq, u.command_id FROM u"
										 "   WHERE NOT EXISTS (SELECT 1 FROM c"
										 "                      WHERE c.command_id OPERATOR(pg_catalog.=) u.command_id)"
										 "   ORDER BY u.ord LIMIT 1) r ON true",
										 9, argtypes),
						   args, nulls, false, 0);
	pr_check_batch_result(ret, n);
	SPI_finish();

	OutboxCountAtCommit(OBC_ENQUEUED, n);
	PG_RETURN_INT32(n);
}
