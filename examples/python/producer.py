#!/usr/bin/env python3
"""Producer: place orders; each order and the charge it decides commit together.

    python3 producer.py RUN_ID COUNT

Running it again with the same arguments is a retry: the orders are there
already, and each decision comes back as already recorded (false).

Connects with the libpq environment (PGHOST, PGPORT, PGDATABASE, PGUSER).
"""
import sys

import psycopg
from psycopg.types.json import Jsonb


def main():
    run_id, count = sys.argv[1], int(sys.argv[2])
    retries = 0
    with psycopg.connect(autocommit=True) as conn:
        for seq in range(1, count + 1):
            order_id = f"{run_id}/order-{seq}"
            amount_cents = 250 * seq
            # One transaction: the business row, the event and the command.
            with conn.transaction():
                conn.execute(
                    "INSERT INTO shop_orders (order_id, amount_cents) VALUES (%s, %s)"
                    " ON CONFLICT (order_id) DO NOTHING",
                    (order_id, amount_cents))
                recorded, = conn.execute(
                    "SELECT outbox.commit_decision(%s, %s, %s, %s, %s, %s)",
                    (run_id, seq, "order_placed", f"{order_id}/charge", "charge_card",
                     Jsonb({"order_id": order_id, "amount_cents": amount_cents}))).fetchone()
            # False: this role recorded the very same decision before (a retry).
            retries += not recorded
    print(f"producer: {count} orders placed, {retries} decisions already recorded", file=sys.stderr)


if __name__ == "__main__":
    main()
