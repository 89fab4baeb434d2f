/*-------------------------------------------------------------------------
 *
 * sink.c
 *		outbox-relay's sink registry, and the helpers every sink module
 *		shares: outcomes, the message body, URL parsing.
 *
 * The registry is the list of modules the relay was built with:
 * RELAY_SINKS, set by the Makefile to X(stdout) X(file) X(http) followed
 * by X(NAME) for every broker whose client library it found.  sink_open
 * picks the module whose scheme begins the URL.  The interface itself is
 * described in sink.h.
 *
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "sink.h"

#ifndef RELAY_SINKS
#error "RELAY_SINKS must be defined (the Makefile sets it to the sinks it builds)"
#endif

#define X(name) extern const SinkOps sink_##name##_ops;
RELAY_SINKS
#undef X

#define X(name) &sink_##name##_ops,
static const SinkOps *const sink_registry[] = {
	RELAY_SINKS
	NULL
};
#undef X

/* A malloc'd message, formatted. */
char *
sink_errorf(const char *fmt,...)
{
	char		buf[1024];
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	return relay_strdup(buf);
}

/* The names of the sinks built in, separated by spaces. */
const char *
sink_names(void)
{
	static char names[512];
	int			i;

	if (names[0] != '\0')
		return names;
	for (i = 0; sink_registry[i] != NULL; i++)
	{
		if (i > 0)
			strncat(names, " ", sizeof(names) - strlen(names) - 1);
		strncat(names, sink_registry[i]->name, sizeof(names) - strlen(names) - 1);
	}
	return names;
}

/* Print the usage lines of every sink built in (for --help). */
void
sink_print_usage(FILE *out)
{
	int			i;

	for (i = 0; sink_registry[i] != NULL; i++)
		fputs(sink_registry[i]->usage, out);
}

/* The module serving url, or NULL. */
static const SinkOps *
sink_lookup(const char *url)
{
	int			i;
	int			j;

	for (i = 0; sink_registry[i] != NULL; i++)
	{
		const SinkOps *ops = sink_registry[i];

		for (j = 0; ops->schemes[j] != NULL; j++)
		{
			const char *s = ops->schemes[j];
			size_t		len = strlen(s);

			if (strcmp(s, "stdout") == 0)
			{
				if (strcmp(url, "stdout") == 0)
					return ops;
				continue;
			}
			if (strncmp(url, s, len) != 0 || url[len] != ':')
				continue;
			if (strcmp(s, "file") == 0 || strncmp(url + len, "://", 3) == 0)
				return ops;
		}
	}
	return NULL;
}

/* The URL with the password of its userinfo replaced by "***". */
static char *
sink_mask_url(const char *url)
{
	const char *sep = strstr(url, "://");
	const char *at;
	const char *colon;
	const char *end;
	PQExpBufferData buf;
	char	   *out;

	if (sep == NULL)
		return relay_strdup(url);
	end = sep + 3 + strcspn(sep + 3, "/?#");
	at = NULL;
	for (colon = sep + 3; colon < end; colon++)
		if (*colon == '@')
			at = colon;
	if (at == NULL)
		return relay_strdup(url);
	colon = memchr(sep + 3, ':', at - (sep + 3));
	if (colon == NULL)
		return relay_strdup(url);
	initPQExpBuffer(&buf);
	appendBinaryPQExpBuffer(&buf, url, colon - url);
	appendPQExpBufferStr(&buf, ":***");
	appendPQExpBufferStr(&buf, at);
	out = relay_strdup(buf.data);
	termPQExpBuffer(&buf);
	return out;
}

/*
 * Open the sink for url.  SINK_OPEN_CONFIG for a URL no module serves or
 * that its module refuses; *err is then a malloc'd message.
 */
SinkOpenResult
sink_open(const char *url, Sink **sink, char **err)
{
	const SinkOps *ops = sink_lookup(url);
	SinkOpenResult r;

	*sink = NULL;
	*err = NULL;
	if (ops == NULL)
	{
		char	   *shown = sink_mask_url(url);

		*err = sink_errorf("invalid sink \"%s\": expected one of: %s (the sinks this relay was built with)",
						   shown, sink_names());
		free(shown);
		return SINK_OPEN_CONFIG;
	}
	r = ops->open(url, sink, err);
	if (r != SINK_OPEN_OK)
	{
		if (*err == NULL)
			*err = sink_errorf("could not open the %s sink", ops->name);
		*sink = NULL;
		return r;
	}
	(*sink)->ops = ops;
	(*sink)->url = relay_strdup(url);
	(*sink)->shown = sink_mask_url(url);
	return SINK_OPEN_OK;
}

/* Deliver the batch's CMD_TODO commands (sink.h). */
SinkResult
sink_deliver(Sink *sink, RelayBatch *batch, SinkTick tick, void *arg)
{
	return sink->ops->deliver(sink, batch, tick, arg);
}

/* Whether the sink can deliver now and confirm later (sink.h: submit). */
bool
sink_can_submit(Sink *sink)
{
	return sink->ops->submit != NULL && sink->ops->settle != NULL;
}

/* Start delivering a batch (sink.h: submit). */
SinkResult
sink_submit(Sink *sink, RelayBatch *batch)
{
	return sink->ops->submit(sink, batch);
}

/* Wait for a submitted batch's confirmations (sink.h: settle). */
SinkResult
sink_settle(Sink *sink, RelayBatch *batch, SinkTick tick, void *arg)
{
	return sink->ops->settle(sink, batch, tick, arg);
}

/* Push buffered deliveries out (sink.h). */
bool
sink_confirm(Sink *sink, char **err)
{
	*err = NULL;
	if (sink->ops->confirm == NULL)
		return true;
	return sink->ops->confirm(sink, err);
}

/*
 * Probe an idle sink (sink.h).  SINK_RETRY when the sink has no probe:
 * nothing is known then.
 */
SinkResult
sink_probe(Sink *sink, char **err)
{
	*err = NULL;
	if (sink->ops->probe == NULL)
		return SINK_RETRY;
	return sink->ops->probe(sink, err);
}

/* Reopen after SIGHUP (sink.h). */
bool
sink_reopen(Sink *sink, char **err)
{
	*err = NULL;
	if (sink->ops->reopen == NULL)
		return true;
	return sink->ops->reopen(sink, err);
}

/* Close and free the sink. */
void
sink_close(Sink *sink)
{
	char	   *url;
	char	   *shown;

	if (sink == NULL)
		return;
	url = sink->url;
	shown = sink->shown;
	sink->ops->close(sink);
	free(url);
	free(shown);
}

/* What the sink is, for the logs. */
const char *
sink_describe(Sink *sink)
{
	if (sink->ops->describe != NULL)
		return sink->ops->describe(sink);
	return sink->shown;
}

/*
 * Record the outcome of one delivery in its command (sink.h).  A command
 * that is no longer CMD_TODO (its lease was lost meanwhile) is left alone.
 */
void
sink_outcome(RelayCommand *cmd, SinkResult r, const char *error)
{
	if (cmd->state != CMD_TODO)
		return;
	if (r != SINK_OK)
	{
		free(cmd->error);
		cmd->error = relay_clean_error(error ? error : "delivery failed", 900);
		metrics_sink_failure(r == SINK_RETRY ? METRICS_FAIL_RETRY :
							 r == SINK_FATAL ? METRICS_FAIL_FATAL : METRICS_FAIL_OUTAGE);
	}
	switch (r)
	{
		case SINK_OK:
			cmd->state = CMD_DELIVERED;
			relay_stats.delivered++;
			break;
		case SINK_RETRY:
		case SINK_FATAL:
			cmd->state = CMD_FAILED;
			cmd->fatal = (r == SINK_FATAL);
			break;
		case SINK_UNAVAILABLE:
			/* held by the relay; delivered again once the broker is back */
			break;
	}
}

/* Append the command's JSON object (the message body) to buf. */
void
sink_command_json(PQExpBuffer buf, const RelayCommand *cmd)
{
	StrBuf		sb;

	sb_init(&sb);
	relay_command_json(&sb, cmd);
	appendBinaryPQExpBuffer(buf, sb.data, sb.len);
	sb_free(&sb);
}

/*
 * Whether a producer header name is a framing or hop-by-hop field of HTTP,
 * which no sink passes on.  The server refuses these names at
 * commit_decision already (the same list, src/args.c); the relay checks
 * again so that its requests never depend on what the table holds.
 */
bool
sink_header_reserved(const char *name)
{
	static const char *const reserved[] = {
		"connection", "content-length", "expect", "host", "keep-alive",
		"proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
		"trailer", "transfer-encoding", "upgrade", NULL
	};
	int			i;

	for (i = 0; reserved[i] != NULL; i++)
		if (strcasecmp(name, reserved[i]) == 0)
			return true;
	return false;
}

/*
 * Whether name is one of list (NULL-terminated), case-insensitively: a
 * producer header a sink sets itself, whose value the sink keeps.
 */
bool
sink_header_listed(const char *name, const char *const *list)
{
	for (; *list != NULL; list++)
		if (strcasecmp(name, *list) == 0)
			return true;
	return false;
}

/* Value of a hex digit, or -1. */
static int
hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* A malloc'd percent-decoded copy of s[0..len), or NULL if malformed. */
static char *
url_decode(const char *s, size_t len)
{
	char	   *out = relay_malloc(len + 1);
	size_t		i;
	size_t		o = 0;

	for (i = 0; i < len; i++)
	{
		if (s[i] == '%')
		{
			int			h;
			int			l;

			if (i + 2 >= len)
			{
				free(out);
				return NULL;
			}
			h = hexval(s[i + 1]);
			l = hexval(s[i + 2]);
			if (h < 0 || l < 0 || (h == 0 && l == 0))
			{
				free(out);
				return NULL;
			}
			out[o++] = (char) (h * 16 + l);
			i += 2;
		}
		else
			out[o++] = s[i];
	}
	out[o] = '\0';
	return out;
}

/*
 * Take url apart (SinkUrl).  False with a malloc'd *err when it is not of
 * the form scheme://[user[:password]@]hosts[/path][?key=value[&...]], has
 * no host, or has a malformed escape.  The message never repeats the URL
 * (it may hold a password).
 */
bool
sink_url_parse(const char *url, SinkUrl *u, char **err)
{
	const char *p = strstr(url, "://");
	const char *auth;
	const char *auth_end;
	const char *at = NULL;
	const char *q;
	const char *path_end;

	memset(u, 0, sizeof(SinkUrl));
	*err = NULL;
	if (p == NULL || p == url)
	{
		*err = sink_errorf("invalid sink URL: scheme://HOST:PORT... is expected");
		return false;
	}
	u->scheme = relay_malloc(p - url + 1);
	memcpy(u->scheme, url, p - url);
	u->scheme[p - url] = '\0';

	auth = p + 3;
	auth_end = auth + strcspn(auth, "/?#");
	if (*auth_end == '#')
	{
		*err = sink_errorf("invalid %s sink URL: a fragment (#) is not allowed", u->scheme);
		goto fail;
	}
	for (q = auth; q < auth_end; q++)
		if (*q == '@')
			at = q;
	if (at != NULL)
	{
		const char *colon = memchr(auth, ':', at - auth);

		u->user = url_decode(auth, (colon ? colon : at) - auth);
		if (colon != NULL)
			u->password = url_decode(colon + 1, at - colon - 1);
		if (u->user == NULL || (colon != NULL && u->password == NULL))
		{
			*err = sink_errorf("invalid %s sink URL: malformed %%-escape in the user or password", u->scheme);
			goto fail;
		}
		auth = at + 1;
	}
	if (auth == auth_end)
	{
		*err = sink_errorf("invalid %s sink URL: no host given", u->scheme);
		goto fail;
	}
	u->hosts = relay_malloc(auth_end - auth + 1);
	memcpy(u->hosts, auth, auth_end - auth);
	u->hosts[auth_end - auth] = '\0';

	p = auth_end;
	path_end = p + strcspn(p, "?#");
	if (*p == '/')
	{
		u->path = url_decode(p + 1, path_end - p - 1);
		if (u->path == NULL)
		{
			*err = sink_errorf("invalid %s sink URL: malformed %%-escape in the path", u->scheme);
			goto fail;
		}
	}
	else
		u->path = relay_strdup("");
	p = path_end;
	if (*p == '#')
	{
		*err = sink_errorf("invalid %s sink URL: a fragment (#) is not allowed", u->scheme);
		goto fail;
	}
	if (*p == '?')
	{
		int			max = 1;

		for (q = p; *q; q++)
			if (*q == '&')
				max++;
		u->keys = relay_malloc(sizeof(char *) * max);
		u->values = relay_malloc(sizeof(char *) * max);
		p++;
		while (*p)
		{
			size_t		len = strcspn(p, "&#");
			const char *eq = memchr(p, '=', len);

			if (p[len] == '#')
			{
				*err = sink_errorf("invalid %s sink URL: a fragment (#) is not allowed", u->scheme);
				goto fail;
			}
			if (len == 0)
			{
				p++;
				continue;
			}
			if (eq == NULL || eq == p)
			{
				*err = sink_errorf("invalid %s sink URL: option \"%.*s\" is not of the form key=value",
								   u->scheme, (int) (eq == p ? 0 : len > 40 ? 40 : len), p);
				goto fail;
			}
			u->keys[u->nopts] = url_decode(p, eq - p);
			u->values[u->nopts] = url_decode(eq + 1, p + len - eq - 1);
			if (u->keys[u->nopts] == NULL || u->values[u->nopts] == NULL)
			{
				free(u->keys[u->nopts]);
				free(u->values[u->nopts]);
				*err = sink_errorf("invalid %s sink URL: malformed %%-escape in an option", u->scheme);
				goto fail;
			}
			u->nopts++;
			p += len;
			if (*p == '&')
				p++;
		}
	}
	return true;

fail:
	sink_url_free(u);
	return false;
}

/*
 * Check that every option of u is one of `allowed` (NULL-terminated) and
 * given once.  False with *err naming the first one that is not.
 */
bool
sink_url_check_options(const SinkUrl *u, const char *const *allowed, char **err)
{
	int			i;
	int			j;

	for (i = 0; i < u->nopts; i++)
	{
		bool		known = false;

		for (j = 0; allowed[j] != NULL; j++)
			if (strcmp(u->keys[i], allowed[j]) == 0)
				known = true;
		if (!known)
		{
			PQExpBufferData list;

			initPQExpBuffer(&list);
			for (j = 0; allowed[j] != NULL; j++)
				appendPQExpBuffer(&list, "%s%s", j > 0 ? ", " : "", allowed[j]);
			*err = sink_errorf("invalid %s sink URL: unknown option \"%.40s\" (known: %s)",
							   u->scheme, u->keys[i], list.len > 0 ? list.data : "none");
			termPQExpBuffer(&list);
			return false;
		}
		for (j = 0; j < i; j++)
			if (strcmp(u->keys[i], u->keys[j]) == 0)
			{
				*err = sink_errorf("invalid %s sink URL: option \"%s\" given twice",
								   u->scheme, u->keys[i]);
				return false;
			}
	}
	return true;
}

/* The value of option key, or NULL. */
const char *
sink_url_option(const SinkUrl *u, const char *key)
{
	int			i;

	for (i = 0; i < u->nopts; i++)
		if (strcmp(u->keys[i], key) == 0)
			return u->values[i];
	return NULL;
}

/*
 * Integer option key in [min, max] into *value (left alone when absent).
 * False with *err when present but not such an integer.
 */
bool
sink_url_int_option(const SinkUrl *u, const char *key, long min, long max,
					long *value, char **err)
{
	const char *s = sink_url_option(u, key);
	char	   *end;
	long		v;

	if (s == NULL)
		return true;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < min || v > max)
	{
		*err = sink_errorf("invalid %s sink URL: option \"%s\" must be an integer from %ld to %ld",
						   u->scheme, key, min, max);
		return false;
	}
	*value = v;
	return true;
}

/*
 * The start of every broker sink's open that takes one HOST[:PORT] and no
 * password in the URL: parse url, check its options against allowed,
 * refuse a password (password_hint says where one goes instead) and split
 * exactly one host into *hosts (*n = 1).  SINK_OPEN_CONFIG with *err, u
 * and the hosts freed, on any error.
 */
SinkOpenResult
sink_url_one_host(const char *url, const char *scheme, const char *const *allowed,
				  int default_port, const char *password_hint,
				  SinkUrl *u, SinkHost **hosts, int *n, char **err)
{
	*hosts = NULL;
	*n = 0;
	if (!sink_url_parse(url, u, err))
		return SINK_OPEN_CONFIG;
	if (!sink_url_check_options(u, allowed, err))
		goto config;
	if (u->password != NULL)
	{
		*err = sink_errorf("invalid %s sink URL: a password must not be in the URL (ps shows it): %s",
						   scheme, password_hint);
		goto config;
	}
	*n = sink_url_hosts(u, default_port, hosts, err);
	if (*n < 0)
		goto config;
	if (*n != 1)
	{
		*err = sink_errorf("invalid %s sink URL: exactly one HOST:PORT is expected", scheme);
		goto config;
	}
	return SINK_OPEN_OK;

config:
	if (*hosts != NULL)
		sink_hosts_free(*hosts, *n);
	*hosts = NULL;
	*n = 0;
	sink_url_free(u);
	return SINK_OPEN_CONFIG;
}

/*
 * Split u->hosts ("HOST[:PORT][,HOST[:PORT]...]", IPv6 in brackets) into
 * *hosts; a host without a port gets default_port (0: a port is required).
 * Returns the number of hosts, or -1 with *err.
 */
int
sink_url_hosts(const SinkUrl *u, int default_port, SinkHost **hosts, char **err)
{
	int			n = 1;
	int			i = 0;
	const char *p;

	for (p = u->hosts; *p; p++)
		if (*p == ',')
			n++;
	*hosts = relay_malloc(sizeof(SinkHost) * n);
	memset(*hosts, 0, sizeof(SinkHost) * n);
	p = u->hosts;
	for (i = 0; i < n; i++)
	{
		size_t		len = strcspn(p, ",");
		const char *hend;
		const char *port = NULL;
		const char *hstart = p;
		long		portnum = default_port;

		if (len == 0)
		{
			*err = sink_errorf("invalid %s sink URL: empty host in the host list", u->scheme);
			goto fail;
		}
		if (*p == '[')
		{
			const char *close = memchr(p, ']', len);

			if (close == NULL)
			{
				*err = sink_errorf("invalid %s sink URL: unterminated [ in a host", u->scheme);
				goto fail;
			}
			hstart = p + 1;
			hend = close;
			if (close + 1 < p + len)
			{
				if (close[1] != ':')
				{
					*err = sink_errorf("invalid %s sink URL: malformed host", u->scheme);
					goto fail;
				}
				port = close + 2;
			}
		}
		else
		{
			const char *colon = memchr(p, ':', len);

			hend = colon ? colon : p + len;
			if (colon != NULL)
				port = colon + 1;
		}
		if (hend == hstart)
		{
			*err = sink_errorf("invalid %s sink URL: empty host name", u->scheme);
			goto fail;
		}
		if (port != NULL)
		{
			char	   *end;

			errno = 0;
			portnum = strtol(port, &end, 10);
			if (errno != 0 || end == port || end != p + len || portnum < 1 || portnum > 65535)
			{
				*err = sink_errorf("invalid %s sink URL: the port must be a number from 1 to 65535",
								   u->scheme);
				goto fail;
			}
		}
		else if (default_port == 0)
		{
			*err = sink_errorf("invalid %s sink URL: HOST:PORT is expected (no port given)", u->scheme);
			goto fail;
		}
		(*hosts)[i].host = relay_malloc(hend - hstart + 1);
		memcpy((*hosts)[i].host, hstart, hend - hstart);
		(*hosts)[i].host[hend - hstart] = '\0';
		(*hosts)[i].port = (int) portnum;
		p += len;
		if (*p == ',')
			p++;
	}
	return n;

fail:
	sink_hosts_free(*hosts, n);
	*hosts = NULL;
	return -1;
}

/*
 * Read a secret (a password) from the first line of the file path names,
 * without its line end; NULL with *err naming the sink (scheme), the file
 * and why.  The buffer it passed through is wiped.
 */
char *
sink_read_secret(const char *scheme, const char *path, char **err)
{
	FILE	   *fp = fopen(path, "r");
	char		buf[1024];
	char	   *secret;

	if (fp == NULL)
	{
		*err = sink_errorf("could not open the %s sink's password_file \"%s\": %s",
						   scheme, path, strerror(errno));
		return NULL;
	}
	if (fgets(buf, sizeof(buf), fp) == NULL)
		buf[0] = '\0';
	fclose(fp);
	buf[strcspn(buf, "\r\n")] = '\0';
	secret = relay_strdup(buf);
	explicit_bzero(buf, sizeof(buf));
	return secret;
}

/*
 * Wipe a secret (a password or token) and free it, so that it does not
 * linger in freed memory.  NULL is allowed.
 */
void
sink_free_secret(char *secret)
{
	if (secret != NULL)
		explicit_bzero(secret, strlen(secret));
	free(secret);
}

/* Free what sink_url_parse allocated. */
void
sink_url_free(SinkUrl *u)
{
	int			i;

	for (i = 0; i < u->nopts; i++)
	{
		free(u->keys[i]);
		free(u->values[i]);
	}
	free(u->keys);
	free(u->values);
	free(u->scheme);
	free(u->user);
	sink_free_secret(u->password);
	free(u->hosts);
	free(u->path);
	memset(u, 0, sizeof(SinkUrl));
}

/* Free what sink_url_hosts allocated. */
void
sink_hosts_free(SinkHost *hosts, int n)
{
	int			i;

	if (hosts == NULL)
		return;
	for (i = 0; i < n; i++)
		free(hosts[i].host);
	free(hosts);
}

/*
 * NDJSON (stdout and file sinks): write one line per CMD_TODO command of
 * the batch to fp, buffered until sink_ndjson_flush.  tick is called
 * before each line; false stops the writing (the rest stays CMD_TODO).
 */
SinkResult
sink_ndjson_deliver(FILE *fp, const char *what, RelayBatch *batch,
					SinkTick tick, void *arg)
{
	PQExpBufferData line;
	int			i;

	initPQExpBuffer(&line);
	for (i = 0; i < batch->n; i++)
	{
		RelayCommand *cmd = &batch->cmds[i];

		if (tick != NULL && !tick(arg))
			break;
		if (cmd->state != CMD_TODO)
			continue;			/* lease lost */
		resetPQExpBuffer(&line);
		sink_command_json(&line, cmd);
		appendPQExpBufferChar(&line, '\n');
		if (PQExpBufferDataBroken(line))
		{
			relay_log("out of memory");
			exit(RELAY_EXIT_RUNTIME);
		}
		if (fwrite(line.data, 1, line.len, fp) != line.len)
		{
			char		msg[256];

			snprintf(msg, sizeof(msg), "could not write to %s: %s", what, strerror(errno));
			sink_outcome(cmd, SINK_RETRY, msg);
		}
		else
			sink_outcome(cmd, SINK_OK, NULL);
	}
	termPQExpBuffer(&line);
	return SINK_OK;
}

/*
 * Push what sink_ndjson_deliver buffered out of the process, and to disk
 * when sync is set.  False with a malloc'd *err when the output is broken.
 */
bool
sink_ndjson_flush(FILE *fp, const char *what, bool sync, char **err)
{
	if (fflush(fp) != 0 || ferror(fp))
	{
		*err = sink_errorf("could not write to %s: %s", what, strerror(errno));
		return false;
	}
	/* pipes and terminals cannot be synced; that is not an error */
	if (sync && fdatasync(fileno(fp)) != 0 && errno != EINVAL && errno != EROFS)
	{
		*err = sink_errorf("could not sync %s: %s", what, strerror(errno));
		return false;
	}
	return true;
}

/*
 * The round of a broker sink that delivers batch, or, with batch NULL, a
 * free one; NULL when there is none.  rounds is the sink's array of n
 * rounds of size bytes each, every one beginning with its RelayBatch
 * pointer (NULL: free).  The sinks that keep two batches at the broker
 * (submit and settle) hold one round per batch.
 */
void *
sink_round(void *rounds, size_t size, int n, const RelayBatch *batch)
{
	int			k;

	for (k = 0; k < n; k++)
	{
		char	   *rd = (char *) rounds + (size_t) k * size;

		if (*(RelayBatch **) rd == batch)
			return rd;
	}
	return NULL;
}

/*
 * A free round for submit (sink_round); the relay submits at most n
 * batches at once, so a sink without one ends it (a defect of the relay).
 */
void *
sink_free_round(void *rounds, size_t size, int n, const char *sink)
{
	void	   *rd = sink_round(rounds, size, n, NULL);

	if (rd == NULL)
	{
		relay_log("%s sink: more than %d batches submitted at once", sink, n);
		exit(RELAY_EXIT_RUNTIME);
	}
	return rd;
}
