"""Dropping synced log bytes from the page cache (issue 14, ``bulk_move``).

On the benchmark VM the balloon's free page reporting hands freed guest memory back
to the host, so every append into a never-used page-cache page costs a host fault
(~1.8 ms CPU a MiB against ~0.3 for recycled pages: docs/bulk_commit.md, "The cause
found at low load"). An append-only log that is never dropped from the cache keeps
asking for new pages. ``drop_synced`` hands the kernel back the pages of log bytes
that are already durable, with ``POSIX_FADV_DONTNEED``, so later appends reuse them.

Who drops: only a caller that knows what readers still need, and says so with an
offset floor (``PartitionLog.sync(drop_below=...)``): the engine's checkpoint, after it
synced a partition that transactions published to, passes the lowest offset every
consumer of the topic has committed (a topic without consumers: all of it), and for a
partition its transactions only read (consumer offsets moved) it calls
``PartitionLog.drop_consumed`` with the same floor, capped at ``durable_end``. Other
syncs (a move's source made durable, explicit syncs, the open's) drop nothing. Pages a
reader maps are released from the segment's cached map first
(``file_map.release_pages``): the kernel drops no page a process maps.

Invariants:
- only synced bytes are dropped: sealed segments (synced at their seal) and the
  active segment below the position the caller's sync covered; never the unsynced
  tail (``DONTNEED`` would skip dirty pages anyway, but the policy does not rely on it);
- never a byte at or above the caller's floor (what a consumer has not committed yet:
  its next reads stay cached); the newest ``keep_bytes`` of synced bytes of the
  partition stay cached too, for tailing readers without a consumer;
- it is a hint: no byte on disk changes, a failure is ignored, readers of dropped
  bytes read them from the disk.

Drop-behind (``drop_behind``, round 16): the checkpoint runs once per 256 commits, so
between two of them a bulk move writes ~256 MiB of new pages per partition before any is
given back, and once the machine's recently freed pages are used up each MiB costs the
host fault again (docs/bulk_commit.md, round 16). A partition the engine gave a drop
floor (``PartitionLog.drop_floor``) therefore drops, as it writes, the active segment's
bytes that were handed to the kernel's writeback (``LogSegment.written_back_bytes``:
``sync_file_range`` every ``WRITEBACK_INTERVAL_BYTES``) more than
``DROP_BEHIND_KEEP_BYTES`` ago, below the floor, in steps of ``DROP_BEHIND_STEP_BYTES``:
the pages go back to the free lists a few MiB at a time and the next writes take them
while they are still warm. Such
bytes need not be synced: a page the kernel has not written back yet is dirty or under
writeback, and ``DONTNEED`` skips it (it stays cached); a clean page holds what the
disk holds, so a later read (or a reopen after a kill) reads the same bytes from the
disk. Durability is the sync's alone either way. Its own watermark
(``LogSegment.behind_to``) leaves ``dropped_to`` to the synced drops, so the
checkpoint's drop advises the range again once synced (pages skipped while dirty go
then). A floor is a snapshot: a consumer created, or moved back, after it was given
reads what was dropped from the disk.

On unless ``TOPICBASE_DROP_SYNCED_PAGES=0`` is in the environment (``ENABLED``):
round 15 measured the bulk move with it (docs/bulk_commit.md, "Round 15"). A map a
batch still holds after its segment made a larger one keeps its pages.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from storage import failpoints, limits

if TYPE_CHECKING:
    from storage.segment import LogSegment

ENABLED = os.environ.get("TOPICBASE_DROP_SYNCED_PAGES", "1") != "0"


def drop_synced(
    segments: Sequence[LogSegment],
    synced_last_bytes: int,
    below_offset: int,
    keep_bytes: int | None = None,
) -> None:
    """Drop from the page cache every synced byte of ``segments`` (oldest first, the
    last one active and synced up to ``synced_last_bytes``) that lies below offset
    ``below_offset`` (every consumer of the topic committed past it: the caller's
    floor), but the newest ``keep_bytes`` (default ``limits.PAGE_CACHE_KEEP_BYTES``).
    A segment holding the floor is dropped up to the frame at or before it (its
    sparse index: never a byte at or above the floor). Every call drops a prefix of
    the log, so the walk (newest first) stops at the first sealed segment already
    dropped whole: older ones were dropped whole by an earlier call."""
    if not segments:
        return
    keep = limits.PAGE_CACHE_KEEP_BYTES if keep_bytes is None else keep_bytes
    assert keep >= 0 and below_offset >= 0
    last = segments[-1]
    assert synced_last_bytes >= 0
    # A fence's cut (outside the caller's lock) may have shortened the log since.
    synced_last_bytes = min(synced_last_bytes, last.size_bytes)
    for segment in reversed(segments):
        synced = synced_last_bytes if segment is last else segment.size_bytes
        if segment is not last and segment.dropped_to >= synced:
            break
        upto = synced - keep
        keep = max(0, keep - synced)
        if below_offset <= segment.base_offset:
            continue  # nothing of it is consumed by every consumer yet
        if below_offset < segment.next_offset:
            upto = min(upto, segment.offset_index.lookup(below_offset))
        if upto > segment.dropped_to:
            segment.drop_cache(upto)


def drop_behind(
    segments: Sequence[LogSegment], below_offset: int, keep_bytes: int | None = None
) -> bool:
    """Drop from the page cache the bytes of ``segments`` (a partition's, oldest first, the
    last one active) handed to writeback (the active one's ``written_back_bytes``; a
    sealed one was synced whole at its seal) but the newest ``keep_bytes`` (default
    ``limits.DROP_BEHIND_KEEP_BYTES``), below offset ``below_offset`` (the segment holding
    it: up to the indexed frame at or before it), from where the last drop of either
    kind stopped: in the active segment once at least ``limits.DROP_BEHIND_STEP_BYTES``
    are due, in a sealed one (its tail, left when it rolled) at once. Returns whether it
    advised. The walk (newest first) stops at the first sealed segment dropped whole;
    once the kept bytes are counted it jumps over the segments wholly above the floor (a
    lagging consumer's floor leaves many: review R2-16-3, an append walked them all). The
    caller holds the partition's write lock. A hint: bytes on disk never change, pages not
    yet written back are skipped by the kernel."""
    keep = limits.DROP_BEHIND_KEEP_BYTES if keep_bytes is None else keep_bytes
    assert keep >= 0 and below_offset >= 0
    last = segments[-1]
    advised = False
    index = len(segments) - 1
    while index >= 0:
        segment = segments[index]
        index -= 1
        active = segment is last
        end = segment.written_back_bytes if active else segment.size_bytes
        start = max(segment.dropped_to, segment.behind_to)
        if not active and start >= end:
            break  # older ones were dropped whole before it
        upto = end - keep
        keep = max(0, keep - end)
        if below_offset <= segment.base_offset:
            if keep == 0:  # on to the newest segment holding bytes below the floor
                index = min(index, _last_below(segments, below_offset))
            continue  # nothing of it is below the floor
        if below_offset < segment.next_offset:
            upto = min(upto, segment.offset_index.lookup(below_offset))
        if upto - start < (limits.DROP_BEHIND_STEP_BYTES if active else 1):
            continue
        # the last step again: pages still under writeback then were skipped
        segment.drop_cache(upto, behind=True, again=limits.DROP_BEHIND_STEP_BYTES)
        failpoints.hit("page_cache.after_drop_behind")
        advised = True
    return advised


def _last_below(segments: Sequence[LogSegment], offset: int) -> int:
    """The index of the newest of ``segments`` (oldest first) whose base offset is below
    ``offset``, -1 if none."""
    return bisect.bisect_left(segments, offset, key=lambda segment: segment.base_offset) - 1
