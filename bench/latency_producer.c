/*
 * latency_producer.c
 *		The producer of bench/latency.sh: business transactions committing
 *		one decision each at a given mean rate, with the time of each COMMIT.
 *
 *	latency_producer CONNINFO RATE SECONDS CONNECTIONS RUN OUT
 *		Starts transactions at RATE per second on average for SECONDS
 *		(exponential gaps, as pgbench -R), on up to CONNECTIONS connections
 *		(a start that finds every connection busy waits for one).  Each
 *		transaction is "BEGIN; SELECT outbox.commit_decision(...)" and then
 *		"COMMIT"; command i is "RUN-i" (kind "lat", seq i, run RUN).  OUT
 *		gets one line per command: command_id, the wall-clock time the
 *		COMMIT was sent and the time its answer came, in milliseconds with
 *		microseconds.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/select.h>

#include "libpq-fe.h"

typedef struct Conn
{
	PGconn	   *pg;
	int			state;			/* 0 idle, 1 in BEGIN + decision, 2 in COMMIT */
	long		cmd;			/* the command of the transaction in progress */
} Conn;

static double
wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
}

static void
die(PGconn *conn, const char *what)
{
	fprintf(stderr, "latency_producer: %s: %s", what, conn ? PQerrorMessage(conn) : "\n");
	exit(1);
}

/* Read what arrived on c; true when its current query has finished. */
static int
finished(Conn *c)
{
	PGresult   *r;

	if (!PQconsumeInput(c->pg))
		die(c->pg, "connection");
	while (!PQisBusy(c->pg))
	{
		r = PQgetResult(c->pg);
		if (r == NULL)
			return 1;
		if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
			die(c->pg, "query failed");
		PQclear(r);
	}
	return 0;
}

int
main(int argc, char **argv)
{
	double		rate;
	double		seconds;
	int			nconn;
	const char *run;
	FILE	   *out;
	Conn	   *conns;
	double	   *sent;
	double	   *done;
	long		max_cmds;
	long		started = 0;
	long		finished_cmds = 0;
	double		t_start;
	double		next;
	int			i;

	if (argc != 7)
	{
		fprintf(stderr, "usage: %s CONNINFO RATE SECONDS CONNECTIONS RUN OUT\n", argv[0]);
		return 2;
	}
	rate = atof(argv[2]);
	seconds = atof(argv[3]);
	nconn = atoi(argv[4]);
	run = argv[5];
	if (rate <= 0 || seconds <= 0 || nconn < 1)
	{
		fprintf(stderr, "latency_producer: bad RATE, SECONDS or CONNECTIONS\n");
		return 2;
	}
	out = fopen(argv[6], "w");
	if (out == NULL)
	{
		perror(argv[6]);
		return 1;
	}
	max_cmds = (long) (rate * seconds * 2 + 100);
	sent = calloc(max_cmds, sizeof(double));
	done = calloc(max_cmds, sizeof(double));
	conns = calloc(nconn, sizeof(Conn));
	for (i = 0; i < nconn; i++)
	{
		conns[i].pg = PQconnectdb(argv[1]);
		if (PQstatus(conns[i].pg) != CONNECTION_OK)
			die(conns[i].pg, "connect");
		if (PQsetnonblocking(conns[i].pg, 1) != 0)
			die(conns[i].pg, "nonblocking");
	}
	srandom((unsigned) time(NULL));
	t_start = wall_ms();
	next = t_start;

	for (;;)
	{
		double		now = wall_ms();
		int			busy = 0;
		fd_set		rfds;
		int			maxfd = -1;
		struct timeval tv;
		double		wait;

		/* start the transactions that are due, on idle connections */
		while (next <= now && next < t_start + seconds * 1000 && started < max_cmds)
		{
			Conn	   *c = NULL;
			char		sql[400];

			for (i = 0; i < nconn; i++)
				if (conns[i].state == 0)
				{
					c = &conns[i];
					break;
				}
			if (c == NULL)
				break;
			snprintf(sql, sizeof(sql),
					 "BEGIN; SELECT outbox.commit_decision('%s', %ld, 'decided', '%s-%ld', 'lat',"
					 " '{\"to\": \"someone@example.org\"}')", run, started, run, started);
			if (!PQsendQuery(c->pg, sql))
				die(c->pg, "send");
			c->state = 1;
			c->cmd = started++;
			/* exponential gaps with mean 1/rate */
			next += -log((random() + 1.0) / ((double) RAND_MAX + 2.0)) * 1000.0 / rate;
		}

		for (i = 0; i < nconn; i++)
			if (conns[i].state != 0)
				busy++;
		if (busy == 0 && (next >= t_start + seconds * 1000 || started >= max_cmds))
			break;

		FD_ZERO(&rfds);
		for (i = 0; i < nconn; i++)
			if (conns[i].state != 0)
			{
				int			s = PQsocket(conns[i].pg);

				PQflush(conns[i].pg);
				FD_SET(s, &rfds);
				if (s > maxfd)
					maxfd = s;
			}
		wait = next - wall_ms();
		if (wait < 0)
			wait = 0;
		if (wait > 100)
			wait = 100;
		tv.tv_sec = 0;
		tv.tv_usec = (long) (wait * 1000);
		if (select(maxfd + 1, &rfds, NULL, NULL, &tv) < 0)
			die(NULL, "select");
		for (i = 0; i < nconn; i++)
		{
			Conn	   *c = &conns[i];

			if (c->state == 0 || !FD_ISSET(PQsocket(c->pg), &rfds) || !finished(c))
				continue;
			if (c->state == 1)
			{
				if (!PQsendQuery(c->pg, "COMMIT"))
					die(c->pg, "send");
				sent[c->cmd] = wall_ms();
				c->state = 2;
			}
			else
			{
				done[c->cmd] = wall_ms();
				c->state = 0;
				finished_cmds++;
			}
		}
	}

	for (i = 0; i < started; i++)
		fprintf(out, "%s-%d\t%.3f\t%.3f\n", run, i, sent[i], done[i]);
	if (fclose(out) != 0)
	{
		perror(argv[6]);
		return 1;
	}
	for (i = 0; i < nconn; i++)
		PQfinish(conns[i].pg);
	fprintf(stderr, "latency_producer: %ld commands in %.1f s\n", finished_cmds,
			(wall_ms() - t_start) / 1000.0);
	return 0;
}
