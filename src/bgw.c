/*-------------------------------------------------------------------------
 *
 * bgw.c
 *		Background-worker plumbing: registration, the transaction runner
 *		with error recovery, and the database lock probe.
 *
 * What the launcher (launcher.c), the per-database worker (worker.c, and
 * its duties in duties.c) and the upkeep worker (upkeep.c) share.  The
 * launcher is registered at preload with a short restart time; every other
 * worker is dynamic, never restarted by the postmaster, and reports its
 * start and exit to the process that registered it.  A duty's transaction
 * runs through OutboxRunTransaction: an error is logged, kept in the slot
 * of the worker (MyOutboxSlot) for outbox.workers, and rolled back, and the
 * worker carries on.  Its text may hold what producers and publishers chose
 * (ids, kinds, error texts), so the log line gets it with control
 * characters and backslashes escaped (bg_escape): a command id with a
 * newline cannot forge a line of the server log.  Calls only shared.c's data (the slot), no function of
 * a file above it.
 *
 * Locking.  OutboxShared->lock (exclusive, briefly) to record an error in
 * the slot.  OutboxDatabaseFree takes the lock of the database object
 * conditionally and releases it at once; it never waits.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "lib/stringinfo.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "outbox.h"

/* The slot this process serves (a per-database worker), else NULL. */
OutboxWorkerSlot *MyOutboxSlot = NULL;

/* The name of the database this worker serves, for log messages. */
char	   *MyOutboxDbName = NULL;

/* Milliseconds from now until t, rounded up, at least 0. */
long
OutboxMsUntil(TimestampTz now, TimestampTz t)
{
	if (t <= now)
		return 0;
	return (long) ((t - now + 999) / 1000);
}

/*
 * True when nobody holds or waits for a lock on database dboid that
 * conflicts with the one every new connection takes (DROP DATABASE, ALTER
 * DATABASE, CREATE DATABASE ... TEMPLATE hold one while they wait for the
 * sessions in the database to leave).  Never waits.
 */
bool
OutboxDatabaseFree(Oid dboid)
{
	LOCKTAG		tag;

	SET_LOCKTAG_OBJECT(tag, InvalidOid, DatabaseRelationId, dboid, 0);
	if (LockAcquire(&tag, RowExclusiveLock, true, true) == LOCKACQUIRE_NOT_AVAIL)
		return false;
	LockRelease(&tag, RowExclusiveLock, true);
	return true;
}

/*
 * Register a dynamic background worker of this library that connects to a
 * database, is never restarted by the postmaster, and reports its start
 * and exit to us (bgw_notify_pid).  The handle lives in TopMemoryContext.
 * False if no background worker slot is free.
 */
bool
OutboxRegisterWorker(const char *function, const char *type, const char *name,
					 Datum main_arg, const void *extra, Size extralen,
					 BackgroundWorkerHandle **handle)
{
	BackgroundWorker bgw;
	MemoryContext oldcxt;
	bool		ok;

	Assert(extralen <= BGW_EXTRALEN);
	memset(&bgw, 0, sizeof(bgw));
	bgw.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	bgw.bgw_start_time = BgWorkerStart_RecoveryFinished;
	bgw.bgw_restart_time = BGW_NEVER_RESTART;
	strlcpy(bgw.bgw_library_name, "outbox", BGW_MAXLEN);
	strlcpy(bgw.bgw_function_name, function, BGW_MAXLEN);
	strlcpy(bgw.bgw_name, name, BGW_MAXLEN);
	strlcpy(bgw.bgw_type, type, BGW_MAXLEN);
	bgw.bgw_main_arg = main_arg;
	memcpy(bgw.bgw_extra, extra, extralen);
	bgw.bgw_notify_pid = MyProcPid;

	oldcxt = MemoryContextSwitchTo(TopMemoryContext);
	ok = RegisterDynamicBackgroundWorker(&bgw, handle);
	MemoryContextSwitchTo(oldcxt);
	if (!ok)
		*handle = NULL;
	return ok;
}

/* Register the launcher (called from _PG_init when preloaded). */
void
OutboxRegisterLauncher(void)
{
	BackgroundWorker bgw;

	memset(&bgw, 0, sizeof(bgw));
	bgw.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	bgw.bgw_start_time = BgWorkerStart_RecoveryFinished;
	bgw.bgw_restart_time = 1;
	strlcpy(bgw.bgw_library_name, "outbox", BGW_MAXLEN);
	strlcpy(bgw.bgw_function_name, "OutboxLauncherMain", BGW_MAXLEN);
	strlcpy(bgw.bgw_name, "outbox launcher", BGW_MAXLEN);
	strlcpy(bgw.bgw_type, "outbox launcher", BGW_MAXLEN);
	RegisterBackgroundWorker(&bgw);
}

/* Keep an error of the worker's duties in its slot for outbox.workers. */
static void
bg_record_error(const char *msg)
{
	if (MyOutboxSlot == NULL)
		return;
	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	strlcpy(MyOutboxSlot->last_error, msg, sizeof(MyOutboxSlot->last_error));
	MyOutboxSlot->last_error_at = GetCurrentTimestamp();
	LWLockRelease(OutboxShared->lock);
}

/*
 * A copy of s for a log line: backslash, newline, carriage return and tab
 * as \\, \n, \r and \t, any other control character as \xNN.  NULL stays
 * NULL.
 */
static char *
bg_escape(const char *s)
{
	StringInfoData buf;
	const unsigned char *p;

	if (s == NULL)
		return NULL;
	initStringInfo(&buf);
	for (p = (const unsigned char *) s; *p; p++)
	{
		if (*p == '\\')
			appendStringInfoString(&buf, "\\\\");
		else if (*p == '\n')
			appendStringInfoString(&buf, "\\n");
		else if (*p == '\r')
			appendStringInfoString(&buf, "\\r");
		else if (*p == '\t')
			appendStringInfoString(&buf, "\\t");
		else if (*p < 0x20 || *p == 0x7f)
			appendStringInfo(&buf, "\\x%02x", *p);
		else
			appendStringInfoChar(&buf, (char) *p);
	}
	return buf.data;
}

/*
 * Recover from an error caught in one of the worker's transactions: log it
 * (as a WARNING, with its texts escaped: the worker goes on), keep its
 * message in the slot, roll the transaction back.  The worker then carries
 * on with its next duty.
 */
void
OutboxRecover(MemoryContext cxt)
{
	ErrorData  *edata;
	char	   *message;

	HOLD_INTERRUPTS();
	MemoryContextSwitchTo(cxt);
	edata = CopyErrorData();
	FlushErrorState();
	AbortCurrentTransaction();
	RESUME_INTERRUPTS();
	message = edata->message;
	edata->elevel = WARNING;
	edata->output_to_client = false;
	edata->message = bg_escape(message);
	edata->detail = bg_escape(edata->detail);
	edata->detail_log = bg_escape(edata->detail_log);
	edata->hint = bg_escape(edata->hint);
	edata->context = bg_escape(edata->context);
	edata->internalquery = bg_escape(edata->internalquery);
	ThrowErrorData(edata);
	bg_record_error(message);
	FreeErrorData(edata);
}

/*
 * Run body in its own transaction, with a snapshot and SPI.  An error is
 * logged and kept in the slot, the transaction is rolled back and the
 * worker carries on.  Returns false if the body failed or skipped its turn.
 */
bool
OutboxRunTransaction(const char *what, OutboxTxnBody body, void *arg)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile bool ok = false;

	pgstat_report_activity(STATE_RUNNING, what);
	PG_TRY();
	{
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		ok = body(arg);
		SPI_finish();
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		OutboxRecover(cxt);
		ok = false;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	pgstat_report_activity(STATE_IDLE, NULL);
	return ok;
}
