"""What psycopg 3 makes of the API, as docs/drivers.md tells it.

Run by test/t/055_examples.pl as a producer-and-publisher role against a
fresh database; prints one "name: value" line per check for the test to
compare.  Every query is parameterized with native values and no cast.
"""
from datetime import datetime, timedelta, timezone

import psycopg
from psycopg.types.json import Jsonb

DECIDE = "SELECT outbox.commit_decision(%s, %s, %s, %s, %s, %s)"


def report(name, value):
    print(f"{name}: {value}")


def failure(conn, sql, params):
    """The SQLSTATE (and constraint) of the error sql raises, or "no error"."""
    try:
        conn.execute(sql, params)
        return "no error"
    except psycopg.Error as e:
        if e.sqlstate is None:      # refused by the driver, never sent
            return f"driver: {type(e).__name__}"
        return f"{e.sqlstate} {e.diag.constraint_name}" if e.diag.constraint_name else e.sqlstate


def main():
    with psycopg.connect(autocommit=True) as conn:
        big_seq = 2**53 + 1
        report("bare dict as jsonb", failure(
            conn, DECIDE, ("py-run", 1, "order_placed", "py-0", "py_kind", {"n": 0})))
        conn.execute(DECIDE, ("py-run", big_seq, "order_placed", "py-1", "py_kind", Jsonb({"n": 1})))
        lease = conn.execute("SELECT * FROM outbox.claim(%s, %s, %s, %s)",
                             ("py-worker", 1, timedelta(minutes=5), ["py_kind"])).fetchone()
        cols = dict(zip(("command_id", "run_id", "seq", "kind", "payload", "token",
                         "version", "deliveries", "lease_until"), lease))
        report("seq", f"{type(cols['seq']).__name__} {cols['seq']}")
        report("payload", f"{type(cols['payload']).__name__} {cols['payload']}")
        report("lease_until", "aware datetime" if cols["lease_until"].tzinfo else "naive datetime")
        longer, = conn.execute("SELECT %s - clock_timestamp() > %s",
                               (cols["lease_until"], timedelta(minutes=4))).fetchone()
        report("timedelta lease", "over 4 minutes" if longer else "under 4 minutes")
        report("ack of a forged token", failure(conn, "SELECT outbox.ack(%s, %s)", ("py-worker", "forged")))
        report("ack", failure(conn, "SELECT outbox.ack(%s, %s)", ("py-worker", cols["token"])))
        again, = conn.execute(DECIDE, ("py-run", big_seq, "order_placed", "py-1", "py_kind",
                                       Jsonb({"n": 1}))).fetchone()
        report("same decision again", again)
        report("same command id", failure(
            conn, DECIDE, ("py-run", 2, "order_placed", "py-1", "py_kind", Jsonb({"n": 2}))))

        months, = conn.execute("SELECT '1 mon'::interval").fetchone()
        report("1 mon", f"{months.days} days")
        conn.execute("SET TimeZone = 'America/New_York'")
        naive, = conn.execute("SELECT %s = '2026-01-01 12:00:00+00'::timestamptz",
                              (datetime(2026, 1, 1, 12, 0),)).fetchone()
        aware, = conn.execute("SELECT %s = '2026-01-01 12:00:00+00'::timestamptz",
                              (datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc),)).fetchone()
        report("naive datetime is UTC", naive)
        report("aware datetime is UTC", aware)

        with conn.transaction():
            try:
                with conn.transaction():
                    conn.execute("SELECT outbox.ack(%s, %s)", ("py-worker", "forged"))
            except psycopg.Error as e:
                report("in a savepoint", e.sqlstate)
            report("after the savepoint", failure(conn, "SELECT 1", ()))


if __name__ == "__main__":
    main()
