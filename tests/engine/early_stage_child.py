"""A process that moves messages topic -> topic and counts them in a table, for
``test_early_stage.py``: each transaction's topic write is staged early (at the upsert).

    python early_stage_child.py DATA_DIR TRANSACTIONS [rollback-every]

Creates topics ``a`` (consumer ``c``, 100 messages over 2 partitions) and ``b`` and table
``counters`` if needed, then runs TRANSACTIONS times ``BEGIN; INSERT INTO TOPIC b SELECT
FROM TOPIC a (consumer c, 7 messages); upsert of counters row 'moved' by the number
moved; COMMIT`` (with ``rollback-every`` N, every N-th ends in ROLLBACK instead), then
runs a checkpoint and closes. Crash points come from ``TOPICBASE_FAILPOINTS`` (exit 137);
a clean run prints ``done`` and exits 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.database import Database

MESSAGES = 100
MOVE = (
    "INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a "
    "WITH (consumer = 'c', max_messages = 7)"
)
UPSERT = "INSERT INTO counters VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n"


def setup(database: Database) -> None:
    session = database.connect()
    try:
        exists = session.execute("SELECT count(*) FROM duckdb_tables() "
                                 "WHERE table_name = 'counters'")[-1]  # fmt: skip
        assert exists.table is not None
        if exists.table.column(0)[0].as_py():
            return
        session.execute(
            "CREATE TOPIC a (CONSUMER c) WITH (min_active_partitions = 2); "
            "CREATE TOPIC b WITH (min_active_partitions = 2); "
            "CREATE TABLE counters (k VARCHAR PRIMARY KEY, n BIGINT NOT NULL)"
        )
        values = ", ".join(f"('m{i:03d}', {i % 2})" for i in range(MESSAGES))
        session.execute(f"INSERT INTO TOPIC a (data, partition) VALUES {values}")
    finally:
        session.close()


def main(argv: list[str]) -> int:
    data, transactions = argv[0], int(argv[1])
    rollback_every = int(argv[2]) if len(argv) > 2 else 0
    database = Database.open(data)
    setup(database)
    session = database.connect()
    for number in range(1, transactions + 1):
        session.execute("BEGIN")
        tag = session.execute(MOVE)[-1].tag
        moved = int(tag.split()[-1])
        session.execute(UPSERT, ["moved", moved])
        if rollback_every and number % rollback_every == 0:
            session.execute("ROLLBACK")
        else:
            session.execute("COMMIT")
    session.close()
    database.committer.checkpoint()
    database.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
