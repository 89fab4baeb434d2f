/*-------------------------------------------------------------------------
 *
 * outbox.h
 *		Declarations shared by the files of the outbox extension.
 *
 * The files of src/, in layers that only call down (docs/worker.md):
 *
 *	 outbox.c	 module load and the GUCs
 *	 args.c		 argument checks of the SQL-callable functions, the caller
 *				 identity (OutboxCallAsOwner)
 *	 authz.c	 this database's group roles, per-kind rights
 *	 plans.c	 saved plans and the planner steering of their execution
 *	 keys.c		 ordered delivery per key: the keys' locks, the release of
 *				 the next command, skip_head
 *	 stream.c	 streams, the write-once path: batch leases and their
 *				 tokens, the producer's append to the stream log
 *	 producer.c, lease.c, consumer.c	the SQL-callable API
 *	 shared.c	 shared memory: counters, the commit, subtransaction and
 *				 two-phase callbacks, the worker slots and request queue,
 *				 outbox.stats and outbox.workers
 *	 bgw.c		 background-worker plumbing: registration, the
 *				 transaction-with-recovery runner, the database lock probe
 *	 launcher.c	 the launcher
 *	 worker.c	 the per-database worker's loop
 *	 duties.c	 the worker's duties, in one table
 *	 upkeep.c	 index upkeep and its short-lived worker
 *	 citus.c	 plan mode and DROP EXTENSION in a database with Citus
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_H
#define OUTBOX_H

#include "postgres.h"

#include "access/transam.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "port/atomics.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "utils/array.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

/*
 * The rules both languages enforce.  Each is defined here, once: the
 * Makefile copies them into the install script (sed on the lines below,
 * which must stay one line each), where @OUTBOX_MAX_ID_LEN@,
 * @OUTBOX_STATUSES@ and @OUTBOX_PLANNER_STEERING@ stand for them, and
 * test/t/024_rules.pl fails if the installed extension or a status literal
 * of src/ disagrees with them.
 */
/* Longest identifier (run id, command id, kind, worker, consumer), bytes. */
#define OUTBOX_MAX_ID_LEN		200
/* The statuses of a command (the domain outbox.command_status). */
#define OUTBOX_STATUSES			"pending", "sending", "published", "dead", "uncertain"
/*
 * The planner settings the API's statements run with turned off (see
 * OutboxExecute; outbox.purge() does the same in PL/pgSQL): X(variable, name).
 */
#define OUTBOX_PLANNER_STEERING(X)	X(enable_seqscan, "enable_seqscan") X(enable_bitmapscan, "enable_bitmapscan") X(enable_sort, "enable_sort") X(jit_enabled, "jit")

/*
 * The extension's own SQLSTATEs of class OB for consumers and addressing
 * (docs/reference.md has the table of all codes).
 */
#define ERRCODE_OUTBOX_UNKNOWN_COMMAND		MAKE_SQLSTATE('O','B','0','0','2')
#define ERRCODE_OUTBOX_UNKNOWN_CONSUMER		MAKE_SQLSTATE('O','B','0','0','3')
#define ERRCODE_OUTBOX_CONSUMER_NOT_OWNED	MAKE_SQLSTATE('O','B','0','0','4')

/* Deepest nesting accepted in a payload. */
#define OUTBOX_MAX_PAYLOAD_DEPTH 64
/* Producer headers: at most this many, names of at most NAME_LEN bytes, names and values together at most TOTAL bytes. */
#define OUTBOX_MAX_HEADERS		32
#define OUTBOX_MAX_HEADER_NAME_LEN 64
#define OUTBOX_MAX_HEADERS_BYTES 4096
/* Longest error text kept in last_error, bytes (longer ones are cut). */
#define OUTBOX_MAX_ERROR_LEN	4096

/*
 * The extension's own SQLSTATEs, class OB (the table in docs/reference.md).
 */
/* OB001 lease_not_owned: ack, fail or renew with a token the caller does not hold */
#define ERRCODE_OUTBOX_LEASE_NOT_OWNED	MAKE_SQLSTATE('O','B','0','0','1')

/* GUC variables (outbox.c) */
extern int	outbox_naptime_ms;
extern int	outbox_default_lease_ms;
extern int	outbox_max_lease_s;
extern int	outbox_max_deliveries;
extern int	outbox_backoff_base_ms;
extern int	outbox_backoff_max_ms;
extern int	outbox_retention_s;
extern int	outbox_purge_batch;
extern int	outbox_stream_rotation_s;
extern int	outbox_max_payload_bytes;
extern int	outbox_max_batch;
extern char *outbox_notify_channel;
extern int	outbox_receipt_overdue_s;
extern int	outbox_max_workers;
extern char *outbox_databases;
extern int	outbox_notify_interval_ms;
extern int	outbox_notify_idle_interval_ms;
extern double outbox_index_bloat;
extern int	outbox_index_check_interval_ms;
extern int	outbox_check_interval_ms;

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
 * rest.  All fields are protected by OutboxShared->lock, except the
 * atomics wake_pending, stream_pending, release_pending, due_floor and
 * look_mark, which committing backends
 * and the worker read and set without taking the lock.
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
	pg_atomic_uint32 stream_pending;	/* a transaction that appended to a
										 * stream committed since the last
										 * tick began */
	pg_atomic_uint32 release_pending;	/* a transaction that released an
										 * ordering key's next command
										 * committed: look for it after
										 * outbox.notify_interval */
	pg_atomic_uint64 due_floor; /* earliest start of a transaction that
								 * committed work since the due check's last
								 * look and began before look_mark
								 * (OUTBOX_NO_FLOOR: none) */
	pg_atomic_uint64 look_mark; /* where the due check's next look would
								 * begin without the floor: its last look or
								 * notification (0 before the first) */
	pg_atomic_uint64 idle_at;	/* when a claim last found nothing: a
								 * publisher waits for a notification (0:
								 * never) */
	pg_atomic_uint32 idle_pid;	/* the process of the claims that found
								 * nothing since the last notification (0:
								 * none, OUTBOX_IDLE_MANY: more than one) */
	pg_atomic_uint32 tick_seq;	/* committed changes that can make a batch
								 * claimable without a notification: ticks
								 * cut by claims (OUTBOX_DUE_TICKED), the
								 * worker's move on; counted */
	pg_atomic_uint64 tick_fxid; /* the transaction of the last of them
								 * that had one (not the move on) */
	int			naptime_ms;		/* the worker's current outbox.naptime */
	TimestampTz started_at;
	TimestampTz last_run;
	int64		last_purged;
	int64		runs;
	TimestampTz last_error_at;
	char		last_error[256];
} OutboxWorkerSlot;

/* due_floor when no commit lowered it. */
#define OUTBOX_NO_FLOOR			PG_INT64_MAX

/*
 * What a prepared transaction will publish if it commits (shared.c): kept
 * from PREPARE TRANSACTION until some process sees it finished.
 */
typedef struct OutboxPrepared
{
	TransactionId xid;			/* InvalidTransactionId: entry unused */
	Oid			dboid;
	TimestampTz xact_start;
	bool		request_worker;
	int			due;			/* OUTBOX_DUE_* of the transaction */
	int64		counts[OBC_NUM_COUNTERS];
} OutboxPrepared;

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
	pg_atomic_uint32 nprepared; /* entries of prepared in use */
	int			maxprepared;
	OutboxPrepared *prepared;	/* max_prepared_transactions entries */
	int			nslots;
	OutboxWorkerSlot slots[FLEXIBLE_ARRAY_MEMBER];
} OutboxSharedState;

/* NULL when the library was not preloaded. */
extern PGDLLIMPORT OutboxSharedState *OutboxShared;

/* args.c */

/*
 * The caller identity of the SQL-callable API (docs/design-decisions.md).
 * Each API function is SECURITY INVOKER with a pinned search_path; its
 * entry point hands its body to OutboxCallAsOwner:
 *
 *	Datum
 *	outbox_claim_1_0(PG_FUNCTION_ARGS)
 *	{
 *		return OutboxCallAsOwner(fcinfo, le_claim);
 *	}
 *
 * The body runs as the function's owner (so SPI and table access have the
 * owner's rights) and gets caller, the role the call was made by
 * (current_user at the call site), for authorization: test membership with
 * has_privs_of_role(caller, role), never GetUserId(), which is the owner
 * inside the body.  The caller's identity is restored on every exit.
 */
typedef Datum (*OutboxApiBody) (FunctionCallInfo fcinfo, Oid caller);
extern Datum OutboxCallAsOwner(FunctionCallInfo fcinfo, OutboxApiBody body);

extern text *OutboxArgId(FunctionCallInfo fcinfo, int argno, const char *what);
extern Jsonb *OutboxArgPayload(FunctionCallInfo fcinfo, int argno,
							   const char *what, bool nullable);
extern void OutboxCheckId(text *t, const char *what);
extern void OutboxCheckKey(text *t, int elem);
extern int	OutboxCompareIds(const text *a, const text *b);
extern void OutboxCheckPayload(Jsonb *j, const char *what);
extern void OutboxCheckHeaders(Jsonb *j, int elem);
extern void OutboxArgNotNull(FunctionCallInfo fcinfo, int argno, const char *what);

/* authz.c */
extern Oid	OutboxDatabaseRole(const char *capability);
extern bool OutboxIsAdmin(Oid caller);
extern bool OutboxMay(ArrayType *roles, Oid caller);
extern void OutboxCheckClaimable(ArrayType *kinds, Oid caller);
extern bool OutboxAnyDeciders(void);
extern bool OutboxOrderedByRun(text *kind);
extern bool OutboxStreamKind(text *kind);

/* siphash.c */
extern void OutboxSipHash(const unsigned char *key, const unsigned char *msg, size_t len,
						  unsigned char *out, int outlen);

/* plans.c */
extern SPIPlanPtr OutboxPrepare(SPIPlanPtr *cache, const char *sql,
								int nargs, const Oid *argtypes);
extern SPIPlanPtr OutboxPrepareRouted(SPIPlanPtr *cache, const char *sql,
									  int nargs, const Oid *argtypes);
extern SPIPlanPtr OutboxPrepareWith(SPIPlanPtr *cache, const char *sql,
									int nargs, const Oid *argtypes,
									int cursor_options);
extern int	OutboxExecute(SPIPlanPtr plan, Datum *args, const char *nulls,
						  bool read_only, long count);
extern int	OutboxExecuteHashJoin(SPIPlanPtr plan, Datum *args, const char *nulls,
								  bool read_only, long count);
extern int	OutboxExecuteLatest(SPIPlanPtr plan, Datum *args, const char *nulls,
								bool read_only, long count);
extern int	OutboxExecuteGeneric(SPIPlanPtr plan, Datum *args, const char *nulls,
								 bool read_only, long count);
extern void OutboxRunGeneric(SPIPlanPtr *cache, const char *sql, int nargs,
							 const Oid *argtypes, Datum *args, int want, const char *what);

/* keys.c: ordered delivery per key */
/* The lock space of the ordering keys' locks (field4 of an advisory lock tag; pg_advisory_* use 1 and 2). */
#define OUTBOX_KEY_LOCK_SPACE	0x4F42
/* A command of an ordering key that a publish or a skip released. */
typedef struct OutboxKeyPlace
{
	Oid			role;			/* the deciding role: a key is (role, key) */
	text	   *key;
	int64		seq;
} OutboxKeyPlace;
extern void OutboxLockKeys(Oid role, text **keys, int n);
extern void OutboxKeyTails(Oid role, text **keys, int n, int64 *last_seq, bool *busy);
extern void OutboxReleaseNext(OutboxKeyPlace *places, int n);
/* The publisher a released command is handed over to (OutboxHandOverNext). */
typedef struct OutboxHandOver
{
	text	   *worker;
	Oid			caller;			/* the calling role: claimers, paused kinds */
	ArrayType  *kinds;			/* the publisher's kinds, or NULL: any */
	int32		limit;			/* at most this many handed over */
	Datum		lease;			/* interval, or 0: the kind's lease */
	Datum		default_lease;	/* interval: outbox.default_lease */
	Datum		max_until;		/* timestamptz: now + outbox.max_lease */
	TimestampTz now;
} OutboxHandOver;
extern uint64 OutboxHandOverNext(OutboxKeyPlace *places, int n, const OutboxHandOver *ho);

/* leasekey.c: the database's lease key (16 bytes), cached per backend */
#define OUTBOX_LEASE_KEY_LEN	16
extern const unsigned char *OutboxLeaseKey(void);
extern bool OutboxTokenMac(const char *s, unsigned char *mac, int maclen);
extern bool OutboxTokenNumber(const char *s, int len, int *pos, int maxdigits,
							  uint64 max, uint64 *v);
extern const unsigned char *OutboxKeyLockKey(void);
extern void OutboxForgetLeaseKey(void);

/* stream.c: streams, the write-once path (docs/streams.md) */
/* Why a stream decision inserted nothing (OutboxStreamWhyNot). */
typedef enum OutboxStreamNot
{
	OUTBOX_STREAM_RETRY = 0,	/* the caller's own retry: no error */
	OUTBOX_STREAM_FORBIDDEN,	/* the kind's deciders do not admit the caller */
	OUTBOX_STREAM_CONFLICT		/* another decision holds the command id */
} OutboxStreamNot;
extern SPIPlanPtr OutboxStreamDecidePlan(bool deciders);
extern SPIPlanPtr OutboxStreamBatchPlan(void);
extern SPIPlanPtr OutboxStreamBatchWhyPlan(void);
extern OutboxStreamNot OutboxStreamWhyNot(Datum *args, const char *nulls);
extern void OutboxStreamCheckDecision(text *command_id, bool has_not_before, int elem);

/* citus.c */

/* One of this node's shards of a distributed outbox.commands. */
typedef struct OutboxShard
{
	int64		commands;		/* its shard id */
	int64		policies;		/* the shard id of this node's copy of
								 * outbox.policies (a reference table) */
} OutboxShard;

extern void OutboxCitusInit(void);
extern bool OutboxCitusLoaded(void);
extern bool OutboxCitusInstalled(void);
extern bool OutboxCitusDistributed(void);
extern bool OutboxCitusCoordinator(void);
extern int	OutboxPlanOptions(void);
extern OutboxShard *OutboxCitusLocalShards(int *n, bool coordinator_error);
extern SPIPlanPtr OutboxCitusShardPlan(const OutboxShard *shard, const char *sql,
									   int nargs, const Oid *argtypes);

/* shared.c */
extern void OutboxSharedInit(void);
extern void OutboxCountAtCommit(OutboxCounter c, int64 n);
/* What OutboxDueAtCommit is told a transaction did (bits). */
#define OUTBOX_DUE_MOVED		0x01	/* wrote a due_at or lease_until */
#define OUTBOX_DUE_NOW			0x02	/* made a command claimable now */
#define OUTBOX_DUE_STREAM		0x04	/* appended to a stream's log */
#define OUTBOX_DUE_RELEASE		0x08	/* released an ordering key's next command */
#define OUTBOX_DUE_TICKED		0x10	/* a claim cut a stream's tick: the
										 * publishers waiting are told */
extern void OutboxDueAtCommit(int what);
extern void OutboxCountNow(OutboxCounter c, int64 n);
extern void OutboxRequestWorkerAtCommit(void);
extern void OutboxRequestWorker(Oid dboid);
extern OutboxWorkerSlot *OutboxFindSlot(Oid dboid);
extern bool OutboxTakeStreamTick(void);
extern void OutboxStreamTickAgain(void);
extern int32 OutboxStreamTick(void);
extern Interval *OutboxDefaultLease(Interval *iv);
extern TimestampTz OutboxLeaseEnd(Interval *iv, TimestampTz now);
/* The commands of a claimed batch: n rows of desc (claim_batch's columns). */
typedef struct OutboxBatchRows
{
	uint64		n;
	TupleDesc	desc;
	HeapTuple  *vals;
} OutboxBatchRows;
extern void OutboxStreamClaim(text *stream, text *sub, text *worker, Interval *lease,
							  Oid caller, int64 nonce, int64 *since, OutboxBatchRows *rows);
#define OUTBOX_IDLE_MANY PG_UINT32_MAX
extern void OutboxNoteIdleClaim(void);
extern uint32 OutboxTickSeq(void);
extern bool OutboxTickCommitted(OutboxWorkerSlot *slot, FullTransactionId fxid,
								TimestampTz since);
extern void OutboxNoteIdleBatchClaim(uint32 tick_seq);
extern void OutboxResolvePrepared(void);
extern bool OutboxPreparedKnown(TransactionId xid);

/* stream_log.c */

/*
 * The binary form of a pg_snapshot (the type's own, as its functions in
 * src/backend/utils/adt/xid8funcs.c define it): the running transactions
 * xip[0 .. nxip - 1] in order, between xmin and xmax.
 */
typedef struct OutboxSnapshot
{
	int32		vl_len_;
	uint32		nxip;
	FullTransactionId xmin;
	FullTransactionId xmax;
	FullTransactionId xip[FLEXIBLE_ARRAY_MEMBER];
} OutboxSnapshot;

/* The ticks of a new batch: from its start (the acked tick) to its end. */
typedef struct OutboxBatchTicks
{
	int64		t_to;			/* the end tick */
	bool		last;			/* the end is the stream's last tick */
	OutboxSnapshot *sa;			/* the start tick's snapshot */
	OutboxSnapshot *sb;			/* the end tick's */
} OutboxBatchTicks;

/*
 * A row of a batch read from the log (OutboxReadLogRange): its id, then
 * command_id, run_id, seq, kind, payload, headers and ordering_key.
 */
typedef struct OutboxLogRow
{
	int64		id;
	Datum		values[7];
	bool		isnull[7];
} OutboxLogRow;

/* A row of outbox.streams locked by the tick (OutboxLockStreams). */
typedef struct OutboxLockedStream
{
	int32		stream_id;
	int32		partitions;
	Datum		part_ticks;		/* int8[], copied; (Datum) 0 when NULL */
	ItemPointerData tid;		/* the locked version */
} OutboxLockedStream;

typedef struct OutboxRowWriter OutboxRowWriter;

/* A column a writer gives values (OutboxOpenRowWriter): its name and type. */
typedef struct OutboxColumn
{
	const char *name;
	Oid			type;
} OutboxColumn;

/* A subscription's progress row, as the claim reads it (OutboxReadClaimLook). */
typedef struct OutboxProgressRow
{
	int32		part;
	int64		batch_id;
	int64		acked_tick;
	bool		open;			/* batch_to IS NOT NULL */
	bool		lease_null;
	bool		acked_null;
	TimestampTz lease_until;
	TimestampTz acked_at;
	ItemPointerData tid;
} OutboxProgressRow;

/* The claim's first look at a stream and a subscription. */
typedef struct OutboxClaimLook
{
	bool		stream_found;
	int32		stream_id;
	int32		partitions;
	int32		batch_size;
	Datum		part_ticks;		/* int8[], copied; (Datum) 0 when NULL */
	bool		sub_found;
	text	   *sub_stream;
	Datum		claimers;		/* regrole[], copied; (Datum) 0 when NULL */
	TimestampTz created_at;
	bool		failures;		/* the subscription has rows in stream_failures */
	bool		forced_rls;		/* stream_progress has row-level security forced on its owner */
	int			nprogress;
	OutboxProgressRow *progress;	/* in partition order */
} OutboxClaimLook;

typedef struct OutboxStreamLogs OutboxStreamLogs;

extern OutboxStreamLogs *OutboxOpenStreamLogs(void);
extern void OutboxCloseStreamLogs(OutboxStreamLogs *logs);
extern void OutboxBeginLogProbes(OutboxStreamLogs *logs, Snapshot snap);
extern void OutboxEndLogScans(OutboxStreamLogs *logs);
extern bool OutboxLogPartHas(OutboxStreamLogs *logs, int32 stream, int32 part, uint64 xid,
							 bool exact);
extern OutboxLogRow *OutboxReadLogRange(OutboxStreamLogs *logs, int32 stream, int32 part,
										const OutboxSnapshot *sa, const OutboxSnapshot *sb,
										text *sub, int *nrows);
extern bool OutboxStreamLastTick(int32 stream_id, int64 *tick, uint64 *xmax, uint64 **xip,
								 int *nxip);
extern void OutboxStreamBatchTicks(int32 stream_id, int64 acked, int64 cap,
								   OutboxBatchTicks *t);
extern Snapshot OutboxStatementSnapshot(void);
extern OutboxLockedStream *OutboxLockStreams(int *nlocked, int *nall, int64 *base);
extern OutboxRowWriter *OutboxOpenRowWriter(const char *name, AclMode mode,
											const OutboxColumn *columns, int ncolumns,
											bool insert, const char *const *checks,
											int nchecks);
extern void OutboxRowInsert(OutboxRowWriter *w, const Datum *values, const bool *nulls);
extern void OutboxRowUpdate(OutboxRowWriter *w, ItemPointer tid, const Datum *values,
							const bool *nulls);
extern void OutboxCloseRowWriter(OutboxRowWriter *w);
extern void OutboxReadClaimLook(text *stream, text *sub, Snapshot snap, OutboxClaimLook *look);
extern void OutboxFreeClaimLook(OutboxClaimLook *look);
extern bool OutboxLockProgress(ItemPointer tid, Snapshot snap, OutboxProgressRow *r);

/* bgw.c */
struct BackgroundWorkerHandle;
typedef bool (*OutboxTxnBody) (void *arg);
typedef bool (*OutboxRunner) (const char *what, OutboxTxnBody body, void *arg);
extern OutboxWorkerSlot *MyOutboxSlot;
extern char *MyOutboxDbName;
extern void OutboxRegisterLauncher(void);
extern bool OutboxRegisterWorker(const char *function, const char *type,
								 const char *name, Datum main_arg,
								 const void *extra, Size extralen,
								 struct BackgroundWorkerHandle **handle);
extern bool OutboxRunTransaction(const char *what, OutboxTxnBody body, void *arg);
extern void OutboxRecover(MemoryContext cxt);
extern bool OutboxDatabaseFree(Oid dboid);
extern long OutboxMsUntil(TimestampTz now, TimestampTz t);

/* launcher.c */
PGDLLEXPORT void OutboxLauncherMain(Datum main_arg);

/* worker.c */
PGDLLEXPORT void OutboxWorkerMain(Datum main_arg);

/* duties.c: the per-database worker's duties (see docs/worker.md) */

/* A duty's turn: what the loop gives a step and what the step answers. */
typedef struct OutboxTurn
{
	TimestampTz now;			/* in: when the turn (and the round) began */
	int			steps;			/* in: steps already done in this turn */
	void		(*between) (void);	/* in: answer signals, DDL and wake-ups
									 * (for a step that runs several
									 * transactions) */
	TimestampTz next;			/* in/out: the duty's next turn, preset to
								 * now + its interval */
	TimestampTz due;			/* out (the due check): when a command or a
								 * lease next reaches its time, 0 if none */
} OutboxTurn;

/* One bounded step of a duty; true when it has more to do in this turn. */
typedef bool (*OutboxDutyStep) (OutboxTurn *turn);

/* A duty's budget: at most this many steps per turn, or OUTBOX_BUDGET_NAP. */
#define OUTBOX_BUDGET_NAP		0	/* steps while the round is younger than
									 * outbox.naptime */

typedef struct OutboxDuty
{
	const char *name;			/* shown in pg_stat_activity while it runs */
	int		   *interval_ms;	/* its setting: ms between turns; NULL: a
								 * turn at every wake-up of the loop */
	int			cap_ms;			/* never longer than this between turns (0:
								 * no cap) */
	OutboxDutyStep step;		/* runs one bounded step */
	int			budget;			/* steps per turn, or OUTBOX_BUDGET_NAP */
	bool		round;			/* a turn counts in outbox.workers.rounds */
	bool		at_due;			/* also takes a turn when a command or a
								 * lease reaches its time */
	void		(*watch) (void);	/* optional: at each of the loop's checks,
									 * inside a transaction */
	void		(*stop) (void); /* optional: when the worker exits */
} OutboxDuty;

extern const OutboxDuty OutboxDuties[];
extern const int OutboxNumDuties;
extern void OutboxServeWakeups(TimestampTz *hold_until);

/* upkeep.c */
extern List *OutboxUpkeepFind(OutboxRunner run, void (*between) (void),
							  bool first_only);
extern bool OutboxStartUpkeep(struct BackgroundWorkerHandle **handle);
extern bool OutboxUpkeepUnopposed(int pid);
PGDLLEXPORT void OutboxUpkeepMain(Datum main_arg);

#endif							/* OUTBOX_H */
