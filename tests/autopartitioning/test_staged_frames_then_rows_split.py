"""A share of frames followed by rows (a bulk commit's topic staged both ways:
``engine.commit``) published to a partition that split since it was routed: the frames go
to the keyless child as staged, then the rows to their keys' children; repeated after a
cut-short publish (recovery, a retried publish), every message lands once. The rows'
counts along the keyless chain are taken after the frames' (``TopicLog._held_rows``'s
``framed``): without it, the frames there were counted as rows already published."""

from __future__ import annotations

import os

import pytest

from storage import limits
from storage.fs import FileSystem
from storage.record_batch import build_wire_batch
from storage.staged_frames import FrameFileWriter, index_file
from tests.autopartitioning.conftest import OpenTopic


def _messages(topic, partitions) -> list[bytes]:
    return sorted(data for p in partitions for record in topic.read(p, 0).batches
                  for data in record.column("data").to_pylist())  # fmt: skip


@pytest.mark.parametrize("cut", ["one frame", "all frames", "frames and one child's rows"])
@pytest.mark.parametrize("keyed", [False, True])
def test_frames_then_rows_to_a_split_partition_land_once(
        open_topic: OpenTopic, tmp_path, monkeypatch: pytest.MonkeyPatch, cut: str,
        keyed: bool) -> None:  # fmt: skip
    topic = open_topic(1, strategy="paused")
    monkeypatch.setattr(limits, "FRAME_TARGET_MESSAGES", 10)
    path = str(tmp_path / "s.frames")
    writer = FrameFileWriter(FileSystem(), path)
    writer.add(0, build_wire_batch([b"f%02d" % i for i in range(30)]))
    writer.finish()
    frames = index_file(FileSystem(), path, os.path.getsize(path))[0]
    assert [frame.record_count for frame in frames] == [10, 10, 10]
    rows = build_wire_batch([b"r%02d" % i for i in range(20)],
                            message_group_id=[f"k{i}" for i in range(20)] if keyed else None,
                            created_at_us=1)  # fmt: skip
    topic.split(0)  # 0 -> 1, 2
    if cut == "one frame":
        topic.publish_staged(frames[:1], 0, 77)
    elif cut == "all frames":
        topic.publish_staged(frames, 0, 77)
    else:  # the frames, then the rows of the first child only (as a crash leaves them)
        topic.publish_staged(frames, 0, 77)
        first = [i for i in range(20)
                 if topic._descendant_for(0, f"k{i}" if keyed else None) == 1]  # fmt: skip
        topic.partition(1).publish_transactional([rows.take(first)], 77)
    for _ in range(2):  # recovery, then again: only what the lineage lacks
        topic.publish_staged(frames, 0, 77, rows)
    assert topic.partition(0).end_offset == 0
    assert _messages(topic, (1, 2)) == sorted(
        [b"f%02d" % i for i in range(30)] + [b"r%02d" % i for i in range(20)])
