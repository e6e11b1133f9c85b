"""A pool of large transient read buffers (``storage.buffer_pool``; issue 14: a fresh
array of megabytes faulted in its pages on every poll).

Properties: ``give`` then ``take`` reuses an array that fits (not one much larger); the
pool keeps within its bounds, the largest first; small arrays are not pooled; a forked
child starts with an empty pool and a free lock. (That a poll's result stays intact
while the next poll reuses its scan buffer: ``test_bulk_scan``.)
"""

from __future__ import annotations

import os
import signal

from storage import buffer_pool
from storage.buffer_pool import BufferPool


def test_give_fit_and_bounds() -> None:
    pool = BufferPool(keep_arrays=2, keep_bytes=10 << 20)
    arrays = [pool.take(size) for size in (1 << 20, 4 << 20, 8 << 20)]
    for array in arrays:
        pool.give(array)
    assert pool.idle_bytes == 8 << 20  # two arrays at most, 10 MiB: the largest kept
    assert pool.take(3 << 20).base is arrays[2].base  # 8 MiB serves 3 MiB (within 4x)
    assert pool.take(1 << 20).base is not arrays[2].base
    assert pool.take(100).base is None  # under POOLED_BYTES_MIN: not pooled


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
