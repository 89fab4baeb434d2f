#!/usr/bin/perl
# bench/latency.sh's arithmetic: join one cell's commits (the producer's
# file), arrivals (the receiver's log) and the relay's -vv trace by
# command, and print p50 and p99 of the total and of each step (ms), then
# the number of commands, on one line.
#
#   latency_steps.pl TAG COMMITS ARRIVALS TRACE
use strict;
use warnings;

my ($tag, $commits, $arrivals, $trace) = @ARGV;
my (%sent, %answered, %arrived, %batch);

open(my $fh, '<', $commits) or die "$commits: $!";
while (<$fh>)
{
	chomp;
	my ($id, $s, $a) = split /\t/;
	my ($seq) = $id =~ /-(\d+)$/;
	($sent{$seq}, $answered{$seq}) = ($s, $a);
}
close $fh;

open($fh, '<', $arrivals) or die "$arrivals: $!";
while (<$fh>)
{
	chomp;
	my ($id, $deliveries, $status, undef, $t) = split /\t/;
	next unless $id =~ /^\Q$tag\E-(\d+)$/;
	$arrived{$1} //= $t;		# the first delivery
}
close $fh;

open($fh, '<', $trace) or die "$trace: $!";
while (<$fh>)
{
	next unless /trace: n=\d+ woke=(\S+) claim=(\S+) claimed=(\S+) delivered=(\S+) acked=(\S+) seqs=(\S*)/;
	my @t = ($1, $2, $3, $4, $5);
	for my $seq (split /,/, $6)
	{
		$batch{$seq} //= [@t];
	}
}
close $fh;

my %v;
for my $seq (keys %sent)
{
	next unless defined $arrived{$seq} && defined $batch{$seq};
	my ($woke, $claim, $claimed, $delivered, $acked) = @{ $batch{$seq} };
	push @{ $v{total} }, $arrived{$seq} - $sent{$seq};
	push @{ $v{from_answer} }, $arrived{$seq} - $answered{$seq};
	push @{ $v{commit} }, $answered{$seq} - $sent{$seq};
	push @{ $v{wait} }, $claim - $answered{$seq};
	push @{ $v{notify} }, $woke - $answered{$seq} if $woke > 0;
	push @{ $v{claim} }, $claimed - $claim;
	push @{ $v{http} }, $arrived{$seq} - $claimed;
	push @{ $v{ack} }, $acked - $delivered;
}

sub pct
{
	my ($vals, $p) = @_;
	return "nan" unless $vals && @$vals;
	my @s = sort { $a <=> $b } @$vals;
	my $i = int($p * @s);
	$i = $#s if $i > $#s;
	return sprintf('%.2f', $s[$i]);
}

my @out;
for my $k (qw(total from_answer commit wait notify claim http ack))
{
	push @out, pct($v{$k}, 0.5), pct($v{$k}, 0.99);
}
push @out, scalar(@{ $v{total} || [] });
print join(' ', @out), "\n";
