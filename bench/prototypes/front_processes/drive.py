"""A/B driver of the front-process prototype (docs/durable_produce.md, round 28).

``python bench/prototypes/front_processes/drive.py SECONDS REPS SIDE...`` from the tree's
root, SIDE one of ``postgres``, ``serve`` (``bench.served`` of this tree: today's
``topicbase serve``), ``reuseport:N`` and ``passed:N`` (the prototype: ``store.py`` and N
``front.py`` processes on one port with ``SO_REUSEPORT``, or behind ``acceptor.py``
handing connections over with SCM_RIGHTS), ``oneproc:1`` (the same store and one front's
loop on a thread of the store's process: one GIL), ``threads:1`` (``threaded.py``: the
same lean path on a thread per connection in one process); a third field (``reuseport:1:-10``)
renices every thread of the side's processes (a diagnostic of CPU share under load).

Every side is started once; then for REPS rounds, the sides in turn (the order reversed
every other round), 16 psycopg connections in this process (threads, as
``bench.streams_bench``'s ``produce.durable.c16``: new connections each round, one 1 KiB
message of the bench's pool per autocommit INSERT, psycopg preparing after five) send
for SECONDS. Per side and round: msgs/s, the server's CPU per message (utime + stime of
every process of the side, the store's and fronts' or PostgreSQL's postmaster and its
children, from ``/proc``, over the timed phase only), messages per fsync (the store's
``fs.fsync_count``; PostgreSQL's ``pg_stat_wal.wal_sync``), the ack p50 and p99 (ms)
the time its threads waited for a CPU per message (``wait_us``: run-queue delay from
``/proc/<pid>/task/*/schedstat``), and the first process's share of the CPU
(``first_us``: the store's, for the prototype). Then each side's medians and ranges.
"""

from __future__ import annotations

import abc
import functools
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psycopg

from bench import postgres
from bench.storage_bench import make_messages

HERE = os.path.dirname(os.path.abspath(__file__))
# The prototype's scripts import this tree's engine and storage (run from its root).
TREE = {**os.environ, "PYTHONPATH": os.getcwd()}
CLIENTS = 16
PARTITIONS = 4
TICK = os.sysconf("SC_CLK_TCK")


def tree_pids(roots: list[int]) -> list[int]:
    """The roots and every process descending from them."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                pass
    found, frontier = set(roots), list(roots)
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found.add(child)
                frontier.append(child)
    return sorted(found)


def cpu_of(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[pid] = (int(fields[11]) + int(fields[12])) / TICK
        except OSError:
            pass
    return out


def run_delay_s(pids: list[int]) -> float:
    """Seconds the processes' threads have waited on a run queue (``schedstat``)."""
    total = 0
    for pid in pids:
        for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
            try:
                with open(path) as f:
                    total += int(f.read().split()[1])
            except (OSError, IndexError):  # the thread ended meanwhile
                pass
    return total / 1e9


class Side(abc.ABC):
    """One server under test: how to connect, its fsync count, how to stop it."""

    name: str
    roots: list[int]

    @abc.abstractmethod
    def connect(self) -> Any: ...

    @abc.abstractmethod
    def fsyncs(self) -> int: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    def insert(self) -> str:
        return "INSERT INTO TOPIC t (data) VALUES (%s)"


def _ask(process: subprocess.Popen[str], line: str) -> str:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(line + "\n")
    process.stdin.flush()
    return process.stdout.readline()


def _stop(process: subprocess.Popen[str]) -> None:
    try:
        assert process.stdin is not None
        process.stdin.write("stop\n")
        process.stdin.close()
    except OSError:
        pass
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Fronts(Side):
    """The prototype: a store process and N fronts (``mode`` reuseport or passed)."""

    def __init__(self, mode: str, count: int, nice: int = 0) -> None:
        self.name = f"{mode}:{count}" + (f":{nice}" if nice else "")
        self.directory = tempfile.mkdtemp(prefix="front-proto-")
        sockets = tempfile.mkdtemp(prefix="front-proto-sock-")  # 0700
        self.sockets = sockets
        path = os.path.join(sockets, "store")
        self.port = postgres.free_port()
        inside = [str(self.port)] if mode == "oneproc" else []
        script = "store.py"
        if mode == "threads":
            script, path, inside = "threaded.py", str(self.port), []
        self.store = subprocess.Popen(
            [sys.executable, os.path.join(HERE, script), self.directory, path,
             str(PARTITIONS), *inside],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=TREE,
        )  # fmt: skip
        assert self.store.stdout is not None
        assert self.store.stdout.readline().strip() == "ready"
        self.fronts: list[subprocess.Popen[str]] = []
        self.acceptor: subprocess.Popen[str] | None = None
        if mode == "reuseport":  # ("oneproc" and "threads": no front process)
            for _ in range(count):
                front = subprocess.Popen(
                    [sys.executable, os.path.join(HERE, "front.py"), path, "reuseport",
                     str(self.port)],
                    stdout=subprocess.PIPE, text=True, env=TREE,
                )  # fmt: skip
                assert front.stdout is not None
                assert front.stdout.readline().strip() == "ready"
                self.fronts.append(front)
        elif mode == "passed":
            self.acceptor = subprocess.Popen(
                [sys.executable, os.path.join(HERE, "acceptor.py"), path, str(self.port),
                 str(count)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=TREE,
            )  # fmt: skip
            assert self.acceptor.stdout is not None
            assert self.acceptor.stdout.readline().strip() == "ready"
        self.roots = [self.store.pid] + [f.pid for f in self.fronts]
        if self.acceptor is not None:
            self.roots.append(self.acceptor.pid)
        if nice:  # a diagnostic: every thread of the side's processes reniced
            for pid in tree_pids(self.roots):
                for task in os.listdir(f"/proc/{pid}/task"):
                    os.setpriority(os.PRIO_PROCESS, int(task), nice)

    def connect(self) -> Any:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="bench", autocommit=True)

    def fsyncs(self) -> int:
        return int(json.loads(_ask(self.store, "stats"))["fsyncs"])

    def stop(self) -> None:
        for front in self.fronts:
            front.kill()
            front.wait()
        if self.acceptor is not None:
            _stop(self.acceptor)
        _stop(self.store)
        shutil.rmtree(self.directory, ignore_errors=True)
        shutil.rmtree(self.sockets, ignore_errors=True)


class Served(Side):
    """Today's wire server (``bench.served`` of this tree)."""

    def __init__(self, switch_ms: float | None = None) -> None:
        self.name = "serve" if switch_ms is None else f"serve:{switch_ms:g}"
        self.directory = tempfile.mkdtemp(prefix="front-proto-served-")
        command = [sys.executable, "-m", "bench.served", self.directory]
        if switch_ms is not None:  # the server's switch interval (a process's own choice stays)
            command[1:3] = ["-c", "import runpy, sys; sys.setswitchinterval(float(sys.argv[1]));"
                            " sys.argv[1:2] = []; runpy.run_module('bench.served',"
                            " run_name='__main__', alter_sys=True)", str(switch_ms / 1000)]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("port "), line
        self.port = int(line.split()[1])
        self.roots = [self.process.pid]
        with self.connect() as connection:
            connection.execute(f"CREATE TOPIC t WITH (min_active_partitions = {PARTITIONS})")

    def connect(self) -> Any:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="bench", autocommit=True)

    def fsyncs(self) -> int:
        return int(json.loads(_ask(self.process, "stats"))["fsyncs"])

    def stop(self) -> None:
        _stop(self.process)
        shutil.rmtree(self.directory, ignore_errors=True)


class Postgres(Side):
    """PostgreSQL as the bench runs it (durable defaults, a bigserial table)."""

    def __init__(self) -> None:
        self.name = "postgres"
        self.cluster = postgres.Cluster(log=lambda s: None).start()
        with psycopg.connect(self.cluster.dsn, autocommit=True) as connection:
            connection.execute("CREATE TABLE t (id BIGSERIAL PRIMARY KEY, data BYTEA NOT NULL)")
        pid = self.cluster._postmaster_pid()
        assert pid is not None
        self.roots = [pid]

    def insert(self) -> str:
        return "INSERT INTO t (data) VALUES (%s)"

    def connect(self) -> Any:
        return psycopg.connect(self.cluster.dsn, autocommit=True)

    def fsyncs(self) -> int:
        with psycopg.connect(self.cluster.dsn, autocommit=True) as connection:
            row = connection.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
            assert row is not None
            return int(row[0])

    def stop(self) -> None:
        self.cluster.stop()


def run(side: Side, seconds: float, pool: list[bytes]) -> dict[str, float]:
    connections = [side.connect() for _ in range(CLIENTS)]
    statement = side.insert()
    latencies: list[list[float]] = [[] for _ in range(CLIENTS)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(CLIENTS + 1)
    deadline = [0.0]

    def body(index: int) -> None:
        conn, mine, clock = connections[index], latencies[index], time.perf_counter
        barrier.wait()
        try:
            i = 0
            while clock() < deadline[0]:
                started = clock()
                conn.execute(statement, [pool[(index * 1_000_003 + i) % len(pool)]])
                mine.append(clock() - started)
                i += 1
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    fsyncs = side.fsyncs()
    pids = tree_pids(side.roots)
    before, waited = cpu_of(pids), run_delay_s(pids)
    start = time.perf_counter()
    deadline[0] = start + seconds
    barrier.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    after, waited = cpu_of(pids), run_delay_s(pids) - waited
    fsyncs = side.fsyncs() - fsyncs
    for conn in connections:
        conn.close()
    if errors:
        raise errors[0]
    acks = np.concatenate([np.array(x) for x in latencies])
    count = len(acks)
    cpu = sum(after[p] - before.get(p, 0.0) for p in after)
    first = side.roots[0]
    return {
        "first_us": (after.get(first, 0.0) - before.get(first, 0.0)) / count * 1e6,
        "count": count,
        "wait_us": waited / count * 1e6,
        "rate": count / elapsed,
        "cpu_us": cpu / count * 1e6,
        "per_fsync": count / max(1, fsyncs),
        "p50": float(np.percentile(acks, 50)) * 1000,
        "p99": float(np.percentile(acks, 99)) * 1000,
    }


def main(argv: list[str]) -> None:
    seconds, reps = float(argv[0]), int(argv[1])
    makers: dict[str, Callable[[], Side]] = {}
    for spec in argv[2:]:
        if spec == "postgres":
            makers[spec] = Postgres
        elif spec == "serve":
            makers[spec] = Served
        elif spec.startswith("serve:"):  # serve:MS, the server's switch interval in ms
            makers[spec] = functools.partial(Served, float(spec.split(":")[1]))
        else:
            mode, count, *nice = spec.split(":")
            makers[spec] = lambda mode=mode, count=int(count), nice=nice: Fronts(
                mode, count, int(nice[0]) if nice else 0
            )
    pool = make_messages()
    sides: list[Side] = []
    try:
        for make in makers.values():
            sides.append(make())
        acked = {side.name: 0 for side in sides}
        for side in sides:  # warm-up: code paths, the first psycopg prepares
            acked[side.name] += int(run(side, 0.5, pool)["count"])
        results: dict[str, list[dict[str, float]]] = {s.name: [] for s in sides}
        for rep in range(reps):
            for side in sides if rep % 2 == 0 else sides[::-1]:
                out = run(side, seconds, pool)
                results[side.name].append(out)
                acked[side.name] += int(out["count"])
                print(side.name, rep, {k: round(v, 2) for k, v in out.items()},
                      time.strftime("%H:%M:%S", time.gmtime()), flush=True)  # fmt: skip
        with open("/proc/loadavg") as f:
            print("load", f.read().strip(), flush=True)
        for side in sides:  # every acked message is in the topic, read back
            if isinstance(side, Fronts):
                stored = json.loads(_ask(side.store, "count"))["stored"]
                print("CHECK", side.name, "acked", acked[side.name], "stored", stored,
                      flush=True)  # fmt: skip
                assert stored == acked[side.name], "an acked message is missing"
        for name, rows in results.items():
            median = {k: round(float(np.median([r[k] for r in rows])), 2) for k in rows[0]}
            low = {k: round(min(r[k] for r in rows), 1) for k in rows[0]}
            high = {k: round(max(r[k] for r in rows), 1) for k in rows[0]}
            print("MEDIAN", name, median, "min", low, "max", high, flush=True)
    finally:
        for side in sides:
            side.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
