"""Where the server's CPU goes per durable-produce message, by section (docs/durable_produce.md,
round 18). Measurement only.

``python bench/prototypes/wire_loop/sections.py TREE CLIENTS SECONDS`` serves TREE with
``bench.served`` in its own process, with thread-CPU clocks (``time.thread_time``) around
the functions of the produce path, kept exclusive of the sections called inside them;
drives it with CLIENTS psycopg clients (``probe.run``: one 1 KiB message per autocommit
``INSERT INTO TOPIC``) for SECONDS and prints each section's CPU per statement. "other"
is the process's CPU (``/proc``) less the sections' sum: the message loop's own glue, the
threads' start, the server's loop. A function a tree does not have is left out.

Run with ``--serve DATA_DIR`` it is the server process itself (what the driver starts).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

SECTIONS = [  # (module, owner or "", attribute, section)
    ("sql.pgwire.connection.connection", "Connection", "_read_directly", "wire.read"),
    ("sql.pgwire.connection.connection", "Connection", "_next_message", "wire.read"),
    ("sql.pgwire.connection.connection", "Connection", "_buffered_message", "wire.read"),
    ("sql.pgwire.connection.lookup_flight", "", "answer", "wire.bind"),
    ("sql.pgwire.connection.insert_flight", "", "answer", "wire.insert_flight"),
    ("sql.pgwire.connection.extended", "ExtendedProtocol", "on_bind", "wire.bind"),
    ("sql.pgwire.connection.extended", "ExtendedProtocol", "on_describe", "wire.portal"),
    ("sql.pgwire.connection.extended", "ExtendedProtocol", "_run_portal", "wire.portal"),
    ("sql.pgwire.connection.extended", "ExtendedProtocol", "_execute_prepared", "wire.portal"),
    ("sql.pgwire.connection.extended", "ExtendedProtocol", "on_execute", "wire.execute"),
    ("sql.pgwire.connection.connection", "Connection", "ready_for_query", "wire.sync"),
    ("sql.pgwire.connection.output", "GatheringWriter", "flush", "wire.send"),
    ("sql.pgwire.emulation.surface", "ConnectionCatalog", "execute", "statement.surface"),
    ("engine.session", "Session", "execute_statement", "statement.entry"),
    ("engine.session", "Session", "_execute", "statement.plan_guard_dispatch"),
    ("engine.session", "Session", "_run", "statement.run"),
    ("engine.session", "Session", "_commit", "statement.autocommit_end"),
    ("engine.session", "Session", "_append", "append.bind_rows"),
    ("engine.session", "Session", "_append_plain_now", "append.bind_rows"),
    ("engine.spread_append", "", "append_plain", "append.a_append_plain"),
    ("engine.spread_append", "PlainCombiner", "append", "append.b_combiner"),
    ("storage.group_commit", "GroupCommitter", "submit", "append.c_wait_for_round"),
    ("storage.group_commit", "GroupCommitter", "_lead", "append.d_lead_hand_off"),
    ("engine.spread_append", "", "_append_chunk", "append.e_round_batch_checks"),
    ("engine.spread_append", "", "_alone", "append.e_alone"),
    ("storage.topic_log", "TopicLog", "append", "append.f_topic_route"),
    ("storage.partition_log", "PartitionLog", "append", "append.g_partition"),
    ("storage.partition_log", "PartitionLog", "_flush_group", "append.g_partition"),
    ("storage.partition_log", "PartitionLog", "_write_locked", "append.h_frame_write"),
    ("storage.partition_log", "PartitionLog", "_sync_locked", "append.i_sync"),
    ("storage.fs", "FileSystem", "sync", "append.j_fdatasync"),
    ("storage.partition_log", "PartitionLog", "_publish", "append.k_publish"),
]

_local = threading.local()
_totals: dict[str, float] = {}
_counts: dict[str, int] = {}
_lock = threading.Lock()


def _add(name: str, exclusive: float) -> None:
    with _lock:
        _totals[name] = _totals.get(name, 0.0) + exclusive
        _counts[name] = _counts.get(name, 0) + 1


def _timed(function: Any, name: str) -> Any:
    clock = time.thread_time

    def enter() -> list[float]:
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        stack.append(0.0)
        return stack

    def leave(stack: list[float], started: float) -> None:
        spent = clock() - started
        inner = stack.pop()
        if stack:
            stack[-1] += spent
        _add(name, spent - inner)

    if inspect.iscoroutinefunction(function):
        @functools.wraps(function)
        async def timed_coroutine(*args: Any, **kwargs: Any) -> Any:
            stack, started = enter(), clock()
            try:
                return await function(*args, **kwargs)
            finally:
                leave(stack, started)
        return timed_coroutine

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        stack, started = enter(), clock()
        try:
            return function(*args, **kwargs)
        finally:
            leave(stack, started)
    return timed


def serve(directory: str, out: str) -> None:
    import importlib

    for module_name, owner_name, attribute, name in SECTIONS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        owner = getattr(module, owner_name) if owner_name else module
        if hasattr(owner, attribute):
            setattr(owner, attribute, _timed(getattr(owner, attribute), name))
    from bench import served

    try:
        served.main([directory])
    finally:
        with open(out, "w") as f:
            json.dump({"totals": _totals, "counts": _counts}, f)


def drive(tree: str, clients: int, seconds: float) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import probe

    out = tempfile.mktemp(suffix=".json")

    served = probe.Served(tree, {"PYTHONPATH": tree}, prefix="sections-",
                          script=[os.path.abspath(__file__), "--serve", "{directory}", out])
    pid = served.process.pid
    cpu = probe.process_cpu_s(pid)
    try:
        figures = probe.run(served, clients, seconds)
        cpu = probe.process_cpu_s(pid) - cpu
    finally:
        served.stop()
    with open(out) as f:
        found = json.load(f)
    os.remove(out)
    statements = found["counts"]["statement.surface"]  # the warm-up's included
    print({k: round(v, 2) for k, v in figures.items()}, "statements", statements)
    total = 0.0
    for name, spent in sorted(found["totals"].items()):
        total += spent
        print(f"{name:34s} {spent / statements * 1e6:7.1f} us a statement "
              f"({found['counts'][name] / statements:.2f} calls)")  # fmt: skip
    print(f"{'other':34s} {(cpu - total) / statements * 1e6:7.1f} us a statement")
    print(f"{'process CPU':34s} {cpu / statements * 1e6:7.1f} us a statement")


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        sys.path.insert(0, os.getcwd())
        serve(sys.argv[2], sys.argv[3])
    else:
        drive(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
