"""`make demo`: the data pipeline on Spark, with the resharding query killed midway.

1. A server (``topicbase serve``: Postgres wire + Arrow Flight) starts on free loopback
   ports over a fresh data directory, with one user.
2. Simulated servers write JSON log lines into ``logs_by_server`` over Flight, in rounds,
   each round published exactly once (sink ``producers``, batch = round).
3. ``topicbase pipeline reshard`` (a Spark streaming query in its own process) moves them
   to ``logs_by_user``, partitioned by the line's user; it is killed with SIGKILL midway
   (JVM and Python workers: the whole process group) and started again from its checkpoint.
4. ``topicbase pipeline to-table`` folds ``logs_by_user`` into ``clicks_per_user``.
5. Checks: messages in = messages out, no duplicates, per-user order per server, table
   totals = messages per user; a table in the terminal and a PNG chart of throughput and
   lag over time (``<data-dir>/pipeline.png``). Exits non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict

import pyarrow as pa

from bench.demo_chart import write_chart
from spark_sql_ext.client import TopicbaseClient
from sql.pgwire.users import add_user, default_users_path

SERVERS, USERS = 8, 50
USER, PASSWORD = "demo", "demo-password"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def topicbase_command() -> list[str]:
    return [sys.executable, "-c", "import sys; from sql.console import main; sys.exit(main())"]


def start_server(data_dir: str, timeout_s: float = 30) -> tuple[subprocess.Popen, int, int]:
    """``topicbase serve`` on free loopback ports, in a process group of its own (stop it
    with ``kill_group``): (process, wire port, Flight port), once both accept."""
    wire, flight = free_port(), free_port()
    server = subprocess.Popen(
        [*topicbase_command(), "serve", "--data-dir", data_dir, "--host", "127.0.0.1",
         "--port", str(wire), "--flight-port", str(flight)],
        stdout=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with (contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", flight), 0.2),
              socket.create_connection(("127.0.0.1", wire), 0.2)):  # fmt: skip
            return server, wire, flight
        time.sleep(0.2)
    kill_group(server)
    raise SystemExit("the server did not start")


def pipeline(url: str, checkpoint: str, *arguments: str) -> subprocess.Popen:
    """A pipeline in a process group of its own, so a kill takes Spark's JVM with it. Its
    output (Spark's log, a killed query's stack traces) goes to ``<checkpoint>.log``, so
    the terminal shows the demo's progress only."""
    env = {**os.environ, "TOPICBASE_PASSWORD": PASSWORD}
    os.makedirs(os.path.dirname(checkpoint), exist_ok=True)
    with open(checkpoint + ".log", "a", encoding="utf-8") as log:
        return subprocess.Popen(
            [*topicbase_command(), "pipeline", "--url", url, "--user", USER, "--checkpoint",
             checkpoint, *arguments], env=env, start_new_session=True,
            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip


def kill_group(process: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    process.wait()


def user_of(server: int, seq: int) -> str:
    return f"user-{(server * 7919 + seq * 104729) % USERS:03d}"


def alive(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        raise SystemExit(f"the pipeline exited with status {process.returncode} (its log: "
                         "<checkpoint>.log under the data directory's checkpoints/)")


class Producers(threading.Thread):
    """Servers writing log lines in rounds; each round is one exactly-once Flight commit."""

    def __init__(self, url: str, rounds: int, lines_per_round: int, pause_s: float) -> None:
        super().__init__(daemon=True)
        self.url, self.rounds, self.lines = url, rounds, lines_per_round
        self.pause_s = pause_s
        self.written = 0

    def run(self) -> None:
        with TopicbaseClient(self.url, USER, PASSWORD) as client:
            for number in range(self.rounds):
                ids = []
                for server in range(SERVERS):
                    first = number * self.lines + 1
                    lines = [json.dumps({"server": f"srv-{server}", "seq": seq,
                                         "user": user_of(server, seq)})
                             for seq in range(first, first + self.lines)]  # fmt: skip
                    batch = pa.record_batch({
                        "data": pa.array([line.encode() for line in lines], pa.binary()),
                        "producer_id": pa.array([f"srv-{server}"] * len(lines)),
                        "seq_no": pa.array(range(first, first + len(lines)), pa.int64()),
                        "partition": pa.array([server % 4] * len(lines), pa.int64())})  # fmt: skip
                    ids.append(client.put({"topic": "logs_by_server"}, [batch], batch.schema))
                client.commit("producers", number, ids)
                self.written += SERVERS * self.lines
                time.sleep(self.pause_s)


def totals(client: TopicbaseClient, topic: str) -> int:
    return sum(b["end"] for b in client.partitions(topic))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="./demo-data/spark")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--lines-per-round", type=int, default=1000, help="per server")
    parser.add_argument("--pause", type=float, default=1.5, help="seconds between rounds")
    arguments = parser.parse_args()
    data_dir = os.path.abspath(arguments.data_dir)
    shutil.rmtree(data_dir, ignore_errors=True)
    os.makedirs(data_dir)
    add_user(default_users_path(data_dir), USER, PASSWORD, superuser=True)
    server, _, flight_port = start_server(data_dir)
    url = f"topicbase://127.0.0.1:{flight_port}"
    started = time.monotonic()
    try:
        return run(data_dir, url, arguments, started)
    finally:
        kill_group(server, signal.SIGTERM)


def run(data_dir: str, url: str, arguments: argparse.Namespace, started: float) -> int:
    client = TopicbaseClient(url, USER, PASSWORD)
    for statement in (
        "CREATE TOPIC logs_by_server (CONSUMER resharder) WITH (min_active_partitions = 4)",
        "CREATE TOPIC logs_by_user (CONSUMER counter) WITH (min_active_partitions = 4)",
        "CREATE TABLE clicks_per_user (user_id VARCHAR PRIMARY KEY, clicks BIGINT)",
    ):
        client.action("execute", {"sql": statement})
    total = SERVERS * arguments.rounds * arguments.lines_per_round
    print(f"topicbase serve at {url}; {SERVERS} servers will write {total:,} log lines")
    producers = Producers(url, arguments.rounds, arguments.lines_per_round, arguments.pause)
    producers.start()
    checkpoint = os.path.join(data_dir, "checkpoints")
    reshard_args = ("--interval", "1 second", "--max-per-trigger", "20000",
                    "--consumer", "resharder", "reshard", "logs_by_server", "logs_by_user",
                    "--key", "user")  # fmt: skip
    samples: list[tuple[float, int, int, int]] = []

    def sample(label: str) -> None:
        written, moved = totals(client, "logs_by_server"), totals(client, "logs_by_user")
        samples.append((time.monotonic() - started, written, moved, written - moved))
        print(f"  {samples[-1][0]:6.1f}s  {label:<22} in {written:>9,}  resharded {moved:>9,}"
              f"  lag {written - moved:>8,}", flush=True)  # fmt: skip

    worker = pipeline(url, os.path.join(checkpoint, "reshard"), *reshard_args)
    while totals(client, "logs_by_user") < total // 3:
        time.sleep(1)
        alive(worker)
        sample("reshard running")
    kill_group(worker)
    sample("reshard KILLED (-9)")
    events = [(samples[-1][0], "reshard killed (SIGKILL), restarted")]
    worker = pipeline(url, os.path.join(checkpoint, "reshard"), *reshard_args)
    while producers.is_alive():  # progress while the servers still write
        producers.join(timeout=1)
        alive(worker)
        sample("reshard restarted")
    while totals(client, "logs_by_user") < totals(client, "logs_by_server"):
        time.sleep(1)
        alive(worker)
        sample("reshard restarted")
    time.sleep(3)  # a batch in flight would publish more than in: give it the chance
    kill_group(worker, signal.SIGTERM)
    sample("reshard stopped")
    print("  to-table: folding logs_by_user into clicks_per_user", flush=True)
    folder = pipeline(url, os.path.join(checkpoint, "to_table"), "--once", "--consumer",
                      "counter", "to-table", "logs_by_user", "clicks_per_user", "--key",
                      "user", "--key-column", "user_id", "--count-column", "clicks")  # fmt: skip
    if folder.wait() != 0:
        print(f"to-table failed: see {os.path.join(checkpoint, 'to_table')}.log",
              file=sys.stderr)  # fmt: skip
        return 1
    ok = verify(client, total)
    chart = os.path.join(data_dir, "pipeline.png")
    write_chart(chart, samples, events)
    print(f"chart: {chart}  ({time.monotonic() - started:.0f} s in all)")
    print(f"Spark's own logs: {checkpoint}/*.log")
    client.close()
    return 0 if ok else 1


def verify(client: TopicbaseClient, total: int) -> bool:
    source = client.read_all({"topic": "logs_by_server", "columns": ["data"]})
    target = client.read_all({"topic": "logs_by_user", "columns": ["partition", "data"]})
    table = client.read_all({"table": "clicks_per_user"}).to_pylist()
    lines = [json.loads(d) for d in target.column("data").to_pylist()]
    partitions = target.column("partition").to_pylist()
    unique = {(m["server"], m["seq"]) for m in lines}
    ordered, placed = True, {}
    last: dict[tuple[str, str], int] = {}
    for partition, line in zip(partitions, lines, strict=True):
        ordered &= placed.setdefault(line["user"], partition) == partition
        key = (line["user"], line["server"])
        ordered &= line["seq"] > last.get(key, 0)
        last[key] = line["seq"]
    expected: dict[str, int] = defaultdict(int)
    for line in lines:
        expected[line["user"]] += 1
    folded = {r["user_id"]: r["clicks"] for r in table}
    checks = [
        ("messages written by the servers", total, source.num_rows),
        ("messages in logs_by_user", source.num_rows, target.num_rows),
        ("distinct (server, seq) in logs_by_user", source.num_rows, len(unique)),
        ("users, each in one partition, in order", len(expected), len(placed) if ordered else -1),
        ("clicks_per_user total", target.num_rows, sum(folded.values())),
        ("users whose total matches", len(expected),
         sum(folded.get(u) == n for u, n in expected.items())),
    ]  # fmt: skip
    print(f"\n{'check':<42}{'expected':>12}{'got':>12}")
    for label, want, got in checks:
        print(f"{label:<42}{want:>12,}{got:>12,}  {'ok' if want == got else 'FAILED'}")
    return all(want == got for _, want, got in checks)


if __name__ == "__main__":
    sys.exit(main())
