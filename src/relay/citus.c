/*-------------------------------------------------------------------------
 *
 * citus.c
 *		outbox-relay --citus: one relay per node of a Citus cluster, each a
 *		child process of a supervisor that finds the nodes.
 *
 * On a distributed outbox (docs/citus.md) a claim takes commands from the
 * shards of the node it runs on, and the coordinator holds none.  With
 * --citus the --dsn names the coordinator; this process (the supervisor)
 * reads the node list there and forks one child per node that may hold
 * shards of outbox.commands: every active primary worker, and the
 * coordinator when it holds a shard.  A child is the ordinary relay of
 * main.c (one connection: claim, LISTEN, ack), with the node's host and
 * port put into the DSN, a worker name of its own (--worker NAME, or the
 * default HOST:PID, followed by "@HOST:PORT" of the node), a metrics port
 * of its own (--metrics HOST:PORT serves the child in slot k on PORT + k)
 * and, for a file: sink, a file of its own (PATH.k).  A slot is given to a
 * node when it is first seen (in the order of pg_dist_node's nodeid: the
 * lowest slot free) and kept while the node is listed.  When the outbox is
 * not distributed, one child relays from the --dsn itself.
 *
 * The supervisor holds no connection between two readings of the node
 * list (every --citus-refresh seconds, and on SIGHUP); a node that appears
 * gets a child, a node that is gone has its child stopped (SIGTERM).  A
 * child that ends while the supervisor runs (killed by a signal, exit 1,
 * or exit 0 after a SIGTERM of its own) is started again after a backoff
 * of 1 s doubling to 60 s (back to 1 s after a child ran for a minute);
 * exit 2 (usage) stops every child and the supervisor; with --drain a
 * child that exits 0 or 1 is not started again, and the supervisor exits
 * when none is left.  SIGTERM and SIGINT are forwarded to every child as
 * SIGTERM (a second one too: it interrupts the batches in flight), SIGHUP
 * as SIGHUP.  The children run in a process group of their own, so that a
 * terminal's ^C reaches the supervisor only, and on Linux get SIGTERM when
 * the supervisor dies.  The exit status is the worst of the children's
 * last ones (a child killed by a signal counts as 1).
 *
 * Single-threaded; no locking.  The supervisor's state is this file's
 * statics, which a child never reads after the fork.
 *
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "relay.h"

/* The longest worker name the server accepts (docs/reference.md). */
#define CITUS_MAX_WORKER_LEN	200

/* One node of the cluster and its child relay. */
typedef struct CitusNode
{
	char	   *host;			/* pg_dist_node.nodename; NULL: the --dsn as
								 * given (the outbox is not distributed) */
	int			port;
	int			slot;
	pid_t		pid;			/* the running child, or 0 */
	double		started;		/* monotonic time the child started */
	double		restart_at;		/* monotonic time to start it again, or 0 */
	double		backoff;		/* the next restart's delay */
	int			last_exit;		/* the last child's exit status, -1: none */
	bool		listed;			/* in the last node list read */
	bool		done;			/* --drain: finished, not started again */
} CitusNode;

static CitusNode *nodes = NULL;
static int	nnodes = 0;
static int	maxnodes = 0;
static int	discovery_exit = RELAY_EXIT_OK;

/* A value of a conninfo string, quoted. */
static void
sb_conninfo_value(StrBuf *sb, const char *v)
{
	sb_puts(sb, "'");
	for (; *v; v++)
	{
		if (*v == '\'' || *v == '\\')
			sb_puts(sb, "\\");
		sb_append(sb, v, 1);
	}
	sb_puts(sb, "'");
}

/*
 * The DSN of a node: every setting of --dsn but the host, hostaddr and
 * port, which are the node's (malloc'd).  The DSN was parsed once already
 * (main.c), so it parses.
 */
static char *
citus_node_dsn(const char *host, int port)
{
	PQconninfoOption *opts;
	PQconninfoOption *o;
	char	   *err = NULL;
	StrBuf		sb;

	opts = PQconninfoParse(relay_opts.dsn ? relay_opts.dsn : "", &err);
	if (opts == NULL)
	{
		relay_log("--citus: could not parse --dsn: %s", err ? err : "out of memory");
		exit(RELAY_EXIT_USAGE);
	}
	sb_init(&sb);
	for (o = opts; o->keyword != NULL; o++)
	{
		if (o->val == NULL || strcmp(o->keyword, "host") == 0 ||
			strcmp(o->keyword, "hostaddr") == 0 || strcmp(o->keyword, "port") == 0)
			continue;
		sb_printf(&sb, "%s=", o->keyword);
		sb_conninfo_value(&sb, o->val);
		sb_puts(&sb, " ");
	}
	PQconninfoFree(opts);
	/* an empty hostaddr overrides PGHOSTADDR */
	sb_puts(&sb, "hostaddr='' host=");
	sb_conninfo_value(&sb, host);
	sb_printf(&sb, " port=%d", port);
	return sb.data;
}

/* Connect to the --dsn (the coordinator, as db_open); NULL, logged, on failure. */
static PGconn *
citus_connect(bool quiet)
{
	PGconn	   *conn = db_open();

	if (PQstatus(conn) != CONNECTION_OK)
	{
		if (!quiet)
		{
			char	   *msg = relay_clean_error(PQerrorMessage(conn), 400);

			relay_log("--citus: could not connect to read the node list: %s", msg);
			free(msg);
		}
		PQfinish(conn);
		return NULL;
	}
	return conn;
}

/* The node of host:port (host NULL: the --dsn itself), or NULL. */
static CitusNode *
citus_find(const char *host, int port)
{
	int			i;

	for (i = 0; i < nnodes; i++)
	{
		CitusNode  *n = &nodes[i];

		if (host == NULL ? n->host == NULL :
			(n->host != NULL && n->port == port && strcmp(n->host, host) == 0))
			return n;
	}
	return NULL;
}

/* Add a node, in the lowest slot free. */
static void
citus_add(const char *host, int port)
{
	CitusNode  *n;
	int			slot;
	int			i;

	for (slot = 0;; slot++)
	{
		for (i = 0; i < nnodes; i++)
			if (nodes[i].slot == slot)
				break;
		if (i == nnodes)
			break;
	}
	if (nnodes == maxnodes)
	{
		maxnodes = maxnodes ? maxnodes * 2 : 8;
		nodes = realloc(nodes, sizeof(CitusNode) * maxnodes);
		if (nodes == NULL)
		{
			relay_log("out of memory");
			exit(RELAY_EXIT_RUNTIME);
		}
	}
	n = &nodes[nnodes++];
	memset(n, 0, sizeof(CitusNode));
	n->host = host ? relay_strdup(host) : NULL;
	n->port = port;
	n->slot = slot;
	n->backoff = 1.0;
	n->last_exit = -1;
	n->listed = true;
}

/* How a node is named in the log. */
static const char *
citus_label(const CitusNode *n)
{
	static char buf[300];

	if (n->host == NULL)
		snprintf(buf, sizeof(buf), "coordinator (outbox not distributed)");
	else
		snprintf(buf, sizeof(buf), "node %s:%d", n->host, n->port);
	return buf;
}

/*
 * Whether a query of the node list failed: then log it, and clear res and
 * close conn.
 */
static bool
ci_list_failed(PGconn *conn, PGresult *res)
{
	char	   *msg;

	if (PQresultStatus(res) == PGRES_TUPLES_OK)
		return false;
	msg = relay_clean_error(PQresultErrorMessage(res), 400);
	relay_log("--citus: could not read the node list: %s", msg);
	free(msg);
	PQclear(res);
	PQfinish(conn);
	return true;
}

/*
 * Read the node list on the coordinator and mark the nodes listed (adding
 * the new ones).  False when it could not be read; with a fatal error
 * (no Citus, no outbox) discovery_exit is set.
 */
static bool
citus_discover(bool quiet)
{
	PGconn	   *conn = citus_connect(quiet);
	PGresult   *res;
	bool		distributed;
	int			i;

	if (conn == NULL)
		return false;
	res = PQexec(conn,
				 "SELECT pg_catalog.to_regclass('pg_catalog.pg_dist_node') IS NOT NULL,"
				 "       EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'outbox')");
	if (ci_list_failed(conn, res))
		return false;
	if (strcmp(PQgetvalue(res, 0, 0), "t") != 0 || strcmp(PQgetvalue(res, 0, 1), "t") != 0)
	{
		relay_log("--citus: database \"%s\" has no %s", PQdb(conn),
				  strcmp(PQgetvalue(res, 0, 0), "t") != 0 ?
				  "Citus (pg_catalog.pg_dist_node is missing)" : "outbox extension");
		discovery_exit = RELAY_EXIT_RUNTIME;
		PQclear(res);
		PQfinish(conn);
		return false;
	}
	PQclear(res);

	/*
	 * The nodes that hold or may get shards of outbox.commands: the active
	 * primary workers, and the coordinator (group 0) when it holds one.
	 * When the outbox is not distributed, none: the coordinator's own
	 * tables.
	 */
	res = PQexec(conn,
				 "SELECT n.nodename, n.nodeport,"
				 "       EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition d"
				 "                WHERE d.logicalrelid = 'outbox.events'::pg_catalog.regclass)"
				 "  FROM pg_catalog.pg_dist_node n"
				 " WHERE n.isactive AND n.noderole = 'primary'"
				 "   AND (n.groupid <> 0 OR EXISTS ("
				 "        SELECT 1 FROM pg_catalog.pg_dist_placement p"
				 "          JOIN pg_catalog.pg_dist_shard s ON s.shardid = p.shardid"
				 "         WHERE s.logicalrelid = 'outbox.commands'::pg_catalog.regclass"
				 "           AND p.groupid = n.groupid))"
				 " ORDER BY n.nodeid");
	if (ci_list_failed(conn, res))
		return false;
	distributed = PQntuples(res) > 0 && strcmp(PQgetvalue(res, 0, 2), "t") == 0;
	for (i = 0; i < nnodes; i++)
		nodes[i].listed = false;
	if (!distributed)
	{
		CitusNode  *n = citus_find(NULL, 0);

		if (n == NULL)
			citus_add(NULL, 0);
		else
			n->listed = true;
	}
	else
	{
		for (i = 0; i < PQntuples(res); i++)
		{
			const char *host = PQgetvalue(res, i, 0);
			int			port = atoi(PQgetvalue(res, i, 1));
			CitusNode  *n = citus_find(host, port);

			if (n == NULL)
				citus_add(host, port);
			else
				n->listed = true;
		}
	}
	PQclear(res);
	PQfinish(conn);
	return true;
}

/*
 * In the child, after the fork: make relay_opts those of the node's relay.
 * Exits 2 when the worker name would be too long for the server.
 */
static void
citus_become_child(const CitusNode *n, pid_t supervisor)
{
	char		name[CITUS_MAX_WORKER_LEN + 300];
	const char *base = relay_opts.worker;

	setpgid(0, 0);
#ifdef __linux__
	prctl(PR_SET_PDEATHSIG, SIGTERM);
#endif
	relay_signal_reinit();
	if (getppid() != supervisor)
		relay_stop = 1;			/* the supervisor is gone already */

	if (base == NULL)
		base = relay_default_worker();	/* HOST:PID of the child */
	if (n->host == NULL)
		snprintf(name, sizeof(name), "%s", base);
	else
	{
		snprintf(name, sizeof(name), "%s@%s:%d", base, n->host, n->port);
		relay_opts.dsn = citus_node_dsn(n->host, n->port);
	}
	if (strlen(name) > CITUS_MAX_WORKER_LEN)
	{
		relay_log("--citus: worker name \"%s\" is longer than %d bytes: give a shorter --worker",
				  name, CITUS_MAX_WORKER_LEN);
		exit(RELAY_EXIT_USAGE);
	}
	relay_opts.worker = relay_strdup(name);

	if (relay_opts.metrics != NULL)
	{
		char	   *h;
		char	   *p;
		StrBuf		sb;

		if (!metrics_parse(relay_opts.metrics, &h, &p))
			exit(RELAY_EXIT_USAGE);		/* checked by main.c */
		if (atoi(p) + n->slot > 65535)
		{
			relay_log("--citus: no metrics port %d for slot %d", atoi(p) + n->slot, n->slot);
			exit(RELAY_EXIT_USAGE);
		}
		sb_init(&sb);
		sb_printf(&sb, strchr(h, ':') ? "[%s]:%d" : "%s:%d", h, atoi(p) + n->slot);
		relay_opts.metrics = sb.data;
		free(h);
		free(p);
	}
	if (strncmp(relay_opts.sink, "file:", 5) == 0 && relay_opts.sink[5] != '\0')
	{
		StrBuf		sb;

		sb_init(&sb);
		sb_printf(&sb, "%s.%d", relay_opts.sink, n->slot);
		relay_opts.sink = sb.data;
	}
	srandom((unsigned int) getpid() ^ (unsigned int) (relay_now() * 1000));
}

/* Start a node's child; true in the child (which then runs as a relay). */
static bool
citus_start(CitusNode *n, pid_t supervisor)
{
	pid_t		pid;

	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0)
	{
		relay_log("--citus: could not fork a relay for %s: %s", citus_label(n), strerror(errno));
		n->restart_at = relay_now() + n->backoff;
		return false;
	}
	if (pid == 0)
	{
		citus_become_child(n, supervisor);
		return true;
	}
	n->pid = pid;
	n->started = relay_now();
	n->restart_at = 0;
	relay_log("--citus: %s: relay %d started (slot %d)", citus_label(n), (int) pid, n->slot);
	return false;
}

/* Send a signal to every running child. */
static void
citus_signal_all(int signo)
{
	int			i;

	for (i = 0; i < nnodes; i++)
		if (nodes[i].pid > 0)
			kill(nodes[i].pid, signo);
}

/* Remove the nodes no longer listed whose child is gone. */
static void
citus_forget(void)
{
	int			i = 0;

	while (i < nnodes)
	{
		if (!nodes[i].listed && nodes[i].pid == 0)
		{
			relay_log("--citus: %s is no longer listed", citus_label(&nodes[i]));
			free(nodes[i].host);
			nodes[i] = nodes[--nnodes];
		}
		else
			i++;
	}
}

/*
 * Collect the children that exited and decide what follows: a restart, or
 * nothing (--drain, a node no longer listed).  Sets *usage when one exited
 * with 2.
 */
static void
citus_reap(bool stopping, bool *usage)
{
	for (;;)
	{
		int			status;
		pid_t		pid = waitpid(-1, &status, WNOHANG);
		CitusNode  *n = NULL;
		int			code;
		int			i;

		if (pid <= 0)
			return;
		for (i = 0; i < nnodes; i++)
			if (nodes[i].pid == pid)
				n = &nodes[i];
		if (n == NULL)
			continue;
		n->pid = 0;
		if (WIFEXITED(status))
		{
			code = WEXITSTATUS(status);
			relay_log("--citus: %s: relay %d exited with status %d", citus_label(n), (int) pid, code);
		}
		else
		{
			code = RELAY_EXIT_RUNTIME;
			relay_log("--citus: %s: relay %d was killed by signal %d", citus_label(n), (int) pid,
					  WIFSIGNALED(status) ? WTERMSIG(status) : 0);
		}
		n->last_exit = code;
		if (code == RELAY_EXIT_USAGE)
			*usage = true;
		if (stopping || !n->listed || code == RELAY_EXIT_USAGE)
			continue;
		if (relay_opts.drain && WIFEXITED(status))
		{
			n->done = true;
			continue;
		}
		if (relay_now() - n->started >= 60)
			n->backoff = 1.0;
		n->restart_at = relay_now() + n->backoff;
		relay_log("--citus: %s: starting a relay again in %.0fs", citus_label(n), n->backoff);
		n->backoff = n->backoff * 2 > 60 ? 60 : n->backoff * 2;
	}
}

/*
 * Run the supervisor: returns only in a child, with relay_opts made those
 * of its node's relay; the supervisor itself exits.
 */
void
citus_supervise(void)
{
	pid_t		self = getpid();
	double		backoff = 1.0;
	double		next_read;
	int			forwarded = 0;
	bool		usage = false;
	int			worst = RELAY_EXIT_OK;
	int			i;
	struct stat st;

	/* the stdout sink would be shared by the children: lines could mix */
	if (strcmp(relay_opts.sink, "stdout") == 0 && fstat(STDOUT_FILENO, &st) == 0 &&
		(S_ISFIFO(st.st_mode) || S_ISREG(st.st_mode) || S_ISSOCK(st.st_mode)))
	{
		relay_log("--citus: the stdout sink would be shared by the relays of all nodes; "
				  "use file:PATH (a file per node) or a broker");
		exit(RELAY_EXIT_USAGE);
	}
	relay_log("--citus: reading the node list every %.1fs", relay_opts.citus_refresh);

	/* the first node list, retried until it is read */
	while (!citus_discover(false))
	{
		if (discovery_exit != RELAY_EXIT_OK || relay_stop)
			exit(discovery_exit);
		relay_sleep(backoff);
		backoff = backoff * 2 > 30 ? 30 : backoff * 2;
	}
	next_read = relay_now() + relay_opts.citus_refresh;

	for (;;)
	{
		bool		running = false;
		bool		pending = false;

		if (relay_stop > forwarded)
		{
			relay_log("--citus: stop requested: stopping the relays");
			citus_signal_all(SIGTERM);
			forwarded = relay_stop;
		}
		citus_reap(relay_stop > 0 || usage, &usage);
		if (usage && forwarded == 0)
		{
			relay_log("--citus: a relay exited with status 2: stopping the others");
			citus_signal_all(SIGTERM);
			forwarded = 1;
		}
		if (relay_reopen && forwarded == 0)
		{
			relay_reopen = 0;
			citus_signal_all(SIGHUP);
			next_read = 0;
		}
		if (forwarded == 0 && !relay_opts.drain && relay_now() >= next_read)
		{
			if (citus_discover(true))
			{
				for (i = 0; i < nnodes; i++)
					if (!nodes[i].listed && nodes[i].pid > 0)
					{
						relay_log("--citus: %s is no longer listed: stopping its relay",
								  citus_label(&nodes[i]));
						kill(nodes[i].pid, SIGTERM);
					}
			}
			discovery_exit = RELAY_EXIT_OK;
			next_read = relay_now() + relay_opts.citus_refresh;
		}
		if (forwarded == 0)
		{
			citus_forget();
			for (i = 0; i < nnodes; i++)
			{
				CitusNode  *n = &nodes[i];

				if (n->pid > 0 || n->done || !n->listed)
					continue;
				if (n->last_exit < 0 || (n->restart_at > 0 && relay_now() >= n->restart_at))
				{
					if (citus_start(n, self))
						return;	/* the child */
				}
			}
		}
		for (i = 0; i < nnodes; i++)
		{
			if (nodes[i].pid > 0)
				running = true;
			else if (forwarded == 0 && nodes[i].listed && !nodes[i].done && nodes[i].restart_at > 0)
				pending = true;
		}
		if (!running && (forwarded > 0 || !pending) && (forwarded > 0 || relay_opts.drain))
			break;
		relay_sleep(0.25);
	}

	for (i = 0; i < nnodes; i++)
		if (nodes[i].last_exit > worst)
			worst = nodes[i].last_exit;
	relay_log("--citus: summary: nodes=%d exit=%d", nnodes, worst);
	exit(worst);
}
