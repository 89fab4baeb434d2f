/*-------------------------------------------------------------------------
 *
 * keys.c
 *		Ordered delivery per key: the lock of an ordering key, the look at
 *		a key's last command, the release (or the hand-over) of the next
 *		command when a head is published, and outbox.skip_head.
 *
 * A key belongs to the role that decides: the key of a command is
 * (decided_by, ordering_key), so two roles using one key string have two
 * independent keys.  The commands that share a key leave one at a time, in
 * ordering_seq order: the producer gives each new command of a key the
 * place after the key's last one.  A key's head is its first command that
 * is not published; only the head can be claimable.  Every command after
 * it is waiting: status pending with due_at NULL, so it has no entry in
 * commands_claim_idx and claim never reads it.  Everything a head goes
 * through (claim, fail with a backoff, dead, sweep, uncertain, takeover,
 * requeue, resolve as retry or dead) keeps it the head.  When it is
 * published (ack, ack_many, resolve as published) or skipped
 * (outbox.skip_head, for a dead head), the one that did it makes the next
 * command of the key claimable in the same transaction (due_at and
 * available_at become the later of its available_at and now).  Its commit
 * does not wake the publishers at once: the publisher that acked the head
 * claims again right after its ack and usually takes the released command
 * itself, and a notification would only wake every idle publisher for an
 * empty claim.  The worker looks for it outbox.notify_interval later and
 * wakes the publishers if it is still claimable (duties.c, "The release's
 * wake-up").  ack_handover goes one step further: the statement that
 * would release the next command leases it to the acking publisher
 * instead (OutboxHandOverNext: one row version where the release and the
 * claim made two), when a claim by that publisher could take it right
 * then; otherwise it releases it.  The lease is made under the key's lock
 * in the transaction that publishes the head, so it is the key's only one,
 * and it is an ordinary lease from then on.  A skipped
 * head leaves the key: its ordering_key and ordering_seq become NULL and
 * its last_error says which key it was the head of.
 *
 * What commands_key_idx holds (KY_KEPT): the waiting, published, dead and
 * uncertain commands of each key, and a head that is pending and due or
 * sending only when it is marked (ordering_tail): when it became the head
 * as its key's last command (the producer's new head of an idle key when
 * it is the key's only new command, or a release that found nothing
 * behind the released command).  An unmarked
 * head has a command waiting behind it, in the index, until it is
 * published: only its own publish releases that one.  So the key's last
 * command is always in the index, which is all the producer reads, and the
 * release, claim and renewed claims of an unmarked head add no entry to
 * it; its ack adds one (published, which keeps the producer's places
 * above every place the key still holds, however the purge removed its
 * history).  A mark stays when commands are appended behind a marked
 * head: it only costs that head its entries.
 *
 * Locking.  Each key has one heavyweight lock: an advisory lock tag in a
 * lock space of its own (field4 OUTBOX_KEY_LOCK_SPACE, which no
 * pg_advisory_* function can take), on the database and a 64-bit SipHash
 * of the database, the role and the key under the lease key (so pg_locks
 * tells nothing of a key; OutboxKeyLockKey keeps a rotation out while the
 * lock is held), exclusive, held until the transaction ends.  Two keys with the
 * same hash share the lock, which only serializes them.  It is taken by
 * the producer that appends to the key (before it looks at the key's last
 * command) and by whatever publishes or skips the key's head (after it
 * changed the head, before it looks for the next command).  The set of a
 * key's unfinished commands changes only under this lock: the changes
 * that do not take it (claim, fail, sweep, requeue, resolve as retry or
 * dead) move the head between unfinished states, and the purge removes
 * published commands only.  The look-ups and the release under the lock
 * read with the latest snapshot (OutboxExecuteLatest), so they see what the
 * lock's last holder committed whatever the caller's isolation level.
 * Hence: a producer that sees the key's last command unfinished makes the
 * new one wait, and whoever publishes or skips the key's head later takes
 * the lock after the producer's commit and sees it (released at once if it
 * is next); a producer that sees the last command published (or none)
 * makes the new one the head, since the key has no unfinished command.  A call that
 * locks several keys locks them in the order of their hashes.  Commands
 * without a key take none of this.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_skip_head);
PG_FUNCTION_INFO_V1(outbox_release_key);

static SPIPlanPtr plan_tails = NULL;
static SPIPlanPtr plan_release = NULL;
static SPIPlanPtr plan_release_many = NULL;
static SPIPlanPtr plan_handover = NULL;
static SPIPlanPtr plan_head = NULL;
static SPIPlanPtr plan_roles = NULL;
static SPIPlanPtr plan_skip = NULL;

/*
 * The predicate of commands_key_idx beyond ordering_key IS NOT NULL
 * (src/sql/00_schema.sql), written as the index says it, so that a look-up
 * that states it reads the index: the command is marked as its key's last
 * head, or waits, or is published, dead or uncertain.  A head that is
 * pending and due, or sending, is left out unless marked: it has commands
 * waiting behind it, which are in the index.
 */
#define KY_KEPT(c) \
	" AND (" c "ordering_tail" \
	"      OR (" c "status OPERATOR(pg_catalog.=) 'pending' AND " c "due_at IS NULL)" \
	"      OR (" c "status OPERATOR(pg_catalog.<>) 'pending' AND " c "status OPERATOR(pg_catalog.<>) 'sending'))"

/*
 * The look-up of the release: the ctids of the (at most) two commands after
 * place p.seq of the key (p.key, p.role) in commands_key_idx, in order.  The
 * first is the one to release; it is marked as its key's last command
 * (ordering_tail) when there is no second, so that it stays in the index
 * while it is the head.  One index scan reads both.
 */
#define KY_NEXT_TWO(key, role, seq) \
	"ARRAY(SELECT c.ctid FROM outbox.commands c" \
	"       WHERE c.ordering_key OPERATOR(pg_catalog.=) " key \
	"         AND c.decided_by OPERATOR(pg_catalog.=) " role \
	"         AND c.ordering_seq OPERATOR(pg_catalog.>) " seq \
	KY_KEPT("c.") \
	"       ORDER BY c.ordering_seq LIMIT 2)"

/* The hash a key's lock is taken on. */
typedef struct KyLock
{
	uint64		hash;
} KyLock;

/*
 * The hash of the lock of the key (role, key): SipHash of the database's
 * oid, the role's oid and the key's bytes under the lease key (sipkey), so
 * that a lock tag in pg_locks says nothing of the key to whoever does not
 * hold the lease key.
 */
static uint64
ky_hash(const unsigned char *sipkey, Oid role, text *key)
{
	int			len = VARSIZE_ANY_EXHDR(key);
	unsigned char buf[8 + OUTBOX_MAX_ID_LEN];
	unsigned char *msg = (len <= OUTBOX_MAX_ID_LEN) ? buf : palloc(8 + len);
	uint32		db = (uint32) MyDatabaseId;
	uint32		r = (uint32) role;
	unsigned char out[8];
	uint64		h = 0;
	int			i;

	memcpy(msg, &db, 4);
	memcpy(msg + 4, &r, 4);
	memcpy(msg + 8, VARDATA_ANY(key), len);
	OutboxSipHash(sipkey, msg, 8 + len, out, 8);
	for (i = 0; i < 8; i++)
		h = (h << 8) | out[i];
	if (msg != buf)
		pfree(msg);
	return h;
}

/* qsort comparator of KyLock by hash. */
static int
ky_cmp_lock(const void *a, const void *b)
{
	uint64		x = ((const KyLock *) a)->hash;
	uint64		y = ((const KyLock *) b)->hash;

	return (x > y) - (x < y);
}

/*
 * Take the locks of n hashes (exclusive, until the transaction ends), in
 * the order of the hashes, each once.  A lock this transaction holds
 * already is only counted again.
 */
static void
ky_lock(KyLock *locks, int n)
{
	int			i;

	qsort(locks, n, sizeof(KyLock), ky_cmp_lock);
	for (i = 0; i < n; i++)
	{
		LOCKTAG		tag;

		if (i > 0 && locks[i].hash == locks[i - 1].hash)
			continue;
		SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (locks[i].hash >> 32),
							 (uint32) locks[i].hash, OUTBOX_KEY_LOCK_SPACE);
		(void) LockAcquire(&tag, ExclusiveLock, false, false);
	}
}

/* Take the locks of the keys of n places (each its own role). */
static void
ky_lock_places(OutboxKeyPlace *places, int n)
{
	KyLock	   *locks = palloc(sizeof(KyLock) * Max(n, 1));
	const unsigned char *sipkey = OutboxKeyLockKey();
	int			i;

	for (i = 0; i < n; i++)
		locks[i].hash = ky_hash(sipkey, places[i].role, places[i].key);
	ky_lock(locks, n);
	pfree(locks);
}

/*
 * Take the locks of n ordering keys of one deciding role (the producer's).
 * Runs in the caller's SPI connection (for the lease key).
 */
void
OutboxLockKeys(Oid role, text **keys, int n)
{
	OutboxKeyPlace *places = palloc0(sizeof(OutboxKeyPlace) * Max(n, 1));
	int			i;

	for (i = 0; i < n; i++)
	{
		places[i].role = role;
		places[i].key = keys[i];
	}
	ky_lock_places(places, n);
	pfree(places);
}

/*
 * For each of n keys, locked by the caller: the place of the key's last
 * command (0 when the key has none) and whether that command is
 * unfinished (busy: a new command of the key must wait).  The key's last
 * command is published only when all its commands are, since they are
 * published in order.  Runs in the caller's SPI connection.
 */
void
OutboxKeyTails(Oid role, text **keys, int n, int64 *last_seq, bool *busy)
{
	static const Oid argtypes[2] = {TEXTARRAYOID, OIDOID};
	Datum	   *elems = palloc(sizeof(Datum) * Max(n, 1));
	Datum		args[2];
	uint64		i;
	int			j;

	for (j = 0; j < n; j++)
	{
		elems[j] = PointerGetDatum(keys[j]);
		last_seq[j] = 0;
		busy[j] = false;
	}
	args[0] = PointerGetDatum(construct_array(elems, n, TEXTOID, -1, false, TYPALIGN_INT));
	args[1] = ObjectIdGetDatum(role);
	if (OutboxExecuteLatest(OutboxPrepare(&plan_tails,
										  "SELECT k.ord, t.ordering_seq,"
										  "       t.status OPERATOR(pg_catalog.<>) 'published'"
										  "  FROM pg_catalog.unnest($1) WITH ORDINALITY AS k(key, ord)"
										  "  JOIN LATERAL (SELECT c.ordering_seq, c.status FROM outbox.commands c"
										  "                 WHERE c.ordering_key OPERATOR(pg_catalog.=) k.key"
										  "                   AND c.decided_by OPERATOR(pg_catalog.=) $2"
										  KY_KEPT("c.")
										  "                 ORDER BY c.ordering_seq DESC LIMIT 1) t ON true",
										  2, argtypes),
							args, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox: look-up of the ordering keys failed");
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		int64		ord = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));

		if (ord < 1 || ord > n)
			elog(ERROR, "outbox: look-up of the ordering keys returned key %d", (int) ord);
		last_seq[ord - 1] = DatumGetInt64(SPI_getbinval(tup, desc, 2, &isnull));
		busy[ord - 1] = DatumGetBool(SPI_getbinval(tup, desc, 3, &isnull));
	}
	pfree(elems);
}

/*
 * The keys, places and roles of places[0 .. n - 1] as the text[], int8[] and
 * oid[] parameters $1, $2 and $4 of the statements that release or hand
 * over several keys' next commands (args[0], args[1], args[3]).
 */
static void
ky_place_arrays(const OutboxKeyPlace *places, int n, Datum *args)
{
	Datum	   *kd = palloc(sizeof(Datum) * n);
	Datum	   *sd = palloc(sizeof(Datum) * n);
	Datum	   *rd = palloc(sizeof(Datum) * n);
	int			i;

	for (i = 0; i < n; i++)
	{
		kd[i] = PointerGetDatum(places[i].key);
		sd[i] = Int64GetDatum(places[i].seq);
		rd[i] = ObjectIdGetDatum(places[i].role);
	}
	args[0] = PointerGetDatum(construct_array(kd, n, TEXTOID, -1, false, TYPALIGN_INT));
	args[1] = PointerGetDatum(construct_array(sd, n, INT8OID, sizeof(int64),
											  FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	args[3] = PointerGetDatum(construct_array(rd, n, OIDOID, sizeof(Oid), true, TYPALIGN_INT));
}

/*
 * Make the command after each place (a head just published or skipped)
 * claimable, if it waits: lock the keys, then release the next command of
 * each, in one statement (one for a single place, one for several: an
 * ack_many of heads of many keys reads each key's next command by an index
 * probe and updates them all by their ctids, as claim does).  If any was
 * released, the worker looks for it after its commit (see the file header).  Runs in the caller's SPI
 * connection; SPI_tuptable is not kept.
 */
void
OutboxReleaseNext(OutboxKeyPlace *places, int n)
{
	static const Oid one_types[4] = {TEXTOID, INT8OID, TIMESTAMPTZOID, OIDOID};
	static const Oid many_types[4] = {TEXTARRAYOID, INT8ARRAYOID, TIMESTAMPTZOID, OIDARRAYOID};
	Datum		args[4];
	int			ret;

	if (n == 0)
		return;
	ky_lock_places(places, n);
	args[2] = TimestampTzGetDatum(GetCurrentTimestamp());
	if (n == 1)
	{
		args[0] = PointerGetDatum(places[0].key);
		args[1] = Int64GetDatum(places[0].seq);
		args[3] = ObjectIdGetDatum(places[0].role);
		ret = OutboxExecuteLatest(OutboxPrepare(&plan_release,
												"WITH n AS MATERIALIZED (SELECT " KY_NEXT_TWO("$1", "$4", "$2") " AS tids)"
												"UPDATE outbox.commands t"
												"   SET available_at = GREATEST(t.available_at, $3),"
												"       due_at = GREATEST(t.available_at, $3),"
												"       ordering_tail = CASE WHEN pg_catalog.cardinality((SELECT n.tids FROM n))"
												"                                 OPERATOR(pg_catalog.=) 1 THEN true END"
												" WHERE t.ctid OPERATOR(pg_catalog.=) (SELECT n.tids[1] FROM n)"
												"   AND t.status OPERATOR(pg_catalog.=) 'pending'"
												"   AND t.due_at IS NULL",
												4, one_types),
								  args, NULL, false, 0);
	}
	else
	{
		ky_place_arrays(places, n, args);
		ret = OutboxExecuteLatest(OutboxPrepare(&plan_release_many,
												"WITH n AS MATERIALIZED ("
												"  SELECT x.tids[1] AS tid,"
												"         pg_catalog.cardinality(x.tids) OPERATOR(pg_catalog.=) 1 AS last"
												"    FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2),"
												"                    pg_catalog.unnest($4)) AS p(key, seq, role)"
												"   CROSS JOIN LATERAL (SELECT " KY_NEXT_TWO("p.key", "p.role", "p.seq") " AS tids OFFSET 0) x)"
												"UPDATE outbox.commands t"
												"   SET available_at = GREATEST(t.available_at, $3),"
												"       due_at = GREATEST(t.available_at, $3),"
												"       ordering_tail = CASE WHEN t.ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
												"            SELECT n.tid FROM n WHERE n.last)) THEN true END"
												" WHERE t.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT n.tid FROM n"
												"                                                WHERE n.tid IS NOT NULL))"
												"   AND t.status OPERATOR(pg_catalog.=) 'pending'"
												"   AND t.due_at IS NULL",
												4, many_types),
								  args, NULL, false, 0);
	}
	if (ret != SPI_OK_UPDATE)
		elog(ERROR, "outbox: release of the next command of an ordering key failed");
	if (SPI_processed > 0)
		OutboxDueAtCommit(OUTBOX_DUE_RELEASE);
}

/*
 * The hand-over's test of a released command t: whether a claim by the
 * acking publisher could lease it right now.  The command is available
 * ($3: now), its kind is among the asked ones ($9, NULL: any) and not among
 * the kinds that are paused or whose claimers do not admit the caller (ex,
 * read once per statement, as claim reads them).
 */
#define KY_HANDED(t) \
	"(" t "available_at OPERATOR(pg_catalog.<=) $3" \
	" AND ($9 IS NULL OR " t "kind OPERATOR(pg_catalog.=) ANY ($9))" \
	" AND " t "kind OPERATOR(pg_catalog.<>) ALL ((SELECT ex.kinds FROM ex)::pg_catalog.text[]))"

/*
 * OutboxReleaseNext, handing the released commands over where it can: under
 * the keys' locks, one statement reads each key's next command (as the
 * release of several does) and updates it once, either to a lease of ho's
 * publisher (status sending, ho's lease, version and deliveries + 1: what
 * claim writes, without the pending version that claim would lease) when a
 * claim by that publisher could take it now (KY_HANDED), or to claimable
 * as the release does.  Only the first ho->limit places are handed over;
 * the keys of the others are released by OutboxReleaseNext (all the keys
 * are locked first, in one order).  Leaves SPI_tuptable with a row per
 * command of the first places released or handed over (handed over: the
 * first column; then the lease's columns, for src/lease.c) and returns
 * their number.  The test that the command waits is written in a CASE, so
 * that it does not match the predicate of commands_held_idx: a plan made
 * while the table is small would read that whole index instead of the
 * rows by their ctids.  Runs in the caller's SPI connection.
 */
uint64
OutboxHandOverNext(OutboxKeyPlace *places, int n, const OutboxHandOver *ho)
{
	static const Oid argtypes[10] = {TEXTARRAYOID, INT8ARRAYOID, TIMESTAMPTZOID, OIDARRAYOID,
		TEXTOID, INTERVALOID, INTERVALOID, TIMESTAMPTZOID, TEXTARRAYOID, OIDOID};
	Datum		args[10];
	char		nulls[10] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	int			m = Min(n, ho->limit);
	uint64		i;
	uint64		released = 0;

	if (n == 0)
		return 0;
	ky_lock_places(places, n);
	if (m < n)
		OutboxReleaseNext(places + m, n - m);
	if (m == 0)
		return 0;
	ky_place_arrays(places, m, args);
	args[2] = TimestampTzGetDatum(ho->now);
	args[4] = PointerGetDatum(ho->worker);
	args[5] = ho->lease;
	if (ho->lease == (Datum) 0)
		nulls[5] = 'n';
	args[6] = ho->default_lease;
	args[7] = ho->max_until;
	args[8] = PointerGetDatum(ho->kinds);
	if (ho->kinds == NULL)
		nulls[8] = 'n';
	args[9] = ObjectIdGetDatum(ho->caller);
	if (OutboxExecuteLatest(OutboxPrepare(&plan_handover,
										  "WITH n AS MATERIALIZED ("
										  "  SELECT x.tids[1] AS tid,"
										  "         pg_catalog.cardinality(x.tids) OPERATOR(pg_catalog.=) 1 AS last"
										  "    FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2),"
										  "                    pg_catalog.unnest($4)) AS p(key, seq, role)"
										  "   CROSS JOIN LATERAL (SELECT " KY_NEXT_TWO("p.key", "p.role", "p.seq") " AS tids OFFSET 0) x),"
										  " ex AS MATERIALIZED (SELECT COALESCE(pg_catalog.array_agg(y.kind), '{}') AS kinds"
										  "   FROM (SELECT p.kind FROM outbox.policies p WHERE p.paused"
										  "         UNION ALL SELECT p.kind FROM outbox.policies p"
										  "          WHERE p.claimers IS NOT NULL AND NOT outbox._may(p.claimers, $10)) y)"
										  "UPDATE outbox.commands t"
										  "   SET status = CASE WHEN " KY_HANDED("t.") " THEN 'sending' ELSE t.status END,"
										  "       owner = CASE WHEN " KY_HANDED("t.") " THEN $5 ELSE t.owner END,"
										  "       available_at = GREATEST(t.available_at, $3),"
										  "       due_at = CASE WHEN " KY_HANDED("t.") " THEN NULL"
										  "                     ELSE GREATEST(t.available_at, $3) END,"
										  "       lease_until = CASE WHEN " KY_HANDED("t.") " THEN"
										  "           LEAST($3 OPERATOR(pg_catalog.+) COALESCE($6,"
										  "               (SELECT p.lease FROM outbox.policies p"
										  "                 WHERE p.kind OPERATOR(pg_catalog.=) t.kind), $7), $8) END,"
										  "       version = CASE WHEN " KY_HANDED("t.") " THEN t.version OPERATOR(pg_catalog.+) 1"
										  "                      ELSE t.version END,"
										  "       deliveries = CASE WHEN " KY_HANDED("t.") " THEN t.deliveries OPERATOR(pg_catalog.+) 1"
										  "                         ELSE t.deliveries END,"
										  "       ordering_tail = CASE WHEN t.ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
										  "            SELECT n.tid FROM n WHERE n.last)) THEN true END"
										  " WHERE t.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT n.tid FROM n"
										  "                                                WHERE n.tid IS NOT NULL))"
										  "   AND CASE WHEN t.status OPERATOR(pg_catalog.=) 'pending' AND t.due_at IS NULL"
										  "            THEN true ELSE false END"
										  " RETURNING t.status OPERATOR(pg_catalog.=) 'sending',"
										  "           t.command_id, t.run_id, t.seq, t.kind, t.payload, NULL::pg_catalog.text,"
										  "           t.version, t.deliveries, t.lease_until, t.headers, t.ordering_key",
										  10, argtypes),
							args, nulls, false, 0) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "outbox: hand-over of the next command of an ordering key failed");
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;

		if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull)))
			released++;
	}
	if (released > 0)
		OutboxDueAtCommit(OUTBOX_DUE_RELEASE);
	return SPI_processed;
}

/*
 * outbox._release_key(ordering_key, ordering_seq, decided_by): OutboxReleaseNext for
 * the PL/pgSQL functions (resolve as published), as the owner.
 */
Datum
outbox_release_key(PG_FUNCTION_ARGS)
{
	OutboxKeyPlace place;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		PG_RETURN_VOID();
	place.key = PG_GETARG_TEXT_PP(0);
	place.seq = PG_GETARG_INT64(1);
	place.role = PG_GETARG_OID(2);
	SPI_connect();
	OutboxReleaseNext(&place, 1);
	SPI_finish();
	PG_RETURN_VOID();
}

/*
 * outbox.skip_head(ordering_key, decided_by): take a dead head out of the
 * key (decided_by, ordering_key) and release the next command.  decided_by
 * NULL means the one role with an unfinished command on ordering_key
 * (21000, changing nothing, when several have one).  Returns the skipped
 * command's id.  55000 when the key has no unfinished command or its head
 * is not dead.  The head is the first command after the key's last
 * published one (found from the key's end, past its waiting commands), so
 * the key's published history is not read.  The head's row is locked
 * before the key's lock, in the order ack and resolve take them.
 */
static Datum
ky_skip_head(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid head_types[2] = {TEXTOID, OIDOID};
	static const Oid roles_types[1] = {TEXTOID};
	static const Oid skip_types[3] = {TEXTOID, TEXTOID, TEXTOID};
	text	   *key = OutboxArgId(fcinfo, 0, "ordering_key");
	MemoryContext outer = CurrentMemoryContext;
	MemoryContext spi;
	Datum		args[3];
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	text	   *command_id;
	text	   *run_id;
	char	   *status;
	Oid			role;
	OutboxKeyPlace place;

	OutboxCheckKey(key, 0);
	SPI_connect();
	args[0] = PointerGetDatum(key);
	if (PG_NARGS() > 1 && !PG_ARGISNULL(1))
		role = PG_GETARG_OID(1);
	else
	{
		/* the one role with an unfinished command on the key */
		if (OutboxExecuteLatest(OutboxPrepare(&plan_roles,
											  "SELECT DISTINCT c.decided_by FROM outbox.commands c"
											  " WHERE c.ordering_key OPERATOR(pg_catalog.=) $1"
											  KY_KEPT("c.")
											  "   AND c.status OPERATOR(pg_catalog.<>) 'published'"
											  " LIMIT 2",
											  1, roles_types),
								args, NULL, true, 0) != SPI_OK_SELECT)
			elog(ERROR, "outbox: look-up of the roles of an ordering key failed");
		if (SPI_processed == 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("ordering key \"%s\" has no unfinished command", text_to_cstring(key)),
					 errdetail("Every command of the key is published, or the key has none.")));
		if (SPI_processed > 1)
			ereport(ERROR,
					(errcode(ERRCODE_CARDINALITY_VIOLATION),
					 errmsg("ordering key \"%s\" has unfinished commands of several deciding roles", text_to_cstring(key)),
					 errdetail("A key belongs to the role that decides; nothing was skipped."),
					 errhint("Name the role: outbox.skip_head(ordering_key, decided_by => 'role').")));
		role = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	}
	args[1] = ObjectIdGetDatum(role);
	if (OutboxExecuteLatest(OutboxPrepare(&plan_head,
										  "SELECT c.command_id, c.run_id, c.status::pg_catalog.text, c.ordering_seq,"
										  "       c.status OPERATOR(pg_catalog.=) 'pending' AND c.due_at IS NULL"
										  "  FROM outbox.commands c"
										  " WHERE c.ordering_key OPERATOR(pg_catalog.=) $1"
										  "   AND c.decided_by OPERATOR(pg_catalog.=) $2"
										  "   AND c.ordering_seq OPERATOR(pg_catalog.>) COALESCE(("
										  "       SELECT p.ordering_seq FROM outbox.commands p"
										  "        WHERE p.ordering_key OPERATOR(pg_catalog.=) $1"
										  "          AND p.decided_by OPERATOR(pg_catalog.=) $2"
										  KY_KEPT("p.")
										  "          AND p.status OPERATOR(pg_catalog.=) 'published'"
										  "        ORDER BY p.ordering_seq DESC LIMIT 1), 0)"
										  KY_KEPT("c.")
										  "   AND c.status OPERATOR(pg_catalog.<>) 'published'"
										  " ORDER BY c.ordering_seq LIMIT 1"
										  "   FOR NO KEY UPDATE OF c",
										  2, head_types),
							args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "outbox: look-up of the head of an ordering key failed");
	if (SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("ordering key \"%s\" has no unfinished command", text_to_cstring(key)),
				 errdetail("Every command of the key is published, or the key has none.")));
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	/* the result outlives the SPI connection */
	spi = MemoryContextSwitchTo(outer);
	command_id = DatumGetTextPCopy(SPI_getbinval(tup, desc, 1, &isnull));
	MemoryContextSwitchTo(spi);
	run_id = DatumGetTextPCopy(SPI_getbinval(tup, desc, 2, &isnull));
	status = TextDatumGetCString(SPI_getbinval(tup, desc, 3, &isnull));
	place.key = key;
	place.role = role;
	place.seq = DatumGetInt64(SPI_getbinval(tup, desc, 4, &isnull));
	/*
	 * The first command of the key in commands_key_idx waits: the head is
	 * pending and due, or sending (not in the index), so not dead.
	 */
	if (DatumGetBool(SPI_getbinval(tup, desc, 5, &isnull)))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the head of ordering key \"%s\" is pending or sending, not dead", text_to_cstring(key)),
				 errdetail("Command \"%s\" waits behind the head; nothing was skipped.", text_to_cstring(command_id)),
				 errhint("Only a dead head can be skipped; an uncertain one is resolved with outbox.resolve.")));
	if (strcmp(status, "dead") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the head of ordering key \"%s\" is %s, not dead", text_to_cstring(key), status),
				 errdetail("The head is command \"%s\"; nothing was skipped.", text_to_cstring(command_id)),
				 errhint("Only a dead head can be skipped; an uncertain one is resolved with outbox.resolve.")));

	/* the head's row is locked: now the key's lock (as ack takes them) */
	OutboxLockKeys(role, &key, 1);
	args[1] = PointerGetDatum(command_id);
	args[2] = PointerGetDatum(run_id);
	if (OutboxExecuteLatest(OutboxPrepare(&plan_skip,
										  "UPDATE outbox.commands c"
										  "   SET ordering_key = NULL, ordering_seq = NULL, ordering_tail = NULL,"
										  "       last_error = pg_catalog.concat_ws('; ', c.last_error,"
										  "           pg_catalog.format('skipped as the head of ordering key %s', $1))"
										  " WHERE c.command_id OPERATOR(pg_catalog.=) $2"
										  "   AND c.run_id OPERATOR(pg_catalog.=) $3",
										  3, skip_types),
							args, NULL, false, 0) != SPI_OK_UPDATE || SPI_processed != 1)
		elog(ERROR, "outbox: skip of the head of an ordering key failed");
	OutboxReleaseNext(&place, 1);
	SPI_finish();
	PG_RETURN_TEXT_P(command_id);
}

/* outbox.skip_head: the body, as the owner, told who called. */
Datum
outbox_skip_head(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, ky_skip_head);
}
