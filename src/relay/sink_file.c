/*-------------------------------------------------------------------------
 *
 * sink_file.c
 *		The file sink (file:PATH): NDJSON lines appended to a file.
 *
 * Lines are buffered, then flushed and fdatasync'ed by confirm before the
 * batch is acked.  If that fails (a full disk), the batch is given back as
 * retryable and the relay exits 1.  SIGHUP reopens the file (rotation).
 *
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sink.h"

typedef struct FileSink
{
	Sink		base;
	char	   *path;
	FILE	   *fp;
} FileSink;

static const char *const file_schemes[] = {"file", NULL};

/* Open (or reopen) the file, for appending. */
static bool
file_open_path(FileSink *s, char **err)
{
	s->fp = fopen(s->path, "a");
	if (s->fp == NULL)
	{
		*err = sink_errorf("could not open file \"%s\": %s", s->path, strerror(errno));
		return false;
	}
	setvbuf(s->fp, NULL, _IOFBF, 1 << 16);
	return true;
}

/* Open file:PATH; an empty path is a configuration error. */
static SinkOpenResult
file_open(const char *url, Sink **sink, char **err)
{
	FileSink   *s;

	if (url[5] == '\0')
	{
		*err = sink_errorf("invalid sink \"%s\": file:PATH needs a path", url);
		return SINK_OPEN_CONFIG;
	}
	s = relay_malloc(sizeof(FileSink));
	memset(s, 0, sizeof(FileSink));
	s->path = relay_strdup(url + 5);
	if (!file_open_path(s, err))
	{
		free(s->path);
		free(s);
		return SINK_OPEN_FAILED;
	}
	*sink = &s->base;
	return SINK_OPEN_OK;
}

/* Write the batch's lines. */
static SinkResult
file_deliver(Sink *sink, RelayBatch *batch, SinkTick tick, void *arg)
{
	FileSink   *s = (FileSink *) sink;

	return sink_ndjson_deliver(s->fp, sink->url, batch, tick, arg);
}

/* Flush and sync them. */
static bool
file_confirm(Sink *sink, char **err)
{
	FileSink   *s = (FileSink *) sink;

	return sink_ndjson_flush(s->fp, sink->url, true, err);
}

/* SIGHUP: flush, close and open the path again. */
static bool
file_reopen(Sink *sink, char **err)
{
	FileSink   *s = (FileSink *) sink;

	if (!file_confirm(sink, err))
		return false;
	fclose(s->fp);
	s->fp = NULL;
	return file_open_path(s, err);
}

/* Close and free. */
static void
file_close(Sink *sink)
{
	FileSink   *s = (FileSink *) sink;

	if (s->fp != NULL)
		fclose(s->fp);
	free(s->path);
	free(s);
}

const SinkOps sink_file_ops = {
	.name = "file",
	.schemes = file_schemes,
	.usage =
	"  file:PATH           the same lines appended to PATH (fdatasync'ed before\n"
	"                      the ack; SIGHUP reopens it)\n",
	.open = file_open,
	.deliver = file_deliver,
	.confirm = file_confirm,
	.reopen = file_reopen,
	.close = file_close,
};
