"""The server's CPU per 1000-row ``INSERT INTO TOPIC`` of psycopg's default cursor (the
bench's ``pgwire produce: psycopg via topicbase serve``), trees alternated
(docs/durable_produce.md, round 21). Measurement only.

``python bench/prototypes/wire_loop/bulk_cpu.py SECONDS REPS NAME=TREE...`` serves each
TREE with ``bench.served`` (its own process, a one-partition topic), then for REPS rounds,
the sides alternated, runs one psycopg connection sending the statement (1000 ``%s``
values of 1 KiB) for SECONDS; per side and round: msgs/s, the server's CPU per statement
(user and user+system, ``/proc``), the client's CPU; then the medians.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe

ROWS = 1000
STATEMENT = "INSERT INTO TOPIC t (data) VALUES " + ", ".join(["(%s)"] * ROWS)


def cpu_s(pid: int) -> tuple[float, float]:
    """(user, user + system) seconds of the process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, (int(fields[11]) + int(fields[12])) / tick


def run(served: probe.Served, seconds: float, pool: list[bytes]) -> dict[str, float]:
    with served.connect() as connection:
        for _ in range(6):  # psycopg prepares after five executions
            connection.execute(STATEMENT, pool)
        pid = served.process.pid
        user, total = cpu_s(pid)
        client, started, count = time.process_time(), time.perf_counter(), 0
        while time.perf_counter() - started < seconds:
            connection.execute(STATEMENT, pool)
            count += 1
        elapsed = time.perf_counter() - started
        client = time.process_time() - client
        user_after, total_after = cpu_s(pid)
    return {"rate": count * ROWS / elapsed, "server_ms": (total_after - total) / count * 1e3,
            "server_user_ms": (user_after - user) / count * 1e3,
            "client_ms": client / count * 1e3}  # fmt: skip


def main(argv: list[str]) -> None:
    seconds, reps = float(argv[0]), int(argv[1])
    sides = [spec.split("=", 1) for spec in argv[2:]]
    pool = [os.urandom(1024) for _ in range(ROWS)]
    os.environ["PARTS"] = "1"  # probe.Served's topic: one partition, as the bench's
    servers = {name: probe.Served(tree, {}) for name, tree in sides}
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in sides}
    try:
        for rep in range(reps):
            for name, _ in sides if rep % 2 == 0 else sides[::-1]:
                figures = run(servers[name], seconds, pool)
                results[name].append(figures)
                print(name, rep, {k: round(v, 2) for k, v in figures.items()}, flush=True)
    finally:
        for served in servers.values():
            served.stop()
    probe.print_medians(results, 2)


if __name__ == "__main__":
    main(sys.argv[1:])
