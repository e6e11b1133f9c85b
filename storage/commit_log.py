"""Commit records in the staging log: the commit point of topic-only transactions.

A transaction that touches no table commits by one append to the staging log
(``storage.staging``): its staged batch frames, then one *commit record*
directly after them, written by a single ``pwritev`` and made durable by the
staging log's group-committed fdatasync. The record is the commit point: a
transaction whose whole, checksummed record is in the log committed.

Record layout (little-endian, a multiple of 8 bytes, like every staging frame)::

    0  magic          4s   b"TBc1"
    4  crc32c         u32  CRC-32C of bytes [8, 24) and of the payload (padding included)
    8  transaction_id u64
    16 payload_bytes  u32  length of the payload before padding
    20 batch_count    u32  the record's batch frames, the ones directly before it
    24 payload             opaque to storage (the engine's JSON), zero-padded to 8

``scan`` walks a staging file frame by frame (batch frames, ``record_batch``'s
``TBb1``, and records) and yields each valid record with where its batches lie.
It stops at the first frame that is not whole and valid: a torn or corrupt tail
(a crash mid-append, or pages of an unsynced append lost) means "not
committed" for that record and everything after it in the file, none of which
was acknowledged (an append is acknowledged only after a sync that covers it,
and syncs cover a file's prefix). A record counts only if its batch frames are
valid too.

Invariant: a record's batches are the ``batch_count`` frames directly before it,
so positions need not be known when it is encoded (outside any lock).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

import crc32c

from storage import limits
from storage.record_batch import HEADER_BYTES, decode_header, frame_checksum_ok

MAGIC = b"TBc1"
RECORD_HEADER = struct.Struct("<4sIQII")
RECORD_HEADER_BYTES = RECORD_HEADER.size
assert RECORD_HEADER_BYTES == 24
_COVERED = struct.Struct("<QII")  # bytes [8, 24)
BATCH_MAGIC = b"TBb1"


@dataclass(frozen=True, slots=True)
class FoundRecord:
    """A valid commit record found by ``scan``: where it and its batches lie."""

    transaction_id: int
    payload: bytes
    position: int  # of the record
    end: int  # just past the record
    batches: tuple[tuple[int, int], ...]  # (position, frame bytes) of each batch, in order


def encode_record(transaction_id: int, batch_count: int, payload: bytes) -> bytes:
    """The record's bytes (header, payload, padding)."""
    assert transaction_id > 0 and batch_count >= 0
    assert len(payload) <= limits.COMMIT_RECORD_PAYLOAD_BYTES_MAX
    padded = payload + b"\0" * (-len(payload) % 8)
    covered = _COVERED.pack(transaction_id, len(payload), batch_count)
    crc = crc32c.crc32c(padded, crc32c.crc32c(covered))
    return MAGIC + struct.pack("<I", crc) + covered + padded


def scan(raw: bytes | memoryview) -> Iterator[FoundRecord]:
    """The valid commit records of one staging file's bytes, in file order; stops at the
    first frame that is not whole and valid (see the module doc)."""
    view = memoryview(raw)
    position = 0
    frames: list[tuple[int, int]] = []  # batch frames since the last record
    size = len(view)
    while position + 8 <= size:
        magic = bytes(view[position : position + 4])
        if magic == BATCH_MAGIC:
            if position + HEADER_BYTES > size:
                return
            header = decode_header(view[position : position + HEADER_BYTES])
            if header is None or position + header.frame_bytes > size:
                return
            body = view[position + HEADER_BYTES : position + header.frame_bytes]
            if not frame_checksum_ok(header, view[position : position + HEADER_BYTES], body):
                return
            frames.append((position, header.frame_bytes))
            position += header.frame_bytes
            continue
        if magic != MAGIC or position + RECORD_HEADER_BYTES > size:
            return
        _, crc, transaction_id, payload_bytes, batch_count = RECORD_HEADER.unpack_from(
            view, position
        )
        padded = payload_bytes + (-payload_bytes % 8)
        end = position + RECORD_HEADER_BYTES + padded
        if end > size or batch_count > len(frames):
            return
        body = view[position + RECORD_HEADER_BYTES : end]
        covered = view[position + 8 : position + RECORD_HEADER_BYTES]
        if crc32c.crc32c(body, crc32c.crc32c(covered)) != crc:
            return
        batches = tuple(frames[len(frames) - batch_count :]) if batch_count else ()
        expected = position - sum(length for _, length in batches)
        if batches and batches[0][0] != expected:
            return  # not directly before the record: damage
        yield FoundRecord(
            transaction_id, bytes(body[:payload_bytes]), position, end, batches
        )
        frames = []
        position = end


# -- checking a staging file (``topicbase check``) ---------------------------------------------
@dataclass
class StagingWalk:
    """What ``walk_staging`` found in one staging file."""

    size_bytes: int
    frames: int = 0  # valid batch frames
    records: int = 0  # valid commit records
    # Damage followed by valid content, not repairable (what follows may be committed):
    # (position, damaged bytes, whether a frame or record with a bad checksum kept its
    # place (its well-formed header's length leads to the next valid one)).
    damage: list[tuple[int, int, bool]] = field(default_factory=list)
    tail_position: int | None = None  # where a torn tail (nothing valid after) starts
    # Zero bytes that end the file (the staging log's pre-written window): not damage.
    zero_tail_bytes: int = 0


def walk_staging(raw: bytes | memoryview) -> StagingWalk:
    """Walk every batch frame and commit record of a staging file. Unlike ``scan`` (which
    stops at the first invalid frame: recovery's rule), damage followed by a valid frame
    or record is reported and skipped; only damage with nothing valid after it is a torn
    tail, which a repair may cut. Zeros from where a frame would start to the end of the
    file are the staging log's pre-written window, the file's clean end (``zero_tail_bytes``);
    a tail with anything else in it is torn as before."""
    view = memoryview(raw)
    walk = StagingWalk(len(view))
    zeros_from = _zero_tail_start(view)
    position = 0
    while position < len(view):
        kind = _unit_at(view, position)
        if kind is not None:
            if kind[0] == "frame":
                walk.frames += 1
            else:
                walk.records += 1
            position += kind[1]
            continue
        if position >= zeros_from:
            walk.zero_tail_bytes = len(view) - position
            break
        claimed = _claimed_length(view, position)
        if claimed and position + claimed < len(view) and _unit_at(view, position + claimed):
            walk.damage.append((position, claimed, True))
            position += claimed
            continue
        resume = next(
            (p for p in range(position + 8, len(view), 8) if _unit_at(view, p) is not None), None
        )
        if resume is None:
            walk.tail_position = position
            break
        walk.damage.append((position, resume - position, False))
        position = resume
    return walk


def _zero_tail_start(view: memoryview) -> int:
    """Where the run of zero bytes that ends ``view`` starts (``len(view)`` if its last
    byte is not zero): found once, so a damaged file's walk does not copy its rest at
    every damaged position."""
    data = view.tobytes()
    return len(data.rstrip(b"\0"))


def _unit_at(view: memoryview, position: int) -> tuple[str, int] | None:
    """("frame" | "record", its length) if a valid one starts at ``position``."""
    size = len(view)
    magic = bytes(view[position : position + 4])
    if magic == BATCH_MAGIC and position + HEADER_BYTES <= size:
        header = decode_header(view[position : position + HEADER_BYTES])
        if header is None or position + header.frame_bytes > size:
            return None
        body = view[position + HEADER_BYTES : position + header.frame_bytes]
        if not frame_checksum_ok(header, view[position : position + HEADER_BYTES], body):
            return None
        return "frame", header.frame_bytes
    if magic == MAGIC and position + RECORD_HEADER_BYTES <= size:
        _, crc, _, payload_bytes, _ = RECORD_HEADER.unpack_from(view, position)
        end = position + RECORD_HEADER_BYTES + payload_bytes + (-payload_bytes % 8)
        if end > size:
            return None
        covered = view[position + 8 : position + RECORD_HEADER_BYTES]
        body = view[position + RECORD_HEADER_BYTES : end]
        if crc32c.crc32c(body, crc32c.crc32c(covered)) != crc:
            return None
        return "record", end - position
    return None


def _claimed_length(view: memoryview, position: int) -> int | None:
    """The length a well-formed header at ``position`` claims (checksum not verified)."""
    magic = bytes(view[position : position + 4])
    if magic == BATCH_MAGIC and position + HEADER_BYTES <= len(view):
        header = decode_header(view[position : position + HEADER_BYTES])
        return None if header is None else header.frame_bytes
    if magic == MAGIC and position + RECORD_HEADER_BYTES <= len(view):
        payload_bytes = RECORD_HEADER.unpack_from(view, position)[3]
        return RECORD_HEADER_BYTES + payload_bytes + (-payload_bytes % 8)
    return None
