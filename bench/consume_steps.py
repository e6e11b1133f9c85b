"""Where one consumer read over the wire spends the server's CPU, step by step.

``python -m bench.consume_steps [reads] [--tree TREE] [--strace] [--copy]`` (default 300
reads; ``--copy``: each read a ``COPY (...) TO STDOUT (FORMAT arrow)`` decoded by pyarrow,
``consume.wire``'s other way).
Starts ``topicbase serve`` of ``TREE`` (default this checkout) in a child process whose
chosen functions (the extended protocol's handlers, the held transaction's BEGIN and
COMMIT, the engine's statement, read and commit, the staging log's sync and its
``fdatasync``, the DataRows)
are wrapped to add up their calls, thread CPU (``time.thread_time_ns``) and wall clock;
reads ``reads`` times 1000 x 1 KiB with psycopg's binary results (``consume.wire``'s
read) after 20 warm-up reads; prints per read: each server thread's CPU and voluntary /
involuntary context switches (``/proc/<pid>/task/*/{schedstat,status}``), each wrapped
step (inclusive: a step's figure contains the steps it calls), and the client's CPU and
wall clock. ``--strace`` also counts the server's system calls during the reads
(``strace -c -f``; slows the reads, so its step figures are not the ones to quote).

A diagnostic (not part of ``bench.run``); its figures are quoted in docs/consume_wire.md.
The wrappers cost ~1-2 us a call (two clock reads each): about 50 us of a read's CPU.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import glob
import importlib
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.ipc

from bench import postgres
from bench.pgwire_bench import consume_sql, insert_sql
from bench.results import REPO_DIR
from bench.storage_bench import make_messages

# (module, class or "", function): what the serving child wraps.
STEPS = (
    ("sql.pgwire.connection.extended", "ExtendedProtocol", "on_bind"),
    ("sql.pgwire.connection.extended", "ExtendedProtocol", "on_describe"),
    ("sql.pgwire.connection.extended", "ExtendedProtocol", "on_execute"),
    ("sql.pgwire.connection.extended", "ExtendedProtocol", "_execute_prepared"),
    ("sql.pgwire.connection.copy_commit", "", "hold"),
    ("sql.pgwire.connection.copy_commit", "Held", "commit"),
    ("sql.pgwire.connection.connection", "Connection", "send_rows"),
    ("sql.pgwire.codec.row_encoding", "DataRows", "__init__"),
    ("engine.session", "Session", "execute_statement"),
    ("engine.session", "Session", "_read"),
    ("engine.session", "Session", "_commit"),
    ("engine.commit", "Committer", "commit_in_log"),
    ("storage.staging", "StagingLog", "wait_durable"),
    # the fdatasync itself: its wall is the device's (and the other I/O's), its CPU the
    # kernel's share of the offset commit (docs/consume_wire.md, round 13)
    ("storage.fs", "FileSystem", "sync"),
    # ``--copy``: COPY (...) TO STDOUT (FORMAT arrow)'s steps
    ("sql.pgwire.connection.copy_arrow", "", "copy_arrow_to_client"),
    ("sql.pgwire.connection.copy_arrow", "", "_open"),
    ("sql.pgwire.connection.copy_arrow", "", "_next_messages"),
    ("sql.pgwire.connection.copy_arrow", "", "_commit"),
    ("sql.pgwire.connection.copy_arrow", "_QuerySource", "close"),
    ("sql.pgwire.codec.copy_arrow", "", "batch_messages"),
    ("sql.pgwire.connection.copy_commit", "", "open_held"),
)


def _wrap(owner: Any, name: str, label: str, sums: dict[str, list[int]]) -> None:
    function = getattr(owner, name)

    def add(cpu: int, wall: int) -> None:
        entry = sums[label]
        entry[0] += 1
        entry[1] += time.thread_time_ns() - cpu
        entry[2] += time.perf_counter_ns() - wall

    if inspect.iscoroutinefunction(function):
        @functools.wraps(function)
        async def wrapped_async(*args: Any, **kwargs: Any) -> Any:
            cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
            try:
                return await function(*args, **kwargs)
            finally:
                add(cpu, wall)

        setattr(owner, name, wrapped_async)
    else:
        @functools.wraps(function)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
            try:
                return function(*args, **kwargs)
            finally:
                add(cpu, wall)

        setattr(owner, name, wrapped)


def serve_wrapped(argv: list[str]) -> int:
    """The child: ``topicbase serve`` with ``STEPS`` wrapped; SIGUSR2 zeroes the sums,
    SIGUSR1 writes them (JSON) to ``$CONSUME_STEPS_OUT``."""
    sums: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for module_name, class_name, function in STEPS:
        module = importlib.import_module(module_name)
        owner = getattr(module, class_name) if class_name else module
        _wrap(owner, function, f"{class_name or module_name.rsplit('.', 1)[1]}.{function}", sums)

    def write(*_: Any) -> None:
        with open(os.environ["CONSUME_STEPS_OUT"], "w") as out:
            json.dump(dict(sums), out)

    signal.signal(signal.SIGUSR1, write)
    signal.signal(signal.SIGUSR2, lambda *_: sums.clear())
    from sql.console import main as console_main

    return console_main(argv)


def _threads(pid: int) -> dict[str, tuple[int, int, int]]:
    """Each live thread of ``pid``: (run ns, voluntary, involuntary context switches)."""
    found = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
            run_ns = int(Path(f"{task}/schedstat").read_text().split()[0])
            status = dict(line.split(":", 1)
                          for line in Path(f"{task}/status").read_text().splitlines()
                          if ":" in line)  # fmt: skip
            found[task.rsplit("/", 1)[1]] = (run_ns, int(status["voluntary_ctxt_switches"]),
                                            int(status["nonvoluntary_ctxt_switches"]))  # fmt: skip
    return found


def main(argv: list[str]) -> int:
    reads = int(next((a for a in argv if a.isdigit()), "300"))
    tree = argv[argv.index("--tree") + 1] if "--tree" in argv else REPO_DIR
    psycopg = postgres.ensure_psycopg()
    with tempfile.TemporaryDirectory(prefix="topicbase-steps-") as root:
        out = os.path.join(root, "steps.json")
        # This file run by path: the tree's own modules are imported (its directory first)
        code = (f"import runpy, sys; steps = runpy.run_path({os.path.abspath(__file__)!r}); "
                "sys.exit(steps['serve_wrapped'](sys.argv[1:]))")  # fmt: skip
        child = subprocess.Popen(
            [sys.executable, "-c", code, "--data-dir", os.path.join(root, "data"), "serve",
             "--host", "127.0.0.1", "--port", "0", "--flight-port", "0", "--auth", "trust"],
            stdout=subprocess.PIPE, text=True, cwd=tree,
            env=dict(os.environ, CONSUME_STEPS_OUT=out),
        )  # fmt: skip
        try:
            assert child.stdout is not None
            port = int(child.stdout.readline().rsplit(":", 1)[1])
            wire = psycopg.connect(host="127.0.0.1", port=port, user="bench", autocommit=True)
            wire.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 1)")
            pool = make_messages(count=4000, size=1024)
            raw = psycopg.RawCursor(wire)
            for i in range(reads + 21):
                start = (i * 1000) % 3000
                raw.execute(insert_sql(lambda n: f"${n}"), pool[start : start + 1000])
            cursor, read = wire.cursor(binary=True), consume_sql("c")
            copy_read = f"COPY ({read}) TO STDOUT (FORMAT arrow)"

            def one_read() -> int:
                if "--copy" not in argv:
                    return len(cursor.execute(read).fetchall())
                with cursor.copy(copy_read) as copy:
                    return pyarrow.ipc.open_stream(b"".join(copy)).read_all().num_rows

            for _ in range(20):
                one_read()
            os.kill(child.pid, signal.SIGUSR2)
            time.sleep(0.2)
            before, cpu, wall = _threads(child.pid), time.process_time(), time.perf_counter()
            tracer = None
            if "--strace" in argv:
                tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(child.pid), "-o",
                                           os.path.join(root, "strace.txt")])  # fmt: skip
                time.sleep(1)
            for _ in range(reads):
                assert one_read() == 1000
            if tracer is not None:
                tracer.send_signal(signal.SIGINT)
                tracer.wait()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            after = _threads(child.pid)
            os.kill(child.pid, signal.SIGUSR1)
            time.sleep(0.3)
            steps = json.loads(Path(out).read_text())
            wire.close()
        finally:
            child.terminate()
            child.wait()
        how = "COPY (FORMAT arrow)" if "--copy" in argv else "binary results"
        print(f"{reads} reads of 1000 x 1 KiB ({how}); load average "
              f"{os.getloadavg()[0]:.1f}; per read: wall {1e6 * wall / reads:.0f} us, client "
              f"CPU {1e6 * cpu / reads:.0f} us")  # fmt: skip
        total = 0
        for task, (run_ns, voluntary, involuntary) in sorted(after.items()):
            run0, vol0, invol0 = before.get(task, (0, 0, 0))
            total += run_ns - run0
            if run_ns - run0 > reads * 1000:  # threads that did something: > 1 us a read
                print(f"  server thread {task}: CPU {(run_ns - run0) / reads / 1000:.1f} us, "
                      f"context switches {(voluntary - vol0) / reads:.2f} voluntary, "
                      f"{(involuntary - invol0) / reads:.2f} involuntary")  # fmt: skip
        print(f"  server CPU, all threads: {total / reads / 1000:.1f} us")
        for label, (calls, cpu_ns, wall_ns) in sorted(steps.items(), key=lambda s: -s[1][1]):
            print(f"  {label:34s} calls {calls / reads:4.2f}  CPU {cpu_ns / reads / 1000:7.1f} us"
                  f"  wall {wall_ns / reads / 1000:7.1f} us")  # fmt: skip
        if "--strace" in argv:
            print(Path(root, "strace.txt").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
