"""A resharding worker that speaks only the PostgreSQL protocol (psycopg), until killed.

Run as a subprocess by ``test_resharding_wire.py``::

    python resharding_worker.py --port P --seed N [--member NAME] [--max-messages K]

It loops, as the YDB article's resharder does, with the data set of
``tests/engine/txn_worker.py`` (topic ``a`` by source, topic ``b`` by user)::

    BEGIN;
    SELECT data, message_group_id FROM TOPIC a WITH (consumer = 'mover', [member = NAME,]
        max_messages = k);                      -- rows come to this process
    INSERT INTO TOPIC b (data, message_group_id) VALUES ($1, $2), ...;   -- and go back
    COMMIT;

and retries a transaction that fails with 40001 (another worker moved the offsets
first, or this member's lease was handed on). With ``--member`` the worker joins the
consumer's group and reads only its leased partitions; without, it reads
optimistically and the offset check at COMMIT decides. An empty read rolls back and
polls again. Each commit prints ``commit <n>``, each retry ``retry``; any other error
ends the process with code 3 and a traceback on stderr.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback

import psycopg

IDLE_SLEEP_S = 0.05


def read_statement(member: str | None, count: int) -> str:
    member_option = "" if member is None else f", member = '{member}'"
    return (
        "SELECT data, message_group_id FROM TOPIC a WITH "
        f"(consumer = 'mover'{member_option}, max_messages = {count})"
    )


def write_statement(rows: int) -> str:
    return "INSERT INTO TOPIC b (data, message_group_id) VALUES " + ", ".join(["(%s, %s)"] * rows)


def move_once(conn: psycopg.Connection, member: str | None, count: int) -> int:
    """One transaction; the number of messages it moved (0: nothing to read)."""
    conn.execute("BEGIN")
    rows = conn.execute(read_statement(member, count)).fetchall()
    if not rows:
        conn.execute("ROLLBACK")
        return 0
    parameters = [value for row in rows for value in row]
    conn.execute(write_statement(len(rows)), parameters)
    conn.execute("COMMIT")
    return len(rows)


def run(port: int, member: str | None, rng: random.Random, max_messages: int) -> None:
    # psycopg's defaults: a repeated INSERT becomes a named prepared statement after 5
    # runs, and after a ROLLBACK psycopg sends DEALLOCATE ALL; both go through the server.
    with psycopg.connect(host="127.0.0.1", port=port, user="worker", autocommit=True,
                         connect_timeout=10) as conn:  # fmt: skip
        print("ready", flush=True)
        commits = 0
        while True:
            try:
                moved = move_once(conn, member, rng.randint(1, max_messages))
            except psycopg.errors.SerializationFailure:
                conn.execute("ROLLBACK")  # only a notice when COMMIT already ended it
                print("retry", flush=True)
                continue
            if moved:
                commits += 1
                print(f"commit {commits}", flush=True)
            else:
                time.sleep(IDLE_SLEEP_S)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--member")
    parser.add_argument("--max-messages", type=int, default=40)
    args = parser.parse_args()
    try:
        run(args.port, args.member, random.Random(args.seed), args.max_messages)
    except BaseException:
        sys.stderr.write(traceback.format_exc())
        sys.stderr.flush()
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
