"""What the door's checks cost: the sandbox and privilege checks on and off, same run.

Every statement passes ``Session._guard`` (``engine.sandbox.check_plan`` and
``engine.privileges.check_plan``). This benchmark runs the wire workloads of
``bench-quick`` (``SELECT 1`` round trip, a primary-key lookup, a 100-row topic INSERT,
and the topic-to-topic move transaction) as an ordinary user holding GRANTs, against an
in-process server, with the checks in place and with both replaced by no-ops. The ratio is
checks-on / checks-off for throughput and checks-off / checks-on for latency, so both read
"fraction of the unchecked speed kept"; the target is >= 0.95 (the checks cost at most 5 %).

A 5 % effect is smaller than this shared machine's drift over a few seconds, so each
workload runs as many short slices, on and off alternating A B B A … within the workload
(the two sides of a pair are never more than one slice apart), and each side's figure is the
median of its slices. The time spent inside the checks is also measured directly, as a
share of the workload's wall time, which no drift disturbs.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench import harness
from bench.results import Recorder

GROUP = "security: cost of the door's checks"
TARGET = 0.95
SLICES = 12  # per side and workload, in A B B A order
LOOKUP_ROWS = 10_000
MOVE_BATCH = 100


class GuardClock:
    """Time spent inside the checks (both of them), to set beside the wall time."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0


@contextlib.contextmanager
def _checks(enabled: bool, clock: GuardClock) -> Iterator[None]:
    """The engine's checks as they are (timed into ``clock``), or no-ops for the baseline."""
    from engine import privileges, sandbox

    saved = (sandbox.check_plan, privileges.check_plan)

    def timed(check: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return check(*args, **kwargs)
            finally:
                clock.seconds += time.perf_counter() - started
                clock.calls += 1

        return run

    if enabled:
        sandbox.check_plan = timed(saved[0])  # type: ignore[assignment]
        privileges.check_plan = timed(saved[1])  # type: ignore[assignment]
    else:
        sandbox.check_plan = lambda *args, **kwargs: None  # type: ignore[assignment]
        privileges.check_plan = lambda *args, **kwargs: None  # type: ignore[assignment]
    try:
        yield
    finally:
        sandbox.check_plan, privileges.check_plan = saved


def _setup(admin: Any) -> None:
    admin.execute("CREATE TABLE kv (k INTEGER PRIMARY KEY, v VARCHAR)")
    admin.execute(f"INSERT INTO kv SELECT i, 'v' || i FROM range({LOOKUP_ROWS}) t(i)")
    admin.execute("CREATE TOPIC events")
    admin.execute("CREATE TOPIC src (CONSUMER mover)")
    admin.execute("CREATE TOPIC dst")
    for grant in (
        "GRANT SELECT ON kv TO alice",
        "GRANT INSERT ON TOPIC events TO alice",
        "GRANT SELECT ON TOPIC src TO alice",
        "GRANT INSERT ON TOPIC dst TO alice",
    ):
        admin.execute(grant)


def _refill(admin: Any, messages: int) -> None:
    values = ", ".join(["('m')"] * 1000)
    for _ in range(messages // 1000 + 1):
        admin.execute(f"INSERT INTO TOPIC src (data) VALUES {values}")


def _latency_us(run: Callable[[], object], count: int) -> float:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e6


def _throughput(run: Callable[[], int], seconds: float) -> float:
    done = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        done += run()
    return done / (time.perf_counter() - started)


def _workloads(alice: Any, quick: bool) -> dict[str, Callable[[], float]]:
    """One slice of each workload: a latency median or a throughput over a short time."""
    count = 75 if quick else 250
    seconds = 0.375 if quick else 1.0
    produce_sql = "INSERT INTO TOPIC events (data) VALUES " + ", ".join(["(%s)"] * 100)
    payload = ["x" * 1024] * 100
    keys = iter(range(10**9))

    def produce() -> int:
        alice.execute(produce_sql, payload)
        return 100

    def move() -> int:
        with alice.transaction():
            alice.execute(
                "INSERT INTO TOPIC dst (data) SELECT data FROM TOPIC src "
                f"WITH (consumer = 'mover', max_messages = {MOVE_BATCH})"
            )
        return 1

    return {
        "SELECT 1 p50 (us)": lambda: _latency_us(lambda: alice.execute("SELECT 1"), count),
        "point lookup p50 (us)": lambda: _latency_us(
            lambda: alice.execute(
                "SELECT v FROM kv WHERE k = %s", (next(keys) % LOOKUP_ROWS,)
            ).fetchall(),
            count,
        ),
        "produce 100-row INSERT (msgs/s)": lambda: _throughput(produce, seconds),
        "move 100 messages topic->topic (txn/s)": lambda: _throughput(move, seconds),
    }


def _abba(slices: int) -> Iterator[bool]:
    """``slices`` True and ``slices`` False as A B B A A B B A …: each side runs first in
    half of the pairs, and neighbours in time are compared."""
    for pair in range(slices):
        yield from (True, False) if pair % 2 == 0 else (False, True)


def run(recorder: Recorder) -> None:
    import psycopg

    from sql.pgwire.server import ServerThread
    from sql.pgwire.users import add_user

    with tempfile.TemporaryDirectory(prefix="topicbase-security-bench-") as root:
        data = os.path.join(root, "data")
        os.makedirs(data)
        users = os.path.join(data, "users.json")
        add_user(users, "admin", "admin-password", superuser=True)
        add_user(users, "alice", "alice-password")
        server = ServerThread(data, "127.0.0.1", 0, auth="scram", users_file=users)
        try:
            dsn = {"host": "127.0.0.1", "port": server.port, "autocommit": True}
            admin_connection = psycopg.connect(user="admin", password="admin-password", **dsn)
            alice_connection = psycopg.connect(user="alice", password="alice-password", **dsn)
            with admin_connection as admin, alice_connection as alice:
                _setup(admin)
                workloads = _workloads(alice, recorder.quick)
                slices = SLICES if recorder.quick else 2 * SLICES
                _refill(admin, 2 * slices * MOVE_BATCH * 500)
                figures: dict[tuple[str, bool], list[float]] = {}
                guard_share: dict[str, list[float]] = {}
                for name, workload in workloads.items():
                    for enabled in _abba(slices):
                        clock = GuardClock()
                        with _checks(enabled, clock):
                            started = time.perf_counter()
                            figures.setdefault((name, enabled), []).append(workload())
                            wall = time.perf_counter() - started
                        if enabled:
                            guard_share.setdefault(name, []).append(clock.seconds / wall)
                    recorder.progress(f"{name}: {slices} slices a side done")
        finally:
            server.stop()
    for name in workloads:
        share = statistics.median(guard_share[name])
        recorder.add(
            f"security checks: share of the wall time spent in them, {name.rsplit(' (', 1)[0]}",
            100 * share,
            "%",
            group=GROUP,
            target="<= 5 %",
            met=share <= 0.05,
            note="time inside sandbox.check_plan + privileges.check_plan over the workload's "
            "wall time (server and client in one process), median of the checked slices",
        )
        on = harness.Spread.of(figures[(name, True)])
        off = harness.Spread.of(figures[(name, False)])
        latency = name.endswith("(us)")
        harness.record(
            recorder,
            f"security checks on vs off: {name}",
            on,
            off,
            unit="us" if latency else name.rsplit("(", 1)[1].rstrip(")"),
            group=GROUP,
            baseline="same workload, checks replaced by no-ops",
            higher_is_better=not latency,
            target_ratio=TARGET,
            target=f">= {TARGET:g} of the unchecked speed",
            note="ratio: the fraction of the unchecked speed kept; median of short slices "
            "alternated A B B A within each workload",
        )
