"""A transactional publish cuts a share over the frame target into bounded frames
(``storage.frame_cuts``), written in row order and visible together; ``published_prefix``
counts what a crash left of it; shares with producer ids or metadata stay one frame."""

from __future__ import annotations

import numpy as np
import pytest

from storage import limits
from storage.frame_cuts import frame_slices


@pytest.fixture
def small_frames(monkeypatch) -> None:
    monkeypatch.setattr(limits, "FRAME_TARGET_MESSAGES", 100)
    monkeypatch.setattr(limits, "FRAME_TARGET_BYTES", 64 * 100)


def _frames(log) -> list[int]:
    return [f.header.record_count for s in log.segments
            for f in s.scan(0, s.size_bytes, 1 << 20)]  # fmt: skip


def test_a_large_share_is_published_as_bounded_frames(open_partition, batch, read_all,
                                                      small_frames) -> None:  # fmt: skip
    log = open_partition()
    share = batch(350, size_bytes=16)
    (result,) = log.publish_transactional([share], 7)
    assert _frames(log) == [100, 100, 100, 50]
    assert result.offsets.tolist() == list(range(350)) and not result.status.any()
    assert [r["data"] for r in read_all(log)] == share.column("data").to_pylist()
    assert log.published_prefix(share, 7, 0) == 350
    assert log.published_prefix(share, 8, 0) == 0


def test_frames_are_cut_by_bytes_too(open_partition, batch, small_frames) -> None:
    log = open_partition()
    log.publish_transactional([batch(50, size_bytes=1000)], 7)  # 6,400 bytes a frame: 6
    assert _frames(log) == [6] * 8 + [2]
    log.publish_transactional([batch(2, size_bytes=20_000)], 8)  # one message over: alone
    assert _frames(log)[-2:] == [1, 1]


def test_shares_with_producer_ids_or_metadata_stay_one_frame(open_partition, batch,
                                                             small_frames) -> None:  # fmt: skip
    log = open_partition()
    log.publish_transactional([batch(250, producer="p", seq_nos=list(range(1, 251)))], 7)
    log.publish_transactional([batch(250, metadata=[{"k": b"v"}] * 250)], 8)
    assert _frames(log) == [250, 250]


def test_published_prefix_counts_the_frames_a_crash_kept(open_partition, batch,
                                                         small_frames) -> None:  # fmt: skip
    """The frames of a share as a crash may leave them: the first two of four."""
    log = open_partition()
    share = batch(350)
    head = frame_slices(share)[:2]
    log.publish_transactional(head, 7)  # what survived: 200 rows in two frames
    assert log.published_prefix(share, 7, 0) == 200
    log.publish_transactional([share.slice(200)], 7)  # recovery publishes the rest
    assert log.published_prefix(share, 7, 0) == 350
    assert _frames(log) == [100, 100, 100, 50]


def test_small_shares_are_one_frame_by_default(open_partition, batch) -> None:
    log = open_partition()
    log.publish_transactional([batch(limits.FRAME_TARGET_MESSAGES)], 7)
    log.publish_transactional([batch(limits.FRAME_TARGET_MESSAGES + 1)], 8)
    assert _frames(log) == [limits.FRAME_TARGET_MESSAGES, limits.FRAME_TARGET_MESSAGES, 1]
    assert np.all(np.array(_frames(log)) <= limits.FRAME_TARGET_MESSAGES)
