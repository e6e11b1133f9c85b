"""Recovery: open a partition directory and make its log consistent again.

What it does, in order:
1. finds the segments (``<base>.log``) and deletes leftovers of interrupted
   work (``*.tmp`` files, indexes without a log);
2. for every sealed segment, checks the shape of its indexes against the log
   and rebuilds them from the frames when they are missing or do not fit;
3. for the last (active) segment, verifies every frame's checksum, cuts a torn
   tail at the last valid frame, and rebuilds its indexes.

A damaged frame that is *followed by valid frames* is not a torn tail: it is
corruption in the middle of the log. A frame whose header is intact keeps its
place (reading it fails with ``CorruptSegmentError`` naming file and
position); a broken header there makes the partition refuse to open, with the
same error. Nothing valid is ever cut.
"""

from __future__ import annotations

import itertools
import logging
import os
from dataclasses import dataclass

from storage import file_names, limits
from storage.errors import CorruptSegmentError
from storage.fs import FileSystem
from storage.record_batch import HEADER_BYTES, FrameHeader, decode_header, frame_checksum_ok
from storage.segment import LogSegment

log = logging.getLogger(__name__)
SCAN_WINDOW_BYTES = 4 * 1024 * 1024


@dataclass(slots=True)
class RecoveryReport:
    truncated_bytes: int = 0
    rebuilt_indexes: int = 0
    corrupt_frames: list[tuple[str, int]] | None = None


def load_segments(fs: FileSystem, directory: str, report: RecoveryReport) -> list[LogSegment]:
    """Open every segment of ``directory`` in offset order; recover the last one."""
    fs.make_directory(directory)
    names = fs.list_directory(directory)
    for name in names:
        if name.endswith(file_names.TEMP_SUFFIX) or name.endswith(file_names.DELETED_SUFFIX):
            fs.remove(os.path.join(directory, name))
    bases = sorted(
        base
        for base in (file_names.parse_offset(n, file_names.LOG_SUFFIX) for n in names)
        if base is not None
    )
    _remove_orphan_indexes(fs, directory, names, set(bases))
    if not bases:
        # Create the first log file now and make its name durable: an fdatasync of
        # its frames alone does not keep the file itself through a power cut.
        first = LogSegment(fs, directory, 0)
        first.create_file()
        fs.sync_directory(directory)
        return [first]
    segments = [LogSegment(fs, directory, base) for base in bases]
    for segment, following in itertools.pairwise(segments):
        _open_sealed(segment, following.base_offset, report)
    _recover_active(segments[-1], report)
    return segments


def _remove_orphan_indexes(
    fs: FileSystem, directory: str, names: list[str], bases: set[int]
) -> None:
    for name in names:
        for suffix in (file_names.OFFSET_INDEX_SUFFIX, file_names.TIME_INDEX_SUFFIX):
            base = file_names.parse_offset(name, suffix)
            if base is not None and base not in bases:
                fs.remove(os.path.join(directory, name))


def _open_sealed(segment: LogSegment, next_offset: int, report: RecoveryReport) -> bool:
    """Trust a sealed segment's frames; check and if needed rebuild its indexes."""
    segment.size_bytes = segment.fs.path_size(segment.log_path)
    segment.next_offset = next_offset
    offsets_ok = segment.offset_index.load() and segment.offset_index.is_consistent(
        segment.size_bytes
    )
    times_ok = segment.time_index.load() and segment.time_index.is_consistent(next_offset)
    if not (offsets_ok and times_ok):
        log.warning("rebuilding indexes of %s", segment.log_path)
        frames = list(_walk_frames(segment, verify=False))
        _rebuild_indexes(segment, frames)
        report.rebuilt_indexes += 1
    last = segment.offset_index.last()
    headers = _walk_frames(segment, verify=False, start=0 if last is None else last[1])
    end, chain_end = (0, segment.base_offset) if last is None else (last[1], None)
    for position, header in headers:
        segment.last_written_at_us = header.written_at_us
        end, chain_end = position + header.frame_bytes, header.next_offset
    first = segment.time_index.entries()[:1]
    segment.first_written_at_us = first[0][0] if first else segment.last_written_at_us
    return end == segment.size_bytes and chain_end == next_offset


def _recover_active(segment: LogSegment, report: RecoveryReport) -> None:
    """Verify every frame of the active segment and cut a torn tail."""
    segment.size_bytes = segment.fs.path_size(segment.log_path)
    frames: list[tuple[int, FrameHeader]] = []
    valid_end = 0
    for position, header in _walk_frames(segment, verify=True, report=report):
        frames.append((position, header))
        valid_end = position + header.frame_bytes
    if valid_end < segment.size_bytes:
        log.warning(
            "cutting torn tail of %s at %d (%d bytes)",
            segment.log_path,
            valid_end,
            segment.size_bytes - valid_end,
        )
        report.truncated_bytes += segment.size_bytes - valid_end
        next_offset = frames[-1][1].next_offset if frames else segment.base_offset
        segment.truncate_to(valid_end, next_offset)
        segment.close()
    _rebuild_indexes(segment, frames)
    segment.next_offset = frames[-1][1].next_offset if frames else segment.base_offset
    segment.size_bytes = valid_end
    if frames:
        segment.first_written_at_us = frames[0][1].written_at_us
        segment.last_written_at_us = frames[-1][1].written_at_us


def index_entries(
    base_offset: int, frames: list[tuple[int, FrameHeader]]
) -> tuple[list[tuple[int, int]], list[tuple[int, int]], int]:
    """The offset and time index entries of a segment's frames, as the writer makes them
    (one entry per ``INDEX_INTERVAL_BYTES``), and the bytes since the last entry."""
    offset_entries: list[tuple[int, int]] = []
    time_entries: list[tuple[int, int]] = []
    since_index = 0
    for position, header in frames:
        if not offset_entries or since_index >= limits.INDEX_INTERVAL_BYTES:
            relative = header.base_offset - base_offset
            offset_entries.append((relative, position))
            if not time_entries or header.written_at_us > time_entries[-1][0]:
                time_entries.append((header.written_at_us, relative))
            since_index = 0
        since_index += header.frame_bytes
    return offset_entries, time_entries, since_index


def _rebuild_indexes(segment: LogSegment, frames: list[tuple[int, FrameHeader]]) -> None:
    """Recreate both indexes of ``segment`` from its frame list."""
    offset_entries, time_entries, since_index = index_entries(segment.base_offset, frames)
    segment.offset_index.rewrite(offset_entries)
    segment.time_index.rewrite(time_entries)
    segment._bytes_since_index = since_index


def _walk_frames(
    segment: LogSegment,
    *,
    verify: bool,
    start: int = 0,
    report: RecoveryReport | None = None,
):
    """Yield (position, header) of consecutive frames; stop at the first torn one.

    With ``verify``, checksums are checked: a bad frame ends the walk (torn
    tail) unless a valid frame follows it, which is corruption in the middle.
    """
    fs, path, size = segment.fs, segment.log_path, segment.size_bytes
    fd = fs.open_read(path)
    try:
        position = start
        expected = None
        while position + HEADER_BYTES <= size:
            raw_header = fs.pread(fd, HEADER_BYTES, position)
            header = decode_header(raw_header)
            plausible = (
                header is not None
                and header.body_bytes % 8 == 0
                and header.record_count > 0
                and (expected is None or header.base_offset == expected)
                and position + header.frame_bytes <= size
            )
            if not plausible:
                if verify and _valid_frame_after(fs, fd, position + 8, size):
                    raise CorruptSegmentError(
                        "broken frame header in the middle of the log", path=path, position=position
                    )
                return
            assert header is not None
            if verify:
                body = fs.pread(fd, header.body_bytes, position + HEADER_BYTES)
                if not frame_checksum_ok(header, memoryview(raw_header), memoryview(body)):
                    end = position + header.frame_bytes
                    if not _plausible_header_at(fs, fd, end, size, header.next_offset):
                        if _valid_frame_after(fs, fd, position + 8, size):
                            raise CorruptSegmentError(
                                "damaged frame in the middle of the log",
                                path=path,
                                position=position,
                            )
                        return  # a torn last frame
                    log.error("checksum mismatch in %s at %d; frame kept", path, position)
                    if report is not None:
                        report.corrupt_frames = [*(report.corrupt_frames or []), (path, position)]
            yield position, header
            expected = header.next_offset
            position += header.frame_bytes
    finally:
        fs.close(fd)


def _plausible_header_at(fs: FileSystem, fd: int, position: int, size: int, base: int) -> bool:
    """True if a well-formed header continuing the offset chain starts at ``position``.

    A damaged body followed by such a header is corruption inside the log (the
    chain goes on), not a torn tail; the following frame is checked on its own.
    """
    if position + HEADER_BYTES > size:
        return False
    header = decode_header(fs.pread(fd, HEADER_BYTES, position))
    return (
        header is not None
        and header.body_bytes % 8 == 0
        and header.record_count > 0
        and header.base_offset == base
        and position + header.frame_bytes <= size
    )


def _valid_frame_at(
    fs: FileSystem, fd: int, position: int, size: int, base_offset: int | None
) -> bool:
    if position + HEADER_BYTES > size:
        return False
    raw_header = fs.pread(fd, HEADER_BYTES, position)
    header = decode_header(raw_header)
    if header is None or position + header.frame_bytes > size or header.body_bytes % 8:
        return False
    if base_offset is not None and header.base_offset != base_offset:
        return False
    body = fs.pread(fd, header.body_bytes, position + HEADER_BYTES)
    return frame_checksum_ok(header, memoryview(raw_header), memoryview(body))


def _valid_frame_after(fs: FileSystem, fd: int, position: int, size: int) -> bool:
    """True if any checksummed frame starts at an 8-aligned position past ``position``."""
    position += -position % 8
    while position + HEADER_BYTES <= size:
        window = fs.pread(fd, SCAN_WINDOW_BYTES, position)
        index = window.find(b"TBb1")
        while index != -1:
            if (position + index) % 8 == 0 and _valid_frame_at(
                fs, fd, position + index, size, None
            ):
                return True
            index = window.find(b"TBb1", index + 1)
        position += max(len(window) - HEADER_BYTES, 8)
        position += -position % 8
    return False


def adopt_segment(segment: LogSegment, frames: list[tuple[int, FrameHeader]], size: int) -> None:
    """Make ``segment`` the one whose log is a whole file of ``frames`` (``size`` bytes,
    synced) just renamed into the partition (``PartitionLog.publish_staged``'s adoption):
    its indexes written from the frames' headers as the writer would have made them, its
    ends as a load would find them."""
    assert frames and frames[0][0] == 0 and frames[0][1].base_offset == segment.base_offset
    assert frames[-1][0] + frames[-1][1].frame_bytes == size
    _rebuild_indexes(segment, frames)
    segment.size_bytes = size
    segment.next_offset = frames[-1][1].next_offset
    segment.first_written_at_us = frames[0][1].written_at_us
    segment.last_written_at_us = frames[-1][1].written_at_us
    segment.dropped_to = size  # not this process's writes: never dropped (as a load's)
    segment._writeback_position = size
