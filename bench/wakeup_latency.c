/*
 * wakeup_latency.c
 *		Commit-to-publisher latency of the outbox wake-up, for bench/wakeup.sh.
 *
 *	wakeup_latency CONNINFO listen N
 *		A publisher LISTENs on outbox.notify_channel; a producer commits N
 *		decisions, 20-40 ms apart.  For each: the time from sending COMMIT to
 *		the publisher receiving the notification, and to the publisher having
 *		claimed (and acked) the command after it.
 *
 *	wakeup_latency CONNINFO poll N INTERVAL_MS
 *		The baseline: the publisher claims every INTERVAL_MS instead; the
 *		latency is from sending COMMIT to the claim that returned the command.
 *
 * Prints one line per measured series: name, count, p50, p90, p99, max (ms).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/select.h>

#include "libpq-fe.h"

#define KIND "bench_wakeup"

static double
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
}

static void
sleep_ms(double ms)
{
	struct timespec ts;

	ts.tv_sec = (time_t) (ms / 1000);
	ts.tv_nsec = (long) ((ms - ts.tv_sec * 1000.0) * 1e6);
	nanosleep(&ts, NULL);
}

static void
die(PGconn *conn, const char *what)
{
	fprintf(stderr, "%s: %s", what, conn ? PQerrorMessage(conn) : "\n");
	exit(1);
}

/* Run a command that must succeed; return its result (caller clears). */
static PGresult *
run(PGconn *conn, const char *sql)
{
	PGresult   *res = PQexec(conn, sql);

	if (PQresultStatus(res) != PGRES_COMMAND_OK &&
		PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		fprintf(stderr, "%s\n", sql);
		die(conn, "query failed");
	}
	return res;
}

static int
cmp_double(const void *a, const void *b)
{
	double		x = *(const double *) a;
	double		y = *(const double *) b;

	return (x > y) - (x < y);
}

static void
report(const char *name, double *v, int n)
{
	qsort(v, n, sizeof(double), cmp_double);
	printf("%-28s n=%d p50=%.2f p90=%.2f p99=%.2f max=%.2f ms\n", name, n,
		   v[(int) (n * 0.50)], v[(int) (n * 0.90)],
		   v[n * 99 / 100 < n ? n * 99 / 100 : n - 1], v[n - 1]);
}

/* Claim and ack everything of KIND; the result lists the ids acked. */
static PGresult *
claim_and_ack(PGconn *pub)
{
	return run(pub,
			   "WITH c AS MATERIALIZED ("
			   "  SELECT * FROM outbox.claim('bench', 1000, NULL, ARRAY['" KIND "']))"
			   " SELECT r.command_id FROM outbox.ack_many('bench',"
			   "   ARRAY(SELECT token FROM c)) r");
}

/* Producer: BEGIN and the decision; COMMIT is sent by the caller. */
static void
decide(PGconn *prod, long run_id, int i)
{
	char		sql[512];

	PQclear(run(prod, "BEGIN"));
	snprintf(sql, sizeof(sql),
			 "SELECT outbox.commit_decision('wk-%ld', %d, 'e', 'wk-%ld-%d', '" KIND "', '{}')",
			 run_id, i, run_id, i);
	PQclear(run(prod, sql));
}

int
main(int argc, char **argv)
{
	PGconn	   *prod;
	PGconn	   *pub;
	int			n;
	long		run_id = (long) time(NULL);
	double	   *notify_ms;
	double	   *claim_ms;
	int			i;

	if (argc < 4 || (strcmp(argv[2], "listen") != 0 && strcmp(argv[2], "poll") != 0) ||
		(strcmp(argv[2], "poll") == 0 && argc < 5))
	{
		fprintf(stderr, "usage: %s CONNINFO listen N | CONNINFO poll N INTERVAL_MS\n", argv[0]);
		return 2;
	}
	n = atoi(argv[3]);
	srandom((unsigned) run_id);
	prod = PQconnectdb(argv[1]);
	pub = PQconnectdb(argv[1]);
	if (PQstatus(prod) != CONNECTION_OK)
		die(prod, "connect");
	if (PQstatus(pub) != CONNECTION_OK)
		die(pub, "connect");
	PQclear(claim_and_ack(pub));
	notify_ms = calloc(n, sizeof(double));
	claim_ms = calloc(n, sizeof(double));

	if (strcmp(argv[2], "listen") == 0)
	{
		PGresult   *res = run(pub, "SELECT current_setting('outbox.notify_channel')");
		char		listen_sql[200];

		snprintf(listen_sql, sizeof(listen_sql), "LISTEN \"%s\"", PQgetvalue(res, 0, 0));
		PQclear(res);
		PQclear(run(pub, listen_sql));

		for (i = 0; i < n; i++)
		{
			double		t0;
			double		t_notify = 0;
			int			committed = 0;
			PGnotify   *note;

			sleep_ms(20 + random() % 21);
			/* Forget notifications left over from the previous round. */
			PQconsumeInput(pub);
			while ((note = PQnotifies(pub)) != NULL)
				PQfreemem(note);

			decide(prod, run_id, i);
			t0 = now_ms();
			if (!PQsendQuery(prod, "COMMIT"))
				die(prod, "COMMIT");
			while (!committed || t_notify == 0)
			{
				fd_set		rfds;
				int			maxfd;

				FD_ZERO(&rfds);
				maxfd = PQsocket(pub);
				FD_SET(PQsocket(pub), &rfds);
				if (!committed)
				{
					FD_SET(PQsocket(prod), &rfds);
					if (PQsocket(prod) > maxfd)
						maxfd = PQsocket(prod);
				}
				if (select(maxfd + 1, &rfds, NULL, NULL, NULL) < 0)
					die(NULL, "select");
				if (t_notify == 0 && FD_ISSET(PQsocket(pub), &rfds))
				{
					PQconsumeInput(pub);
					if ((note = PQnotifies(pub)) != NULL)
					{
						t_notify = now_ms();
						PQfreemem(note);
					}
				}
				if (!committed && FD_ISSET(PQsocket(prod), &rfds))
				{
					PGresult   *r;

					PQconsumeInput(prod);
					while (!PQisBusy(prod) && (r = PQgetResult(prod)) != NULL)
					{
						if (PQresultStatus(r) != PGRES_COMMAND_OK)
							die(prod, "COMMIT");
						PQclear(r);
						committed = 1;
					}
				}
			}
			notify_ms[i] = t_notify - t0;
			PQclear(claim_and_ack(pub));
			claim_ms[i] = now_ms() - t0;
		}
		report("listen: commit->notified", notify_ms, n);
		report("listen: commit->claimed", claim_ms, n);
	}
	else
	{
		double		interval = atof(argv[4]);
		double	   *t0 = calloc(n, sizeof(double));
		double		next_poll = now_ms() + interval;
		double		next_commit = now_ms() + 20 + random() % 21;
		int			sent = 0;
		int			seen = 0;

		while (seen < n)
		{
			if (sent < n && next_commit <= next_poll)
			{
				double		w = next_commit - now_ms();

				if (w > 0)
					sleep_ms(w);
				decide(prod, run_id, sent);
				t0[sent] = now_ms();
				PQclear(run(prod, "COMMIT"));
				sent++;
				next_commit = now_ms() + 20 + random() % 21;
			}
			else
			{
				double		w = next_poll - now_ms();
				PGresult   *res;
				double		t;
				int			j;

				if (w > 0)
					sleep_ms(w);
				/* A slow claim skips the ticks it overran. */
				next_poll += interval;
				if (next_poll < now_ms())
					next_poll = now_ms() + interval;
				res = claim_and_ack(pub);
				t = now_ms();
				for (j = 0; j < PQntuples(res); j++)
				{
					const char *id = PQgetvalue(res, j, 0);
					const char *dash = strrchr(id, '-');
					int			k = atoi(dash + 1);

					if (k >= 0 && k < n && seen < n)
						claim_ms[seen++] = t - t0[k];
				}
				PQclear(res);
			}
		}
		report("poll: commit->claimed", claim_ms, n);
		free(t0);
	}

	PQfinish(prod);
	PQfinish(pub);
	return 0;
}
