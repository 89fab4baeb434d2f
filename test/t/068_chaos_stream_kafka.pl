# The chaos suite (060_chaos.pl) on a stream, the relays publishing its
# subscription to Kafka (librdkafka's mock cluster, as in 061): kill -9 of
# relays mid-batch and an immediate stop of the server, then lost 0,
# unexpected 0 and duplicates within one batch per kill (and per relay for
# the server stop), counted from what the broker holds; conservation,
# verify() and amcheck clean.

use strict;
use warnings;
use FindBin;
# loaded here, at compile time, so that their INIT blocks run (060 uses them too)
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

$ENV{OUTBOX_CHAOS_STREAM} = 1;
$ENV{OUTBOX_CHAOS_SINK} = 'kafka';
my $file = "$FindBin::RealBin/060_chaos.pl";
do $file;
die "$file: $@" if $@;
