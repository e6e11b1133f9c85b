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
