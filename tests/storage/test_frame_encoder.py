"""Tests of ``record_batch.FrameEncoder``: the zero-copy append path writes the one frame format.

The encoder must give, byte for byte, the frame that ``encode_frame(serialize_body(batch))``
gives (the format readers, recovery, check and staging know), without copying the batch's
buffers.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import record_batch
from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.partition_log import PartitionLog
from storage.record_batch import (
    HEADER_BYTES,
    FrameEncoder,
    build_wire_batch,
    decode_header,
    encode_frame,
    serialize_body,
)


def _joined(parts: list) -> bytes:
    return b"".join(bytes(memoryview(part)) for part in parts)


def _reference_frame(
    batch: pa.RecordBatch, base_offset: int, written_at_us: int, transaction_id: int = 0
) -> bytes:
    return encode_frame(
        serialize_body(batch),
        base_offset=base_offset,
        written_at_us=written_at_us,
        record_count=batch.num_rows,
        transaction_id=transaction_id,
    )


_metadata = st.one_of(
    st.none(), st.dictionaries(st.text(max_size=5), st.binary(max_size=10), max_size=3)
)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.binary(max_size=200), st.one_of(st.none(), st.text(max_size=8)), _metadata),
        min_size=1,
        max_size=40,
    ),
    slice_start=st.integers(0, 39),
    base_offset=st.integers(0, 2**40),
    written_at_us=st.integers(0, 2**62),
    transaction_id=st.integers(0, 2**63),
)
def test_encoded_frame_is_byte_identical_to_the_serialized_frame(
    rows: list, slice_start: int, base_offset: int, written_at_us: int, transaction_id: int
) -> None:
    batch = build_wire_batch(
        [data for data, _, _ in rows],
        seq_no=list(range(len(rows))),
        producer_id="p",
        message_group_id=[group for _, group, _ in rows],
        created_at_us=[7 * i for i in range(len(rows))],
        metadata=[metadata for _, _, metadata in rows],
    )
    start = min(slice_start, len(rows) - 1)
    sliced = batch.slice(start)  # offsets not starting at 0: the writer rebases them
    encoder = FrameEncoder()
    saved = record_batch._JOINED_BELOW_BYTES
    try:
        # Small batches take one serialize() (the joined path); -1 sends every batch
        # through the zero-copy writer, so both paths are held to the reference.
        for joined_below in (saved, -1):
            record_batch._JOINED_BELOW_BYTES = joined_below
            for candidate in (batch, sliced):
                parts, header = encoder.encode(
                    candidate,
                    base_offset=base_offset,
                    written_at_us=written_at_us,
                    transaction_id=transaction_id,
                )
                frame = _joined(parts)
                reference = _reference_frame(candidate, base_offset, written_at_us, transaction_id)
                assert frame == reference
                assert decode_header(frame) == header
                assert header.frame_bytes == len(frame) and header.body_bytes % 8 == 0
    finally:
        record_batch._JOINED_BELOW_BYTES = saved


def test_encoded_parts_hold_the_batch_data_buffer_itself() -> None:
    batch = build_wire_batch([b"x" * 4096] * 256, seq_no=list(range(256)), producer_id="p")
    data_buffer = batch.column(5).buffers()[2]
    parts, header = FrameEncoder().encode(batch, base_offset=0, written_at_us=1)
    addresses = [part.address for part in parts if isinstance(part, pa.Buffer)]
    assert data_buffer.address in addresses  # written from where it is, not copied
    assert header.record_count == 256


def test_encoder_recovers_after_a_failed_encode() -> None:
    encoder = FrameEncoder()
    wrong = pa.RecordBatch.from_pydict({"x": [1, 2]})
    with pytest.raises(pa.ArrowInvalid):
        encoder.encode(wrong, base_offset=0, written_at_us=1)
    batch = build_wire_batch([b"a", b"bc"], seq_no=[0, 1], producer_id="p")
    parts, _ = encoder.encode(batch, base_offset=3, written_at_us=4)
    assert _joined(parts) == _reference_frame(batch, 3, 4)


def test_appended_log_file_holds_the_reference_frames(tmp_path: os.PathLike) -> None:
    clock = ManualClock()
    directory = os.path.join(str(tmp_path), "p0")
    os.makedirs(directory)
    config = TopicConfig(fsync_policy=FsyncPolicy.NEVER, retention_ms=None)
    log = PartitionLog(FileSystem(), directory, 0, config, clock)
    batches = [
        build_wire_batch(
            [b"m" * (i + 1)] * (i + 1), seq_no=list(range(10 * i, 10 * i + i + 1)), producer_id="p"
        )
        for i in range(5)
    ]
    expected = b""
    offset = 0
    for batch in batches:
        log.append(batch)
        written_at = log.segments[-1].last_written_at_us
        assert written_at is not None
        expected += _reference_frame(batch, offset, written_at)
        offset += batch.num_rows
    log.close()
    (log_name,) = [name for name in os.listdir(directory) if name.endswith(".log")]
    with open(os.path.join(directory, log_name), "rb") as file:
        on_disk = file.read()
    assert on_disk == expected
    assert len(on_disk) > HEADER_BYTES
