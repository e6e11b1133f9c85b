"""A share staged as frames (``storage.staged_frames``) published to a partition that
split since it was routed: its frames go, copied as staged (never decoded: a framed share
may be over one transaction's per-partition limit), to the child keyless messages go to,
once."""

from __future__ import annotations

import os

import pytest

from storage import limits, staged_frames
from storage.fs import FileSystem
from storage.record_batch import build_wire_batch
from storage.staged_frames import FrameFileWriter, index_file
from tests.autopartitioning.conftest import OpenTopic


def test_staged_frames_published_to_a_split_partition_land_once_in_its_children(
        open_topic: OpenTopic, tmp_path) -> None:  # fmt: skip
    topic = open_topic(1, strategy="paused")
    path = str(tmp_path / "s.frames")
    writer = FrameFileWriter(FileSystem(), path)
    writer.add(0, build_wire_batch([b"m%02d" % i for i in range(20)]))
    writer.finish()
    frames = index_file(FileSystem(), path, os.path.getsize(path))[0]
    topic.split(0)
    topic.publish_staged(frames, 0, 77)
    assert topic.partition(0).end_offset == 0
    found = sorted(data for child in (1, 2) for record in topic.read(child, 0).batches
                   for data in record.column("data").to_pylist())  # fmt: skip
    assert found == [b"m%02d" % i for i in range(20)]


def test_a_framed_share_over_a_transactions_limit_goes_to_a_split_partitions_child_once(
        open_topic: OpenTopic, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    topic = open_topic(1, strategy="paused")
    path = str(tmp_path / "s.frames")
    writer = FrameFileWriter(FileSystem(), path)
    for start in range(0, 60, 20):  # three frames of 20: 60 messages, the limit 50
        writer.add(0, build_wire_batch([b"m%02d" % i for i in range(start, start + 20)]))
    writer.finish()
    frames = index_file(FileSystem(), path, os.path.getsize(path))[0]
    monkeypatch.setattr(limits, "BATCH_MESSAGES_MAX", 50)

    def refused(*args, **kwargs):
        raise AssertionError("a framed share was decoded")

    monkeypatch.setattr(staged_frames, "decode", refused)
    topic.split(0)
    topic.publish_staged(frames[:1], 0, 77)  # a publish cut short after its first frame
    topic.publish_staged(frames, 0, 77)  # recovery: the rest
    topic.publish_staged(frames, 0, 77)  # again: nothing twice
    assert topic.partition(0).end_offset == 0
    found = [data for child in (1, 2) for record in topic.read(child, 0).batches
             for data in record.column("data").to_pylist()]  # fmt: skip
    assert found == [b"m%02d" % i for i in range(60)]


def test_a_framed_share_published_again_after_its_child_split_is_not_duplicated(
        open_topic: OpenTopic, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # Review R1-1: the share went to child 1, child 1 split before the transaction's
    # checkpoint, and the publish is repeated (recovery, a failed publish finished): the
    # frames child 1 holds count, only the rest (none) goes to its own child.
    topic = open_topic(1, strategy="paused")
    monkeypatch.setattr(limits, "FRAME_TARGET_MESSAGES", 10)  # frames of 10 messages
    path = str(tmp_path / "s.frames")
    writer = FrameFileWriter(FileSystem(), path)
    writer.add(0, build_wire_batch([b"m%02d" % i for i in range(30)]))
    writer.finish()
    frames = index_file(FileSystem(), path, os.path.getsize(path))[0]
    assert [frame.record_count for frame in frames] == [10, 10, 10]
    topic.split(0)  # 0 -> 1, 2
    topic.publish_staged(frames[:2], 0, 77)  # cut short: two frames in child 1
    assert topic.split(1) == (3, 4)  # 1 -> 3, 4
    topic.publish_staged(frames, 0, 77)  # the rest, to 1's keyless child
    topic.publish_staged(frames, 0, 77)  # again: nothing
    ends = {p: topic.partition(p).end_offset for p in (1, 2, 3, 4)}
    assert ends == {1: 20, 2: 0, 3: 10, 4: 0}
    found = [data for p in (1, 3) for record in topic.read(p, 0).batches
             for data in record.column("data").to_pylist()]  # fmt: skip
    assert found == [b"m%02d" % i for i in range(30)]


@pytest.mark.parametrize("cut", [None, 15])
@pytest.mark.parametrize("keyed", [False, True])
def test_a_share_published_again_after_its_child_split_is_not_duplicated(
        open_topic: OpenTopic, keyed: bool, cut: int | None) -> None:  # fmt: skip
    # Review LEAD-1 (R1-1's keyed path, ``_publish_to_lineage``): the share went to the
    # children, child 1 split before the transaction's checkpoint, and the publish is
    # repeated: what child 1 holds counts, nothing is published twice.
    topic = open_topic(1, strategy="paused")
    groups = [f"k{i % 7}" for i in range(40)] if keyed else None
    batch = build_wire_batch([b"m%02d" % i for i in range(40)], message_group_id=groups)
    topic.split(0)  # 0 -> 1, 2
    # the whole share, or its first ``cut`` messages (a publish cut short: the frames
    # written before a crash)
    topic.publish_transactional(batch if cut is None else batch.slice(0, cut), 0, 77)
    first = {p: topic.partition(p).end_offset for p in (1, 2)}
    assert first[1] > 0
    assert topic.split(1) == (3, 4)  # 1 -> 3, 4
    topic.publish_transactional(batch, 0, 77)  # again: only what is missing
    topic.publish_transactional(batch, 0, 77)  # and again: nothing
    ends = {p: topic.partition(p).end_offset for p in (1, 2, 3, 4)}
    assert sum(ends.values()) == 40 and ends[1] == first[1]
    if cut is None:
        assert ends == {**first, 3: 0, 4: 0}
    found = sorted(data for p in (1, 2, 3, 4) for record in topic.read(p, 0).batches
                   for data in record.column("data").to_pylist())  # fmt: skip
    assert found == [b"m%02d" % i for i in range(40)]
