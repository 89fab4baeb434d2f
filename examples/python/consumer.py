#!/usr/bin/env python3
"""Consumer: charge each order once, however often its command is delivered.

    python3 consumer.py < messages

Reads the publisher's JSON messages, one a line.  The inbox entry, the
charge and the completion receipt commit in one transaction: a redelivered
command finds its inbox entry and changes nothing.
"""
import json
import sys

import psycopg
from psycopg.types.json import Jsonb

CONSUMER = "billing"


def main():
    charged = 0
    with psycopg.connect(autocommit=True) as conn:
        for line in sys.stdin:
            msg = json.loads(line)
            with conn.transaction():
                first, = conn.execute(
                    "SELECT outbox.inbox_accept(%s, %s, %s)",
                    (CONSUMER, msg["run_id"], msg["command_id"])).fetchone()
                if not first:
                    continue
                charge_id, = conn.execute(
                    "INSERT INTO shop_charges (command_id, order_id, amount_cents)"
                    " VALUES (%s, %s, %s) RETURNING id",
                    (msg["command_id"], msg["payload"]["order_id"],
                     msg["payload"]["amount_cents"])).fetchone()
                conn.execute(
                    "SELECT outbox.complete(%s, %s, %s, %s)",
                    (msg["run_id"], msg["command_id"], "done", Jsonb({"charge_id": charge_id})))
                charged += 1
    print(f"consumer: {charged} charged", file=sys.stderr)


if __name__ == "__main__":
    main()
