// Consumer: charge each order once, however often its command is delivered.
//
//     node consumer.js < messages
//
// Reads the publisher's JSON messages, one a line.  The inbox entry, the
// charge and the completion receipt commit in one transaction: a redelivered
// command finds its inbox entry and changes nothing.
'use strict';
const readline = require('node:readline');
const { Client } = require('pg');

const CONSUMER = 'billing';

async function main() {
  const client = new Client();
  await client.connect();
  let charged = 0;
  try {
    for await (const line of readline.createInterface({ input: process.stdin })) {
      const msg = JSON.parse(line);
      await client.query('BEGIN');
      try {
        const { rows: [{ inbox_accept: first }] } = await client.query(
          'SELECT outbox.inbox_accept($1, $2, $3)', [CONSUMER, msg.run_id, msg.command_id]);
        if (first) {
          const { rows: [{ id: chargeId }] } = await client.query(
            'INSERT INTO shop_charges (command_id, order_id, amount_cents) VALUES ($1, $2, $3) RETURNING id',
            [msg.command_id, msg.payload.order_id, msg.payload.amount_cents]);
          // chargeId is a string: node-postgres returns bigint (int8) as text.
          await client.query('SELECT outbox.complete($1, $2, $3, $4)',
            [msg.run_id, msg.command_id, 'done', { charge_id: chargeId }]);
          charged++;
        }
        await client.query('COMMIT');
      } catch (err) {
        await client.query('ROLLBACK');
        throw err;
      }
    }
    console.error(`consumer: ${charged} charged`);
  } finally {
    await client.end();
  }
}

main().catch((err) => { console.error(err); process.exitCode = 1; });
