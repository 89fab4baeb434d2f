#!/usr/bin/perl
# A TCP proxy on 127.0.0.1 that delays every byte by half of RTT_MS in each
# direction, so that a broker on the loopback answers like one across a
# network RTT_MS away (bench/brokers.sh, BROKER_RTT=MS).  Not a test.
#
#   perl bench/delay_proxy.pl RTT_MS TARGET_HOST TARGET_PORT
#
# Prints "ready PORT" once it listens (an ephemeral port), then forwards
# each accepted connection to the target, keeping the byte order of each
# direction; a side that closes is closed on the other side once what it
# sent has been delivered.  Ends on SIGTERM.
use strict;
use warnings;
use IO::Select;
use IO::Socket::INET;
use Socket qw(IPPROTO_TCP TCP_NODELAY);
use Time::HiRes qw(time);

my ($rtt_ms, $thost, $tport) = @ARGV;
die "usage: delay_proxy.pl RTT_MS HOST PORT\n"
  unless defined $tport && $rtt_ms =~ /^\d+(\.\d+)?$/;
my $delay = $rtt_ms / 2000.0;    # one way, seconds

my $listen = IO::Socket::INET->new(
	LocalAddr => '127.0.0.1',
	LocalPort => 0,
	Listen => 64,
	ReuseAddr => 1) or die "listen: $!\n";
$| = 1;
print "ready ", $listen->sockport, "\n";

my $sel = IO::Select->new($listen);
my %peer;     # fileno => the socket it forwards to
my %sock;     # fileno => socket
my %queue;    # fileno of the destination => [[due, data], ...]
my %eof;      # fileno of the destination => due time of the close
my $stop = 0;
$SIG{TERM} = sub { $stop = 1 };

# Close both sockets of a pair.
sub drop_pair
{
	my ($fd) = @_;
	for my $f ($fd, defined $peer{$fd} ? fileno($peer{$fd}) : ())
	{
		next unless $sock{$f};
		$sel->remove($sock{$f});
		close($sock{$f});
		delete $sock{$f};
		delete $peer{$f};
		delete $queue{$f};
		delete $eof{$f};
	}
}

while (!$stop)
{
	# the next due write bounds the wait
	my $now = time;
	my $wait = 1.0;
	for my $f (keys %queue)
	{
		next unless @{ $queue{$f} };
		my $w = $queue{$f}[0][0] - $now;
		$wait = $w if $w < $wait;
	}
	for my $f (keys %eof)
	{
		my $w = $eof{$f} - $now;
		$wait = $w if $w < $wait;
	}
	$wait = 0 if $wait < 0;
	for my $r ($sel->can_read($wait))
	{
		if ($r == $listen)
		{
			my $c = $listen->accept or next;
			my $t = IO::Socket::INET->new(PeerAddr => $thost, PeerPort => $tport, Proto => 'tcp');
			unless ($t)
			{
				close($c);
				next;
			}
			setsockopt($_, IPPROTO_TCP, TCP_NODELAY, 1) for ($c, $t);
			$sock{ fileno($c) } = $c;
			$sock{ fileno($t) } = $t;
			$peer{ fileno($c) } = $t;
			$peer{ fileno($t) } = $c;
			$queue{ fileno($c) } = [];
			$queue{ fileno($t) } = [];
			$sel->add($c, $t);
			next;
		}
		my $fd = fileno($r);
		next unless $sock{$fd};
		my $dst = fileno($peer{$fd});
		my $buf;
		my $n = sysread($r, $buf, 262144);
		# acknowledge at once (Linux TCP_QUICKACK, 12): a sender with
		# Nagle's algorithm on would otherwise wait for a delayed ACK
		setsockopt($r, IPPROTO_TCP, 12, 1) if $^O eq 'linux';
		if (!$n)
		{
			# closed: close the other side once what came before has gone
			$sel->remove($r);
			$eof{$dst} = time + $delay;
			next;
		}
		push @{ $queue{$dst} }, [ time + $delay, $buf ];
	}
	$now = time;
	for my $f (keys %queue)
	{
		my $q = $queue{$f};
		next unless $sock{$f};
		while (@$q && $q->[0][0] <= $now)
		{
			my $data = $q->[0][1];
			my $off = 0;
			while ($off < length $data)
			{
				my $w = syswrite($sock{$f}, $data, length($data) - $off, $off);
				last unless defined $w;
				$off += $w;
			}
			shift @$q;
		}
	}
	for my $f (keys %eof)
	{
		next if $eof{$f} > $now || ($queue{$f} && @{ $queue{$f} });
		drop_pair($f);
	}
}
