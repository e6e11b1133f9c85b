"""Scale: many partitions, and more data. Through the DB-API (``sql.dbapi``), in process.

1. ``scale.partitions_1000``: produce and consume throughput of a topic with 1000
   partitions against the same topic with 10, the two alternating (``bench.harness``:
   1000, 10, 1000, 10, …). Produce: autocommit ``INSERT INTO TOPIC t (data,
   producer_id) SELECT unnest(?), unnest(?)`` of 5,000 messages of 1 KiB from 2,000
   producer ids (so each statement spreads over the partitions), repeated for a
   fixed time (at least one statement); consume: a consumer reads everything the
   repetition produced, ``max_messages = 20000`` per read (offsets committed by each
   read); the consume note gives the process CPU time per message read, steadier than
   msgs/s on a loaded machine. Target: 1000 partitions >= 70 % of 10, for each. One
   statement and its read into each topic, untimed, come first (``_warmed``).
   The store runs as by default: with the topics' ledgers (docs/scale.md rounds 28-31).
   The rows' later write from the ledger into the partitions is charged to producing
   them, as the staging path writes them in the statement: what is left of it when a
   repetition ends is written then (``TopicLedger.settle_all``) and its time added to
   the produce time; the partitions' syncs after it (``copy_all``) are not, as the
   staging path's checkpoint syncs are not; no copier pass runs into the other side's
   time. The note gives the whole copy's CPU a message (the background passes' and
   those). A repetition produces for 5 s in both suites: the copier's passes come
   ``limits.LEDGER_COPY_WAIT_S`` (3 s since round 36) or 48 frames apart at most, so a
   repetition holds one or more; one of 1 s (the quick suite's before round 32, with
   passes a second apart) held none, and every row's copy was written at its end, in
   the foreground: it measured the statements plus a synchronous copy of all of them,
   not a producer that goes on producing (docs/scale.md, round 32).
2. ``scale.partitions_1000.ledger_off``: the same comparison in a store with the ledger
   switched off (``TOPICBASE_LEDGER=0``: every statement through the staging log into
   the partitions' own segments, the default before round 31), no target.
3. ``scale.growth``: how cost grows with data: 1000-message INSERTs into a
   4-partition topic until it holds ``growth_bytes`` (10 GB in the full suite, 0.2 GB
   in the quick one), produce rate measured per slice; then one consumer reads it
   all, rate per slice. Recorded: the last slice against the first (the ratio says
   what growing 10x costs); every slice's rate in the note. Sequential by nature,
   so not alternated.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from bench import harness
from bench.results import Recorder
from bench.storage_bench import make_messages
from sql import dbapi
from storage.config import LEDGER_ENVIRONMENT_VARIABLE

GB = 1_000_000_000
MESSAGE_BYTES = 1024
PRODUCE_BATCH = 5000
PRODUCERS = 2000
CONSUME_BATCH = 20_000
GROWTH_BATCH = 1000
PARTITIONS_TARGET = 0.7
G_PARTITIONS = "scale: 1000 partitions vs 10 (DB-API, 5,000-message INSERTs, 2,000 producers)"
G_GROWTH = "scale: data growth (DB-API, 1000-message INSERTs, 4 partitions)"
G_LEDGER_OFF = "scale: 1000 partitions vs 10 with the ledger switched off (TOPICBASE_LEDGER=0)"
INSERT = "INSERT INTO TOPIC {topic} (data, producer_id) SELECT unnest(?), unnest(?)"
GROWTH_INSERT = "INSERT INTO TOPIC g (data) SELECT unnest(?)"


@dataclass(frozen=True)
class Params:
    produce_seconds: float
    reps: int
    growth_bytes: int
    growth_slices: int


QUICK = Params(produce_seconds=5.0, reps=3, growth_bytes=GB // 5, growth_slices=4)
FULL = Params(produce_seconds=5.0, reps=5, growth_bytes=10 * GB, growth_slices=10)


def _read_all(cursor: dbapi.Cursor, topic: str, count: int) -> float:
    """Read ``count`` messages with consumer ``c``: msgs/s."""
    read = f"SELECT data FROM TOPIC {topic} WITH (consumer = 'c', max_messages = {CONSUME_BATCH})"
    started = time.perf_counter()
    got = 0
    while got < count:
        cursor.execute(read)
        rows = len(cursor.fetchall())
        assert rows, f"{topic}: ran dry after {got} of {count}"
        got += rows
    return got / (time.perf_counter() - started)


def _read_slices(cursor: dbapi.Cursor, per_slice: int, slices: int) -> list[float]:
    """Read topic ``g`` whole with consumer ``c``; msgs/s over each slice of it (a read
    that crosses a slice boundary counts in the slice where it ends)."""
    read = f"SELECT data FROM TOPIC g WITH (consumer = 'c', max_messages = {CONSUME_BATCH})"
    rates = []
    got, mark, mark_got = 0, time.perf_counter(), 0
    while len(rates) < slices:
        cursor.execute(read)
        rows = len(cursor.fetchall())
        assert rows, f"g: ran dry after {got} of {per_slice * slices}"
        got += rows
        if got >= per_slice * (len(rates) + 1):
            now = time.perf_counter()
            rates.append((got - mark_got) / (now - mark))
            mark, mark_got = now, got
    return rates


def _ledger_of(conn: dbapi.Connection, topic: str) -> Any:
    """``topic``'s ledger (``storage.ledger_route.TopicLedger``), or None."""
    database = conn._database  # a bench reaches into the engine for a figure it keeps
    entry = database.catalog.entry(topic)
    return None if entry is None else database.topic_log(entry.topic_id).ledger


def _drained(conn: dbapi.Connection, topic: str) -> tuple[float, float, float]:
    """Copy what ``topic``'s ledger still holds into its partitions now, as a copier's
    pass would (run here): the writes' wall and CPU seconds (``settle_all``), then the
    syncs' and releases' CPU seconds (``copy_all``); zeros without a ledger."""
    ledger = _ledger_of(conn, topic)
    if ledger is None:
        return 0.0, 0.0, 0.0
    started, cpu = time.perf_counter(), time.thread_time()
    ledger.settle_all()
    wall, written = time.perf_counter() - started, time.thread_time() - cpu
    cpu = time.thread_time()
    ledger.copy_all()
    return wall, written, time.thread_time() - cpu


def _warmed(conn: dbapi.Connection, cursor: dbapi.Cursor, topic: str, data: list[bytes],
            ids: list[str]) -> None:  # fmt: skip
    """One statement into ``topic`` and its read, untimed, before the repetitions: the
    process's and the topic's first-time costs (the statement's plan and the session's
    DuckDB connections, the 2,000 producers' first bindings, a ledger's first file and
    map) are not a repetition's. Without it they fell on the first side to run, the
    1000-partition one (a first statement ~1.1 s of CPU against ~0.2 s after)."""
    cursor.execute(INSERT.format(topic=topic), [data, ids])
    _read_all(cursor, topic, PRODUCE_BATCH)
    _drained(conn, topic)


@contextlib.contextmanager
def _ledger_switch(on: bool) -> Iterator[None]:
    """``TOPICBASE_LEDGER`` as asked while a store opens (``storage.config``), then as it was."""
    before = os.environ.get(LEDGER_ENVIRONMENT_VARIABLE)
    os.environ[LEDGER_ENVIRONMENT_VARIABLE] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[LEDGER_ENVIRONMENT_VARIABLE]
        else:
            os.environ[LEDGER_ENVIRONMENT_VARIABLE] = before


def bench_partitions(rec: Recorder, parent: str, params: Params, pool: Sequence[bytes],
                     ledger: bool = True) -> None:  # fmt: skip
    """The partitions comparison; ``ledger`` off: in a store with the ledger switched off,
    its records named ``scale.partitions_1000.ledger_off.*``, without a target (the switch
    is on by default); on, the copier's CPU a message in the notes."""
    with _ledger_switch(ledger):
        conn = dbapi.connect(os.path.join(parent, "partitions" if ledger else "ledger_off"),
                             autocommit=True)  # fmt: skip
    try:
        cursor = conn.cursor()
        for partitions in (1000, 10):
            cursor.execute(
                f"CREATE TOPIC p{partitions} (CONSUMER c) "
                f"WITH (min_active_partitions = {partitions})"
            )
        data = [pool[i % len(pool)] for i in range(PRODUCE_BATCH)]
        ids = [f"producer-{i % PRODUCERS}" for i in range(PRODUCE_BATCH)]
        drains_cpu: dict[str, float] = {}  # topic -> CPU seconds of the copies at the ends
        produced: dict[str, int] = {}

        def side(partitions: int) -> harness.Side:
            topic = f"p{partitions}"
            statement = INSERT.format(topic=topic)

            def run(rep: int) -> dict[str, float]:
                started = time.perf_counter()
                sent = 0
                while True:
                    cursor.execute(statement, [data, ids])
                    sent += PRODUCE_BATCH
                    if time.perf_counter() - started >= params.produce_seconds:
                        break
                produce_s = time.perf_counter() - started
                cpu_started = time.process_time()
                consume = _read_all(cursor, topic, sent)
                # CPU per message read: steadier than msgs/s on a loaded machine
                cpu_us = (time.process_time() - cpu_started) / sent * 1e6
                # With a ledger, the rows are written into the partitions later: what is
                # left of that when the side ends is written now and its time charged to
                # producing them (the staging path writes them in the statement); the
                # partitions' syncs after it are not (the staging path's checkpoint syncs
                # them in the background, uncharged), and no pass runs into the other
                # side's time.
                drain_s, written_s, synced_s = _drained(conn, topic)
                drains_cpu[topic] = drains_cpu.get(topic, 0.0) + written_s + synced_s
                produced[topic] = produced.get(topic, 0) + sent
                return {"produce": sent / (produce_s + drain_s), "consume": consume,
                        "consume_cpu_us": cpu_us}  # fmt: skip

            return harness.Side(topic, run)

        for partitions in (1000, 10):  # the first statements' costs, paid before the reps
            _warmed(conn, cursor, f"p{partitions}", data, ids)
        spreads = harness.alternate([side(1000), side(10)], params.reps, rec.progress)
        descriptors = len(os.listdir("/proc/self/fd"))
        cpu = {name: spreads[name]["consume_cpu_us"].median for name in ("p1000", "p10")}
        ledger_1000 = _ledger_of(conn, "p1000")
        copier_cpu_s = 0.0 if ledger_1000 is None else ledger_1000.copier_cpu_s
        copier = (copier_cpu_s + drains_cpu.get("p1000", 0.0)) / produced["p1000"] * 1e6
        for metric in ("produce", "consume"):
            note = (f"{descriptors:,} open file descriptors in the process after the run"
                    if metric == "produce" else f"reads of up to {CONSUME_BATCH:,}; CPU a "
                    f"message read (process time, medians): {cpu['p1000']:.1f} us at 1000 "
                    f"partitions, {cpu['p10']:.1f} us at 10")  # fmt: skip
            if not ledger:
                note += "; TOPICBASE_LEDGER=0 (the ledger on is the default)"
            elif ledger_1000 is not None:
                note += (f"; copying the rows from the "
                         f"ledger into the partitions took {copier:.1f} us of CPU a message "
                         "at 1000 partitions, writes and syncs (the copier's passes, and the "
                         "copy left at the end of each repetition, done then: its writes' "
                         "time added to the produce time, its syncs' not, as the staging "
                         "path's checkpoint syncs are not)")
            harness.record(
                rec, f"scale.partitions_1000{'' if ledger else '.ledger_off'}.{metric}",
                spreads["p1000"][metric], spreads["p10"][metric], unit="msgs/s",
                group=G_PARTITIONS if ledger else G_LEDGER_OFF,
                baseline="the same topic with 10 partitions",
                target_ratio=PARTITIONS_TARGET if ledger else None,
                target=f">= {PARTITIONS_TARGET:.0%} of 10 partitions" if ledger else None,
                note=note,
            )  # fmt: skip
    finally:
        conn.close()


def bench_growth(rec: Recorder, parent: str, params: Params, pool: Sequence[bytes]) -> None:
    conn = dbapi.connect(os.path.join(parent, "growth"), autocommit=True)
    try:
        cursor = conn.cursor()
        cursor.execute("CREATE TOPIC g (CONSUMER c) WITH (min_active_partitions = 4)")
        slice_messages = params.growth_bytes // params.growth_slices // MESSAGE_BYTES
        statements = max(1, slice_messages // GROWTH_BATCH)
        data = [pool[i % len(pool)] for i in range(GROWTH_BATCH)]
        produce: list[float] = []
        for index in range(params.growth_slices):
            started = time.perf_counter()
            for _ in range(statements):
                cursor.execute(GROWTH_INSERT, [data])
            produce.append(statements * GROWTH_BATCH / (time.perf_counter() - started))
            rec.progress(
                f"growth: {(index + 1) * statements * GROWTH_BATCH * MESSAGE_BYTES / GB:.1f} GB "
                f"written, last slice {produce[-1]:,.0f} msgs/s"
            )
        consume = _read_slices(cursor, statements * GROWTH_BATCH, params.growth_slices)
        total_gb = params.growth_slices * statements * GROWTH_BATCH * MESSAGE_BYTES / GB
        first_gb = total_gb / params.growth_slices
        for metric, rates in (("produce", produce), ("consume", consume)):
            shown = ", ".join(f"{r / 1000:.0f}k" for r in rates)
            harness.record(
                rec, f"scale.growth.{metric}", harness.Spread.of(rates[-1:]),
                harness.Spread.of(rates[:1]), unit="msgs/s", group=G_GROWTH,
                baseline=f"the first {first_gb:g} GB slice",
                note=f"rate of the last of {params.growth_slices} slices ({total_gb:g} GB in "
                f"all) against the first; every slice: {shown} msgs/s",
            )  # fmt: skip
    finally:
        conn.close()


def run(rec: Recorder) -> None:
    params = QUICK if rec.quick else FULL
    parent = tempfile.mkdtemp(
        prefix="topicbase-scale-", dir=os.environ.get("TOPICBASE_BENCH_DIR") or None
    )
    try:
        pool = make_messages()
        ledger_off = functools.partial(bench_partitions, ledger=False)
        for name, body in (("partitions", bench_partitions), ("partitions, ledger off", ledger_off),
                           ("growth", bench_growth)):  # fmt: skip
            started = time.perf_counter()
            rec.progress(f"-- {name}")
            body(rec, parent, params, pool)
            rec.progress(f"-- {name} done in {time.perf_counter() - started:.1f}s")
    finally:
        shutil.rmtree(parent, ignore_errors=True)
