/*-------------------------------------------------------------------------
 *
 * kafka_mock.c
 *		A Kafka cluster for the tests: librdkafka's mock cluster, reachable
 *		over TCP on the loopback by kcat and by outbox-relay.
 *
 *		kafka-mock TOPIC PARTITIONS
 *
 * prints "bootstrap HOST:PORT[,...]" on stdout and serves until its
 * standard input ends (or it is killed).  Each line of standard input is
 * a command, answered by "ok N" (N: the line's number) on stdout:
 *		down					all brokers drop their connections and refuse new ones
 *		up						they accept connections again
 *		rtt MS					they answer every request MS milliseconds late
 *		error API CODE COUNT	the next COUNT requests of Kafka API key API
 *								(0: Produce) fail with error CODE
 * The mock's brokers keep what was produced while they are down.
 *
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

int
main(int argc, char **argv)
{
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	rd_kafka_mock_cluster_t *mc;
	char		errstr[512];
	char		line[256];
	int			lineno = 0;

	if (argc != 3)
	{
		fprintf(stderr, "usage: kafka-mock TOPIC PARTITIONS\n");
		return 2;
	}
	conf = rd_kafka_conf_new();
	rd_kafka_conf_set(conf, "log_level", "3", errstr, sizeof(errstr));
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
	{
		fprintf(stderr, "kafka-mock: %s\n", errstr);
		return 1;
	}
	mc = rd_kafka_mock_cluster_new(rk, 1);
	if (mc == NULL)
	{
		fprintf(stderr, "kafka-mock: could not create the mock cluster\n");
		return 1;
	}
	if (rd_kafka_mock_topic_create(mc, argv[1], atoi(argv[2]), 1) != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		fprintf(stderr, "kafka-mock: could not create topic %s\n", argv[1]);
		return 1;
	}
	printf("bootstrap %s\n", rd_kafka_mock_cluster_bootstraps(mc));
	fflush(stdout);

	while (fgets(line, sizeof(line), stdin) != NULL)
	{
		int			api;
		int			code;
		int			count;
		int			ms;

		lineno++;
		if (strncmp(line, "down", 4) == 0)
			rd_kafka_mock_broker_set_down(mc, -1);
		else if (strncmp(line, "up", 2) == 0)
			rd_kafka_mock_broker_set_up(mc, -1);
		else if (sscanf(line, "rtt %d", &ms) == 1 && ms >= 0)
			rd_kafka_mock_broker_set_rtt(mc, -1, ms);
		else if (sscanf(line, "error %d %d %d", &api, &code, &count) == 3 && count > 0)
		{
			rd_kafka_resp_err_t *errs = calloc(count, sizeof(rd_kafka_resp_err_t));
			int			i;

			for (i = 0; i < count; i++)
				errs[i] = (rd_kafka_resp_err_t) code;
			rd_kafka_mock_push_request_errors_array(mc, (int16_t) api, count, errs);
			free(errs);
		}
		else
		{
			fprintf(stderr, "kafka-mock: unknown command: %s", line);
			continue;
		}
		printf("ok %d\n", lineno);
		fflush(stdout);
	}
	rd_kafka_mock_cluster_destroy(mc);
	rd_kafka_destroy(rk);
	return 0;
}
