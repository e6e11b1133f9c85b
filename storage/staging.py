"""Durable staging of transactions' topic writes, outside the partitions.

``<data>/staging/<20-digit file number>.stage`` files hold frames in the
usual format (``record_batch``): each staged batch is one frame whose
``transaction_id`` is the transaction and whose ``base_offset`` is the
batch's index within it. Nothing here is visible to readers of topics.

Staging is append-only: a transaction's frames are appended to the current
file and synced once (concurrent transactions share that sync through group
commit); a new file starts past ``file_bytes_max`` (one directory sync per
file, not per transaction). A file is deleted once no transaction that
needs it is left (``release``), which is how staged data of aborted or
undecided transactions disappears.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.ipc

from storage import failpoints, file_names
from storage.errors import CorruptSegmentError
from storage.fs import FileSystem
from storage.group_commit import GroupCommitter, Request
from storage.record_batch import (
    HEADER_BYTES,
    WIRE_SCHEMA,
    decode_header,
    encode_frame,
    frame_checksum_ok,
    serialize_body,
)

STAGE_SUFFIX = ".stage"
FILE_BYTES_MAX = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StagedBatch:
    """Where one staged batch lies: file number, position and frame length."""

    file_number: int
    position: int
    frame_bytes: int


class StagingLog:
    def __init__(self, fs: FileSystem, directory: str, file_bytes_max: int = FILE_BYTES_MAX):
        self._fs = fs
        self._directory = directory
        self._file_bytes_max = file_bytes_max
        self._lock = threading.Lock()
        fs.make_directory(directory)
        numbers = self.file_numbers()
        self._file_number = (numbers[-1] + 1) if numbers else 1
        self._fd: int | None = None
        self._size = 0
        self._users: dict[int, set[int]] = {}  # file number -> transactions that need it
        self._committer = GroupCommitter(self._flush)

    def file_numbers(self) -> list[int]:
        names = self._fs.list_directory(self._directory)
        found = (file_names.parse_offset(n, STAGE_SUFFIX) for n in names)
        return sorted(n for n in found if n is not None)

    def _path(self, number: int) -> str:
        return os.path.join(self._directory, file_names.offset_name(number) + STAGE_SUFFIX)

    # -- staging --------------------------------------------------------------------
    def stage(self, transaction_id: int, batches: list[pa.RecordBatch]) -> list[StagedBatch]:
        """Append ``batches`` durably; returns where each one lies."""
        assert transaction_id > 0 and batches
        frames = [
            encode_frame(
                serialize_body(batch),
                base_offset=index,
                written_at_us=0,
                record_count=batch.num_rows,
                transaction_id=transaction_id,
            )
            for index, batch in enumerate(batches)
        ]
        placed = self._committer.submit((transaction_id, frames))
        failpoints.hit("staging.after_sync")
        return placed

    def _flush(self, requests: list[Request]) -> None:
        """Group-commit leader: write every request's frames, sync once."""
        with self._lock:
            if self._fd is None or self._size >= self._file_bytes_max:
                self._rotate()
            assert self._fd is not None
            payload = bytearray()
            for request in requests:
                transaction_id, frames = request.payload
                placed = []
                for frame in frames:
                    placed.append(
                        StagedBatch(self._file_number, self._size + len(payload), len(frame))
                    )
                    payload += frame
                self._users.setdefault(self._file_number, set()).add(transaction_id)
                request.result = placed
            self._fs.pwrite(self._fd, bytes(payload), self._size)
            self._size += len(payload)
            self._fs.sync(self._fd)

    def _rotate(self) -> None:
        if self._fd is not None:
            self._fs.close(self._fd)
            self._file_number += 1
        fd = self._fs.open_write(self._path(self._file_number))
        try:
            self._fs.sync_directory(self._directory)
        except BaseException:
            self._fs.close(fd)
            raise
        self._fd = fd
        self._size = self._fs.file_size(fd)

    # -- reading back (recovery) ----------------------------------------------------------
    def read(self, staged: StagedBatch) -> pa.RecordBatch:
        """The staged batch, checksum verified."""
        path = self._path(staged.file_number)
        fd = self._fs.open_read(path)
        try:
            raw = self._fs.pread(fd, staged.frame_bytes, staged.position)
        finally:
            self._fs.close(fd)
        header = decode_header(raw)
        view = memoryview(raw)
        if (
            header is None
            or header.frame_bytes != len(raw)
            or not frame_checksum_ok(header, view[:HEADER_BYTES], view[HEADER_BYTES:])
        ):
            raise CorruptSegmentError(
                "staged batch is damaged", path=path, position=staged.position
            )
        return pyarrow.ipc.read_record_batch(pa.py_buffer(raw).slice(HEADER_BYTES), WIRE_SCHEMA)

    # -- cleanup ------------------------------------------------------------------------
    def keep(self, transaction_id: int, staged: list[StagedBatch]) -> None:
        """Recovery: note that ``transaction_id`` still needs its staged files."""
        with self._lock:
            for item in staged:
                self._users.setdefault(item.file_number, set()).add(transaction_id)

    def release(self, transaction_ids: set[int]) -> int:
        """Forget transactions (published and synced, or never committed); delete
        every file no transaction needs any more, except the one being written.
        Returns the number of files deleted."""
        deleted = 0
        with self._lock:
            for number in self.file_numbers():
                users = self._users.get(number, set()) - transaction_ids
                self._users[number] = users
                if not users and number != self._file_number:
                    self._fs.remove(self._path(number))
                    self._users.pop(number, None)
                    deleted += 1
        return deleted

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                self._fs.close(self._fd)
                self._fd = None
