/*-------------------------------------------------------------------------
 *
 * main.c
 *		outbox-relay: command line, the claim/deliver/report loop, signals
 *		and reconnection.
 *
 * The loop.  Claim up to --batch commands with a lease; have the sink
 * deliver them (sink.h: it returns once the broker confirmed or refused
 * each one); report the batch (one array ack for the delivered
 * commands, one fail per failed command); claim again at once.  When a
 * claim finds nothing, wait for a notification on outbox.notify_channel
 * (sent by the extension's background worker after producers commit) or
 * for --poll seconds, whichever comes first: the poll is the backstop that
 * makes the relay work without notifications.
 *
 * Pipelining.  The claim of the next batch is sent (libpq's pipeline
 * mode, db.c) before the sink delivers the current one, so the database
 * works on it while the sink waits for the broker's confirmations; and
 * once the sink has returned (every command confirmed or refused), the
 * batch's ack is sent without waiting for its answer before the next batch
 * is delivered.  So the relay holds at most three batches: one acked (its
 * ack on its way), one delivered, one claimed ahead (at most one batch
 * ahead).  Nothing is acked before the sink returned with the broker's
 * confirmation of it.  Each batch has its own tokens, so a refusal (OB001)
 * of one does not touch the others.  Order per key holds: the database
 * hands out no command of an ordering key whose earlier command is not
 * acked, and no second batch of a stream partition whose batch is open, so
 * the batch claimed ahead holds none of the keys (partitions) of the one
 * being delivered.  No claim goes ahead while stopping, during an outage
 * or with a broken sink; a batch claimed ahead is delivered after the
 * current one, renewed with it during an outage, and given back as
 * retryable failures when the relay stops before delivering it (a second
 * stop request, a stop during an outage, a broken sink).  A batch with
 * failed commands (a fail call each) is reported at once, not pipelined.
 * With a sink that delivers now and confirms later (sink.h: submit and
 * settle: the broker sinks), the batch claimed ahead is submitted while the
 * current one is being settled, as soon as its claim is in (submit_ahead,
 * from the sink's tick), so the broker works on both; a submitted batch is
 * always settled, also when it is given back.
 *
 * Hand-over.  The pipelined ack of a batch with ordered commands is an
 * ack_handover (db.c) while fewer than RELAY_HANDED handed batches are in
 * hand: the server leases the next command of each key acked to this
 * worker in the ack's own transaction, and those leases are a handed
 * batch, delivered like a claimed one (renewed, given back when the relay
 * stops, taken over by others if the relay dies), in the order the acks
 * were sent.  A claim goes ahead only while no handed batch is in hand or
 * on its way (or one is and the current batch is under half full: its
 * keys are running out), so that a relay runs up to two chains of keys,
 * the ack of the one on its way while the other is delivered, and holds
 * at most five batches: one being acked, one delivered, one claimed
 * ahead, two handed over.  Order per key holds as with claims: the server
 * hands over a key's command only in the transaction that acks the one
 * before it.
 *
 * Idle probe.  After --probe-interval seconds without a delivery, while
 * waiting for work, the relay asks the sink to probe its broker (sink.h)
 * and sets outbox_relay_sink_up from the answer, logging a change.
 *
 * Leases.  A batch's leases are renewed when half of the shortest one has
 * passed and commands of the batch are still undelivered (the delivered
 * ones are acked first).  A renewal refused with lease_not_owned drops the
 * command from the batch: someone else owns it now.
 *
 * Outages.  When the sink finds its broker down or refusing the relay
 * (no connection, authentication, HTTP 401/403/404), the commands it could
 * not deliver are held, not failed: no delivery is spent on an outage.
 * The relay reports what has an outcome, logs one line, stops claiming,
 * and tries the held commands again after a backoff (0.5 s doubling to
 * 30 s), renewing their leases meanwhile; it logs one line again when the
 * sink is back.  A stop request during an outage hands the held commands
 * back as retryable failures.  A sink URL that is wrong ends the relay at
 * start-up with exit 2.
 *
 * Failures.  A lost connection is re-established with exponential backoff
 * (0.1 s doubling to 10 s, with jitter).  Outcomes of a batch that could
 * not be reported yet are kept and reported on the new connection with
 * the same tokens, which the server still accepts unless another worker
 * took the commands over meanwhile (then they are counted as stale: a
 * duplicate delivery, never a loss).  A kill -9 at any point loses
 * nothing: the leases expire and another relay takes the commands over.
 *
 * Streams.  With --stream and --subscription the relay claims the
 * subscription's batches instead (claim_batch), reports each batch in one
 * ack_batch once every command of it has an outcome, and renews it with
 * renew_batch (db.c); the loop is the same.
 *
 * Signals.  SIGTERM or SIGINT: stop claiming, finish and report the
 * batches in hand (the one being delivered, then the one claimed ahead),
 * exit 0.  A second one: abort the deliveries in progress, fail the rest of
 * both batches as retryable, exit 0.  SIGHUP: reopen a file sink.
 *
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "sink.h"

static Sink *sink = NULL;
static int	exit_code = RELAY_EXIT_OK;
static bool sink_broken = false;
static double backoff = 0;		/* current reconnect/retry backoff */
static bool ever_connected = false;
static double outage_since = 0; /* monotonic time the sink went down, or 0 */
static double outage_ended = 0; /* monotonic time the last outage ended */

/* For the trace of -vv: wall-clock milliseconds of a batch's steps. */
static double trace_woke = 0;	/* a notification ended the wait before the
								 * claim, or 0 */

/*
 * The batches the relay holds (see "Pipelining" in the file header): the
 * one the sink delivers, the next one claimed meanwhile, and the one whose
 * ack is on its way.  Each points into slots, or is NULL.
 */
#define RELAY_HANDED 2
static RelayBatch slots[3 + RELAY_HANDED];
static RelayBatch *cur = NULL;
static RelayBatch *ahead = NULL;
static RelayBatch *acking = NULL;
/* the handed batches, oldest first: filled, or to be filled by an ack on its way */
static RelayBatch *handed[RELAY_HANDED];
static int	nhanded = 0;

/*
 * Claims ahead that came back empty in a row, and batches to deliver
 * before the next claim ahead (see the main loop).
 */
static int	ahead_empty = 0;
static int	ahead_skip = 0;

/* The idle probe: monotonic time the sink last did something. */
static double sink_active_at = 0;
static bool probe_down = false;	/* the last probe found the sink down */

/* Print --help. */
static void
usage(void)
{
	printf("%s publishes the commands of the outbox PostgreSQL extension.\n\n", RELAY_NAME);
	printf("Usage:\n"
		   "  %s --sink SINK [--dsn CONNINFO] [OPTION]...\n\n", RELAY_NAME);
	printf("Options:\n"
		   "  -d, --dsn=CONNINFO        libpq connection string or URI (default: PG* environment)\n"
		   "      --citus               the DSN is a Citus coordinator: run a relay per node\n"
		   "                            holding shards of the outbox (see the man page)\n"
		   "      --citus-refresh=SECONDS  --citus: read the node list this often (default 10)\n"
		   "  -s, --sink=SINK           where to publish: a URL (see Sinks below)\n"
		   "  -b, --batch=N             commands claimed per batch (default 100)\n"
		   "  -l, --lease=SECONDS       lease per claim (default: the kind's policy or\n"
		   "                            outbox.default_lease)\n"
		   "  -k, --kinds=K1,K2         deliver only these command kinds (default: all)\n"
		   "      --stream=NAME         publish the batches of this stream (with\n"
		   "                            --subscription; the stream's batch_size sizes\n"
		   "                            them, --batch and --kinds do not apply)\n"
		   "      --subscription=NAME   the stream's subscription to publish\n"
		   "  -w, --worker=NAME         worker name owning the leases (default HOST:PID)\n"
		   "  -p, --poll=SECONDS        poll interval when no notification comes (default 1)\n"
		   "      --timeout=SECONDS     HTTP request timeout (default 10)\n"
		   "      --connect-timeout=SECONDS  HTTP connect timeout (default 5)\n"
		   "  -c, --concurrency=N       HTTP requests in flight at once (default 1: one at\n"
		   "                            a time, in claim order)\n"
		   "  -H, --header='NAME: VALUE'  extra HTTP header (repeatable)\n"
		   "      --drain               exit 0 as soon as a claim finds nothing\n"
		   "      --claim-commit=MODE   async (default): a claim does not wait for its WAL\n"
		   "                            flush (a crash can lose it: its commands are only\n"
		   "                            delayed); sync: it waits\n"
		   "      --ack-commit=MODE     sync (default): an ack waits for its WAL flush;\n"
		   "                            async: it does not (a crash can lose it: its\n"
		   "                            commands are delivered again, never lost)\n"
		   "      --handover=on|off     on (default): the ack of a key's command leases the\n"
		   "                            key's next one to this relay (outbox.ack_handover)\n"
		   "      --metrics=HOST:PORT   serve Prometheus metrics at http://HOST:PORT/metrics\n"
		   "      --probe-interval=SECONDS  probe an idle sink's broker after this long\n"
		   "                            without a delivery (default 10; 0: never)\n"
		   "  -v, --verbose             log every batch\n"
		   "  -V, --version             print the version and exit\n"
		   "  -h, --help                print this help and exit\n\n");
	printf("Sinks (built with: %s):\n", sink_names());
	sink_print_usage(stdout);
	printf("  A sink that is down or refuses the relay holds the batch (no delivery is\n"
		   "  spent), pauses claiming and retries with backoff; a bad URL exits 2.\n\n");
	printf("Signals:\n"
		   "  SIGTERM, SIGINT     stop claiming, finish the batches in hand, exit 0;\n"
		   "                      a second one fails what is left of them (retryable)\n"
		   "  SIGHUP              reopen the file of a file: sink\n\n");
	printf("Exit status:\n"
		   "  0  stopped by a signal, or --drain found nothing to claim\n"
		   "  1  runtime error: the database refused the relay (extension missing,\n"
		   "     privileges, bad settings) or the sink could not be written\n"
		   "  2  usage error: a bad option, DSN or sink URL\n");
}

/* Wall-clock milliseconds, for the trace (comparable across processes). */
static double
trace_clock(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double) ts.tv_sec * 1000.0 + (double) ts.tv_nsec / 1e6;
}

/*
 * With -vv, one line per batch: when a notification woke the relay (0: the
 * claim followed the previous batch), when the claim was sent and when it
 * returned, when the sink returned and when the outcomes were reported, and
 * the seq of each command (numbers: nothing a producer can forge a line
 * with).  bench/latency.sh reads it.
 */
static void
trace_batch(const RelayBatch *batch, double reported)
{
	StrBuf		sb;
	int			i;

	sb_init(&sb);
	for (i = 0; i < batch->n; i++)
		sb_printf(&sb, "%s%lld", i > 0 ? "," : "", batch->cmds[i].seq);
	relay_log("trace: n=%d woke=%.3f claim=%.3f claimed=%.3f delivered=%.3f acked=%.3f seqs=%s",
			  batch->n, batch->woke, batch->claim_sent, batch->claimed_wall,
			  batch->delivered_wall, reported, sb.data);
	sb_free(&sb);
}

/* Report a usage error and exit 2. */
static void
usage_error(const char *fmt, const char *arg)
{
	fprintf(stderr, "%s: ", RELAY_NAME);
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\nTry \"%s --help\" for more information.\n", RELAY_NAME);
	exit(RELAY_EXIT_USAGE);
}

/* Parse a positive number of seconds. */
static double
parse_seconds(const char *arg, const char *opt)
{
	char	   *end;
	double		v;

	errno = 0;
	v = strtod(arg, &end);
	if (errno != 0 || end == arg || *end != '\0' || !(v > 0) || v > 86400 * 365)
	{
		char		fmt[128];

		snprintf(fmt, sizeof(fmt), "invalid value \"%%s\" for %s: a positive number of seconds is expected", opt);
		usage_error(fmt, arg);
	}
	return v;
}

/* Turn "a,b" into the text[] literal {"a","b"}. */
static const char *
parse_kinds(const char *arg)
{
	StrBuf		sb;
	const char *p = arg;

	sb_init(&sb);
	sb_puts(&sb, "{");
	for (;;)
	{
		const char *comma = strchr(p, ',');
		size_t		len = comma ? (size_t) (comma - p) : strlen(p);
		char	   *k;

		if (len == 0)
			usage_error("invalid value \"%s\" for --kinds: empty kind name", arg);
		k = relay_malloc(len + 1);
		memcpy(k, p, len);
		k[len] = '\0';
		if (sb.len > 1)
			sb_puts(&sb, ",");
		sb_array_elem(&sb, k);
		free(k);
		if (comma == NULL)
			break;
		p = comma + 1;
	}
	sb_puts(&sb, "}");
	return sb.data;
}

/*
 * libpq checks the port only when it connects, and the relay would retry
 * that forever: check it here (a comma-separated list, empty items allowed).
 */
static void
check_dsn_ports(PQconninfoOption *opts)
{
	PQconninfoOption *o;

	for (o = opts; o->keyword != NULL; o++)
	{
		const char *p;

		if (strcmp(o->keyword, "port") != 0 || o->val == NULL)
			continue;
		for (p = o->val; *p;)
		{
			size_t		len = strcspn(p, ",");
			char	   *end;
			long		v;

			if (len > 0)
			{
				errno = 0;
				v = strtol(p, &end, 10);
				if (errno != 0 || end != p + len || v < 1 || v > 65535 || !isdigit((unsigned char) *p))
					usage_error("invalid --dsn: invalid port number \"%s\"", o->val);
			}
			p += len;
			if (*p == ',')
				p++;
		}
	}
}

/* Parse the command line into relay_opts. */
static void
parse_options(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"dsn", required_argument, NULL, 'd'},
		{"citus", no_argument, NULL, 40},
		{"citus-refresh", required_argument, NULL, 41},
		{"sink", required_argument, NULL, 's'},
		{"batch", required_argument, NULL, 'b'},
		{"lease", required_argument, NULL, 'l'},
		{"kinds", required_argument, NULL, 'k'},
		{"worker", required_argument, NULL, 'w'},
		{"poll", required_argument, NULL, 'p'},
		{"timeout", required_argument, NULL, 1},
		{"connect-timeout", required_argument, NULL, 2},
		{"concurrency", required_argument, NULL, 'c'},
		{"header", required_argument, NULL, 'H'},
		{"drain", no_argument, NULL, 3},
		{"metrics", required_argument, NULL, 4},
		{"claim-commit", required_argument, NULL, 5},
		{"ack-commit", required_argument, NULL, 6},
		{"probe-interval", required_argument, NULL, 7},
		{"handover", required_argument, NULL, 8},
		{"stream", required_argument, NULL, 20},
		{"subscription", required_argument, NULL, 21},
		{"verbose", no_argument, NULL, 'v'},
		{"version", no_argument, NULL, 'V'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}
	};
	int			c;
	char	   *end;
	long		n;

	relay_opts.batch = 100;
	relay_opts.poll = 1.0;
	relay_opts.timeout = 10.0;
	relay_opts.connect_timeout = 5.0;
	relay_opts.concurrency = 1;
	relay_opts.citus_refresh = 10.0;
	relay_opts.probe_interval = 10.0;
	relay_opts.handover = true;
	relay_opts.headers = relay_malloc(sizeof(char *) * (argc + 1));

	while ((c = getopt_long(argc, argv, "d:s:b:l:k:w:p:c:H:vVh", longopts, NULL)) != -1)
	{
		switch (c)
		{
			case 'd':
				relay_opts.dsn = optarg;
				break;
			case 40:
				relay_opts.citus = true;
				break;
			case 41:
				relay_opts.citus_refresh = parse_seconds(optarg, "--citus-refresh");
				break;
			case 's':
				relay_opts.sink = optarg;
				break;
			case 'b':
				errno = 0;
				n = strtol(optarg, &end, 10);
				if (errno != 0 || end == optarg || *end != '\0' || n < 1 || n > 1000000)
					usage_error("invalid value \"%s\" for --batch: an integer from 1 to 1000000 is expected", optarg);
				relay_opts.batch = (int) n;
				break;
			case 'c':
				errno = 0;
				n = strtol(optarg, &end, 10);
				if (errno != 0 || end == optarg || *end != '\0' || n < 1 || n > 256)
					usage_error("invalid value \"%s\" for --concurrency: an integer from 1 to 256 is expected", optarg);
				relay_opts.concurrency = (int) n;
				break;
			case 'l':
				relay_opts.lease = parse_seconds(optarg, "--lease");
				break;
			case 'k':
				relay_opts.kinds = parse_kinds(optarg);
				break;
			case 'w':
				if (optarg[0] == '\0')
					usage_error("invalid value \"%s\" for --worker: empty name", optarg);
				relay_opts.worker = optarg;
				break;
			case 'p':
				relay_opts.poll = parse_seconds(optarg, "--poll");
				break;
			case 1:
				relay_opts.timeout = parse_seconds(optarg, "--timeout");
				break;
			case 2:
				relay_opts.connect_timeout = parse_seconds(optarg, "--connect-timeout");
				break;
			case 'H':
				if (strchr(optarg, ':') == NULL || optarg[0] == ':' ||
					strpbrk(optarg, "\r\n") != NULL)
					usage_error("invalid value \"%s\" for --header: \"Name: value\" is expected", optarg);
				relay_opts.headers[relay_opts.nheaders++] = optarg;
				break;
			case 3:
				relay_opts.drain = true;
				break;
			case 4:
				{
					char	   *h;
					char	   *p;

					if (!metrics_parse(optarg, &h, &p))
						usage_error("invalid value \"%s\" for --metrics: HOST:PORT is expected", optarg);
					free(h);
					free(p);
					relay_opts.metrics = optarg;
				}
				break;
			case 5:
			case 6:
				{
					bool		sync = strcmp(optarg, "sync") == 0;

					if (!sync && strcmp(optarg, "async") != 0 && c == 5)
						usage_error("invalid value \"%s\" for --claim-commit: sync or async is expected", optarg);
					if (!sync && strcmp(optarg, "async") != 0)
						usage_error("invalid value \"%s\" for --ack-commit: sync or async is expected", optarg);
					if (c == 5)
						relay_opts.claim_sync = sync;
					else
						relay_opts.ack_async = !sync;
				}
				break;
			case 8:
				if (strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0)
					usage_error("invalid value \"%s\" for --handover: on or off is expected", optarg);
				relay_opts.handover = strcmp(optarg, "on") == 0;
				break;
			case 7:
				/* 0 turns the probe off */
				if (strcmp(optarg, "0") == 0)
					relay_opts.probe_interval = 0;
				else
					relay_opts.probe_interval = parse_seconds(optarg, "--probe-interval");
				break;
			case 20:
			case 21:
				if (optarg[0] == '\0')
					usage_error(c == 20 ? "invalid value \"%s\" for --stream: empty name" :
								"invalid value \"%s\" for --subscription: empty name", optarg);
				if (c == 20)
					relay_opts.stream = optarg;
				else
					relay_opts.subscription = optarg;
				break;
			case 'v':
				relay_opts.verbose++;
				break;
			case 'V':
				printf("%s %s\n", RELAY_NAME, RELAY_VERSION);
				exit(RELAY_EXIT_OK);
			case 'h':
				usage();
				exit(RELAY_EXIT_OK);
			default:
				fprintf(stderr, "Try \"%s --help\" for more information.\n", RELAY_NAME);
				exit(RELAY_EXIT_USAGE);
		}
	}
	if (optind < argc)
		usage_error("unexpected argument \"%s\"", argv[optind]);
	if (relay_opts.sink == NULL)
		usage_error("%s", "no sink given: --sink is required");
	if ((relay_opts.stream == NULL) != (relay_opts.subscription == NULL))
		usage_error("%s", relay_opts.stream ? "--stream needs --subscription: give both" :
					"--subscription needs --stream: give both");
	if (relay_opts.stream != NULL && relay_opts.citus)
		usage_error("%s", "--citus cannot be used with --stream: streams are not distributed on Citus");
	if (relay_opts.stream != NULL && relay_opts.kinds != NULL)
		usage_error("%s", "--kinds cannot be used with --stream: a stream publishes every kind set_policy gave it");
	if (relay_opts.dsn != NULL)
	{
		char	   *err = NULL;
		PQconninfoOption *opts = PQconninfoParse(relay_opts.dsn, &err);

		if (opts == NULL)
		{
			char		msg[600];
			size_t		l;

			snprintf(msg, sizeof(msg), "%s", err ? err : "out of memory");
			l = strlen(msg);
			while (l > 0 && msg[l - 1] == '\n')
				msg[--l] = '\0';
			usage_error("invalid --dsn: %s", msg);
		}
		check_dsn_ports(opts);
		PQconninfoFree(opts);
	}
	if (relay_opts.worker == NULL && !relay_opts.citus)
		relay_opts.worker = relay_default_worker();
}

/* The next backoff delay: 0.1 s doubling to 10 s, +-25% jitter. */
static double
next_backoff(void)
{
	backoff = backoff <= 0 ? 0.1 : backoff * 2;
	if (backoff > 10)
		backoff = 10;
	return backoff * (0.75 + 0.5 * ((double) random() / RAND_MAX));
}

/*
 * Get a connection, retrying with backoff.  False when giving up: a fatal
 * error (exit_code is set), an interrupt, or a stop request while nothing
 * is waiting to be reported (give_up_at: monotonic time after which a
 * stopping relay gives up; 0 for never).
 */
static bool
connect_loop(double give_up_at)
{
	for (;;)
	{
		DbResult	r;

		if (relay_stop >= 2)
			return false;
		if (relay_stop && (give_up_at <= 0 || relay_now() > give_up_at))
			return false;
		r = db_connect();
		if (r == DB_OK)
		{
			if (ever_connected)
				relay_stats.reconnects++;
			ever_connected = true;
			backoff = 0;
			return true;
		}
		if (r == DB_FATAL)
		{
			exit_code = RELAY_EXIT_RUNTIME;
			return false;
		}
		relay_sleep(next_backoff());
	}
}

/*
 * Have the sink confirm what it buffered (stdout, a file): nothing may be
 * acked before that.  If the output is broken, what was delivered since
 * the last confirm is failed instead (retryable) and the relay will exit 1.
 */
static void
confirm_sink(RelayBatch *batch)
{
	char	   *err = NULL;
	int			i;

	if (sink_confirm(sink, &err))
		return;
	relay_log("%s", err ? err : "the sink could not be written");
	sink_broken = true;
	for (i = 0; i < batch->n; i++)
	{
		RelayCommand *cmd = &batch->cmds[i];

		if (cmd->state != CMD_DELIVERED)
			continue;
		cmd->state = CMD_FAILED;
		cmd->fatal = false;
		free(cmd->error);
		cmd->error = relay_clean_error(err ? err : "the sink could not be written", 900);
		relay_stats.delivered--;
	}
	free(err);
}

/* Report what is finished and renew the rest (during a slow delivery). */
static void
renew_batch(RelayBatch *batch)
{
	DbResult	r;

	confirm_sink(batch);
	r = db_report(batch);

	if (r == DB_OK)
		r = db_renew(batch);
	if (r == DB_FATAL)
		exit_code = RELAY_EXIT_RUNTIME;
	if (r != DB_OK)
		batch->renew_at = relay_now() + 1.0;	/* try again in a second */
}

/* Renew the batch's leases when due (reconnecting once if needed). */
static void
maybe_renew(RelayBatch *batch)
{
	if (relay_now() < batch->renew_at)
		return;
	if (!db_connected() && db_connect() == DB_OK)
		relay_stats.reconnects++;
	renew_batch(batch);
}

static void finish_batch(RelayBatch *batch);
static void submit_ahead(bool from_tick);


/*
 * Take in the results of the pipelined calls that have come; finish the
 * batch whose ack came back (with wait: wait for it).  An ack that left
 * outcomes unreported (a lost connection) is finished by the main loop,
 * which reports them again.
 */
static void
take_in_ack(bool wait)
{
	int			i;

	db_async_collect(wait ? acking : NULL, wait);
	if (acking == NULL || db_async_pending(acking))
		return;
	if (!wait)
		for (i = 0; i < acking->n; i++)
			if (acking->cmds[i].state == CMD_DELIVERED || acking->cmds[i].state == CMD_FAILED)
				return;
	finish_batch(acking);
	acking = NULL;
}

/*
 * Renew, when due, the leases of the batch being delivered and of the one
 * claimed ahead (once its claim is in).
 */
static void
renew_held(RelayBatch *batch)
{
	int			i;

	take_in_ack(false);
	maybe_renew(batch);
	if (ahead != NULL && ahead != batch && !db_async_pending(ahead) && ahead->n > 0)
		maybe_renew(ahead);
	for (i = 0; i < nhanded; i++)
		if (handed[i] != batch && !db_async_pending(handed[i]) && handed[i]->n > 0)
			maybe_renew(handed[i]);
}

/* Called by the sink while deliveries are in flight; false interrupts. */
static bool
relay_tick(void *arg)
{
	RelayBatch *batch = arg;

	if (relay_stop >= 2)
		return false;
	renew_held(batch);
	if (batch == cur)
		submit_ahead(true);
	return true;
}

/*
 * Report the outcomes the batch has, reconnecting as often as needed.
 * False when the relay gave up (it is stopping, or a fatal error).
 */
static bool
report_batch(RelayBatch *batch)
{
	int			i;

	for (;;)
	{
		DbResult	r = db_report(batch);
		int			left = 0;

		if (r == DB_OK)
			return true;
		if (r == DB_FATAL)
		{
			exit_code = RELAY_EXIT_RUNTIME;
			return false;
		}
		if (db_connected())
		{
			relay_sleep(next_backoff());
			if (relay_stop < 2)
				continue;
		}
		else if (connect_loop(batch->lease_end))
			continue;
		for (i = 0; i < batch->n; i++)
			if (batch->cmds[i].state == CMD_DELIVERED || batch->cmds[i].state == CMD_FAILED)
				left++;
		relay_log("giving up reporting %d outcome%s; their leases will expire and the commands will be delivered again",
				  left, left == 1 ? "" : "s");
		return false;
	}
}

/* The number of commands of the batch still CMD_TODO, and the first one. */
static int
count_todo(RelayBatch *batch, RelayCommand **first)
{
	int			n = 0;
	int			i;

	*first = NULL;
	for (i = 0; i < batch->n; i++)
		if (batch->cmds[i].state == CMD_TODO)
		{
			if (n++ == 0)
				*first = &batch->cmds[i];
		}
	return n;
}

/*
 * Wait `seconds` during an outage, renewing the held leases.  False when
 * a stop was requested meanwhile.
 */
static bool
outage_wait(RelayBatch *batch, double seconds)
{
	double		until = relay_now() + seconds;

	for (;;)
	{
		double		left = until - relay_now();

		if (relay_stop || exit_code != RELAY_EXIT_OK)
			return false;
		if (left <= 0)
			return true;
		relay_sleep(left < 0.25 ? left : 0.25);
		renew_held(batch);
		metrics_publish();
	}
}

/*
 * Deliver a claimed batch, leaving its outcome to be reported by the
 * caller.  While the sink is unavailable, the commands it could not
 * deliver are held and tried again after a backoff (see the file header).
 * A batch the relay is told to give back before its delivery began (a
 * second stop request, or a stop during an outage) is not delivered.
 */
static void
process_batch(RelayBatch *batch)
{
	double		pause = 0;
	const char *reason = NULL;
	char	   *held_error = NULL;
	RelayCommand *first;
	int			held;
	int			i;

	if (relay_stop >= 2)
		reason = "delivery not attempted: the relay was interrupted";
	else if (relay_stop && outage_since > 0)
		reason = "delivery not attempted: the sink was unavailable";
	/* a submitted batch is settled, also one that is given back */
	while (reason == NULL || batch->submitted)
	{
		double		began = relay_now();
		double		submitted_at = batch->submitted ? batch->submitted_at : 0;
		SinkResult	r;

		if (batch->submitted)
		{
			batch->settle_began = began;
			r = sink_settle(sink, batch, relay_tick, batch);
			batch->settle_began = 0;
		}
		else
			r = sink_deliver(sink, batch, relay_tick, batch);
		batch->submitted = false;

		batch->delivered_wall = trace_clock();
		sink_active_at = relay_now();
		confirm_sink(batch);
		metrics_sink_done(r != SINK_UNAVAILABLE, relay_now() - began);
		if (r != SINK_UNAVAILABLE)
		{
			if (outage_since > 0)
			{
				relay_log("sink %s is available again after %.1fs",
						  sink_describe(sink), relay_now() - outage_since);
				outage_ended = relay_now();
			}
			outage_since = 0;
			if (relay_stop >= 2)
				reason = "delivery not attempted: the relay was interrupted";
			break;
		}
		if (reason != NULL)
			break;				/* given back: no retry */
		if (submitted_at > 0 && submitted_at < outage_ended)
		{
			/*
			 * Submitted ahead while the broker was failing, and settled
			 * after the outage of the batch before it ended: what failed
			 * is that outage's, so it goes again at once, not as a new one.
			 */
			if (!report_batch(batch))
				break;
			continue;
		}
		held = count_todo(batch, &first);
		free(held_error);
		held_error = relay_strdup(first && first->error ? first->error : "the sink is unavailable");
		/* report what has an outcome; the held leases are renewed */
		if (!report_batch(batch))
			break;
		if (outage_since <= 0)
		{
			outage_since = relay_now();
			relay_log("sink unavailable: %s; holding %d command%s, claiming paused, retrying with backoff",
					  held_error, held, held == 1 ? "" : "s");
		}
		if (held == 0)
			break;
		pause = pause <= 0 ? 0.5 : pause * 2;
		if (pause > 30)
			pause = 30;
		relay_debug("sink unavailable; pausing %.1fs", pause);
		if (!outage_wait(batch, pause))
		{
			reason = "delivery not attempted: the sink was unavailable";
			break;
		}
		/* the held commands are delivered again under the same leases */
	}

	/* what was not delivered goes back, retryable */
	for (i = 0; i < batch->n; i++)
	{
		RelayCommand *cmd = &batch->cmds[i];
		char		msg[1100];

		if (cmd->state != CMD_TODO)
			continue;
		cmd->state = CMD_FAILED;
		cmd->fatal = false;
		if (held_error != NULL && reason != NULL)
			snprintf(msg, sizeof(msg), "%s: %s", reason, held_error);
		else
			snprintf(msg, sizeof(msg), "%s", reason ? reason : "delivery not attempted");
		free(cmd->error);
		cmd->error = relay_clean_error(msg, 900);
	}
	free(held_error);
	relay_debug("batch of %d delivered", batch->n);
}

/*
 * A batch's ack came back, or it was reported otherwise: report what is
 * left to report (an ack lost with its connection goes again, with the
 * same tokens), count it, and free it.
 */
static void
finish_batch(RelayBatch *batch)
{
	int			i;

	for (i = 0; i < batch->n; i++)
		if (batch->cmds[i].state == CMD_DELIVERED || batch->cmds[i].state == CMD_FAILED)
		{
			(void) report_batch(batch);
			break;
		}
	metrics_batch_done(batch->n, relay_now() - batch->claimed_at);
	if (relay_opts.verbose >= 2)
		trace_batch(batch, trace_clock());
	relay_debug("batch of %d done", batch->n);
	batch_free(batch);
}

/* A slot no batch occupies. */
static RelayBatch *
free_slot(void)
{
	int			i;

	for (i = 0; i < 3 + RELAY_HANDED; i++)
	{
		bool		used = &slots[i] == cur || &slots[i] == ahead || &slots[i] == acking;
		int			j;

		for (j = 0; j < nhanded; j++)
			used = used || &slots[i] == handed[j];
		if (!used)
			return &slots[i];
	}
	return NULL;				/* not reached: as many slots as roles */
}

/* Whether the batch holds a command of an ordering key. */
static bool
batch_ordered(const RelayBatch *batch)
{
	int			i;

	for (i = 0; i < batch->n; i++)
		if (batch->cmds[i].ordering_key != NULL)
			return true;
	return false;
}

/*
 * Whether a handed batch in hand or on its way will be the next batch, so
 * that no claim goes ahead: one is, unless the current batch is under
 * half full (its keys are running out, and a claim ahead fills the gap)
 * and there is room for one more chain.
 */
static bool
handover_next(const RelayBatch *batch)
{
	if (nhanded == 0)
		return false;
	return nhanded >= RELAY_HANDED || batch->n * 2 >= relay_opts.batch;
}

/*
 * Report the delivered batch: its ack goes out without waiting for it
 * (take_in_ack finishes the batch when it comes back), unless the batch
 * needs more than one call (failed commands), which are reported at once.
 * The previous batch's ack is taken in first: one ack on its way at a
 * time.
 */
static void
report_delivered(RelayBatch *batch)
{
	RelayBatch *into = NULL;

	if (acking != NULL)
		take_in_ack(true);
	if (relay_opts.handover && relay_opts.stream == NULL && nhanded < RELAY_HANDED &&
		!relay_stop && !sink_broken && batch_ordered(batch))
	{
		acking = batch;			/* so that free_slot does not pick it */
		into = free_slot();
		acking = NULL;
	}
	if (db_connected() && db_async_report(batch, into))
	{
		acking = batch;
		if (into != NULL && db_async_pending(into))
			handed[nhanded++] = into;	/* filled when the ack is in */
		return;
	}
	(void) report_batch(batch);
	finish_batch(batch);
}

/*
 * The batch claimed ahead, once its claim is in: the next to deliver, or
 * NULL when the claim found nothing (or its connection was lost).
 */
static RelayBatch *
take_in_ahead(void)
{
	RelayBatch *b = ahead;

	if (b->claimed_at > 0)
	{
		ahead = NULL;			/* taken in already (submit_ahead) */
		return b;
	}
	db_async_collect(b, true);
	ahead = NULL;
	if (b->n == 0)
	{
		/* claim ahead less often while it finds nothing: 1, 3, 7, 15 */
		if (ahead_empty < 4)
			ahead_empty++;
		ahead_skip = (1 << ahead_empty) - 1;
		batch_free(b);
		return NULL;
	}
	ahead_empty = 0;
	b->claimed_at = relay_now();
	b->claimed_wall = trace_clock();
	metrics_claimed(b->n);
	relay_debug("claimed %d ahead", b->n);
	return b;
}

/*
 * The oldest handed batch, once the ack that hands it over is in: the
 * next to deliver, or NULL when it is empty (nothing was handed over, or
 * the ack's connection was lost).
 */
static RelayBatch *
take_in_handed(void)
{
	RelayBatch *b = handed[0];

	if (db_async_pending(b) && acking != NULL)
		take_in_ack(true);
	if (db_async_pending(b))
		db_async_collect(b, true);
	memmove(&handed[0], &handed[1], sizeof(RelayBatch *) * (RELAY_HANDED - 1));
	nhanded--;
	if (b->n == 0)
	{
		batch_free(b);
		return NULL;
	}
	b->claimed_at = relay_now();
	b->claimed_wall = trace_clock();
	metrics_claimed(b->n);
	relay_debug("%d handed over", b->n);
	return b;
}

/*
 * With a sink that delivers now and confirms later (sink.h: submit): hand
 * the current batch to the sink, then take the claim ahead in and hand
 * that batch over too, before the current one is settled, so that the
 * broker confirms the one while it receives the other.
 */
static void
submit_ahead(bool from_tick)
{
	RelayBatch *b;

	if (!sink_can_submit(sink) || relay_stop >= 2 || cur == NULL)
		return;
	if (!cur->submitted && cur->settle_began <= 0 && !from_tick)
	{
		cur->submitted = true;
		cur->submitted_at = relay_now();
		if (sink_submit(sink, cur) == SINK_UNAVAILABLE)
			return;				/* the outage is settle's; no more now */
	}
	/*
	 * The batch ahead once its claim is in (never waiting for it), while
	 * the current one is being settled (from the sink's tick).
	 */
	if (ahead == NULL || ahead->submitted || relay_stop || outage_since > 0 ||
		cur->settle_began <= 0 || db_async_pending(ahead))
		return;
	b = take_in_ahead();
	ahead = b;
	if (b == NULL)
		return;
	b->submitted = true;
	b->submitted_at = relay_now();
	(void) sink_submit(sink, b);
}

/*
 * Give back a claimed batch that will not be delivered (the relay stops
 * with it in hand): its commands are failed as retryable (a submitted
 * batch is settled first: what the broker confirmed is acked).
 */
static void
release_batch(RelayBatch *batch, const char *reason)
{
	int			i;

	if (batch->submitted)
	{
		(void) sink_settle(sink, batch, relay_tick, batch);
		batch->submitted = false;
		confirm_sink(batch);
	}

	for (i = 0; i < batch->n; i++)
	{
		RelayCommand *cmd = &batch->cmds[i];

		if (cmd->state != CMD_TODO)
			continue;
		cmd->state = CMD_FAILED;
		cmd->fatal = false;
		free(cmd->error);
		cmd->error = relay_strdup(reason);
	}
	(void) report_batch(batch);
	finish_batch(batch);
}

/*
 * Probe an idle sink (sink.h) once it has been idle --probe-interval
 * seconds: outbox_relay_sink_up follows the probe, and a change is logged.
 */
static void
probe_idle_sink(void)
{
	char	   *err = NULL;
	SinkResult	r;

	if (relay_opts.probe_interval <= 0 || relay_now() - sink_active_at < relay_opts.probe_interval)
		return;
	r = sink_probe(sink, &err);
	sink_active_at = relay_now();
	if (r == SINK_OK)
	{
		if (probe_down)
			relay_log("idle probe: sink %s is available again", sink_describe(sink));
		probe_down = false;
		metrics_sink_probed(true);
	}
	else if (r == SINK_UNAVAILABLE)
	{
		if (!probe_down)
			relay_log("idle probe: sink unavailable: %s", err ? err : "no reason given");
		probe_down = true;
		metrics_sink_probed(false);
	}
	free(err);
}

/* The summary line. */
static void
summary(double started)
{
	relay_log("summary: worker=%s batches=%lld claimed=%lld delivered=%lld acked=%lld "
			  "handed=%lld stale=%lld retried=%lld dead=%lld renewed=%lld reconnects=%lld "
			  "wakeups=%lld elapsed=%.1fs exit=%d",
			  relay_opts.worker, relay_stats.batches, relay_stats.claimed,
			  relay_stats.delivered, relay_stats.acked, relay_stats.handed, relay_stats.stale,
			  relay_stats.retried, relay_stats.dead, relay_stats.renewed,
			  relay_stats.reconnects, relay_stats.wakeups,
			  relay_now() - started, exit_code);
}

/* Parse the command line, then claim, deliver and report until stopped. */
int
main(int argc, char **argv)
{
	double		started = relay_now();
	char	   *err = NULL;
	SinkOpenResult opened;
	bool		stop_logged = false;
	RelayBatch *batch;

	parse_options(argc, argv);
	srandom((unsigned int) getpid() ^ (unsigned int) (started * 1000));
	relay_signal_init();
	if (relay_opts.citus)
		citus_supervise();		/* returns in each node's relay only */
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
	{
		relay_log("could not initialize libcurl");
		return RELAY_EXIT_RUNTIME;
	}
	opened = sink_open(relay_opts.sink, &sink, &err);
	if (opened != SINK_OPEN_OK)
	{
		relay_log("%s", err);
		free(err);
		curl_global_cleanup();
		return opened == SINK_OPEN_CONFIG ? RELAY_EXIT_USAGE : RELAY_EXIT_RUNTIME;
	}
	if (relay_opts.stream != NULL)
		relay_log("starting: worker \"%s\", sink %s, stream \"%s\", subscription \"%s\"",
				  relay_opts.worker, sink_describe(sink), relay_opts.stream,
				  relay_opts.subscription);
	else
		relay_log("starting: worker \"%s\", sink %s, batch %d", relay_opts.worker,
				  sink_describe(sink), relay_opts.batch);
	if (relay_opts.metrics != NULL && !metrics_start(relay_opts.metrics, &err))
	{
		relay_log("%s", err);
		sink_close(sink);
		return RELAY_EXIT_RUNTIME;
	}

	for (;;)
	{
		DbResult	r;

		metrics_publish();
		take_in_ack(false);
		if (cur == NULL && ahead != NULL)
			cur = take_in_ahead();
		while (cur == NULL && nhanded > 0)
			cur = take_in_handed();
		if (cur == NULL)
		{
			if (relay_stop)
			{
				if (!stop_logged)
					relay_log("stop requested: no more claims");
				stop_logged = true;
				break;
			}
			if (!db_connected())
			{
				if (acking != NULL)
					take_in_ack(true);	/* reported on a new connection */
				if (!connect_loop(0))
					break;
				continue;
			}
			if (relay_reopen)
			{
				relay_reopen = 0;
				if (!sink_reopen(sink, &err))
				{
					relay_log("%s", err ? err : "could not reopen the sink");
					free(err);
					exit_code = RELAY_EXIT_RUNTIME;
					break;
				}
			}

			batch = free_slot();
			{
				double		sent = trace_clock();

				r = db_claim(batch);
				batch->claim_sent = sent;
			}
			batch->claimed_wall = trace_clock();
			batch->woke = trace_woke;
			if (r == DB_FATAL)
			{
				exit_code = RELAY_EXIT_RUNTIME;
				break;
			}
			if (r == DB_RETRY)
			{
				if (db_connected())
					relay_sleep(next_backoff());
				continue;
			}
			backoff = 0;
			if (batch->n == 0)
			{
				batch_free(batch);
				if (acking != NULL)
					take_in_ack(true);
				if (relay_opts.drain)
				{
					relay_log("nothing left to claim");
					break;
				}
				probe_idle_sink();
				trace_woke = db_wait(relay_opts.poll) ? trace_clock() : 0;
				continue;
			}
			relay_debug("claimed %d", batch->n);
			batch->claimed_at = relay_now();
			metrics_claimed(batch->n);
			cur = batch;
		}
		trace_woke = 0;

		/*
		 * The next batch's claim goes out before this one is delivered, so
		 * that the database works on it while the sink waits for the
		 * broker.  Not while stopping or after an outage, nor with a sink
		 * that was found broken; and after claims ahead that found nothing
		 * (no backlog, or none but the keys of the batch being delivered,
		 * which the server holds back until its ack), only every 2nd, 4th,
		 * 8th, at most 16th batch, so that an idle or single-key relay does
		 * not double its claims.
		 */
		if (handover_next(cur))
			;					/* its ack brings the next batch */
		else if (ahead_skip > 0)
			ahead_skip--;
		else if (!relay_stop && outage_since <= 0 && !sink_broken && db_connected())
		{
			ahead = free_slot();
			if (db_async_claim(ahead) == DB_OK)
				ahead->claim_sent = trace_clock();
			else
				ahead = NULL;
		}
		submit_ahead(false);
		process_batch(cur);
		batch = cur;
		cur = NULL;
		report_delivered(batch);
		if (exit_code != RELAY_EXIT_OK)
			break;
		if (sink_broken)
		{
			exit_code = RELAY_EXIT_RUNTIME;
			break;
		}
	}

	/* what is still in hand: the ack on its way, a batch claimed ahead */
	if (acking != NULL)
		take_in_ack(true);
	if (ahead != NULL && (batch = take_in_ahead()) != NULL)
		release_batch(batch, sink_broken ? "delivery not attempted: the sink could not be written" :
					  "delivery not attempted: the relay stopped");
	while (nhanded > 0)
		if ((batch = take_in_handed()) != NULL)
			release_batch(batch, sink_broken ? "delivery not attempted: the sink could not be written" :
						  "delivery not attempted: the relay stopped");

	metrics_stop();
	db_disconnect();
	sink_close(sink);
	curl_global_cleanup();
	summary(started);
	return exit_code;
}
