/*-------------------------------------------------------------------------
 *
 * outbox.c
 *		Module load and the GUCs.
 *
 * The top layer of the extension: _PG_init defines every outbox.* setting
 * and, when the library is in shared_preload_libraries, asks shared.c for
 * its shared memory and hooks and bgw.c to register the launcher.  Nothing
 * here is called by another file of the extension (the other files read the
 * GUC variables declared in outbox.h).
 *
 * Locking: none.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/guc.h"
#include "utils/memutils.h"
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
int			outbox_stream_rotation_s = 600;
int			outbox_max_payload_bytes = 1024 * 1024;
int			outbox_max_batch = 10000;
char	   *outbox_notify_channel = NULL;
int			outbox_receipt_overdue_s = 3600;
int			outbox_max_workers = 8;
char	   *outbox_databases = NULL;
int			outbox_notify_interval_ms = 10;
int			outbox_notify_idle_interval_ms = 1;
double		outbox_index_bloat = 3.0;
int			outbox_index_check_interval_ms = 60000;
int			outbox_check_interval_ms = 300000;

void		_PG_init(void);
static bool ob_check_channel(char **newval, void **extra, GucSource source);
static bool ob_check_databases(char **newval, void **extra, GucSource source);
static bool ob_check_index_bloat(double *newval, void **extra, GucSource source);

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
	DefineCustomIntVariable("outbox.stream_rotation",
							"How long a stream log table takes the appends before the next one does (docs/streams.md).",
							"A table is truncated once every subscription has published its commands, their receipts are in and their retention has passed.",
							&outbox_stream_rotation_s,
							600, 1, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S,
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

	DefineCustomIntVariable("outbox.notify_idle_interval",
							"Shortest time between two wake-up notifications of a worker while a publisher waits (a claim of every kind found nothing); at most outbox.notify_interval.",
							NULL,
							&outbox_notify_idle_interval_ms,
							1, 0, 60 * 1000,
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

	DefineCustomIntVariable("outbox.check_interval",
							"How often the background worker counts the conservation checks into outbox.check_results.",
							NULL,
							&outbox_check_interval_ms,
							300000, 1000, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	MarkGUCPrefixReserved("outbox");
	OutboxCitusInit();

	if (!process_shared_preload_libraries_in_progress)
		return;

	OutboxSharedInit();
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
