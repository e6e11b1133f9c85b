"""Which byte ranges of a segment's log hold frames whose checksum this process verified.

A read through a segment's map (``LogSegment.scan(mapped=True)``, and ``storage.bulk_scan``'s
copy of many partitions' windows from their maps) checks each frame's
CRC-32C over the page cache's bytes: 1 MB of a 1000 x 1 KiB frame costs ~40 us hot and
~100 us cold, the largest single cost of a consumer's read after the socket. With
``TOPICBASE_VERIFY_READS=once`` (the default) a frame is checked **once per process**:

- when this process wrote it from memory (``LogSegment.append_frame_parts``: the
  checksum was computed over the very buffers that ``pwritev`` wrote), or
- when a read of this process first verified it (after a restart every frame is
  verified again on its first read: the runs live in memory only);

later reads of those bytes through the map are served unchecked. Published bytes never
change under the server (appends go after them, a fence cuts only unpublished bytes,
``truncate_to`` clips the runs to the cut, retention unlinks whole files), so what a
verified range no longer protects against is damage that happens *after* it was
verified, while the process lives: a page the kernel evicted from the page cache and
read back wrong from a disk that reports no error (bytes ``storage.page_cache`` drops
are forgotten here, ``forget_below``, and checked again on their next read), a
segment file modified by something outside the server, or memory corruption of the
page cache. Kafka's broker takes the same stand (it checks a producer's batch at
append and the unflushed tail at recovery, never at fetch; its clients check the
CRC), but SQL clients cannot check a frame's CRC, so it
is stated here: such damage reaches the client instead of failing the read with
``CorruptSegmentError``. ``topicbase check`` still reads and checks every frame, and
``TOPICBASE_VERIFY_READS=always`` checks every read as before (as does every ``pread``
read: maps off, the faulty file systems of the tests, recovery's scans).

A reader marks what it checked only if no ``forget_below`` or ``cut`` ran since it took
``VerifiedRuns.generation``, before it read the bytes (review R2-16-1: a drop landing
between a frame's check and its mark would mark bytes that just left the page cache).

Bounded: at most ``limits.VERIFIED_RUNS_MAX`` disjoint runs per segment (a tailing consumer's reads
and the writer's appends extend one run); past it the run verified longest ago is
forgotten, which only costs a check again. Thread-safe (readers mark concurrently with
the writer's appends and cuts).
"""

from __future__ import annotations

import os
import threading

from storage import limits

ONCE = os.environ.get("TOPICBASE_VERIFY_READS", "once") != "always"


class VerifiedRuns:
    """Disjoint, non-adjacent byte ranges ``[start, end)`` of whole frames verified by
    this process. Invariant: every frame inside a run was verified (or written from
    memory) at its position and its bytes have not been cut since."""

    __slots__ = ("_lock", "_runs", "generation")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Newest-touched last; replaced whole under the lock, read without it.
        self._runs: tuple[tuple[int, int], ...] = ()
        # Bumped by every ``cut`` and ``forget_below`` (under the lock, read without it): a
        # reader takes it before it reads the bytes it checks and passes it to ``add``, so
        # a check that a drop or a cut overtook marks nothing (review R2-16-1).
        self.generation = 0

    def snapshot(self) -> tuple[tuple[int, int], ...]:
        """The runs now (a read checks its frames against one snapshot: a run a cut
        clipped meanwhile covered only unpublished bytes, which a read never reaches)."""
        return self._runs

    def add(self, start: int, end: int, generation: int | None = None) -> None:
        """``[start, end)`` (whole frames) was verified: merge it into the runs. A reader
        passes the ``generation`` it took before reading the bytes it checked: if a
        ``forget_below`` or ``cut`` ran since, the bytes it checked may no longer be the
        page cache's, and nothing is marked (it only costs a check again). The writer,
        whose bytes come from its own memory, passes None."""
        assert 0 <= start < end
        with self._lock:
            if generation is not None and generation != self.generation:
                return
            runs = self._runs
            if len(runs) == 1 and runs[0][1] == start:
                # The writer's append after the one run (a frame a share, 1000 a spread
                # statement): that run grows; nothing else to merge.
                self._runs = ((runs[0][0], end),)
                return
            kept: list[tuple[int, int]] = []
            for run_start, run_end in self._runs:
                if run_end < start or end < run_start:
                    kept.append((run_start, run_end))
                else:  # overlapping or adjacent: one run
                    start, end = min(start, run_start), max(end, run_end)
            kept.append((start, end))
            self._runs = tuple(kept[-limits.VERIFIED_RUNS_MAX :])

    def cut(self, position: int) -> None:
        """The log was cut at ``position``: nothing at or past it is verified any more."""
        with self._lock:
            self.generation += 1
            self._runs = tuple(
                (start, min(end, position)) for start, end in self._runs if start < position
            )

    def forget_below(self, position: int) -> None:
        """The bytes before ``position`` left the page cache on purpose
        (``LogSegment.drop_cache``): their next read comes from the disk, so it is
        checked again (review R2-B1: the drop would make the one stated gap routine)."""
        with self._lock:
            self.generation += 1
            self._runs = tuple(
                (max(start, position), end) for start, end in self._runs if end > position
            )


def covered(runs: tuple[tuple[int, int], ...], start: int, end: int) -> bool:
    """Whether ``[start, end)`` lies inside one of ``runs``."""
    return any(run_start <= start and end <= run_end for run_start, run_end in runs)
