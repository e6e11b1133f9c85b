"""``storage.ledger_index.LedgerIndex``'s answer to retention: the oldest frame with a
share not copied yet (round 34: walked from the last answer on, not over every copied
frame kept for whole-frame reads)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from storage import ledger_index
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
    real = ledger_index._Lookup.__call__

    def counting(self, partitions):  # one lookup a chunk walked
        walked.append(1)
        return real(self, partitions)

    monkeypatch.setattr(ledger_index._Lookup, "__call__", counting)
    assert index.first_needed_frame() == 40
    assert len(walked) == 41
    walked.clear()
    assert index.first_needed_frame() == 40
    assert len(walked) == 1


def test_the_first_needed_frame_with_no_copied_start_known() -> None:
    """Frames added with no ``set_end`` nor ``release`` before (no copied start at all):
    every partition counts as copied to 0, so the first frame is needed."""
    index = LedgerIndex()
    index.add(0, np.array([3, 9]), np.array([0, 0]), np.array([2, 1]), np.array([0, 2]))
    index.add(1, np.array([3]), np.array([2]), np.array([1]), np.array([0]))
    assert index.first_needed_frame() == 0
    index.release(3, 3)
    assert index.first_needed_frame() == 0  # partition 9's share
    index.release(9, 1)
    assert index.first_needed_frame() is None


def _needed_one_at_a_time(index: LedgerIndex, starts: dict[int, int]) -> int | None:
    """The first needed frame by the rule, share by share: the oldest live chunk with a
    share ending past its partition's copied start (0 for a partition never released)."""
    for chunk in index._chunks[index._first_chunk :]:
        for partition, base, count, frame, _row in chunk.tolist():
            if base + count > starts.get(partition, 0):
                return frame
    return None


@pytest.mark.parametrize("seed", range(12))
def test_the_first_needed_frame_is_the_rule_share_by_share(seed: int) -> None:
    """The array lookup of the copied starts (round 38) answers as the share-by-share rule
    does: sparse and large partition ids (a split's children), partitions never released
    or set only by ``set_end``, copies that leave some partitions behind, drops from the
    front."""
    rng = random.Random(seed)
    index = LedgerIndex()
    ids = rng.sample(range(1, 5000), 40)  # (unsorted: the copied starts' keys come unsorted)
    ends = dict.fromkeys(ids, 0)
    tops: list[dict[int, int]] = []  # each frame's shares: partition -> its share's end
    starts: dict[int, int] = {}
    for partition in rng.sample(ids, 10):
        index.set_end(partition, 0)
        starts[partition] = 0
    answers = []
    for _ in range(150):
        action = rng.random()
        if action < 0.5:
            chosen = np.array(sorted(rng.sample(ids, rng.randint(1, len(ids)))), np.int64)
            counts = np.array([rng.randint(1, 5) for _ in chosen], np.int64)
            bases = np.array([ends[p] for p in chosen.tolist()], np.int64)
            index.add(len(tops), chosen, bases, counts, np.zeros(len(chosen), np.int64))
            ends.update(zip(chosen.tolist(), (bases + counts).tolist(), strict=True))
            tops.append(dict(zip(chosen.tolist(), (bases + counts).tolist(), strict=True)))
        elif action < 0.85:  # a copy of the frames below one, some partitions left behind
            below = rng.randint(0, len(tops))
            lagging = set(rng.sample(ids, rng.choice((0, 0, 1, 3))))
            for partition in ids:
                copied = max((top.get(partition, 0) for top in tops[:below]), default=0)
                if partition not in lagging and copied > starts.get(partition, 0):
                    index.release(partition, copied)
                    starts[partition] = copied
        else:
            needed = _needed_one_at_a_time(index, starts)
            index.drop_front(rng.randint(0, len(tops) if needed is None else needed))
        expected = _needed_one_at_a_time(index, starts)
        assert index.first_needed_frame() == expected
        answers.append(expected)
    assert len(set(answers)) > 3  # the answer moved along
    for partition in ids:  # everything copied
        index.release(partition, ends[partition])
    assert index.first_needed_frame() is None


@pytest.mark.parametrize("seed", range(20))
def test_many_new_chunks_are_listed_as_one_at_a_time_would_be(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_list_new`` sorts many new chunks' shares by partition and extends each
    partition's lists once (round 37): the lists, and every lookup through them, are the
    same as listing the chunks share by share, whatever the adds, lookups and drops
    between them."""
    rng = random.Random(seed)
    indexes = []
    for grouped_from in (1, 10**9):  # always grouped, never grouped
        monkeypatch.setattr(ledger_index, "_LIST_GROUPED_MIN_CHUNKS", grouped_from)
        rng.seed(seed)
        index = LedgerIndex()
        ends = dict.fromkeys(range(8), 0)
        for partition in ends:
            index.set_end(partition, 0)
        for frame in range(rng.randrange(1, 60)):
            ids = sorted(rng.sample(range(8), rng.randrange(1, 9)))
            counts = [rng.randrange(1, 5) for _ in ids]
            bases = [ends[p] for p in ids]
            rows = np.cumsum([0, *counts[:-1]])
            index.add(frame, np.array(ids), np.array(bases), np.array(counts), rows)
            for p, count in zip(ids, counts, strict=True):
                ends[p] += count
            if rng.random() < 0.2:  # a lookup lists what came so far
                index.at_share_edge(rng.choice(ids), ends[ids[0]])
            if rng.random() < 0.05:
                index.drop_front(frame // 2)
        index.first_bases(range(8))  # lists what is left
        indexes.append(index)
    grouped, single = indexes
    assert grouped._lists.keys() == single._lists.keys()
    for partition, entry in single._lists.items():
        other = grouped._lists[partition]
        assert (other.bases, other.frames, other.rows, other.counts) == (
            entry.bases, entry.frames, entry.rows, entry.counts), partition  # fmt: skip
