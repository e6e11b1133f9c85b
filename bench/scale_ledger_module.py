"""The ledger module's own costs (``storage.ledger``, round 27) against the steps of the
round 10-12 prototype (``bench/scale_ledger.py``) on the same statement and poll.

``python -m bench.scale_ledger_module`` (thread CPU, per statement or poll; A/B alternated,
``PAIRS`` pairs, medians and ranges):

- produce, a 5,000-message statement over 1000 partitions (5 messages a share, keyed as
  the scale bench routes: producer ``k`` to partition ``k % 1000``); the shares are slices
  made beforehand (route and shares are the caller's, as in the prototype):
  A, the prototype's write steps: one concatenation and serialize with its CRC, one
  ``pwritev``, the index as arrays; B, ``Ledger.append`` with the syncs of a file system
  that does not sync (the prototype's figures leave the sync out: it is the staging log's
  today); C, ``Ledger.append`` as it is (fdatasync included);
- consume, a poll of 20,000 messages (4 statements' frames) over the 1000 partitions:
  A, the prototype's read as written (``scale_ledger._ledger_consume``'s first mode:
  a CRC pass, a zero-copy IPC read and the offset column a frame); B, ``Ledger.read_many``
  from every partition's start (frames already verified once: the first read of each
  frame checks its CRC, the later reads of the same mapped bytes do not); C, the same
  with every frame's CRC checked again (a first read after an open).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import crc32c
import numpy as np
import pyarrow as pa

from bench.scale_ledger import PRODUCERS, STATEMENT
from bench.storage_bench import make_messages
from storage.fs import FileSystem
from storage.ledger import Ledger
from storage.record_batch import build_wire_batch, encode_frame_header, serialize_body_buffer

PARTITIONS = 1000
PAIRS = 9
POLL = 20_000


class _NoSync(FileSystem):
    def sync(self, fd: int) -> None:
        pass


def _cpu() -> float:
    return time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)


def _summary(values: list[float]) -> str:
    ms = [v * 1e3 for v in values]
    return f"{statistics.median(ms):.2f} ms (range {min(ms):.2f}-{max(ms):.2f}, n={len(ms)})"


def _statement() -> list[tuple[int, pa.RecordBatch]]:
    pool = make_messages()
    targets = np.arange(STATEMENT) % PRODUCERS % PARTITIONS
    order = np.argsort(targets, kind="stable")
    batch = build_wire_batch([pool[i % len(pool)] for i in order.tolist()],
                             producer_id=[f"producer-{i % PRODUCERS}" for i in order.tolist()],
                             seq_no=list(range(STATEMENT)))  # fmt: skip
    counts = np.bincount(targets, minlength=PARTITIONS)
    starts = np.cumsum(counts) - counts
    pairs = zip(starts.tolist(), counts.tolist(), strict=True)
    return [(p, batch.slice(s, c)) for p, (s, c) in enumerate(pairs)]


def _prototype_write(fd: int, shares: list[tuple[int, pa.RecordBatch]], ends: np.ndarray,
                     state: dict) -> float:  # fmt: skip
    started = _cpu()
    whole = pa.Table.from_batches([s for _, s in shares]).combine_chunks()
    body = serialize_body_buffer(whole.to_batches()[0])
    header = encode_frame_header(body, base_offset=0, written_at_us=0,
                                 record_count=whole.num_rows, transaction_id=1)  # fmt: skip
    os.pwritev(fd, [header, body], state["position"])
    ids = np.fromiter((p for p, _ in shares), np.int64, len(shares))
    counts = np.fromiter((s.num_rows for _, s in shares), np.int64, len(shares))
    bases = ends[ids]
    ends[ids] += counts
    state["index"].append((ids, bases, np.full(len(ids), state["position"]),
                           np.cumsum(counts) - counts))  # fmt: skip
    state["position"] += len(header) + body.size
    return _cpu() - started


def produce(directory: str, shares: list[tuple[int, pa.RecordBatch]]) -> None:
    fd = os.open(os.path.join(directory, "prototype.log"), os.O_CREAT | os.O_WRONLY, 0o644)
    state = {"position": 0, "index": []}
    ends = np.zeros(PARTITIONS, np.int64)
    nosync = Ledger(_NoSync(), os.path.join(directory, "nosync"))
    synced = Ledger(FileSystem(), os.path.join(directory, "synced"))
    spent: dict[str, list[float]] = {"A prototype steps": [], "B Ledger.append, no sync": [],
                                     "C Ledger.append, fdatasync": []}  # fmt: skip
    try:
        for pair in range(PAIRS + 1):
            a = _prototype_write(fd, shares, ends, state)
            started = _cpu()
            nosync.append(shares)
            b = _cpu() - started
            started = _cpu()
            synced.append(shares)
            c = _cpu() - started
            if pair:  # the first round warms up
                for key, value in zip(spent, (a, b, c), strict=True):
                    spent[key].append(value)
    finally:
        os.close(fd)
        nosync.close()
        synced.close()
    for key, values in spent.items():
        print(f"produce, 1000 partitions, {key}: {_summary(values)}", flush=True)


def consume(directory: str, shares: list[tuple[int, pa.RecordBatch]]) -> None:
    path = os.path.join(directory, "poll")
    ledger = Ledger(FileSystem(), path)
    for _ in range(POLL // STATEMENT):
        ledger.append(shares)
    ledger.read_many(dict.fromkeys(range(PARTITIONS), 0), POLL)  # verifies each frame once
    frames, view = _prototype_frames(shares, directory)
    spent: dict[str, list[float]] = {"A prototype read as written": [],
                                     "B Ledger.read_many": [],
                                     "C Ledger.read_many, every frame's CRC again": []}  # fmt: skip
    try:
        for _ in range(PAIRS):
            started = _cpu()
            _prototype_read(frames, view, shares)
            spent["A prototype read as written"].append(_cpu() - started)
            started = _cpu()
            table, _ = ledger.read_many(dict.fromkeys(range(PARTITIONS), 0), POLL)
            assert table.num_rows == POLL
            spent["B Ledger.read_many"].append(_cpu() - started)
            ledger._verified.clear()  # the bench's view of the first read after an open
            started = _cpu()
            table, _ = ledger.read_many(dict.fromkeys(range(PARTITIONS), 0), POLL)
            spent["C Ledger.read_many, every frame's CRC again"].append(_cpu() - started)
    finally:
        ledger.close()
    for key, values in spent.items():
        print(f"consume, 1000 partitions, 20,000 messages, {key}: {_summary(values)}",
              flush=True)  # fmt: skip


def _prototype_frames(shares: list[tuple[int, pa.RecordBatch]], directory: str):
    whole = pa.Table.from_batches([s for _, s in shares]).combine_chunks().to_batches()[0]
    body = serialize_body_buffer(whole)
    header = encode_frame_header(body, base_offset=0, written_at_us=0,
                                 record_count=whole.num_rows, transaction_id=1)  # fmt: skip
    raw = (header + body.to_pybytes()) * (POLL // STATEMENT)
    frames = [(i * (len(header) + body.size), body.size) for i in range(POLL // STATEMENT)]
    return frames, pa.py_buffer(raw)


def _prototype_read(frames, buffer: pa.Buffer, shares) -> None:
    counts = np.fromiter((s.num_rows for _, s in shares), np.int64, len(shares))
    partitions = np.repeat(np.arange(len(shares)), counts)
    row_in_partition = np.arange(STATEMENT) - np.repeat(np.cumsum(counts) - counts, counts)
    batches = []
    for position, size in frames:
        crc32c.crc32c(buffer.slice(position + 8, 48 - 8 + size))
        batches.append(pa.ipc.read_record_batch(buffer.slice(position + 48, size),
                                                pa.schema(shares[0][1].schema)))  # fmt: skip
    offsets = (np.repeat(np.arange(len(frames)), STATEMENT) * np.tile(counts[partitions],
               len(frames)) + np.tile(row_in_partition, len(frames)))  # fmt: skip
    table = pa.Table.from_batches(batches)
    table.append_column("offset", pa.array(offsets))


def main() -> None:
    shares = _statement()
    directory = tempfile.mkdtemp(prefix="ledger_module_")
    try:
        print(f"load {os.getloadavg()[0]:.1f}, {time.strftime('%H:%M', time.gmtime())} UTC")
        produce(directory, shares)
        consume(directory, shares)
    finally:
        shutil.rmtree(directory)


if __name__ == "__main__":
    main()
