"""Frames of small appends (group commit's coalesced rounds, single messages).

``FrameEncoder`` copies batches under ``_JOINED_BELOW_BYTES`` with one
``serialize()`` instead of its zero-copy part list: these tests hold that both
give the very same frame (bytes and decoded header), that the switch happens at
the threshold, and that a group-committed partition reads back what it got.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from storage import record_batch
from storage.config import FsyncPolicy
from storage.partition_log import PartitionLog
from storage.record_batch import (
    FrameEncoder,
    FrameHeader,
    build_wire_batch,
    decode_header,
    serialize_body,
)


def _joined(parts: list[Any]) -> bytes:
    return b"".join(memoryview(part).cast("B") for part in parts)


def _encode(
    batch: pa.RecordBatch, *, zero_copy: bool, transaction_id: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[bytes, FrameHeader, int]:
    """The frame bytes, decoded header and number of parts of one encoding path."""
    with monkeypatch.context() as patch:
        if zero_copy:
            patch.setattr(record_batch, "_JOINED_BELOW_BYTES", -1)
        parts, header = FrameEncoder().encode(
            batch,
            base_offset=41,
            written_at_us=1_700_000_000_000_000,
            transaction_id=transaction_id,
        )
    return _joined(parts), header, len(parts)


@pytest.mark.parametrize("transaction_id", [0, 9])
@pytest.mark.parametrize("messages", [1, 3, 16])
def test_small_batch_copy_and_zero_copy_give_the_same_frame(
    messages: int, transaction_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = build_wire_batch(
        [bytes([65 + i]) * (100 + 37 * i) for i in range(messages)],
        seq_no=list(range(messages)),
        producer_id="p",
        metadata=[{"k": b"v"} if i % 2 else None for i in range(messages)],
    )
    assert batch.get_total_buffer_size() <= record_batch._JOINED_BELOW_BYTES
    copied, copied_header, copied_parts = _encode(
        batch, zero_copy=False, transaction_id=transaction_id, monkeypatch=monkeypatch
    )
    zero, zero_header, zero_parts = _encode(
        batch, zero_copy=True, transaction_id=transaction_id, monkeypatch=monkeypatch
    )
    assert copied_parts == 2 < zero_parts, "the small batch took the copying path"
    assert copied == zero
    assert copied_header == zero_header == decode_header(copied)
    assert copied[record_batch.HEADER_BYTES :] == serialize_body(batch)


def test_batch_over_the_threshold_keeps_the_zero_copy_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch = build_wire_batch([b"x" * 1000] * 4)
    monkeypatch.setattr(record_batch, "_JOINED_BELOW_BYTES", batch.get_total_buffer_size() - 1)
    parts, header = FrameEncoder().encode(batch, base_offset=0, written_at_us=1)
    assert len(parts) > 2
    assert _joined(parts)[record_batch.HEADER_BYTES :] == serialize_body(batch)
    assert header == decode_header(_joined(parts))


def test_concurrent_single_messages_read_back_whole_and_in_producer_order(
    open_partition: Callable[..., PartitionLog],
    read_all: Callable[..., list[dict[str, Any]]],
) -> None:
    partition = open_partition(fsync_policy=FsyncPolicy.GROUP)
    threads, appends = 8, 15
    barrier = threading.Barrier(threads)

    def produce(thread: int) -> None:
        barrier.wait()
        for n in range(appends):
            payload = f"t{thread} n{n} ".encode() * (n + 1)
            partition.append(build_wire_batch([payload], seq_no=[n], producer_id=f"p{thread}"))

    workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
        assert not worker.is_alive()
    rows = read_all(partition)
    assert [row["offset"] for row in rows] == list(range(threads * appends))
    for thread in range(threads):
        mine = [row for row in rows if row["producer_id"] == f"p{thread}"]
        assert [row["seq_no"] for row in mine] == list(range(appends))
        assert [row["data"] for row in mine] == [
            f"t{thread} n{n} ".encode() * (n + 1) for n in range(appends)
        ]
