/*-------------------------------------------------------------------------
 *
 * leasekey.c
 *		The database's lease key (outbox.lease_key): read once per backend,
 *		kept until a relcache invalidation of its table says it changed.
 *		It keys the MACs of the lease tokens (src/lease.c) and the hash of
 *		the ordering keys' lock tags (src/keys.c).
 *
 * Locking.  OutboxKeyLockKey takes RowShareLock on outbox.lease_key until
 * the transaction ends (a fast-path lock: callers do not contend), which
 * rotate_lease_key's ExclusiveLock waits for: every holder of a key's lock
 * hashed it under the same lease key, so a rotation cannot let two
 * transactions take one ordering key's lock under two hashes.  Reading the
 * key takes nothing more than the SELECT's own lock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "executor/spi.h"
#include "storage/lmgr.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"

#include "outbox.h"

static unsigned char lk_key[OUTBOX_LEASE_KEY_LEN];
static bool lk_key_valid = false;
static Oid	lk_key_relid = InvalidOid;
static bool lk_key_callback = false;

/* Relcache invalidation callback: forget the key when its table changed. */
static void
lk_forget_key(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == lk_key_relid)
		lk_key_valid = false;
}

/*
 * The database's lease key, read from outbox.lease_key on first use (in the
 * caller's SPI connection, as the extension's owner) and then kept.
 * Pending invalidations are taken in first, so a rotation committed before
 * this call is seen.
 */
const unsigned char *
OutboxLeaseKey(void)
{
	static SPIPlanPtr plan_key = NULL;
	bool		isnull;
	bytea	   *k;

	if (!lk_key_callback)
	{
		CacheRegisterRelcacheCallback(lk_forget_key, (Datum) 0);
		lk_key_callback = true;
	}
	AcceptInvalidationMessages();
	if (lk_key_valid)
		return lk_key;
	lk_key_relid = get_relname_relid("lease_key", get_namespace_oid("outbox", false));
	if (OutboxExecute(OutboxPrepare(&plan_key, "SELECT key FROM outbox.lease_key", 0, NULL),
					  NULL, NULL, true, 2) != SPI_OK_SELECT)
		elog(ERROR, "outbox: lookup of the lease key failed");
	if (SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox.lease_key must hold one key"),
				 errdetail("It holds %d rows.", (int) SPI_processed),
				 errhint("Call outbox.rotate_lease_key() to make a new key.")));
	k = DatumGetByteaPP(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (isnull || VARSIZE_ANY_EXHDR(k) != OUTBOX_LEASE_KEY_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the key in outbox.lease_key is not 16 bytes long"),
				 errhint("Call outbox.rotate_lease_key() to make a new key.")));
	memcpy(lk_key, VARDATA_ANY(k), OUTBOX_LEASE_KEY_LEN);
	lk_key_valid = true;
	return lk_key;
}

/*
 * The lease key for the hash of the ordering keys' locks (src/keys.c), in
 * the caller's SPI connection, with RowShareLock on outbox.lease_key until
 * the transaction ends (see the file's header).
 */
const unsigned char *
OutboxKeyLockKey(void)
{
	if (!OidIsValid(lk_key_relid))
		lk_key_relid = get_relname_relid("lease_key", get_namespace_oid("outbox", false));
	LockRelationOid(lk_key_relid, RowShareLock);
	return OutboxLeaseKey();
}

/* Forget the cached key (rotate_lease_key, before its commit is seen). */
void
OutboxForgetLeaseKey(void)
{
	lk_key_valid = false;
}

/*
 * The MAC at the start of a token: 2 * maclen hexadecimal digits at s into
 * mac; false if one is not a hexadecimal digit.
 */
bool
OutboxTokenMac(const char *s, unsigned char *mac, int maclen)
{
	int			i;

	for (i = 0; i < 2 * maclen; i++)
	{
		char		c = s[i];
		int			d;

		if (c >= '0' && c <= '9')
			d = c - '0';
		else if (c >= 'a' && c <= 'f')
			d = c - 'a' + 10;
		else if (c >= 'A' && c <= 'F')
			d = c - 'A' + 10;
		else
			return false;
		if (i % 2 == 0)
			mac[i / 2] = (unsigned char) (d << 4);
		else
			mac[i / 2] |= (unsigned char) d;
	}
	return true;
}

/*
 * Read a decimal number of 1 to maxdigits digits at s[*pos], followed by
 * ':', into *v and step past the ':'; false if there is none or it
 * exceeds max.
 */
bool
OutboxTokenNumber(const char *s, int len, int *pos, int maxdigits, uint64 max, uint64 *v)
{
	int			digits = 0;

	*v = 0;
	while (*pos < len && s[*pos] >= '0' && s[*pos] <= '9' && digits < maxdigits)
	{
		*v = *v * 10 + (uint64) (s[(*pos)++] - '0');
		digits++;
	}
	if (digits == 0 || *v > max || *pos >= len || s[*pos] != ':')
		return false;
	(*pos)++;
	return true;
}
