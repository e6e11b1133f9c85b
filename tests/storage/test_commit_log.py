"""Commit records in a staging file: found whole, never torn or damaged.

``storage.commit_log.scan`` must yield exactly the records that are whole and
valid together with their batch frames, in file order, and stop at the first
frame that is not: a torn tail (every cut of the file) or a flipped byte
anywhere hides that record and the ones after it, never an earlier one.
"""

from __future__ import annotations

import pyarrow as pa

from storage import commit_log
from storage.record_batch import build_wire_batch
from storage.staging import encode_batches


def _batch(text: str) -> pa.RecordBatch:
    return build_wire_batch([text.encode()])


def _append(raw: bytearray, transaction_id: int, texts: list[str], payload: bytes) -> int:
    """Append a transaction's frames and its record; returns the record's end."""
    parts, lengths = encode_batches(transaction_id, [_batch(t) for t in texts]) if texts else (
        [], []
    )
    for part in parts:
        raw += memoryview(part).cast("B")
    raw += commit_log.encode_record(transaction_id, len(lengths), payload)
    return len(raw)


def _file() -> tuple[bytes, list[int]]:
    raw = bytearray()
    ends = [
        _append(raw, 11, ["a", "bb"], b'{"t":11}'),
        _append(raw, 12, [], b"offsets only"),
    ]
    # A table transaction's staged frames (no record) between two records.
    parts, _ = encode_batches(13, [_batch("staged")])
    for part in parts:
        raw += memoryview(part).cast("B")
    ends.append(_append(raw, 14, ["c"], b"x" * 13))
    return bytes(raw), ends


def test_scan_finds_every_record_with_its_batches_in_order() -> None:
    raw, ends = _file()
    found = list(commit_log.scan(raw))
    assert [r.transaction_id for r in found] == [11, 12, 14]
    assert [r.payload for r in found] == [b'{"t":11}', b"offsets only", b"x" * 13]
    assert [r.end for r in found] == ends
    assert len(found[0].batches) == 2 and found[1].batches == () and len(found[2].batches) == 1
    first, second = found[0].batches
    assert first[0] == 0 and second[0] == first[1] and second[0] + second[1] == found[0].position
    assert found[2].batches[0][0] + found[2].batches[0][1] == found[2].position


def test_every_cut_of_the_file_keeps_exactly_the_whole_records_before_it() -> None:
    raw, ends = _file()
    for cut in range(len(raw) + 1):
        found = [r.transaction_id for r in commit_log.scan(raw[:cut])]
        expected = [t for t, end in zip([11, 12, 14], ends, strict=True) if end <= cut]
        assert found == expected, cut


def test_a_flipped_byte_hides_that_record_and_the_later_ones_only() -> None:
    """Every byte is covered (magic compared, the rest checksummed), so damage anywhere
    in a transaction's frames or record keeps exactly the records that end before it."""
    raw, ends = _file()
    for position in range(len(raw)):
        damaged = bytearray(raw)
        damaged[position] ^= 0x40
        found = [r.transaction_id for r in commit_log.scan(bytes(damaged))]
        expected = [t for t, end in zip([11, 12, 14], ends, strict=True) if end <= position]
        assert found == expected, position


def test_the_checker_walk_counts_frames_and_records_and_finds_only_real_damage() -> None:
    """``walk_staging`` (``topicbase check``): commit records are valid content, a cut
    inside a unit is a torn tail, and damage inside a record followed by valid content
    is reported in place (never a tail that a repair would cut)."""
    raw, _ = _file()
    walk = commit_log.walk_staging(raw)
    assert (walk.frames, walk.records, walk.damage, walk.tail_position) == (4, 3, [], None)
    boundaries = {0}
    for found in commit_log.scan(raw):
        boundaries |= {found.position, found.end}
        boundaries |= {p for start, length in found.batches for p in (start, start + length)}
    for cut in range(len(raw)):
        walk = commit_log.walk_staging(raw[:cut])
        assert (walk.tail_position is None) == (cut in boundaries), cut
        assert walk.damage == [], cut
    record = next(r for r in commit_log.scan(raw) if r.transaction_id == 12)
    damaged = bytearray(raw)
    damaged[record.position + 30] ^= 0x01  # inside the record's payload
    walk = commit_log.walk_staging(bytes(damaged))
    assert walk.damage == [(record.position, record.end - record.position, True)]
    assert (walk.records, walk.tail_position) == (2, None)
