"""Walking the frames of a log or staging file, and checking indexes and snapshots.

Used by ``storage.check``; reads only, never repairs. Damage is told apart as in
``log_loader``: a bad region followed by a valid frame is corruption in the middle;
one with no valid frame after it is a torn tail. Files are read through windows of
``READ_WINDOW_BYTES`` so a check's memory stays bounded whatever the segment size.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from storage import file_names, log_loader, offset_index, time_index
from storage.check_report import BROKEN_FRAME, CORRUPT_FRAME, OFFSET_GAP
from storage.fs import FileSystem
from storage.record_batch import HEADER_BYTES, MAGIC, FrameHeader, decode_header, frame_checksum_ok
from storage.staging import STAGE_SUFFIX

READ_WINDOW_BYTES = 4 * 1024 * 1024


# -- walking the frames of a file -------------------------------------------------------------
@dataclass(slots=True)
class LogWalk:
    """The frames of one file in order, damage found between them, and a torn tail."""

    path: str
    size_bytes: int
    # Every frame with a well-formed header, including kept frames with a bad checksum.
    frames: list[tuple[int, FrameHeader]] = field(default_factory=list)
    damage: list[tuple[str, int, str]] = field(default_factory=list)  # (kind, position, text)
    tail_position: int | None = None  # start of bytes with no valid frame after them

    @property
    def end_offset(self) -> int | None:
        return self.frames[-1][1].next_offset if self.frames else None


class _Reader:
    """Reads a file through one cached window: a sequential walk costs a pread per window."""

    def __init__(self, fs: FileSystem, fd: int, size: int) -> None:
        self._fs, self._fd, self.size = fs, fd, size
        self._start = 0
        self._data = b""

    def read(self, position: int, length: int) -> memoryview:
        end = min(position + length, self.size)
        if not (self._start <= position and end <= self._start + len(self._data)):
            self._start = position
            self._data = self._fs.pread(self._fd, max(end - position, READ_WINDOW_BYTES), position)
        start = position - self._start
        return memoryview(self._data)[start : start + end - position]

    def chunk(self, position: int) -> bytes:
        return self._fs.pread(self._fd, READ_WINDOW_BYTES, position)


def walk_frames(fs: FileSystem, path: str, first_offset: int | None) -> LogWalk:
    """Walk every frame of ``path``; ``first_offset`` None means no offset chain (staging).

    A frame with a bad checksum keeps its place when a well-formed header
    continuing the chain follows it; any other damage is skipped to the next
    valid frame, or, when none follows, is the torn tail.
    """
    size = fs.path_size(path)
    walk = LogWalk(path, size)
    fd = fs.open_read(path)
    try:
        reader = _Reader(fs, fd, size)
        chained = first_offset is not None
        position, expected = 0, first_offset
        for _ in range(size // 8 + 1):  # every round moves on by at least 8 bytes
            if position >= size:
                break
            header = _well_formed_header(reader, position)
            if header is not None and _checksum_ok(reader, position, header):
                if expected is not None and header.base_offset != expected:
                    text = f"frame starts at offset {header.base_offset}, expected {expected}"
                    walk.damage.append((OFFSET_GAP, position, text))
            elif header is not None and _header_follows(
                reader, position + header.frame_bytes, header.next_offset if chained else None
            ):
                text = "checksum mismatch; the frame keeps its place (not repairable)"
                walk.damage.append((CORRUPT_FRAME, position, text))
            else:
                resume = _next_valid_frame(reader, position + 8)
                if resume is None:
                    walk.tail_position = position
                    break
                text = f"{resume - position} damaged bytes before the next valid frame"
                walk.damage.append((BROKEN_FRAME, position, text + " (not repairable)"))
                position, expected = resume, None
                continue
            walk.frames.append((position, header))
            expected = header.next_offset if chained else None
            position += header.frame_bytes
        return walk
    finally:
        fs.close(fd)


def _well_formed_header(reader: _Reader, position: int) -> FrameHeader | None:
    if position + HEADER_BYTES > reader.size:
        return None
    header = decode_header(reader.read(position, HEADER_BYTES))
    if header is None or header.body_bytes % 8 or header.record_count == 0:
        return None
    return header if position + header.frame_bytes <= reader.size else None


def _checksum_ok(reader: _Reader, position: int, header: FrameHeader) -> bool:
    raw = reader.read(position, header.frame_bytes)
    return frame_checksum_ok(header, raw[:HEADER_BYTES], raw[HEADER_BYTES:])


def _header_follows(reader: _Reader, position: int, next_offset: int | None) -> bool:
    header = _well_formed_header(reader, position)
    return header is not None and (next_offset is None or header.base_offset == next_offset)


def _next_valid_frame(reader: _Reader, start: int) -> int | None:
    """Position of the first checksummed frame at an 8-aligned position >= ``start``."""
    position = start + (-start % 8)
    for _ in range(reader.size // 8 + 1):  # every round moves on by at least 8 bytes
        if position + HEADER_BYTES > reader.size:
            return None
        chunk = reader.chunk(position)
        index = chunk.find(MAGIC)
        while index != -1:
            candidate = position + index
            if candidate % 8 == 0:
                header = _well_formed_header(reader, candidate)
                if header is not None and _checksum_ok(reader, candidate, header):
                    return candidate
            index = chunk.find(MAGIC, index + 1)
        position += max(len(chunk) - len(MAGIC) + 1, 8)
        position += -position % 8
    return None


# -- indexes and snapshots (pure) ---------------------------------------------------------
def index_entries(
    base_offset: int, frames: list[tuple[int, FrameHeader]]
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The offset and time index entries recovery builds for ``frames``."""
    offset_entries, time_entries, _ = log_loader.index_entries(base_offset, frames)
    return offset_entries, time_entries


def offset_index_issue(
    raw: bytes | None, base_offset: int, frames: list[tuple[int, FrameHeader]]
) -> tuple[str, int | None] | None:
    """What is wrong with an offset index file's bytes, and at which byte; None if fine."""
    entry = offset_index.ENTRY
    if raw is None:
        return ("the offset index is missing", None) if frames else None
    if len(raw) % entry.size:
        return f"{len(raw)} bytes is not a whole number of {entry.size}-byte entries", None
    if frames and raw[: entry.size] != entry.pack(0, 0):
        return "the first entry does not name the first frame (offset 0 at byte 0)", 0
    starts = dict(frames)
    previous = (-1, -1)
    for number, (relative, position) in enumerate(entry.iter_unpack(raw)):
        header = starts.get(position)
        if header is None:
            text = f"entry {number} points at byte {position}, not at a frame start"
            return text, number * entry.size
        if header.base_offset != base_offset + relative:
            text = f"entry {number} names offset {base_offset + relative}, the frame holds "
            return text + str(header.base_offset), number * entry.size
        if relative <= previous[0] or position <= previous[1]:
            return f"entry {number} does not increase", number * entry.size
        previous = (relative, position)
    return None


def time_index_issue(
    raw: bytes | None, base_offset: int, frames: list[tuple[int, FrameHeader]]
) -> tuple[str, int | None] | None:
    """What is wrong with a time index file's bytes, and at which byte; None if fine."""
    entry = time_index.ENTRY
    if raw is None:
        return ("the time index is missing", None) if frames else None
    if len(raw) % entry.size:
        return f"{len(raw)} bytes is not a whole number of {entry.size}-byte entries", None
    by_offset = {header.base_offset: header for _, header in frames}
    previous_time, previous_offset = -(2**63), -1
    for number, (written_at_us, relative) in enumerate(entry.iter_unpack(raw)):
        offset = base_offset + relative
        header = by_offset.get(offset)
        if header is None:
            text = f"entry {number} names offset {offset}, where no frame starts"
            return text, number * entry.size
        if header.written_at_us != written_at_us:
            text = f"entry {number} says {written_at_us} µs, the frame at offset {offset} says "
            return text + str(header.written_at_us), number * entry.size
        if written_at_us < previous_time or offset <= previous_offset:
            return f"entry {number} does not increase", number * entry.size
        previous_time, previous_offset = written_at_us, offset
    return None


def snapshot_issue(raw: bytes, offset: int, *, ledger: bool = False) -> str | None:
    """What is wrong with a producer snapshot named ``offset``; None if it loads.
    ``ledger``: the topic has a ledger (``storage.ledger_route``), whose rows' producer
    state is recorded at their ledger append, before they are copied into the log: a
    snapshot written meanwhile (a clean close, a roll during a copy) names the log's own
    end and claims offsets past it, held in the ledger (the open copies them in)."""
    try:
        payload = json.loads(raw)
    except ValueError:
        return "not valid JSON"
    if not isinstance(payload, dict) or payload.get("offset") != offset:
        return "its offset field does not match its name"
    producers = payload.get("producers")
    if not isinstance(producers, dict):
        return "it has no producer table"
    for key, entry in producers.items():
        well_formed = (
            isinstance(entry, list)
            and len(entry) == 3
            and (entry[0] is None or isinstance(entry[0], int))
            and all(isinstance(value, int) for value in entry[1:])
        )
        if not well_formed:
            return f"the entry of producer {key!r} is malformed"
        if entry[1] >= offset and not ledger:
            return f"producer {key!r} claims offset {entry[1]}, not below the snapshot's {offset}"
    return None


def staged_batch_issue(
    fs: FileSystem,
    directory: str,
    file_number: int,
    position: int,
    frame_bytes: int,
    transaction_id: int,
) -> tuple[str, str] | None:
    """(staging file path, what is wrong) with a staged batch a commit record names; None if ok."""
    path = os.path.join(directory, file_names.offset_name(file_number) + STAGE_SUFFIX)
    if not fs.exists(path):
        return path, "its staging file is missing"
    fd = fs.open_read(path)
    try:
        raw = fs.pread(fd, frame_bytes, position)
    finally:
        fs.close(fd)
    header = decode_header(raw) if len(raw) >= HEADER_BYTES else None
    if len(raw) < frame_bytes or header is None or header.frame_bytes != frame_bytes:
        return path, "no frame of that length starts there"
    view = memoryview(raw)
    if not frame_checksum_ok(header, view[:HEADER_BYTES], view[HEADER_BYTES:]):
        return path, "the staged frame fails its checksum"
    if header.transaction_id != transaction_id:
        return path, f"the staged frame belongs to transaction {header.transaction_id}"
    return None
