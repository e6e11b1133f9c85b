"""Prototype measurement (issue 14, ``scale.partitions_1000``): what a shared log of
small shares (a "ledger") would cost, run on the real pieces. Not a design in use.

Today a 5,000-message statement over 1000 partitions writes every share twice: as a
frame in the staging log (the commit point) and as a frame in its partition's file
(1000 ``pwritev``s, 1000 frame headers and CRCs, index entries). A consumer poll of
20,000 messages then walks 4,000 frames of 5 messages in 1000 files. In the ledger
design a statement's small shares are written once, as one frame in partition order in a
shared log, and each partition keeps only an index into it (offset -> ledger frame and
row), as arrays; a poll reads whole statement frames, decoded zero-copy as at 10
partitions.

``python -m bench.scale_ledger`` prints, per statement and per poll (thread CPU, medians):

- produce: ``spread_append.append_now`` as it is (route, shares, checks, staging
  encode, the commit, the 1000 publishes) at 1000 and 10 partitions, and the ledger's
  steps on the same statement at 1000: route and shares (the real ``TopicLog.route`` and
  ``shares``), the producer-state decision (the real ``decide_shares``, under the 1000
  write locks), one serialize of the statement and its CRC, one ``pwritev``, the index
  and end offsets as array updates, and the producer entries (the real ``record_shares``);
- consume: the real poll (statement and ``fetchall``) at 1000 and 10 partitions, its
  storage read and decode (``engine.reads._read_all`` and ``_relation``), and the
  ledger's read of the same 20,000 messages: 4 statement frames from a map, one CRC
  pass each, a zero-copy IPC read each, the offset column in one numpy pass, and then
  either the frames as they are (partitions interleaved by statement, each partition's
  messages in offset order) or one ``take`` into partition order.

The staging sync and the commit record are the same in both designs and left out of
the ledger's figures.
"""

from __future__ import annotations

import functools
import mmap
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import crc32c
import numpy as np
import pyarrow as pa

import engine.reads as reads
import engine.spread_append as spread_append
from bench.storage_bench import make_messages
from sql import dbapi
from storage.producer_state import decide_shares, record_shares
from storage.record_batch import (
    HEADER_BYTES,
    WIRE_SCHEMA,
    encode_frame_header,
    serialize_body_buffer,
)

STATEMENT = 5000
PRODUCERS = 2000
POLL = 20_000
INSERT = "INSERT INTO TOPIC {} (data, producer_id) SELECT unnest(?), unnest(?)"


def _cpu() -> float:
    return time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.1f}"


def _timed(target: Any, name: str, into: dict[str, list[float]]) -> Callable[[], None]:
    """Wrap ``target.name`` to add its thread CPU to ``into[name]``; returns the undo."""
    original = getattr(target, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = _cpu()
        try:
            return original(*args, **kwargs)
        finally:
            into.setdefault(name, []).append(_cpu() - started)

    setattr(target, name, timed)
    return lambda: setattr(target, name, original)


def produce(directory: str, data: list[bytes], ids: list[str], statements: int) -> None:
    for partitions in (1000, 10):
        conn = dbapi.connect(os.path.join(directory, f"produce{partitions}"), autocommit=True)
        cursor = conn.cursor()
        cursor.execute(f"CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = {partitions})")
        seen: dict[str, Any] = {}
        original = spread_append.append_now
        spread_append.append_now = functools.partial(_capture, original, seen)
        try:
            for _ in range(3):  # the first creates the files
                cursor.execute(INSERT.format("t"), [data, ids])
        finally:
            spread_append.append_now = original
        spent: dict[str, list[float]] = {}
        undo = _timed(spread_append, "append_now", spent)
        try:
            for _ in range(statements):
                cursor.execute(INSERT.format("t"), [data, ids])
        finally:
            undo()
        line = f"produce, {partitions} partitions: append_now today {_ms(spent['append_now'])} ms"
        if partitions == 1000:
            steps = _ledger_produce(directory, seen["database"].topic_log(seen["topic_id"]),
                                    seen["batch"], statements)  # fmt: skip
            line += "; ledger " + ", ".join(f"{k} {_ms(v)}" for k, v in steps.items())
        print(line, flush=True)
        conn.close()


def _capture(original: Callable[..., Any], seen: dict[str, Any], database: Any,
             topic_id: str, batch: pa.RecordBatch, *rest: Any) -> Any:  # fmt: skip
    seen.update(database=database, topic_id=topic_id, batch=batch)
    return original(database, topic_id, batch, *rest)


def _ledger_produce(
    directory: str, topic: Any, batch: pa.RecordBatch, statements: int
) -> dict[str, list[float]]:
    names = ("route+shares", "decide", "serialize+crc", "pwritev", "index", "record_share",
             "total")  # fmt: skip
    steps: dict[str, list[float]] = {name: [] for name in names}
    fd = os.open(os.path.join(directory, "ledger.log"), os.O_CREAT | os.O_WRONLY, 0o644)
    ends = np.zeros(len(topic.partition_ids()), np.int64)
    index: list[tuple[np.ndarray, ...]] = []
    position = 0
    try:
        for _ in range(statements):
            t0 = _cpu()
            shares = topic.shares(batch, topic.route(batch))
            t1 = _cpu()
            # as the ledger path reads them: ids, counts and the one batch (no share's own)
            assert shares.whole is not None, "a spread statement: one batch, sliced"
            logs = [topic.partition(partition) for partition in shares.partition_ids]
            counts = shares.counts
            for log in logs:
                log.write_lock.acquire()
            try:
                whole = pa.Table.from_batches([shares.whole])
                decision = decide_shares([log.producers for log in logs], shares.pieces, whole,
                                         counts)  # fmt: skip
                assert decision is not None
                t2 = _cpu()
                body = serialize_body_buffer(whole.to_batches()[0])
                header = encode_frame_header(
                    body, base_offset=0, written_at_us=0, record_count=whole.num_rows,
                    transaction_id=1)  # fmt: skip
                t3 = _cpu()
                os.pwritev(fd, [header, body], position)
                t4 = _cpu()
                ids = np.array(shares.partition_ids, np.int64)
                bases = ends[ids]
                ends[ids] += counts
                index.append((ids, bases, np.full(len(ids), position), np.cumsum(counts) - counts))
                position += len(header) + body.size
                t5 = _cpu()
                now_us = time.time_ns() // 1000
                # at offsets apart from the real ones
                record_shares([log.producers for log in logs], decision,
                              (bases + 10**12).tolist(), now_us)  # fmt: skip
                t6 = _cpu()
            finally:
                for log in logs:
                    log.write_lock.release()
            for key, value in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5,
                                          t6 - t0), strict=True):  # fmt: skip
                steps[key].append(value)
    finally:
        os.close(fd)
    return steps


def consume(directory: str, data: list[bytes], ids: list[str], polls: int) -> None:
    conn = dbapi.connect(os.path.join(directory, "consume"), autocommit=True)
    cursor = conn.cursor()
    for partitions in (1000, 10):
        cursor.execute(f"CREATE TOPIC p{partitions} (CONSUMER c) "
                       f"WITH (min_active_partitions = {partitions})")  # fmt: skip
    spent: dict[int, dict[str, list[float]]] = {1000: {}, 10: {}}
    for round_ in range(polls + 1):
        for partitions in (1000, 10):
            for _ in range(POLL // STATEMENT):
                cursor.execute(INSERT.format(f"p{partitions}"), [data, ids])
            phases: dict[str, list[float]] = {}
            undo = [_timed(reads, name, phases) for name in ("_read_all", "_relation")]
            started = _cpu()
            try:
                cursor.execute(f"SELECT data FROM TOPIC p{partitions} "
                               f"WITH (consumer = 'c', max_messages = {POLL})")  # fmt: skip
                assert len(cursor.fetchall()) == POLL
            finally:
                for step in undo:
                    step()
            if round_:  # the first dropped
                spent[partitions].setdefault("poll", []).append(_cpu() - started)
                for name, values in phases.items():
                    spent[partitions].setdefault(name, []).append(sum(values))
    conn.close()
    for partitions, phases in spent.items():
        print(f"consume, {partitions} partitions, today: "
              + ", ".join(f"{k} {_ms(v)} ms" for k, v in phases.items()), flush=True)  # fmt: skip
    ledger = _ledger_consume(directory, data, ids, polls)
    print("consume, 1000 partitions, ledger read: "
          + ", ".join(f"{k} {_ms(v)} ms" for k, v in ledger.items()))  # fmt: skip


def _ledger_consume(directory: str, data: list[bytes], ids: list[str],
                    polls: int) -> dict[str, list[float]]:  # fmt: skip
    """4 statement frames (rows in partition order, keyed as the bench routes: producer
    ``k`` to one partition) read back as one poll."""
    batch = pa.RecordBatch.from_pydict(
        {"seq_no": pa.array(np.arange(STATEMENT), pa.int64()), "producer_id": ids,
         "message_group_id": pa.nulls(STATEMENT, pa.string()),
         "created_at": pa.nulls(STATEMENT, WIRE_SCHEMA.field(3).type),
         "codec": pa.array(np.zeros(STATEMENT, np.uint8)), "data": pa.array(data, pa.binary()),
         "metadata": pa.nulls(STATEMENT, WIRE_SCHEMA.field(6).type)},
        schema=WIRE_SCHEMA,
    )  # fmt: skip
    targets = np.arange(STATEMENT) % PRODUCERS % 1000
    order = np.argsort(targets, kind="stable")
    partitions = targets[order]
    whole = batch.take(pa.array(order))
    per_partition = np.bincount(partitions, minlength=1000)
    frames = []
    path = os.path.join(directory, "ledger_read.log")
    with open(path, "wb") as out:
        for _ in range(POLL // STATEMENT):
            body = serialize_body_buffer(whole)
            header = encode_frame_header(body, base_offset=0, written_at_us=0,
                                         record_count=STATEMENT, transaction_id=1)  # fmt: skip
            frames.append((out.tell(), body.size))
            out.write(header)
            out.write(body)
    spent: dict[str, list[float]] = {"as written": [], "in partition order": []}
    statement_rank = np.repeat(np.arange(len(frames)), STATEMENT)
    row_in_partition = np.arange(STATEMENT) - np.repeat(np.cumsum(per_partition) - per_partition,
                                                        per_partition)  # fmt: skip
    with open(path, "rb") as source:
        mapped = mmap.mmap(source.fileno(), 0, prot=mmap.PROT_READ)
        try:
            buffer = pa.py_buffer(mapped)
            for _ in range(polls * 2):
                for mode in spent:
                    started = _cpu()
                    batches = []
                    for position, size in frames:
                        crc32c.crc32c(buffer.slice(position + 8, HEADER_BYTES - 8 + size))
                        batches.append(pa.ipc.read_record_batch(
                            buffer.slice(position + HEADER_BYTES, size), WIRE_SCHEMA))  # fmt: skip
                    # each row's offset: its partition's base in that statement, plus its rank
                    offsets = (np.repeat(np.arange(len(frames)), STATEMENT)
                               * np.tile(per_partition[partitions], len(frames))
                               + np.tile(row_in_partition, len(frames)))  # fmt: skip
                    table = pa.Table.from_batches(batches)
                    if mode == "in partition order":
                        key = np.lexsort((statement_rank, np.tile(partitions, len(frames))))
                        table = table.take(pa.array(key)).combine_chunks()
                        offsets = offsets[key]
                    table.append_column("offset", pa.array(offsets))
                    spent[mode].append(_cpu() - started)
            del buffer, batches, table
        finally:
            mapped.close()
    return spent


def main() -> None:
    pool = make_messages()
    data = [pool[i % len(pool)] for i in range(STATEMENT)]
    ids = [f"producer-{i % PRODUCERS}" for i in range(STATEMENT)]
    directory = tempfile.mkdtemp(prefix="scale_ledger_")
    try:
        produce(directory, data, ids, statements=12)
        consume(directory, data, ids, polls=8)
    finally:
        shutil.rmtree(directory)


if __name__ == "__main__":
    main()
