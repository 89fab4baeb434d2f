/*-------------------------------------------------------------------------
 *
 * consumer.c
 *		The consumer API: completion receipts and the inbox.
 *
 * complete() takes a FOR KEY SHARE lock on the command while it inserts
 * the receipt, so a concurrent purge cannot remove the command in between;
 * the receipt is inserted with ON CONFLICT DO NOTHING, so two concurrent
 * completions of one command record one receipt and exactly one of them
 * returns true.  inbox_accept() relies on the inbox primary key the same
 * way: a second accept of the same (consumer, command_id) waits for the
 * first transaction and then returns false if it committed.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_complete);
PG_FUNCTION_INFO_V1(outbox_inbox_accept);

static SPIPlanPtr plan_complete = NULL;
static SPIPlanPtr plan_receipt = NULL;
static SPIPlanPtr plan_inbox = NULL;

/*
 * outbox.complete(command_id, outcome, detail): record the receipt.  True
 * the first time; false on a repeat with the same outcome (also after the
 * command was purged); an error for an unknown command (23503) or a repeat
 * with another outcome (23505).
 */
static Datum
co_complete(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid argtypes[3] = {TEXTOID, TEXTOID, JSONBOID};
	text	   *command_id = OutboxArgId(fcinfo, 0, "command_id");
	text	   *outcome = OutboxArgId(fcinfo, 1, "outcome");
	Jsonb	   *detail = OutboxArgPayload(fcinfo, 2, "detail", true);
	Datum		args[3];
	char		nulls[3] = {' ', ' ', ' '};
	bool		isnull;
	bool		exists;
	bool		inserted;
	char	   *prior;
	char	   *wanted;

	args[0] = PointerGetDatum(command_id);
	args[1] = PointerGetDatum(outcome);
	args[2] = detail ? PointerGetDatum(detail) : (Datum) 0;
	if (detail == NULL)
		nulls[2] = 'n';

	SPI_connect();
	if (OutboxExecute(OutboxPrepare(&plan_complete,
									   "WITH c AS ("
									   "  SELECT command_id FROM outbox.commands"
									   "   WHERE command_id OPERATOR(pg_catalog.=) $1 FOR KEY SHARE),"
									   " i AS ("
									   "  INSERT INTO outbox.receipts (command_id, outcome, detail)"
									   "  SELECT command_id, $2, $3 FROM c"
									   "  ON CONFLICT DO NOTHING RETURNING 1)"
									   "SELECT EXISTS (SELECT 1 FROM c), EXISTS (SELECT 1 FROM i)",
									   3, argtypes),
						 args, nulls, false, 0) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "outbox: complete failed");
	exists = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	inserted = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	if (inserted)
	{
		SPI_finish();
		PG_RETURN_BOOL(true);
	}

	/* Not inserted: an earlier receipt (maybe purged with its command)? */
	if (OutboxExecute(OutboxPrepare(&plan_receipt,
									   "SELECT outcome FROM outbox.receipts"
									   " WHERE command_id OPERATOR(pg_catalog.=) $1"
									   " UNION ALL "
									   "SELECT outcome FROM outbox.purged"
									   " WHERE command_id OPERATOR(pg_catalog.=) $1"
									   " LIMIT 1",
									   1, argtypes),
						 args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "outbox: receipt lookup failed");
	if (SPI_processed == 0)
	{
		if (!exists)
			ereport(ERROR,
					(errcode(ERRCODE_FOREIGN_KEY_VIOLATION),
					 errmsg("command \"%s\" does not exist", text_to_cstring(command_id)),
					 errdetail("A receipt must reference an existing command.")));
		elog(ERROR, "outbox: receipt for \"%s\" neither inserted nor found",
			 text_to_cstring(command_id));
	}
	prior = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	wanted = text_to_cstring(outcome);
	if (strcmp(prior, wanted) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("command \"%s\" already has a receipt with outcome \"%s\"",
						text_to_cstring(command_id), prior),
				 errdetail("A command has one receipt; the repeat asked for outcome \"%s\".",
						   wanted)));
	SPI_finish();
	PG_RETURN_BOOL(false);
}

/* outbox.complete: the body, as the owner, told who called. */
Datum
outbox_complete(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, co_complete);
}

/* outbox.inbox_accept(consumer, command_id): true the first time only. */
static Datum
co_inbox_accept(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid argtypes[2] = {TEXTOID, TEXTOID};
	text	   *consumer = OutboxArgId(fcinfo, 0, "consumer");
	text	   *command_id = OutboxArgId(fcinfo, 1, "command_id");
	Datum		args[2];
	bool		accepted;

	args[0] = PointerGetDatum(consumer);
	args[1] = PointerGetDatum(command_id);

	SPI_connect();
	if (OutboxExecute(OutboxPrepare(&plan_inbox,
									   "INSERT INTO outbox.inbox (consumer, command_id)"
									   "VALUES ($1, $2) ON CONFLICT DO NOTHING",
									   2, argtypes),
						 args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "outbox: inbox_accept failed");
	accepted = (SPI_processed == 1);
	SPI_finish();
	PG_RETURN_BOOL(accepted);
}

/* outbox.inbox_accept: the body, as the owner, told who called. */
Datum
outbox_inbox_accept(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, co_inbox_accept);
}
