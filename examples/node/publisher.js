// Publisher: claim commands, send them, ack each one the broker confirmed.
//
//     node publisher.js WORKER [LEASE_SECONDS]
//
// The "broker" is this process's standard streams: one JSON message per line
// out, one confirmation line in per message (publisher confirms).  Put your
// broker's client in send() and confirmed().  The publisher stops when a
// claim returns nothing (a long-running one would wait and claim again).
'use strict';
const readline = require('node:readline');
const { Client } = require('pg');

const LEASE_NOT_OWNED = 'OB001';
const broker = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();

function send(lease) {
  const { command_id, run_id, kind, payload } = lease;
  process.stdout.write(JSON.stringify({ command_id, run_id, kind, payload }) + '\n');
}

async function confirmed() {
  if ((await broker.next()).done) throw new Error('publisher: the broker went away');
}

async function main() {
  const worker = process.argv[2];
  // An interval goes as text the server parses ('60 seconds'), never as a
  // JS object: {minutes: 5} arrives as the text {"minutes":5}, which the
  // server reads as 5 seconds.
  const lease = `${Number(process.argv[3] ?? 60)} seconds`;
  const client = new Client();
  await client.connect();
  try {
    for (;;) {
      const { rows: leases } = await client.query(
        'SELECT * FROM outbox.claim($1, $2, $3)', [worker, 10, lease]);
      if (leases.length === 0) break;
      leases.forEach(send);
      for (const l of leases) {
        await confirmed();
        try {
          await client.query('SELECT outbox.ack($1, $2)', [worker, l.token]);
        } catch (err) {
          if (err.code !== LEASE_NOT_OWNED) throw err;
          // Our lease ran out and another publisher took the command over:
          // it is theirs now.  Drop it; never retry the ack.
          console.error(`publisher ${worker}: ${err.code}, dropped ${l.command_id}`);
        }
      }
    }
  } finally {
    await client.end();
  }
}

main().then(() => process.exit(), (err) => { console.error(err); process.exit(1); });
