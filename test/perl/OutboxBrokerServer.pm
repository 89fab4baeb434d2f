# Message brokers for the TAP tests of outbox-relay's broker sinks:
# RabbitMQ, NATS (JetStream) and Mosquitto, each started as the test's own
# process on 127.0.0.1, on free ports of its own, with its data, logs and
# configuration under one directory of its own, and stopped by pid at the
# end (also when the test dies: an END block stops whatever is still
# running).  The system's services are never touched.
#
#   my $b = OutboxBrokerServer->new('rabbitmq', "$tmp/rabbit");   # or nats, mosquitto
#   $b->start;             # waits until the broker serves its port
#   $b->port; $b->url;     # where the relay connects
#   $b->stop;              # SIGTERM, then SIGKILL after the timeout
#   $b->kill9;             # SIGKILL: the broker dies mid-batch
#   $b->start;             # again, on the same ports and data
#
# Broker tools: RabbitMQ's rabbitmqctl ($b->ctl) and amqp-tools ($b->amqp),
# NATS's JetStream API ($b->js_request, a minimal client of the NATS
# protocol) and its monitoring endpoint ($b->monitor), mosquitto_sub.
package OutboxBrokerServer;

use strict;
use warnings;
use Carp;
use IO::Socket::INET;
use IO::Select;
use JSON::PP;
use MIME::Base64 qw(decode_base64);
use POSIX qw(WNOHANG);
use Time::HiRes qw(usleep time);
use HTTP::Tiny;
use IPC::Run;
use PostgreSQL::Test::Cluster;

my $timeout = $ENV{PG_TEST_TIMEOUT_DEFAULT} // 180;
my @running;

my $rabbit_lib = '/usr/lib/rabbitmq/bin';

# A program's path: on PATH or in the sbin directories (the servers are
# installed there, which an unprivileged user's PATH may lack).
sub _which
{
	my ($name) = @_;
	for my $d (split(/:/, $ENV{PATH} // ''), '/usr/sbin', '/sbin')
	{
		return "$d/$name" if $d ne '' && -x "$d/$name";
	}
	croak "$name not found (test/lib.sh installs its package)";
}

# A TCP port of 127.0.0.1 nobody uses now, above the kernel's ephemeral
# range (32768-60999 on Debian), so that no outgoing connection takes it
# before the broker binds it (or binds it again after a restart), and
# above the range of PostgreSQL::Test::Cluster's servers (10200-32767);
# not one this process handed out before.
my %handed_out;
sub free_port
{
	my $low = 61000;
	if (open(my $fh, '<', '/proc/sys/net/ipv4/ip_local_port_range'))
	{
		my (undef, $high) = split(' ', scalar(<$fh>) // '');
		$low = $high + 1 if defined $high && $high =~ /^\d+$/ && $high < 64535;
		close($fh);
	}
	for (1 .. 1000)
	{
		my $port = $low + int(rand(65535 - $low));
		next if $handed_out{$port};
		my $s = IO::Socket::INET->new(
			LocalAddr => '127.0.0.1',
			LocalPort => $port,
			Proto => 'tcp',
			Listen => 1,
			ReuseAddr => 0) or next;
		close($s);
		$handed_out{$port} = 1;
		return $port;
	}
	croak "no free port from $low on 127.0.0.1";
}

# True when something accepts connections on 127.0.0.1:$port.
sub port_open
{
	my ($port) = @_;
	my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
		Proto => 'tcp', Timeout => 1);
	return 0 unless $s;
	close($s);
	return 1;
}

# A broker of the given kind (rabbitmq, nats, mosquitto) under $dir.
# Mosquitto takes an optional acl => TEXT (its acl_file) and users =>
# { NAME => PASSWORD } (then no anonymous client is let in); NATS takes
# jetstream => 0 (a plain NATS server).
sub new
{
	my ($class, $kind, $dir, %opt) = @_;
	croak "unknown broker $kind" unless $kind =~ /^(rabbitmq|nats|mosquitto)$/;
	mkdir $dir or croak "mkdir $dir: $!" unless -d $dir;
	my $self = bless { kind => $kind, dir => $dir, pids => [],
		port => free_port() }, $class;
	if ($kind eq 'rabbitmq')
	{
		$self->{dist_port} = free_port();
		$self->{epmd_port} = free_port();
		$self->{node} = 'outbox' . $self->{port} . '@localhost';
		# an Erlang cookie of its own, in the HOME the Erlang tools use
		my $cookie = join('', map { ('A' .. 'Z')[ int(rand(26)) ] } 1 .. 20);
		_write("$dir/.erlang.cookie", $cookie);
		chmod 0400, "$dir/.erlang.cookie";
		_write("$dir/enabled_plugins", "[].\n");
		_write("$dir/rabbitmq.conf",
			"listeners.tcp.default = 127.0.0.1:$self->{port}\n"
			  . "loopback_users.guest = true\n"
			  . "log.file.level = info\n");
	}
	elsif ($kind eq 'nats')
	{
		$self->{monitor_port} = free_port();
		$self->{jetstream} = $opt{jetstream} // 1;
	}
	else
	{
		_write("$dir/mosquitto.conf", <<"EOF");
listener $self->{port} 127.0.0.1
allow_anonymous true
persistence true
persistence_location $dir/
autosave_interval 1
max_queued_messages 0
log_dest file $dir/mosquitto.log
log_type error
log_type warning
log_type notice
EOF
		if (defined $opt{acl})
		{
			_write("$dir/acl", $opt{acl});
			open(my $fh, '>>', "$dir/mosquitto.conf") or croak "open: $!";
			print $fh "acl_file $dir/acl\n";
			close($fh);
		}
		if ($opt{users})
		{
			_write("$dir/passwd", '');
			for my $u (sort keys %{ $opt{users} })
			{
				my ($rc, $out) = _run({}, _which('mosquitto_passwd'), '-b', "$dir/passwd",
					$u, $opt{users}{$u});
				croak "mosquitto_passwd: $out" if $rc != 0;
			}
			my $conf = slurp("$dir/mosquitto.conf");
			$conf =~ s/^allow_anonymous true$/allow_anonymous false\npassword_file $dir\/passwd/m;
			_write("$dir/mosquitto.conf", $conf);
		}
	}
	return $self;
}

sub _write
{
	my ($path, $text) = @_;
	open(my $fh, '>', $path) or croak "open $path: $!";
	print $fh $text;
	close($fh) or croak "close $path: $!";
}

sub kind { return $_[0]{kind}; }
sub port { return $_[0]{port}; }
sub dir { return $_[0]{dir}; }
sub monitor_port { return $_[0]{monitor_port}; }

# The base URL of the broker's sink (no path, no credentials).
sub url
{
	my ($self) = @_;
	my %scheme = (rabbitmq => 'amqp', nats => 'nats', mosquitto => 'mqtt');
	return "$scheme{$self->{kind}}://127.0.0.1:$self->{port}";
}

# The environment of RabbitMQ's server and tools.
sub _rabbit_env
{
	my ($self) = @_;
	my $d = $self->{dir};
	return (
		HOME => $d,
		RABBITMQ_NODENAME => $self->{node},
		RABBITMQ_NODE_IP_ADDRESS => '127.0.0.1',
		RABBITMQ_NODE_PORT => $self->{port},
		RABBITMQ_DIST_PORT => $self->{dist_port},
		ERL_EPMD_PORT => $self->{epmd_port},
		ERL_EPMD_ADDRESS => '127.0.0.1',
		RABBITMQ_MNESIA_BASE => "$d/mnesia",
		RABBITMQ_LOG_BASE => "$d/log",
		RABBITMQ_CONFIG_FILE => "$d/rabbitmq.conf",
		RABBITMQ_ADVANCED_CONFIG_FILE => "$d/advanced.config",
		RABBITMQ_CONF_ENV_FILE => "$d/rabbitmq-env.conf",
		RABBITMQ_ENABLED_PLUGINS_FILE => "$d/enabled_plugins",
		RABBITMQ_PLUGINS_EXPAND_DIR => "$d/plugins-expand",
		RABBITMQ_PID_FILE => "$d/rabbitmq.pid",
		RABBITMQ_LOGS => "$d/log/rabbit.log",
		RABBITMQ_SERVER_START_ARGS => '-kernel inet_dist_use_interface {127,0,0,1}',
		# exec the VM (no signal-forwarding shell in between)
		RUNNING_UNDER_SYSTEMD => 1,
	);
}

# Fork and exec @cmd with %env added, output appended to $log.
sub _spawn
{
	my ($env, $log, @cmd) = @_;
	my $pid = fork() // croak "fork: $!";
	if ($pid == 0)
	{
		setpgrp(0, 0);
		@ENV{ keys %$env } = values %$env;
		open(STDIN, '<', '/dev/null') or POSIX::_exit(127);
		open(STDOUT, '>>', $log) or POSIX::_exit(127);
		open(STDERR, '>&', \*STDOUT) or POSIX::_exit(127);
		exec(@cmd) or POSIX::_exit(127);
	}
	return $pid;
}

# Start the broker and wait until it accepts connections.
sub start
{
	my ($self) = @_;
	my $d = $self->{dir};
	croak "$self->{kind} already running" if @{ $self->{pids} };
	if ($self->{kind} eq 'rabbitmq')
	{
		my %env = $self->_rabbit_env;
		# its own epmd, in the foreground so that it is stopped by pid
		push @{ $self->{pids} },
		  _spawn(\%env, "$d/epmd.log", _which('epmd'), '-port', $self->{epmd_port},
			'-address', '127.0.0.1');
		$self->_wait_port($self->{epmd_port}, "$d/epmd.log");
		# rabbitmq-server execs erl, which execs beam: the pid is the node's
		# (SIGTERM stops it cleanly)
		push @{ $self->{pids} },
		  _spawn(\%env, "$d/server.log", "$rabbit_lib/rabbitmq-server");
	}
	elsif ($self->{kind} eq 'nats')
	{
		push @{ $self->{pids} },
		  _spawn({}, "$d/server.log", _which('nats-server'), '-a', '127.0.0.1',
			'-p', $self->{port}, '-m', $self->{monitor_port},
			($self->{jetstream} ? ('-js', '-sd', "$d/store") : ()),
			'-n', "outbox-test-$self->{port}");
	}
	else
	{
		push @{ $self->{pids} },
		  _spawn({}, "$d/server.log", _which('mosquitto'), '-c', "$d/mosquitto.conf");
	}
	push @running, $self unless grep { $_ == $self } @running;
	$self->_wait_port($self->{port}, "$d/server.log");
	if ($self->{kind} eq 'rabbitmq')
	{
		my ($rc, $out) = $self->ctl('await_startup');
		croak "rabbitmq did not start: $out" if $rc != 0;
	}
	return $self;
}

sub _wait_port
{
	my ($self, $port, $log) = @_;
	my $deadline = time() + $timeout;
	while (time() < $deadline)
	{
		return if port_open($port);
		for my $pid (@{ $self->{pids} })
		{
			if (waitpid($pid, WNOHANG) == $pid)
			{
				$self->{pids} = [ grep { $_ != $pid } @{ $self->{pids} } ];
				croak "$self->{kind} exited at start-up: " . _tail($log);
			}
		}
		usleep(100_000);
	}
	croak "$self->{kind} does not listen on port $port: " . _tail($log);
}

sub _tail
{
	my ($path) = @_;
	open(my $fh, '<', $path) or return "(no $path)";
	my @l = <$fh>;
	close($fh);
	return join('', @l > 20 ? @l[ -20 .. -1 ] : @l);
}

# Stop the broker's processes (the server before its epmd) with $sig,
# then SIGKILL what is still there after the timeout.
sub _stop
{
	my ($self, $sig) = @_;
	for my $pid (reverse @{ $self->{pids} })
	{
		kill $sig, $pid;
		my $deadline = time() + $timeout;
		while (waitpid($pid, WNOHANG) != $pid)
		{
			if (time() > $deadline)
			{
				kill 'KILL', $pid;
				waitpid($pid, 0);
				last;
			}
			usleep(50_000);
		}
	}
	$self->{pids} = [];
}

# Stop the broker cleanly (a frozen one too: it is woken up to stop).
sub stop
{
	my ($self) = @_;
	if (@{ $self->{pids} })
	{
		kill 'TERM', $self->{pids}[-1];
		kill 'CONT', -$self->{pids}[-1];
	}
	$self->_stop('TERM');
}

# Kill the broker at once (its epmd too, cleanly).
sub kill9
{
	my ($self) = @_;
	my @pids = @{ $self->{pids} };
	my $server = pop @pids;
	# the server's process group: its helper processes too
	kill 'KILL', -$server;
	waitpid($server, 0);
	$self->{pids} = \@pids;
	$self->_stop('TERM');
}

# Freeze the broker (SIGSTOP): connections stay open, nothing is answered;
# kill9 ends it from there.
sub freeze
{
	my ($self) = @_;
	kill 'STOP', -$self->{pids}[-1];
}

sub running { return scalar @{ $_[0]{pids} }; }

# Run a RabbitMQ tool (rabbitmqctl by default) against the node: (exit code, output).
sub ctl
{
	my ($self, @args) = @_;
	my $tool = 'rabbitmqctl';
	$tool = shift @args if @args && $args[0] =~ /^rabbitmq-/;
	return _run({ $self->_rabbit_env }, "$rabbit_lib/$tool", '-q', @args);
}

# Run an amqp-tools program (amqp-get, amqp-consume, ...) against the
# broker as guest: (exit code, output).
sub amqp
{
	my ($self, $tool, @args) = @_;
	return _run({}, $tool, '--url', "amqp://guest:guest\@127.0.0.1:$self->{port}", @args);
}

sub _run
{
	my ($env, @cmd) = @_;
	my $out = '';
	local @ENV{ keys %$env } = values %$env;
	IPC::Run::run(\@cmd, '<', \undef, '>', \$out, '2>&1',
		IPC::Run::timeout($timeout));
	return ($? >> 8, $out);
}

# Mosquitto: run mosquitto_sub against the broker with @args: (exit code, output).
sub mqtt_sub
{
	my ($self, @args) = @_;
	return _run({}, 'mosquitto_sub', '-h', '127.0.0.1', '-p', $self->{port}, '-V', '5', @args);
}

# RabbitMQ: declare durable exchanges, queues and bindings through
# rabbitmqctl import_definitions: ([exchange, type], ...), ([queue], ...),
# ([exchange, queue, routing key], ...).
sub rabbit_declare
{
	my ($self, $exchanges, $queues, $bindings) = @_;
	my %defs = (
		exchanges => [ map { { name => $_->[0], vhost => '/', type => $_->[1],
					durable => JSON::PP::true, auto_delete => JSON::PP::false,
					internal => JSON::PP::false, arguments => {} } } @$exchanges ],
		queues => [ map { { name => $_->[0], vhost => '/', durable => JSON::PP::true,
					auto_delete => JSON::PP::false, arguments => {} } } @$queues ],
		bindings => [ map { { source => $_->[0], vhost => '/', destination => $_->[1],
					destination_type => 'queue', routing_key => $_->[2],
					arguments => {} } } @$bindings ]);
	my $file = "$self->{dir}/definitions.json";
	_write($file, encode_json(\%defs));
	my ($rc, $out) = $self->ctl('import_definitions', $file);
	croak "import_definitions: $out" if $rc != 0;
}

# RabbitMQ: delete an exchange of vhost "/" (rabbitmqctl has no command for
# it; its eval runs the broker's own function).
sub rabbit_delete_exchange
{
	my ($self, $name) = @_;
	croak "bad exchange name" unless $name =~ /^[A-Za-z0-9_.-]+$/;
	my ($rc, $out) = $self->ctl('eval',
		qq{rabbit_exchange:delete(rabbit_misc:r(<<"/">>, exchange, <<"$name">>), false, <<"outbox-test">>).});
	croak "delete exchange: $out" if $rc != 0 || $out !~ /^ok/;
}

# RabbitMQ: the messages of a queue in order (consumed), as
# [body, ...]; waits for $n of them.
sub rabbit_consume
{
	my ($self, $queue, $n) = @_;
	return () if $n == 0;
	my ($rc, $out) = $self->amqp('amqp-consume', '-q', $queue, '-c', $n,
		'-p', 500, '--', 'awk', 1);
	croak "amqp-consume: $out" if $rc != 0;
	return split(/\n/, $out);
}

# RabbitMQ: the number of messages ready in a queue.
sub rabbit_queue_length
{
	my ($self, $queue) = @_;
	my ($rc, $out) = $self->ctl('list_queues', '--no-table-headers', 'name', 'messages');
	croak "list_queues: $out" if $rc != 0;
	for (split /\n/, $out)
	{
		my ($q, $m) = split /\s+/;
		return $m if defined $q && $q eq $queue;
	}
	return undef;
}

# NATS: one request to the server (a JetStream API subject, or a subject a
# stream captures: the reply is then its PubAck), its reply decoded; $req is
# a hash (sent as JSON) or a string, $headers an optional hash of headers.
# A new connection each time keeps the client trivial.
sub js_request
{
	my ($self, $subject, $req, $headers) = @_;
	my $body = !defined $req ? '' : ref $req ? encode_json($req) : $req;
	my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
		PeerPort => $self->{port}, Proto => 'tcp', Timeout => 10)
	  or croak "nats connect: $!";
	binmode($s);
	my $buf = '';
	_nats_line($s, \$buf);    # INFO
	print $s 'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true}'
	  . "\r\nSUB _INBOX.outbox.test 1\r\n";
	if ($headers)
	{
		my $h = "NATS/1.0\r\n" . join('', map { "$_: $headers->{$_}\r\n" } sort keys %$headers) . "\r\n";
		print $s "HPUB $subject _INBOX.outbox.test " . length($h) . ' '
		  . (length($h) + length($body)) . "\r\n$h$body\r\n";
	}
	else
	{
		print $s "PUB $subject _INBOX.outbox.test " . length($body) . "\r\n$body\r\n";
	}
	for (;;)
	{
		my $line = _nats_line($s, \$buf);
		if ($line =~ /^PING/) { print $s "PONG\r\n"; next; }
		croak "nats: $line" if $line =~ /^-ERR/;
		if ($line =~ /^(H?)MSG /)
		{
			my @f = split(/ /, $line);
			my $total = $f[-1];
			my $hlen = $1 ? $f[-2] : 0;
			my $data = _nats_read($s, \$buf, $total + 2);
			close($s);
			$data = substr($data, $hlen);
			croak "nats: no responder for $subject" if $data eq '';
			return decode_json($data);
		}
	}
}

sub _nats_line
{
	my ($s, $buf) = @_;
	for (;;)
	{
		if ((my $i = index($$buf, "\r\n")) >= 0)
		{
			my $line = substr($$buf, 0, $i);
			$$buf = substr($$buf, $i + 2);
			return $line;
		}
		_nats_fill($s, $buf);
	}
}

sub _nats_read
{
	my ($s, $buf, $n) = @_;
	_nats_fill($s, $buf) while length($$buf) < $n;
	my $data = substr($$buf, 0, $n - 2);
	$$buf = substr($$buf, $n);
	return $data;
}

sub _nats_fill
{
	my ($s, $buf) = @_;
	my $sel = IO::Select->new($s);
	croak "nats: no answer" unless $sel->can_read(10);
	my $r = sysread($s, $$buf, 65536, length($$buf));
	croak "nats: connection closed" unless $r;
}

# NATS: create a file stream over @subjects with a duplicate window.
sub js_stream_create
{
	my ($self, $name, $subjects, $dup_seconds) = @_;
	my $r = $self->js_request("\$JS.API.STREAM.CREATE.$name", {
		name => $name, subjects => $subjects, storage => 'file',
		duplicate_window => ($dup_seconds // 120) * 1_000_000_000 });
	croak "stream create: " . encode_json($r->{error}) if $r->{error};
	return $r;
}

sub js_stream_delete
{
	my ($self, $name) = @_;
	my $r = $self->js_request("\$JS.API.STREAM.DELETE.$name");
	croak "stream delete: " . encode_json($r->{error}) if $r->{error};
}

# NATS: the stream's state (messages, first_seq, last_seq, ...).
sub js_stream_state
{
	my ($self, $name) = @_;
	my $r = $self->js_request("\$JS.API.STREAM.INFO.$name");
	croak "stream info: " . encode_json($r->{error}) if $r->{error};
	return $r->{state};
}

# NATS: every message of a stream, as { seq, subject, data, headers => {} }.
sub js_stream_messages
{
	my ($self, $name) = @_;
	my $state = $self->js_stream_state($name);
	my @msgs;
	for my $seq ($state->{first_seq} .. $state->{last_seq})
	{
		last if $state->{messages} == 0;
		my $r = $self->js_request("\$JS.API.STREAM.MSG.GET.$name", { seq => $seq });
		next if $r->{error};    # deleted
		my $m = $r->{message};
		my %h;
		for (split /\r\n/, decode_base64($m->{hdrs} // ''))
		{
			$h{$1} = $2 if /^([^:\s]+):\s*(.*)$/;
		}
		push @msgs, { seq => $m->{seq}, subject => $m->{subject},
			data => decode_base64($m->{data} // ''), headers => \%h };
	}
	return @msgs;
}

# NATS: a page of the HTTP monitoring endpoint (/jsz?streams=true, ...), decoded.
sub monitor
{
	my ($self, $path) = @_;
	my $r = HTTP::Tiny->new(timeout => 10)
	  ->get("http://127.0.0.1:$self->{monitor_port}$path");
	croak "monitor $path: $r->{status} $r->{reason}" unless $r->{success};
	return decode_json($r->{content});
}

# ---------------------------------------------------------------------------
# What the three sink tests share: a cluster, commands, relays.
# ---------------------------------------------------------------------------

# A started cluster preloading outbox, with short backoffs, the extension created.
sub sink_test_node
{
	my ($name) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	$node->append_conf('postgresql.conf', qq(
shared_preload_libraries = 'outbox'
outbox.backoff_base = 100
outbox.backoff_max = 400
));
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION outbox');
	return $node;
}

# Commit $n commands of run $run (seq $first.. , 1 by default), ids
# "$run-00001"..., kind $kind.
sub produce
{
	my ($node, $run, $n, $kind, $first) = @_;
	$kind //= 'broker';
	$first //= 1;
	my $last = $first + $n - 1;
	$node->safe_psql('postgres', qq{
		SELECT outbox.commit_decision('$run', s, 'decided', format('%s-%s', '$run', lpad(s::text, 5, '0')),
			'$kind', jsonb_build_object('n', s))
		FROM generate_series($first, $last) s});
}

# Start outbox-relay in the background: (pid, stderr file).
sub relay_start
{
	my ($dir, $name, @args) = @_;
	my $err = "$dir/$name.err";
	my $pid = fork() // croak "fork: $!";
	if ($pid == 0)
	{
		open(STDIN, '<', '/dev/null') or POSIX::_exit(127);
		open(STDOUT, '>>', "$dir/$name.out") or POSIX::_exit(127);
		open(STDERR, '>>', $err) or POSIX::_exit(127);
		exec('outbox-relay', '--worker', $name, @args) or POSIX::_exit(127);
	}
	return ($pid, $err);
}

# Wait for a child to exit: its exit code, or undef (killed) after the timeout.
sub wait_exit
{
	my ($pid, $secs) = @_;
	my $deadline = time() + ($secs // $timeout);
	while (time() < $deadline)
	{
		return $? >> 8 if waitpid($pid, WNOHANG) == $pid;
		usleep(50_000);
	}
	kill 'KILL', $pid;
	waitpid($pid, 0);
	return undef;
}

# Wait until $sql returns 't': true, or false after the timeout.
sub wait_sql
{
	my ($node, $sql) = @_;
	my $deadline = time() + $timeout;
	while (time() < $deadline)
	{
		return 1 if $node->safe_psql('postgres', $sql) eq 't';
		usleep(100_000);
	}
	return 0;
}

# Run outbox-relay to its end: (exit code, stderr).
sub relay_run
{
	my (@args) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'outbox-relay', @args ], '<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout($timeout));
	return ($? >> 8, $err);
}

# The text of a file.
sub slurp
{
	my ($path) = @_;
	open(my $fh, '<', $path) or return '';
	local $/;
	my $t = <$fh>;
	close($fh);
	return $t;
}

# Published, dead and other commands of runs LIKE $pattern: "P D O".
sub run_states
{
	my ($node, $pattern) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT count(*) FILTER (WHERE status = 'published') || ' ' ||
		       count(*) FILTER (WHERE status = 'dead') || ' ' ||
		       count(*) FILTER (WHERE status NOT IN ('published', 'dead'))
		FROM outbox.commands WHERE run_id LIKE '$pattern'});
}

# The command_ids of a run's published commands.
sub published_ids
{
	my ($node, $run) = @_;
	return split(/\n/, $node->safe_psql('postgres',
		"SELECT command_id FROM outbox.commands WHERE run_id = '$run' AND status = 'published' ORDER BY 1"));
}

END
{
	my $rc = $?;
	$_->stop for grep { $_->running } @running;
	$? = $rc;
}

1;
