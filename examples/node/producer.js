// Producer: place orders; each order and the charge it decides commit together.
//
//     node producer.js RUN_ID COUNT
//
// Connects with the libpq environment (PGHOST, PGPORT, PGDATABASE, PGUSER).
'use strict';
const { Client } = require('pg');

async function main() {
  const [runId, count] = [process.argv[2], Number(process.argv[3])];
  const client = new Client();
  await client.connect();
  try {
    for (let seq = 1; seq <= count; seq++) {
      const orderId = `${runId}/order-${seq}`;
      const amountCents = 250 * seq;
      // One transaction: the business row, the event and the command.
      await client.query('BEGIN');
      try {
        await client.query(
          'INSERT INTO shop_orders (order_id, amount_cents) VALUES ($1, $2)',
          [orderId, amountCents]);
        await client.query(
          'SELECT outbox.commit_decision($1, $2, $3, $4, $5, $6)',
          [runId, seq, 'order_placed', `${orderId}/charge`, 'charge_card',
            { order_id: orderId, amount_cents: amountCents }]);
        await client.query('COMMIT');
      } catch (err) {
        await client.query('ROLLBACK');
        throw err;
      }
    }
    console.error(`producer: ${count} orders placed`);
  } finally {
    await client.end();
  }
}

main().catch((err) => { console.error(err); process.exitCode = 1; });
