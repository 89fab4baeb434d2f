/*-------------------------------------------------------------------------
 *
 * lease.c
 *		The publisher API: claim, ack (single and batch), fail, renew, and
 *		the sweep of expired leases; the cut of error texts (also for the
 *		stream path, through outbox._error_text).
 *
 * Lease protocol.  Each claim gives a command a new lease (a new version)
 * and hands out a token, opaque text that carries the claiming role, the
 * version, the run_id and the command_id, and a MAC of them and of the
 * worker name under the database's lease key (le_make_token): the claim
 * writes nothing to the row that 0.1.0 did not write.  ack, fail and renew
 * take the worker name and the token; each first checks the token's MAC
 * for the caller's worker name and its role against the calling role (or
 * the caller is a member of this database's outbox admin role), then runs
 * one statement that finds the row by its primary key (the token's
 * command_id) and whose WHERE clause holds the rest of the lease: status =
 * 'sending', the token's run_id and version, owner = the caller's worker
 * name.  A claim, ack and fail bump version.  Two holders can therefore
 * never both change a row: whichever statement runs second finds a
 * different version or status (READ COMMITTED re-checks the WHERE clause on
 * the newest row version) and changes nothing, and the caller is told
 * OB001 (lease_not_owned), with nothing of the row's holder in the error.
 * renew extends lease_until and keeps the version: the holder keeps its
 * token.
 *
 * claim locks its candidates with FOR NO KEY UPDATE SKIP LOCKED, so
 * concurrent claimers never wait for each other and never lock the same
 * row; a row is claimable when it is pending and due (commands_claim_idx)
 * or sending with an expired lease (commands_lease_idx, a takeover).
 * Expired leases are taken over only while deliveries remain and the kind's
 * takeover mode is 'auto'; the others are settled by sweep (dead, or
 * uncertain for a manual kind), which the background worker runs.
 *
 * Ordering keys.  A command waiting behind an earlier one of its ordering
 * key is pending with due_at NULL, in no index claim reads: claim hands out
 * keys' heads only and knows nothing of keys beyond returning them.  The
 * ack of a head (ack, ack_many: their UPDATE returns the key, NULL for an
 * unordered command, which takes nothing more) releases the next command of
 * its key under the key's lock (OutboxReleaseNext, src/keys.c), or with
 * ack_handover leases it to the caller when a claim by the caller could
 * take it now (OutboxHandOverNext): a handed-over lease is an ordinary
 * lease, its token made as claim makes one.  fail, renew, sweep and
 * takeovers keep a head the head.
 *
 * Times.  Leases and availability are computed from the clock at the
 * moment of the call (GetCurrentTimestamp), not from the transaction start:
 * a claim inside a long transaction never hands out a lease that has
 * already expired.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relation.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_type.h"
#include "common/pg_prng.h"
#include "executor/tuptable.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "nodes/primnodes.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/relcache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_claim_1_0);
PG_FUNCTION_INFO_V1(outbox_ack_1_0);
PG_FUNCTION_INFO_V1(outbox_ack_many);
PG_FUNCTION_INFO_V1(outbox_ack_handover);
PG_FUNCTION_INFO_V1(outbox_rotate_lease_key);
PG_FUNCTION_INFO_V1(outbox_fail_1_0);
PG_FUNCTION_INFO_V1(outbox_renew_1_0);
PG_FUNCTION_INFO_V1(outbox_sweep);
PG_FUNCTION_INFO_V1(outbox_error_text);

static SPIPlanPtr plan_claim = NULL;
static SPIPlanPtr plan_claim_pending = NULL;
static SPIPlanPtr plan_ack = NULL;
static SPIPlanPtr plan_ack_many = NULL;
static SPIPlanPtr plan_ack_many_small = NULL;
static SPIPlanPtr plan_fail_lock = NULL;
static SPIPlanPtr plan_fail_set = NULL;
static SPIPlanPtr plan_renew = NULL;
static SPIPlanPtr plan_sweep = NULL;

/*
 * "The row is sending", for the statements that find their row by
 * command_id.  Written plainly (status = 'sending'), the test matches the
 * predicate of commands_lease_idx, and a plan made while that index is small
 * (an empty table) reads the whole index, filtering on command_id, instead
 * of probing the primary key; inside a CASE the planner cannot match it.
 */
#define LE_SENDING(alias) \
	"CASE WHEN " alias "status OPERATOR(pg_catalog.=) 'sending' THEN true ELSE false END"

/* The row's kind's max deliveries, or dflt (outbox.max_deliveries). */
#define LE_MAX_DELIVERIES(alias, dflt) \
	"COALESCE((SELECT p.max_deliveries FROM outbox.policies p" \
	"           WHERE p.kind OPERATOR(pg_catalog.=) " alias "kind), " dflt ")"

/* "The row's kind is in manual takeover mode." */
#define LE_MANUAL(alias) \
	"EXISTS (SELECT 1 FROM outbox.policies p" \
	"         WHERE p.kind OPERATOR(pg_catalog.=) " alias "kind" \
	"           AND p.takeover OPERATOR(pg_catalog.=) 'manual')"

/* The lease the caller did not name: outbox.default_lease, into *iv. */
static Datum
le_default_lease(Interval *iv)
{
	return IntervalPGetDatum(OutboxDefaultLease(iv));
}

/* Fetch and check a batch_size argument: 1 to outbox.max_batch. */
static int32
le_arg_batch(FunctionCallInfo fcinfo, int argno)
{
	int32		batch;

	OutboxArgNotNull(fcinfo, argno, "batch_size");
	batch = PG_GETARG_INT32(argno);
	if (batch < 1 || batch > outbox_max_batch)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch_size must be between 1 and %d", outbox_max_batch),
				 errdetail("The value was %d.", batch)));
	return batch;
}

/*
 * Fetch and check an optional lease argument, for a lease that starts at
 * now (OutboxLeaseEnd): NULL means "the default" and is returned as NULL.
 */
static Interval *
le_arg_lease(FunctionCallInfo fcinfo, int argno, TimestampTz now)
{
	Interval   *iv;

	if (PG_ARGISNULL(argno))
		return NULL;
	iv = PG_GETARG_INTERVAL_P(argno);
	(void) OutboxLeaseEnd(iv, now);
	return iv;
}

/* The latest end of a lease that starts at now: now + outbox.max_lease. */
static Datum
le_max_until(TimestampTz now)
{
	return TimestampTzGetDatum(now + (int64) outbox_max_lease_s * USECS_PER_SEC);
}

/*
 * Tokens.  A token is the text
 *
 *		<mac: 32 hex digits>:<role oid>:<version>:<run_id's length in bytes>:<run_id>:<command_id>
 *
 * for example 0f5c...9a3e:16384:2:5:run-1:cmd-1, where mac is the 128-bit
 * SipHash-2-4 (siphash.c), under the database's lease key, of the lease:
 * run_id, command_id, version, the claiming role and the worker name
 * (le_mac).  Only claim computes it; ack, fail and renew compute it again
 * from the token's fields and the caller's worker name, and compare in
 * constant time: a token nobody made, or one used under another worker
 * name, is refused before any row is read.  The row is then found by its
 * primary key and must hold the token's lease: sending, to this worker, at
 * the token's version.  One claim makes one version, so a MAC made for a
 * version is the MAC of the claim that made it; a claim, ack, fail or
 * sweep moves the version on and every older token fails.  The length makes
 * the split unambiguous whatever the ids hold.  Clients treat it as opaque.
 *
 * The lease key (16 random bytes, outbox.lease_key, made at install) is
 * read once per backend and kept until a relcache invalidation of its
 * table (outbox.rotate_lease_key() sends one).
 */
#define LE_MAC_LEN		16
#define LE_MAC_HEX		(2 * LE_MAC_LEN)
#define LE_TOKEN_MAX	(LE_MAC_HEX + 1 + 10 + 1 + 19 + 1 + 3 + 1 + OUTBOX_MAX_ID_LEN + 1 + OUTBOX_MAX_ID_LEN)

/* A token taken apart (pointing into the token's text). */
typedef struct LeToken
{
	unsigned char mac[LE_MAC_LEN];
	Oid			role;
	int64		version;
	const char *run_id;
	int			run_len;
	const char *command_id;
	int			cmd_len;
} LeToken;

static inline unsigned char *
le_put32(unsigned char *p, uint32 v)
{
	p[0] = (unsigned char) v;
	p[1] = (unsigned char) (v >> 8);
	p[2] = (unsigned char) (v >> 16);
	p[3] = (unsigned char) (v >> 24);
	return p + 4;
}

/*
 * The MAC of a lease into mac: SipHash-2-4-128 under key of the
 * length-prefixed run_id, command_id and worker, the version and the role.
 */
static void
le_mac(const unsigned char *key, const char *run_id, int run_len,
	   const char *command_id, int cmd_len, int64 version, Oid role,
	   const char *worker, int worker_len, unsigned char *mac)
{
	unsigned char msg[3 * 4 + 3 * OUTBOX_MAX_ID_LEN + 8 + 4];
	unsigned char *p = msg;

	Assert(run_len <= OUTBOX_MAX_ID_LEN && cmd_len <= OUTBOX_MAX_ID_LEN &&
		   worker_len <= OUTBOX_MAX_ID_LEN);
	p = le_put32(p, (uint32) run_len);
	memcpy(p, run_id, run_len);
	p += run_len;
	p = le_put32(p, (uint32) cmd_len);
	memcpy(p, command_id, cmd_len);
	p += cmd_len;
	p = le_put32(p, (uint32) (((uint64) version) & 0xFFFFFFFF));
	p = le_put32(p, (uint32) (((uint64) version) >> 32));
	p = le_put32(p, (uint32) role);
	p = le_put32(p, (uint32) worker_len);
	memcpy(p, worker, worker_len);
	p += worker_len;
	OutboxSipHash(key, msg, p - msg, mac, LE_MAC_LEN);
}

/* The token of a lease that claim made (key: the lease key). */
static text *
le_make_token(const unsigned char *key, text *run_id, text *command_id,
			  int64 version, Oid role, text *worker)
{
	int			rl = VARSIZE_ANY_EXHDR(run_id);
	int			cl = VARSIZE_ANY_EXHDR(command_id);
	unsigned char mac[LE_MAC_LEN];
	char		head[LE_MAC_HEX + 48];
	int			hl;
	text	   *t;
	char	   *p;

	le_mac(key, VARDATA_ANY(run_id), rl, VARDATA_ANY(command_id), cl, version, role,
		   VARDATA_ANY(worker), VARSIZE_ANY_EXHDR(worker), mac);
	hex_encode((const char *) mac, LE_MAC_LEN, head);
	hl = LE_MAC_HEX + snprintf(head + LE_MAC_HEX, sizeof(head) - LE_MAC_HEX,
							   ":%u:" INT64_FORMAT ":%d:", role, version, rl);
	t = palloc(VARHDRSZ + hl + rl + 1 + cl);
	SET_VARSIZE(t, VARHDRSZ + hl + rl + 1 + cl);
	p = VARDATA(t);
	memcpy(p, head, hl);
	memcpy(p + hl, VARDATA_ANY(run_id), rl);
	p[hl + rl] = ':';
	memcpy(p + hl + rl + 1, VARDATA_ANY(command_id), cl);
	return t;
}

/* Take a token apart; false when it is not in the form claim makes. */
static bool
le_parse_token(text *token, LeToken *tok)
{
	const char *s = VARDATA_ANY(token);
	int			len = VARSIZE_ANY_EXHDR(token);
	int			pos = LE_MAC_HEX;
	uint64		v;
	int			rl;

	if (len < LE_MAC_HEX + 10 || len > LE_TOKEN_MAX)
		return false;
	if (!OutboxTokenMac(s, tok->mac, LE_MAC_LEN))
		return false;
	if (s[pos++] != ':')
		return false;
	if (!OutboxTokenNumber(s, len, &pos, 10, PG_UINT32_MAX, &v) || v == InvalidOid)
		return false;
	tok->role = (Oid) v;
	if (!OutboxTokenNumber(s, len, &pos, 19, PG_INT64_MAX, &v) || v < 1)
		return false;
	tok->version = (int64) v;
	if (!OutboxTokenNumber(s, len, &pos, 3, OUTBOX_MAX_ID_LEN, &v) || v < 1)
		return false;
	rl = (int) v;
	/* the run_id, its ':', and a command_id of 1 to OUTBOX_MAX_ID_LEN bytes */
	if (len - pos < rl + 2 || s[pos + rl] != ':' || len - pos - rl - 1 > OUTBOX_MAX_ID_LEN)
		return false;
	tok->run_id = s + pos;
	tok->run_len = rl;
	tok->command_id = s + pos + rl + 1;
	tok->cmd_len = len - pos - rl - 1;
	return pg_verifymbstr(tok->run_id, tok->run_len, true) &&
		pg_verifymbstr(tok->command_id, tok->cmd_len, true);
}

/* Fetch a token argument (22004 if NULL); false if it is malformed. */
static bool
le_arg_token(FunctionCallInfo fcinfo, int argno, LeToken *tok)
{
	OutboxArgNotNull(fcinfo, argno, "token");
	return le_parse_token(PG_GETARG_TEXT_PP(argno), tok);
}

/*
 * Whether a token (taken apart) is one claim made for this worker name, and
 * its role is the caller's (a role the caller has the privileges of) or the
 * caller is an outbox admin (asked only when the role is another's).  The MAC is compared in constant time.  Whether
 * the lease is still the row's is for the statement to say (version).  key
 * is the lease key (OutboxLeaseKey).
 */
static bool
le_token_holds(const unsigned char *key, const LeToken *tok, text *worker, Oid caller)
{
	unsigned char mac[LE_MAC_LEN];

	le_mac(key, tok->run_id, tok->run_len, tok->command_id, tok->cmd_len,
		   tok->version, tok->role, VARDATA_ANY(worker), VARSIZE_ANY_EXHDR(worker), mac);
	if (timingsafe_bcmp(mac, tok->mac, LE_MAC_LEN) != 0)
		return false;
	return tok->role == caller || has_privs_of_role(caller, tok->role) ||
		OutboxIsAdmin(caller);
}

/*
 * outbox.rotate_lease_key(): replace the database's lease key with 16 new
 * random bytes (pg_strong_random) and tell every backend at commit (a
 * relcache invalidation of outbox.lease_key).  Every token handed out
 * before is refused from then on (OB001); the leases run to their end and
 * are then taken over.  Admins only.
 */
static Datum
le_rotate_lease_key(FunctionCallInfo fcinfo, Oid caller)
{
	static SPIPlanPtr plan_rotate = NULL;
	static const Oid argtypes[2] = {BYTEAOID, TIMESTAMPTZOID};
	bytea	   *k = palloc(VARHDRSZ + OUTBOX_LEASE_KEY_LEN);
	Datum		args[2];
	Oid			relid;

	SET_VARSIZE(k, VARHDRSZ + OUTBOX_LEASE_KEY_LEN);
	if (!pg_strong_random(VARDATA(k), OUTBOX_LEASE_KEY_LEN))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate a random lease key")));
	args[0] = PointerGetDatum(k);
	/* now(), passed in: Citus refuses a function in the reference table's DO UPDATE */
	args[1] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	relid = get_relname_relid("lease_key", get_namespace_oid("outbox", false));
	/* wait for the holders of ordering keys' locks (OutboxKeyLockKey, src/leasekey.c) */
	if (OidIsValid(relid))
		LockRelationOid(relid, ExclusiveLock);
	SPI_connect();
	if (OutboxExecute(OutboxPrepare(&plan_rotate,
									"INSERT INTO outbox.lease_key AS k (key, made_at) VALUES ($1, $2)"
									" ON CONFLICT (one) DO UPDATE"
									"   SET key = EXCLUDED.key, made_at = EXCLUDED.made_at",
									2, argtypes),
					  args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "outbox: rotation of the lease key failed");
	SPI_finish();
	if (OidIsValid(relid))
		CacheInvalidateRelcacheByRelid(relid);
	OutboxForgetLeaseKey();
	PG_RETURN_VOID();
}

/* outbox.rotate_lease_key: the body, as the owner, told who called. */
Datum
outbox_rotate_lease_key(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, le_rotate_lease_key);
}

/*
 * Raise OB001 (lease_not_owned) for worker's call with a token naming
 * command_id (NULL: a malformed token).  The error says nothing of the
 * row: not who holds it, at what version, nor the token.  Counts the
 * refusal.
 */
static void
le_raise_not_owned(text *worker, const LeToken *tok)
{
	char	   *wname = text_to_cstring(worker);

	OutboxCountNow(OBC_STALE_REFUSED, 1);
	if (tok == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUTBOX_LEASE_NOT_OWNED),
				 errmsg("lease_not_owned: worker \"%s\" does not hold the command of an invalid token", wname),
				 errdetail("The token is not in the form outbox.claim returns.")));
	ereport(ERROR,
			(errcode(ERRCODE_OUTBOX_LEASE_NOT_OWNED),
			 errmsg("lease_not_owned: worker \"%s\" does not hold command \"%s\"",
					wname, pnstrdup(tok->command_id, tok->cmd_len)),
			 errdetail("The token is not that of a lease this worker and role hold: the lease was taken over or has ended, or the token is wrong.")));
}

/* A row a claim leased (its RETURNING columns, deformed once), in claim order. */
#define LE_CLAIM_COLS 15		/* 11 lease columns (a NULL in the token's
								 * place), takeover, priority, available_at,
								 * created_at */
#define LE_CLAIM_TOKEN 5		/* where the token goes */
typedef struct LeClaimed
{
	Datum		values[LE_CLAIM_COLS];
	bool		isnull[LE_CLAIM_COLS];
	bool		takeover;
	int32		priority;
	TimestampTz available_at;
	TimestampTz created_at;
} LeClaimed;

/* qsort comparator of LeClaimed: takeovers, priority (higher first), availability, age. */
static int
le_cmp_claimed(const void *a, const void *b)
{
	const LeClaimed *x = (const LeClaimed *) a;
	const LeClaimed *y = (const LeClaimed *) b;

	if (x->takeover != y->takeover)
		return x->takeover ? -1 : 1;
	if (x->priority != y->priority)
		return x->priority > y->priority ? -1 : 1;
	if (x->available_at != y->available_at)
		return x->available_at < y->available_at ? -1 : 1;
	if (x->created_at != y->created_at)
		return x->created_at < y->created_at ? -1 : 1;
	return 0;
}

/*
 * Whether idx is the index the extension made as commands_lease_idx: a
 * B-tree keyed on lease_until alone (its non-key INCLUDE column, the kind
 * the metrics read, does not matter to the probe), without expressions,
 * over the rows that satisfy status = 'sending'.  A different index under
 * that name (made by hand) could hold fewer rows, and the probe would then
 * miss leases.
 */
static bool
le_is_lease_index(Relation rel, Relation idx)
{
	Form_pg_index ix = idx->rd_index;
	List	   *pred;
	OpExpr	   *op;
	Node	   *left;
	Var		   *var;
	Const	   *val;

	if (idx->rd_rel->relkind != RELKIND_INDEX || idx->rd_rel->relam != BTREE_AM_OID ||
		ix->indrelid != RelationGetRelid(rel) || !ix->indisvalid || ix->indcheckxmin ||
		ix->indnkeyatts != 1 ||
		ix->indkey.values[0] != get_attnum(RelationGetRelid(rel), "lease_until") ||
		RelationGetIndexExpressions(idx) != NIL)
		return false;
	pred = RelationGetIndexPredicate(idx);
	if (list_length(pred) != 1 || !IsA(linitial(pred), OpExpr))
		return false;
	op = linitial_node(OpExpr, pred);
	if (op->opno != TextEqualOperator || list_length(op->args) != 2)
		return false;
	/* status is of the domain command_status: text = text on (status)::text */
	left = linitial(op->args);
	if (IsA(left, RelabelType))
		left = (Node *) ((RelabelType *) left)->arg;
	if (!IsA(left, Var) || !IsA(lsecond(op->args), Const))
		return false;
	var = (Var *) left;
	val = lsecond_node(Const, op->args);
	return var->varattno == get_attnum(RelationGetRelid(rel), "status") &&
		val->consttype == TEXTOID && !val->constisnull &&
		strcmp(TextDatumGetCString(val->constvalue), "sending") == 0;
}

/*
 * Whether outbox.commands holds a sending row, visible to a snapshot taken
 * now, whose lease ended at or before now: the first entry of
 * commands_lease_idx (sending rows by lease end) up to now.  A direct index
 * probe, because a query costs more to start than the takeover part it
 * saves.  When the index is not there to look at (dropped, being swapped by
 * a concurrent rebuild, or replaced by another index of that name), the
 * answer is yes and the claim runs the statement that looks.
 */
static bool
le_any_expired(TimestampTz now)
{
	static Oid	checked_idx = InvalidOid;	/* last index le_is_lease_index passed */
	Oid			nsp = get_namespace_oid("outbox", false);
	Oid			relid = get_relname_relid("commands", nsp);
	Oid			idxid = get_relname_relid("commands_lease_idx", nsp);
	Relation	rel;
	Relation	idx;
	IndexScanDesc scan;
	ScanKeyData key;
	TupleTableSlot *slot;
	bool		found;

	if (!OidIsValid(relid) || !OidIsValid(idxid))
		return true;
	rel = table_open(relid, AccessShareLock);

	/*
	 * An index upkeep's REINDEX CONCURRENTLY may rename and drop the index
	 * between the name lookup and this lock: then look no further.  The
	 * definition is checked once per index (a rebuild makes a new one).
	 */
	idx = try_relation_open(idxid, AccessShareLock);
	if (idx == NULL)
	{
		table_close(rel, AccessShareLock);
		return true;
	}
	if (idxid != checked_idx || !idx->rd_index->indisvalid)
	{
		if (!le_is_lease_index(rel, idx))
		{
			relation_close(idx, AccessShareLock);
			table_close(rel, AccessShareLock);
			return true;
		}
		checked_idx = idxid;
	}

	/*
	 * The snapshot the claim's statement would take (in READ COMMITTED a new
	 * one, not the one the calling statement started with).
	 */
	PushActiveSnapshot(GetTransactionSnapshot());
	ScanKeyInit(&key, 1, BTLessEqualStrategyNumber, F_TIMESTAMPTZ_LE,
				TimestampTzGetDatum(now));
	slot = table_slot_create(rel, NULL);
	scan = index_beginscan(rel, idx, GetActiveSnapshot(), 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	PopActiveSnapshot();
	relation_close(idx, NoLock);
	table_close(rel, NoLock);
	return found;
}

/*
 * The two claim statements share their pending part: pd locks up to limit
 * due pending commands of the asked, unpaused kinds the caller ($8) may
 * claim (outbox.policies.claimers, read like the paused kinds), in claim
 * order; the
 * UPDATE leases the rows whose ctids are tids to $1 and returns the
 * LE_CLAIM_COLS columns, takeover saying whether the row was taken over.
 */
#define LE_CLAIM_PENDING(limit) \
	" pd AS MATERIALIZED (SELECT ARRAY(" \
	"  SELECT c.ctid FROM outbox.commands c" \
	"   WHERE c.due_at OPERATOR(pg_catalog.<=) $5" \
	"     AND ($4 IS NULL OR c.kind OPERATOR(pg_catalog.=) ANY ($4))" \
	"     AND c.kind OPERATOR(pg_catalog.<>) ALL ((SELECT COALESCE(pg_catalog.array_agg(x.kind)," \
	"            '{}') FROM (SELECT p.kind FROM outbox.policies p WHERE p.paused" \
	"                        UNION ALL SELECT p.kind FROM outbox.policies p" \
	"                         WHERE p.claimers IS NOT NULL AND NOT outbox._may(p.claimers, $8)) x" \
	"            )::pg_catalog.text[])" \
	"   ORDER BY c.priority DESC, c.due_at, c.created_at" \
	"   LIMIT " limit \
	"   FOR NO KEY UPDATE OF c SKIP LOCKED) AS tids)"
#define LE_CLAIM_UPDATE(tids, takeover) \
	"UPDATE outbox.commands t" \
	"   SET status = 'sending', owner = $1, due_at = NULL," \
	"       lease_until = LEAST($5 OPERATOR(pg_catalog.+) COALESCE($3," \
	"           (SELECT p.lease FROM outbox.policies p" \
	"             WHERE p.kind OPERATOR(pg_catalog.=) t.kind), $6), $9)," \
	"       version = t.version OPERATOR(pg_catalog.+) 1," \
	"       deliveries = t.deliveries OPERATOR(pg_catalog.+) 1" \
	" WHERE t.ctid OPERATOR(pg_catalog.=) ANY (" tids ")" \
	" RETURNING t.command_id, t.run_id, t.seq, t.kind, t.payload, NULL::pg_catalog.text," \
	"           t.version, t.deliveries, t.lease_until, t.headers, t.ordering_key, " takeover "," \
	"           t.priority, t.available_at, t.created_at"

/*
 * The claim statement with the takeover part: tk locks up to $2 expired
 * leases, pd fills the rest of the batch with due pending commands.
 */
#define LE_CLAIM_TAKEOVER \
	"WITH tk AS MATERIALIZED (" \
	" SELECT COALESCE(pg_catalog.array_agg(l.tid), '{}') AS tids," \
	"        COALESCE(pg_catalog.array_agg(l.id), '{}') AS ids FROM (" \
	"  SELECT c.ctid AS tid, c.command_id AS id FROM outbox.commands c" \
	"   WHERE c.status OPERATOR(pg_catalog.=) 'sending'" \
	"     AND c.lease_until OPERATOR(pg_catalog.<=) $5" \
	"     AND ($4 IS NULL OR c.kind OPERATOR(pg_catalog.=) ANY ($4))" \
	"     AND c.deliveries OPERATOR(pg_catalog.<) " LE_MAX_DELIVERIES("c.", "$7") \
	"     AND NOT EXISTS (SELECT 1 FROM outbox.policies p" \
	"                      WHERE p.kind OPERATOR(pg_catalog.=) c.kind" \
	"                        AND (p.paused OR p.takeover OPERATOR(pg_catalog.=) 'manual'" \
	"                             OR (p.claimers IS NOT NULL AND NOT outbox._may(p.claimers, $8))))" \
	"   ORDER BY c.lease_until" \
	"   LIMIT $2" \
	"   FOR NO KEY UPDATE OF c SKIP LOCKED) l)," \
	LE_CLAIM_PENDING("($2 OPERATOR(pg_catalog.-) pg_catalog.cardinality((SELECT ids FROM tk)))") \
	LE_CLAIM_UPDATE("(SELECT tids FROM tk) OPERATOR(pg_catalog.||) (SELECT tids FROM pd)", \
	"t.command_id OPERATOR(pg_catalog.=) ANY ((SELECT ids FROM tk)::pg_catalog.text[])")

/* The argument types of the claim statements. */
static const Oid le_claim_types[9] = {TEXTOID, INT4OID, INTERVALOID, TEXTARRAYOID,
TIMESTAMPTZOID, INTERVALOID, INT4OID, OIDOID, TIMESTAMPTZOID};

/*
 * Append the rows of the claim statement just run (SPI_tuptable) to
 * *order, which holds n rows, each with its token; returns the new count.
 */
static uint64
le_take_claimed(LeClaimed **order, uint64 n, const unsigned char *key,
				Oid caller, text *worker)
{
	uint64		i;

	if (SPI_tuptable->tupdesc->natts != LE_CLAIM_COLS)
		elog(ERROR, "outbox: claim returned %d columns", SPI_tuptable->tupdesc->natts);
	if (*order == NULL)
		*order = palloc(sizeof(LeClaimed) * (SPI_processed + 1));
	else
		*order = repalloc(*order, sizeof(LeClaimed) * (n + SPI_processed + 1));
	for (i = 0; i < SPI_processed; i++)
	{
		LeClaimed  *c = &(*order)[n + i];

		heap_deform_tuple(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, c->values, c->isnull);
		c->takeover = DatumGetBool(c->values[11]);
		c->priority = DatumGetInt32(c->values[12]);
		c->available_at = DatumGetTimestampTz(c->values[13]);
		c->created_at = DatumGetTimestampTz(c->values[14]);
		c->values[LE_CLAIM_TOKEN] =
			PointerGetDatum(le_make_token(key,
										  DatumGetTextPP(c->values[1]),
										  DatumGetTextPP(c->values[0]),
										  DatumGetInt64(c->values[6]),
										  caller, worker));
		c->isnull[LE_CLAIM_TOKEN] = false;
	}
	return n + SPI_processed;
}

/*
 * The claim of a distributed outbox (docs/citus.md): the takeover statement
 * run on each of this node's shards of outbox.commands in turn, against
 * the shard's own table (src/citus.c), until the batch is full.  Each call
 * starts one shard further, so that no shard waits behind the others.  The
 * takeover part always runs: the look at commands_lease_idx would read the
 * distributed table's empty shell.
 */
static uint64
le_claim_shards(Datum *args, const char *nulls, int32 batch,
				const unsigned char *key, Oid caller, text *worker,
				LeClaimed **order)
{
	static uint32 next_shard = 0;
	int			nshards;
	int			k;
	uint64		n = 0;
	OutboxShard *shards = OutboxCitusLocalShards(&nshards, true);

	for (k = 0; k < nshards && n < (uint64) batch; k++)
	{
		OutboxShard *sh = &shards[(next_shard + k) % nshards];
		int			ret;

		args[1] = Int32GetDatum(batch - (int32) n);
		ret = OutboxExecute(OutboxCitusShardPlan(sh, LE_CLAIM_TAKEOVER, 9, le_claim_types),
							args, nulls, false, 0);
		if (ret != SPI_OK_UPDATE_RETURNING)
			elog(ERROR, "outbox: claim failed: %s", SPI_result_code_string(ret));
		n = le_take_claimed(order, n, key, caller, worker);
	}
	next_shard++;
	args[1] = Int32GetDatum(batch);
	return n;
}

/*
 * outbox.claim(worker, batch_size, lease, kinds)
 *
 * One statement locks up to batch_size expired leases (takeovers) and then
 * as many due pending commands as the batch still has room for, and leases
 * them all to worker.  A look at commands_lease_idx comes first; when no
 * lease has expired, the statement without the takeover part runs.
 *
 * The UPDATE finds the rows the index scans locked by their ctid (a TID
 * scan), not by a second primary-key lookup of each command_id.  A locked
 * row version cannot be updated, moved or removed by anyone else until this
 * transaction ends, so its ctid stays its own.  One case differs from a
 * lookup by key: when the row was changed by a transaction that committed
 * after this statement's snapshot (and still qualifies), the locking scan
 * locks and lists its newest version, which the UPDATE's snapshot cannot
 * see, so the UPDATE leaves it alone.  The command stays as it was, locked
 * until this transaction ends, and the claim returns fewer rows than it
 * locked (that row took a place in the batch); the next claim takes it.
 * Through the API this needs a commit that makes a row claimable again
 * (fail, requeue, resolve) between the snapshot and the lock: rare, and never
 * a loss or a second lease.
 */
static Datum
le_claim(FunctionCallInfo fcinfo, Oid caller)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *worker = OutboxArgId(fcinfo, 0, "worker");
	int32		batch;
	Interval   *lease;
	Interval	default_lease;
	Datum		args[9];
	char		nulls[9] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	int			ret;
	uint64		i;
	uint64		n;
	int64		takeovers = 0;
	LeClaimed  *order = NULL;
	const unsigned char *key;
	TimestampTz now = GetCurrentTimestamp();

	batch = le_arg_batch(fcinfo, 1);
	lease = le_arg_lease(fcinfo, 2, now);
	if (!PG_ARGISNULL(3))
	{
		ArrayType  *kinds = PG_GETARG_ARRAYTYPE_P(3);

		if (ARR_NDIM(kinds) > 1)
			ereport(ERROR,
					(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
					 errmsg("kinds must be a one-dimensional array")));
		if (array_contains_nulls(kinds))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("kinds must not contain nulls")));
		args[3] = PointerGetDatum(kinds);
	}
	else
		nulls[3] = 'n';

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);

	args[0] = PointerGetDatum(worker);
	args[1] = Int32GetDatum(batch);
	args[2] = lease ? IntervalPGetDatum(lease) : (Datum) 0;
	if (lease == NULL)
		nulls[2] = 'n';
	args[4] = TimestampTzGetDatum(now);
	args[5] = le_default_lease(&default_lease);
	args[6] = Int32GetDatum(outbox_max_deliveries);
	args[7] = ObjectIdGetDatum(caller);
	args[8] = le_max_until(now);

	SPI_connect();
	key = OutboxLeaseKey();

	/* Naming a kind the caller may not claim is refused (42501). */
	if (!PG_ARGISNULL(3))
		OutboxCheckClaimable(DatumGetArrayTypeP(args[3]), caller);

	/*
	 * Is any lease expired?  Usually not, and then the claim runs the plan
	 * without the takeover part (leaving its start-up and run out gave 5-7%
	 * more throughput at a batch of 10).  A lease that expires or is
	 * committed after this look is taken over by the next claim.
	 */
	if (OutboxCitusDistributed())
		n = le_claim_shards(args, nulls, batch, key, caller, worker, &order);
	else
	{
		if (le_any_expired(DatumGetTimestampTz(args[4])))
			ret = OutboxExecute(OutboxPrepare(&plan_claim, LE_CLAIM_TAKEOVER, 9, le_claim_types),
								args, nulls, false, 0);
		else
			ret = OutboxExecute(OutboxPrepare(&plan_claim_pending,
											  "WITH" LE_CLAIM_PENDING("$2")
											  LE_CLAIM_UPDATE("(SELECT tids FROM pd)::pg_catalog.tid[]", "false"),
											  9, le_claim_types),
								args, nulls, false, 0);
		if (ret != SPI_OK_UPDATE_RETURNING)
			elog(ERROR, "outbox: claim failed: %s", SPI_result_code_string(ret));
		n = le_take_claimed(&order, 0, key, caller, worker);
	}

	/*
	 * Hand the batch out in claim order (the UPDATE returns it in physical
	 * order): takeovers first, then by priority, availability and age.
	 */
	qsort(order, n, sizeof(LeClaimed), le_cmp_claimed);
	/* the result type has the first 11 columns */
	for (i = 0; i < n; i++)
	{
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, order[i].values, order[i].isnull);
		if (order[i].takeover)
			takeovers++;
	}
	OutboxCountAtCommit(OBC_CLAIMED, (int64) n);
	if (n == 0 && PG_ARGISNULL(3))
		OutboxNoteIdleClaim();
	if (takeovers > 0)
		OutboxCountAtCommit(OBC_TAKEN_OVER, takeovers);
	SPI_finish();

	return (Datum) 0;
}

/* outbox.claim: the body, as the owner, told who called. */
Datum
outbox_claim_1_0(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, le_claim);
}

/* outbox.ack(worker, token): mark one leased command published. */
static Datum
le_ack(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid argtypes[5] = {TEXTOID, INT8OID, TEXTOID, TEXTOID, TIMESTAMPTZOID};
	text	   *worker = OutboxArgId(fcinfo, 0, "worker");
	LeToken		tok;
	Datum		args[5];
	int			ret;
	bool		isnull;
	Datum		okey;

	if (!le_arg_token(fcinfo, 1, &tok))
		le_raise_not_owned(worker, NULL);
	SPI_connect();
	if (!le_token_holds(OutboxLeaseKey(), &tok, worker, caller))
		le_raise_not_owned(worker, &tok);
	args[0] = PointerGetDatum(cstring_to_text_with_len(tok.command_id, tok.cmd_len));
	args[1] = Int64GetDatum(tok.version);
	args[2] = PointerGetDatum(cstring_to_text_with_len(tok.run_id, tok.run_len));
	args[3] = PointerGetDatum(worker);
	args[4] = TimestampTzGetDatum(GetCurrentTimestamp());
	ret = OutboxExecute(OutboxPrepare(&plan_ack,
									  "UPDATE outbox.commands"
									  "   SET status = 'published', published_at = $5, lease_until = NULL,"
									  "       version = version OPERATOR(pg_catalog.+) 1"
									  " WHERE command_id OPERATOR(pg_catalog.=) $1"
									  "   AND version OPERATOR(pg_catalog.=) $2"
									  "   AND run_id OPERATOR(pg_catalog.=) $3"
									  "   AND owner OPERATOR(pg_catalog.=) $4"
									  "   AND " LE_SENDING("")
									  " RETURNING ordering_key, ordering_seq, decided_by",
									  5, argtypes),
						args, NULL, false, 0);
	if (ret != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "outbox: ack failed: %s", SPI_result_code_string(ret));
	if (SPI_processed != 1)
		le_raise_not_owned(worker, &tok);
	/* The head of an ordering key releases the next command (src/keys.c). */
	okey = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
	{
		OutboxKeyPlace place;

		place.key = DatumGetTextPCopy(okey);
		place.seq = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
												SPI_tuptable->tupdesc, 2, &isnull));
		place.role = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
													SPI_tuptable->tupdesc, 3, &isnull));
		OutboxReleaseNext(&place, 1);
	}
	SPI_finish();

	OutboxCountAtCommit(OBC_ACKED, 1);
	PG_RETURN_VOID();
}

/* outbox.ack: the body, as the owner, told who called. */
Datum
outbox_ack_1_0(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, le_ack);
}

/* A row the batch ack's UPDATE took (used: matched to a token already). */
typedef struct LeTaken
{
	text	   *command_id;
	int64		version;		/* the lease's, before the ack */
	Datum		run_id;
	bool		used;
} LeTaken;

/* qsort/bsearch comparator of LeTaken by command_id and version. */
static int
le_cmp_taken(const void *a, const void *b)
{
	const LeTaken *x = (const LeTaken *) a;
	const LeTaken *y = (const LeTaken *) b;
	int			c = OutboxCompareIds(x->command_id, y->command_id);

	if (c != 0)
		return c;
	if (x->version != y->version)
		return x->version < y->version ? -1 : 1;
	return 0;
}

/* A held token of a batch ack: its place in the call, and its version. */
typedef struct LeHeld
{
	int			idx;
	int64		version;
} LeHeld;

/* qsort comparator of LeHeld: by version, then by place. */
static int
le_cmp_held(const void *a, const void *b)
{
	const LeHeld *x = (const LeHeld *) a;
	const LeHeld *y = (const LeHeld *) b;

	if (x->version != y->version)
		return x->version < y->version ? -1 : 1;
	return x->idx - y->idx;
}

/*
 * outbox.ack_many(worker, tokens): the batch form.  Each token's MAC and
 * role are checked first (le_token_holds), as ack does; the tokens that
 * pass are acked by UPDATEs that read their rows by key (commands_pkey,
 * command_id = ANY) and test each row's version, run_id, worker and status
 * against the tokens:
 *
 * - up to LE_ACK_MANY_SMALL tokens of at most LE_ACK_MANY_VERSIONS distinct
 *   versions (a relay's batch is mostly of one: the first claim of each
 *   command), one UPDATE per version, testing version = that version and
 *   the run_id with = ANY (at most that many comparisons a row, which up to
 *   this size cost less than setting up a join).  All the tokens of one
 *   statement have its version, so a row is taken only at the version of
 *   the token that names it;
 * - otherwise, the rows are joined to the tokens on command_id, version and
 *   run_id as a hash join (see OutboxExecuteHashJoin): each side read once.
 *
 * A token is acked when an UPDATE took the row it names at its version.  A
 * token repeated in the call is acked once; the repeat reports
 * lease_not_owned.  The UPDATEs test the status with LE_SENDING: written
 * plainly, the test would match the predicate of commands_lease_idx, and the
 * planner could read the rows from a scan of that whole index.
 */
#define LE_ACK_MANY_SMALL	128
#define LE_ACK_MANY_VERSIONS 4

/* The columns of outbox.handover_result: ack_result's, then lease's but its first two. */
#define LE_HANDOVER_COLS 13

/*
 * The body of ack_many and, with handover, of ack_handover(worker, tokens,
 * batch_size, lease, kinds): the heads acked hand their keys' next commands
 * over to the caller where a claim of (batch_size, lease, kinds) by the
 * caller could lease them now (OutboxHandOverNext, src/keys.c), and the
 * result has a row per token (the ack_result's columns, the lease's NULL)
 * followed by a row per lease handed over (its acked and reason NULL, its
 * token made as claim makes one).  On a distributed outbox nothing is
 * handed over.
 */
static Datum
le_ack_body(FunctionCallInfo fcinfo, Oid caller, bool handover)
{
	static const Oid small_types[5] = {TEXTOID, TEXTARRAYOID, INT8OID, TEXTARRAYOID,
	TIMESTAMPTZOID};
	static const Oid join_types[5] = {TEXTOID, TEXTARRAYOID, INT8ARRAYOID, TEXTARRAYOID,
	TIMESTAMPTZOID};
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	text	   *worker = OutboxArgId(fcinfo, 0, "worker");
	ArrayType  *tokens;
	Datum	   *elems;
	bool	   *enulls;
	int			n;
	int			nheld = 0;
	int			nversions = 0;
	int			i;
	int			g;
	LeToken    *toks;
	bool	   *valid;
	bool	   *held;
	text	  **cmds;
	LeHeld	   *hs;
	Datum	   *ids;
	Datum	   *versions;
	Datum	   *runs;
	Datum		args[5];
	int			ret;
	uint64		nacked = 0;
	LeTaken    *taken;
	OutboxKeyPlace *places;
	int			nplaces = 0;
	int64		nok = 0;
	const unsigned char *key;
	TimestampTz now = GetCurrentTimestamp();
	OutboxHandOver ho;
	Interval   *lease = NULL;
	Interval	default_lease;
	SPITupleTable *handed = NULL;
	uint64		nhanded = 0;
	int64		nleased = 0;

	OutboxArgNotNull(fcinfo, 1, "tokens");
	tokens = PG_GETARG_ARRAYTYPE_P(1);
	memset(&ho, 0, sizeof(ho));
	if (handover)
	{
		ho.limit = le_arg_batch(fcinfo, 2);
		lease = le_arg_lease(fcinfo, 3, now);
		if (!PG_ARGISNULL(4))
		{
			ho.kinds = PG_GETARG_ARRAYTYPE_P(4);
			if (ARR_NDIM(ho.kinds) > 1)
				ereport(ERROR,
						(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
						 errmsg("kinds must be a one-dimensional array")));
			if (array_contains_nulls(ho.kinds))
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("kinds must not contain nulls")));
		}
		ho.worker = worker;
		ho.caller = caller;
		ho.lease = lease ? IntervalPGetDatum(lease) : (Datum) 0;
		ho.default_lease = le_default_lease(&default_lease);
		ho.max_until = le_max_until(now);
		ho.now = now;
	}
	if (ARR_NDIM(tokens) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("tokens must be a one-dimensional array")));
	deconstruct_array(tokens, TEXTOID, -1, false, TYPALIGN_INT, &elems, &enulls, &n);
	if (n > outbox_max_batch)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("too many tokens in one ack_many"),
				 errdetail("The call has %d tokens; outbox.max_batch is %d.",
						   n, outbox_max_batch)));
	for (i = 0; i < n; i++)
		if (enulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("tokens must not contain nulls"),
					 errdetail("Element %d is null.", i + 1)));

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (n == 0)
	{
		/* naming a kind the caller may not claim is refused all the same */
		if (ho.kinds != NULL)
		{
			SPI_connect();
			OutboxCheckClaimable(ho.kinds, caller);
			SPI_finish();
		}
		return (Datum) 0;
	}

	toks = palloc(sizeof(LeToken) * n);
	valid = palloc(sizeof(bool) * n);
	held = palloc0(sizeof(bool) * n);
	cmds = palloc0(sizeof(text *) * n);
	hs = palloc(sizeof(LeHeld) * n);
	for (i = 0; i < n; i++)
		valid[i] = le_parse_token(DatumGetTextPP(elems[i]), &toks[i]);

	SPI_connect();
	key = OutboxLeaseKey();
	/* Naming a kind the caller may not claim is refused (42501), as claim does. */
	if (ho.kinds != NULL)
		OutboxCheckClaimable(ho.kinds, caller);
	for (i = 0; i < n; i++)
	{
		if (!valid[i])
			continue;
		cmds[i] = cstring_to_text_with_len(toks[i].command_id, toks[i].cmd_len);
		held[i] = le_token_holds(key, &toks[i], worker, caller);
		if (!held[i])
			continue;
		hs[nheld].idx = i;
		hs[nheld].version = toks[i].version;
		nheld++;
	}
	qsort(hs, nheld, sizeof(LeHeld), le_cmp_held);
	for (i = 0; i < nheld; i++)
		if (i == 0 || hs[i].version != hs[i - 1].version)
			nversions++;

	taken = palloc(sizeof(LeTaken) * (nheld + 1));
	ids = palloc(sizeof(Datum) * (nheld + 1));
	versions = palloc(sizeof(Datum) * (nheld + 1));
	runs = palloc(sizeof(Datum) * (nheld + 1));
	places = palloc(sizeof(OutboxKeyPlace) * (nheld + 1));
	args[0] = PointerGetDatum(worker);
	args[4] = TimestampTzGetDatum(now);
	for (g = 0; g < nheld;)
	{
		int			m = 0;
		int			j;
		bool		small = nheld <= LE_ACK_MANY_SMALL && nversions <= LE_ACK_MANY_VERSIONS;

		/* one version's tokens (small), or all of them (the join) */
		for (j = g; j < nheld && (!small || hs[j].version == hs[g].version); j++)
		{
			LeToken    *t = &toks[hs[j].idx];

			ids[m] = PointerGetDatum(cmds[hs[j].idx]);
			versions[m] = Int64GetDatum(t->version);
			runs[m] = PointerGetDatum(cstring_to_text_with_len(t->run_id, t->run_len));
			m++;
		}
		args[1] = PointerGetDatum(construct_array(ids, m, TEXTOID, -1, false, TYPALIGN_INT));
		args[3] = PointerGetDatum(construct_array(runs, m, TEXTOID, -1, false, TYPALIGN_INT));
		if (small)
		{
			args[2] = Int64GetDatum(hs[g].version);
			ret = OutboxExecute(OutboxPrepare(&plan_ack_many_small,
											  "UPDATE outbox.commands t"
											  "   SET status = 'published', published_at = $5, lease_until = NULL,"
											  "       version = t.version OPERATOR(pg_catalog.+) 1"
											  " WHERE t.command_id OPERATOR(pg_catalog.=) ANY ($2)"
											  "   AND t.version OPERATOR(pg_catalog.=) $3"
											  "   AND t.run_id OPERATOR(pg_catalog.=) ANY ($4)"
											  "   AND t.owner OPERATOR(pg_catalog.=) $1"
											  "   AND " LE_SENDING("t.")
											  " RETURNING t.command_id, t.run_id, t.version,"
											  "           t.ordering_key, t.ordering_seq, t.decided_by",
											  5, small_types),
								args, NULL, false, 0);
		}
		else
		{
			args[2] = PointerGetDatum(construct_array(versions, m, INT8OID, sizeof(int64),
													  FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
			ret = OutboxExecuteHashJoin(OutboxPrepare(&plan_ack_many,
													  "UPDATE outbox.commands t"
													  "   SET status = 'published', published_at = $5, lease_until = NULL,"
													  "       version = t.version OPERATOR(pg_catalog.+) 1"
													  "  FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3),"
													  "                 pg_catalog.unnest($4)) AS k(command_id, version, run_id)"
													  " WHERE t.command_id OPERATOR(pg_catalog.=) ANY ($2)"
													  "   AND t.command_id OPERATOR(pg_catalog.=) k.command_id"
													  "   AND t.version OPERATOR(pg_catalog.=) k.version"
													  "   AND t.run_id OPERATOR(pg_catalog.=) k.run_id"
													  "   AND t.owner OPERATOR(pg_catalog.=) $1"
													  "   AND " LE_SENDING("t.")
													  " RETURNING t.command_id, t.run_id, t.version,"
													  "           t.ordering_key, t.ordering_seq, t.decided_by",
													  5, join_types),
									  args, NULL, false, 0);
		}
		if (ret != SPI_OK_UPDATE_RETURNING)
			elog(ERROR, "outbox: ack_many failed: %s", SPI_result_code_string(ret));
		for (j = 0; j < (int) SPI_processed; j++)
		{
			HeapTuple	tup = SPI_tuptable->vals[j];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			bool		isnull;
			Datum		okey;

			taken[nacked].command_id = DatumGetTextPP(SPI_getbinval(tup, desc, 1, &isnull));
			taken[nacked].run_id = SPI_getbinval(tup, desc, 2, &isnull);
			taken[nacked].version = DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull)) - 1;
			taken[nacked].used = false;
			nacked++;
			okey = SPI_getbinval(tup, desc, 4, &isnull);
			if (!isnull)
			{
				places[nplaces].key = DatumGetTextPP(okey);
				places[nplaces].seq = DatumGetInt64(SPI_getbinval(tup, desc, 5, &isnull));
				places[nplaces].role = DatumGetObjectId(SPI_getbinval(tup, desc, 6, &isnull));
				nplaces++;
			}
		}
		g += m;
	}
	qsort(taken, nacked, sizeof(LeTaken), le_cmp_taken);

	/*
	 * The heads of ordering keys release their next commands, or hand them
	 * over (src/keys.c).
	 */
	if (handover && !OutboxCitusDistributed())
	{
		nhanded = OutboxHandOverNext(places, nplaces, &ho);
		handed = SPI_tuptable;
	}
	else
		OutboxReleaseNext(places, nplaces);

	/* One row per token, in the tokens' order. */
	for (i = 0; i < n; i++)
	{
		Datum		values[LE_HANDOVER_COLS];
		bool		isnull[LE_HANDOVER_COLS];
		LeTaken    *hit = NULL;

		memset(isnull, false, sizeof(isnull));
		for (g = 4; g < LE_HANDOVER_COLS; g++)
		{
			values[g] = (Datum) 0;
			isnull[g] = true;
		}

		if (!valid[i])
		{
			isnull[0] = isnull[1] = true;
			values[0] = values[1] = (Datum) 0;
			values[2] = BoolGetDatum(false);
			values[3] = CStringGetTextDatum("invalid_token");
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, isnull);
			continue;
		}
		if (held[i] && nacked > 0)
		{
			LeTaken		key;

			key.command_id = cmds[i];
			key.version = toks[i].version;
			hit = bsearch(&key, taken, nacked, sizeof(LeTaken), le_cmp_taken);
		}
		if (hit != NULL && !hit->used)
		{
			hit->used = true;
			nok++;
			values[0] = PointerGetDatum(hit->command_id);
			values[1] = hit->run_id;
			values[2] = BoolGetDatum(true);
			isnull[3] = true;
			values[3] = (Datum) 0;
		}
		else
		{
			values[0] = PointerGetDatum(cmds[i]);
			values[1] = PointerGetDatum(cstring_to_text_with_len(toks[i].run_id, toks[i].run_len));
			values[2] = BoolGetDatum(false);
			values[3] = CStringGetTextDatum("lease_not_owned");
		}
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, isnull);
	}

	/* Then one row per lease handed over, with its token. */
	for (i = 0; i < (int) nhanded; i++)
	{
		Datum		row[12];
		bool		rnull[12];
		Datum		values[LE_HANDOVER_COLS];
		bool		isnull[LE_HANDOVER_COLS];

		heap_deform_tuple(handed->vals[i], handed->tupdesc, row, rnull);
		if (!DatumGetBool(row[0]))
			continue;			/* released, not handed over */
		/* command_id, run_id; acked and reason NULL; the lease from seq on */
		values[0] = row[1];
		isnull[0] = false;
		values[1] = row[2];
		isnull[1] = false;
		values[2] = values[3] = (Datum) 0;
		isnull[2] = isnull[3] = true;
		for (g = 3; g < 12; g++)
		{
			values[g + 1] = row[g];
			isnull[g + 1] = rnull[g];
		}
		/* the token's place: row[6] */
		values[7] = PointerGetDatum(le_make_token(key, DatumGetTextPP(row[2]),
												  DatumGetTextPP(row[1]),
												  DatumGetInt64(row[7]),
												  caller, worker));
		isnull[7] = false;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, isnull);
		nleased++;
	}
	SPI_finish();

	OutboxCountAtCommit(OBC_ACKED, nok);
	OutboxCountNow(OBC_STALE_REFUSED, n - nok);
	if (nleased > 0)
		OutboxCountAtCommit(OBC_CLAIMED, nleased);
	return (Datum) 0;
}

/* outbox.ack_many's body. */
static Datum
le_ack_many(FunctionCallInfo fcinfo, Oid caller)
{
	return le_ack_body(fcinfo, caller, false);
}

/* outbox.ack_many: the body, as the owner, told who called. */
Datum
outbox_ack_many(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, le_ack_many);
}

/* outbox.ack_handover's body. */
static Datum
le_ack_handover(FunctionCallInfo fcinfo, Oid caller)
{
	return le_ack_body(fcinfo, caller, true);
}

/*
 * outbox.ack_handover(worker, tokens, batch_size, lease, kinds): ack_many
 * that hands the acked heads' next commands over to the caller.
 */
Datum
outbox_ack_handover(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, le_ack_handover);
}

/*
 * Backoff before retry number `deliveries`: base * 2^(deliveries - 1),
 * capped at max, then "equal jitter" (a random point in the upper half), so
 * a burst of failures does not come back as a burst.
 */
static int64
le_backoff_usec(int32 deliveries, int64 base_usec, int64 max_usec)
{
	double		delay = (double) base_usec;
	int			k;

	for (k = 1; k < deliveries && delay < (double) max_usec; k++)
		delay *= 2.0;
	if (delay > (double) max_usec)
		delay = (double) max_usec;
	return (int64) (delay / 2.0 + pg_prng_double(&pg_global_prng_state) * delay / 2.0);
}

/*
 * A backoff of the kind's policy (seconds, from date_part) in microseconds,
 * kept between 0 and 100 years: set_policy refuses longer ones, and the
 * clamp keeps a policy row written by other means from overflowing the
 * conversion or the new available_at.
 */
static int64
le_backoff_policy_usec(double seconds)
{
	double		usec = seconds * (double) USECS_PER_SEC;
	double		limit = (double) INT64CONST(36525) * (double) USECS_PER_DAY;

	if (!(usec > 0.0))			/* negative, or NaN */
		return 0;
	if (usec > limit)
		return (int64) limit;
	return (int64) usec;
}

/*
 * An error text fit for last_error: at most OUTBOX_MAX_ERROR_LEN bytes.  A
 * longer one keeps its beginning, cut at a character boundary, followed by
 * LE_CUT_MARK, so a reader sees that the text was cut.
 */
#define LE_CUT_MARK		" [... cut]"

static text *
le_error_text(text *error)
{
	int			len = VARSIZE_ANY_EXHDR(error);
	int			keep;
	text	   *t;

	if (len <= OUTBOX_MAX_ERROR_LEN)
		return error;
	keep = pg_mbcliplen(VARDATA_ANY(error), len,
						OUTBOX_MAX_ERROR_LEN - (int) strlen(LE_CUT_MARK));
	t = palloc(VARHDRSZ + keep + strlen(LE_CUT_MARK));
	SET_VARSIZE(t, VARHDRSZ + keep + strlen(LE_CUT_MARK));
	memcpy(VARDATA(t), VARDATA_ANY(error), keep);
	memcpy(VARDATA(t) + keep, LE_CUT_MARK, strlen(LE_CUT_MARK));
	return t;
}

/*
 * outbox._error_text(error, note): le_error_text for SQL, so that the stream
 * path (ack_batch's errors, part 35) cuts its errors as fail does.  With a
 * note (a short text of the extension's, such as "; resolved as dead"),
 * the error is cut so that it and the note fit in OUTBOX_MAX_ERROR_LEN
 * bytes, and the note follows it: appended to an error that was cut
 * already, the note would otherwise be cut away itself.
 */
Datum
outbox_error_text(PG_FUNCTION_ARGS)
{
	text	   *error;
	text	   *note;
	text	   *t;
	int			len;
	int			nlen;
	int			keep;
	int			mark = 0;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	error = PG_GETARG_TEXT_PP(0);
	if (PG_NARGS() < 2 || PG_ARGISNULL(1))
		PG_RETURN_TEXT_P(le_error_text(error));
	note = PG_GETARG_TEXT_PP(1);
	len = VARSIZE_ANY_EXHDR(error);
	nlen = VARSIZE_ANY_EXHDR(note);
	if (nlen > OUTBOX_MAX_ERROR_LEN / 2)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("note is too long"),
				 errdetail("The note is %d bytes long; the limit is %d bytes.",
						   nlen, OUTBOX_MAX_ERROR_LEN / 2)));
	keep = len;
	if (len + nlen > OUTBOX_MAX_ERROR_LEN)
	{
		mark = (int) strlen(LE_CUT_MARK);
		keep = pg_mbcliplen(VARDATA_ANY(error), len,
							OUTBOX_MAX_ERROR_LEN - nlen - mark);
	}
	t = palloc(VARHDRSZ + keep + mark + nlen);
	SET_VARSIZE(t, VARHDRSZ + keep + mark + nlen);
	memcpy(VARDATA(t), VARDATA_ANY(error), keep);
	memcpy(VARDATA(t) + keep, LE_CUT_MARK, mark);
	memcpy(VARDATA(t) + keep + mark, VARDATA_ANY(note), nlen);
	PG_RETURN_TEXT_P(t);
}

/*
 * outbox.fail(worker, token, error, fatal)
 *
 * Lock the row by its lease, then decide in C: dead when the failure is
 * fatal or the deliveries are used up, otherwise pending again after a
 * backoff.  Returns the new status.
 */
static Datum
le_fail(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid lock_types[4] = {TEXTOID, INT8OID, TEXTOID, TEXTOID};
	static const Oid set_types[4] = {TEXTOID, TIMESTAMPTZOID, TEXTOID, INT8OID};
	text	   *worker = OutboxArgId(fcinfo, 0, "worker");
	LeToken		tok;
	bool		valid;
	text	   *command_id;
	text	   *error;
	bool		fatal;
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	int32		deliveries;
	int32		max_deliveries;
	int64		base_usec;
	int64		max_usec;
	int64		version;
	bool		dead;
	TimestampTz now = GetCurrentTimestamp();

	valid = le_arg_token(fcinfo, 1, &tok);
	OutboxArgNotNull(fcinfo, 2, "error");
	error = le_error_text(PG_GETARG_TEXT_PP(2));
	OutboxArgNotNull(fcinfo, 3, "fatal");
	fatal = PG_GETARG_BOOL(3);
	if (!valid)
		le_raise_not_owned(worker, NULL);

	command_id = cstring_to_text_with_len(tok.command_id, tok.cmd_len);
	args[0] = PointerGetDatum(command_id);
	args[1] = Int64GetDatum(tok.version);
	args[2] = PointerGetDatum(cstring_to_text_with_len(tok.run_id, tok.run_len));
	args[3] = PointerGetDatum(worker);

	SPI_connect();
	if (!le_token_holds(OutboxLeaseKey(), &tok, worker, caller))
		le_raise_not_owned(worker, &tok);
	if (OutboxExecute(OutboxPrepare(&plan_fail_lock,
									"SELECT c.deliveries, p.max_deliveries,"
									"       pg_catalog.date_part('epoch', p.backoff_base),"
									"       pg_catalog.date_part('epoch', p.backoff_max),"
									"       c.version"
									"  FROM outbox.commands c"
									"  LEFT JOIN outbox.policies p ON p.kind OPERATOR(pg_catalog.=) c.kind"
									" WHERE c.command_id OPERATOR(pg_catalog.=) $1"
									"   AND c.version OPERATOR(pg_catalog.=) $2"
									"   AND c.run_id OPERATOR(pg_catalog.=) $3"
									"   AND c.owner OPERATOR(pg_catalog.=) $4"
									"   AND " LE_SENDING("c.")
									"   FOR NO KEY UPDATE OF c",
									4, lock_types),
					  args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "outbox: fail lookup failed");
	if (SPI_processed != 1)
		le_raise_not_owned(worker, &tok);

	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	deliveries = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
	max_deliveries = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
	if (isnull)
		max_deliveries = outbox_max_deliveries;
	base_usec = le_backoff_policy_usec(DatumGetFloat8(SPI_getbinval(tup, desc, 3, &isnull)));
	if (isnull)
		base_usec = (int64) outbox_backoff_base_ms * 1000;
	max_usec = le_backoff_policy_usec(DatumGetFloat8(SPI_getbinval(tup, desc, 4, &isnull)));
	if (isnull)
		max_usec = (int64) outbox_backoff_max_ms * 1000;
	version = DatumGetInt64(SPI_getbinval(tup, desc, 5, &isnull));

	dead = fatal || deliveries >= max_deliveries;

	/*
	 * $1 is the command_id; $2 the new available_at, NULL when the command
	 * goes to dead; $4 the version the lock read (the row stays locked, so
	 * it is the row's).
	 */
	args[1] = (Datum) 0;
	if (dead)
		nulls[1] = 'n';
	else
		args[1] = TimestampTzGetDatum(now + le_backoff_usec(deliveries, base_usec, max_usec));
	args[2] = PointerGetDatum(error);
	args[3] = Int64GetDatum(version);
	if (OutboxExecute(OutboxPrepare(&plan_fail_set,
									"UPDATE outbox.commands"
									"   SET status = CASE WHEN $2 IS NULL THEN 'dead' ELSE 'pending' END,"
									"       last_error = $3, lease_until = NULL,"
									"       owner = CASE WHEN $2 IS NULL THEN owner END,"
									"       available_at = COALESCE($2, available_at),"
									"       due_at = $2,"
									"       version = version OPERATOR(pg_catalog.+) 1"
									" WHERE command_id OPERATOR(pg_catalog.=) $1"
									"   AND version OPERATOR(pg_catalog.=) $4",
									4, set_types),
					  args, nulls, false, 0) != SPI_OK_UPDATE || SPI_processed != 1)
		elog(ERROR, "outbox: fail update failed");
	SPI_finish();

	OutboxCountAtCommit(OBC_FAILED, 1);
	if (dead)
		OutboxCountAtCommit(OBC_DEAD_LETTERED, 1);
	PG_RETURN_TEXT_P(cstring_to_text(dead ? "dead" : "pending"));
}

/* outbox.fail: the body, as the owner, told who called. */
Datum
outbox_fail_1_0(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, le_fail);
}

/*
 * outbox.renew(worker, token, lease): extend the lease held with this
 * token to now + lease (never past now + outbox.max_lease).  Accepted while
 * the lease is the token's, even if it has run out and nobody took the
 * command over yet.
 */
static Datum
le_renew(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid argtypes[8] = {TEXTOID, INT8OID, TEXTOID, TEXTOID,
	TIMESTAMPTZOID, INTERVALOID, INTERVALOID, TIMESTAMPTZOID};
	text	   *worker = OutboxArgId(fcinfo, 0, "worker");
	LeToken		tok;
	bool		valid;
	TimestampTz now = GetCurrentTimestamp();
	Interval   *lease;
	Interval	default_lease;
	Datum		args[8];
	char		nulls[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	bool		isnull;
	TimestampTz until;

	valid = le_arg_token(fcinfo, 1, &tok);
	lease = le_arg_lease(fcinfo, 2, now);
	if (!valid)
		le_raise_not_owned(worker, NULL);

	args[0] = PointerGetDatum(cstring_to_text_with_len(tok.command_id, tok.cmd_len));
	args[1] = Int64GetDatum(tok.version);
	args[2] = PointerGetDatum(cstring_to_text_with_len(tok.run_id, tok.run_len));
	args[3] = PointerGetDatum(worker);
	args[4] = TimestampTzGetDatum(now);
	args[5] = lease ? IntervalPGetDatum(lease) : (Datum) 0;
	if (lease == NULL)
		nulls[5] = 'n';
	args[6] = le_default_lease(&default_lease);
	args[7] = le_max_until(now);

	SPI_connect();
	if (!le_token_holds(OutboxLeaseKey(), &tok, worker, caller))
		le_raise_not_owned(worker, &tok);
	if (OutboxExecute(OutboxPrepare(&plan_renew,
									"UPDATE outbox.commands t"
									"   SET lease_until = LEAST($5 OPERATOR(pg_catalog.+) COALESCE($6,"
									"           (SELECT p.lease FROM outbox.policies p"
									"             WHERE p.kind OPERATOR(pg_catalog.=) t.kind), $7), $8)"
									" WHERE t.command_id OPERATOR(pg_catalog.=) $1"
									"   AND t.version OPERATOR(pg_catalog.=) $2"
									"   AND t.run_id OPERATOR(pg_catalog.=) $3"
									"   AND t.owner OPERATOR(pg_catalog.=) $4"
									"   AND " LE_SENDING("t.")
									" RETURNING t.lease_until",
									8, argtypes),
					  args, nulls, false, 0) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "outbox: renew failed");
	if (SPI_processed != 1)
		le_raise_not_owned(worker, &tok);
	/* read the result before SPI_finish releases the tuple */
	until = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0],
											  SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();

	/*
	 * The new lease end is what the worker's due check looks for: if this
	 * transaction outlives a look, the next one must look back to its start.
	 */
	OutboxDueAtCommit(OUTBOX_DUE_MOVED);

	PG_RETURN_TIMESTAMPTZ(until);
}

/* outbox.renew: the body, as the owner, told who called. */
Datum
outbox_renew_1_0(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, le_renew);
}

/*
 * The sweep's statement: settle up to $1 expired leases whose deliveries
 * are used up (dead) or whose kind is manual (uncertain).
 */
#define LE_SWEEP \
	"WITH x AS MATERIALIZED (SELECT ARRAY(" \
	"  SELECT c.ctid FROM outbox.commands c" \
	"   WHERE c.status OPERATOR(pg_catalog.=) 'sending'" \
	"     AND c.lease_until OPERATOR(pg_catalog.<=) $2" \
	"     AND (c.deliveries OPERATOR(pg_catalog.>=) " LE_MAX_DELIVERIES("c.", "$3") \
	"          OR " LE_MANUAL("c.") ")" \
	"   ORDER BY c.lease_until" \
	"   LIMIT $1" \
	"   FOR NO KEY UPDATE OF c SKIP LOCKED) AS tids)" \
	"UPDATE outbox.commands t" \
	"   SET status = CASE WHEN " LE_MANUAL("t.") " THEN 'uncertain' ELSE 'dead' END," \
	"       last_error = CASE WHEN " LE_MANUAL("t.") \
	"         THEN pg_catalog.format('lease of worker %s expired; kind %s needs a manual takeover'," \
	"                                t.owner, t.kind)" \
	"         ELSE pg_catalog.format('lease of worker %s expired after %s deliveries'," \
	"                                t.owner, t.deliveries) END," \
	"       lease_until = NULL," \
	"       version = t.version OPERATOR(pg_catalog.+) 1" \
	" WHERE t.ctid OPERATOR(pg_catalog.=) ANY ((SELECT tids FROM x)::pg_catalog.tid[])" \
	" RETURNING t.status"

/* How many rows of the sweep just run (SPI_tuptable) went dead. */
static int64
le_count_dead(void)
{
	uint64		i;
	int64		dead = 0;

	for (i = 0; i < SPI_processed; i++)
	{
		char	   *status = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);

		if (strcmp(status, "dead") == 0)
			dead++;
	}
	return dead;
}

/*
 * outbox.sweep(batch_size): settle up to batch_size expired leases that
 * claim will not take over: to dead when the deliveries are used up, to
 * uncertain when the kind's takeover mode is manual.  Returns the number of
 * commands settled.  The UPDATE finds the rows it locked by their ctid (a
 * TID scan, the only plan there is), not through a join with
 * outbox.commands that a planner misled by the table's statistics could turn
 * into a read of the whole table.  As in claim, a row that a transaction
 * committed after the statement's snapshot changed is locked in its newest
 * version but not settled; the count is short, and the next sweep settles
 * it.
 */
static Datum
le_sweep(FunctionCallInfo fcinfo, Oid caller)
{
	static const Oid argtypes[3] = {INT4OID, TIMESTAMPTZOID, INT4OID};
	int32		batch;
	Datum		args[3];
	int64		dead = 0;
	uint64		n;

	batch = le_arg_batch(fcinfo, 0);
	args[0] = Int32GetDatum(batch);
	args[1] = TimestampTzGetDatum(GetCurrentTimestamp());
	args[2] = Int32GetDatum(outbox_max_deliveries);

	SPI_connect();
	if (OutboxCitusDistributed())
	{
		/* this node's shards, one statement each, until the batch is done */
		int			nshards;
		int			k;
		OutboxShard *shards = OutboxCitusLocalShards(&nshards, false);

		n = 0;
		for (k = 0; k < nshards && n < (uint64) batch; k++)
		{
			args[0] = Int32GetDatum(batch - (int32) n);
			if (OutboxExecute(OutboxCitusShardPlan(&shards[k], LE_SWEEP, 3, argtypes),
							  args, NULL, false, 0) != SPI_OK_UPDATE_RETURNING)
				elog(ERROR, "outbox: sweep failed");
			n += SPI_processed;
			dead += le_count_dead();
		}
	}
	else
	{
		if (OutboxExecute(OutboxPrepare(&plan_sweep, LE_SWEEP, 3, argtypes),
						  args, NULL, false, 0) != SPI_OK_UPDATE_RETURNING)
			elog(ERROR, "outbox: sweep failed");
		n = SPI_processed;
		dead = le_count_dead();
	}
	SPI_finish();

	OutboxCountAtCommit(OBC_DEAD_LETTERED, dead);
	PG_RETURN_INT32((int32) n);
}

/* outbox.sweep: the body, as the owner, told who called. */
Datum
outbox_sweep(PG_FUNCTION_ARGS)
{
	return OutboxCallAsOwner(fcinfo, le_sweep);
}
