/*-------------------------------------------------------------------------
 *
 * outbox.c
 *		Module load, GUCs, shared memory, statistics and commit-time wake-up.
 *
 * Shared state.  When the library is in shared_preload_libraries it
 * reserves one OutboxSharedState: cumulative counters (atomics, no lock) and
 * one slot per per-database worker (protected by OutboxShared->lock).
 * Without preloading OutboxShared stays NULL: the API works, counters are
 * not kept and no worker runs.
 *
 * Counting and waking at commit.  API calls do not touch shared memory.
 * They add to backend-local pending counts; a transaction callback adds
 * those to the shared counters when the transaction commits and throws them
 * away when it aborts, so rolled-back work is never counted.  If the
 * committed transaction enqueued commands, the callback also sets
 * wake_pending in the database's worker slot and sets the worker's latch.
 * That is all a producer pays: no lock, no NOTIFY on its commit path.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "jit/jit.h"
#include "miscadmin.h"
#include "optimizer/cost.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/varlena.h"

#include "outbox.h"

PG_MODULE_MAGIC;

/* GUC variables */
int			outbox_naptime_ms = 1000;
int			outbox_default_lease_ms = 30000;
int			outbox_max_lease_s = 86400;
int			outbox_max_deliveries = 10;
int			outbox_backoff_base_ms = 1000;
int			outbox_backoff_max_ms = 300000;
int			outbox_retention_s = 7 * 86400;
int			outbox_purge_batch = 1000;
int			outbox_max_payload_bytes = 1024 * 1024;
int			outbox_max_batch = 10000;
char	   *outbox_notify_channel = NULL;
int			outbox_receipt_overdue_s = 3600;
int			outbox_max_workers = 8;
char	   *outbox_databases = NULL;
int			outbox_notify_interval_ms = 10;
double		outbox_index_bloat = 3.0;
int			outbox_index_check_interval_ms = 60000;

OutboxSharedState *OutboxShared = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* Counts of the current transaction, published at commit. */
static int64 pending_counts[OBC_NUM_COUNTERS];
static bool pending_request_worker = false;
static bool pending_any = false;
static bool xact_callback_registered = false;

void		_PG_init(void);
static void ob_shmem_request(void);
static void ob_shmem_startup(void);
static Size ob_shmem_size(void);
static void ob_xact_callback(XactEvent event, void *arg);
static bool ob_check_channel(char **newval, void **extra, GucSource source);
static bool ob_check_databases(char **newval, void **extra, GucSource source);
static bool ob_check_index_bloat(double *newval, void **extra, GucSource source);

PG_FUNCTION_INFO_V1(outbox_stats);
PG_FUNCTION_INFO_V1(outbox_stats_reset);
PG_FUNCTION_INFO_V1(outbox_count_purged);
PG_FUNCTION_INFO_V1(outbox_preloaded);

/*
 * Module load: define the GUCs and, when preloaded, reserve shared memory
 * and register the launcher.
 */
void
_PG_init(void)
{
	DefineCustomIntVariable("outbox.naptime",
							"Time the background worker sleeps between rounds of its duties.",
							NULL,
							&outbox_naptime_ms,
							1000, 10, 3600 * 1000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("outbox.default_lease",
							"Lease granted by claim and renew when neither the call nor the kind's policy names one.",
							NULL,
							&outbox_default_lease_ms,
							30000, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("outbox.max_lease",
							"Longest lease claim and renew accept.",
							NULL,
							&outbox_max_lease_s,
							86400, 1, 365 * 86400,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);
	DefineCustomIntVariable("outbox.max_deliveries",
							"Deliveries after which a command that keeps failing or expiring goes to dead.",
							NULL,
							&outbox_max_deliveries,
							10, 1, 1000000,
							PGC_SUSET, 0,
							NULL, NULL, NULL);
	DefineCustomIntVariable("outbox.backoff_base",
							"First retry delay after a failed delivery; doubled for each further delivery.",
							NULL,
							&outbox_backoff_base_ms,
							1000, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("outbox.backoff_max",
							"Longest retry delay after a failed delivery.",
							NULL,
							&outbox_backoff_max_ms,
							300000, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("outbox.retention",
							"How long a published command with a receipt is kept before the purge removes it.",
							NULL,
							&outbox_retention_s,
							7 * 86400, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);
	DefineCustomIntVariable("outbox.purge_batch",
							"Most commands the retention purge removes in one transaction.",
							NULL,
							&outbox_purge_batch,
							1000, 1, 1000000,
							PGC_SUSET, 0,
							NULL, NULL, NULL);
	DefineCustomIntVariable("outbox.max_payload_bytes",
							"Largest payload (jsonb size) the producer API accepts.",
							NULL,
							&outbox_max_payload_bytes,
							1024 * 1024, 64, MaxAllocSize / 2,
							PGC_SUSET, GUC_UNIT_BYTE,
							NULL, NULL, NULL);
	DefineCustomIntVariable("outbox.max_batch",
							"Largest batch claim and the set-based calls accept.",
							NULL,
							&outbox_max_batch,
							10000, 1, 1000000,
							PGC_SUSET, 0,
							NULL, NULL, NULL);
	DefineCustomStringVariable("outbox.notify_channel",
							   "Channel on which the background worker notifies publishers.",
							   NULL,
							   &outbox_notify_channel,
							   "outbox",
							   PGC_SIGHUP, 0,
							   ob_check_channel, NULL, NULL);
	DefineCustomIntVariable("outbox.receipt_overdue",
							"Age after publication at which a command without a receipt is reported overdue.",
							NULL,
							&outbox_receipt_overdue_s,
							3600, 1, INT_MAX,
							PGC_USERSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	/*
	 * A PGC_POSTMASTER setting can only be defined while preloading (a
	 * backend that loads the library later would fail with FATAL); it only
	 * sizes shared memory, which does not exist then anyway.
	 */
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("outbox.max_workers",
								"Most databases served by a background worker at once.",
								NULL,
								&outbox_max_workers,
								8, 1, 256,
								PGC_POSTMASTER, 0,
								NULL, NULL, NULL);
	DefineCustomStringVariable("outbox.databases",
							   "Comma-separated databases the launcher serves; empty means every database with the extension.",
							   NULL,
							   &outbox_databases,
							   "",
							   PGC_SIGHUP, 0,
							   ob_check_databases, NULL, NULL);

	DefineCustomIntVariable("outbox.notify_interval",
							"Shortest time between two wake-up notifications of a worker; commits in between share one.",
							NULL,
							&outbox_notify_interval_ms,
							10, 0, 60 * 1000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomRealVariable("outbox.index_bloat",
							 "Rebuild an index of the extension's tables (REINDEX CONCURRENTLY) once it has this many times the pages its entries need; 0 turns it off.",
							 NULL,
							 &outbox_index_bloat,
							 3.0, 0.0, 1000.0,
							 PGC_SIGHUP, 0,
							 ob_check_index_bloat, NULL, NULL);
	DefineCustomIntVariable("outbox.index_check_interval",
							"How often the background worker measures the indexes of the extension's tables.",
							NULL,
							&outbox_index_check_interval_ms,
							60000, 1000, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	MarkGUCPrefixReserved("outbox");

	if (!process_shared_preload_libraries_in_progress)
		return;

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = ob_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = ob_shmem_startup;

	OutboxRegisterLauncher();
}

/* A notify channel must be a non-empty identifier-sized string. */
static bool
ob_check_channel(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || (*newval)[0] == '\0' ||
		strlen(*newval) >= NAMEDATALEN)
	{
		GUC_check_errdetail("outbox.notify_channel must be between 1 and %d bytes long.",
							NAMEDATALEN - 1);
		return false;
	}
	return true;
}

/* outbox.databases must be a list of (possibly quoted) names. */
static bool
ob_check_databases(char **newval, void **extra, GucSource source)
{
	char	   *raw;
	List	   *names;
	bool		ok;

	if (*newval == NULL)
		return true;
	raw = pstrdup(*newval);
	ok = SplitIdentifierString(raw, ',', &names);
	list_free(names);
	pfree(raw);
	if (!ok)
		GUC_check_errdetail("outbox.databases must be a comma-separated list of database names.");
	return ok;
}

/*
 * outbox.index_bloat: 0 (off) or at least 1.5.  A fresh build measures
 * about 1, and an index with random inserts settles near 1.4, so a smaller
 * limit would rebuild the same index over and over.
 */
static bool
ob_check_index_bloat(double *newval, void **extra, GucSource source)
{
	if (*newval != 0 && *newval < 1.5)
	{
		GUC_check_errdetail("outbox.index_bloat must be 0 (off) or at least 1.5.");
		return false;
	}
	return true;
}

static Size
ob_shmem_size(void)
{
	return add_size(offsetof(OutboxSharedState, slots),
					mul_size(outbox_max_workers, sizeof(OutboxWorkerSlot)));
}

static void
ob_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(ob_shmem_size());
	RequestNamedLWLockTranche("outbox", 1);
}

/* Create or attach to the shared state. */
static void
ob_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	OutboxShared = ShmemInitStruct("outbox", ob_shmem_size(), &found);
	if (!found)
	{
		int			i;

		memset(OutboxShared, 0, ob_shmem_size());
		OutboxShared->lock = &(GetNamedLWLockTranche("outbox"))->lock;
		OutboxShared->stats_reset = GetCurrentTimestamp();
		for (i = 0; i < OBC_NUM_COUNTERS; i++)
			pg_atomic_init_u64(&OutboxShared->counters[i], 0);
		OutboxShared->nslots = outbox_max_workers;
		for (i = 0; i < outbox_max_workers; i++)
			pg_atomic_init_u32(&OutboxShared->slots[i].wake_pending, 0);
	}
	LWLockRelease(AddinShmemInitLock);
}

/* Make sure ob_xact_callback runs at the end of this transaction. */
static void
ob_at_end_of_xact(void)
{
	if (!xact_callback_registered)
	{
		RegisterXactCallback(ob_xact_callback, NULL);
		xact_callback_registered = true;
	}
	pending_any = true;
}

/* Add n to a counter when (and only if) the current transaction commits. */
void
OutboxCountAtCommit(OutboxCounter c, int64 n)
{
	ob_at_end_of_xact();
	pending_counts[c] += n;
}

/* Ask the launcher for a worker in this database when the transaction commits. */
void
OutboxRequestWorkerAtCommit(void)
{
	ob_at_end_of_xact();
	pending_request_worker = true;
}

/* Add n to a counter now (for refusals, which abort the transaction). */
void
OutboxCountNow(OutboxCounter c, int64 n)
{
	if (OutboxShared != NULL && n != 0)
		pg_atomic_fetch_add_u64(&OutboxShared->counters[c], (uint64) n);
}

/*
 * The slot of the worker serving dboid, or NULL.  Reads without the lock:
 * callers only use the result to set a latch, and a stale answer costs at
 * most one wake-up (the worker also polls every naptime).
 */
OutboxWorkerSlot *
OutboxFindSlot(Oid dboid)
{
	int			i;

	if (OutboxShared == NULL)
		return NULL;
	for (i = 0; i < OutboxShared->nslots; i++)
	{
		OutboxWorkerSlot *slot = &OutboxShared->slots[i];

		if (slot->state != OBW_FREE && slot->dboid == dboid)
			return slot;
	}
	return NULL;
}

/*
 * Publish or drop the transaction's counts; on commit wake the worker, and
 * ask the launcher for one if CREATE EXTENSION ran here.
 */
static void
ob_xact_callback(XactEvent event, void *arg)
{
	int			i;

	if (!pending_any)
		return;

	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (OutboxShared != NULL)
			{
				for (i = 0; i < OBC_NUM_COUNTERS; i++)
					if (pending_counts[i] != 0)
						pg_atomic_fetch_add_u64(&OutboxShared->counters[i],
												(uint64) pending_counts[i]);
				if (pending_counts[OBC_ENQUEUED] > 0)
				{
					OutboxWorkerSlot *slot = OutboxFindSlot(MyDatabaseId);

					/*
					 * Only the commit that raises the flag sets the latch:
					 * while the worker holds a wake-up back (see
					 * outbox.notify_interval) later commits cost one
					 * atomic exchange and no signal.
					 */
					if (slot != NULL &&
						pg_atomic_exchange_u32(&slot->wake_pending, 1) == 0)
					{
						Latch	   *latch = slot->latch;

						if (latch != NULL)
							SetLatch(latch);
					}
				}
				if (pending_request_worker)
					OutboxRequestWorker(MyDatabaseId);
			}
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			break;
		default:
			return;				/* not the end of the transaction yet */
	}
	memset(pending_counts, 0, sizeof(pending_counts));
	pending_request_worker = false;
	pending_any = false;
}

/*
 * Prepare and keep a plan once per backend.  The plan cache re-plans it
 * after DDL on the tables it reads (for example DROP and CREATE EXTENSION).
 *
 * The plan is generic: planned once, not for each call's parameter values.
 * Left to choose, the plan cache kept making a custom plan on every call
 * (planning was an eighth of a one-command claim + ack), because OutboxExecute
 * prices the paths it rules out so high that a generic plan never looks
 * cheaper; every statement here has one index plan, whatever its values.
 */
SPIPlanPtr
OutboxPrepare(SPIPlanPtr *cache, const char *sql, int nargs,
			  const Oid *argtypes)
{
	SPIPlanPtr	plan;

	if (*cache != NULL)
		return *cache;
	plan = SPI_prepare_cursor(sql, nargs, (Oid *) argtypes,
							  CURSOR_OPT_GENERIC_PLAN);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s",
			 sql, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	*cache = plan;
	return plan;
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
 * restored around the call, so this costs nothing per call.  outbox.purge()
 * (src/sql/20_admin.sql) turns the same four off for its victims query:
 * keep the two lists alike.
 */
static int
ob_execute(SPIPlanPtr plan, Datum *args, const char *nulls, bool read_only,
		   long count, bool hash_joins)
{
	bool		save_seqscan = enable_seqscan;
	bool		save_bitmapscan = enable_bitmapscan;
	bool		save_sort = enable_sort;
	bool		save_jit = jit_enabled;
	bool		save_nestloop = enable_nestloop;
	bool		save_mergejoin = enable_mergejoin;
	int			ret;

	enable_seqscan = false;
	enable_bitmapscan = false;
	enable_sort = false;
	jit_enabled = false;
	if (hash_joins)
	{
		enable_nestloop = false;
		enable_mergejoin = false;
	}
	PG_TRY();
	{
		ret = SPI_execute_plan(plan, args, nulls, read_only, count);
	}
	PG_FINALLY();
	{
		enable_seqscan = save_seqscan;
		enable_bitmapscan = save_bitmapscan;
		enable_sort = save_sort;
		jit_enabled = save_jit;
		enable_nestloop = save_nestloop;
		enable_mergejoin = save_mergejoin;
	}
	PG_END_TRY();
	return ret;
}

int
OutboxExecute(SPIPlanPtr plan, Datum *args, const char *nulls,
			  bool read_only, long count)
{
	return ob_execute(plan, args, nulls, read_only, count, false);
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
	return ob_execute(plan, args, nulls, read_only, count, true);
}

/* Raise 22004 if argument argno is NULL. */
void
OutboxArgNotNull(FunctionCallInfo fcinfo, int argno, const char *what)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what)));
}

/* Check that an identifier is non-empty and not too long. */
void
OutboxCheckId(text *t, const char *what)
{
	int			len = VARSIZE_ANY_EXHDR(t);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what)));
	if (len > OUTBOX_MAX_ID_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is too long", what),
				 errdetail("The value is %d bytes long; the limit is %d bytes.",
						   len, OUTBOX_MAX_ID_LEN)));
}

/* Fetch and check an identifier argument. */
text *
OutboxArgId(FunctionCallInfo fcinfo, int argno, const char *what)
{
	text	   *t;

	OutboxArgNotNull(fcinfo, argno, what);
	t = PG_GETARG_TEXT_PP(argno);
	OutboxCheckId(t, what);
	return t;
}

/* Check a payload's size and nesting depth. */
void
OutboxCheckPayload(Jsonb *j, const char *what)
{
	Size		size = VARSIZE(j);
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			depth = 0;

	if (size > (Size) outbox_max_payload_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s is too large", what),
				 errdetail("The payload is %zu bytes; outbox.max_payload_bytes is %d.",
						   size, outbox_max_payload_bytes)));

	/* A scalar or a flat container cannot be too deep: skip the walk. */
	if (JB_ROOT_IS_SCALAR(j) || JB_ROOT_COUNT(j) == 0)
		return;
	it = JsonbIteratorInit(&j->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		if (tok == WJB_BEGIN_ARRAY || tok == WJB_BEGIN_OBJECT)
		{
			if (++depth > OUTBOX_MAX_PAYLOAD_DEPTH)
				ereport(ERROR,
						(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
						 errmsg("%s is nested too deeply", what),
						 errdetail("The limit is %d levels.",
								   OUTBOX_MAX_PAYLOAD_DEPTH)));
		}
		else if (tok == WJB_END_ARRAY || tok == WJB_END_OBJECT)
			depth--;
	}
}

/* Fetch and check a payload argument; NULL allowed only if nullable. */
Jsonb *
OutboxArgPayload(FunctionCallInfo fcinfo, int argno, const char *what,
				 bool nullable)
{
	Jsonb	   *j;

	if (PG_ARGISNULL(argno))
	{
		if (nullable)
			return NULL;
		OutboxArgNotNull(fcinfo, argno, what);
	}
	j = PG_GETARG_JSONB_P(argno);
	OutboxCheckPayload(j, what);
	return j;
}

/*
 * An interval in microseconds, counting a month as 30 days and a day as
 * 24 hours (as EXTRACT(epoch) does); saturates instead of overflowing.
 */
int64
OutboxIntervalUsec(Interval *iv)
{
	double		usec;

	usec = (double) iv->time +
		((double) iv->month * DAYS_PER_MONTH + (double) iv->day) *
		(double) USECS_PER_DAY;
	if (usec >= (double) PG_INT64_MAX)
		return PG_INT64_MAX;
	if (usec <= (double) PG_INT64_MIN)
		return PG_INT64_MIN;
	return (int64) usec;
}

/*
 * Fetch and check an optional lease argument: NULL means "the default"
 * and is returned as NULL; otherwise it must be positive and at most
 * outbox.max_lease.
 */
Interval *
OutboxArgLease(FunctionCallInfo fcinfo, int argno)
{
	Interval   *iv;
	int64		usec;

	if (PG_ARGISNULL(argno))
		return NULL;
	iv = PG_GETARG_INTERVAL_P(argno);
	usec = OutboxIntervalUsec(iv);
	if (usec <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must be positive"),
				 errdetail("The requested lease was %s.",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(iv))))));
	if (usec > (int64) outbox_max_lease_s * USECS_PER_SEC)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease is longer than outbox.max_lease"),
				 errdetail("The requested lease was %s; the limit is %d seconds.",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(iv))),
						   outbox_max_lease_s)));
	return iv;
}

/* outbox.preloaded(): true when the library was in shared_preload_libraries. */
Datum
outbox_preloaded(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(OutboxShared != NULL);
}

/*
 * outbox._stats(): one row of the shared counters.  When the library was
 * not preloaded the counters do not exist: the row is all NULL (unknown,
 * not zero), so that monitoring queries keep working; outbox.workers says
 * why.
 */
Datum
outbox_stats(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[OBC_NUM_COUNTERS + 1];
	bool		nulls[OBC_NUM_COUNTERS + 1];
	int			i;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	if (OutboxShared == NULL)
	{
		memset(nulls, true, sizeof(nulls));
		PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
	}

	memset(nulls, 0, sizeof(nulls));
	for (i = 0; i < OBC_NUM_COUNTERS; i++)
		values[i] = Int64GetDatum((int64) pg_atomic_read_u64(&OutboxShared->counters[i]));
	LWLockAcquire(OutboxShared->lock, LW_SHARED);
	values[OBC_NUM_COUNTERS] = TimestampTzGetDatum(OutboxShared->stats_reset);
	LWLockRelease(OutboxShared->lock);

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/* outbox.stats_reset(): zero the shared counters. */
Datum
outbox_stats_reset(PG_FUNCTION_ARGS)
{
	int			i;

	if (OutboxShared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox statistics are not available"),
				 errhint("Add outbox to shared_preload_libraries and restart the server.")));
	for (i = 0; i < OBC_NUM_COUNTERS; i++)
		pg_atomic_write_u64(&OutboxShared->counters[i], 0);
	LWLockAcquire(OutboxShared->lock, LW_EXCLUSIVE);
	OutboxShared->stats_reset = GetCurrentTimestamp();
	LWLockRelease(OutboxShared->lock);
	PG_RETURN_VOID();
}

/*
 * outbox._count_purged(n): add n to the purged counter when the calling
 * transaction commits.  outbox.purge() calls it, so that purges run by the
 * worker and by hand are counted alike (and a rolled-back purge is not).
 */
Datum
outbox_count_purged(PG_FUNCTION_ARGS)
{
	int32		n;

	OutboxArgNotNull(fcinfo, 0, "n");
	n = PG_GETARG_INT32(0);
	if (n > 0)
		OutboxCountAtCommit(OBC_PURGED, n);
	PG_RETURN_VOID();
}
