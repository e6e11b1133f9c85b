"""``storage.ledger_index.LedgerIndex``'s answer to retention: the oldest frame with a
share not copied yet (round 34: walked from the last answer on, not over every copied
frame kept for whole-frame reads)."""

from __future__ import annotations

import numpy as np

from storage.ledger_index import LedgerIndex


def _index(frames: int, partitions: int = 3) -> LedgerIndex:
    """``frames`` frames, each one message of every partition (frame k at offset k)."""
    index = LedgerIndex()
    for partition in range(partitions):
        index.set_end(partition, 0)
    ids = np.arange(partitions, dtype=np.int64)
    for frame in range(frames):
        index.add(frame, ids, np.full(partitions, frame, np.int64), np.ones(partitions, np.int64),
                  ids.copy())  # fmt: skip
    return index


def test_the_first_needed_frame_follows_the_copies() -> None:
    index = _index(6)
    assert index.first_needed_frame() == 0
    index.release(0, 4)
    index.release(1, 4)
    assert index.first_needed_frame() == 0  # partition 2 copied nothing
    index.release(2, 2)
    assert index.first_needed_frame() == 2
    index.release(2, 5)
    assert index.first_needed_frame() == 4  # partitions 0 and 1 stop at 4
    for partition in range(3):
        index.release(partition, 6)
    assert index.first_needed_frame() is None
    index.add(6, np.array([1]), np.array([6]), np.array([1]), np.array([0]))
    assert index.first_needed_frame() == 6  # a new frame, not copied yet
    index.drop_front(6)
    assert index.first_needed_frame() == 6


def test_the_walk_starts_where_the_last_answer_stood(monkeypatch) -> None:
    """Copied frames are not walked again: the second question, with nothing new, walks
    only the one frame it stopped at."""
    index = _index(50)
    for partition in range(3):
        index.release(partition, 40)
    walked: list[int] = []
    real = np.fromiter

    def counting(*args, **kwargs):  # one call a chunk walked
        walked.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(np, "fromiter", counting)
    assert index.first_needed_frame() == 40
    assert len(walked) == 41
    walked.clear()
    assert index.first_needed_frame() == 40
    assert len(walked) == 1
