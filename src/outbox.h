/*-------------------------------------------------------------------------
 *
 * outbox.h
 *		Declarations shared by the files of the outbox extension.
 *
 * The extension has three parts: the SQL-callable API (producer.c,
 * lease.c, consumer.c), the shared state (outbox.c: GUCs, shared-memory
 * counters, the worker slots, the commit-time wake-up) and the background
 * workers (worker.c: launcher and per-database workers).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_H
#define OUTBOX_H

#include "postgres.h"

#include "executor/spi.h"
#include "fmgr.h"
#include "port/atomics.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

/* Longest identifier (run id, command id, kind, worker, consumer), bytes. */
#define OUTBOX_MAX_ID_LEN		200
/* Deepest nesting accepted in a payload. */
#define OUTBOX_MAX_PAYLOAD_DEPTH 64
/* Longest error text kept in last_error, bytes (longer ones are cut). */
#define OUTBOX_MAX_ERROR_LEN	4096

/* GUC variables (outbox.c) */
extern int	outbox_naptime_ms;
extern int	outbox_default_lease_ms;
extern int	outbox_max_lease_s;
extern int	outbox_max_deliveries;
extern int	outbox_backoff_base_ms;
extern int	outbox_backoff_max_ms;
extern int	outbox_retention_s;
extern int	outbox_purge_batch;
extern int	outbox_max_payload_bytes;
extern int	outbox_max_batch;
extern char *outbox_notify_channel;
extern int	outbox_receipt_overdue_s;
extern int	outbox_max_workers;
extern char *outbox_databases;
extern int	outbox_notify_interval_ms;
extern double outbox_index_bloat;
extern int	outbox_index_check_interval_ms;

/* Cumulative counters kept in shared memory (outbox.stats). */
typedef enum OutboxCounter
{
	OBC_ENQUEUED = 0,
	OBC_CLAIMED,
	OBC_TAKEN_OVER,
	OBC_ACKED,
	OBC_STALE_REFUSED,
	OBC_FAILED,
	OBC_DEAD_LETTERED,
	OBC_PURGED,
	OBC_WAKEUPS,
	OBC_NUM_COUNTERS
} OutboxCounter;

/* States a per-database worker reports in outbox.workers. */
typedef enum OutboxWorkerState
{
	OBW_FREE = 0,				/* slot unused */
	OBW_STARTING,				/* registered, not yet running */
	OBW_IDLE,					/* napping */
	OBW_RUNNING,				/* doing its duties */
	OBW_STOPPED					/* exited (extension dropped, error) */
} OutboxWorkerState;

/* Why a per-database worker exited, for the launcher's restart policy. */
typedef enum OutboxWorkerExit
{
	OBX_NONE = 0,				/* killed, or failed: restart it */
	OBX_NO_EXTENSION,			/* extension not installed: do not restart */
	OBX_DATABASE_BUSY			/* gave way to DROP/ALTER DATABASE: retry later */
} OutboxWorkerExit;

/* Databases that asked for a worker at commit, kept until the launcher looks. */
#define OUTBOX_MAX_REQUESTS		16

/*
 * One slot per database served by a worker.  The launcher owns dboid,
 * generation and state transitions out of OBW_FREE; the worker fills in the
 * rest.  All fields are protected by OutboxShared->lock, except
 * wake_pending, which producers set at commit without taking the lock.
 */
typedef struct OutboxWorkerSlot
{
	Oid			dboid;
	uint32		generation;		/* bumped each time the launcher (re)assigns */
	int			pid;
	OutboxWorkerState state;
	OutboxWorkerExit exit_reason;
	Latch	   *latch;			/* worker's process latch, NULL if not running */
	pg_atomic_uint32 wake_pending;	/* a producer committed since last look */
	int			naptime_ms;		/* the worker's current outbox.naptime */
	TimestampTz started_at;
	TimestampTz last_run;
	int64		last_purged;
	int64		runs;
	TimestampTz last_error_at;
	char		last_error[256];
} OutboxWorkerSlot;

typedef struct OutboxSharedState
{
	LWLock	   *lock;
	Latch	   *launcher_latch;
	int			launcher_pid;
	TimestampTz stats_reset;
	pg_atomic_uint64 counters[OBC_NUM_COUNTERS];
	int			nrequests;		/* entries used in requests */
	bool		requests_overflow;	/* a request did not fit: probe all */
	Oid			requests[OUTBOX_MAX_REQUESTS];
	int			nslots;
	OutboxWorkerSlot slots[FLEXIBLE_ARRAY_MEMBER];
} OutboxSharedState;

/* NULL when the library was not preloaded. */
extern OutboxSharedState *OutboxShared;

/* outbox.c */
extern void OutboxCountAtCommit(OutboxCounter c, int64 n);
extern void OutboxCountNow(OutboxCounter c, int64 n);
extern void OutboxRequestWorkerAtCommit(void);
extern OutboxWorkerSlot *OutboxFindSlot(Oid dboid);
extern SPIPlanPtr OutboxPrepare(SPIPlanPtr *cache, const char *sql,
								int nargs, const Oid *argtypes);
extern int	OutboxExecute(SPIPlanPtr plan, Datum *args, const char *nulls,
						  bool read_only, long count);
extern int	OutboxExecuteHashJoin(SPIPlanPtr plan, Datum *args, const char *nulls,
								  bool read_only, long count);
extern text *OutboxArgId(FunctionCallInfo fcinfo, int argno, const char *what);
extern Jsonb *OutboxArgPayload(FunctionCallInfo fcinfo, int argno,
							   const char *what, bool nullable);
extern void OutboxCheckId(text *t, const char *what);
extern void OutboxCheckPayload(Jsonb *j, const char *what);
extern void OutboxArgNotNull(FunctionCallInfo fcinfo, int argno, const char *what);
extern int64 OutboxIntervalUsec(Interval *iv);
extern Interval *OutboxArgLease(FunctionCallInfo fcinfo, int argno);

/* worker.c */
struct BackgroundWorkerHandle;
extern void OutboxRegisterLauncher(void);
extern bool OutboxRegisterWorker(const char *function, const char *type,
								 const char *name, Datum main_arg,
								 const void *extra, Size extralen,
								 struct BackgroundWorkerHandle **handle);
extern void OutboxRequestWorker(Oid dboid);
PGDLLEXPORT void OutboxLauncherMain(Datum main_arg);
PGDLLEXPORT void OutboxWorkerMain(Datum main_arg);

/* upkeep.c */
typedef bool (*OutboxDuty) (void *arg);
typedef bool (*OutboxRunner) (const char *what, OutboxDuty duty, void *arg);
extern List *OutboxUpkeepFind(OutboxRunner run, void (*between) (void),
							  bool first_only);
extern bool OutboxStartUpkeep(struct BackgroundWorkerHandle **handle);
extern bool OutboxUpkeepUnopposed(int pid);
PGDLLEXPORT void OutboxUpkeepMain(Datum main_arg);

#endif							/* OUTBOX_H */
