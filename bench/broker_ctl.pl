# One message broker for bench/brokers.sh, started on 127.0.0.1 on free
# ports, with its data under DIR, and stopped by pid when standard input
# ends (or on any error: the END blocks of OutboxBrokerServer and of this
# file stop what is still running).
#
#   perl -I test/perl bench/broker_ctl.pl KIND DIR BASELINE_BINARY
#
# KIND: kafka (test/kafka-mock, topic "bench", 4 partitions; KAFKA_RTT=MS
# makes its brokers answer every request MS milliseconds late), redis
# (redis-server, appendfsync always), rabbitmq (exchange "bench" bound to
# queue "bench" by "cmd"), nats (nats-server -js, stream "bench" over
# "bench.>"), mosquitto.  Prints one line "ready ADDRESS" (host:port, the
# Kafka bootstrap list), then answers each command of standard input with
# one line "ok ..." (or dies):
#   reset            empty what the last cell left: Redis DEL, RabbitMQ
#                    purge, NATS stream deleted and created again (its
#                    duplicate window forgotten)
#   listen FILE      start a consumer that writes "command_id<TAB>epoch" to
#                    FILE for each message as it arrives (kafka: kcat;
#                    rabbitmq: broker-baseline listen-amqp; mosquitto:
#                    mosquitto_sub); the epoch is taken when the line is read
#   unlisten         stop it: "ok N" (messages seen)
#   stamps FILE      write "command_id<TAB>epoch" from the broker's own
#                    record of each message (redis: the entry ID's
#                    milliseconds; nats: the stored message's time)
use strict;
use warnings;
# PostgreSQL::Test::Utils (which OutboxBrokerServer loads) sends STDOUT and
# STDERR to a log under $TESTDIR/tmp_check: keep the real ones.
my ($OUT, $ERR);
BEGIN
{
	open($OUT, '>&', \*STDOUT) or die "dup: $!";
	open($ERR, '>&', \*STDERR) or die "dup: $!";
	if (defined $ARGV[1])
	{
		mkdir $ARGV[1];
		$ENV{TESTDIR} = $ARGV[1];
	}
}
use FindBin;
use lib "$FindBin::Bin/../test/perl";
use IO::Handle;
use POSIX qw(WNOHANG);
use POSIX ();
use Time::HiRes qw(time usleep);
use MIME::Base64 qw(decode_base64);
use Time::Local qw(timegm);
use OutboxBrokerServer;

my ($kind, $dir, $baseline) = @ARGV;
die "usage: broker_ctl.pl KIND DIR BASELINE\n" unless defined $baseline;
mkdir $dir unless -d $dir;
open(STDOUT, '>&', $OUT) or die "dup: $!";
open(STDERR, '>&', $ERR) or die "dup: $!";
$| = 1;

my ($broker, @pids, $addr, $kafka_in, $listener);

END
{
	local $?;
	stop_listener();
	for my $pid (@pids)
	{
		kill 'TERM', $pid;
		for (1 .. 100) { last if waitpid($pid, WNOHANG) == $pid; usleep(100_000); }
		kill 'KILL', $pid;
		waitpid($pid, 0);
	}
	$broker->stop if $broker && $broker->running;
}
$SIG{TERM} = $SIG{INT} = sub { exit 1; };

sub wait_port
{
	my ($port) = @_;
	for (1 .. 300)
	{
		return if OutboxBrokerServer::port_open($port);
		usleep(100_000);
	}
	die "port $port never opened\n";
}

if ($kind eq 'kafka')
{
	my $pid = open($kafka_in, '|-') // die "fork: $!";
	if ($pid == 0)
	{
		# its stdout is not ours: the bootstrap list is read from the file
		open(STDOUT, '>', "$dir/kafka.out") or die "open: $!";
		open(STDERR, '>', "$dir/kafka.err") or die "open: $!";
		exec("$FindBin::Bin/../test/kafka-mock", 'bench', '4') or die "exec kafka-mock: $!";
	}
	push @pids, $pid;
	$kafka_in->autoflush(1);
}
elsif ($kind eq 'redis')
{
	my $port = OutboxBrokerServer::free_port();
	my $pid = fork() // die "fork: $!";
	if ($pid == 0)
	{
		open(STDOUT, '>>', "$dir/redis.out");
		open(STDERR, '>&', \*STDOUT);
		exec('redis-server', '--port', $port, '--bind', '127.0.0.1', '--protected-mode', 'yes',
			'--dir', $dir, '--appendonly', 'yes', '--appendfsync', 'always', '--save', '',
			'--logfile', "$dir/redis.log") or die "exec redis-server: $!";
	}
	push @pids, $pid;
	wait_port($port);
	$addr = "127.0.0.1:$port";
}
else
{
	$broker = OutboxBrokerServer->new($kind, $dir);
	$broker->start;
	$addr = '127.0.0.1:' . $broker->port;
	if ($kind eq 'rabbitmq')
	{
		$broker->rabbit_declare([ [ 'bench', 'direct' ] ], [ ['bench'] ],
			[ [ 'bench', 'bench', 'cmd' ] ]);
	}
	elsif ($kind eq 'nats')
	{
		$broker->js_stream_create('bench', ['bench.>']);
	}
}

if ($kind eq 'kafka')
{
	# the mock's first line
	my $line;
	for (1 .. 300)
	{
		if (open(my $fh, '<', "$dir/kafka.out"))
		{
			$line = <$fh>;
			close($fh);
			last if defined $line && $line =~ /^bootstrap /;
		}
		usleep(100_000);
	}
	die "kafka-mock printed no bootstrap list\n" unless defined $line && $line =~ /^bootstrap (\S+)/;
	$addr = $1;
	# KAFKA_RTT=MS: the brokers answer every request MS late (a broker
	# across a network)
	print $kafka_in "rtt $ENV{KAFKA_RTT}\n" if ($ENV{KAFKA_RTT} // '') =~ /^[1-9]\d*$/;
}
print "ready $addr\n";

sub redis_cli
{
	my ($h, $p) = split /:/, $addr;
	my @cmd = ('redis-cli', '-h', $h, '-p', $p, '--raw', @_);
	my $out = `@cmd`;
	die "redis-cli @_ failed\n" if $? != 0;
	return $out;
}

sub stop_listener
{
	return 0 unless $listener;
	my ($pid, $file) = @$listener;
	kill 'TERM', -$pid;
	waitpid($pid, 0);
	$listener = undef;
	open(my $fh, '<', $file) or return 0;
	my $n = 0;
	$n++ while <$fh>;
	close($fh);
	return $n;
}

# A child (its own process group) that runs @cmd and stamps every
# command_id its output shows.
sub start_listener
{
	my ($file, @cmd) = @_;
	my $pid = fork() // die "fork: $!";
	if ($pid == 0)
	{
		# not this file's END block: the broker is the parent's to stop
		$SIG{TERM} = 'DEFAULT';
		setpgrp(0, 0);
		open(my $out, '>', $file) or die "open $file: $!";
		$out->autoflush(1);
		open(STDERR, '>>', "$dir/listener.err");
		open(my $in, '-|', @cmd) or die "@cmd: $!";
		my $buf = '';
		while (sysread($in, $buf, 65536, length($buf)))
		{
			my $t = time();
			while ($buf =~ s/^.*?"command_id":"([^"]+)"//s)
			{
				printf $out "%s\t%.6f\n", $1, $t;
			}
		}
		POSIX::_exit(0);
	}
	$listener = [ $pid, $file ];
	usleep(500_000);	# let it subscribe
}

while (my $line = <STDIN>)
{
	chomp $line;
	my ($cmd, $arg) = split / /, $line, 2;
	if ($cmd eq 'reset')
	{
		if ($kind eq 'redis') { redis_cli('DEL', 'bench'); }
		elsif ($kind eq 'rabbitmq')
		{
			my ($rc, $out) = $broker->ctl('purge_queue', 'bench');
			die "purge_queue: $out" if $rc != 0;
		}
		elsif ($kind eq 'nats')
		{
			$broker->js_stream_delete('bench');
			$broker->js_stream_create('bench', ['bench.>']);
		}
		print "ok\n";
	}
	elsif ($cmd eq 'listen')
	{
		my ($h, $p) = split /:/, $addr;
		if ($kind eq 'kafka')
		{
			start_listener($arg, 'kcat', '-C', '-q', '-u', '-b', $addr, '-t', 'bench', '-o', 'end', '-X', 'fetch.wait.max.ms=5',
				'-f', "%s\n");
		}
		elsif ($kind eq 'rabbitmq')
		{
			start_listener($arg, $baseline, 'listen-amqp', $h, $p, 'bench');
		}
		elsif ($kind eq 'mosquitto')
		{
			start_listener($arg, 'mosquitto_sub', '-h', $h, '-p', $p, '-V', '5', '-q', '1',
				'-t', 'bench', '-F', "%p\n");
		}
		else { die "listen: not for $kind\n"; }
		print "ok\n";
	}
	elsif ($cmd eq 'unlisten')
	{
		print "ok ", stop_listener(), "\n";
	}
	elsif ($cmd eq 'stamps')
	{
		open(my $out, '>', $arg) or die "open $arg: $!";
		my $n = 0;
		if ($kind eq 'redis')
		{
			# XRANGE --raw: id, then the field/value lines of the entry
			my @l = split /\n/, redis_cli('XRANGE', 'bench', '-', '+');
			my $id;
			for (my $i = 0; $i < @l; $i++)
			{
				if ($l[$i] =~ /^(\d+)-\d+$/ && ($i + 1 < @l) && $l[ $i + 1 ] eq 'command_id')
				{
					printf $out "%s\t%.3f\n", $l[ $i + 2 ], $1 / 1000;
					$n++;
					$i += 2;
				}
			}
		}
		elsif ($kind eq 'nats')
		{
			my $state = $broker->js_stream_state('bench');
			for my $seq ($state->{first_seq} .. $state->{last_seq})
			{
				last if $state->{messages} == 0;
				my $r = $broker->js_request("\$JS.API.STREAM.MSG.GET.bench", { seq => $seq });
				next if $r->{error};
				my $m = $r->{message};
				my $data = decode_base64($m->{data} // '');
				next unless $data =~ /"command_id":"([^"]+)"/;
				my $id = $1;
				# 2026-12-01T13:20:00.123456789Z
				$m->{time} =~ /^(\d+)-(\d+)-(\d+)T(\d+):(\d+):(\d+)(\.\d+)?Z$/
				  or die "stream time $m->{time}\n";
				my $t = timegm($6, $5, $4, $3, $2 - 1, $1) + ($7 // 0);
				printf $out "%s\t%.6f\n", $id, $t;
				$n++;
			}
		}
		else { die "stamps: not for $kind\n"; }
		close($out);
		print "ok $n\n";
	}
	else
	{
		die "unknown command $line\n";
	}
}
exit 0;
