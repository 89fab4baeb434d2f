/*-------------------------------------------------------------------------
 *
 * sink_http.c
 *		The HTTP(S) sink: one POST per command (libcurl's multi interface).
 *
 * The body is the command's JSON object, with an Idempotency-Key header
 * holding the command_id; up to --concurrency requests of a batch are in
 * flight at once (default 1: one at a time, in claim order), over reused
 * keep-alive connections.  The producer's headers (commit_decision's
 * headers) are sent as request headers under their own names, except those
 * the relay sets itself (Content-Type, Idempotency-Key, Expect, and every
 * --header), which keep the relay's value, and the framing and hop-by-hop
 * fields (Host, Content-Length, Connection, ...: sink_header_reserved),
 * which the server already refuses.  Outcomes:
 *	 2xx							delivered;
 *	 401, 403, 404, 407				the endpoint refuses the relay (credentials,
 *									rights, a wrong URL): unavailable;
 *	 no connection, no name			unavailable;
 *	 408, 429, 5xx, 3xx, a timeout	retryable (redirects are not followed);
 *	 any other 4xx					fatal: the endpoint refuses the command.
 * Once the endpoint is found unavailable no further request of the batch
 * is started, and the deliver call reports SINK_UNAVAILABLE: the relay
 * holds the rest of the batch and tries again after a backoff.  Between
 * two polls of the transfers (at most 100 ms apart) the sink calls tick,
 * which renews the leases of a slow batch and lets a second SIGTERM
 * interrupt the requests in flight.
 *
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "sink.h"

/* One request slot of the multi handle. */
typedef struct HttpSlot
{
	CURL	   *easy;
	struct curl_slist *headers;
	PQExpBufferData body;
	char		errbuf[CURL_ERROR_SIZE];
	char		resp[256];
	size_t		resp_len;
	int			cmd;			/* index in the batch; -1 when free */
} HttpSlot;

typedef struct HttpSink
{
	Sink		base;
	char	   *url;
	CURLM	   *multi;
	HttpSlot   *slots;
	int			nslots;
} HttpSink;

static const char *const http_schemes[] = {"http", "https", NULL};

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

/* What every curl handle of the sink starts with: the URL, HTTP(S) only, no signals. */
static void
http_easy_target(HttpSink *sink, CURL *c)
{
	curl_easy_setopt(c, CURLOPT_URL, sink->url);
#if LIBCURL_VERSION_NUM >= 0x075500
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
#else
	curl_easy_setopt(c, CURLOPT_PROTOCOLS, CURLPROTO_HTTP | CURLPROTO_HTTPS);
#endif
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
}

/* Create the easy handle of one slot, with the options every request shares. */
static bool
http_slot_init(HttpSink *sink, HttpSlot *slot)
{
	CURL	   *c = curl_easy_init();

	if (c == NULL)
		return false;
	slot->easy = c;
	slot->cmd = -1;
	initPQExpBuffer(&slot->body);
	http_easy_target(sink, c);
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

/* Free the slots and the multi handle. */
static void
http_free(HttpSink *s)
{
	int			i;

	for (i = 0; i < s->nslots; i++)
	{
		if (s->slots[i].easy == NULL)
			continue;
		if (s->slots[i].cmd >= 0)
			curl_multi_remove_handle(s->multi, s->slots[i].easy);
		curl_slist_free_all(s->slots[i].headers);
		curl_easy_cleanup(s->slots[i].easy);
		termPQExpBuffer(&s->slots[i].body);
	}
	free(s->slots);
	if (s->multi != NULL)
		curl_multi_cleanup(s->multi);
	free(s->url);
	free(s);
}

/*
 * Open an http:// or https:// URL.  libcurl's URL parser checks it: a URL
 * without a host, or with a malformed one ("http://[::1"), is a
 * configuration error.
 */
static SinkOpenResult
http_open(const char *url, Sink **sink, char **err)
{
	HttpSink   *s;
	CURLU	   *cu = curl_url();
	CURLUcode	uc;
	char	   *host = NULL;
	int			i;

	if (cu == NULL)
	{
		*err = sink_errorf("could not initialize libcurl");
		return SINK_OPEN_FAILED;
	}
	uc = curl_url_set(cu, CURLUPART_URL, url, 0);
	if (uc == CURLUE_OK)
		uc = curl_url_get(cu, CURLUPART_HOST, &host, 0);
	if (uc == CURLUE_OK && (host == NULL || host[0] == '\0'))
		uc = CURLUE_NO_HOST;
	curl_free(host);
	curl_url_cleanup(cu);
	if (uc != CURLUE_OK)
	{
		*err = sink_errorf("invalid sink URL: %s", curl_url_strerror(uc));
		return SINK_OPEN_CONFIG;
	}

	s = relay_malloc(sizeof(HttpSink));
	memset(s, 0, sizeof(HttpSink));
	s->url = relay_strdup(url);
	s->multi = curl_multi_init();
	s->nslots = relay_opts.concurrency > 0 ? relay_opts.concurrency : 1;
	s->slots = relay_malloc(sizeof(HttpSlot) * s->nslots);
	memset(s->slots, 0, sizeof(HttpSlot) * s->nslots);
	for (i = 0; s->multi != NULL && i < s->nslots; i++)
		if (!http_slot_init(s, &s->slots[i]))
			break;
	if (s->multi == NULL || i < s->nslots)
	{
		http_free(s);
		*err = sink_errorf("could not initialize libcurl");
		return SINK_OPEN_FAILED;
	}
	*sink = &s->base;
	return SINK_OPEN_OK;
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

/* Whether the relay sets header name itself (it keeps its own value). */
static bool
http_own_header(const char *name)
{
	size_t		len = strlen(name);
	int			i;

	if (strcasecmp(name, "content-type") == 0 ||
		strcasecmp(name, "idempotency-key") == 0 ||
		strcasecmp(name, "expect") == 0)
		return true;
	for (i = 0; i < relay_opts.nheaders; i++)
		if (strncasecmp(relay_opts.headers[i], name, len) == 0 &&
			(relay_opts.headers[i][len] == ':' || relay_opts.headers[i][len] == ';'))
			return true;
	return false;
}

/* Start the POST of one command in a free slot. */
static void
http_start(HttpSink *sink, HttpSlot *slot, RelayCommand *cmd, int index)
{
	PQExpBufferData key;
	int			i;

	resetPQExpBuffer(&slot->body);
	sink_command_json(&slot->body, cmd);

	initPQExpBuffer(&key);
	appendPQExpBuffer(&key, "Idempotency-Key: %s", cmd->command_id);
	slot->headers = curl_slist_append(NULL, "Content-Type: application/json");
	slot->headers = curl_slist_append(slot->headers, "Expect:");
	for (i = 0; i < relay_opts.nheaders; i++)
		slot->headers = curl_slist_append(slot->headers, relay_opts.headers[i]);
	slot->headers = curl_slist_append(slot->headers, key.data);
	for (i = 0; i < cmd->nheaders; i++)
	{
		const RelayHeader *h = &cmd->headers[i];

		if (sink_header_reserved(h->name) || http_own_header(h->name))
			continue;
		resetPQExpBuffer(&key);
		/* "Name;" is how libcurl sends a header with an empty value */
		if (h->value[0] == '\0')
			appendPQExpBuffer(&key, "%s;", h->name);
		else
			appendPQExpBuffer(&key, "%s: %s", h->name, h->value);
		slot->headers = curl_slist_append(slot->headers, key.data);
		if (slot->headers == NULL)
			break;
	}
	if (slot->headers == NULL || PQExpBufferDataBroken(key) ||
		PQExpBufferDataBroken(slot->body))
	{
		relay_log("out of memory");
		exit(RELAY_EXIT_RUNTIME);
	}
	termPQExpBuffer(&key);

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
http_release(HttpSink *sink, HttpSlot *slot)
{
	curl_multi_remove_handle(sink->multi, slot->easy);
	curl_easy_setopt(slot->easy, CURLOPT_HTTPHEADER, NULL);
	curl_slist_free_all(slot->headers);
	slot->headers = NULL;
	slot->cmd = -1;
}

/* Sort out a finished request; *msg gets the error text. */
static SinkResult
http_result(HttpSink *sink, HttpSlot *slot, CURLcode rc, char *msg, size_t msglen)
{
	long		status = 0;

	if (rc == CURLE_OK)
	{
		curl_easy_getinfo(slot->easy, CURLINFO_RESPONSE_CODE, &status);
		if (status >= 200 && status < 300)
			return SINK_OK;
		snprintf(msg, msglen, "HTTP %ld from %s%s%s", status, sink->base.shown,
				 slot->resp_len > 0 ? ": " : "", slot->resp);
		if (status == 401 || status == 403 || status == 404 || status == 407)
			return SINK_UNAVAILABLE;
		if (status >= 400 && status < 500 && status != 408 && status != 429)
			return SINK_FATAL;
		return SINK_RETRY;
	}

	snprintf(msg, msglen, "%s: %s", curl_easy_strerror(rc),
			 slot->errbuf[0] ? slot->errbuf : sink->base.shown);
	switch (rc)
	{
		case CURLE_COULDNT_CONNECT:
		case CURLE_COULDNT_RESOLVE_HOST:
		case CURLE_COULDNT_RESOLVE_PROXY:
		case CURLE_SSL_CONNECT_ERROR:
		case CURLE_PEER_FAILED_VERIFICATION:
		case CURLE_LOGIN_DENIED:
			return SINK_UNAVAILABLE;
		default:
			return SINK_RETRY;
	}
}

/*
 * Deliver the batch's CMD_TODO commands, up to nslots at a time (sink.h).
 */
static SinkResult
http_deliver(Sink *base, RelayBatch *batch, SinkTick tick, void *arg)
{
	HttpSink   *sink = (HttpSink *) base;
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
				sink_outcome(cmd, SINK_FATAL,
							 "command_id contains characters that cannot be sent in an Idempotency-Key header");
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
			char		text[1200];

			if (msg->msg != CURLMSG_DONE)
				continue;
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **) &slot);
			cmd = &batch->cmds[slot->cmd];
			text[0] = '\0';
			r = http_result(sink, slot, msg->data.result, text, sizeof(text));
			http_release(sink, slot);
			active--;
			if (r == SINK_UNAVAILABLE)
				unavailable = true;
			sink_outcome(cmd, r, text);
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

				if (slot->cmd < 0)
					continue;
				sink_outcome(&batch->cmds[slot->cmd], SINK_RETRY,
							 "delivery interrupted: the relay was stopped");
				http_release(sink, slot);
				active--;
			}
			continue;
		}
		curl_multi_poll(sink->multi, NULL, 0, 100, NULL);
	}
	return unavailable ? SINK_UNAVAILABLE : SINK_OK;
}

/*
 * The idle probe: a connection to the endpoint's host and port, with the
 * TLS handshake for https (CURLOPT_CONNECT_ONLY), bounded by
 * --connect-timeout, then closed.  No request is sent: any request could
 * have effects at the endpoint, so a refusal only a request would show
 * (401, 403, 404) is not seen before the next delivery.
 */
static SinkResult
http_probe(Sink *base, char **err)
{
	HttpSink   *sink = (HttpSink *) base;
	CURL	   *c = curl_easy_init();
	char		errbuf[CURL_ERROR_SIZE];
	CURLcode	rc;

	if (c == NULL)
	{
		*err = sink_errorf("could not allocate a curl handle");
		return SINK_RETRY;
	}
	errbuf[0] = '\0';
	http_easy_target(sink, c);
	curl_easy_setopt(c, CURLOPT_CONNECT_ONLY, 1L);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long) (relay_opts.connect_timeout * 1000));
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
	rc = curl_easy_perform(c);
	curl_easy_cleanup(c);
	if (rc == CURLE_OK)
		return SINK_OK;
	*err = sink_errorf("%s: %s", curl_easy_strerror(rc), errbuf[0] ? errbuf : base->shown);
	switch (rc)
	{
		case CURLE_COULDNT_CONNECT:
		case CURLE_COULDNT_RESOLVE_HOST:
		case CURLE_COULDNT_RESOLVE_PROXY:
		case CURLE_SSL_CONNECT_ERROR:
		case CURLE_PEER_FAILED_VERIFICATION:
		case CURLE_OPERATION_TIMEDOUT:
			return SINK_UNAVAILABLE;
		default:
			return SINK_RETRY;
	}
}

/* Close and free. */
static void
http_close(Sink *sink)
{
	http_free((HttpSink *) sink);
}

const SinkOps sink_http_ops = {
	.name = "http",
	.schemes = http_schemes,
	.usage =
	"  http(s)://URL       POST of that object, header Idempotency-Key: <command_id>;\n"
	"                      2xx acks; 408, 429, 5xx, timeouts retry with backoff;\n"
	"                      401, 403, 404, 407 and no connection hold the batch and\n"
	"                      pause claiming; any other 4xx is fatal (the command is dead)\n",
	.open = http_open,
	.deliver = http_deliver,
	.probe = http_probe,
	.close = http_close,
};
