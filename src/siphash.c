/*-------------------------------------------------------------------------
 *
 * siphash.c
 *		SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input
 *		PRF", 2012), with the 64-bit output of the paper and the 128-bit
 *		output of its reference implementation.  The lease tokens' MAC
 *		(lease.c) is its 128-bit form under the database's lease key.
 *
 * Written from the published description: a 128-bit key k0 || k1 (two
 * little-endian 64-bit words), four words of state, two rounds per 8-byte
 * message word (the last word holds the length mod 256 in its top byte),
 * four rounds of finalization.  The 128-bit form xors 0xee into v1 at the
 * start and into v2 at the finalization (instead of 0xff), and makes its
 * second 64 bits by xoring 0xdd into v1 and running four more rounds.
 *
 * outbox._siphash(key, message, bytes) exposes it to the regression test
 * sql/siphash.sql, which checks the test vectors of the paper (Appendix A)
 * and of the reference implementation.
 *
 * Locking: none; the functions keep no state.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/builtins.h"

#include "outbox.h"

PG_FUNCTION_INFO_V1(outbox_siphash);

#define SIP_ROTL(x, b)	(uint64) (((x) << (b)) | ((x) >> (64 - (b))))

#define SIP_ROUND(v0, v1, v2, v3) \
	do { \
		(v0) += (v1); (v1) = SIP_ROTL(v1, 13); (v1) ^= (v0); (v0) = SIP_ROTL(v0, 32); \
		(v2) += (v3); (v3) = SIP_ROTL(v3, 16); (v3) ^= (v2); \
		(v0) += (v3); (v3) = SIP_ROTL(v3, 21); (v3) ^= (v0); \
		(v2) += (v1); (v1) = SIP_ROTL(v1, 17); (v1) ^= (v2); (v2) = SIP_ROTL(v2, 32); \
	} while (0)

/* Load and store 64-bit little-endian words, whatever the host's order. */
static inline uint64
sip_load64(const unsigned char *p)
{
	return (uint64) p[0] | (uint64) p[1] << 8 | (uint64) p[2] << 16 |
		(uint64) p[3] << 24 | (uint64) p[4] << 32 | (uint64) p[5] << 40 |
		(uint64) p[6] << 48 | (uint64) p[7] << 56;
}

static inline void
sip_store64(unsigned char *p, uint64 v)
{
	int			i;

	for (i = 0; i < 8; i++)
		p[i] = (unsigned char) (v >> (8 * i));
}

/*
 * SipHash-2-4 of msg[0 .. len) under the 16-byte key, into out: outlen is
 * 8 (the 64-bit output) or 16 (the 128-bit output).
 */
void
OutboxSipHash(const unsigned char *key, const unsigned char *msg, size_t len,
			  unsigned char *out, int outlen)
{
	uint64		k0 = sip_load64(key);
	uint64		k1 = sip_load64(key + 8);
	uint64		v0 = k0 ^ UINT64CONST(0x736f6d6570736575);
	uint64		v1 = k1 ^ UINT64CONST(0x646f72616e646f6d);
	uint64		v2 = k0 ^ UINT64CONST(0x6c7967656e657261);
	uint64		v3 = k1 ^ UINT64CONST(0x7465646279746573);
	const unsigned char *end = msg + (len - len % 8);
	uint64		b = (uint64) len << 56;
	int			i;

	Assert(outlen == 8 || outlen == 16);
	if (outlen == 16)
		v1 ^= 0xee;
	for (; msg != end; msg += 8)
	{
		uint64		m = sip_load64(msg);

		v3 ^= m;
		SIP_ROUND(v0, v1, v2, v3);
		SIP_ROUND(v0, v1, v2, v3);
		v0 ^= m;
	}
	for (i = (int) (len % 8) - 1; i >= 0; i--)
		b |= (uint64) msg[i] << (8 * i);
	v3 ^= b;
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	v0 ^= b;

	v2 ^= (outlen == 16) ? 0xee : 0xff;
	for (i = 0; i < 4; i++)
		SIP_ROUND(v0, v1, v2, v3);
	sip_store64(out, v0 ^ v1 ^ v2 ^ v3);
	if (outlen == 8)
		return;
	v1 ^= 0xdd;
	for (i = 0; i < 4; i++)
		SIP_ROUND(v0, v1, v2, v3);
	sip_store64(out + 8, v0 ^ v1 ^ v2 ^ v3);
}

/*
 * outbox._siphash(key bytea, message bytea, bytes int4) RETURNS bytea: the
 * SipHash-2-4 of message under key (16 bytes), 8 or 16 bytes long.  For
 * the regression test of the test vectors; only the owner may call it.
 */
Datum
outbox_siphash(PG_FUNCTION_ARGS)
{
	bytea	   *key;
	bytea	   *msg;
	int32		outlen;
	bytea	   *res;

	OutboxArgNotNull(fcinfo, 0, "key");
	OutboxArgNotNull(fcinfo, 1, "message");
	OutboxArgNotNull(fcinfo, 2, "bytes");
	key = PG_GETARG_BYTEA_PP(0);
	msg = PG_GETARG_BYTEA_PP(1);
	outlen = PG_GETARG_INT32(2);

	if (VARSIZE_ANY_EXHDR(key) != 16)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a SipHash key is 16 bytes"),
				 errdetail("The key has %d bytes.", (int) VARSIZE_ANY_EXHDR(key))));
	if (outlen != 8 && outlen != 16)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a SipHash output is 8 or 16 bytes"),
				 errdetail("The call asked for %d.", outlen)));
	res = palloc(VARHDRSZ + outlen);
	SET_VARSIZE(res, VARHDRSZ + outlen);
	OutboxSipHash((const unsigned char *) VARDATA_ANY(key),
				  (const unsigned char *) VARDATA_ANY(msg), VARSIZE_ANY_EXHDR(msg),
				  (unsigned char *) VARDATA(res), outlen);
	PG_RETURN_BYTEA_P(res);
}
