# The chaos suite (060_chaos.pl) on a stream (issue 20, the write-once
# path): the kind is written once into a stream, the 4 relays publish its
# subscription with --stream/--subscription to outbox-receiver; kill -9 of
# relays mid-batch and an immediate stop of the server, then lost 0,
# unexpected 0, duplicates within one batch per kill (and per relay for the
# server stop), every receipt present, conservation, verify() and amcheck
# clean.

use strict;
use warnings;
use FindBin;
# loaded here, at compile time, so that their INIT blocks run (060 uses them too)
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

$ENV{OUTBOX_CHAOS_STREAM} = 1;
my $file = "$FindBin::RealBin/060_chaos.pl";
do $file;
die "$file: $@" if $@;
