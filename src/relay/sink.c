/*-------------------------------------------------------------------------
 *
 * sink.c
 *		Where outbox-relay delivers: stdout, a file (NDJSON, one object per
 *		command), or an HTTP(S) endpoint (one POST per command, libcurl).
 *
 * NDJSON sinks buffer the lines of a batch and flush them (and, for a
 * file, fdatasync it) before the batch is acked: a line is "delivered" only
 * once it is out of the process.  If the flush fails, the batch is failed
 * as retryable and the relay exits 1.
 *
 * The HTTP sink POSTs the same JSON object with an Idempotency-Key header
 * holding the command_id, through libcurl's multi interface: up to
 * --concurrency requests of a batch in flight at once (default 1: one at a
 * time, in claim order), over reused keep-alive connections.  A 2xx answer
 * is a delivery; 408, 429, 5xx, a timeout or a network error are retryable
 * failures; any other 4xx is fatal (the endpoint refuses the command
 * itself); redirects are not followed and count as retryable.  When the
 * endpoint cannot be reached at all, no further request of the batch is
 * started (the rest is reported as not attempted).  Between two polls of
 * the transfers (at most 100 ms apart) the sink calls back into the relay,
 * which renews the leases of a slow batch and lets a second SIGTERM
 * interrupt the requests in flight.
 *
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>

#include "relay.h"

typedef enum SinkType
{
	SINK_STDOUT,
	SINK_FILE,
	SINK_HTTP
} SinkType;

/* One HTTP request slot of the multi handle. */
typedef struct HttpSlot
{
	CURL	   *easy;
	struct curl_slist *headers;
	StrBuf		body;
	char		errbuf[CURL_ERROR_SIZE];
	char		resp[256];
	size_t		resp_len;
	int			cmd;			/* index in the batch; -1 when free */
} HttpSlot;

struct Sink
{
	SinkType	type;
	char	   *spec;
	char	   *path;			/* SINK_FILE */
	FILE	   *fp;				/* SINK_STDOUT, SINK_FILE */
	StrBuf		body;
	/* SINK_HTTP */
	CURLM	   *multi;
	HttpSlot   *slots;
	int			nslots;
};

/* Open (or reopen) the file of a file sink. */
static bool
sink_open_file(Sink *sink, char **errmsg)
{
	static char msg[1024];

	sink->fp = fopen(sink->path, "a");
	if (sink->fp == NULL)
	{
		snprintf(msg, sizeof(msg), "could not open file \"%s\": %s",
				 sink->path, strerror(errno));
		*errmsg = msg;
		return false;
	}
	setvbuf(sink->fp, NULL, _IOFBF, 1 << 16);
	return true;
}

/* libcurl write callback: keep the start of the response body. */
static size_t
http_write(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	HttpSlot   *slot = userdata;
	size_t		len = size * nmemb;
	size_t		room = sizeof(slot->resp) - 1 - slot->resp_len;

	if (room > len)
		room = len;
	memcpy(slot->resp + slot->resp_len, ptr, room);
	slot->resp_len += room;
	slot->resp[slot->resp_len] = '\0';
	return len;
}

/* Create the easy handle of one slot, with the options every request shares. */
static bool
http_slot_init(Sink *sink, HttpSlot *slot)
{
	CURL	   *c = curl_easy_init();

	if (c == NULL)
		return false;
	slot->easy = c;
	slot->cmd = -1;
	sb_init(&slot->body);
	curl_easy_setopt(c, CURLOPT_URL, sink->spec);
#if LIBCURL_VERSION_NUM >= 0x075500
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
#else
	curl_easy_setopt(c, CURLOPT_PROTOCOLS, CURLPROTO_HTTP | CURLPROTO_HTTPS);
#endif
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_POST, 1L);
	curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long) (relay_opts.connect_timeout * 1000));
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long) (relay_opts.timeout * 1000));
	curl_easy_setopt(c, CURLOPT_USERAGENT, RELAY_NAME "/" RELAY_VERSION);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, slot->errbuf);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, http_write);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, slot);
	curl_easy_setopt(c, CURLOPT_PRIVATE, slot);
	return true;
}

/*
 * Open the sink named by spec: "stdout", "file:PATH", or an http:// or
 * https:// URL.  NULL with *errmsg set on failure.
 */
Sink *
sink_open(const char *spec, char **errmsg)
{
	Sink	   *sink = relay_malloc(sizeof(Sink));
	int			i;

	memset(sink, 0, sizeof(Sink));
	sink->spec = relay_strdup(spec);
	sb_init(&sink->body);

	if (strcmp(spec, "stdout") == 0)
	{
		sink->type = SINK_STDOUT;
		sink->fp = stdout;
		setvbuf(stdout, NULL, _IOFBF, 1 << 16);
		return sink;
	}
	if (strncmp(spec, "file:", 5) == 0)
	{
		sink->type = SINK_FILE;
		sink->path = relay_strdup(spec + 5);
		if (!sink_open_file(sink, errmsg))
			return NULL;
		return sink;
	}

	sink->type = SINK_HTTP;
	sink->multi = curl_multi_init();
	sink->nslots = relay_opts.concurrency > 0 ? relay_opts.concurrency : 1;
	sink->slots = relay_malloc(sizeof(HttpSlot) * sink->nslots);
	memset(sink->slots, 0, sizeof(HttpSlot) * sink->nslots);
	if (sink->multi == NULL)
	{
		*errmsg = "could not initialize libcurl";
		return NULL;
	}
	for (i = 0; i < sink->nslots; i++)
	{
		if (!http_slot_init(sink, &sink->slots[i]))
		{
			*errmsg = "could not initialize libcurl";
			return NULL;
		}
	}
	return sink;
}

/* True for an HTTP(S) sink, which delivers whole batches (sink_deliver_batch). */
bool
sink_is_http(Sink *sink)
{
	return sink->type == SINK_HTTP;
}

/* What the sink is, for the logs. */
const char *
sink_describe(Sink *sink)
{
	return sink->spec;
}

/* True when s can go into an HTTP header value as is. */
static bool
header_safe(const char *s)
{
	for (; *s; s++)
		if ((unsigned char) *s < 0x20 || *s == 0x7f)
			return false;
	return true;
}

/* Set cmd's error text (printable, bounded). */
static void
set_error(RelayCommand *cmd, const char *msg)
{
	free(cmd->error);
	cmd->error = relay_clean_error(msg, 900);
}

/* Start the POST of one command in a free slot. */
static void
http_start(Sink *sink, HttpSlot *slot, RelayCommand *cmd, int index)
{
	StrBuf		key;
	int			i;

	sb_reset(&slot->body);
	relay_command_json(&slot->body, cmd);

	sb_init(&key);
	sb_printf(&key, "Idempotency-Key: %s", cmd->command_id);
	slot->headers = curl_slist_append(NULL, "Content-Type: application/json");
	slot->headers = curl_slist_append(slot->headers, "Expect:");
	for (i = 0; i < relay_opts.nheaders; i++)
		slot->headers = curl_slist_append(slot->headers, relay_opts.headers[i]);
	slot->headers = curl_slist_append(slot->headers, key.data);
	sb_free(&key);
	if (slot->headers == NULL)
	{
		relay_log("out of memory");
		exit(RELAY_EXIT_RUNTIME);
	}

	curl_easy_setopt(slot->easy, CURLOPT_HTTPHEADER, slot->headers);
	curl_easy_setopt(slot->easy, CURLOPT_POSTFIELDS, slot->body.data);
	curl_easy_setopt(slot->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) slot->body.len);
	slot->errbuf[0] = '\0';
	slot->resp_len = 0;
	slot->resp[0] = '\0';
	slot->cmd = index;
	curl_multi_add_handle(sink->multi, slot->easy);
}

/* Take a slot's request out of the multi handle and free the slot. */
static void
http_release(Sink *sink, HttpSlot *slot)
{
	curl_multi_remove_handle(sink->multi, slot->easy);
	curl_easy_setopt(slot->easy, CURLOPT_HTTPHEADER, NULL);
	curl_slist_free_all(slot->headers);
	slot->headers = NULL;
	slot->cmd = -1;
}

/* Sort out a finished request. */
static SinkResult
http_result(Sink *sink, HttpSlot *slot, CURLcode rc, RelayCommand *cmd)
{
	long		status = 0;
	char		msg[1200];

	if (rc == CURLE_OK)
	{
		curl_easy_getinfo(slot->easy, CURLINFO_RESPONSE_CODE, &status);
		if (status >= 200 && status < 300)
			return SINK_OK;
		snprintf(msg, sizeof(msg), "HTTP %ld from %s%s%s", status, sink->spec,
				 slot->resp_len > 0 ? ": " : "", slot->resp);
		set_error(cmd, msg);
		if (status >= 400 && status < 500 && status != 408 && status != 429)
			return SINK_FATAL;
		return SINK_RETRY;
	}

	snprintf(msg, sizeof(msg), "%s: %s", curl_easy_strerror(rc),
			 slot->errbuf[0] ? slot->errbuf : sink->spec);
	set_error(cmd, msg);
	switch (rc)
	{
		case CURLE_COULDNT_CONNECT:
		case CURLE_COULDNT_RESOLVE_HOST:
		case CURLE_COULDNT_RESOLVE_PROXY:
			return SINK_UNAVAILABLE;
		default:
			return SINK_RETRY;
	}
}

/* Record the outcome of one delivery in its command. */
static void
set_outcome(RelayCommand *cmd, SinkResult r)
{
	/* a command whose lease was lost meanwhile is no longer ours */
	if (cmd->state != CMD_TODO)
		return;
	if (r == SINK_OK)
	{
		cmd->state = CMD_DELIVERED;
		relay_stats.delivered++;
		return;
	}
	cmd->state = CMD_FAILED;
	cmd->fatal = (r == SINK_FATAL);
}

/*
 * Deliver the batch's CMD_TODO commands over HTTP, up to nslots at a time,
 * setting each one's state.  `tick` is called at least every 100 ms; when
 * it returns false, the requests in flight are aborted (failed, retryable)
 * and no more are started.  Returns true when the endpoint was unreachable.
 * Commands left CMD_TODO were not attempted.
 */
bool
sink_deliver_batch(Sink *sink, RelayBatch *batch, SinkTick tick, void *arg)
{
	int			next = 0;
	int			active = 0;
	bool		unavailable = false;
	bool		stop = false;
	int			i;

	for (;;)
	{
		CURLMsg    *msg;
		int			queued;
		int			running;

		/* fill the free slots */
		while (!unavailable && !stop && active < sink->nslots && next < batch->n)
		{
			RelayCommand *cmd = &batch->cmds[next];
			HttpSlot   *slot = NULL;

			if (cmd->state != CMD_TODO)
			{
				next++;
				continue;
			}
			if (!header_safe(cmd->command_id))
			{
				set_error(cmd, "command_id contains characters that cannot be sent in an Idempotency-Key header");
				set_outcome(cmd, SINK_FATAL);
				next++;
				continue;
			}
			for (i = 0; i < sink->nslots; i++)
				if (sink->slots[i].cmd < 0)
				{
					slot = &sink->slots[i];
					break;
				}
			http_start(sink, slot, cmd, next);
			next++;
			active++;
		}
		if (active == 0)
			break;

		curl_multi_perform(sink->multi, &running);
		while ((msg = curl_multi_info_read(sink->multi, &queued)) != NULL)
		{
			HttpSlot   *slot = NULL;
			RelayCommand *cmd;
			SinkResult	r;

			if (msg->msg != CURLMSG_DONE)
				continue;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **) &slot);
			cmd = &batch->cmds[slot->cmd];
			r = http_result(sink, slot, msg->data.result, cmd);
			http_release(sink, slot);
			active--;
			if (r == SINK_UNAVAILABLE)
			{
				unavailable = true;
				r = SINK_RETRY;
			}
			set_outcome(cmd, r);
		}
		if (active == 0)
			continue;

		if (!stop && tick != NULL && !tick(arg))
		{
			/* interrupted: abort what is in flight */
			stop = true;
			for (i = 0; i < sink->nslots; i++)
			{
				HttpSlot   *slot = &sink->slots[i];
				RelayCommand *cmd;

				if (slot->cmd < 0)
					continue;
				cmd = &batch->cmds[slot->cmd];
				http_release(sink, slot);
				active--;
				set_error(cmd, "delivery interrupted: the relay was stopped");
				set_outcome(cmd, SINK_RETRY);
			}
			continue;
		}
		curl_multi_poll(sink->multi, NULL, 0, 100, NULL);
	}
	return unavailable;
}

/* Write one command as an NDJSON line (buffered until sink_flush). */
SinkResult
sink_deliver(Sink *sink, RelayCommand *cmd)
{
	sb_reset(&sink->body);
	relay_command_json(&sink->body, cmd);
	sb_append(&sink->body, "\n", 1);
	if (fwrite(sink->body.data, 1, sink->body.len, sink->fp) != sink->body.len)
	{
		char		msg[256];

		snprintf(msg, sizeof(msg), "could not write to %s: %s", sink->spec, strerror(errno));
		set_error(cmd, msg);
		return SINK_RETRY;
	}
	return SINK_OK;
}

/*
 * Push what the NDJSON sinks buffered out of the process (and to disk for
 * a file).  False, with *errmsg, when the output is broken.
 */
bool
sink_flush(Sink *sink, char **errmsg)
{
	static char msg[512];

	if (sink->type == SINK_HTTP)
		return true;
	if (fflush(sink->fp) != 0 || ferror(sink->fp))
	{
		snprintf(msg, sizeof(msg), "could not write to %s: %s", sink->spec, strerror(errno));
		*errmsg = msg;
		return false;
	}
	/* pipes and terminals cannot be synced; that is not an error */
	if (sink->type == SINK_FILE && fdatasync(fileno(sink->fp)) != 0 &&
		errno != EINVAL && errno != EROFS)
	{
		snprintf(msg, sizeof(msg), "could not sync %s: %s", sink->spec, strerror(errno));
		*errmsg = msg;
		return false;
	}
	return true;
}

/* Reopen a file sink (after SIGHUP, e.g. for log rotation). */
bool
sink_reopen(Sink *sink, char **errmsg)
{
	if (sink->type != SINK_FILE)
		return true;
	if (!sink_flush(sink, errmsg))
		return false;
	fclose(sink->fp);
	return sink_open_file(sink, errmsg);
}

/* Close the sink. */
void
sink_close(Sink *sink)
{
	if (sink == NULL)
		return;
	if (sink->type == SINK_FILE && sink->fp != NULL)
		fclose(sink->fp);
	else if (sink->type == SINK_STDOUT)
		fflush(stdout);
	if (sink->type == SINK_HTTP)
	{
		int			i;

		for (i = 0; i < sink->nslots; i++)
		{
			if (sink->slots[i].easy == NULL)
				continue;
			if (sink->slots[i].cmd >= 0)
				http_release(sink, &sink->slots[i]);
			curl_easy_cleanup(sink->slots[i].easy);
			sb_free(&sink->slots[i].body);
		}
		free(sink->slots);
		if (sink->multi != NULL)
			curl_multi_cleanup(sink->multi);
	}
	sb_free(&sink->body);
	free(sink->path);
	free(sink->spec);
	free(sink);
}
