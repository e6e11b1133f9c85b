"""Large read windows come from a pool and go back to it (``storage.buffer_pool``; issue
14: fresh arrays of megabytes faulted in their pages on every read).

Properties: a leased array goes back to the pool only once nothing refers to the view
given out (an Arrow buffer, a slice of it, a batch decoded from it); a batch read from
pooled windows stays intact while later reads reuse the pool; ``give`` and the bounds.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
from typing import Any

import pyarrow as pa
import pytest

from storage import buffer_pool, segment
from storage.buffer_pool import BufferPool
from storage.record_batch import build_wire_batch


def test_a_lease_returns_only_when_the_view_is_gone() -> None:
    pool = BufferPool()
    view = pool.take(2 << 20, lease=True)
    buffer = pa.py_buffer(view)
    body = buffer.slice(100, 1000)
    del view, buffer
    gc.collect()
    assert pool.idle_bytes == 0  # the slice still holds it
    del body
    gc.collect()
    assert pool.idle_bytes == 2 << 20
    assert pool.take(2 << 20).base is not None and pool.idle_bytes == 0


def test_give_fit_and_bounds() -> None:
    pool = BufferPool(keep_arrays=2, keep_bytes=10 << 20)
    arrays = [pool.take(size) for size in (1 << 20, 4 << 20, 8 << 20)]
    for array in arrays:
        pool.give(array)
    assert pool.idle_bytes == 8 << 20  # two arrays at most, 10 MiB: the largest kept
    assert pool.take(3 << 20).base is arrays[2].base  # 8 MiB serves 3 MiB (within 4x)
    assert pool.take(1 << 20).base is not arrays[2].base
    assert pool.take(100).base is None  # under POOLED_BYTES_MIN: not pooled


def test_batches_from_pooled_windows_stay_intact_while_the_pool_is_reused(
    open_partition: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = BufferPool()
    monkeypatch.setattr(segment, "BUFFERS", pool)
    partition = open_partition()
    for index in range(6):  # frames of ~0.5 MiB: windows of 1 MiB and more, pooled
        data = [bytes([index]) * 1000 + f"{index}-{i}".encode() for i in range(500)]
        partition.append(build_wire_batch(data))
    kept = partition.read(0, max_messages=1000, max_bytes=1 << 20)
    expected = [row["data"] for batch in kept.batches for row in batch.to_pylist()]
    assert pool.leases > 0 and len(expected) == 1000
    for _ in range(5):
        for start in (1000, 2000, 500):
            partition.read(start, max_messages=1000, max_bytes=1 << 20)
        gc.collect()
    assert pool.fresh < pool.leases  # windows were reused
    again = [row["data"] for batch in kept.batches for row in batch.to_pylist()]
    assert again == expected
    assert again[0].startswith(b"\x00" * 1000) and again[-1].endswith(b"1-499")


def test_small_windows_are_not_pooled(open_partition: Any, batch: Any) -> None:
    partition = open_partition()
    partition.append(batch(5))
    before = buffer_pool.BUFFERS.leases
    partition.read(0, max_messages=5, max_bytes=1000)
    assert buffer_pool.BUFFERS.leases == before


def test_a_lease_returned_while_the_pool_is_locked_does_not_deadlock() -> None:
    """A finalizer may run inside the pool's own locked section (a garbage collection
    there): it only queues the array, which the next call takes in."""
    pool = BufferPool()
    view = pool.take(2 << 20, lease=True)

    def drop_under_the_lock() -> None:
        nonlocal view
        with pool._lock:
            del view  # the finalizer runs here, in this thread, the lock held

    worker = threading.Thread(target=drop_under_the_lock, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "the finalizer waited for the pool's lock"
    assert pool.idle_bytes == 2 << 20


def test_a_forked_child_starts_with_an_empty_pool_and_a_free_lock() -> None:
    buffer_pool.BUFFERS.give(buffer_pool.BUFFERS.take(2 << 20))
    with buffer_pool.BUFFERS._lock:  # held by this thread when the child is forked
        child = os.fork()
        if child == 0:
            signal.alarm(60)  # a child stuck on the parent's lock dies instead of hanging
            try:
                ok = buffer_pool.BUFFERS.idle_bytes == 0
                buffer_pool.BUFFERS.give(buffer_pool.BUFFERS.take(2 << 20))
                os._exit(0 if ok and buffer_pool.BUFFERS.idle_bytes == 2 << 20 else 1)
            finally:
                os._exit(2)
    _, status = os.waitpid(child, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
