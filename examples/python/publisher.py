#!/usr/bin/env python3
"""Publisher: claim commands, send them, ack each one the broker confirmed.

    python3 publisher.py WORKER [LEASE_SECONDS]

The "broker" is this process's standard streams: one JSON message per line
out, one confirmation line in per message (publisher confirms).  Put your
broker's client in send() and confirmed().  The publisher stops when a
claim returns nothing (a long-running one would wait and claim again).
"""
import json
import sys
from datetime import timedelta

import psycopg
from psycopg.rows import dict_row

LEASE_NOT_OWNED = "OB001"


def send(lease):
    message = {k: lease[k] for k in ("command_id", "run_id", "kind", "payload")}
    print(json.dumps(message), flush=True)


def confirmed():
    if not sys.stdin.readline():
        sys.exit("publisher: the broker went away")


def main():
    worker = sys.argv[1]
    lease = timedelta(seconds=float(sys.argv[2]) if len(sys.argv) > 2 else 60)
    with psycopg.connect(autocommit=True, row_factory=dict_row) as conn:
        while True:
            leases = conn.execute(
                "SELECT * FROM outbox.claim(%s, %s, %s)", (worker, 10, lease)).fetchall()
            if not leases:
                break
            for lease_row in leases:
                send(lease_row)
            for lease_row in leases:
                confirmed()
                try:
                    conn.execute("SELECT outbox.ack(%s, %s)", (worker, lease_row["token"]))
                except psycopg.Error as e:
                    if e.sqlstate != LEASE_NOT_OWNED:
                        raise
                    # Our lease ran out and another publisher took the command
                    # over: it is theirs now.  Drop it; never retry the ack.
                    print(f"publisher {worker}: {e.sqlstate}, dropped {lease_row['command_id']}",
                          file=sys.stderr)


if __name__ == "__main__":
    main()
