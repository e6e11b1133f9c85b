"""One chaos workload process: random producer writes, movers and table appends.

Run by ``tests.sim.chaos`` until it is killed (SIGKILL at a random moment, or a
failpoint crashing it) or its time is up. Every acknowledged effect is recorded
in the shared history file (see ``tests.sim.history``) before the next one:

- producer writes to ``src`` with producer ids and seq_nos (exactly-once
  publish), and writes without a producer id (no dedup), with RETURNING;
- *mover* transactions: read ``src`` with consumer ``mover`` and write each
  message's value to ``dst`` as ``m:<value>@<txn id>`` (exactly-once resharding:
  the runner checks every consumed value arrives once);
- *tabler* transactions: read ``dst`` with consumer ``tabler`` and append
  ``x:<value>#<txn id>`` to rows of the table ``lists`` (list-append keys
  ``r:<row>``), reading some rows too; the runner checks every consumed
  message lands in the table exactly once.

A transaction logs an ``invoke`` with its planned ops before COMMIT; if the
process dies there, the runner turns it into an ``info`` transaction.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import time

from engine.database import Database
from storage.errors import SerializationFailure, TopicbaseError
from tests.sim.history import HistoryWriter, append_op, load, read_op, row_key, topic_key

PRODUCERS = ("p0", "p1", "p2", "p3")
ROWS = ("a", "b", "c", "d", "e")


def setup(data_dir: str) -> None:
    """Create the topics and the table (idempotent)."""
    db = Database.open(data_dir)
    session = db.connect()
    try:
        session.execute(
            "CREATE TOPIC IF NOT EXISTS src (CONSUMER mover WITH (important = true)) "
            "WITH (min_active_partitions = 3);"
            "CREATE TOPIC IF NOT EXISTS dst (CONSUMER tabler WITH (important = true)) "
            "WITH (min_active_partitions = 3);"
            "CREATE TABLE IF NOT EXISTS lists (k VARCHAR PRIMARY KEY, v VARCHAR)"
        )
    finally:
        session.close()
        db.close()


class Worker:
    def __init__(self, data_dir: str, history_path: str, cycle: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.cycle = cycle
        self.history = HistoryWriter(history_path, f"worker-{cycle}")
        self.seq_nos = _next_seq_nos(history_path)
        self.counter = 0
        self.db = Database.open(data_dir)
        self.session = self.db.connect()

    def run(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        actions = (self.produce, self.produce, self.write_plain, self.move, self.tabulate)
        while time.monotonic() < deadline:
            self.rng.choice(actions)()
        self.session.close()
        self.db.close()

    def _value(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.cycle}.{self.counter}"

    # -- producers ------------------------------------------------------------------------
    def produce(self) -> None:
        producer = self.rng.choice(PRODUCERS)
        count = self.rng.randint(1, 5)
        rows = []
        for _ in range(count):
            seq_no = self.seq_nos.get(producer, 0) + self.rng.randint(1, 2)  # gaps allowed
            self.seq_nos[producer] = seq_no
            rows.append((producer, seq_no))
            self.history.invoke("src", producer, seq_no)
        values = ", ".join(f"('{p}:{s}', '{p}', {s})" for p, s in rows)
        result = self.session.execute(
            f"INSERT INTO TOPIC src (data, producer_id, seq_no) VALUES {values} "
            'RETURNING partition, "offset", status'
        )[0]
        for (producer, seq_no), row in zip(rows, result.table.to_pylist(), strict=True):
            offset = row["offset"] if row["offset"] >= 0 else None
            self.history.ack(
                "src", producer, seq_no, row["partition"], offset, status=row["status"]
            )

    def write_plain(self) -> None:
        value = self._value("np")
        self.history.invoke("src", None, None, value=value)
        result = self.session.execute(
            f"INSERT INTO TOPIC src (data) VALUES ('{value}') RETURNING partition, \"offset\""
        )[0]
        row = result.table.to_pylist()[0]
        self.history.ack("src", None, None, row["partition"], row["offset"], value=value)

    # -- transactions ----------------------------------------------------------------------
    def move(self) -> None:
        limit = self.rng.randint(1, 20)
        txn_id = self._value("T")
        self.session.execute("BEGIN")
        try:
            read = self.session.execute(
                'SELECT partition, "offset", CAST(data AS VARCHAR) AS v FROM TOPIC src '
                f"WITH (consumer = 'mover', max_messages = {limit})"
            )[0].table.to_pylist()
            ops = _topic_reads("src", read, limit)
            # Unique per transaction: a move retried after an abort is another write.
            moved = [f"m:{row['v']}@{txn_id}" for row in read]
            if moved:
                values = ", ".join(f"('{v}')" for v in moved)
                self.session.execute(f"INSERT INTO TOPIC dst (data) VALUES {values}")
            ops += [append_op(topic_key("dst"), v) for v in moved]
            self._commit(txn_id, ops)
        except TopicbaseError:
            self._abort(txn_id)

    def tabulate(self) -> None:
        limit = self.rng.randint(1, 10)
        txn_id = self._value("T")
        self.session.execute("BEGIN")
        try:
            read = self.session.execute(
                'SELECT partition, "offset", CAST(data AS VARCHAR) AS v FROM TOPIC dst '
                f"WITH (consumer = 'tabler', max_messages = {limit})"
            )[0].table.to_pylist()
            ops = _topic_reads("dst", read, limit)
            for row in read:
                key = self.rng.choice(ROWS)
                value = f"x:{row['v']}#{txn_id}"  # unique per transaction
                self.session.execute(
                    "INSERT INTO lists VALUES (?, ?) ON CONFLICT (k) DO UPDATE "
                    "SET v = lists.v || ',' || EXCLUDED.v",
                    [key, value],
                )
                ops.append(append_op(row_key(key), value))
            for key in self.rng.sample(ROWS, 2):
                found = self.session.execute("SELECT v FROM lists WHERE k = ?", [key])[0]
                rows = found.table.to_pylist()
                ops.append(read_op(row_key(key), rows[0]["v"].split(",") if rows else []))
            self._commit(txn_id, ops)
        except TopicbaseError:
            self._abort(txn_id)

    def _commit(self, txn_id: str, ops: list) -> None:
        """COMMIT and record the outcome: ok, fail (40001) or info (any other error:
        the commit point may have been passed)."""
        self.history.record("invoke", id=txn_id, ops=ops)
        try:
            tag = self.session.execute("COMMIT")[0].tag
        except SerializationFailure:
            self.history.txn(txn_id, "fail", ops)
            return
        except TopicbaseError:
            self.history.txn(txn_id, "info", ops)
            return
        self.history.txn(txn_id, "ok" if tag == "COMMIT" else "fail", ops)

    def _abort(self, txn_id: str) -> None:
        """A statement before COMMIT failed: nothing of the transaction happened."""
        with contextlib.suppress(TopicbaseError):
            self.session.execute("ROLLBACK")
        self.history.txn(txn_id, "fail", [])


def _topic_reads(topic: str, rows: list[dict], limit: int) -> list:
    """One consumer-read op per partition read, with its start offset."""
    by_partition: dict[int, list[dict]] = {}
    for row in rows:
        by_partition.setdefault(row["partition"], []).append(row)
    complete = len(rows) < limit
    return [
        read_op(topic_key(topic, p), [r["v"] for r in part], part[0]["offset"], complete)
        for p, part in sorted(by_partition.items())
    ]


def _next_seq_nos(history_path: str) -> dict[str, int]:
    """Largest seq_no each producer has used in the history: continue above it."""
    seq_nos: dict[str, int] = {}
    try:
        events = load(history_path)
    except FileNotFoundError:
        return seq_nos
    for event in events:
        if event.get("type") == "invoke" and event.get("producer"):
            producer = event["producer"]
            seq_nos[producer] = max(seq_nos.get(producer, 0), int(event["seq_no"]))
    return seq_nos


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--cycle", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    worker = Worker(args.data_dir, args.history, args.cycle, args.seed)
    print(json.dumps({"ready": True}), flush=True)
    worker.run(args.seconds)


if __name__ == "__main__":
    main()
