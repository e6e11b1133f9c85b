"""Spread-write worker: autocommit INSERTs over many partitions until killed, journaled.

Run as a subprocess by ``test_spread_append_crash.py`` (and importable for its checks)::

    python spread_worker.py --data DIR --journal FILE --statements N [--checkpoint-every N]

Statement ``n`` is one autocommit ``INSERT INTO TOPIC t (data, producer_id, seq_no)
SELECT unnest(?), unnest(?), unnest(?) RETURNING status`` of ``PRODUCERS`` x
``PER_PRODUCER`` messages: producer ``p<k>`` sends seq_nos ``PER_PRODUCER * n + r``
with data ``<n>:<k>:<r>``. The producers are bound round-robin over ``PARTITIONS``
partitions, so every statement spreads over all of them and commits through the
staging log (``engine.spread_append``).

The journal (one ``os.write`` per line on an ``O_APPEND`` descriptor: a SIGKILL cannot
tear it) holds ``I <n>`` before statement ``n`` runs and ``A <n>`` once it returned.
On start the worker resends every statement with an intent and no ack, as a producer
that did not learn the outcome would: the statement must come back wholly written (it
was absent) or wholly duplicate (it was there); a mix means it was half there, and the
worker exits with code 3 and ``FAIL`` on stderr. Then it runs ``--statements`` new ones.

Stdout gets ``ready`` once the database is open (recovery done) and ``done`` after a
clean close. Crash points come from outside: SIGKILL, or ``TOPICBASE_FAILPOINTS``
(``name=crash@n``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine import commit as commit_module
from sql import dbapi

PARTITIONS = 8
PRODUCERS = 24
PER_PRODUCER = 3
INSERT = (
    "INSERT INTO TOPIC t (data, producer_id, seq_no) SELECT unnest(?), unnest(?), unnest(?) "
    "RETURNING status"
)


def statement_rows(n: int) -> tuple[list[str], list[str], list[int]]:
    data, producers, seq_nos = [], [], []
    for k in range(PRODUCERS):
        for r in range(PER_PRODUCER):
            data.append(f"{n}:{k}:{r}")
            producers.append(f"p{k}")
            seq_nos.append(PER_PRODUCER * n + r)
    return data, producers, seq_nos


def read_journal(path: str) -> tuple[set[int], set[int]]:
    intents: set[int] = set()
    acks: set[int] = set()
    if not os.path.exists(path):
        return intents, acks
    with open(path) as file:
        for line in file:
            parts = line.split()
            if len(parts) != 2 or not parts[1].isdigit():
                continue  # a torn last line
            (intents if parts[0] == "I" else acks).add(int(parts[1]))
    return intents, acks


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--journal", required=True)
    parser.add_argument("--statements", type=int, default=20)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    args = parser.parse_args(argv)
    if args.checkpoint_every:
        commit_module.CHECKPOINT_TRANSACTIONS = args.checkpoint_every
    journal = os.open(args.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    connection = dbapi.connect(args.data, autocommit=True)
    cursor = connection.cursor()
    cursor.execute("SHOW TOPICS")
    if "t" not in {row[0] for row in cursor.fetchall()}:
        cursor.execute(f"CREATE TOPIC t WITH (min_active_partitions = {PARTITIONS})")
    os.write(1, b"ready\n")
    intents, acks = read_journal(args.journal)
    for n in sorted(intents - acks):
        cursor.execute(INSERT, list(statement_rows(n)))
        statuses = {row[0] for row in cursor.fetchall()}
        if len(statuses) != 1:
            os.write(2, f"FAIL statement {n} was half there: {statuses}\n".encode())
            return 3
        os.write(journal, f"A {n}\n".encode())
    first = max(intents, default=-1) + 1
    for n in range(first, first + args.statements):
        os.write(journal, f"I {n}\n".encode())
        cursor.execute(INSERT, list(statement_rows(n)))
        statuses = {row[0] for row in cursor.fetchall()}
        if statuses != {"written"}:
            os.write(2, f"FAIL new statement {n}: {statuses}\n".encode())
            return 3
        os.write(journal, f"A {n}\n".encode())
    connection.close()
    os.write(1, b"done\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
