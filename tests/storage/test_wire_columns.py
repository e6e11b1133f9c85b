"""Many small frame bodies decoded column by column at once (``storage.wire_columns``;
issue 14, consume at 1000 partitions).

The result equals Arrow's IPC read of each body, sliced and concatenated, for random
batches with nulls in every nullable column, maps with and without entries, and any
skips and row counts; a body of another layout or a wrong row count is refused (None)
so the caller reads it with Arrow; a read over many partitions of small frames makes
no Arrow IPC read per frame.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from storage import frame_read
from storage.frame_read import FrameSlice, decode_small
from storage.record_batch import WIRE_SCHEMA, FrameHeader, build_wire_batch, serialize_body
from storage.wire_columns import decode_wire_bodies, decode_wire_spans


def _random_batch(rng: random.Random, count: int) -> pa.RecordBatch:
    def maybe(value: Any) -> Any:
        return None if rng.random() < 0.3 else value

    metadata = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.3:
            metadata.append(None)
        elif kind < 0.4:
            metadata.append({})
        else:
            metadata.append(
                {f"k{i}": maybe(bytes(rng.randrange(5))) for i in range(rng.randrange(1, 4))}
            )
    return build_wire_batch(
        [bytes(rng.randrange(256) for _ in range(rng.randrange(40))) for _ in range(count)],
        seq_no=[maybe(rng.randrange(10**9)) for _ in range(count)],
        producer_id=[maybe(f"p{rng.randrange(50)}" * rng.randrange(3)) for _ in range(count)],
        message_group_id=[maybe(f"g{rng.randrange(5)}") for _ in range(count)],
        created_at_us=[rng.randrange(10**12) for _ in range(count)],
        codec=[rng.choice([1, 2]) for _ in range(count)],
        metadata=metadata,
    )


def _compressed_body(wire: pa.RecordBatch) -> pa.Buffer:
    """``wire`` as an IPC message with zstd-compressed buffers (another layout)."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, wire.schema, options=options) as writer:
        writer.write_batch(wire)
    reader = pa.ipc.MessageReader.open_stream(sink.getvalue())
    reader.read_next_message()  # the schema
    body = reader.read_next_message().serialize()
    return pa.py_buffer(body.to_pybytes() + bytes(-body.size % 8))


def _reference(bodies: list[pa.Buffer], skips: list[int], rows: list[int]) -> pa.RecordBatch:
    wires = [
        pa.ipc.read_record_batch(body, WIRE_SCHEMA).slice(skip, count)
        for body, skip, count in zip(bodies, skips, rows, strict=True)
    ]
    return pa.concat_batches(wires)


def _decode(
    bodies: list[pa.Buffer], counts: list[int], skips: list[int], rows: list[int]
) -> pa.RecordBatch | None:
    return decode_wire_bodies(
        bodies, np.array(counts), np.array(skips, dtype=np.int64), np.array(rows, dtype=np.int64)
    )


def _random_bodies(rng: random.Random) -> tuple[list[pa.Buffer], list[int], list[int], list[int]]:
    """1-39 random frame bodies of 1-11 rows, each with a random run of rows to take:
    bodies, row counts, rows skipped, rows taken."""
    bodies, counts, skips, rows = [], [], [], []
    for _ in range(rng.randrange(1, 40)):
        count = rng.randrange(1, 12)
        bodies.append(pa.py_buffer(serialize_body(_random_batch(rng, count))))
        skip = rng.randrange(count)
        counts.append(count)
        skips.append(skip)
        rows.append(rng.randrange(1, count - skip + 1))
    return bodies, counts, skips, rows


@pytest.mark.parametrize("seed", range(12))
def test_columns_equal_arrow_reads_sliced_and_concatenated(seed: int) -> None:
    rng = random.Random(seed)
    bodies, counts, skips, rows = _random_bodies(rng)
    decoded = _decode(bodies, counts, skips, rows)
    assert decoded is not None
    expected = _reference(bodies, skips, rows)
    decoded.validate(full=True)
    assert decoded.equals(expected)
    assert decoded.to_pylist() == expected.to_pylist()


def _spans(bodies: list[pa.Buffer], gaps: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The bodies laid in one array, each after ``gaps[k]`` bytes of other bytes (as a
    read of many partitions lays frames after their headers): array, starts, sizes."""
    parts, starts, at = [], [], 0
    for body, gap in zip(bodies, gaps, strict=True):
        parts += [b"\xee" * gap, body.to_pybytes()]
        starts.append(at + gap)
        at += gap + body.size
    big = np.frombuffer(b"".join(parts) + bytes(-at % 8), dtype=np.uint8).copy()
    sizes = np.array([body.size for body in bodies], dtype=np.int64)
    return big, np.array(starts, dtype=np.int64), sizes


@pytest.mark.parametrize("seed", range(12))
def test_spans_of_one_array_equal_arrow_reads(seed: int) -> None:
    rng = random.Random(seed)
    bodies, counts, skips, rows = _random_bodies(rng)
    big, starts, sizes = _spans(bodies, [8 * rng.randrange(7) for _ in bodies])
    decoded = decode_wire_spans(
        big, starts, sizes, np.array(counts), np.array(skips), np.array(rows)
    )
    assert decoded is not None
    expected = _reference(bodies, skips, rows)
    decoded.validate(full=True)
    assert decoded.equals(expected)
    assert decoded.to_pylist() == expected.to_pylist()


def test_spans_of_another_layout_or_misaligned_are_refused(batch: Any) -> None:
    plain = pa.py_buffer(serialize_body(batch(3)))
    compressed = _compressed_body(batch(3))
    ones = np.array([3, 3]), np.array([0, 0]), np.array([3, 3])
    big, starts, sizes = _spans([plain, compressed], [48, 48])
    assert decode_wire_spans(big, starts, sizes, *ones) is None
    big, starts, sizes = _spans([plain, plain], [48, 48])
    assert decode_wire_spans(big, starts, sizes, *ones) is not None
    assert decode_wire_spans(big, starts, sizes, np.array([3, 4]), *ones[1:]) is None
    assert decode_wire_spans(big, starts + 4, sizes, *ones) is None  # not 8-aligned


def test_bodies_without_nulls_or_metadata(batch: Any) -> None:
    bodies = [pa.py_buffer(serialize_body(batch(5, first=5 * i))) for i in range(10)]
    decoded = _decode(bodies, [5] * 10, [0] * 10, [5] * 10)
    assert decoded is not None and decoded.equals(_reference(bodies, [0] * 10, [5] * 10))


def test_another_layout_or_a_wrong_count_is_refused(batch: Any) -> None:
    plain = pa.py_buffer(serialize_body(batch(3)))
    compressed = _compressed_body(batch(3))
    assert _decode([plain, compressed], [3, 3], [0, 0], [3, 3]) is None
    assert _decode([compressed, plain], [3, 3], [0, 0], [3, 3]) is None
    assert _decode([plain, plain], [3, 4], [0, 0], [3, 3]) is None
    assert _decode([plain, plain], [3, 3], [0, 2], [3, 2]) is None  # past the body's rows
    torn = pa.py_buffer(plain.to_pybytes()[:64])
    assert _decode([plain, torn], [3, 3], [0, 0], [3, 3]) is None


def test_a_refused_run_is_read_with_arrow(batch: Any) -> None:
    slices = []
    for index in range(10):
        wire = batch(3, first=3 * index)
        # one body of another layout (compressed): the run goes through Arrow
        body = _compressed_body(wire) if index == 6 else pa.py_buffer(serialize_body(wire))
        header = FrameHeader(0, 3 * index, 1000 + index, 3, body.size, 0)
        slices.append(FrameSlice(header, body, 1 if index == 2 else 0, 2 if index == 2 else 3))
    rows = decode_small(slices).to_pylist()
    expected = [3 * i + j for i in range(10) for j in range(3) if (i, j) != (2, 0)]
    assert [row["offset"] for row in rows] == expected
    assert [bytes(row["data"]).rstrip(b".") for row in rows] == [f"m{o}".encode() for o in expected]


def test_a_read_of_many_small_frames_makes_no_ipc_read_per_frame(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = open_partition()
    for index in range(50):
        partition.append(batch(3, first=3 * index))
    reads = []
    original = pa.ipc.read_record_batch

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(frame_read.pa.ipc, "read_record_batch", counted)
    found = partition.read_frames(0, max_messages=1000)
    decoded = decode_small(found.slices)
    assert [row["offset"] for row in decoded.to_pylist()] == list(range(150))
    assert reads == []
