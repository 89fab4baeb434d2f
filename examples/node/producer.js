// Producer: place orders; the orders and the charges they decide commit
// together, all in one transaction with one batch call.
//
//     node producer.js RUN_ID COUNT
//
// Running it again with the same arguments is a retry: the orders are there
// already, and each decision comes back as already recorded (false).
// Connects with the libpq environment (PGHOST, PGPORT, PGDATABASE, PGUSER).
'use strict';
const { Client } = require('pg');

async function main() {
  const [runId, count] = [process.argv[2], Number(process.argv[3])];
  const orders = [];
  for (let seq = 1; seq <= count; seq++) {
    orders.push({ seq, orderId: `${runId}/order-${seq}`, amountCents: 250 * seq });
  }
  // One decision per order: the event that records it and its charge.
  const decisions = orders.map((o) => ({
    run_id: runId, seq: o.seq, event_kind: 'order_placed',
    command_id: `${o.orderId}/charge`, command_kind: 'charge_card',
    payload: { order_id: o.orderId, amount_cents: o.amountCents },
  }));
  const client = new Client();
  await client.connect();
  try {
    await client.query('BEGIN');
    try {
      for (const o of orders) {
        await client.query(
          'INSERT INTO shop_orders (order_id, amount_cents) VALUES ($1, $2) ON CONFLICT (order_id) DO NOTHING',
          [o.orderId, o.amountCents]);
      }
      // The batch is one jsonb document, an array: node-postgres would send
      // a JS array as a PostgreSQL array, so it goes as JSON text.
      const { rows } = await client.query(
        'SELECT command_id, recorded FROM outbox.commit_decisions($1)', [JSON.stringify(decisions)]);
      await client.query('COMMIT');
      const retries = rows.filter((r) => !r.recorded).length;
      console.error(`producer: ${count} orders placed, ${retries} decisions already recorded`);
    } catch (err) {
      await client.query('ROLLBACK');
      throw err;
    }
  } finally {
    await client.end();
  }
}

main().catch((err) => { console.error(err); process.exitCode = 1; });
