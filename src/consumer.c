/*-------------------------------------------------------------------------
 *
 * consumer.c
 *		The consumer API: completion receipts and the inbox.
 *
 * Both calls address a command by run_id and command_id; a command is
 * known when it is in outbox.commands or in the stream log (a kind with a
 * stream, docs/streams.md), or purged with a tombstone in outbox.purged,
 * under that run.  Anything else is OB002.
 *
 * complete() takes a FOR KEY SHARE lock on the command while it inserts
 * the receipt, so a concurrent purge cannot remove the command in between
 * (a stream command's log table is truncated only by a rotation, whose
 * ACCESS EXCLUSIVE lock waits for the reader's transaction).  A stream
 * command's receipt goes next to it: into stream_receipts_N for a command
 * in stream_log_N (truncated with it, docs/streams.md), into
 * outbox.receipts for a command the rotation kept (stream_kept), as for a
 * command of outbox.commands; the rotation moves a command and its
 * receipt together under that lock, so the statement that finds the
 * command writes the receipt where the rotation will look for it;
 * the receipt is inserted with ON CONFLICT DO NOTHING, so two concurrent
 * completions of one command record one receipt and exactly one of them
 * returns true.  It refuses a kind whose completers (outbox.set_policy) do
 * not admit the caller, in the same statement.
 *
 * inbox_accept() first reads the consumer's registration (outbox.consumers:
 * OB003 for an unregistered name, OB004 when the caller is not a member of
 * the role it is registered to) and whether the command is known, then
 * relies on the inbox primary key: a second accept of the same (consumer,
 * command_id) waits for the first transaction and then returns false if it
 * committed.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/acl.h"
#include "utils/builtins.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_complete_1_0);
PG_FUNCTION_INFO_V1(outbox_inbox_accept_1_0);

static SPIPlanPtr plan_complete_row = NULL;
static SPIPlanPtr plan_complete = NULL;
static SPIPlanPtr plan_receipt = NULL;
static SPIPlanPtr plan_consumer = NULL;
static SPIPlanPtr plan_inbox = NULL;

/* Raise OB002 for a command that is neither stored nor purged under run_id. */
static void
co_raise_unknown(text *run_id, text *command_id)
{
	ereport(ERROR,
			(errcode(ERRCODE_OUTBOX_UNKNOWN_COMMAND),
			 errmsg("unknown_command: command \"%s\" of run \"%s\" does not exist",
					text_to_cstring(command_id), text_to_cstring(run_id)),
			 errdetail("No command of that run has this id, and none was purged.")));
}

/* Raise 42501 for a kind whose completers do not admit the caller. */
static void
co_raise_forbidden(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied to complete this command"),
			 errhint("The kind's completers (outbox.set_policy) do not include a role of yours.")));
}

/*
 * outbox.complete(run_id, command_id, outcome, detail): record the receipt.
 * True the first time; false on a repeat with the same outcome (also after
 * the command was purged); an error for an unknown command (OB002), a kind
 * the caller may not complete (42501) or a repeat with another outcome
 * (23505).
 */
static Datum
co_complete(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid argtypes[5] = {TEXTOID, TEXTOID, JSONBOID, TEXTOID, OIDOID};
	text	   *run_id = OutboxArgId(fcinfo, 0, "run_id");
	text	   *command_id = OutboxArgId(fcinfo, 1, "command_id");
	text	   *outcome = OutboxArgId(fcinfo, 2, "outcome");
	Jsonb	   *detail = OutboxArgPayload(fcinfo, 3, "detail", true);
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};
	bool		isnull;
	bool		exists;
	bool		allowed;
	bool		inserted;
	char	   *prior;
	char	   *wanted;

	args[0] = PointerGetDatum(command_id);
	args[1] = PointerGetDatum(outcome);
	args[2] = detail ? PointerGetDatum(detail) : (Datum) 0;
	if (detail == NULL)
		nulls[2] = 'n';
	args[3] = PointerGetDatum(run_id);
	args[4] = ObjectIdGetDatum(caller);

	SPI_connect();

	/*
	 * A command of outbox.commands first, by a statement that reads and
	 * writes that table's side only; then, for any other (a stream's
	 * command, or none), the statement that looks in the stream's tables
	 * too and writes the receipt where its command is.  A command decided
	 * in between is found by the second, whose snapshot is later.
	 */
	if (OutboxExecute(OutboxPrepare(&plan_complete_row,
									"WITH r AS ("
									"  SELECT command_id, kind FROM outbox.commands"
									"   WHERE command_id OPERATOR(pg_catalog.=) $1"
									"     AND run_id OPERATOR(pg_catalog.=) $4 FOR KEY SHARE),"
									" ok AS ("
									"  SELECT r.command_id FROM r"
									"   WHERE NOT EXISTS (SELECT 1 FROM outbox.policies p"
									"                      WHERE p.kind OPERATOR(pg_catalog.=) r.kind"
									"                        AND p.completers IS NOT NULL"
									"                        AND NOT outbox._may(p.completers, $5))),"
									" i AS ("
									"  INSERT INTO outbox.receipts (command_id, outcome, detail, run_id)"
									"  SELECT command_id, $2, $3, $4 FROM ok"
									"  ON CONFLICT DO NOTHING RETURNING 1)"
									"SELECT EXISTS (SELECT 1 FROM r), EXISTS (SELECT 1 FROM ok),"
									"       EXISTS (SELECT 1 FROM i)",
									5, argtypes),
					  args, nulls, false, 0) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "outbox: complete failed");
	exists = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (!exists &&
		(OutboxExecute(OutboxPrepare(&plan_complete,
									"WITH r AS ("
									"  SELECT command_id, kind FROM outbox.commands"
									"   WHERE command_id OPERATOR(pg_catalog.=) $1"
									"     AND run_id OPERATOR(pg_catalog.=) $4 FOR KEY SHARE),"
									" c AS ("
									"  SELECT r.command_id, r.kind, -1 AS t FROM r"
									"  UNION ALL"
									"  (SELECT l.command_id, l.kind, l.t FROM ("
									"     SELECT command_id, run_id, kind, 0 AS t FROM outbox.stream_log_0"
									"     UNION ALL SELECT command_id, run_id, kind, 1 FROM outbox.stream_log_1"
									"     UNION ALL SELECT command_id, run_id, kind, 2 FROM outbox.stream_log_2"
									"     UNION ALL SELECT command_id, run_id, kind, 3 FROM outbox.stream_kept) l"
									"    WHERE l.command_id OPERATOR(pg_catalog.=) $1"
									"      AND l.run_id OPERATOR(pg_catalog.=) $4 LIMIT 1)),"
									" ok AS ("
									"  SELECT c.command_id, c.t FROM c"
									"   WHERE NOT EXISTS (SELECT 1 FROM outbox.policies p"
									"                      WHERE p.kind OPERATOR(pg_catalog.=) c.kind"
									"                        AND p.completers IS NOT NULL"
									"                        AND NOT outbox._may(p.completers, $5))),"
									" i AS ("
									"  INSERT INTO outbox.receipts (command_id, outcome, detail, run_id)"
									"  SELECT command_id, $2, $3, $4 FROM ok"
									"   WHERE ok.t OPERATOR(pg_catalog.=) -1 OR ok.t OPERATOR(pg_catalog.=) 3"
									"  ON CONFLICT DO NOTHING RETURNING 1),"
									" i0 AS ("
									"  INSERT INTO outbox.stream_receipts_0 (command_id, outcome, detail, run_id)"
									"  SELECT command_id, $2, $3, $4 FROM ok WHERE ok.t OPERATOR(pg_catalog.=) 0"
									"  ON CONFLICT DO NOTHING RETURNING 1),"
									" i1 AS ("
									"  INSERT INTO outbox.stream_receipts_1 (command_id, outcome, detail, run_id)"
									"  SELECT command_id, $2, $3, $4 FROM ok WHERE ok.t OPERATOR(pg_catalog.=) 1"
									"  ON CONFLICT DO NOTHING RETURNING 1),"
									" i2 AS ("
									"  INSERT INTO outbox.stream_receipts_2 (command_id, outcome, detail, run_id)"
									"  SELECT command_id, $2, $3, $4 FROM ok WHERE ok.t OPERATOR(pg_catalog.=) 2"
									"  ON CONFLICT DO NOTHING RETURNING 1)"
									"SELECT EXISTS (SELECT 1 FROM c), EXISTS (SELECT 1 FROM ok),"
									"       EXISTS (SELECT 1 FROM i) OR EXISTS (SELECT 1 FROM i0)"
									"       OR EXISTS (SELECT 1 FROM i1) OR EXISTS (SELECT 1 FROM i2)",
									5, argtypes),
					   args, nulls, false, 0) != SPI_OK_SELECT || SPI_processed != 1))
		elog(ERROR, "outbox: complete failed");
	exists = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	allowed = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	inserted = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &isnull));
	if (inserted)
	{
		SPI_finish();
		PG_RETURN_BOOL(true);
	}
	if (exists && !allowed)
		co_raise_forbidden();

	/*
	 * Not inserted: an earlier receipt of the stored command, or the
	 * outcome kept in the tombstone of a purged one (whose kind's
	 * completers are checked here).
	 */
	if (OutboxExecute(OutboxPrepare(&plan_receipt,
									"SELECT x.outcome, x.forbidden FROM ("
									" SELECT r.outcome, false AS forbidden, 1 AS o"
									"   FROM outbox.receipts r JOIN outbox.commands c"
									"     ON c.command_id OPERATOR(pg_catalog.=) r.command_id"
									"  WHERE r.command_id OPERATOR(pg_catalog.=) $1"
									"    AND c.run_id OPERATOR(pg_catalog.=) $4"
									" UNION ALL "
									" SELECT r.outcome, false, 1"
									"   FROM (SELECT s.command_id, s.run_id, s.outcome FROM outbox.receipts s"
									"         UNION ALL"
									"         SELECT s.command_id, s.run_id, s.outcome FROM outbox._stream_receipts s) r"
									"  WHERE r.command_id OPERATOR(pg_catalog.=) $1"
									"    AND r.run_id OPERATOR(pg_catalog.=) $4"
									"    AND EXISTS (SELECT 1 FROM outbox._stream_log l"
									"                 WHERE l.command_id OPERATOR(pg_catalog.=) $1"
									"                   AND l.run_id OPERATOR(pg_catalog.=) $4)"
									" UNION ALL "
									" SELECT p.outcome,"
									"        EXISTS (SELECT 1 FROM outbox.policies q"
									"                 WHERE q.kind OPERATOR(pg_catalog.=) p.kind"
									"                   AND q.completers IS NOT NULL"
									"                   AND NOT outbox._may(q.completers, $5)), 2"
									"   FROM outbox.purged p"
									"  WHERE p.command_id OPERATOR(pg_catalog.=) $1"
									"    AND p.run_id OPERATOR(pg_catalog.=) $4"
									" UNION ALL "
									" SELECT p.outcome,"
									"        EXISTS (SELECT 1 FROM outbox.policies q"
									"                 WHERE q.kind OPERATOR(pg_catalog.=) p.kind"
									"                   AND q.completers IS NOT NULL"
									"                   AND NOT outbox._may(q.completers, $5)), 2"
									"   FROM outbox._stream_purged($4, $1) p) x"
									" ORDER BY x.o LIMIT 1",
									5, argtypes),
					  args, nulls, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "outbox: receipt lookup failed");
	if (SPI_processed == 0)
	{
		if (!exists)
			co_raise_unknown(run_id, command_id);
		elog(ERROR, "outbox: receipt for \"%s\" neither inserted nor found",
			 text_to_cstring(command_id));
	}
	if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull)))
		co_raise_forbidden();
	prior = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	wanted = text_to_cstring(outcome);
	if (strcmp(prior, wanted) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("command \"%s\" already has a receipt with outcome \"%s\"",
						text_to_cstring(command_id), prior),
				 errdetail("A command has one receipt; the repeat asked for outcome \"%s\".",
						   wanted),
				 err_generic_string(PG_DIAG_SCHEMA_NAME, "outbox"),
				 err_generic_string(PG_DIAG_TABLE_NAME, "receipts"),
				 err_generic_string(PG_DIAG_CONSTRAINT_NAME, "receipts_pkey")));
	SPI_finish();
	PG_RETURN_BOOL(false);
}

/* outbox.complete: the body, as the owner, told who called. */
Datum
outbox_complete_1_0(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, co_complete);
}

/*
 * outbox.inbox_accept(consumer, run_id, command_id): true the first time
 * only.  The consumer name must be registered to a role the caller is a
 * member of, and the command must be known.
 */
static Datum
co_inbox_accept(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid argtypes[3] = {TEXTOID, TEXTOID, TEXTOID};
	text	   *consumer = OutboxArgId(fcinfo, 0, "consumer");
	text	   *run_id = OutboxArgId(fcinfo, 1, "run_id");
	text	   *command_id = OutboxArgId(fcinfo, 2, "command_id");
	Datum		args[3];
	bool		isnull;
	bool		registered;
	Oid			role;
	bool		known;
	bool		accepted;

	args[0] = PointerGetDatum(consumer);
	args[1] = PointerGetDatum(run_id);
	args[2] = PointerGetDatum(command_id);

	SPI_connect();
	if (OutboxExecute(OutboxPrepare(&plan_consumer,
									"SELECT (SELECT r.role::pg_catalog.oid FROM outbox.consumers r"
									"         WHERE r.consumer OPERATOR(pg_catalog.=) $1),"
									"       EXISTS (SELECT 1 FROM outbox.commands c"
									"                WHERE c.command_id OPERATOR(pg_catalog.=) $3"
									"                  AND c.run_id OPERATOR(pg_catalog.=) $2)"
									"       OR EXISTS (SELECT 1 FROM outbox._stream_log l"
									"                   WHERE l.command_id OPERATOR(pg_catalog.=) $3"
									"                     AND l.run_id OPERATOR(pg_catalog.=) $2)"
									"       OR EXISTS (SELECT 1 FROM outbox.purged p"
									"                   WHERE p.command_id OPERATOR(pg_catalog.=) $3"
									"                     AND p.run_id OPERATOR(pg_catalog.=) $2)"
									"       OR EXISTS (SELECT 1 FROM outbox._stream_purged($2, $3))",
									3, argtypes),
					  args, NULL, true, 0) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "outbox: inbox_accept failed");
	role = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &registered));
	registered = !registered;
	known = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	if (!registered)
		ereport(ERROR,
				(errcode(ERRCODE_OUTBOX_UNKNOWN_CONSUMER),
				 errmsg("unknown_consumer: consumer \"%s\" is not registered",
						text_to_cstring(consumer)),
				 errhint("An outbox administrator registers consumer names with outbox.register_consumer.")));
	if (!has_privs_of_role(caller, role))
		ereport(ERROR,
				(errcode(ERRCODE_OUTBOX_CONSUMER_NOT_OWNED),
				 errmsg("consumer_not_owned: consumer \"%s\" is registered to a role you are not a member of",
						text_to_cstring(consumer))));
	if (!known)
		co_raise_unknown(run_id, command_id);

	if (OutboxExecute(OutboxPrepare(&plan_inbox,
									"INSERT INTO outbox.inbox (consumer, command_id, run_id)"
									"VALUES ($1, $3, $2) ON CONFLICT DO NOTHING",
									3, argtypes),
					  args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "outbox: inbox_accept failed");
	accepted = (SPI_processed == 1);
	SPI_finish();
	PG_RETURN_BOOL(accepted);
}

/* outbox.inbox_accept: the body, as the owner, told who called. */
Datum
outbox_inbox_accept_1_0(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, co_inbox_accept);
}
