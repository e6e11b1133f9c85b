"""A/B probe of durable produce over the wire (docs/durable_produce.md, round 6).

``python bench/prototypes/wire_loop/probe.py CLIENTS SECONDS REPS NAME=TREE[,VAR:VALUE]...``

Starts ``bench.served`` of each git worktree TREE (its own process, environment
variables VAR=VALUE added), then for REPS rounds, the sides alternated (A B, B A, ...),
runs CLIENTS psycopg connections in this process, each sending one 1 KiB message per
autocommit ``INSERT INTO TOPIC t (data) VALUES (%s)`` for SECONDS. Per side and round:
msgs/s, the server's CPU per message (utime+stime from ``/proc``, us), its context
switches per message (every thread's ``voluntary`` + ``nonvoluntary``), messages per
fsync (``bench.served``'s counter), the ack p50 (ms) and the clients' CPU per message
(this process, us); then the medians. The topic
has ``PARTS`` partitions (environment, default 4, as the bench).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np
import psycopg

PYTHON = sys.executable
INSERT = "INSERT INTO TOPIC t (data) VALUES (%s)"


def process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def context_switches(pid: int) -> int:
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            with open(path) as f:
                total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    return total


class Served:
    """``bench.served`` of one tree, with a topic ``t``."""

    def __init__(
        self,
        tree: str,
        environment: dict[str, str],
        script: list[str] | None = None,
        prefix: str = "wire-loop-probe-",
    ) -> None:
        """``script``: what the interpreter runs instead of ``-m bench.served``, with
        ``{directory}`` standing for the data directory (an instrumented server that
        prints ``port N`` first, as ``bench.served`` does)."""
        self.directory = tempfile.mkdtemp(prefix=prefix)
        argv = [a.replace("{directory}", self.directory) for a in script or
                ["-m", "bench.served", "{directory}"]]  # fmt: skip
        self.process = subprocess.Popen(
            [PYTHON, *argv], cwd=tree, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, **environment},
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("port "), line
        self.port = int(line.split()[1])
        partitions = int(os.environ.get("PARTS", "4"))
        with self.connect() as connection:
            connection.execute(f"CREATE TOPIC t WITH (min_active_partitions = {partitions})")

    def connect(self) -> Any:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="bench", autocommit=True)

    def fsyncs(self) -> int:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("stats\n")
        self.process.stdin.flush()
        return int(json.loads(self.process.stdout.readline())["fsyncs"])

    def stop(self) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write("stop\n")
            self.process.stdin.close()
        except OSError:
            pass
        self.process.wait(60)
        shutil.rmtree(self.directory, ignore_errors=True)


def run(served: Served, clients: int, seconds: float) -> dict[str, float]:
    message = os.urandom(1024)
    connections = [served.connect() for _ in range(clients)]
    for connection in connections:  # warm: psycopg prepares after five executions
        for _ in range(6):
            connection.execute(INSERT, [message])
    acks: list[list[float]] = [[] for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)
    deadline = [0.0]
    errors: list[BaseException] = []

    def body(index: int) -> None:
        connection, mine, clock = connections[index], acks[index], time.perf_counter
        barrier.wait()
        try:
            while clock() < deadline[0]:
                started = clock()
                connection.execute(INSERT, [message])
                mine.append(clock() - started)
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    pid = served.process.pid
    fsyncs, cpu, switches = served.fsyncs(), process_cpu_s(pid), context_switches(pid)
    client_cpu = time.process_time()
    started = time.perf_counter()
    deadline[0] = started + seconds
    barrier.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    client_cpu = time.process_time() - client_cpu
    cpu, switches = process_cpu_s(pid) - cpu, context_switches(pid) - switches
    fsyncs = served.fsyncs() - fsyncs
    for connection in connections:
        connection.close()
    if errors:
        raise errors[0]
    latencies = np.concatenate([np.array(a) for a in acks])
    count = len(latencies)
    return {
        "rate": count / elapsed,
        "cpu_us": cpu / count * 1e6,
        "ctx": switches / count,
        "per_fsync": count / max(1, fsyncs),
        "p50": float(np.percentile(latencies, 50)) * 1000,
        "p99": float(np.percentile(latencies, 99)) * 1000,
        "client_us": client_cpu / count * 1e6,
    }


def main(argv: list[str]) -> None:
    clients, seconds, reps = int(argv[0]), float(argv[1]), int(argv[2])
    sides = []
    for spec in argv[3:]:
        name, rest = spec.split("=", 1)
        tree, *pairs = rest.split(",")
        sides.append((name, tree, dict(pair.split(":", 1) for pair in pairs)))
    servers = {name: Served(tree, environment) for name, tree, environment in sides}
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in sides}
    try:
        for rep in range(reps):
            for name, _, _ in sides if rep % 2 == 0 else sides[::-1]:
                out = run(servers[name], clients, seconds)
                results[name].append(out)
                print(name, rep, {k: round(v, 2) for k, v in out.items()}, flush=True)
    finally:
        for served in servers.values():
            served.stop()
    print_medians(results, 1)


def print_medians(results: dict[str, list[dict[str, float]]], digits: int) -> None:
    """Each side's median, min and max of every figure over its repetitions."""
    for name, rows in results.items():
        median = {k: round(float(np.median([r[k] for r in rows])), 2) for k in rows[0]}
        low = {k: round(min(r[k] for r in rows), digits) for k in rows[0]}
        high = {k: round(max(r[k] for r in rows), digits) for k in rows[0]}
        print("MEDIAN", name, median, "min", low, "max", high, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
