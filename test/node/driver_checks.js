// What node-postgres makes of the API, as docs/drivers.md tells it: run by
// test/t/055_examples.pl as a producer-and-publisher role against a fresh
// database, printing one "name: value" line per check for the test to
// compare.  Every query is parameterized with native values and no cast.
'use strict';
const { Client } = require('pg');

const client = new Client();

// The SQLSTATE and constraint of the error a query raises, or "no error".
async function failure(sql, params) {
  try {
    await client.query(sql, params);
    return 'no error';
  } catch (err) {
    return err.constraint ? `${err.code} ${err.constraint}` : err.code;
  }
}

function report(name, value) {
  console.log(`${name}: ${value}`);
}

async function main() {
  await client.connect();
  const decide = 'SELECT outbox.commit_decision($1, $2, $3, $4, $5, $6)';

  // int8 beyond 2^53 goes in as a string and comes back as the same string.
  const bigSeq = '9007199254740993';
  await client.query(decide, ['drv-run', bigSeq, 'order_placed', 'drv-1', 'drv_kind', { n: 1 }]);
  const { rows: [lease] } = await client.query(
    'SELECT * FROM outbox.claim($1, $2, $3, $4)', ['drv-worker', 1, '5 minutes', ['drv_kind']]);
  report('seq', `${typeof lease.seq} ${lease.seq}`);
  report('version', typeof lease.version);
  report('deliveries', typeof lease.deliveries);
  report('payload', JSON.stringify(lease.payload));
  report('lease_until', lease.lease_until instanceof Date ? 'Date' : typeof lease.lease_until);

  // The single and batch acks are told apart without a cast.
  report('ack of a forged token', await failure('SELECT outbox.ack($1, $2)', ['drv-worker', 'forged']));
  const { rows: many } = await client.query(
    'SELECT acked, reason FROM outbox.ack_many($1, $2)', ['drv-worker', [lease.token, 'forged']]);
  report('ack_many', many.map((r) => `${r.acked}/${r.reason}`).join(' '));
  report('ack after ack_many', await failure('SELECT outbox.ack($1, $2)', ['drv-worker', lease.token]));

  // Duplicates name their constraint.
  report('same command id',
    await failure(decide, ['drv-run', 1, 'order_placed', 'drv-1', 'drv_kind', { n: 2 }]));
  report('same event',
    await failure(decide, ['drv-run', bigSeq, 'order_placed', 'drv-2', 'drv_kind', { n: 2 }]));

  // The same decision again from the same role is a retry: false, no error.
  const { rows: [{ commit_decision: again }] } = await client.query(
    decide, ['drv-run', bigSeq, 'order_placed', 'drv-1', 'drv_kind', { n: 1 }]);
  report('same decision again', again);

  // The batch: one jsonb document (an array, so JSON text), seq as a string.
  const batch = (ids) => JSON.stringify(ids.map((id, i) => ({
    run_id: 'drv-batch', seq: String(10 + i), event_kind: 'e', command_id: id,
    command_kind: 'drv_batch', payload: { i },
  })));
  const { rows: recorded } = await client.query(
    'SELECT ord, command_id, recorded FROM outbox.commit_decisions($1)', [batch(['b-1', 'b-2'])]);
  report('batch', recorded.map((r) => `${r.ord}:${r.command_id}:${r.recorded}`).join(' '));
  const { rows: retried } = await client.query(
    'SELECT recorded FROM outbox.commit_decisions($1)', [batch(['b-1', 'b-2'])]);
  report('batch again', retried.map((r) => r.recorded).join(' '));
  try {
    await client.query('SELECT * FROM outbox.commit_decisions($1)', [batch(['b-3', 'b-4', 'b-3'])]);
    report('repeat within a batch', 'no error');
  } catch (err) {
    report('repeat within a batch', `${err.code} ${/Decisions (\d+) and (\d+)/.exec(err.detail)?.slice(1).join(',')}`);
  }
  const { rows: [{ n: stored }] } = await client.query(
    'SELECT count(*) AS n FROM outbox.commit_decisions($1) WHERE false', ['[]']);
  report('empty batch', stored);

  // A JS array for a jsonb parameter is sent as an array literal.
  report('array as jsonb', await failure(decide, ['drv-run', 2, 'order_placed', 'drv-3', 'drv_kind', [1, 2]]));
  report('stringified array as jsonb',
    await failure(decide, ['drv-run', 3, 'order_placed', 'drv-4', 'drv_kind', JSON.stringify([1, 2])]));

  // The lease: an object becomes seconds, a string is what it says.
  await client.query(decide, ['drv-run', 4, 'order_placed', 'drv-5', 'drv_kind', { n: 5 }]);
  const leaseOf = async (worker, lease) => {
    const { rows } = await client.query(
      'SELECT lease_until - clock_timestamp() > $1 AS longer FROM outbox.claim($2, $3, $4, $5)',
      ['1 minute', worker, 1, lease, ['drv_kind']]);
    return rows.length ? (rows[0].longer ? 'over a minute' : 'under a minute') : 'nothing claimed';
  };
  report('lease as an object', await leaseOf('drv-object', { minutes: 5 }));
  report('lease as text', await leaseOf('drv-string', '5 minutes'));

  // fail with an error text longer than the stored 4,096 bytes.
  await client.query(decide, ['drv-run', 5, 'order_placed', 'drv-6', 'drv_kind', { n: 6 }]);
  const { rows: [held] } = await client.query(
    'SELECT * FROM outbox.claim($1, $2, $3, $4)', ['drv-fail', 1, '5 minutes', ['drv_kind']]);
  const { rows: [{ fail: status }] } = await client.query(
    'SELECT outbox.fail($1, $2, $3)', ['drv-fail', held.token, 'é'.repeat(3000)]);
  report('fail of a long error', `${held.command_id} ${status}`);

  // The consumer's calls: unknown commands, consumers and other roles'
  // consumer names have codes of their own.
  const accept = 'SELECT outbox.inbox_accept($1, $2, $3)';
  report('accept', (await client.query(accept, ['drv-consumer', 'drv-run', 'drv-1'])).rows[0].inbox_accept);
  report('accept again', (await client.query(accept, ['drv-consumer', 'drv-run', 'drv-1'])).rows[0].inbox_accept);
  report('accept an unknown command', await failure(accept, ['drv-consumer', 'drv-run', 'no-such']));
  report('accept for an unregistered consumer', await failure(accept, ['nobody', 'drv-run', 'drv-1']));
  report("accept for another role's consumer", await failure(accept, ['other-consumer', 'drv-run', 'drv-1']));
  report('complete an unknown command',
    await failure('SELECT outbox.complete($1, $2)', ['drv-run', 'no-such']));
  report('complete', (await client.query('SELECT outbox.complete($1, $2, $3, $4)',
    ['drv-run', 'drv-1', 'done', { ok: true }])).rows[0].complete);

  // A failed call aborts the caller's transaction; a savepoint keeps it.
  await client.query('BEGIN');
  await failure('SELECT outbox.ack($1, $2)', ['drv-worker', 'forged']);
  report('after an error in a transaction', await failure('SELECT 1', []));
  await client.query('ROLLBACK');
  await client.query('BEGIN');
  await client.query('SAVEPOINT ack');
  await failure('SELECT outbox.ack($1, $2)', ['drv-worker', 'forged']);
  await client.query('ROLLBACK TO SAVEPOINT ack');
  report('after a rolled back savepoint', await failure('SELECT 1', []));
  await client.query('COMMIT');
}

main().then(() => client.end(), (err) => {
  console.error(err);
  process.exitCode = 1;
  return client.end();
});
