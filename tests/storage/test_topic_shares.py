"""``TopicLog.shares``: one take, then slices, that encode as small as a take per share.

A statement spread over many partitions is split by ``TopicLog.shares``: each share must
hold exactly its rows in order, encode (staging's ``serialize_body_buffer``, a
partition's ``FrameEncoder``) to a body that decodes to its rows and is about as small
as its own take's (not the whole statement's buffers), and take the copying encoder
path although ``get_total_buffer_size`` of a slice counts the whole statement's.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from storage import record_batch
from storage.record_batch import (
    WIRE_SCHEMA,
    FrameEncoder,
    build_wire_batch,
    decode_header,
    serialize_body,
    serialize_body_buffer,
)
from storage.topic_log import TopicLog


def _statement(count: int = 2000, metadata: bool = False) -> tuple[pa.RecordBatch, np.ndarray]:
    batch = build_wire_batch(
        [bytes([65 + i % 26]) * (100 + i % 7) for i in range(count)],
        producer_id=[f"p{i % 300}" for i in range(count)],
        metadata=[{"k": b"v"} if i % 2 else None for i in range(count)] if metadata else None,
    )
    targets = np.array([(i % 300) * 7 % 100 for i in range(count)], dtype=np.int64)
    return batch, targets


def test_each_share_holds_its_rows_in_order_and_encodes_as_its_own_take() -> None:
    batch, targets = _statement()
    shares = TopicLog.shares(None, batch, targets)  # type: ignore[arg-type]
    assert [p for p, _, _ in shares] == sorted(set(targets.tolist()))
    assert sorted(np.concatenate([rows for _, rows, _ in shares]).tolist()) == list(range(2000))
    for partition, rows, piece in shares:
        assert (targets[rows] == partition).all() and (np.diff(rows) > 0).all()
        taken = batch.take(pa.array(rows))
        assert piece.equals(taken)
        # its rows, in about the take's bytes (a few bitmap bytes more), not the
        # whole statement's buffers
        body = serialize_body_buffer(piece)
        assert pa.ipc.read_record_batch(body, WIRE_SCHEMA).equals(taken)
        assert body.size <= len(serialize_body(taken)) + 512
        assert piece.get_total_buffer_size() > 20 * taken.get_total_buffer_size()


def test_a_small_slice_takes_the_copying_encoder_path_with_the_same_bytes() -> None:
    batch, targets = _statement(5000)  # ~50 rows a share, the statement over the copy bound
    _, rows, piece = TopicLog.shares(None, batch, targets)[5]  # type: ignore[arg-type]
    assert piece.get_total_buffer_size() > record_batch._JOINED_BELOW_BYTES
    parts, header = FrameEncoder().encode(piece, base_offset=7, written_at_us=1)
    assert len(parts) == 2, "joined: header and one body"
    joined = b"".join(memoryview(p).cast("B") for p in parts)
    assert decode_header(joined) == header and header.record_count == len(rows)
    assert joined[record_batch.HEADER_BYTES :] == serialize_body(piece)
    body = pa.py_buffer(joined[record_batch.HEADER_BYTES :])
    assert pa.ipc.read_record_batch(body, WIRE_SCHEMA).equals(batch.take(pa.array(rows)))


def test_a_moves_slice_of_a_frame_takes_the_copying_encoder_path_with_the_same_bytes() -> None:
    """A move of 100 messages of 1 KiB out of a 1000-message frame (the move's share is
    ``raw_data_batch`` of a slice of the frame's data): ~100 KiB, so copied once, not the
    zero-copy path's ~28 parts (round 17)."""
    frame = build_wire_batch([bytes([65 + i % 26]) * 1024 for i in range(1000)])
    data = frame.column(5).slice(300, 100)
    columns = [
        data if field.name == "data"
        else pa.array([0] * 100, field.type) if field.name in ("codec", "created_at")
        else pa.nulls(100, field.type)
        for field in WIRE_SCHEMA
    ]  # fmt: skip
    piece = pa.RecordBatch.from_arrays(columns, schema=WIRE_SCHEMA)
    assert piece.get_total_buffer_size() > record_batch._JOINED_BELOW_BYTES
    parts, header = FrameEncoder().encode(piece, base_offset=7, written_at_us=1)
    assert len(parts) == 2, "joined: header and one body"
    joined = b"".join(memoryview(p).cast("B") for p in parts)
    assert decode_header(joined) == header and header.record_count == 100
    assert joined[record_batch.HEADER_BYTES :] == serialize_body(piece)


def test_shares_with_metadata_are_taken_one_by_one() -> None:
    """A sliced map column would be encoded with its parent's child offsets whole."""
    batch, targets = _statement(metadata=True)
    for _, rows, piece in TopicLog.shares(None, batch, targets):  # type: ignore[arg-type]
        taken = batch.take(pa.array(rows))
        assert piece.equals(taken)
        assert piece.get_total_buffer_size() == taken.get_total_buffer_size()


def test_shares_index_as_a_sequence_and_make_each_batch_once() -> None:
    batch, targets = _statement(600)
    shares = TopicLog.shares(None, batch, targets)  # type: ignore[arg-type]
    count = len(shares)
    assert shares[-1][0] == shares[count - 1][0] == max(targets.tolist())
    assert [p for p, _, _ in shares[1:3]] == shares.partition_ids[1:3]
    assert [p.num_rows for p in shares.pieces[::-1]] == shares.counts[::-1].tolist()
    for bad in (count, -count - 1):
        with pytest.raises(IndexError):
            shares[bad]
        with pytest.raises(IndexError):
            shares.pieces[bad]
    assert shares.piece(2) is shares[2][2] is shares.pieces[2], "made once, then kept"
    assert (np.concatenate([rows for _, rows, _ in shares]) == shares.order).all()
