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
 * Locking: none (catalog caches only).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_may);

static SPIPlanPtr plan_claimable = NULL;

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
