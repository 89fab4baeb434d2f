/*-------------------------------------------------------------------------
 *
 * args.c
 *		Argument checks shared by the SQL-callable functions.
 *
 * Identifiers (at most OUTBOX_MAX_ID_LEN bytes, the limit the PL/pgSQL
 * functions get from the same definition through the install script),
 * payloads (outbox.max_payload_bytes, OUTBOX_MAX_PAYLOAD_DEPTH levels),
 * producer headers (OutboxCheckHeaders: an object of strings, names that
 * are HTTP tokens, the OUTBOX_MAX_HEADERS* limits), NULLs and a lease's
 * bounds (OutboxLeaseEnd), each with its SQLSTATE; and the caller identity
 * of the API functions (OutboxCallAsOwner): they are SECURITY INVOKER, so
 * current_user at the call site is the role a call is made by, and their
 * body runs as the extension objects' owner.
 * A bottom layer: it calls no other file of the extension.
 *
 * Locking: none.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_proc.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "outbox.h"

/*
 * Run body, the implementation of a SQL-callable API function, as the
 * function's owner (its proowner, the extension's owner), giving it the
 * calling role: current_user when the call was made, so a SECURITY DEFINER
 * function of the application that calls the API acts as its own owner.
 *
 * This is what SECURITY DEFINER would do, done in C so that the body also
 * knows who called: fmgr has already applied the function's SET
 * search_path.  The security context gets SECURITY_LOCAL_USERID_CHANGE (no
 * SET ROLE or SET SESSION AUTHORIZATION inside), and PG_FINALLY restores the
 * caller's identity on every exit, an error included.
 */
Datum
OutboxCallAsOwner(FunctionCallInfo fcinfo, OutboxApiBody body)
{
	Oid			caller;
	Oid			owner;
	int			sec_context;
	HeapTuple	tup;
	volatile Datum result = (Datum) 0;

	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fcinfo->flinfo->fn_oid));
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for function %u",
			 fcinfo->flinfo->fn_oid);
	owner = ((Form_pg_proc) GETSTRUCT(tup))->proowner;
	ReleaseSysCache(tup);

	GetUserIdAndSecContext(&caller, &sec_context);
	SetUserIdAndSecContext(owner, sec_context | SECURITY_LOCAL_USERID_CHANGE);
	PG_TRY();
	{
		result = body(fcinfo, caller);
	}
	PG_FINALLY();
	{
		SetUserIdAndSecContext(caller, sec_context);
	}
	PG_END_TRY();
	return result;
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

/*
 * Compare two identifiers as their "C"-collated keys do: byte by byte, a
 * prefix first (for sorting and searching ids in C without a collation).
 */
int
OutboxCompareIds(const text *a, const text *b)
{
	int			la = VARSIZE_ANY_EXHDR(a);
	int			lb = VARSIZE_ANY_EXHDR(b);
	int			c = memcmp(VARDATA_ANY(a), VARDATA_ANY(b), Min(la, lb));

	if (c != 0)
		return c;
	return (la > lb) - (la < lb);
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

/*
 * Check an ordering key: an identifier (OutboxCheckId) without control
 * characters (bytes below 0x20 and 0x7f), as header values, since a key is
 * echoed in messages and in last_error.  elem is the 1-based position in a
 * batch, or 0.  22023.
 */
void
OutboxCheckKey(text *t, int elem)
{
	const unsigned char *p = (const unsigned char *) VARDATA_ANY(t);
	int			len = VARSIZE_ANY_EXHDR(t);
	int			i;

	OutboxCheckId(t, "ordering_key");
	for (i = 0; i < len; i++)
		if (p[i] < 0x20 || p[i] == 0x7f)
		{
			if (elem > 0)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("ordering_key of decision %d has a control character", elem),
						 errdetail("The byte at offset %d is 0x%02x.", i, p[i])));
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("ordering_key has a control character"),
					 errdetail("The byte at offset %d is 0x%02x.", i, p[i])));
		}
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
	{
		uint32		nchildren = JB_ROOT_COUNT(j) * (JB_ROOT_IS_OBJECT(j) ? 2 : 1);
		uint32		i;

		for (i = 0; i < nchildren; i++)
			if (JBE_ISCONTAINER(j->root.children[i]))
				break;
		if (i == nchildren)
			return;
	}
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

/* Whether c is a tchar of RFC 9110's token (a header field name). */
static bool
ar_tchar(unsigned char c)
{
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
		return true;
	return c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/*
 * Header names a producer may not set: the framing and hop-by-hop fields
 * of HTTP (RFC 9110 7.6.1, RFC 9112), which would let a command change how
 * the relay's request is delimited or routed.  Compared case-insensitively.
 */
static const char *const ar_reserved_headers[] = {
	"connection", "content-length", "expect", "host", "keep-alive",
	"proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
	"trailer", "transfer-encoding", "upgrade", NULL
};

/* Raise 22023 about header name of a decision (elem > 0: of a batch). */
static void
ar_bad_header(int elem, const char *name, const char *why)
{
	if (elem > 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("header \"%s\" of decision %d %s", name, elem, why)));
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("header \"%s\" %s", name, why)));
}

/*
 * Check a decision's headers: a JSON object whose keys are header names
 * (RFC 9110 tokens of at most OUTBOX_MAX_HEADER_NAME_LEN bytes, none
 * reserved, none twice when compared case-insensitively) and whose values
 * are strings without control characters; at most OUTBOX_MAX_HEADERS of
 * them, OUTBOX_MAX_HEADERS_BYTES of names and values together.  elem is the
 * 1-based position in a batch, or 0.  22023 for the shape, 54000 for the
 * limits.
 */
void
OutboxCheckHeaders(Jsonb *j, int elem)
{
	JsonbIterator *it;
	JsonbValue	k;
	JsonbValue	v;
	JsonbIteratorToken tok;
	char	  **names;
	int			n;
	int			i;
	Size		bytes = 0;

	if (JB_ROOT_IS_SCALAR(j) || !JB_ROOT_IS_OBJECT(j))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 elem > 0 ? errmsg("headers of decision %d must be a JSON object", elem) :
				 errmsg("headers must be a JSON object")));
	n = JB_ROOT_COUNT(j);
	if (n > OUTBOX_MAX_HEADERS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 elem > 0 ? errmsg("too many headers in decision %d", elem) :
				 errmsg("too many headers"),
				 errdetail("There are %d headers; the limit is %d.", n, OUTBOX_MAX_HEADERS)));
	if (n == 0)
		return;
	names = palloc(sizeof(char *) * n);
	i = 0;
	it = JsonbIteratorInit(&j->root);
	tok = JsonbIteratorNext(&it, &k, true);
	Assert(tok == WJB_BEGIN_OBJECT);
	while ((tok = JsonbIteratorNext(&it, &k, true)) == WJB_KEY)
	{
		char	   *name = pnstrdup(k.val.string.val, k.val.string.len);
		int			c;

		tok = JsonbIteratorNext(&it, &v, true);
		Assert(tok == WJB_VALUE);
		if (k.val.string.len == 0)
			ar_bad_header(elem, name, "has an empty name");
		if (k.val.string.len > OUTBOX_MAX_HEADER_NAME_LEN)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("a header name is too long"),
					 errdetail("The name has %d bytes; the limit is %d.",
							   k.val.string.len, OUTBOX_MAX_HEADER_NAME_LEN)));
		for (c = 0; c < k.val.string.len; c++)
			if (!ar_tchar((unsigned char) name[c]))
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 elem > 0 ? errmsg("a header name of decision %d is not a token", elem) :
						 errmsg("a header name is not a token"),
						 errdetail("A header name has letters, digits and !#$%%&'*+-.^_`|~ only (an RFC 9110 token).")));
		for (c = 0; ar_reserved_headers[c] != NULL; c++)
			if (pg_strcasecmp(name, ar_reserved_headers[c]) == 0)
				ar_bad_header(elem, name, "is reserved");
		for (c = 0; c < i; c++)
			if (pg_strcasecmp(name, names[c]) == 0)
				ar_bad_header(elem, name, "is given twice (header names are case-insensitive)");
		if (v.type != jbvString)
			ar_bad_header(elem, name, "must be a string");
		for (c = 0; c < v.val.string.len; c++)
		{
			unsigned char ch = (unsigned char) v.val.string.val[c];

			if (ch < 0x20 || ch == 0x7f)
				ar_bad_header(elem, name, "has a control character in its value");
		}
		bytes += k.val.string.len + v.val.string.len;
		names[i++] = name;
	}
	if (bytes > OUTBOX_MAX_HEADERS_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 elem > 0 ? errmsg("headers of decision %d are too large", elem) :
				 errmsg("headers are too large"),
				 errdetail("Names and values have %zu bytes; the limit is %d.",
						   bytes, OUTBOX_MAX_HEADERS_BYTES)));
	for (i = 0; i < n; i++)
		pfree(names[i]);
	pfree(names);
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

/* The lease a caller did not name, outbox.default_lease, into *iv; iv. */
Interval *
OutboxDefaultLease(Interval *iv)
{
	iv->time = (int64) outbox_default_lease_ms * 1000;
	iv->day = 0;
	iv->month = 0;
	return iv;
}

/*
 * Check a lease that starts at now and return its end.  The bounds are
 * checked on the timestamp the lease would end at (now + lease, as the
 * statements compute it), not on the interval with its months counted as 30
 * days: the lease must end after now and at most outbox.max_lease after
 * it.  Each field of the interval is first kept within 2000 years either
 * way, so that the sum cannot leave the range of timestamptz.  The row
 * leases (lease.c) and the stream's claim (stream_claim.c) share it.
 */
TimestampTz
OutboxLeaseEnd(Interval *iv, TimestampTz now)
{
	TimestampTz end;
	const int64 years = 2000;

	if (iv->month > years * MONTHS_PER_YEAR || iv->month < -years * MONTHS_PER_YEAR ||
		iv->day > years * 366 || iv->day < -years * 366 ||
		iv->time > years * 366 * USECS_PER_DAY || iv->time < -years * 366 * USECS_PER_DAY)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease is out of range"),
				 errdetail("The requested lease was %s; each of its months, days and time must be within %d years.",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(iv))),
						   (int) years)));
	end = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
												  TimestampTzGetDatum(now),
												  IntervalPGetDatum(iv)));
	if (end <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must be positive"),
				 errdetail("The requested lease %s would end at or before the time of the call.",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(iv))))));
	if (end - now > (int64) outbox_max_lease_s * USECS_PER_SEC)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease is longer than outbox.max_lease"),
				 errdetail("The requested lease %s would end more than %d seconds after the time of the call.",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(iv))),
						   outbox_max_lease_s)));
	return end;
}
