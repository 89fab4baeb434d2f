#!/usr/bin/perl
# A TCP proxy for the tests of outbox-relay's broker sinks
# (test/t/062_broker_inflight.pl): it listens on 127.0.0.1 (an ephemeral
# port) and forwards each accepted connection to TARGET_HOST:TARGET_PORT,
# byte for byte.  Commands on its standard input, one a line, each answered
# by one line on its standard output once it took effect:
#
#   hold      stop forwarding the broker->relay direction of every
#             connection (also of connections accepted later): what the
#             broker sends is kept, in order, not dropped, and a broker
#             that closes its side is seen by the relay at the release
#             -> "ok hold"
#   release   forward again, what was kept first
#             -> "ok release"
#   cut       close every connection, both sides, at once; what was kept
#             for them is discarded (the broker got what the relay sent,
#             the relay never sees the broker's answers)
#             -> "ok cut N" (N connections cut)
#   stats     -> "stats open=N accepted=N held=BYTES up=BYTES down=BYTES"
#             (up: relay->broker bytes forwarded, down: broker->relay)
#
#   perl test/hold_proxy.pl TARGET_HOST TARGET_PORT
#
# Prints "ready PORT" once it listens.  Ends at the end of its standard
# input (the test's END block or exit closes it) or on SIGTERM.
use strict;
use warnings;
use Errno qw(EAGAIN EWOULDBLOCK EINTR);
use IO::Select;
use IO::Socket::INET;
use Socket qw(IPPROTO_TCP TCP_NODELAY);

my ($thost, $tport) = @ARGV;
die "usage: hold_proxy.pl HOST PORT\n" unless defined $tport && $tport =~ /^\d+$/;

my $listen = IO::Socket::INET->new(
	LocalAddr => '127.0.0.1',
	LocalPort => 0,
	Listen => 64,
	ReuseAddr => 1) or die "listen: $!\n";
$| = 1;
print "ready ", $listen->sockport, "\n";

my $hold = 0;
my ($accepted, $up, $down) = (0, 0, 0);
my $stop = 0;
$SIG{TERM} = sub { $stop = 1 };
$SIG{PIPE} = 'IGNORE';

# One connection: the relay's side and the broker's, and what waits to be
# written to each (to_relay is what hold keeps).
my @pairs;

# Close both sides of a pair and forget it.
sub drop_pair
{
	my ($p) = @_;
	for my $s ($p->{relay}, $p->{broker})
	{
		next unless $s;
		shutdown($s, 2);
		close($s);
	}
	@pairs = grep { $_ != $p } @pairs;
}

# Write what a side can take now; false when it is gone.
sub flush_side
{
	my ($sock, $buf) = @_;
	while (length $$buf)
	{
		my $w = syswrite($sock, $$buf);
		if (!defined $w)
		{
			return 1 if $! == EAGAIN || $! == EWOULDBLOCK || $! == EINTR;
			return 0;
		}
		substr($$buf, 0, $w) = '';
	}
	return 1;
}

# Run one command of the test.
sub command
{
	my ($line) = @_;
	if ($line eq 'hold')
	{
		$hold = 1;
		print "ok hold\n";
	}
	elsif ($line eq 'release')
	{
		$hold = 0;
		print "ok release\n";
	}
	elsif ($line eq 'cut')
	{
		my @all = @pairs;
		drop_pair($_) for @all;
		print "ok cut ", scalar(@all), "\n";
	}
	elsif ($line eq 'stats')
	{
		my $held = 0;
		$held += length($_->{to_relay}) for @pairs;
		printf "stats open=%d accepted=%d held=%d up=%d down=%d\n",
		  scalar(@pairs), $accepted, $held, $up, $down;
	}
	else
	{
		print "error unknown command \"$line\"\n";
	}
}

my $in = '';
my $stdin_open = 1;
while (!$stop && $stdin_open)
{
	my $rsel = IO::Select->new($listen, \*STDIN);
	my $wsel = IO::Select->new();
	for my $p (@pairs)
	{
		$rsel->add($p->{relay}) unless $p->{relay_eof};
		$rsel->add($p->{broker}) unless $p->{broker_eof};
		$wsel->add($p->{broker}) if length $p->{to_broker};
		$wsel->add($p->{relay}) if length $p->{to_relay} && !$hold;
	}
	my ($r, $w) = IO::Select->select($rsel, $wsel, undef, 1.0);
	next unless defined $r;
	for my $s (@$r)
	{
		if ($s == $listen)
		{
			my $c = $listen->accept or next;
			my $t = IO::Socket::INET->new(PeerAddr => $thost, PeerPort => $tport, Proto => 'tcp');
			unless ($t)
			{
				close($c);
				next;
			}
			setsockopt($_, IPPROTO_TCP, TCP_NODELAY, 1) for ($c, $t);
			$_->blocking(0) for ($c, $t);
			push @pairs, { relay => $c, broker => $t, to_relay => '', to_broker => '' };
			$accepted++;
			next;
		}
		my $fd = fileno($s);
		next unless defined $fd;	# cut meanwhile
		if ($fd == fileno(STDIN))
		{
			my $n = sysread(STDIN, $in, 4096, length $in);
			if (!$n)
			{
				$stdin_open = 0;
				last;
			}
			while ($in =~ s/^([^\n]*)\n//)
			{
				my $line = $1;
				$line =~ s/\s+$//;
				command($line) if $line ne '';
			}
			next;
		}
		my ($p) = grep { $_->{relay} == $s || $_->{broker} == $s } @pairs;
		next unless $p;			# cut meanwhile
		my $from_relay = $p->{relay} == $s;
		my $buf;
		my $n = sysread($s, $buf, 262144);
		next if !defined $n && ($! == EAGAIN || $! == EWOULDBLOCK || $! == EINTR);
		if (!$n)
		{
			$p->{ $from_relay ? 'relay_eof' : 'broker_eof' } = 1;
			next;
		}
		if ($from_relay)
		{
			$p->{to_broker} .= $buf;
			$up += $n;
		}
		else
		{
			$p->{to_relay} .= $buf;
			$down += $n;
		}
	}
	for my $p (@{ [@pairs] })
	{
		# the broker closed: what the relay still sends is lost, as it
		# would be without the proxy
		$p->{to_broker} = '' if $p->{broker_eof};
		if (!flush_side($p->{broker}, \$p->{to_broker})
			|| (!$hold && !flush_side($p->{relay}, \$p->{to_relay})))
		{
			drop_pair($p);
			next;
		}
		# a side that closed: close the other once what it sent is out;
		# while holding, the broker's close is held with its answers
		if (($p->{relay_eof} && !length $p->{to_broker})
			|| ($p->{broker_eof} && !$hold && !length $p->{to_relay}))
		{
			drop_pair($p);
		}
	}
}
drop_pair($_) for @{ [@pairs] };
