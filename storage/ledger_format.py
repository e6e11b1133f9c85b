"""The ledger's frame format: one statement's small shares of many partitions, written once.

A *ledger frame* holds the shares of one statement (or one transaction's publish) over
many partitions of a topic: a table of its shares, each a partition, its first offset and
its number of messages, then one Arrow IPC record batch (``WIRE_SCHEMA``) whose rows are
the shares' messages, share after share in the table's order. A share's rows are
``[row, row + count)`` with ``row`` the sum of the counts before it in the table.

Frame layout (little-endian; every frame starts at a multiple of 8 bytes)::

    0  magic          4s   b"TBL1"
    4  crc32c         u32  see below
    8  sequence       u64  the frame's number in the ledger: each frame's is its
                           predecessor's plus one, across files
    16 written_at_us  i64  server time of the append, microseconds since the epoch
    24 record_count   u32  rows of the body (the sum of the shares' counts, >= 1)
    28 share_count    u32  entries of the share table (>= 1)
    32 body_bytes     u32  length of the body, a multiple of 8
    36 reserved       u32  zero
    40 transaction_id u64  the publishing transaction, 0 for a plain statement
    48 share table        ``share_count`` x (partition u32, count u32, base_offset i64)
    .. body               Arrow IPC encapsulated record batch message (no schema)

The checksum is CRC-32C of the body, continued over header bytes [8, 48) and then the
share table: ``crc32c(covered + table, crc32c(body))``. (Not in byte order: the body's
CRC, the long part, is computed by the appender outside the ledger's lock; the header
and the table, which hold the sequence number and offsets the ledger assigns under it,
are covered after.)

Invariants of a valid frame (``decode_frame`` checks them all): the partitions of the
share table are strictly increasing (one share per partition per frame), every count is
>= 1, the counts sum to ``record_count``, every base offset is >= 0.

The commit point: a statement written to the ledger committed iff its whole frame, with
a valid checksum, is in the ledger (it is acknowledged only after an fdatasync covering
it). ``scan`` finds the valid frames of a file: it stops at the first invalid one, the
torn tail of a crash (nothing after it was acknowledged: syncs cover a file's prefix); if
a well-formed header there claims a length that leads to another valid frame, the file is
damaged in the middle (a valid, maybe acknowledged, frame follows), and ``scan`` raises
``CorruptSegmentError`` instead of dropping what follows.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c
import numpy as np
import pyarrow as pa

from storage.errors import CorruptSegmentError
from storage.record_batch import WIRE_SCHEMA, serialize_body_buffer

MAGIC = b"TBL1"
HEADER = struct.Struct("<4sIQqIIIIQ")
HEADER_BYTES = HEADER.size
assert HEADER_BYTES == 48
_LEAD = struct.Struct("<4sI")  # magic, crc: bytes [0, 8)
_COVERED = struct.Struct("<QqIIIIQ")  # bytes [8, 48)
SHARE_DTYPE = np.dtype([("partition", "<u4"), ("count", "<u4"), ("base", "<i8")])
SHARE_BYTES = SHARE_DTYPE.itemsize
assert SHARE_BYTES == 16


@dataclass(frozen=True, slots=True)
class EncodedBody:
    """A statement's shares as the ledger's appender hands them over (``encode_body``):
    the partitions in increasing order, their counts, the body and its CRC. Made outside
    the ledger's lock; the offsets and the sequence number are added under it."""

    partitions: np.ndarray  # uint32, strictly increasing
    counts: np.ndarray  # uint32, each >= 1
    body: pa.Buffer
    body_crc: int

    @property
    def record_count(self) -> int:
        return int(self.counts.sum())


@dataclass(frozen=True, slots=True)
class LedgerFrame:
    """A valid frame found by ``scan`` or ``decode_frame``: where its body lies in its file
    and its shares (``SHARE_DTYPE``, a copy of the table)."""

    position: int
    sequence: int
    written_at_us: int
    record_count: int
    transaction_id: int
    shares: np.ndarray
    body_position: int
    body_bytes: int

    @property
    def end(self) -> int:
        return self.body_position + self.body_bytes


def encode_body(shares: Sequence[tuple[int, pa.RecordBatch]]) -> EncodedBody:
    """Encode a statement's shares ``(partition, wire batch)``, partitions strictly
    increasing and each batch non-empty, as one body. The batches are concatenated and
    serialized once (a copy of the messages: the frame's one write)."""
    if not shares:
        raise ValueError("a ledger frame needs at least one share")
    partitions = np.fromiter((p for p, _ in shares), np.int64, len(shares))
    counts = np.fromiter((b.num_rows for _, b in shares), np.int64, len(shares))
    try:  # refuses batches of different schemas: checking the result checks them all
        whole = pa.concat_batches([b for _, b in shares]) if len(shares) > 1 else shares[0][1]
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise ValueError(f"a ledger frame's shares must be wire batches: {error}") from error
    return encode_whole(partitions, counts, whole)


def encode_whole(partitions: np.ndarray, counts: np.ndarray, whole: pa.RecordBatch
                 ) -> EncodedBody:  # fmt: skip
    """``encode_body`` of shares given as one batch: ``whole``'s rows are the shares' one
    after another, ``counts[i]`` rows to ``partitions[i]`` (strictly increasing). A
    statement that holds its rows in share order already (``storage.ledger_route``)
    makes no batch a share."""
    if not len(partitions) or len(partitions) != len(counts):
        raise ValueError("a ledger frame needs one count for each of its shares (>= 1)")
    if partitions[0] < 0 or partitions[-1] > 0xFFFFFFFF or np.any(np.diff(partitions) <= 0):
        raise ValueError("a ledger frame's partitions must be increasing u32 values")
    if np.any(counts < 1) or np.any(counts > 0xFFFFFFFF):
        raise ValueError("every share of a ledger frame needs at least one message")
    if int(counts.sum()) != whole.num_rows:
        raise ValueError("a ledger frame's counts must add up to its rows")
    if not whole.schema.equals(WIRE_SCHEMA):
        raise ValueError("a ledger share must be a wire batch (WIRE_SCHEMA)")
    body = serialize_body_buffer(whole)
    return EncodedBody(partitions.astype(np.uint32), counts.astype(np.uint32), body,
                       crc32c.crc32c(body))  # fmt: skip


def frame_parts(
    encoded: EncodedBody, bases: np.ndarray, *, sequence: int, written_at_us: int,
    transaction_id: int,
) -> list[bytes | pa.Buffer]:  # fmt: skip
    """The frame of ``encoded`` with base offsets ``bases`` (int64, one per share), as
    buffers to write back to back: header and share table in one ``bytes``, then the body."""
    count = len(encoded.partitions)
    table = np.empty(count, SHARE_DTYPE)
    table["partition"] = encoded.partitions
    table["count"] = encoded.counts
    table["base"] = bases
    table_bytes = table.tobytes()
    covered = _COVERED.pack(sequence, written_at_us, encoded.record_count, count,
                            encoded.body.size, 0, transaction_id)  # fmt: skip
    crc = crc32c.crc32c(table_bytes, crc32c.crc32c(covered, encoded.body_crc))
    return [_LEAD.pack(MAGIC, crc) + covered + table_bytes, encoded.body]


def frame_bytes(parts: Sequence[bytes | pa.Buffer]) -> int:
    return sum(len(p) if isinstance(p, bytes) else p.size for p in parts)


def decode_frame(view: memoryview, position: int) -> LedgerFrame | None:
    """The valid frame at ``position`` of ``view``, or None: not a frame start, not whole,
    a bad checksum or a table that breaks the invariants (the module docstring)."""
    size = len(view)
    if position + HEADER_BYTES > size or bytes(view[position : position + 4]) != MAGIC:
        return None
    _, crc, sequence, written_at, records, share_count, body_bytes, reserved, transaction = (
        HEADER.unpack_from(view, position))  # fmt: skip
    if share_count < 1 or records < 1 or body_bytes % 8 or reserved:
        return None
    table_end = position + HEADER_BYTES + share_count * SHARE_BYTES
    end = table_end + body_bytes
    if end > size:
        return None
    body_position = table_end
    table_raw = view[position + HEADER_BYTES : table_end]
    covered = view[position + 8 : position + HEADER_BYTES]
    body_crc = crc32c.crc32c(view[body_position:end])
    if crc32c.crc32c(table_raw, crc32c.crc32c(covered, body_crc)) != crc:
        return None
    shares = np.frombuffer(table_raw, SHARE_DTYPE).copy()
    partitions = shares["partition"].astype(np.int64)
    if (np.any(np.diff(partitions) <= 0) or np.any(shares["count"] < 1)
            or int(shares["count"].sum(dtype=np.int64)) != records
            or np.any(shares["base"] < 0)):  # fmt: skip
        return None
    return LedgerFrame(position, sequence, written_at, records, transaction, shares,
                       body_position, body_bytes)  # fmt: skip


def _claimed_end(view: memoryview, position: int) -> int | None:
    """Where a well-formed header at ``position`` says its frame ends (checksum not
    verified), or None."""
    if position + HEADER_BYTES > len(view) or bytes(view[position : position + 4]) != MAGIC:
        return None
    share_count, body_bytes = HEADER.unpack_from(view, position)[5:7]
    return position + HEADER_BYTES + share_count * SHARE_BYTES + body_bytes


def scan(raw: bytes | memoryview | pa.Buffer, path: str) -> tuple[list[LedgerFrame], int]:
    """The valid frames of one ledger file, in order, and where the valid prefix ends.

    Stops at the first invalid frame (a torn tail). Raises ``CorruptSegmentError`` if the
    damage is followed by a valid frame at the end a well-formed header there claims, or if
    sequence numbers within the file do not follow one another."""
    view = memoryview(raw).cast("B") if not isinstance(raw, memoryview) else raw
    frames: list[LedgerFrame] = []
    position = 0
    while position < len(view):
        frame = decode_frame(view, position)
        if frame is None:
            claimed = _claimed_end(view, position)
            valid_after = (claimed is not None and claimed % 8 == 0 and claimed < len(view)
                           and decode_frame(view, claimed) is not None)  # fmt: skip
            if valid_after:
                raise CorruptSegmentError(
                    "damaged ledger frame followed by valid frames", path=path, position=position
                )
            break
        if frames and frame.sequence != frames[-1].sequence + 1:
            raise CorruptSegmentError(
                f"ledger frame sequence {frame.sequence} after {frames[-1].sequence}",
                path=path, position=position)  # fmt: skip
        frames.append(frame)
        position = frame.end
    return frames, position
