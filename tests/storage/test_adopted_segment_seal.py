"""An adopted segment's indexes (``log_loader.adopt_segment`` writes them whole, unsynced)
are made durable by its seal, as a written segment's are (review R2-A3): under a durable
fsync policy the seal syncs both index files."""

from __future__ import annotations

from pathlib import Path

from storage import log_loader
from storage.check_frames import walk_frames
from storage.fs import FileSystem
from storage.record_batch import FrameHeader, build_wire_batch, encode_frame, serialize_body
from storage.segment import LogSegment

BASE = 40


class SyncRecordingFileSystem(FileSystem):
    """Plain files; every path it syncs (fdatasync through a descriptor), in order."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: dict[int, str] = {}
        self.synced: list[str] = []

    def open_write(self, path: str) -> int:
        fd = super().open_write(path)
        self.opened[fd] = path
        return fd

    def sync(self, fd: int) -> None:
        self.synced.append(self.opened[fd])
        super().sync(fd)


def _write_log(directory: Path, frame_count: int) -> int:
    """A segment log of ``frame_count`` frames of 3 messages at ``BASE`` (its indexes
    removed, as an own file renamed into a partition has none); its size."""
    segment = LogSegment(FileSystem(), str(directory), BASE)
    for _ in range(frame_count):
        data = [b"m%d" % (segment.next_offset + i) for i in range(3)]
        body = serialize_body(build_wire_batch(data))
        frame = encode_frame(body, base_offset=segment.next_offset, written_at_us=7,
                             record_count=3)  # fmt: skip
        segment.append_frame(frame, FrameHeader(0, segment.next_offset, 7, 3, len(body), 0))
    segment.seal(durable=True)
    size = segment.size_bytes
    Path(segment.offset_index.path).unlink()
    Path(segment.time_index.path).unlink()
    return size


def test_the_seal_of_an_adopted_segment_syncs_its_indexes(tmp_path: Path) -> None:
    size = _write_log(tmp_path, 4)
    fs = SyncRecordingFileSystem()
    segment = LogSegment(fs, str(tmp_path), BASE)
    frames = walk_frames(fs, segment.log_path, BASE).frames
    assert len(frames) == 4
    log_loader.adopt_segment(segment, frames, size)
    assert Path(segment.offset_index.path).stat().st_size > 0
    indexes = {segment.offset_index.path, segment.time_index.path}
    assert not indexes & set(fs.synced)  # written unsynced: the seal's to sync
    segment.seal(durable=True)
    assert indexes <= set(fs.synced), fs.synced
    # the indexes on disk are still whole and loadable
    reopened = LogSegment(FileSystem(), str(tmp_path), BASE)
    assert reopened.offset_index.load() and reopened.time_index.load()
    assert reopened.offset_index.entries() == segment.offset_index.entries()
