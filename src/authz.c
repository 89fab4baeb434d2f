/*-------------------------------------------------------------------------
 *
 * authz.c
 *		Who may do what: this database's group roles and the per-kind rights.
 *
 * The group roles are per database, <db>_outbox_producer and so on (see
 * src/sql/05_roles.sql); OutboxDatabaseRole finds one.  A kind's policy may
 * list the roles that may decide, claim or complete it (outbox.policies
 * deciders, claimers, completers): NULL lets anyone who may call the
 * function, an empty list only this database's outbox admins, and a list
 * its members (has_privs_of_role) and the admins.  outbox._may() is that
 * rule for the statements of the API, which pass the calling role they got
 * from OutboxCallAsOwner; OutboxCheckClaimable refuses a claim that names
 * a kind the caller may not claim.
 *
 * OutboxAnyDeciders tells the producer whether any kind has deciders at
 * all, so that a decision skips the policy probe while none has (the probe
 * cost about 4% of a lone producer's transaction).  The answer is kept per
 * backend until a relcache invalidation: set_policy sends one for
 * outbox.policies (outbox._policies_changed(), at commit, to every
 * backend), and any other one resets it too, which covers DROP and CREATE
 * EXTENSION.
 *
 * OutboxOrderedByRun tells the producer whether a kind's commands are
 * ordered by run (policies.ordered_by_run), from the ordered kinds read
 * once and kept until the same invalidation; OutboxStreamKind likewise
 * whether a kind is written to a stream (policies.stream).
 *
 * Locking: none (catalog caches only).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "storage/sinval.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_may);
PG_FUNCTION_INFO_V1(outbox_policies_changed);

static SPIPlanPtr plan_claimable = NULL;
static SPIPlanPtr plan_any_deciders = NULL;

/* Whether any kind has deciders: unknown, none, some. */
typedef enum AzDeciders
{
	AZ_DECIDERS_UNKNOWN = 0,
	AZ_DECIDERS_NONE,
	AZ_DECIDERS_SOME
} AzDeciders;

static AzDeciders az_deciders = AZ_DECIDERS_UNKNOWN;
static bool az_callback_registered = false;

/*
 * A set of kinds read from outbox.policies by one query (sorted byte by
 * byte), in TopMemoryContext; valid while known.
 */
typedef struct AzKinds
{
	bool		known;
	int			n;
	text	  **kinds;
	SPIPlanPtr	plan;
	const char *query;
	const char *what;
} AzKinds;

/* The kinds ordered by run (policies.ordered_by_run). */
static AzKinds az_ordered = {
	false, 0, NULL, NULL,
	"SELECT p.kind FROM outbox.policies p WHERE p.ordered_by_run ORDER BY p.kind",
	"the kinds ordered by run"
};

/* The kinds written to a stream (policies.stream). */
static AzKinds az_stream = {
	false, 0, NULL, NULL,
	"SELECT p.kind FROM outbox.policies p WHERE p.stream IS NOT NULL ORDER BY p.kind",
	"the kinds written to a stream"
};

/* Relcache invalidation callback: forget what was known of the policies. */
static void
az_forget_policies(Datum arg, Oid relid)
{
	az_deciders = AZ_DECIDERS_UNKNOWN;
	az_ordered.known = false;
	az_stream.known = false;
}

/*
 * The oid of this database's group role for a capability ("producer",
 * "publisher", "consumer" or "admin"), InvalidOid if it does not exist.
 */
Oid
OutboxDatabaseRole(const char *capability)
{
	char	   *db = get_database_name(MyDatabaseId);
	char		name[NAMEDATALEN * 2];
	Oid			role;

	if (db == NULL)
		return InvalidOid;
	snprintf(name, sizeof(name), "%s_outbox_%s", db, capability);
	pfree(db);
	if (strlen(name) >= NAMEDATALEN)
		return InvalidOid;
	role = get_role_oid(name, true);
	return role;
}

/* Whether caller has the privileges of this database's outbox admin role. */
bool
OutboxIsAdmin(Oid caller)
{
	Oid			admin = OutboxDatabaseRole("admin");

	return OidIsValid(admin) && has_privs_of_role(caller, admin);
}

/*
 * Whether caller may act on a kind whose policy lists roles (NULL: no
 * list, anyone who may call the function).  An empty list lets only the
 * admins in; otherwise a member of a listed role, or an admin.
 */
bool
OutboxMay(ArrayType *roles, Oid caller)
{
	Datum	   *elems;
	bool	   *elnulls;
	int			n;
	int			i;

	if (roles == NULL)
		return true;
	deconstruct_array(roles, REGROLEOID, sizeof(Oid), true, TYPALIGN_INT,
					  &elems, &elnulls, &n);
	for (i = 0; i < n; i++)
		if (!elnulls[i] && has_privs_of_role(caller, DatumGetObjectId(elems[i])))
			return true;
	return OutboxIsAdmin(caller);
}

/* outbox._may(roles regrole[], caller oid): OutboxMay for SQL. */
Datum
outbox_may(PG_FUNCTION_ARGS)
{
	if (PG_ARGISNULL(1))
		PG_RETURN_BOOL(false);
	PG_RETURN_BOOL(OutboxMay(PG_ARGISNULL(0) ? NULL : PG_GETARG_ARRAYTYPE_P(0),
							 PG_GETARG_OID(1)));
}

/*
 * Raise 42501 if kinds (of a claim) names a kind whose claimers do not
 * admit caller.  Runs in the caller's SPI connection.
 */
void
OutboxCheckClaimable(ArrayType *kinds, Oid caller)
{
	static const Oid argtypes[2] = {TEXTARRAYOID, OIDOID};
	Datum		args[2];
	bool		isnull;

	args[0] = PointerGetDatum(kinds);
	args[1] = ObjectIdGetDatum(caller);
	if (OutboxExecute(OutboxPrepare(&plan_claimable,
									"SELECT p.kind FROM outbox.policies p"
									" WHERE p.kind OPERATOR(pg_catalog.=) ANY ($1)"
									"   AND p.claimers IS NOT NULL"
									"   AND NOT outbox._may(p.claimers, $2)"
									" ORDER BY p.kind LIMIT 1",
									2, argtypes),
					  args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "outbox: check of the claimed kinds failed");
	if (SPI_processed > 0)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to claim commands of kind \"%s\"",
						TextDatumGetCString(SPI_getbinval(SPI_tuptable->vals[0],
														  SPI_tuptable->tupdesc, 1, &isnull))),
				 errhint("The kind's claimers (outbox.set_policy) do not include a role of yours.")));
}

/*
 * Bring the kept policy facts (the deciders, the sets of kinds) up
 * to date: register their relcache callback once, then take in pending
 * invalidations, so that a set_policy committed before this call is seen.
 */
static void
az_policies_current(void)
{
	if (!az_callback_registered)
	{
		CacheRegisterRelcacheCallback(az_forget_policies, (Datum) 0);
		az_callback_registered = true;
	}
	AcceptInvalidationMessages();
}

/*
 * Whether any kind's policy lists deciders (read once, then kept until a
 * relcache invalidation).  Runs in the caller's SPI connection.  Pending
 * invalidations are taken in first, so a set_policy committed before this
 * call is seen.
 */
bool
OutboxAnyDeciders(void)
{
	bool		isnull;

	az_policies_current();
	if (az_deciders == AZ_DECIDERS_UNKNOWN)
	{
		if (OutboxExecute(OutboxPrepare(&plan_any_deciders,
										"SELECT EXISTS (SELECT 1 FROM outbox.policies p"
										"                WHERE p.deciders IS NOT NULL)",
										0, NULL),
						  NULL, NULL, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "outbox: lookup of the deciders failed");
		az_deciders = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
												 SPI_tuptable->tupdesc, 1, &isnull))
			? AZ_DECIDERS_SOME : AZ_DECIDERS_NONE;
	}
	return az_deciders == AZ_DECIDERS_SOME;
}

/* bsearch comparator of two text pointers (OutboxCompareIds). */
static int
az_cmp_kind(const void *a, const void *b)
{
	return OutboxCompareIds(*(text *const *) a, *(text *const *) b);
}

/*
 * Read the set of kinds ks unless it is known; pending invalidations are
 * taken in first, so a set_policy committed before this call is seen.
 * Runs in the caller's SPI connection.
 */
static void
az_load_kinds(AzKinds *ks)
{
	MemoryContext old;
	uint64		i;

	az_policies_current();
	if (ks->known)
		return;
	if (OutboxExecute(OutboxPrepare(&ks->plan, ks->query, 0, NULL),
					  NULL, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "outbox: lookup of %s failed", ks->what);
	if (ks->kinds != NULL)
	{
		for (i = 0; i < (uint64) ks->n; i++)
			pfree(ks->kinds[i]);
		pfree(ks->kinds);
		ks->kinds = NULL;
	}
	old = MemoryContextSwitchTo(TopMemoryContext);
	ks->n = (int) SPI_processed;
	if (ks->n > 0)
		ks->kinds = palloc(sizeof(text *) * ks->n);
	for (i = 0; i < SPI_processed; i++)
	{
		bool		isnull;

		ks->kinds[i] = DatumGetTextPCopy(SPI_getbinval(SPI_tuptable->vals[i],
													   SPI_tuptable->tupdesc, 1, &isnull));
	}
	MemoryContextSwitchTo(old);
	ks->known = true;
}

/*
 * Whether kind is in the set ks (read if it is not known); with kind NULL,
 * whether the set has any kind.  While it has none, the answer costs no
 * look-up.
 */
static bool
az_kind_in(AzKinds *ks, text *kind)
{
	az_load_kinds(ks);
	if (ks->n == 0)
		return false;
	if (kind == NULL)
		return true;
	return bsearch(&kind, ks->kinds, ks->n, sizeof(text *), az_cmp_kind) != NULL;
}

/*
 * Whether the policy of kind orders its commands by run (a command decided
 * without an ordering key gets its run_id as key); with kind NULL, whether
 * any kind's does.  The ordered kinds are read once and kept like the
 * deciders (OutboxAnyDeciders); while no kind is ordered, the answer costs
 * no look-up.  Runs in the caller's SPI connection.
 */
bool
OutboxOrderedByRun(text *kind)
{
	return az_kind_in(&az_ordered, kind);
}

/*
 * Whether kind is written to a stream (policies.stream); with kind NULL,
 * whether any kind is.  While no kind is, the answer costs no look-up.
 * Runs in the caller's SPI connection.
 */
bool
OutboxStreamKind(text *kind)
{
	return az_kind_in(&az_stream, kind);
}

/*
 * outbox._policies_changed(): tell every backend, when this transaction
 * commits, that the policies changed (a relcache invalidation of
 * outbox.policies).  set_policy calls it.
 */
Datum
outbox_policies_changed(PG_FUNCTION_ARGS)
{
	Oid			relid = get_relname_relid("policies", get_namespace_oid("outbox", false));

	if (OidIsValid(relid))
		CacheInvalidateRelcacheByRelid(relid);
	PG_RETURN_VOID();
}
