"""`make demo`: YDB's resharding scenario in SQL, with a worker killed midway.

1. Simulated servers write JSON log lines into ``logs_by_server`` (each server
   a producer id with sequence numbers, so resends are skipped).
2. A resharding worker (a subprocess) moves them to ``logs_by_user``,
   partitioned by the user id in each line, in transactions: read a range with
   consumer ``resharder``, write it, commit. It is killed with SIGKILL midway
   and started again.
3. A second worker folds ``logs_by_user`` into the DuckDB table
   ``clicks_per_user``, one transaction per chunk.
4. The demo checks: messages in = messages out, no duplicates, per-user
   order kept, table totals = messages; and exits non-zero if not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict

from engine.database import Database
from storage.errors import SerializationFailure

SERVERS = 8
USERS = 50
RESHARD = (
    "INSERT INTO TOPIC logs_by_user (data, message_group_id) "
    "SELECT data, json_extract_string(CAST(data AS VARCHAR), '$.user') "
    "FROM TOPIC logs_by_server WITH (consumer = 'resharder', max_messages = {chunk})"
)
FOLD = (
    "INSERT INTO clicks_per_user "
    "SELECT message_group_id, count(*) FROM TOPIC logs_by_user "
    "WITH (consumer = 'counter', max_messages = {chunk}) GROUP BY 1 "
    "ON CONFLICT (user_id) DO UPDATE SET clicks = clicks + EXCLUDED.clicks"
)


def setup(data_dir: str, lines_per_server: int) -> int:
    db = Database.open(data_dir)
    session = db.connect()
    session.execute(
        "CREATE TOPIC logs_by_server (CONSUMER resharder WITH (important = true)) "
        "WITH (min_active_partitions = 4);"
        "CREATE TOPIC logs_by_user (CONSUMER counter WITH (important = true)) "
        "WITH (min_active_partitions = 4);"
        "CREATE TABLE clicks_per_user (user_id VARCHAR PRIMARY KEY, clicks BIGINT)"
    )
    total = 0
    for server in range(SERVERS):
        rows = []
        for seq in range(1, lines_per_server + 1):
            user = f"user-{(server * 7919 + seq * 104729) % USERS:03d}"
            line = json.dumps({"server": f"srv-{server}", "seq": seq, "user": user})
            rows.append(f"('{line}', 'srv-{server}', {seq})")
        for start in range(0, len(rows), 500):
            values = ", ".join(rows[start : start + 500])
            session.execute(
                f"INSERT INTO TOPIC logs_by_server (data, producer_id, seq_no) VALUES {values}"
            )
        # A server that lost its acknowledgement resends its last 100 lines: skipped.
        values = ", ".join(rows[-100:])
        result = session.execute(
            f"INSERT INTO TOPIC logs_by_server (data, producer_id, seq_no) VALUES {values}"
        )[0]
        assert result.tag == "INSERT 0 0", result.tag
        total += lines_per_server
    session.close()
    db.close()
    return total


def work(data_dir: str, statement: str, chunk: int) -> None:
    """Run ``statement`` in transactions until nothing is left; print progress."""
    db = Database.open(data_dir)
    session = db.connect()
    moved = 0
    transactions = 0
    while True:
        try:
            session.execute("BEGIN")
            result = session.execute(statement.format(chunk=chunk))[0]
            session.execute("COMMIT")
        except SerializationFailure:
            session.execute("ROLLBACK")
            continue
        count = int(result.tag.split()[-1])
        if count == 0:
            break
        moved += count
        transactions += 1
        print(f"progress {transactions} {moved}", flush=True)
    session.close()
    db.close()
    print("done", flush=True)


def run_worker(data_dir: str, kind: str, kill_after_transactions: int | None) -> bool:
    """Start a worker subprocess; SIGKILL it after that many committed transactions."""
    command = [
        sys.executable,
        "-m",
        "bench.demo_pipeline",
        "--data-dir",
        data_dir,
        "--worker",
        kind,
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if not line.startswith("progress"):
            continue
        transactions, rows = (int(x) for x in line.split()[1:])
        if transactions % 10 == 0:
            print(f"  {kind}: {transactions} transactions committed, {rows} rows", flush=True)
        if kill_after_transactions is not None and transactions >= kill_after_transactions:
            process.send_signal(signal.SIGKILL)
            process.wait()
            print(f"  {kind}: killed with SIGKILL after {transactions} transactions")
            return False
    process.wait()
    print(f"  {kind}: finished (exit {process.returncode})")
    return process.returncode == 0


def verify(data_dir: str, total: int) -> bool:
    db = Database.open(data_dir)
    session = db.connect()
    rows = session.execute(
        'SELECT partition, "offset", message_group_id AS user_id, CAST(data AS VARCHAR) AS line '
        'FROM TOPIC logs_by_user WITH (max_messages = 1000000) ORDER BY partition, "offset"'
    )[0].table.to_pylist()
    seen = set()
    duplicates = 0
    last_seq: dict[tuple[str, str], int] = defaultdict(int)
    order_broken = 0
    for row in rows:
        line = json.loads(row["line"])
        key = (line["server"], line["seq"])
        duplicates += key in seen
        seen.add(key)
        pair = (row["user_id"], line["server"])
        order_broken += line["seq"] < last_seq[pair]
        last_seq[pair] = line["seq"]
    clicks = session.execute("SELECT sum(clicks) AS n FROM clicks_per_user")[0].table
    clicked = clicks.column("n")[0].as_py() or 0
    session.close()
    db.close()
    print(
        f"messages in: {total}, out: {len(rows)}, distinct: {len(seen)}, "
        f"duplicates: {duplicates}, per-user order violations: {order_broken}, "
        f"clicks counted: {clicked}"
    )
    return len(rows) == total == len(seen) == clicked and duplicates == 0 == order_broken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", default="./demo-data/sql")
    parser.add_argument("--lines-per-server", type=int, default=2500)
    parser.add_argument("--worker", choices=("reshard", "fold"))
    args = parser.parse_args()
    if args.worker == "reshard":
        work(args.data_dir, RESHARD, 500)
        return
    if args.worker == "fold":
        work(args.data_dir, FOLD, 1000)
        return
    shutil.rmtree(args.data_dir, ignore_errors=True)
    os.makedirs(args.data_dir)
    started = time.monotonic()
    print(f"Writing {SERVERS} servers x {args.lines_per_server} log lines into logs_by_server")
    total = setup(args.data_dir, args.lines_per_server)
    print("Resharding logs_by_server -> logs_by_user (by user) in transactions")
    run_worker(args.data_dir, "reshard", total // 500 // 2)
    print("  restarting the resharding worker")
    finished = run_worker(args.data_dir, "reshard", None)
    print("Folding logs_by_user into the table clicks_per_user")
    run_worker(args.data_dir, "fold", 5)
    print("  restarting the folding worker")
    finished = run_worker(args.data_dir, "fold", None) and finished
    ok = verify(args.data_dir, total) and finished
    print(f"{'OK' if ok else 'FAILED'} in {time.monotonic() - started:.1f} s")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
