/*-------------------------------------------------------------------------
 *
 * sink_stdout.c
 *		The stdout sink: one JSON object per command and line (NDJSON) on
 *		standard output.
 *
 * Lines are buffered and flushed by confirm, before the batch is acked: a
 * line counts as delivered once it is out of the process.  If stdout is
 * broken, confirm fails and the relay gives the batch back and exits 1.
 *
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sink.h"

typedef struct StdoutSink
{
	Sink		base;
} StdoutSink;

static const char *const stdout_schemes[] = {"stdout", NULL};

/* Open: stdout, fully buffered. */
static SinkOpenResult
stdout_open(const char *url, Sink **sink, char **err)
{
	StdoutSink *s = relay_malloc(sizeof(StdoutSink));

	(void) url;
	(void) err;
	memset(s, 0, sizeof(StdoutSink));
	setvbuf(stdout, NULL, _IOFBF, 1 << 16);
	*sink = &s->base;
	return SINK_OPEN_OK;
}

/* Write the batch's lines. */
static SinkResult
stdout_deliver(Sink *sink, RelayBatch *batch, SinkTick tick, void *arg)
{
	(void) sink;
	return sink_ndjson_deliver(stdout, "stdout", batch, tick, arg);
}

/* Flush them out of the process. */
static bool
stdout_confirm(Sink *sink, char **err)
{
	(void) sink;
	return sink_ndjson_flush(stdout, "stdout", false, err);
}

/* Flush and free. */
static void
stdout_close(Sink *sink)
{
	fflush(stdout);
	free(sink);
}

const SinkOps sink_stdout_ops = {
	.name = "stdout",
	.schemes = stdout_schemes,
	.usage =
	"  stdout              one JSON object per line (NDJSON):\n"
	"                      {\"command_id\",\"run_id\",\"seq\",\"kind\",\"payload\",\"deliveries\"\n"
	"                      [,\"headers\"]}\n",
	.open = stdout_open,
	.deliver = stdout_deliver,
	.confirm = stdout_confirm,
	.close = stdout_close,
};
