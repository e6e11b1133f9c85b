"""File names of the log: 20-digit base offsets and suffixes.

A partition directory holds, per segment, ``<base>.log``, ``<base>.index`` and
``<base>.timeindex``; producer snapshots are ``<offset>.snapshot``. ``<base>``
is the first offset of the segment padded to 20 digits, so names sort in
offset order.
"""

from __future__ import annotations

LOG_SUFFIX = ".log"
OFFSET_INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
SNAPSHOT_SUFFIX = ".snapshot"
TEMP_SUFFIX = ".tmp"
DELETED_SUFFIX = ".deleted"

_DIGITS = 20


def offset_name(offset: int) -> str:
    assert 0 <= offset < 10**_DIGITS, offset
    return f"{offset:0{_DIGITS}d}"


def log_file(base_offset: int) -> str:
    return offset_name(base_offset) + LOG_SUFFIX


def offset_index_file(base_offset: int) -> str:
    return offset_name(base_offset) + OFFSET_INDEX_SUFFIX


def time_index_file(base_offset: int) -> str:
    return offset_name(base_offset) + TIME_INDEX_SUFFIX


def snapshot_file(offset: int) -> str:
    return offset_name(offset) + SNAPSHOT_SUFFIX


def parse_offset(name: str, suffix: str) -> int | None:
    """Return the offset in ``name`` if it is ``<20 digits><suffix>``, else None."""
    if not name.endswith(suffix):
        return None
    stem = name[: -len(suffix)]
    if len(stem) != _DIGITS or not stem.isdigit():
        return None
    return int(stem)
