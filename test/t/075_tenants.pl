# Tenants across databases, and producer-controlled text in the worker's log.
#
# Two databases of one cluster install outbox, app and hr; each gets group
# roles of its own (app_outbox_producer ..., hr_outbox_producer ...).  A
# login role that is a member of all of app's roles connects to hr: every
# API call and every view there is refused with 42501 and hr's outbox is
# unchanged, while in app the same calls work.  (With 0.1.0's cluster-wide
# roles, a member of outbox_publisher granted for app claimed hr's
# commands.)
#
# Then a command id with a newline reaches the worker's log, through an
# error of its sweep that names the command: the log shows it escaped, and
# no line of the log is forged.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use FindBin;
use lib "$FindBin::RealBin/../perl";
use OutboxTest;

my $node = outbox_node('tenants', qq{
outbox.databases = 'app'
outbox.naptime = '100ms'
});

sub sql { my ($db, $q) = @_; return $node->safe_psql($db, $q); }

sql('postgres', q{
CREATE DATABASE app;
CREATE DATABASE hr;
CREATE ROLE app_user LOGIN;
});
sql($_, 'CREATE EXTENSION outbox') foreach ('app', 'hr');
is( sql('postgres', q{SELECT string_agg(rolname, ',' ORDER BY rolname) FROM pg_roles
		WHERE rolname LIKE '%\_outbox\_%'}),
	'app_outbox_admin,app_outbox_consumer,app_outbox_producer,app_outbox_publisher,'
	  . 'hr_outbox_admin,hr_outbox_consumer,hr_outbox_producer,hr_outbox_publisher',
	'each database has its own four group roles');
is(sql('hr', q{SELECT outbox.role('publisher')}), 'hr_outbox_publisher', 'outbox.role names them');
is( sql('hr', q{SELECT count(*) FROM pg_proc p, aclexplode(p.proacl) a
		WHERE p.pronamespace = 'outbox'::regnamespace AND a.grantee::regrole::text LIKE 'app\_%'}),
	'0', "hr grants nothing to app's roles");

sql('postgres', 'GRANT app_outbox_producer, app_outbox_publisher, app_outbox_consumer, app_outbox_admin TO app_user');
sql('hr', q{
SELECT outbox.commit_decision('hr-run', 1, 'decided', 'salary-1', 'payroll', '{"salary": 250000, "employee": "alice"}');
SELECT outbox.register_consumer('payroll-mailer', current_user::text::regrole);
});

my $fingerprint = q{
SELECT md5(concat_ws('|',
	(SELECT string_agg(t::text, ',' ORDER BY t::text) FROM outbox.events t),
	(SELECT string_agg(t::text, ',' ORDER BY t::text) FROM outbox.commands t),
	(SELECT string_agg(t::text, ',' ORDER BY t::text) FROM outbox.receipts t),
	(SELECT string_agg(t::text, ',' ORDER BY t::text) FROM outbox.inbox t),
	(SELECT string_agg(t::text, ',' ORDER BY t::text) FROM outbox.consumers t),
	(SELECT string_agg(t::text, ',' ORDER BY t::text) FROM outbox.policies t)))};
my $before = sql('hr', $fingerprint);

# The SQLSTATE of a statement run by app_user in a database.
sub state_as_app_user
{
	my ($db, $stmt) = @_;
	my ($rc, $out, $err) = $node->psql($db, "\\set VERBOSITY verbose\n$stmt",
		extra_params => [ '-U', 'app_user' ]);
	return $rc == 0 ? '00000' : ($err =~ /ERROR:  ([0-9A-Z]{5}):/ ? $1 : "? $err");
}

my @calls = (
	q{SELECT * FROM outbox.claim('w', 10)},
	q{SELECT outbox.commit_decision('hr-run', 2, 'decided', 'salary-2', 'payroll', '{}')},
	q{SELECT * FROM outbox.commit_decisions('[]')},
	q{SELECT outbox.record_event('hr-run', 3, 'note')},
	q{SELECT outbox.complete('hr-run', 'salary-1')},
	q{SELECT outbox.inbox_accept('payroll-mailer', 'hr-run', 'salary-1')},
	q{SELECT outbox.register_consumer('payroll-mailer-2', 'app_user')},
	q{SELECT outbox.requeue('hr-run', 'salary-1')},
	q{SELECT outbox.set_policy('payroll', claimers => '{app_user}')},
	q{SELECT outbox.pause('payroll')},
	q{SELECT outbox.sweep()},
	q{SELECT outbox.purge()},
	q{SELECT outbox.role('admin')},
	q{SELECT * FROM outbox.leases},
	q{SELECT * FROM outbox.dead_letters},
	q{SELECT * FROM outbox.conservation},
	q{SELECT * FROM outbox.commands});
foreach my $stmt (@calls)
{
	is(state_as_app_user('hr', $stmt), '42501', "a member of app's roles is refused in hr: $stmt");
}
is(sql('hr', $fingerprint), $before, "hr's outbox is unchanged");
is(sql('hr', q{SELECT status FROM outbox.commands WHERE command_id = 'salary-1'}), 'pending',
	"hr's command was never claimed");

# In app the same member works.
sql('app', q{SELECT outbox.register_consumer('app-mailer', 'app_user')});
is( state_as_app_user('app', q{
SELECT outbox.commit_decision('app-run', 1, 'decided', 'mail-1', 'mail', '{}');
SELECT count(*) FROM outbox.claim('w', 10);
SELECT outbox.inbox_accept('app-mailer', 'app-run', 'mail-1');
SELECT outbox.complete('app-run', 'mail-1');}),
	'00000', "in app the member of app's roles decides, claims, accepts and completes");

# ---------------------------------------------------------------------------
# The worker's log.  A trigger of the DBA's refuses the sweep's update of one
# command with an error naming it; the command's id holds a newline and
# what would look like a log line.
# ---------------------------------------------------------------------------
sql('app', q{
CREATE FUNCTION public.refuse_sweep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.status = 'uncertain' THEN
		RAISE EXCEPTION 'refusing to settle %', NEW.command_id;
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER refuse_sweep BEFORE UPDATE ON outbox.commands
	FOR EACH ROW EXECUTE FUNCTION public.refuse_sweep();
SELECT outbox.set_policy('wire', takeover => 'manual');
SELECT outbox.commit_decision('app-run', 2, 'decided', E'evil\nLOG:  forged line\r\t\\\\', 'wire', '{}');
SELECT count(*) FROM outbox.claim('w', 1, interval '1 millisecond', '{wire}');
});
ok( $node->poll_query_until('app', q{SELECT last_error LIKE 'refusing to settle evil%' FROM outbox.workers
		WHERE database = 'app'}),
	"the worker's sweep hits the DBA's error");
my $log = slurp_file($node->logfile);
like($log, qr/WARNING:  refusing to settle evil\\nLOG:  forged line\\r\\t\\\\/,
	'the log shows the id escaped');
unlike($log, qr/^LOG:  forged line/m, 'no line of the log is forged');

$node->stop;
done_testing();
