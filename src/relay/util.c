/*-------------------------------------------------------------------------
 *
 * util.c
 *		outbox-relay helpers: logging, clocks, memory, strings and JSON.
 *
 * Logs go to stderr, one line each, prefixed with the program name and
 * pid; the sink owns stdout.  JSON strings are escaped per RFC 8259 (the
 * quote, the backslash and every control character); bytes >= 0x80 pass
 * through, the connection's client_encoding being UTF8.
 *
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/select.h>

#include "relay.h"

RelayOptions relay_opts;
RelayStats	relay_stats;

/* Monotonic time in seconds. */
double
relay_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/* Write one log line to stderr. */
static void relay_vlog(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));
static void
relay_vlog(const char *fmt, va_list ap)
{
	char		line[2048];
	int			n;

	n = snprintf(line, sizeof(line), "%s[%d]: ", RELAY_NAME, (int) getpid());
	vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	strcat(line, "\n");
	fputs(line, stderr);
}

/* Log a line. */
void
relay_log(const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	relay_vlog(fmt, ap);
	va_end(ap);
}

/* Log a line only with --verbose. */
void
relay_debug(const char *fmt,...)
{
	va_list		ap;

	if (relay_opts.verbose == 0)
		return;
	va_start(ap, fmt);
	relay_vlog(fmt, ap);
	va_end(ap);
}

/* malloc that exits on failure. */
void *
relay_malloc(size_t size)
{
	void	   *p = malloc(size ? size : 1);

	if (p == NULL)
	{
		relay_log("out of memory");
		exit(RELAY_EXIT_RUNTIME);
	}
	return p;
}

/* strdup that exits on failure. */
char *
relay_strdup(const char *s)
{
	size_t		len = strlen(s);
	char	   *p = relay_malloc(len + 1);

	memcpy(p, s, len + 1);
	return p;
}

/* The default worker name, HOST:PID of this process (malloc'd). */
char *
relay_default_worker(void)
{
	char		host[256];
	char		name[300];

	if (gethostname(host, sizeof(host)) != 0)
		strcpy(host, "localhost");
	host[sizeof(host) - 1] = '\0';
	snprintf(name, sizeof(name), "%s:%d", host, (int) getpid());
	return relay_strdup(name);
}

/* Start an empty buffer. */
void
sb_init(StrBuf *sb)
{
	sb->cap = 256;
	sb->len = 0;
	sb->data = relay_malloc(sb->cap);
	sb->data[0] = '\0';
}

/* Release a buffer. */
void
sb_free(StrBuf *sb)
{
	free(sb->data);
	sb->data = NULL;
	sb->len = sb->cap = 0;
}

/* Empty a buffer, keeping its memory. */
void
sb_reset(StrBuf *sb)
{
	sb->len = 0;
	sb->data[0] = '\0';
}

/* Make room for len more bytes and the terminator. */
static void
sb_reserve(StrBuf *sb, size_t len)
{
	if (sb->len + len + 1 <= sb->cap)
		return;
	while (sb->len + len + 1 > sb->cap)
		sb->cap *= 2;
	sb->data = realloc(sb->data, sb->cap);
	if (sb->data == NULL)
	{
		relay_log("out of memory");
		exit(RELAY_EXIT_RUNTIME);
	}
}

/* Append len bytes. */
void
sb_append(StrBuf *sb, const char *s, size_t len)
{
	sb_reserve(sb, len);
	memcpy(sb->data + sb->len, s, len);
	sb->len += len;
	sb->data[sb->len] = '\0';
}

/* Append a C string. */
void
sb_puts(StrBuf *sb, const char *s)
{
	sb_append(sb, s, strlen(s));
}

/* Append formatted text. */
void
sb_printf(StrBuf *sb, const char *fmt,...)
{
	va_list		ap;
	int			n;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	sb_reserve(sb, (size_t) n);
	va_start(ap, fmt);
	vsnprintf(sb->data + sb->len, (size_t) n + 1, fmt, ap);
	va_end(ap);
	sb->len += n;
}

/* Append s as a JSON string literal. */
void
sb_json_string(StrBuf *sb, const char *s)
{
	const unsigned char *p = (const unsigned char *) s;
	const unsigned char *run = p;

	sb_append(sb, "\"", 1);
	for (; *p; p++)
	{
		const char *esc = NULL;
		char		hex[8];

		if (*p >= 0x20 && *p != '"' && *p != '\\')
			continue;
		switch (*p)
		{
			case '"':
				esc = "\\\"";
				break;
			case '\\':
				esc = "\\\\";
				break;
			case '\n':
				esc = "\\n";
				break;
			case '\r':
				esc = "\\r";
				break;
			case '\t':
				esc = "\\t";
				break;
			case '\b':
				esc = "\\b";
				break;
			case '\f':
				esc = "\\f";
				break;
			default:
				snprintf(hex, sizeof(hex), "\\u%04x", *p);
				esc = hex;
				break;
		}
		sb_append(sb, (const char *) run, p - run);
		sb_puts(sb, esc);
		run = p + 1;
	}
	sb_append(sb, (const char *) run, p - run);
	sb_append(sb, "\"", 1);
}

/* Append s as one element of a PostgreSQL array literal (always quoted). */
void
sb_array_elem(StrBuf *sb, const char *s)
{
	sb_append(sb, "\"", 1);
	for (; *s; s++)
	{
		if (*s == '"' || *s == '\\')
			sb_append(sb, "\\", 1);
		sb_append(sb, s, 1);
	}
	sb_append(sb, "\"", 1);
}

/*
 * The JSON object of one command: the NDJSON line (without its newline)
 * and the HTTP request body.
 */
void
relay_command_json(StrBuf *sb, const RelayCommand *cmd)
{
	sb_puts(sb, "{\"command_id\":");
	sb_json_string(sb, cmd->command_id);
	sb_puts(sb, ",\"run_id\":");
	sb_json_string(sb, cmd->run_id);
	sb_printf(sb, ",\"seq\":%lld,\"kind\":", cmd->seq);
	sb_json_string(sb, cmd->kind);
	sb_puts(sb, ",\"payload\":");
	sb_puts(sb, cmd->payload);
	sb_printf(sb, ",\"deliveries\":%d", cmd->deliveries);
	if (cmd->headers_json != NULL)
	{
		sb_puts(sb, ",\"headers\":");
		sb_puts(sb, cmd->headers_json);
	}
	sb_puts(sb, "}");
}

/*
 * A copy of s fit to be stored as an error text: at most maxlen bytes,
 * printable ASCII only (a response body may hold anything), no trailing
 * whitespace.
 */
char *
relay_clean_error(const char *s, size_t maxlen)
{
	size_t		len = strlen(s);
	char	   *out;
	size_t		i;

	if (len > maxlen)
		len = maxlen;
	out = relay_malloc(len + 1);
	for (i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) s[i];

		out[i] = (c >= 0x20 && c < 0x7f) ? (char) c : ' ';
	}
	while (len > 0 && out[len - 1] == ' ')
		len--;
	out[len] = '\0';
	return out;
}

/*
 * Signals.  The first SIGTERM or SIGINT asks the relay to stop claiming and
 * finish the batch in flight (relay_stop = 1); a second one interrupts the
 * delivery in progress (relay_stop = 2): what is left of the batch is
 * failed as retryable.  SIGHUP reopens a file sink.  Each handler also
 * writes a byte to a self-pipe, so a wait in select() wakes up at once.
 */
volatile sig_atomic_t relay_stop = 0;
volatile sig_atomic_t relay_reopen = 0;
static int	sig_pipe[2] = {-1, -1};

/* Handler of SIGTERM and SIGINT. */
static void
relay_on_stop(int signo)
{
	int			save_errno = errno;
	ssize_t		rc;

	(void) signo;
	if (relay_stop < 2)
		relay_stop++;
	rc = write(sig_pipe[1], "x", 1);
	(void) rc;
	errno = save_errno;
}

/* Handler of SIGHUP. */
static void
relay_on_hup(int signo)
{
	int			save_errno = errno;
	ssize_t		rc;

	(void) signo;
	relay_reopen = 1;
	rc = write(sig_pipe[1], "x", 1);
	(void) rc;
	errno = save_errno;
}

/*
 * In a child forked after relay_signal_init: a self-pipe of its own (the
 * parent's stays the parent's).  A stop request already received stays.
 */
void
relay_signal_reinit(void)
{
	close(sig_pipe[0]);
	close(sig_pipe[1]);
	relay_reopen = 0;
	relay_signal_init();
}

/* Install the signal handlers and the self-pipe. */
void
relay_signal_init(void)
{
	struct sigaction sa;
	int			i;

	if (pipe(sig_pipe) != 0)
	{
		relay_log("could not create pipe: %s", strerror(errno));
		exit(RELAY_EXIT_RUNTIME);
	}
	for (i = 0; i < 2; i++)
	{
		fcntl(sig_pipe[i], F_SETFL, fcntl(sig_pipe[i], F_GETFL) | O_NONBLOCK);
		fcntl(sig_pipe[i], F_SETFD, FD_CLOEXEC);
	}

	/*
	 * SA_RESTART: a signal must not turn a blocked write to the sink into
	 * an error; waits in select() return early all the same.
	 */
	memset(&sa, 0, sizeof(sa));
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART;
	sa.sa_handler = relay_on_stop;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sa.sa_handler = relay_on_hup;
	sigaction(SIGHUP, &sa, NULL);
	sa.sa_handler = SIG_IGN;
	sigaction(SIGPIPE, &sa, NULL);
}

/* The read end of the self-pipe. */
int
relay_signal_fd(void)
{
	return sig_pipe[0];
}

/* Empty the self-pipe. */
void
relay_drain_signal_fd(void)
{
	char		buf[64];

	while (read(sig_pipe[0], buf, sizeof(buf)) > 0)
		;
}

/*
 * Sleep for up to `seconds`, waking up early when a signal arrives.
 */
void
relay_sleep(double seconds)
{
	fd_set		rfds;
	struct timeval tv;
	int			fd = relay_signal_fd();

	if (seconds <= 0)
		return;
	FD_ZERO(&rfds);
	FD_SET(fd, &rfds);
	tv.tv_sec = (time_t) seconds;
	tv.tv_usec = (suseconds_t) ((seconds - (double) tv.tv_sec) * 1e6);
	if (select(fd + 1, &rfds, NULL, NULL, &tv) > 0)
		relay_drain_signal_fd();
}
