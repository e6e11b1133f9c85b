"""A log segment: one ``.log`` file of frames plus its offset and time indexes.

On disk: ``<base>.log`` holds frames back to back from position 0 (see
``record_batch`` for the frame layout); ``<base>.index`` and
``<base>.timeindex`` are sparse indexes over it. The segment's messages are
``[base_offset, next_offset)``.

Every ``limits.WRITEBACK_INTERVAL_BYTES`` of log the writer asks the kernel to
start writing the new bytes to disk (``FileSystem.start_writeback``, a hint that
promises nothing), so the sync that seals a full segment, even under fsync
policy ``never``, finds little left to write instead of tens of megabytes.

Thread-safety: one writer (the partition's) appends; readers use ``scan`` and
never see bytes past the limit the partition published, so they never block or
observe a half-written frame. While the writer's descriptor is open (the active
segment), scans ``pread`` through it instead of opening the file for each read
(an ``open`` and a ``close`` cost about as much as a small ``pread``, paid by every
partition of a read over 1000): a count of the scans using it defers its close to
the last of them, so a descriptor is never closed under a scan, nor its number
reused by another file while one reads through it.

Partition reads read published bytes through a read-only map of the log instead
(``scan(mapped=True)``, ``storage.file_map``): no copy, the frames' bodies views of the
map, which lives as long as any of them; ``pread`` remains for the other scans and
wherever no map can be made. A file cut or changed under a map, or a disk error on an
uncached page, kills the process with ``SIGBUS`` (``storage.file_map``); under
``pread`` it fails the one read (a file shorter than published: ``CorruptSegmentError``).
A frame read through the map is checked once per process (``storage.verified_frames``:
on its write from memory or its first read); a ``pread`` read checks every frame.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import weakref
from collections.abc import Iterator
from typing import NamedTuple

import crc32c
import pyarrow as pa

from storage import failpoints, file_map, file_names, limits, verified_frames
from storage.column_codec import unpacked_bytes
from storage.errors import CorruptSegmentError, StorageIOError
from storage.fs import FileSystem
from storage.offset_index import OffsetIndex
from storage.record_batch import HEADER, HEADER_BYTES, MAGIC, FrameHeader, body_header_bytes
from storage.time_index import TimeIndex
from storage.verified_frames import VerifiedRuns, covered

READ_WINDOW_BYTES_MIN = 1024 * 1024

# Segments holding a cached map (``LogSegment._map``), each with the tick of its last
# read through it (``_map_used``): when live maps near ``limits.READ_MAPS_MAX`` the least
# recently read of those without a writer let their maps go (``_release_idle_maps``),
# so a catch-up over many sealed segments keeps mapping. Batches read through a map
# released so keep it alive (``storage.file_map``); only the segment's reference goes.
_map_ticks = itertools.count()
_cached_lock = threading.Lock()
_cached: weakref.WeakSet[LogSegment] = weakref.WeakSet()  # a dropped segment leaves it


def _release_at() -> int:
    """Live maps from which idle segments' cached maps are released."""
    return limits.READ_MAPS_MAX - limits.READ_MAPS_MAX // 8


def _release_idle_maps(keep: LogSegment) -> None:
    """Drop the cached maps of the least recently read half of the segments without a
    writer (never ``keep``). A segment busy under its lock is passed over (no lock is
    waited for while another is held: no lock order to keep)."""
    with _cached_lock:
        try:
            idle = [s for s in _cached if s is not keep and s._shared is None]
        except RuntimeError:  # a segment collected meanwhile (the WeakSet's callback takes
            return  # no lock): skip this pass, the next slow-path map tries again
    idle.sort(key=lambda s: s._map_used)
    for segment in idle[: max(1, len(idle) // 2)]:
        if segment._fd_lock.acquire(blocking=False):
            try:
                segment._drop_map()
            finally:
                segment._fd_lock.release()


class _SharedDescriptor:
    """The writer's descriptor as scans share it: closed once released by the writer
    and left by every scan (``readers``), under the segment's ``_fd_lock``."""

    __slots__ = ("fd", "readers", "released")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.readers = 0
        self.released = False


class Frame(NamedTuple):
    """A verified frame read from a segment; ``body`` is a zero-copy Arrow buffer. (A
    named tuple: one is built per frame read, cheaper than a frozen dataclass.)"""

    position: int
    header: FrameHeader
    body: pa.Buffer
    # The body is a view of the segment's map (``LogSegment.scan(mapped=True)``), not of
    # a read window: keeping it keeps the page cache's pages mapped, no heap memory.
    mapped: bool = False


class LogSegment:
    def __init__(self, fs: FileSystem, directory: str, base_offset: int) -> None:
        self.fs = fs
        self.directory = directory
        self.base_offset = base_offset
        self.log_path = os.path.join(directory, file_names.log_file(base_offset))
        self.offset_index = OffsetIndex(
            fs, os.path.join(directory, file_names.offset_index_file(base_offset)), base_offset
        )
        self.time_index = TimeIndex(
            fs, os.path.join(directory, file_names.time_index_file(base_offset)), base_offset
        )
        self.size_bytes = 0
        self.next_offset = base_offset
        self.first_written_at_us: int | None = None
        self.last_written_at_us: int | None = None
        self._bytes_since_index = 0
        self._write_fd: int | None = None
        self._shared: _SharedDescriptor | None = None  # ``_write_fd`` as scans share it
        self._fd_lock = threading.Lock()
        # Syncs of the log, one at a time (a checkpoint's runs outside the partition's
        # write lock: ``sync_published``), and the error of a failed one, which every
        # later sync raises (``_sync_log``).
        self._sync_lock = threading.Lock()
        self._sync_failed: StorageIOError | None = None
        self._marked_deleted = False  # the log file is renamed to *.deleted
        # Log bytes below this position are synced or already handed to writeback.
        self._writeback_position = 0
        # Log bytes below this position were dropped from the page cache once synced
        # (``storage.page_cache``); only grows, but for a cut (``truncate_to``).
        self.dropped_to = 0
        # Log bytes below this position were dropped once handed to writeback, not yet
        # synced (``page_cache.drop_behind``); ``dropped_to`` is left to the synced drops.
        self.behind_to = 0
        # The read-only map of the log (``mapped``) and its view; None until a scan
        # asks for it, and again once closed or released (``_release_idle_maps``).
        # ``_map_refused``: no map could be made, as ``file_map.room()`` stood then (a
        # map is tried again once that changed); ``_map_used``: the last read's tick.
        self._map: tuple[pa.Buffer, memoryview] | None = None
        self._map_refused: tuple[int, int] | None = None
        self._map_used = 0
        # Frames whose checksum this process verified or wrote from memory: reads
        # through the map skip their check (``storage.verified_frames``).
        self.verified = VerifiedRuns()
        # Reads' budgets charge a frame whose data column is compressed whole what it
        # decodes to (``unpacked_at``): every frame below ``_probed_below`` was probed
        # (published bytes, never changed again but by ``truncate_to``), and those of them
        # that are compressed are in ``_unpacked`` (position -> bytes): a frame read again
        # is not probed again.
        self._probed_below = 0
        self._unpacked: dict[int, int] = {}

    # -- writing (single writer) --------------------------------------------------------
    def append_frame(self, frame: bytes, header: FrameHeader) -> None:
        """Write one encoded frame at the end; indexes follow the byte interval."""
        assert header.base_offset == self.next_offset, (header.base_offset, self.next_offset)
        assert self.size_bytes % 8 == 0
        if failpoints.ACTIVE:
            self._torn_write_failpoint(frame)
        fd = self._fd()
        self.fs.pwrite(fd, frame, self.size_bytes)
        self._note_frame(self.size_bytes, header)
        if self.size_bytes - self._writeback_position >= limits.WRITEBACK_INTERVAL_BYTES:
            self._start_writeback(fd)

    def append_frame_parts(self, parts: list, header: FrameHeader) -> None:
        """``append_frame`` with the frame given as buffers to write back to back.

        ``parts`` (``FrameEncoder.encode``: the header bytes, then the body's
        buffers) go out in one ``pwritev``, never joined into one copy; their
        total size is ``header.frame_bytes``.
        """
        assert header.base_offset == self.next_offset, (header.base_offset, self.next_offset)
        assert self.size_bytes % 8 == 0
        if failpoints.ACTIVE:
            self._torn_write_failpoint(b"".join(memoryview(part).cast("B") for part in parts))
        fd = self._fd()
        position = self.size_bytes
        self.fs.pwritev(fd, parts, position)
        self._note_frame(position, header)
        # The header's checksum was computed over these very buffers (``FrameEncoder``):
        # the frame is verified as written (``storage.verified_frames``).
        self.verified.add(position, position + header.frame_bytes)
        if self.size_bytes - self._writeback_position >= limits.WRITEBACK_INTERVAL_BYTES:
            self._start_writeback(fd)

    def append_body(
        self, body: pa.Buffer, count: int, written_at_us: int, transaction_id: int
    ) -> int:
        """``append_frame_parts`` of the frame of an encoded ``body`` of ``count`` messages
        (``record_batch.framed_body``'s bytes: its header, then the body) at the end, in
        one step; returns the frame's base offset. The path of a spread publish's shares
        (1000 frames a statement over 1000 partitions): no ``FrameHeader`` and no parts
        list are built, and the indexes are noted in place (``_note``)."""
        assert self.size_bytes % 8 == 0
        position = self.size_bytes
        base_offset = self.next_offset
        header = body_header_bytes(body, count, base_offset, written_at_us, transaction_id)
        if failpoints.ACTIVE and failpoints.armed("segment.torn_write"):
            self._torn_write_failpoint(header + body.to_pybytes())
        fd = self._write_fd
        if fd is None:
            fd = self._fd()
        self.fs.pwritev(fd, [header, body], position)
        frame_bytes = HEADER_BYTES + body.size
        self._note(position, base_offset, base_offset + count, written_at_us, frame_bytes)
        # The checksum was computed over these very bytes: verified as written.
        self.verified.add(position, position + frame_bytes)
        if self.size_bytes - self._writeback_position >= limits.WRITEBACK_INTERVAL_BYTES:
            self._start_writeback(fd)
        return base_offset

    def append_frame_copy(self, header_bytes: bytes, header: FrameHeader, source_fd: int,
                          body_position: int) -> None:  # fmt: skip
        """``append_frame`` of a frame whose body is already encoded in another file (a
        staged frame, ``storage.staged_frames``): the header written, then the body's
        ``header.body_bytes`` copied in the kernel from ``source_fd`` at ``body_position``
        (``FileSystem.copy_range``). A crash between the two leaves a torn frame at the
        end, which the loader cuts like any other."""
        assert header.base_offset == self.next_offset, (header.base_offset, self.next_offset)
        assert self.size_bytes % 8 == 0 and len(header_bytes) == HEADER_BYTES
        fd = self._fd()
        if failpoints.ACTIVE and failpoints.armed("segment.torn_write"):
            self.fs.pwrite(fd, header_bytes, self.size_bytes)
            self.fs.copy_range(source_fd, body_position, fd, self.size_bytes + HEADER_BYTES,
                               header.body_bytes // 2)  # fmt: skip
            failpoints.hit("segment.torn_write")
        self.fs.pwrite(fd, header_bytes, self.size_bytes)
        self.fs.copy_range(source_fd, body_position, fd, self.size_bytes + HEADER_BYTES,
                           header.body_bytes)  # fmt: skip
        self._note_frame(self.size_bytes, header)
        if self.size_bytes - self._writeback_position >= limits.WRITEBACK_INTERVAL_BYTES:
            self._start_writeback(fd)

    def _start_writeback(self, fd: int) -> None:
        """Hand the bytes written since the last hint to the kernel's writeback (no wait)."""
        position = self._writeback_position
        self._writeback_position = self.size_bytes
        self.fs.start_writeback(fd, position, self.size_bytes - position)

    def append_frames(self, frames: list[tuple[bytes, FrameHeader]]) -> None:
        """Write several frames in one call (group commit)."""
        if len(frames) == 1:
            self.append_frame(*frames[0])
            return
        position = self.size_bytes
        self.fs.pwrite(self._fd(), b"".join(frame for frame, _ in frames), position)
        for frame, header in frames:
            assert header.base_offset == self.next_offset
            self._note_frame(position, header)
            position += len(frame)

    def _torn_write_failpoint(self, frame: bytes) -> None:
        """``segment.torn_write``: write half of the frame, then crash or fail there."""
        if failpoints.armed("segment.torn_write"):
            self.fs.pwrite(self._fd(), frame[: len(frame) // 2], self.size_bytes)
            failpoints.hit("segment.torn_write")

    def _note_frame(self, position: int, header: FrameHeader) -> None:
        self._note(position, header.base_offset, header.next_offset, header.written_at_us,
                   header.frame_bytes)  # fmt: skip

    def _note(self, position: int, base_offset: int, next_offset: int, written_at_us: int,
              frame_bytes: int) -> None:  # fmt: skip
        """A frame written at ``position``: the indexes (an entry every
        ``INDEX_INTERVAL_BYTES``), the size, the next offset and the write times."""
        if self._bytes_since_index == 0 or self._bytes_since_index >= limits.INDEX_INTERVAL_BYTES:
            self.offset_index.add(base_offset, position)
            last_time = self.time_index.last()
            if last_time is None or written_at_us > last_time[0]:
                self.time_index.add(written_at_us, base_offset)
            self._bytes_since_index = 0
        self._bytes_since_index += frame_bytes
        self.size_bytes = position + frame_bytes
        self.next_offset = next_offset
        if self.first_written_at_us is None:
            self.first_written_at_us = written_at_us
        self.last_written_at_us = written_at_us

    def create_file(self) -> None:
        """Create the log file now, empty, so the segment exists on disk before its first frame."""
        self._fd()

    def sync(self) -> bool:
        """Make the log durable (one counted fdatasync); indexes are flushed, not synced.
        Returns whether it synced: a log this process has not opened for writing (nothing
        written since the open) is not synced (``PartitionLog.make_durable`` does)."""
        self.offset_index.flush()
        self.time_index.flush()
        if self._write_fd is None:
            return False
        self._sync_log(self._write_fd)
        self._writeback_position = self.size_bytes
        return True

    @property
    def writing(self) -> bool:
        """Whether this process opened the log for writing (wrote it, or created it)."""
        return self._write_fd is not None

    def sync_file(self) -> None:
        """``fdatasync`` the log through a descriptor opened for it and closed at once: a
        log this process has not opened for writing (after an open, what a killed process
        wrote may be in the page cache only). The file exists (the caller holds the
        partition's write lock, so the active segment cannot go); counted, and one sync
        at a time with the others (``_sync_log``)."""
        fd = self.fs.open_write(self.log_path)
        try:
            self._sync_log(fd)
        finally:
            self.fs.close(fd)

    def flush_for_sync(self) -> _SharedDescriptor | None:
        """``sync``'s part under the partition's write lock, for a sync of the log made
        outside it (``sync_published``): the indexes flushed (not synced, as ``sync``),
        and the writer's descriptor held for that sync (as a scan holds it: a close
        meanwhile, at a roll, leaves it open to the holder); None when the log is not
        open for writing (nothing written since the segment was opened or sealed, and a
        sealed log was synced at its seal)."""
        self.offset_index.flush()
        self.time_index.flush()
        with self._fd_lock:
            shared = self._shared
            if shared is None:
                return None
            shared.readers += 1
        self._writeback_position = self.size_bytes
        return shared

    def sync_published(self, held: _SharedDescriptor) -> None:
        """Sync the log through the descriptor ``flush_for_sync`` held, without the
        partition's write lock, then let it go: everything written before that call is
        durable when this returns. Appends may go on meanwhile (a checkpoint syncing 1000
        partitions no longer makes a publish, which takes every partition's lock, wait
        for each sync in turn). A failure is raised here and by every later sync of
        this log (``_sync_log``)."""
        try:
            self._sync_log(held.fd)
        finally:
            self._scan_done(held.fd, held)

    def synced_together(self, held: _SharedDescriptor) -> None:
        """``sync_published``'s end when one sync of the whole file system covered the
        log after ``flush_for_sync`` (``FileSystem.sync_file_system``): no ``fdatasync``
        of its own, the descriptor let go. Raises as ``_sync_log`` when an earlier sync
        of this log failed: no sync here succeeds after a failure."""
        try:
            with self._sync_lock:
                self._refuse_after_failure_locked()
        finally:
            self._scan_done(held.fd, held)

    def _refuse_after_failure_locked(self) -> None:
        """Raise once a sync of this log failed (caller holds ``_sync_lock``)."""
        failed = self._sync_failed
        if failed is not None:
            raise StorageIOError(
                f"an earlier sync of this log failed ({failed}); reopen to recover",
                path=self.log_path,
            )

    def _sync_log(self, fd: int) -> None:
        """``fdatasync`` the log, one sync at a time. Once a sync failed, every later
        one raises that error without syncing: the kernel reports a failed writeback to
        one ``fdatasync`` of the file only, so a sync made after another one saw the
        failure (a writer's group commit after a checkpoint's) could succeed although
        bytes written before it were lost. The partition fences on the error (reopen
        recovers); until it does, no sync here succeeds."""
        with self._sync_lock:
            self._refuse_after_failure_locked()
            try:
                self.fs.sync(fd)
            except StorageIOError as error:
                self._sync_failed = error
                raise

    def _sync_cut(self, fd: int) -> None:
        """``fdatasync`` a cut of the log (``truncate_to``), one sync at a time with the
        others (``_sync_log``). Unlike ``_sync_log`` it syncs after a failure too: it
        acknowledges no write, it only makes the cut durable (a reopen after a power
        cut must not find the failed tail). Its own failure is kept for every later
        sync, as ``_sync_log`` keeps one."""
        with self._sync_lock:
            try:
                self.fs.sync(fd)
            except StorageIOError as error:
                if self._sync_failed is None:
                    self._sync_failed = error
                raise

    @property
    def written_back_bytes(self) -> int:
        """Log bytes below this position were synced or handed to the kernel's writeback
        (``_start_writeback``); only grows, but for a cut."""
        return self._writeback_position

    def drop_cache(self, upto: int, *, behind: bool = False, again: int = 0) -> None:
        """Hint the kernel to drop the log's bytes ``[dropped_to, upto)`` from the page
        cache; the caller knows them synced (``storage.page_cache``), or with ``behind``
        handed to writeback long enough ago (``page_cache.drop_behind``: from
        ``behind_to`` too, which it raises instead of ``dropped_to``; ``again`` bytes
        below ``behind_to`` are advised again: pages under writeback at the last advice
        were skipped). The cached read
        map's pages below ``upto`` are released first (``file_map.release_pages``; a map
        a batch still holds after the segment made a larger one keeps its pages), then
        the advice goes through a descriptor opened for it and closed at once. Neither
        runs under ``_fd_lock``, which appends and reads take: a drop of a few MiB took
        1-3 ms, and every publish to the partition waited behind it. A log that is gone
        (retention) or cannot be opened is skipped: it is a hint."""
        upto = min(upto, self.size_bytes)  # a fence's cut may have come since
        start = max(self.dropped_to, self.behind_to) if behind else self.dropped_to
        if upto <= start:
            return
        start = max(self.dropped_to, start - again)  # ``again``: with ``behind`` only
        if upto <= start:
            return
        # What leaves the cache is read from the disk next time: checked again then.
        self.verified.forget_below(upto)
        with self._fd_lock:
            mapped = None if self._map is None else self._map[0]  # keeps the map alive
        if mapped is not None:  # pages a process maps are not dropped: unmap them
            file_map.release_pages(mapped, upto)
        if self._marked_deleted:
            return
        try:  # retention may rename the log meanwhile: FileNotFoundError (review R2-F3)
            fd = self.fs.open_read(self.log_path)
        except (StorageIOError, OSError):
            return
        try:
            self.fs.drop_cache(fd, start, upto - start)
        finally:
            with contextlib.suppress(StorageIOError, OSError):
                self.fs.close(fd)
        # Again after the advice: a read that took the generation after the first forget
        # checked and marked pages the advice then handed back (review R2-16-5).
        self.verified.forget_below(upto)
        with self._fd_lock:  # two syncs may drop at once: it only grows (review R2-F7)
            if behind:
                self.behind_to = max(self.behind_to, upto)
            else:
                self.dropped_to = max(self.dropped_to, upto)

    def seal(self, *, durable: bool) -> None:
        """Called at roll: the log is always synced, the indexes when ``durable``.

        Recovery trusts a sealed segment's frames (only the last segment's tail
        is checked), so even under fsync policy ``never`` a segment is synced
        once when it is sealed: a power cut must not leave a short segment
        before a newer one. Indexes are rebuilt when they do not fit.
        """
        if self._write_fd is not None:
            self._sync_log(self._write_fd)
        self.offset_index.flush(sync=durable)
        self.time_index.flush(sync=durable)
        self.close()

    def truncate_to(self, position: int, next_offset: int) -> None:
        """Cut the log at ``position`` (a frame boundary) and drop index entries past it.

        The cut is synced (``_sync_cut``) even after a failed sync of the log, and a
        failure of that sync is kept as any sync's (``_sync_failed``): a fence cuts the
        log while a checkpoint may be syncing it outside the write lock, and the kernel
        reports a failed writeback to one ``fdatasync`` only, so a cut's sync that saw it
        must make the checkpoint's fail too."""
        fd = self._fd()
        self.verified.cut(position)
        if self._probed_below > position:
            self._probed_below = position
            self._unpacked = {at: n for at, n in self._unpacked.items() if at < position}
        self.dropped_to = min(self.dropped_to, position)
        self.behind_to = min(self.behind_to, position)
        self.fs.truncate(fd, position)
        self._sync_cut(fd)
        self.size_bytes = position
        self.next_offset = next_offset
        self._writeback_position = min(self._writeback_position, position)

    def close(self) -> None:
        with self._fd_lock:
            self._drop_map()
        self.offset_index.close()
        self.time_index.close()
        if self._write_fd is not None:
            fd, self._write_fd = self._write_fd, None
            with self._fd_lock:
                shared, self._shared = self._shared, None
                busy = shared is not None and shared.readers > 0
                if shared is not None:
                    shared.released = True
            if not busy:
                self.fs.close(fd)  # else the last scan reading through it closes it

    def mark_deleted(self) -> None:
        """Rename the log file to ``*.deleted``: once the directory is synced, recovery
        no longer loads this segment (it removes such files and orphan indexes).

        Readers that opened the file before keep reading it; ``delete_files`` ends it.
        """
        self.close()
        self.fs.rename(self.log_path, self.log_path + file_names.DELETED_SUFFIX)
        self._marked_deleted = True

    def delete_files(self) -> None:
        self.close()
        log_path = self.log_path + (file_names.DELETED_SUFFIX if self._marked_deleted else "")
        for path in (log_path, self.offset_index.path, self.time_index.path):
            self.fs.remove(path)

    def _fd(self) -> int:
        if self._write_fd is None:
            fd = self.fs.open_write(self.log_path)
            with self._fd_lock:
                self._shared = _SharedDescriptor(fd)
            self._write_fd = fd
        return self._write_fd

    def _scan_fd(self) -> tuple[int, _SharedDescriptor | None]:
        """A descriptor to read with: the writer's while it is open (counted), else one
        of the scan's own (FileNotFoundError once the file is gone)."""
        with self._fd_lock:
            shared = self._shared
            if shared is not None:
                shared.readers += 1
                return shared.fd, shared
        return self.fs.open_read(self.log_path), None

    def _scan_done(self, fd: int, shared: _SharedDescriptor | None) -> None:
        if shared is None:
            self.fs.close(fd)
            return
        with self._fd_lock:
            shared.readers -= 1
            last = shared.released and shared.readers == 0
        if last:
            self.fs.close(shared.fd)  # the writer closed it while this scan read

    # -- reading (any thread) -----------------------------------------------------------
    def read_into(self, target: memoryview, position: int) -> int:
        """Read ``len(target)`` bytes at ``position`` into ``target`` (fewer at the end of
        the file): the bytes read. Unchecked: the caller checks the frames (a read of
        many partitions into one buffer, ``storage.bulk_scan``)."""
        fd, shared = self._scan_fd()
        try:
            return self.fs.pread_into(fd, target, position)
        finally:
            self._scan_done(fd, shared)

    def mapped(self, limit_bytes: int, map_bytes: int) -> tuple[pa.Buffer, memoryview] | None:
        """The segment's log mapped (``FileSystem.map_read``) over at least its first
        ``limit_bytes``, made on first use and made again larger when the log grew past
        it (``map_bytes`` or more, past the end of the file: bytes the map may hold but
        no scan reads until they are published); None when no map can be made (then
        scans ``pread``). Only for bytes ``[0, limit_bytes)`` that never change again
        (published: ``scan(mapped=True)``).

        The map is made through the writer's descriptor while it is open (a tail read
        needs no new descriptor), else through one opened for it and closed at once; an
        ``open`` failing with anything but ``FileNotFoundError`` (retention) makes this
        read ``pread`` instead. A refused map is tried again once ``file_map.room()``
        changed."""
        found = self._map
        if found is not None and found[0].size >= limit_bytes:
            self._map_used = next(_map_ticks)
            return found
        if self._map_refused is not None and self._map_refused == file_map.room():
            return None
        if file_map.live_maps() >= _release_at():
            _release_idle_maps(self)
        with self._fd_lock:
            found = self._map
            if found is not None and found[0].size >= limit_bytes:
                return found
            size = max(limit_bytes, map_bytes, 2 * found[0].size if found else 0)
            room = file_map.room()
            if self._shared is not None:
                # The writer's descriptor: ``close`` releases it under this lock only.
                buffer = self.fs.map_read(self._shared.fd, size)
            else:
                try:
                    fd = self.fs.open_read(self.log_path)  # FileNotFoundError: retention
                except StorageIOError:
                    return None  # no descriptor left (EMFILE) or the like: this read preads
                try:
                    buffer = self.fs.map_read(fd, size)
                finally:
                    self.fs.close(fd)
            if buffer is None:
                self._map_refused = room
                return None
            self._map_refused = None
            self._map_used = next(_map_ticks)
            # Batches read through the old map keep it alive (``storage.file_map``).
            found = self._map = (buffer, memoryview(buffer))
            with _cached_lock:
                _cached.add(self)
            return found

    def _drop_map(self) -> None:
        """Let the cached map go (under ``_fd_lock``); batches read through it keep it."""
        self._map = None
        with _cached_lock:
            _cached.discard(self)

    def scan(
        self,
        start_offset: int,
        limit_bytes: int,
        budget_bytes: int,
        *,
        skip_corrupt: bool = False,
        position: int | None = None,
        mapped: bool = False,
        map_bytes: int = 0,
    ) -> Iterator[Frame]:
        """Yield verified frames holding offsets >= ``start_offset``, up to byte ``limit_bytes``.

        Reads in windows of at least ``budget_bytes`` (one ``pread`` per window)
        and hands out zero-copy slices of them. A frame that fails its checks
        raises ``CorruptSegmentError`` with the file and position, unless
        ``skip_corrupt`` (recovery's producer replay) asks to pass over it.
        ``position``, when given, is a frame boundary at or before the first frame
        wanted (a caller that knows where the frame after one it holds starts);
        else the offset index says where to start.

        A window that ends inside a frame is followed by one that starts at that
        frame and holds it whole, plus what is left of ``budget_bytes``, not a whole
        window more (an 8 MiB window ending inside a 1 MiB frame was followed by 8 MiB more).

        ``mapped`` (the caller's promise that bytes ``[0, limit_bytes)`` never change
        again: they are published, and a fence cuts only unpublished bytes) reads
        through the segment's map instead: no window, no copy, the bodies views of the
        map (``Frame.mapped``), the same checks. ``map_bytes``: how much a new map may
        cover past ``limit_bytes`` (the active segment's size to come), so that a
        growing segment is not mapped again at every read.
        """
        if position is None:
            position = (
                self.offset_index.lookup(start_offset) if start_offset > self.base_offset else 0
            )
        if mapped and limit_bytes > 0:
            found = self.mapped(limit_bytes, map_bytes)
            if found is not None:
                return self._scan_map(found, start_offset, limit_bytes, position, skip_corrupt)
        return self._scan_read(start_offset, limit_bytes, budget_bytes, skip_corrupt, position)

    def unpacked_at(self, position: int, frame_bytes: int, body: pa.Buffer) -> int:
        """``column_codec.unpacked_bytes`` of the published frame at ``position`` (its
        ``body``), its zstd messages counted: probed once, then remembered while reads go
        on from there (a frame read again costs a comparison, ~0.7 us less; a frame of
        zstd messages, 15-80 us less). At most ``limits.UNPACKED_REMEMBERED_MAX``
        compressed frames are remembered a segment: the frames from the first one past
        it on are probed at every read (the same sizes, only not kept)."""
        end = position + frame_bytes
        if end <= self._probed_below:
            return self._unpacked.get(position, 0) if self._unpacked else 0
        unpacked = unpacked_bytes(body, messages=True)
        if position == self._probed_below:
            if unpacked:
                if len(self._unpacked) >= limits.UNPACKED_REMEMBERED_MAX:
                    return unpacked  # not remembered: the mark stays, later reads probe
                self._unpacked[position] = unpacked  # before the mark that makes it found
            self._probed_below = end
        return unpacked

    def _scan_map(
        self,
        found: tuple[pa.Buffer, memoryview],
        start_offset: int,
        limit_bytes: int,
        position: int,
        skip_corrupt: bool,
    ) -> Iterator[Frame]:
        """``scan`` through the map: frames checked in place, bodies zero-copy views."""
        buffer, view = found
        header_at, crc = self._header_at, crc32c.crc32c
        # Frames verified before by this process are not checked again (``once``). The
        # generation is taken before any byte is checked: a drop of the page cache or a cut
        # after it voids this scan's marks (``VerifiedRuns.add``).
        generation = self.verified.generation
        runs = self.verified.snapshot() if verified_frames.ONCE else ()
        while position < limit_bytes:
            if position + HEADER_BYTES > limit_bytes:
                raise CorruptSegmentError(
                    "segment ends inside a frame header", path=self.log_path, position=position
                )
            header = header_at(view, position, position)
            end = position + HEADER_BYTES + header.body_bytes
            if end > limit_bytes:
                raise CorruptSegmentError(
                    "frame runs past the end of the segment", path=self.log_path, position=position
                )
            if header.base_offset + header.record_count > start_offset:
                # The checksum covers header bytes [8, 48) and the body (``frame_checksum_ok``).
                if covered(runs, position, end):
                    body = buffer.slice(position + HEADER_BYTES, header.body_bytes)
                    yield Frame(position, header, body, True)
                elif crc(view[position + 8 : end]) != header.crc:
                    if not skip_corrupt:
                        raise CorruptSegmentError(
                            "checksum mismatch in a log frame",
                            path=self.log_path,
                            position=position,
                        )
                else:
                    self.verified.add(position, end, generation)
                    body = buffer.slice(position + HEADER_BYTES, header.body_bytes)
                    yield Frame(position, header, body, True)
            position = end

    def _scan_read(
        self,
        start_offset: int,
        limit_bytes: int,
        budget_bytes: int,
        skip_corrupt: bool,
        position: int,
    ) -> Iterator[Frame]:
        """``scan`` through ``pread`` windows."""
        window_bytes = max(budget_bytes + HEADER_BYTES, READ_WINDOW_BYTES_MIN)
        fd, shared = self._scan_fd()
        try:
            if limit_bytes - position > window_bytes:
                # Peek at the first frame's size so the first window holds it whole: a
                # frame a little over the window (1000 messages of 1 KiB) was read twice.
                # (No peek when the window holds the rest of the segment anyway: a
                # partition of a few small frames is read with one pread.)
                head = self.fs.pread(fd, HEADER_BYTES, position)
                if len(head) < HEADER_BYTES:
                    raise self._shorter_than_published(position)
                first = self._header_at(head, 0, position)
                window_bytes = max(window_bytes, first.frame_bytes)
            left = window_bytes  # of what the budget asks to read from the first position
            while position < limit_bytes:
                size = min(window_bytes, limit_bytes - position)
                raw = self.fs.pread(fd, size, position)
                if len(raw) < size:
                    # Published bytes are all in the file: a short read means something
                    # outside the server cut it (reading again would loop for ever).
                    raise self._shorter_than_published(position + len(raw))
                buffer = pa.py_buffer(raw)
                view = memoryview(raw)
                available = len(raw)
                consumed = 0
                while consumed + HEADER_BYTES <= available:
                    header = self._header_at(raw, consumed, position + consumed)
                    end = consumed + HEADER_BYTES + header.body_bytes
                    if end > available:
                        # Read from this frame on: it whole, and what the budget still
                        # wants (the short reads of a few small frames aside).
                        window_bytes = max(
                            header.frame_bytes, left - consumed, READ_WINDOW_BYTES_MIN
                        )
                        break
                    if header.base_offset + header.record_count > start_offset:
                        # The checksum covers header bytes [8, 48) and the body, which
                        # follow each other here: one pass (as ``frame_checksum_ok``).
                        if crc32c.crc32c(view[consumed + 8 : end]) != header.crc:
                            if skip_corrupt:
                                consumed = end
                                continue
                            raise CorruptSegmentError(
                                "checksum mismatch in a log frame",
                                path=self.log_path,
                                position=position + consumed,
                            )
                        body = buffer.slice(consumed + HEADER_BYTES, header.body_bytes)
                        yield Frame(position + consumed, header, body)
                    consumed = end
                if consumed == 0:
                    # One frame larger than the window: read exactly that frame. A
                    # length running past the limit is damage; re-reading would loop.
                    if len(raw) < HEADER_BYTES:
                        raise CorruptSegmentError(
                            "segment ends inside a frame header",
                            path=self.log_path,
                            position=position,
                        )
                    header = self._header_at(raw, 0, position)
                    if position + header.frame_bytes > limit_bytes:
                        raise CorruptSegmentError(
                            "frame runs past the end of the segment",
                            path=self.log_path,
                            position=position,
                        )
                    window_bytes = header.frame_bytes
                    continue
                position += consumed
                left -= consumed
        finally:
            self._scan_done(fd, shared)

    def _shorter_than_published(self, position: int) -> CorruptSegmentError:
        return CorruptSegmentError(
            "segment file is shorter than its published size", path=self.log_path, position=position
        )

    def _header_at(self, raw: bytes | memoryview, index: int, position: int) -> FrameHeader:
        """The header at ``raw[index:]`` (as ``decode_header``), checked."""
        magic, crc, base, written, count, body_bytes, attributes, _, transaction = (
            HEADER.unpack_from(raw, index)
        )
        if magic != MAGIC or body_bytes % 8 or count == 0:
            raise CorruptSegmentError("bad frame header", path=self.log_path, position=position)
        return FrameHeader(crc, base, written, count, body_bytes, attributes, transaction)
