"""CPU per consumer read over the wire: client and server, Topicbase against PostgreSQL.

``python -m bench.consume_cpu [reads per round] [rounds] [--base TREE] [--only WORD,...]``
(default 100 x 5). The ways of
``bench.pgwire_bench``'s ``consume.wire`` (reads of 1000 x 1 KiB through psycopg):
Topicbase with binary results and with ``COPY (...) TO STDOUT (FORMAT arrow)`` decoded by
pyarrow, PostgreSQL 15's log-table consumer with binary results and with a binary COPY,
alternated (``orders``: rotated, every other cycle backwards), every way ``reads`` reads
per round. For each way and round:
the client's CPU (``time.process_time`` of this process) and the server's (``topicbase
serve``'s process, PostgreSQL's backend of the connection; its threads' run time in
``/proc/<pid>/task/*/schedstat``, Linux only) per read, and the wall clock per read, printed
as medians with min-max (``total`` is client + server CPU).

``--base TREE`` also starts ``topicbase serve`` from another checkout (e.g. ``git worktree
add /tmp/base <rev>``) and adds its binary-results and COPY ways (named ``base``), alternated
with the others: a before/after comparison in one run. ``--only`` keeps the ways whose
names contain one of the words (e.g. ``--only binary``).

Why CPU: on the shared 2-core machines the wall clock of a quick run swung 5-8x within
one run (load average 8-11), while CPU per read holds still; with one client and one
server taking turns, a read's wall time on an idle machine is about its CPU total.
Not part of ``bench.run``: a diagnostic, its figures are quoted in docs/copy_arrow.md.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench import postgres
from bench.pgwire_bench import (
    PG_SETUP,
    ROWS_PER_STATEMENT,
    consume_sql,
    copy_arrow_consumer,
    insert_sql,
    postgres_consumer,
    postgres_copy_consumer,
)
from bench.results import REPO_DIR
from bench.storage_bench import make_messages

CONSUMERS = ("c_binary", "c_arrow")


def process_cpu_s(pid: int) -> float:
    """CPU seconds of the live threads of process ``pid`` so far: their run time from
    ``/proc/<pid>/task/*/schedstat``, in nanoseconds (``stat``'s clock ticks of 10 ms were
    a tenth of a round's figure per read). A thread that ends within a round takes its
    time with it; the threads that serve a read (the connection's, the staging log's)
    live through the run."""
    total_ns = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        path = f"/proc/{pid}/task/{task}/schedstat"
        with contextlib.suppress(FileNotFoundError, ProcessLookupError), open(path) as stat:
            total_ns += int(stat.read().split()[0])
    return total_ns / 1e9


@contextlib.contextmanager
def serve(directory: str, tree: str = REPO_DIR) -> Iterator[tuple[int, int]]:
    """``topicbase serve`` of the checkout ``tree`` on a free loopback port: (pid, port)."""
    code = "import sys; from sql.console import main; sys.exit(main(sys.argv[1:]))"
    command = [sys.executable, "-c", code, "--data-dir", directory, "serve", "--host",
               "127.0.0.1", "--port", "0", "--flight-port", "0", "--auth", "trust"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=tree)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "serving" not in line:
            raise RuntimeError(f"topicbase serve did not start: {line!r}")
        yield process.pid, int(line.rsplit(":", 1)[1])
    finally:
        process.terminate()
        process.wait()


def orders(names: list[str], rounds: int) -> Iterator[list[str]]:
    """The ways' order in each round: rotated by one a round, and every other cycle of
    rotations backwards, so that each way runs first, last, and after each other way
    alike. With plain rotation the same way always follows the same other one (the first
    listed follows PostgreSQL's): in an A/B of two trees run in both orders, the tree
    listed first looked 0.2-0.4 ms of server CPU slower either way."""
    count = len(names)
    for index in range(rounds):
        shift = index % count
        order = names[shift:] + names[:shift]
        yield order[::-1] if (index // count) % 2 else order


def measure(ways: dict[str, tuple[int, Callable[[], int]]], reads: int, rounds: int
            ) -> dict[str, dict[str, list[float]]]:  # fmt: skip
    """ms of client and server CPU and of wall clock per read, per way and round, ways in
    the ``orders`` of the rounds."""
    for _, consume in ways.values():
        consume()  # warm-up
    figures: dict[str, dict[str, list[float]]] = {
        n: {"server": [], "client": [], "wall": []} for n in ways}  # fmt: skip
    for order in orders(list(ways), rounds):
        for name in order:
            pid, consume = ways[name]
            server, client, wall = process_cpu_s(pid), time.process_time(), time.perf_counter()
            got = sum(consume() for _ in range(reads))
            assert got == reads * ROWS_PER_STATEMENT, f"{name}: {got} messages"
            figures[name]["server"].append(1000 * (process_cpu_s(pid) - server) / reads)
            figures[name]["client"].append(1000 * (time.process_time() - client) / reads)
            figures[name]["wall"].append(1000 * (time.perf_counter() - wall) / reads)
    return figures


def topicbase_ways(stack: contextlib.ExitStack, psycopg: Any, directory: str, tree: str,
                   chunks: list[list[bytes]], label: str
                   ) -> dict[str, tuple[int, Callable[[], int]]]:  # fmt: skip
    """A ``topicbase serve`` of ``tree`` holding ``chunks`` in topic ``t``: its ways."""
    pid, port = stack.enter_context(serve(directory, tree))
    wire = stack.enter_context(psycopg.connect(host="127.0.0.1", port=port, user="bench",
                                              autocommit=True))  # fmt: skip
    wire.execute(f"CREATE TOPIC t ({', '.join(f'CONSUMER {c}' for c in CONSUMERS)}) "
                 "WITH (min_active_partitions = 1)")  # fmt: skip
    raw = psycopg.RawCursor(wire)
    for chunk in chunks:
        raw.execute(insert_sql(lambda i: f"${i}"), chunk)
    cursor = wire.cursor(binary=True)
    read = consume_sql("c_binary")
    return {
        f"{label}, binary results": (pid, lambda: len(cursor.execute(read).fetchall())),
        f"{label}, COPY arrow": (pid, copy_arrow_consumer(wire, "c_arrow")),
    }


def options(argv: list[str]) -> tuple[list[str], str | None, list[str]]:
    """(positional arguments, ``--base`` tree or None, ``--only`` words)."""
    positional, base, only = [], None, []
    items = iter(argv)
    for item in items:
        if item == "--base":
            base = os.path.abspath(next(items))
        elif item == "--only":
            only += [word for word in next(items).split(",") if word]
        else:
            positional.append(item)
    return positional, base, only


def main(argv: list[str]) -> int:
    positional, base, only = options(argv)
    reads = int(positional[0]) if positional else 100
    rounds = int(positional[1]) if len(positional) > 1 else 5
    psycopg = postgres.ensure_psycopg()
    statements = reads * rounds + 3  # and the warm-up reads
    pool = make_messages(count=4 * ROWS_PER_STATEMENT, size=1024)
    chunks = [pool[(i * 1000) % 3000 : (i * 1000) % 3000 + 1000] for i in range(statements)]
    with contextlib.ExitStack() as stack:
        root = stack.enter_context(tempfile.TemporaryDirectory(prefix="topicbase-consume-"))
        ways = topicbase_ways(stack, psycopg, os.path.join(root, "served"), REPO_DIR, chunks,
                              "Topicbase")  # fmt: skip
        if base is not None:
            ways |= topicbase_ways(stack, psycopg, os.path.join(root, "base"), base, chunks,
                                   "base")  # fmt: skip
        parent = os.environ.get("TOPICBASE_BENCH_DIR") or None  # as pgwire_bench's
        cluster = stack.enter_context(postgres.Cluster(parent=parent, log=lambda _: None))
        baseline = stack.enter_context(psycopg.connect(cluster.dsn, autocommit=True))
        baseline.execute(PG_SETUP)
        insert = "INSERT INTO t (data) VALUES " + ", ".join(["(%s)"] * ROWS_PER_STATEMENT)
        for chunk in chunks:
            baseline.execute(insert, chunk)
        baseline.execute("VACUUM ANALYZE t")
        backend = baseline.execute("SELECT pg_backend_pid()").fetchone()[0]
        ways[f"{postgres.short_version(cluster.version)}, binary results"] = (
            backend, postgres_consumer(baseline, "c_binary", True))  # fmt: skip
        ways[f"{postgres.short_version(cluster.version)}, COPY binary"] = (
            backend, postgres_copy_consumer(baseline, "c_copy"))  # fmt: skip
        if only:
            ways = {n: w for n, w in ways.items() if any(word in n for word in only)}
        figures = measure(ways, reads, rounds)
    print(f"CPU ms per read of {ROWS_PER_STATEMENT} x 1 KiB: medians of {rounds} rounds of "
          f"{reads} reads [min..max]; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    for name, taken in figures.items():
        total = [s + c for s, c in zip(taken["server"], taken["client"], strict=True)]  # CPU
        cells = [f"{kind} {statistics.median(v):.2f} [{min(v):.2f}..{max(v):.2f}]"
                 for kind, v in (*taken.items(), ("total", total))]  # fmt: skip
        print(f"  {name:34s} " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
