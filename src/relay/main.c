/*-------------------------------------------------------------------------
 *
 * main.c
 *		outbox-relay: command line, the claim/deliver/report loop, signals
 *		and reconnection.
 *
 * The loop.  Claim up to --batch commands with a lease; deliver them to
 * the sink (one by one, or up to --concurrency HTTP requests at a time);
 * report the batch (one array ack for the delivered
 * commands, one fail per failed command); claim again at once.  When a
 * claim finds nothing, wait for a notification on outbox.notify_channel
 * (sent by the extension's background worker after producers commit) or
 * for --poll seconds, whichever comes first: the poll is the backstop that
 * makes the relay work without notifications.
 *
 * Leases.  A batch's leases are renewed when half of the shortest one has
 * passed and commands of the batch are still undelivered (the delivered
 * ones are acked first).  A renewal refused with lease_not_owned drops the
 * command from the batch: someone else owns it now.
 *
 * Failures.  A lost connection is re-established with exponential backoff
 * (0.1 s doubling to 10 s, with jitter).  Outcomes of a batch that could
 * not be reported yet are kept and reported on the new connection with
 * the same tokens, which the server still accepts unless another worker
 * took the commands over meanwhile (then they are counted as stale: a
 * duplicate delivery, never a loss).  A kill -9 at any point loses
 * nothing: the leases expire and another relay takes the commands over.
 *
 * Signals.  SIGTERM or SIGINT: stop claiming, finish and report the batch
 * in flight, exit 0.  A second one: abort the deliveries in progress, fail
 * the rest of the batch as retryable, exit 0.  SIGHUP: reopen a file sink.
 *
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>

#include "relay.h"

static Sink *sink = NULL;
static int	exit_code = RELAY_EXIT_OK;
static bool sink_broken = false;
static double backoff = 0;		/* current reconnect/retry backoff */
static bool ever_connected = false;

/* Print --help. */
static void
usage(void)
{
	printf("%s publishes the commands of the outbox PostgreSQL extension.\n\n", RELAY_NAME);
	printf("Usage:\n"
		   "  %s --sink SINK [--dsn CONNINFO] [OPTION]...\n\n", RELAY_NAME);
	printf("Options:\n"
		   "  -d, --dsn=CONNINFO        libpq connection string or URI (default: PG* environment)\n"
		   "  -s, --sink=SINK           stdout | file:PATH | http://... | https://...\n"
		   "  -b, --batch=N             commands claimed per batch (default 100)\n"
		   "  -l, --lease=SECONDS       lease per claim (default: the kind's policy or\n"
		   "                            outbox.default_lease)\n"
		   "  -k, --kinds=K1,K2         deliver only these command kinds (default: all)\n"
		   "  -w, --worker=NAME         worker name owning the leases (default HOST:PID)\n"
		   "  -p, --poll=SECONDS        poll interval when no notification comes (default 1)\n"
		   "      --timeout=SECONDS     HTTP request timeout (default 10)\n"
		   "      --connect-timeout=SECONDS  HTTP connect timeout (default 5)\n"
		   "  -c, --concurrency=N       HTTP requests in flight at once (default 1: one at\n"
		   "                            a time, in claim order)\n"
		   "  -H, --header='NAME: VALUE'  extra HTTP header (repeatable)\n"
		   "      --drain               exit 0 as soon as a claim finds nothing\n"
		   "      --metrics=HOST:PORT   serve Prometheus metrics at http://HOST:PORT/metrics\n"
		   "  -v, --verbose             log every batch\n"
		   "  -V, --version             print the version and exit\n"
		   "  -h, --help                print this help and exit\n\n");
	printf("Sinks:\n"
		   "  stdout, file:PATH   one JSON object per line (NDJSON):\n"
		   "                      {\"command_id\",\"run_id\",\"kind\",\"payload\",\"deliveries\"}\n"
		   "  http(s)://URL       POST of that object, header Idempotency-Key: <command_id>;\n"
		   "                      2xx acks; 408, 429, 5xx, timeouts and network errors retry\n"
		   "                      with backoff; any other 4xx is fatal (the command goes dead)\n\n");
	printf("Signals:\n"
		   "  SIGTERM, SIGINT     stop claiming, finish the batch in flight, exit 0;\n"
		   "                      a second one fails what is left of the batch (retryable)\n"
		   "  SIGHUP              reopen the file of a file: sink\n\n");
	printf("Exit status:\n"
		   "  0  stopped by a signal, or --drain found nothing to claim\n"
		   "  1  runtime error: the database refused the relay (extension missing,\n"
		   "     privileges, bad settings) or the sink could not be written\n"
		   "  2  usage error\n");
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

/* Parse the command line into relay_opts. */
static void
parse_options(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"dsn", required_argument, NULL, 'd'},
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
	relay_opts.headers = relay_malloc(sizeof(char *) * (argc + 1));

	while ((c = getopt_long(argc, argv, "d:s:b:l:k:w:p:c:H:vVh", longopts, NULL)) != -1)
	{
		switch (c)
		{
			case 'd':
				relay_opts.dsn = optarg;
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
	if (strcmp(relay_opts.sink, "stdout") != 0 &&
		!(strncmp(relay_opts.sink, "file:", 5) == 0 && relay_opts.sink[5] != '\0') &&
		strncmp(relay_opts.sink, "http://", 7) != 0 &&
		strncmp(relay_opts.sink, "https://", 8) != 0)
		usage_error("invalid sink \"%s\": expected stdout, file:PATH, or an http:// or https:// URL",
					relay_opts.sink);
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
		PQconninfoFree(opts);
	}
	if (relay_opts.worker == NULL)
	{
		char		host[256];
		char		name[300];

		if (gethostname(host, sizeof(host)) != 0)
			strcpy(host, "localhost");
		host[sizeof(host) - 1] = '\0';
		snprintf(name, sizeof(name), "%s:%d", host, (int) getpid());
		relay_opts.worker = relay_strdup(name);
	}
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
 * Push what an NDJSON sink buffered out of the process: nothing may be
 * acked before that.  If the output is broken, what was written since the
 * last flush is failed instead (retryable) and the relay will exit 1.
 */
static void
flush_sink(RelayBatch *batch)
{
	char	   *err = NULL;
	int			i;

	if (sink_flush(sink, &err))
		return;
	relay_log("%s", err);
	sink_broken = true;
	for (i = 0; i < batch->n; i++)
	{
		RelayCommand *cmd = &batch->cmds[i];

		if (cmd->state != CMD_DELIVERED)
			continue;
		cmd->state = CMD_FAILED;
		cmd->fatal = false;
		free(cmd->error);
		cmd->error = relay_clean_error(err, 900);
		relay_stats.delivered--;
	}
}

/* Report what is finished and renew the rest (during a slow delivery). */
static void
renew_batch(RelayBatch *batch)
{
	DbResult	r;

	flush_sink(batch);
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

/* Called by the HTTP sink while requests are in flight; false interrupts. */
static bool
relay_tick(void *arg)
{
	RelayBatch *batch = arg;

	if (relay_stop >= 2)
		return false;
	maybe_renew(batch);
	return true;
}

/*
 * Deliver a claimed batch and report its outcome.  Returns true when the
 * endpoint was unreachable (the caller backs off before claiming again).
 */
static bool
process_batch(RelayBatch *batch)
{
	bool		unavailable = false;
	const char *skip_reason = NULL;
	int			i;

	if (sink_is_http(sink))
	{
		unavailable = sink_deliver_batch(sink, batch, relay_tick, batch);
		if (unavailable)
			skip_reason = "delivery not attempted: the endpoint was unavailable";
		else if (relay_stop >= 2)
			skip_reason = "delivery not attempted: the relay was interrupted";
		i = 0;
	}
	else
	{
		for (i = 0; i < batch->n; i++)
		{
			RelayCommand *cmd = &batch->cmds[i];
			SinkResult	r;

			if (relay_stop >= 2)
			{
				skip_reason = "delivery not attempted: the relay was interrupted";
				break;
			}
			maybe_renew(batch);
			if (cmd->state != CMD_TODO)
				continue;		/* lease lost */
			r = sink_deliver(sink, cmd);
			if (r == SINK_OK)
			{
				cmd->state = CMD_DELIVERED;
				relay_stats.delivered++;
			}
			else
			{
				cmd->state = CMD_FAILED;
				cmd->fatal = false;
			}
		}
	}
	/* what was not attempted goes back, retryable */
	for (; i < batch->n; i++)
	{
		RelayCommand *cmd = &batch->cmds[i];

		if (cmd->state != CMD_TODO)
			continue;
		cmd->state = CMD_FAILED;
		cmd->fatal = false;
		free(cmd->error);
		cmd->error = relay_strdup(skip_reason ? skip_reason : "delivery not attempted");
	}

	/* an NDJSON line counts as delivered once it is out of the process */
	flush_sink(batch);

	/* report, reconnecting as often as needed */
	for (;;)
	{
		DbResult	r = db_report(batch);
		int			left = 0;

		if (r == DB_OK)
			break;
		if (r == DB_FATAL)
		{
			exit_code = RELAY_EXIT_RUNTIME;
			break;
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
		break;
	}
	relay_debug("batch of %d done", batch->n);
	return unavailable;
}

/* The summary line. */
static void
summary(double started)
{
	relay_log("summary: worker=%s batches=%lld claimed=%lld delivered=%lld acked=%lld "
			  "stale=%lld retried=%lld dead=%lld renewed=%lld reconnects=%lld "
			  "wakeups=%lld elapsed=%.1fs exit=%d",
			  relay_opts.worker, relay_stats.batches, relay_stats.claimed,
			  relay_stats.delivered, relay_stats.acked, relay_stats.stale,
			  relay_stats.retried, relay_stats.dead, relay_stats.renewed,
			  relay_stats.reconnects, relay_stats.wakeups,
			  relay_now() - started, exit_code);
}

/* Parse the command line, then claim, deliver and report until stopped. */
int
main(int argc, char **argv)
{
	double		started = relay_now();
	double		unavailable_backoff = 0;
	char	   *err = NULL;
	bool		stop_logged = false;

	parse_options(argc, argv);
	srandom((unsigned int) getpid() ^ (unsigned int) (started * 1000));
	relay_signal_init();
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
	{
		relay_log("could not initialize libcurl");
		return RELAY_EXIT_RUNTIME;
	}
	sink = sink_open(relay_opts.sink, &err);
	if (sink == NULL)
	{
		relay_log("%s", err);
		return RELAY_EXIT_RUNTIME;
	}
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
		RelayBatch	batch;
		DbResult	r;
		double		claimed_at;
		bool		unavailable;

		metrics_publish();
		if (relay_stop)
		{
			if (!stop_logged)
				relay_log("stop requested: no more claims");
			stop_logged = true;
			break;
		}
		if (!db_connected())
		{
			if (!connect_loop(0))
				break;
			continue;
		}
		if (relay_reopen)
		{
			relay_reopen = 0;
			if (!sink_reopen(sink, &err))
			{
				relay_log("%s", err);
				exit_code = RELAY_EXIT_RUNTIME;
				break;
			}
		}

		r = db_claim(&batch);
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
		if (batch.n == 0)
		{
			batch_free(&batch);
			if (relay_opts.drain)
			{
				relay_log("nothing left to claim");
				break;
			}
			(void) db_wait(relay_opts.poll);
			continue;
		}

		relay_debug("claimed %d", batch.n);
		claimed_at = relay_now();
		metrics_claimed(batch.n);
		unavailable = process_batch(&batch);
		metrics_batch_done(relay_now() - claimed_at);
		if (unavailable)
		{
			unavailable_backoff = unavailable_backoff <= 0 ? 0.5 : unavailable_backoff * 2;
			if (unavailable_backoff > 30)
				unavailable_backoff = 30;
			relay_log("endpoint unavailable; pausing %.1fs", unavailable_backoff);
			relay_sleep(unavailable_backoff);
		}
		else
			unavailable_backoff = 0;
		batch_free(&batch);
		if (exit_code != RELAY_EXIT_OK)
			break;
		if (sink_broken)
		{
			exit_code = RELAY_EXIT_RUNTIME;
			break;
		}
	}

	metrics_stop();
	db_disconnect();
	sink_close(sink);
	curl_global_cleanup();
	summary(started);
	return exit_code;
}
