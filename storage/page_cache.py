"""Dropping synced log bytes from the page cache (issue 14, ``bulk_move``).

On the benchmark VM the balloon's free page reporting hands freed guest memory back
to the host, so every append into a never-used page-cache page costs a host fault
(~1.8 ms CPU a MiB against ~0.3 for recycled pages: docs/bulk_commit.md, "The cause
found at low load"). An append-only log that is never dropped from the cache keeps
asking for new pages. ``drop_synced`` hands the kernel back the pages of log bytes
that are already durable, with ``POSIX_FADV_DONTNEED``, so later appends reuse them.

Invariants:
- only synced bytes are dropped: sealed segments (synced at their seal) and the
  active segment below the position the caller's sync covered; never the unsynced
  tail (``DONTNEED`` would skip dirty pages anyway, but the policy does not rely on it);
- the newest ``keep_bytes`` of synced bytes of the partition stay cached for
  tailing readers;
- it is a hint: no byte on disk changes, a failure is ignored, readers of dropped
  bytes read them from the disk.

Off unless ``TOPICBASE_DROP_SYNCED_PAGES=1`` is in the environment (``ENABLED``):
the A/B that would justify it by default was not finished (docs/bulk_commit.md).
What consumers still need is not known here (their committed offsets live above
storage); the kept tail is the only protection readers get.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from storage import limits

if TYPE_CHECKING:
    from storage.segment import LogSegment

ENABLED = os.environ.get("TOPICBASE_DROP_SYNCED_PAGES", "0") == "1"


def drop_synced(
    segments: Sequence[LogSegment], synced_last_bytes: int, keep_bytes: int | None = None
) -> None:
    """Drop from the page cache every synced byte of ``segments`` (oldest first, the
    last one active and synced up to ``synced_last_bytes``) but the newest
    ``keep_bytes`` (default ``limits.PAGE_CACHE_KEEP_BYTES``). Walks newest first and
    stops at the first sealed segment already dropped whole (older ones were then
    dropped by an earlier call)."""
    if not segments:
        return
    keep = limits.PAGE_CACHE_KEEP_BYTES if keep_bytes is None else keep_bytes
    assert keep >= 0
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
        if upto > segment.dropped_to:
            segment.drop_cache(upto)
