"""Durable staging of transactions' topic writes, outside the partitions.

``<data>/staging/<20-digit file number>.stage`` files hold frames in the
usual format (``record_batch``): each staged batch is one frame whose
``transaction_id`` is the transaction and whose ``base_offset`` is the
batch's index within it. Nothing here is visible to readers of topics.

Commit records (``storage.commit_log``) share these files: a topic-only
transaction appends its frames and its commit record in one ``append`` (one
``pwritev``, so its batches lie directly before the record); recovery reads the
files back whole (``read_file``) to find them. Frame and record both start at a
multiple of 8 bytes.

Staging is append-only and split in two steps so that the sync overlaps the
committer's other work: ``write`` appends a transaction's frames (no sync)
and returns where they lie plus a ``StagingTicket``; a background *syncer*
thread fdatasyncs the current file as soon as it holds unsynced bytes (one
sync covers every frame written before it started: concurrent transactions
share it, which is group commit); ``wait_durable(ticket)`` blocks until a
sync that began after the ticket's write has returned. ``stage`` does both.
An append that carries a commit record does not wake the syncer: its writer
waits at once, and a waiter whose bytes no sync is writing yet syncs them
itself (the *leader*; one sync at a time, the others wait for it and the first
not covered leads the next), which saves two thread hand-offs per commit.
Wake-ups are targeted: each waiting committer sleeps on its own condition
(``_Waiter``), and the end of a sync wakes only the waiters it covered and, if
others are left, one of them to lead the next sync (a ``notify_all`` woke every
waiter, and those not covered took the GIL only to sleep again: ~0.9 useless
wake-ups per commit with 16 sessions). A failure, a new file and ``close`` wake
every waiter.
Pre-written window: after a small append (at most
``limits.STAGING_PREWRITE_APPEND_BYTES_MAX``) that leaves less than half of
``limits.STAGING_PREWRITE_BYTES`` written ahead of the file's end, the appender writes
zeros that far ahead (under the lock, not synced by itself: the next sync covers them),
so the appends after it overwrite written blocks and their fdatasync changes no file size
(no synchronous inode write: a sync of an overwrite costs 0.22-0.29 ms p50 on this
machine's ext4, of an append 0.35-0.44 ms). Big appends (bulk writes) pre-write nothing:
zeros would double their bytes. A file's bytes are therefore its frames and records, then
zeros: the logical end is where the first all-zero header starts (``commit_log.scan``
stops there; ``walk_staging`` reports a zero tail as no damage), not the file's size. A
failed zero write (ENOSPC) only stops pre-writing in that file. A file is never reopened
for appending: each process appends to new file numbers (``_rotate``).
A new file starts past ``file_bytes_max`` (one directory sync per file, not
per transaction); the old file is synced before it is closed. The syncer
creates the next file (and syncs the directory) ahead of time, once the
current one is ``SPARE_AT_FRACTION`` full, so a rotation on the commit path
usually only switches descriptors.

Invariants:
- a ticket is durable only once a sync *started after its write* returned
  (the sync's target is taken under the lock that orders writes);
- after a failed sync nothing written to that file so far counts as durable
  (fsyncgate: the kernel may have dropped those dirty pages), every waiter on
  it gets the error, and the next write starts a new file, so no later frame
  shares a page with lost ones;
- a file is deleted once no transaction that needs it is left (``release``),
  which is how staged data of aborted or undecided transactions disappears;
  the file being written is never deleted.
Thread-safety: every method may be called from any thread; one lock orders
writes, sync targets and file changes, and the fsync itself runs outside it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.ipc

from storage import failpoints, file_names, limits
from storage.errors import CorruptSegmentError, StorageIOError
from storage.fs import FileSystem
from storage.record_batch import (
    HEADER_BYTES,
    WIRE_SCHEMA,
    decode_header,
    encode_frame_header,
    frame_checksum_ok,
    serialize_body_buffer,
)

STAGE_SUFFIX = ".stage"
SPARE_AT_FRACTION = 0.75


_ZEROS = bytes(limits.STAGING_PREWRITE_BYTES)


def _zeros(size: int) -> memoryview:
    """``size`` zero bytes (a view of one shared buffer when it is big enough)."""
    assert size > 0
    if size <= len(_ZEROS):
        return memoryview(_ZEROS)[:size]
    return memoryview(bytes(size))


@dataclass(frozen=True, slots=True)
class StagedBatch:
    """Where one staged batch lies: file number, position and frame length."""

    file_number: int
    position: int
    frame_bytes: int


@dataclass(frozen=True, slots=True)
class StagingTicket:
    """One ``write``: its batches' places, and the file end they need synced."""

    placed: tuple[StagedBatch, ...]
    file_number: int
    end: int


@dataclass(slots=True)
class _Waiter:
    """A committer in ``wait_durable``: the file and end its ticket needs synced, and the
    condition (on the log's lock) it sleeps on."""

    file_number: int
    end: int
    woken: threading.Condition


def encode_batches(
    transaction_id: int, batches: list[pa.RecordBatch]
) -> tuple[list[bytes | pa.Buffer], list[int]]:
    """Frames of ``batches`` for ``StagingLog.append`` (no lock needed): the parts to
    write back to back (each frame's header, then its body: ``serialize_body_buffer``,
    which a transaction's publish reuses) and each frame's length."""
    assert transaction_id > 0
    parts: list[bytes | pa.Buffer] = []
    lengths = []
    for index, batch in enumerate(batches):
        body = serialize_body_buffer(batch)
        header = encode_frame_header(
            body,
            base_offset=index,
            written_at_us=0,
            record_count=batch.num_rows,
            transaction_id=transaction_id,
        )
        parts += (header, body)
        lengths.append(len(header) + body.size)
    return parts, lengths


class StagingLog:
    def __init__(self, fs: FileSystem, directory: str,
                 file_bytes_max: int = limits.STAGING_FILE_BYTES_MAX) -> None:
        self._fs = fs
        self._directory = directory
        self._file_bytes_max = file_bytes_max
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # syncs, file changes, close
        # The syncer alone waits here, for bytes to sync (or close): an append wakes it
        # without waking every committer waiting on ``_changed`` for its sync (with 16
        # committing sessions, each append woke all of them only to sleep again).
        self._wanted = threading.Condition(self._lock)
        # Committers waiting in ``wait_durable``, in arrival order (``_wake_covered``).
        self._waiters: list[_Waiter] = []
        fs.make_directory(directory)
        numbers = self.file_numbers()
        self._file_number = (numbers[-1] + 1) if numbers else 1
        self._fd: int | None = None
        self._size = 0  # the logical end of the current file: where the next append goes
        # Bytes of the current file written: its frames and records, then zeros (``_prewrite``).
        self._filled = 0
        self._prewrite_bytes = limits.STAGING_PREWRITE_BYTES
        self._prewrite_ok = True  # False in a file once a zero write failed
        self.prewrites = 0  # zero writes made (``_prewrite``)
        self._users: dict[int, set[int]] = {}  # file number -> transactions that need it
        self._durable: dict[int, int] = {}  # file number -> bytes known synced
        self._failed: dict[int, BaseException] = {}  # file number -> its failed sync
        self._syncing = False  # the syncer holds ``_fd`` outside the lock
        self._spare: tuple[int, int] | None = None  # (number, fd) of the next file, ready
        self._preparing = False  # a thread is creating the spare (``_prepare_spare``)
        self._plain_end = (0, 0)  # (file, end) of the last append without a commit record
        self._closed = False
        self._syncer: threading.Thread | None = None
        self.sync_rounds = 0  # syncs made by the syncer thread or a leader (``wait_durable``)
        self.rotation_syncs = 0  # syncs of a full file before it is closed
        self.spare_directory_syncs = 0  # directory syncs made ahead for spare files

    def file_numbers(self) -> list[int]:
        names = self._fs.list_directory(self._directory)
        found = (file_names.parse_offset(n, STAGE_SUFFIX) for n in names)
        return sorted(n for n in found if n is not None)

    def _path(self, number: int) -> str:
        return os.path.join(self._directory, file_names.offset_name(number) + STAGE_SUFFIX)

    # -- staging --------------------------------------------------------------------
    def stage(self, transaction_id: int, batches: list[pa.RecordBatch]) -> list[StagedBatch]:
        """Append ``batches`` durably; returns where each one lies."""
        ticket = self.write(transaction_id, batches)
        self.wait_durable(ticket)
        return list(ticket.placed)

    def write(self, transaction_id: int, batches: list[pa.RecordBatch]) -> StagingTicket:
        """Append ``batches`` (not yet durable: see ``wait_durable``) and wake the syncer."""
        parts, lengths = encode_batches(transaction_id, batches)
        return self.append(transaction_id, parts, lengths)

    def append(
        self,
        transaction_id: int,
        parts: list[bytes | pa.Buffer],
        lengths: list[int],
        record: bytes | None = None,
    ) -> StagingTicket:
        """Append encoded batch frames (``encode_batches``) and, if given, the commit
        record after them (``storage.commit_log``), in one write to one file; not yet
        durable (``wait_durable``). The ticket's ``end`` is past the record."""
        assert transaction_id > 0 and (lengths or record is not None)
        if record is not None:
            parts = [*parts, record]
        with self._changed:
            if self._closed:
                raise StorageIOError("the staging log is closed")
            self._make_room()
            assert self._fd is not None
            position = self._size
            start = position
            if record is not None and failpoints.ACTIVE:
                self._torn_record_failpoint(parts, position)
            self._fs.pwritev(self._fd, parts, position)
            placed = []
            for length in lengths:
                placed.append(StagedBatch(self._file_number, position, length))
                position += length
            if record is not None:
                position += len(record)
            self._size = position
            if position > self._filled:
                self._filled = position  # this append grew the file
            if (
                self._prewrite_ok
                and self._filled - position < self._prewrite_bytes // 2
                and position - start <= limits.STAGING_PREWRITE_APPEND_BYTES_MAX
            ):
                self._prewrite(position)
            self._users.setdefault(self._file_number, set()).add(transaction_id)
            if record is None:  # a commit record's writer waits at once: it syncs itself
                self._plain_end = (self._file_number, position)
                self._start_syncer()
                self._wanted.notify()
            return StagingTicket(tuple(placed), self._file_number, position)

    def _prewrite(self, end: int) -> None:
        """Caller holds the lock: write zeros from the written end (``_filled``) to ``end``
        plus the window (never past ``file_bytes_max`` unless the file already is), so that
        the next appends overwrite and their syncs change no size. A failure (``staging.
        prewrite``; ENOSPC) ends pre-writing in this file: the appends grow it, as they did
        before; zeros written past the logical end are harmless (they end the file)."""
        assert self._fd is not None and end <= self._filled
        start = self._filled
        stop = min(end + self._prewrite_bytes, max(self._file_bytes_max, end))
        if stop <= start:
            return
        try:
            if failpoints.ACTIVE:
                failpoints.hit("staging.prewrite")
            self._fs.pwrite(self._fd, _zeros(stop - start), start)
        except StorageIOError:
            self._prewrite_ok = False
            return
        self._filled = stop
        self.prewrites += 1

    def _torn_record_failpoint(self, parts: list[bytes | pa.Buffer], position: int) -> None:
        """``staging.torn_record``: write all but the last 8 bytes of a commit append
        (its record torn), then crash or fail there (the full write follows if not due)."""
        if not failpoints.armed("staging.torn_record"):
            return
        joined = b"".join(memoryview(part).cast("B") for part in parts)
        assert self._fd is not None
        self._fs.pwritev(self._fd, [joined[:-8]], position)
        failpoints.hit("staging.torn_record")

    def wait_durable(self, ticket: StagingTicket) -> None:
        """Block until the ticket's frames are synced; raise the error of a failed sync.

        A waiter whose bytes no sync is writing yet makes that sync itself (the *leader*:
        it syncs everything appended so far, as the syncer would, and wakes the others),
        so a committer does not hand its sync to the syncer thread and wait to be woken
        (two thread hand-offs per commit on a 2-core machine); while a sync runs, others
        wait for it and the first not covered leads the next."""
        number = ticket.file_number
        waiter: _Waiter | None = None
        while True:
            with self._changed:
                if self._durable.get(number, 0) >= ticket.end:
                    break
                failure = self._failed.get(number)
                if failure is not None:
                    raise failure
                if self._closed:
                    raise StorageIOError("the staging log closed before the sync")
                if self._syncing or number != self._file_number or not self._sync_wanted():
                    if waiter is None:
                        waiter = _Waiter(number, ticket.end, threading.Condition(self._lock))
                    self._waiters.append(waiter)
                    try:
                        waiter.woken.wait()
                    except BaseException:  # an interrupt: it may have been chosen to lead
                        self._waiters.remove(waiter)
                        self._wake_leader()
                        raise
                    self._waiters.remove(waiter)
                    continue
                fd, target = self._fd, self._size
                self._syncing = True
            assert fd is not None
            self._sync_round(fd, number, target)
        failpoints.hit("staging.after_sync")

    def _wake_all(self) -> None:
        """Caller holds the lock: wake every waiter (a failure, a new file, close)."""
        self._changed.notify_all()
        for waiter in self._waiters:
            waiter.woken.notify()

    def _wake_leader(self) -> None:
        """Caller holds the lock: if no sync runs, wake one waiter on the current file that
        no sync covered yet, to lead the next one (the others stay asleep)."""
        if self._syncing:
            return
        number = self._file_number
        durable = self._durable.get(number, 0)
        for waiter in self._waiters:
            if waiter.file_number == number and waiter.end > durable:
                waiter.woken.notify()
                return

    def _wake_covered(self, number: int) -> None:
        """Caller holds the lock, a sync of file ``number`` just succeeded: wake the
        waiters it made durable, then one of the rest to lead the next sync."""
        durable = self._durable.get(number, 0)
        for waiter in self._waiters:
            if waiter.file_number == number and waiter.end <= durable:
                waiter.woken.notify()
        self._wake_leader()

    def _make_room(self) -> None:
        """Caller holds the lock: open a file if none is open, or a new one past the
        size limit or after a failed sync (the old one synced and closed first)."""
        while (
            self._fd is None
            or self._size >= self._file_bytes_max
            or self._file_number in self._failed
        ):
            if self._syncing:
                self._changed.wait()  # the syncer is using ``_fd``: let it finish
                continue
            self._rotate()

    def _rotate(self) -> None:
        if self._fd is not None:
            number = self._file_number
            if number not in self._failed and self._durable.get(number, 0) < self._size:
                try:
                    self._fs.sync(self._fd)
                except BaseException as error:
                    self._failed[number] = error
                    self._wake_all()
                    raise
                self._durable[number] = self._size
                self.rotation_syncs += 1
                self._wake_all()
            self._fs.close(self._fd)
            self._fd = None
            self._file_number += 1
        spare, self._spare = self._spare, None
        if spare is not None and spare[0] == self._file_number:
            fd = spare[1]  # created and its name synced by the syncer
        else:
            if spare is not None:
                self._fs.close(spare[1])
            fd = self._fs.open_write(self._path(self._file_number))
            try:
                self._fs.sync_directory(self._directory)
            except BaseException:
                self._fs.close(fd)
                raise
        self._fd = fd
        self._size = self._fs.file_size(fd)
        self._filled = self._size
        self._prewrite_ok = True
        self._durable[self._file_number] = self._size

    def _prepare_spare(self) -> None:
        """After a sync (the syncer's or a leader's): create the next file before it is
        needed (errors are left to ``_rotate``, which then creates it itself); one
        thread at a time (``_preparing``)."""
        with self._lock:
            wanted = (
                self._spare is None
                and not self._preparing
                and self._fd is not None
                and self._size >= self._file_bytes_max * SPARE_AT_FRACTION
            )
            number = self._file_number + 1
            self._preparing = self._preparing or wanted
        if not wanted:
            return
        try:
            self._make_spare(number)
        finally:
            with self._lock:
                self._preparing = False

    def _make_spare(self, number: int) -> None:
        try:
            fd = self._fs.open_write(self._path(number))
        except StorageIOError:
            return
        try:
            self._fs.sync_directory(self._directory)
        except BaseException:
            self._fs.close(fd)
            return
        with self._lock:
            self.spare_directory_syncs += 1
            if self._spare is None and self._file_number + 1 == number and not self._closed:
                self._spare = (number, fd)
                return
        self._fs.close(fd)

    # -- the syncer thread ----------------------------------------------------------------
    def _start_syncer(self) -> None:
        if self._syncer is None:
            self._syncer = threading.Thread(
                target=self._sync_loop, name="topicbase-staging-sync", daemon=True
            )
            self._syncer.start()

    def _sync_wanted(self) -> bool:
        number = self._file_number
        return (
            self._fd is not None
            and number not in self._failed
            and self._durable.get(number, 0) < self._size
        )

    def _sync_loop(self) -> None:
        """Sync the current file whenever it holds unsynced bytes, until ``close``."""
        while True:
            with self._lock:
                # One sync of the file at a time: never beside a leader's (``_syncing``).
                while not self._closed and (self._syncing or not self._sync_wanted()):
                    self._wanted.wait()
                if self._closed:
                    return
                fd, number, target = self._fd, self._file_number, self._size
                self._syncing = True
            assert fd is not None
            self._sync_round(fd, number, target)

    def _sync_round(self, fd: int, number: int, target: int) -> None:
        """Sync file ``number`` up to ``target`` bytes (the caller set ``_syncing``, so
        nobody else uses or closes ``fd``), record the outcome for every waiter on the
        file and wake them; then prepare the next file if it is due."""
        error: BaseException | None = None
        try:
            self._fs.sync(fd)
        except BaseException as raised:  # every waiter on the file must learn of it
            error = raised
        with self._changed:
            self._syncing = False
            self.sync_rounds += 1
            if error is None:
                if number not in self._failed:  # a failed file never becomes durable
                    self._durable[number] = max(self._durable.get(number, 0), target)
                self._changed.notify_all()  # ``_make_room`` and ``close`` wait for ``_syncing``
                self._wake_covered(number)
            else:
                self._failed[number] = error
                self._wake_all()
            # Bytes appended without a record while this sync ran wait for the syncer,
            # which waited for this sync to end (no waiter of theirs leads).
            plain_number, plain_end = self._plain_end
            if plain_number == self._file_number and self._durable.get(plain_number, 0) < plain_end:
                self._wanted.notify()
        self._prepare_spare()

    @property
    def syncs(self) -> int:
        """Data syncs of staging files so far (the syncer's and rotations')."""
        return self.sync_rounds + self.rotation_syncs

    def start_after(self, number: int) -> None:
        """Recovery, before any write: new files get numbers above ``number`` (a commit
        log watermark names a file that may be gone; numbers never repeat below it)."""
        with self._lock:
            assert self._fd is None, "only before the first write"
            self._file_number = max(self._file_number, number + 1)

    # -- reading back (recovery) ----------------------------------------------------------
    def read_file(self, number: int) -> bytes:
        """The whole of staging file ``number`` (recovery scans it for commit records)."""
        path = self._path(number)
        fd = self._fs.open_read(path)
        try:
            return self._fs.pread(fd, self._fs.file_size(fd), 0)
        finally:
            self._fs.close(fd)

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
        every file no transaction needs any more, except the one being written and
        the spare (files past it). Returns the number of files deleted."""
        deleted = 0
        with self._lock:
            for number in self.file_numbers():
                users = self._users.get(number, set()) - transaction_ids
                self._users[number] = users
                # Files past the current one are spares, maybe still being created.
                if not users and number < self._file_number:
                    self._fs.remove(self._path(number))
                    self._users.pop(number, None)
                    self._durable.pop(number, None)
                    self._failed.pop(number, None)
                    deleted += 1
        return deleted

    def close(self) -> None:
        """Stop the syncer and close the file; waiters still waiting get an error."""
        with self._changed:
            self._closed = True
            self._wake_all()
            self._wanted.notify_all()
        if self._syncer is not None:
            self._syncer.join()
        with self._changed:
            while self._syncing:  # a leader's sync (``wait_durable``) still uses ``_fd``
                self._changed.wait()
            if self._fd is not None:
                self._fs.close(self._fd)
                self._fd = None
            if self._spare is not None:
                self._fs.close(self._spare[1])  # an empty file: the next release deletes it
                self._spare = None
