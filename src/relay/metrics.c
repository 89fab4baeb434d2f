/*-------------------------------------------------------------------------
 *
 * metrics.c
 *		outbox-relay's Prometheus endpoint: --metrics HOST:PORT serves
 *		GET /metrics in the Prometheus text exposition format (0.0.4).
 *
 * The relay's loop is single-threaded and may block for seconds (a slow
 * webhook, a reconnect backoff, the wait for a notification), so the
 * endpoint runs in a thread of its own.  The two threads share one
 * snapshot and nothing else: the main thread copies its counters into the
 * snapshot (metrics_publish, metrics_claimed, metrics_batch_done,
 * metrics_sink_failure, metrics_sink_done) under
 * metrics_lock, and the server thread formats a page from a copy taken
 * under the same lock.  The server thread never reads relay_stats, the
 * batch or the connection, and blocks every signal, so that signals still
 * reach the main thread's self-pipe.  One request at a time: a scraper
 * that does not send its request within two seconds is dropped.
 *
 * Metrics (all of this relay process; Prometheus adds job and instance):
 *   outbox_relay_info{worker,version}          1
 *   outbox_relay_start_time_seconds            Unix time the relay started
 *   outbox_relay_batches_total                 claims that returned commands
 *   outbox_relay_claimed_total                 leases granted to the relay
 *   outbox_relay_delivered_total               commands the sink accepted
 *   outbox_relay_acked_total                   acks the server accepted
 *   outbox_relay_failed_total{outcome}         fails reported: retry or dead
 *   outbox_relay_stale_refused_total           calls refused: lease taken over
 *   outbox_relay_renewed_total                 leases renewed
 *   outbox_relay_reconnects_total              database reconnections
 *   outbox_relay_wakeups_total                 notifications received
 *   outbox_relay_in_flight                     commands claimed, not reported
 *   outbox_relay_database_connected            1 while connected
 *   outbox_relay_last_ack_timestamp_seconds    Unix time of the last ack (0: none)
 *   outbox_relay_batch_duration_seconds        histogram, claim to report
 *   outbox_relay_sink_failures_total{class}    sink outcomes: retry, fatal, outage
 *   outbox_relay_sink_up{scheme}               1 unless the last delivery found
 *                                              the sink unavailable
 *   outbox_relay_sink_outages_total{scheme}    times the sink went unavailable
 *   outbox_relay_sink_confirm_duration_seconds histogram, a batch's delivery
 *                                              until the broker settled all
 *
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "relay.h"

/* Upper bounds of the batch duration histogram's buckets, in seconds. */
static const double mt_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
#define MT_NBUCKETS ((int) (sizeof(mt_bounds) / sizeof(mt_bounds[0])))

/* A histogram over mt_bounds. */
typedef struct MetricsHistogram
{
	long long	buckets[MT_NBUCKETS];	/* not cumulative */
	long long	count;
	double		sum;
} MetricsHistogram;

/* What the main thread publishes. */
typedef struct MetricsSnapshot
{
	RelayStats	stats;
	int			in_flight;
	bool		connected;
	double		last_ack;		/* Unix time, 0: never */
	MetricsHistogram batch;		/* claim to report */
	MetricsHistogram confirm;	/* sink deliver call, settled batches */
	long long	sink_failures[METRICS_NFAILURES];
	bool		sink_down;
	long long	sink_outages;
} MetricsSnapshot;

/* Label values of outbox_relay_sink_failures_total, by MetricsFailure. */
static const char *const mt_failure_class[METRICS_NFAILURES] = {"retry", "fatal", "outage"};

static pthread_mutex_t metrics_lock = PTHREAD_MUTEX_INITIALIZER;
static MetricsSnapshot mt_snap;
static double mt_started;		/* Unix time */
static bool mt_running = false;
static int	mt_listen_fd = -1;
static int	mt_stop_pipe[2] = {-1, -1};
static pthread_t mt_thread;

/* Wall-clock time in seconds. */
static double
mt_wall_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/*
 * Split HOST:PORT (HOST may be [v6]) into freshly allocated strings.  False
 * when the form is wrong; nothing is allocated then.
 */
bool
metrics_parse(const char *spec, char **host, char **port)
{
	const char *colon = strrchr(spec, ':');
	const char *h = spec;
	size_t		hlen;
	char	   *end;
	long		p;

	if (colon == NULL || colon == spec || colon[1] == '\0')
		return false;
	errno = 0;
	p = strtol(colon + 1, &end, 10);
	if (errno != 0 || *end != '\0' || p < 1 || p > 65535)
		return false;
	hlen = (size_t) (colon - spec);
	if (spec[0] == '[')
	{
		if (hlen < 3 || spec[hlen - 1] != ']')
			return false;
		h = spec + 1;
		hlen -= 2;
	}
	else if (memchr(spec, ':', hlen) != NULL)
		return false;			/* an IPv6 address needs its brackets */
	*host = relay_malloc(hlen + 1);
	memcpy(*host, h, hlen);
	(*host)[hlen] = '\0';
	*port = relay_strdup(colon + 1);
	return true;
}

/* Append one metric family's HELP and TYPE lines. */
static void
mt_family(StrBuf *sb, const char *name, const char *type, const char *help)
{
	sb_printf(sb, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Append a label value, escaped as the exposition format wants. */
static void
mt_label_value(StrBuf *sb, const char *s)
{
	for (; *s; s++)
	{
		if (*s == '\\')
			sb_puts(sb, "\\\\");
		else if (*s == '"')
			sb_puts(sb, "\\\"");
		else if (*s == '\n')
			sb_puts(sb, "\\n");
		else
			sb_append(sb, s, 1);
	}
}

/* Append a histogram's buckets, sum and count. */
static void
mt_histogram(StrBuf *sb, const char *name, const char *help, const MetricsHistogram *h)
{
	long long	cum = 0;
	int			i;

	mt_family(sb, name, "histogram", help);
	for (i = 0; i < MT_NBUCKETS; i++)
	{
		cum += h->buckets[i];
		sb_printf(sb, "%s_bucket{le=\"%g\"} %lld\n", name, mt_bounds[i], cum);
	}
	sb_printf(sb, "%s_bucket{le=\"+Inf\"} %lld\n", name, h->count);
	sb_printf(sb, "%s_sum %.6f\n", name, h->sum);
	sb_printf(sb, "%s_count %lld\n", name, h->count);
}

/* Add one observation to a histogram. */
static void
mt_observe(MetricsHistogram *h, double seconds)
{
	int			i;

	for (i = 0; i < MT_NBUCKETS; i++)
		if (seconds <= mt_bounds[i])
			break;
	if (i < MT_NBUCKETS)
		h->buckets[i]++;
	h->count++;
	h->sum += seconds;
}

/* Append the sink's scheme label value (the --sink URL up to its ':'). */
static void
mt_scheme(StrBuf *sb)
{
	const char *url = relay_opts.sink ? relay_opts.sink : "";
	size_t		n = strcspn(url, ":");
	char		scheme[32];

	if (n >= sizeof(scheme))
		n = sizeof(scheme) - 1;
	memcpy(scheme, url, n);
	scheme[n] = '\0';
	mt_label_value(sb, scheme);
}

/* Format the page from a snapshot. */
static void
mt_format(StrBuf *sb, const MetricsSnapshot *m)
{
	int			i;

	mt_family(sb, "outbox_relay_info", "gauge", "The relay's worker name (lease owner) and version.");
	sb_puts(sb, "outbox_relay_info{worker=\"");
	mt_label_value(sb, relay_opts.worker);
	sb_printf(sb, "\",version=\"%s\"} 1\n", RELAY_VERSION);
	mt_family(sb, "outbox_relay_start_time_seconds", "gauge", "Unix time the relay started.");
	sb_printf(sb, "outbox_relay_start_time_seconds %.3f\n", mt_started);

#define MT_COUNTER(name, help, value) \
	do { \
		mt_family(sb, name, "counter", help); \
		sb_printf(sb, "%s %lld\n", name, (long long) (value)); \
	} while (0)
	MT_COUNTER("outbox_relay_batches_total", "Claims that returned at least one command.", m->stats.batches);
	MT_COUNTER("outbox_relay_claimed_total", "Leases granted to this relay by claim.", m->stats.claimed);
	MT_COUNTER("outbox_relay_delivered_total", "Commands the sink accepted.", m->stats.delivered);
	MT_COUNTER("outbox_relay_acked_total", "Commands acknowledged as published and accepted by the server.", m->stats.acked);
	mt_family(sb, "outbox_relay_failed_total", "counter",
			  "Failed deliveries reported with outbox.fail, by outcome (retry: back to pending, dead: dead-lettered).");
	sb_printf(sb, "outbox_relay_failed_total{outcome=\"retry\"} %lld\n", m->stats.retried);
	sb_printf(sb, "outbox_relay_failed_total{outcome=\"dead\"} %lld\n", m->stats.dead);
	MT_COUNTER("outbox_relay_stale_refused_total",
			   "Ack, fail or renew calls refused with lease_not_owned (the lease was taken over).", m->stats.stale);
	MT_COUNTER("outbox_relay_renewed_total", "Leases renewed during slow deliveries.", m->stats.renewed);
	MT_COUNTER("outbox_relay_reconnects_total", "Database reconnections.", m->stats.reconnects);
	MT_COUNTER("outbox_relay_wakeups_total", "Notifications received on outbox.notify_channel.", m->stats.wakeups);
#undef MT_COUNTER

	mt_family(sb, "outbox_relay_in_flight", "gauge", "Commands claimed whose outcome is not reported yet.");
	sb_printf(sb, "outbox_relay_in_flight %d\n", m->in_flight);
	mt_family(sb, "outbox_relay_database_connected", "gauge", "1 while the relay has a database connection.");
	sb_printf(sb, "outbox_relay_database_connected %d\n", m->connected ? 1 : 0);
	mt_family(sb, "outbox_relay_last_ack_timestamp_seconds", "gauge",
			  "Unix time of the last accepted ack (0: none yet).");
	sb_printf(sb, "outbox_relay_last_ack_timestamp_seconds %.3f\n", m->last_ack);

	mt_histogram(sb, "outbox_relay_batch_duration_seconds",
				 "Time from a claim's result to the report of the batch's outcome.", &m->batch);

	mt_family(sb, "outbox_relay_sink_failures_total", "counter",
			  "Deliveries the sink did not get confirmed, by class (retry: may pass, fatal: the command was refused, outage: the sink was unavailable and the command was held).");
	for (i = 0; i < METRICS_NFAILURES; i++)
		sb_printf(sb, "outbox_relay_sink_failures_total{class=\"%s\"} %lld\n",
				  mt_failure_class[i], m->sink_failures[i]);
	mt_family(sb, "outbox_relay_sink_up", "gauge",
			  "0 from a delivery that found the sink unavailable (down, unreachable, refusing the relay) until one that did not; 1 otherwise.");
	sb_puts(sb, "outbox_relay_sink_up{scheme=\"");
	mt_scheme(sb);
	sb_printf(sb, "\"} %d\n", m->sink_down ? 0 : 1);
	mt_family(sb, "outbox_relay_sink_outages_total", "counter",
			  "Times the sink went from available to unavailable.");
	sb_puts(sb, "outbox_relay_sink_outages_total{scheme=\"");
	mt_scheme(sb);
	sb_printf(sb, "\"} %lld\n", m->sink_outages);
	mt_histogram(sb, "outbox_relay_sink_confirm_duration_seconds",
				 "Time the sink took to deliver a batch until the broker confirmed or refused each message (deliveries that found the sink unavailable are not counted).",
				 &m->confirm);
}

/* Write all of buf to a socket; false on error. */
static bool
mt_send_all(int fd, const char *buf, size_t len)
{
	while (len > 0)
	{
		ssize_t		n = send(fd, buf, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		buf += n;
		len -= (size_t) n;
	}
	return true;
}

/* Read one request from a connection and answer it. */
static void
mt_serve(int fd)
{
	char		req[4096];
	size_t		len = 0;
	struct timeval tv = {2, 0};
	StrBuf		body;
	StrBuf		resp;
	const char *status;
	const char *ctype = "text/plain; charset=utf-8";
	bool		head;

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	while (len < sizeof(req) - 1)
	{
		ssize_t		n = recv(fd, req + len, sizeof(req) - 1 - len, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return;
		len += (size_t) n;
		req[len] = '\0';
		if (strstr(req, "\r\n\r\n") != NULL || strstr(req, "\n\n") != NULL)
			break;
	}
	req[len] = '\0';

	sb_init(&body);
	sb_init(&resp);
	head = strncmp(req, "HEAD ", 5) == 0;
	if (strncmp(req, "GET ", 4) != 0 && !head)
	{
		status = "405 Method Not Allowed";
		sb_puts(&body, "only GET is served\n");
	}
	else
	{
		const char *path = req + (head ? 5 : 4);
		size_t		plen = strcspn(path, " ?\r\n");

		if (plen == 8 && strncmp(path, "/metrics", 8) == 0)
		{
			MetricsSnapshot m;

			pthread_mutex_lock(&metrics_lock);
			m = mt_snap;
			pthread_mutex_unlock(&metrics_lock);
			status = "200 OK";
			ctype = "text/plain; version=0.0.4; charset=utf-8";
			mt_format(&body, &m);
		}
		else
		{
			status = "404 Not Found";
			sb_puts(&body, "outbox-relay serves /metrics only\n");
		}
	}
	sb_printf(&resp, "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
			  status, ctype, body.len);
	if (!head)
		sb_append(&resp, body.data, body.len);
	(void) mt_send_all(fd, resp.data, resp.len);
	sb_free(&body);
	sb_free(&resp);
}

/* The server thread: accept and answer until the stop pipe is written. */
static void *
mt_main(void *arg __attribute__((unused)))
{
	for (;;)
	{
		struct pollfd pfd[2];
		int			fd;

		pfd[0].fd = mt_listen_fd;
		pfd[0].events = POLLIN;
		pfd[1].fd = mt_stop_pipe[0];
		pfd[1].events = POLLIN;
		if (poll(pfd, 2, -1) < 0)
		{
			if (errno == EINTR)
				continue;
			relay_log("metrics endpoint: poll failed: %s", strerror(errno));
			break;
		}
		if (pfd[1].revents)
			break;
		if (!(pfd[0].revents & POLLIN))
			continue;
		fd = accept(mt_listen_fd, NULL, NULL);
		if (fd < 0)
			continue;
		mt_serve(fd);
		close(fd);
	}
	return NULL;
}

/*
 * Listen on HOST:PORT and start the server thread.  False with a message
 * when the address cannot be resolved or bound.
 */
bool
metrics_start(const char *spec, char **errmsg)
{
	char	   *host;
	char	   *port;
	struct addrinfo hints;
	struct addrinfo *res = NULL;
	struct addrinfo *ai;
	int			rc;
	int			fd = -1;
	int			one = 1;
	sigset_t	all;
	sigset_t	old;
	StrBuf		msg;

	sb_init(&msg);
	if (!metrics_parse(spec, &host, &port))
	{
		sb_printf(&msg, "invalid --metrics address \"%s\"", spec);
		*errmsg = msg.data;
		return false;
	}
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	rc = getaddrinfo(host, port, &hints, &res);
	if (rc != 0)
	{
		sb_printf(&msg, "could not resolve --metrics address \"%s\": %s", spec, gai_strerror(rc));
		*errmsg = msg.data;
		free(host);
		free(port);
		return false;
	}
	for (ai = res; ai != NULL; ai = ai->ai_next)
	{
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0)
			continue;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 16) == 0)
			break;
		rc = errno;
		close(fd);
		fd = -1;
		errno = rc;
	}
	freeaddrinfo(res);
	free(host);
	free(port);
	if (fd < 0)
	{
		sb_printf(&msg, "could not listen on --metrics address \"%s\": %s", spec, strerror(errno));
		*errmsg = msg.data;
		return false;
	}
	if (pipe(mt_stop_pipe) != 0)
	{
		sb_printf(&msg, "could not create pipe: %s", strerror(errno));
		*errmsg = msg.data;
		close(fd);
		return false;
	}
	mt_listen_fd = fd;
	mt_started = mt_wall_now();
	metrics_publish();

	/* the thread inherits a mask that blocks every signal */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&mt_thread, NULL, mt_main, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0)
	{
		sb_printf(&msg, "could not start the metrics thread: %s", strerror(rc));
		*errmsg = msg.data;
		close(fd);
		mt_listen_fd = -1;
		return false;
	}
	mt_running = true;
	sb_free(&msg);
	relay_log("serving metrics on http://%s/metrics", spec);
	return true;
}

/* Copy the counters into the snapshot (main thread). */
void
metrics_publish(void)
{
	bool		connected = db_connected();

	pthread_mutex_lock(&metrics_lock);
	if (relay_stats.acked > mt_snap.stats.acked)
		mt_snap.last_ack = mt_wall_now();
	mt_snap.stats = relay_stats;
	mt_snap.connected = connected;
	pthread_mutex_unlock(&metrics_lock);
}

/* A batch of n commands was claimed (main thread). */
void
metrics_claimed(int n)
{
	metrics_publish();
	pthread_mutex_lock(&metrics_lock);
	mt_snap.in_flight += n;
	pthread_mutex_unlock(&metrics_lock);
}

/*
 * The outcome of a batch of n commands was reported, seconds after its
 * claim (main thread).
 */
void
metrics_batch_done(int n, double seconds)
{
	metrics_publish();
	pthread_mutex_lock(&metrics_lock);
	mt_snap.in_flight -= n;
	if (mt_snap.in_flight < 0)
		mt_snap.in_flight = 0;
	mt_observe(&mt_snap.batch, seconds);
	pthread_mutex_unlock(&metrics_lock);
}

/* The sink reported a command's delivery as failed (sink_outcome). */
void
metrics_sink_failure(MetricsFailure class)
{
	pthread_mutex_lock(&metrics_lock);
	mt_snap.sink_failures[class]++;
	pthread_mutex_unlock(&metrics_lock);
}

/*
 * A deliver call of the sink returned after `seconds`, having found the
 * sink available or not (main thread).
 */
void
metrics_sink_done(bool available, double seconds)
{
	pthread_mutex_lock(&metrics_lock);
	if (!available && !mt_snap.sink_down)
		mt_snap.sink_outages++;
	mt_snap.sink_down = !available;
	if (available)
		mt_observe(&mt_snap.confirm, seconds);
	pthread_mutex_unlock(&metrics_lock);
}

/*
 * An idle relay's probe of its sink found it available or not (main
 * thread): outbox_relay_sink_up follows it as it follows deliveries.
 */
void
metrics_sink_probed(bool available)
{
	pthread_mutex_lock(&metrics_lock);
	if (!available && !mt_snap.sink_down)
		mt_snap.sink_outages++;
	mt_snap.sink_down = !available;
	pthread_mutex_unlock(&metrics_lock);
}

/* Stop the server thread and close the socket. */
void
metrics_stop(void)
{
	if (!mt_running)
		return;
	if (write(mt_stop_pipe[1], "x", 1) != 1)
		relay_log("metrics endpoint: could not signal the thread: %s", strerror(errno));
	pthread_join(mt_thread, NULL);
	close(mt_listen_fd);
	close(mt_stop_pipe[0]);
	close(mt_stop_pipe[1]);
	mt_running = false;
}
