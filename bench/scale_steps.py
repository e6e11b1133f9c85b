"""Where a spread ``INSERT`` over 1000 partitions spends its CPU against the same one over
10, step by step (issue 14, ``scale.partitions_1000.produce``; docs/scale.md round 21).

``python -m bench.scale_steps [rounds] [--polls]`` runs the bench's statement
(``bench.scale_bench``: 5,000 messages of 1 KiB from 2,000 producer ids) on a topic of
1000 partitions and one of 10, four statements of each side a round, in turn (3 warm-up
statements each first). Each statement's thread CPU, thread system time, minor page
faults (the thread's and the process's) and wall clock are taken, and the steps of the
spread write (``STEPS``) are wrapped to add up their thread CPU on the statement's thread
(inclusive: a step's figure contains the steps it calls). It prints the medians of each
side, each step's difference per share (the 1000-partition statement has ~1000 shares,
the 10-partition one 10) and the CPU ratio the target is about (10 partitions' statement
against 1000's: 0.7 is the target). After each side's four statements a read of 20,000
messages follows: ``--polls`` reads ``data`` as the bench does (its columns are freed
before the next statement: the allocator's state the bench's produce meets), else a
``count(*)``.

``python -m bench.scale_steps writes`` measures the one kernel step a share has: the
``pwritev`` of a ~5 KB frame at the end of each of 1000 files, in turn, 40 rounds, thread
CPU per 1000 writes, with the files' tails as they are today (each write extends the file)
and prepared in the ways that avoid the extension in the write (``posix_fallocate``,
``fallocate(KEEP_SIZE)``, a sparse ``ftruncate``, zeros written ahead).

A diagnostic (not part of ``bench.run``). The wrappers cost ~1-2 us a call (two thread
clock reads, which are system calls here: they show in the system time), so the
1000-partition statement measures ~5 ms more than unwrapped.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import engine.commit
import engine.spread_append
import storage.partition_log
import storage.segment
import storage.spread_publish
import storage.topic_log
from bench.storage_bench import make_messages
from sql import dbapi

MESSAGES = 5000
PRODUCERS = 2000
STATEMENTS = 4  # a side, a round
INSERT = "INSERT INTO TOPIC {} (data, producer_id) SELECT unnest(?), unnest(?)"
SIDES = (1000, 10)

# (owner, attribute): the steps of a spread statement (engine.spread_append), in call order.
STEPS: tuple[tuple[Any, str], ...] = (
    (engine.spread_append, "append_now"),
    (storage.topic_log.TopicLog, "route"),
    (storage.topic_log.TopicLog, "shares"),
    (engine.commit.Committer, "commit_in_log"),
    (engine.commit, "encode_batches"),  # the staging frame: a serialize a share
    (engine.commit.Committer, "finish"),
    (storage.topic_log, "checked_shares"),
    (storage.topic_log, "publish_shares"),
    (storage.spread_publish, "decide_shares"),
    (storage.spread_publish, "_frame_bodies"),  # the refill of the seq_nos
    (storage.partition_log.PartitionLog, "write_share_locked"),
    (storage.segment.LogSegment, "append_body"),  # of it: header, pwritev, index entries
    (storage.partition_log, "record_share"),  # of it: the producer entries
    (storage.topic_log.TopicLog, "_published_shares"),
)


def _thread_cpu() -> float:
    return time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)


@contextlib.contextmanager
def wrapped(spent: dict[str, float]) -> Iterator[None]:
    """Wrap every step of ``STEPS`` to add its thread CPU (seconds) to ``spent[name]``,
    on the calling thread only (the publishes of other threads are not this statement's)."""
    owner_thread = threading.get_ident()
    undo: list[Callable[[], None]] = []

    def wrap(owner: Any, name: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != owner_thread:
                return original(*args, **kwargs)
            started = _thread_cpu()
            try:
                return original(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + _thread_cpu() - started

        setattr(owner, name, timed)
        undo.append(lambda: setattr(owner, name, original))

    try:
        for owner, name in STEPS:
            wrap(owner, name)
        yield
    finally:
        for step in reversed(undo):
            step()


def _usage() -> tuple[float, float, int, int, float]:
    thread = resource.getrusage(resource.RUSAGE_THREAD)
    process = resource.getrusage(resource.RUSAGE_SELF)
    return (_thread_cpu(), thread.ru_stime, thread.ru_minflt, process.ru_minflt,
            time.perf_counter())  # fmt: skip


def measure(directory: str, rounds: int, *, polls: bool, sides: tuple[int, ...] = SIDES,
            messages: int = MESSAGES) -> dict[int, list[dict[str, float]]]:  # fmt: skip
    """Per side, one dict a measured statement: ``cpu``, ``sys``, ``faults``,
    ``process_faults``, ``wall`` and each step's thread CPU (seconds; faults as counts)."""
    pool = make_messages()
    data = [pool[i % len(pool)] for i in range(messages)]
    ids = [f"producer-{i % PRODUCERS}" for i in range(messages)]
    read = "SELECT {} FROM TOPIC p{} WITH (consumer = 'c', max_messages = 20000)"
    conn = dbapi.connect(os.path.join(directory, "steps"), autocommit=True)
    taken: dict[int, list[dict[str, float]]] = {side: [] for side in sides}
    try:
        cursor = conn.cursor()
        for side in sides:
            cursor.execute(f"CREATE TOPIC p{side} (CONSUMER c) "
                           f"WITH (min_active_partitions = {side})")  # fmt: skip
            for _ in range(3):  # the first creates the files
                cursor.execute(INSERT.format(f"p{side}"), [data, ids])
        for _ in range(rounds):
            for side in sides:
                for _ in range(STATEMENTS):
                    spent: dict[str, float] = {}
                    with wrapped(spent):
                        before = _usage()
                        cursor.execute(INSERT.format(f"p{side}"), [data, ids])
                        after = _usage()
                    names = ("cpu", "sys", "faults", "process_faults", "wall")
                    spent.update({n: a - b for n, a, b in zip(names, after, before, strict=True)})
                    taken[side].append(spent)
                cursor.execute(read.format("data" if polls else "count(*)", side))
                cursor.fetchall()
    finally:
        conn.close()
    return taken


def report(taken: dict[int, list[dict[str, float]]]) -> None:
    big, small = SIDES

    def median(side: int, name: str) -> float:
        return statistics.median(s.get(name, 0.0) for s in taken[side])

    print(f"{'per statement (medians)':28s} {big:>9d} p {small:>7d} p   diff   us a share")
    rows = [("cpu", "thread CPU"), ("sys", "- of it system"), ("wall", "wall clock")]
    rows += [(name, f"  {name}") for _, name in STEPS]
    for key, label in rows:
        a, b = median(big, key) * 1e3, median(small, key) * 1e3
        share = (a - b) / (big - small) * 1e3
        print(f"{label:28s} {a:9.2f} ms {b:7.2f} ms {a - b:6.2f} {share:8.2f}")
    for key in ("faults", "process_faults"):
        label = f"minor faults ({key})"
        print(f"{label:28s} {median(big, key):9.0f}   {median(small, key):7.0f}")
    print(f"CPU ratio (10 p / 1000 p statement): {median(small, 'cpu') / median(big, 'cpu'):.3f}; "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip


# -- the frame's write into 1000 files ----------------------------------------------------

FILES = 1000
FRAME_BYTES = 5248  # a 5-message share of 1 KiB messages, framed
WRITE_ROUNDS = 40
TAIL_BYTES = 256 * 1024
_FALLOC_FL_KEEP_SIZE = 1


def _prepare(fds: list[int], way: str) -> None:
    if way == "prewritten":
        zeros = bytes(TAIL_BYTES)
        for fd in fds:
            os.pwrite(fd, zeros, 0)
    elif way == "fallocate":
        for fd in fds:
            os.posix_fallocate(fd, 0, TAIL_BYTES)
    elif way == "fallocate_keep_size":
        libc = ctypes.CDLL(None, use_errno=True)
        for fd in fds:
            if libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE, ctypes.c_long(0),
                              ctypes.c_long(TAIL_BYTES)) != 0:  # fmt: skip
                raise OSError(ctypes.get_errno(), "fallocate")
    elif way == "sparse":
        for fd in fds:
            os.ftruncate(fd, TAIL_BYTES)
    else:
        assert way == "extending", way


def writes(directory: str, way: str) -> float:
    """Median thread CPU (seconds) of one ``pwritev`` of a frame (header and body) into
    each of ``FILES`` files, the files' tails prepared ``way``."""
    target = tempfile.mkdtemp(dir=directory)
    fds = [os.open(os.path.join(target, f"{i}.log"), os.O_CREAT | os.O_RDWR, 0o644)
           for i in range(FILES)]  # fmt: skip
    try:
        _prepare(fds, way)
        header, body = os.urandom(64), os.urandom(FRAME_BYTES - 64)
        spent = []
        for index in range(WRITE_ROUNDS):
            started = _thread_cpu()
            for fd in fds:
                os.pwritev(fd, [header, body], index * FRAME_BYTES)
            spent.append(_thread_cpu() - started)
        return statistics.median(spent[2:])
    finally:
        for fd in fds:
            os.close(fd)
        shutil.rmtree(target)


WAYS = ("extending", "fallocate", "fallocate_keep_size", "sparse", "prewritten")


def main(argv: list[str]) -> None:
    directory = tempfile.mkdtemp(prefix="scale_steps_")
    try:
        if argv[:1] == ["writes"]:
            for repetition in range(2):
                for way in WAYS:
                    print(f"{way:20s} {writes(directory, way) * 1e3:6.2f} ms per {FILES} "
                          f"pwritev (pass {repetition + 1})", flush=True)  # fmt: skip
            print(f"load average {os.getloadavg()[0]:.1f}")
            return
        rounds = int(argv[0]) if argv and argv[0].isdigit() else 8
        report(measure(directory, rounds, polls="--polls" in argv))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
