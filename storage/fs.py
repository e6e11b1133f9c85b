"""The file layer: the only module of storage that opens, writes and syncs files.

Like SQLite's VFS, everything that touches the disk goes through a
``FileSystem`` object, so tests can swap in one that tears writes, fails
``fsync`` or drops un-synced data. Files are raw descriptors: ``pwrite`` at an
explicit position (no shared file offset) and ``pread`` (safe from many threads
at once).

Invariants:
- every data ``fsync`` goes through ``sync`` (or ``sync_file_system``, one sync of a
  whole file system) and is counted in ``fsync_count``;
  directory syncs are counted in ``directory_fsync_count``; ``start_writeback``
  is a hint, not a sync, and is not counted;
- an ``OSError`` leaves this module as ``StorageIOError`` naming the path,
  except ``FileNotFoundError`` from ``open_read``/``read_file``, which callers
  use to notice files deleted under them (retention).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import threading
from collections.abc import Callable

import pyarrow as pa

from storage import failpoints, file_map
from storage.errors import ObjectInUseError, StorageIOError
from storage.limits import IOV_MAX

_COPY_PIECE_BYTES = 4 * 1024 * 1024  # ``copy_range`` through this process: read in pieces


class FileSystem:
    """Plain POSIX files. Thread-safe: descriptors are used with pread/pwrite only."""

    def __init__(self) -> None:
        self._counter_lock = threading.Lock()
        self._fsync_count = 0
        self._directory_fsync_count = 0
        self._paths: dict[int, str] = {}

    # -- counters ---------------------------------------------------------------------
    @property
    def fsync_count(self) -> int:
        """Number of file-data syncs so far (fdatasync of log, index and staging files)."""
        return self._fsync_count

    @property
    def directory_fsync_count(self) -> int:
        return self._directory_fsync_count

    # -- descriptors --------------------------------------------------------------------
    def open_write(self, path: str) -> int:
        """Open (creating if needed) a file for writing; never truncates."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise _io_error("open", path, error) from error
        self._paths[fd] = path
        return fd

    def open_read(self, path: str) -> int:
        """Open a file read-only. Raises FileNotFoundError if it is gone."""
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise
        except OSError as error:
            raise _io_error("open", path, error) from error

    def close(self, fd: int) -> None:
        self._paths.pop(fd, None)
        try:
            os.close(fd)
        except OSError as error:
            raise _io_error("close", str(fd), error) from error

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> None:
        """Write all of ``data`` at ``position``; a short write is retried to the end."""
        view = memoryview(data)
        written = 0
        try:
            while written < len(view):
                written += os.pwrite(fd, view[written:], position + written)
        except OSError as error:
            raise _io_error("write", self._paths.get(fd, str(fd)), error) from error

    def pwritev(self, fd: int, parts: list, position: int) -> None:
        """Write the buffers ``parts`` back to back at ``position`` without joining them.

        The kernel takes at most ``IOV_MAX`` buffers per call (EINVAL past it: a
        transaction staging batches for 1000 partitions hands over more), so the parts go
        out in runs of at most that many; a crash between runs leaves a torn write, which
        every caller's checksums already treat as absent.
        """
        if len(parts) <= IOV_MAX:  # the usual case (a frame: its header and body)
            self._pwritev_run(fd, parts, position)
            return
        for start in range(0, len(parts), IOV_MAX):
            run = parts[start : start + IOV_MAX]
            position += self._pwritev_run(fd, run, position)

    def _pwritev_run(self, fd: int, parts: list, position: int) -> int:
        """One ``pwritev`` of at most ``IOV_MAX`` buffers, finished if short; the bytes written."""
        assert len(parts) <= IOV_MAX
        try:
            written = os.pwritev(fd, parts, position)
        except OSError as error:
            raise _io_error("write", self._paths.get(fd, str(fd)), error) from error
        total = 0
        for part in parts:
            total += memoryview(part).nbytes
        if written < total:  # a short write: finish the rest
            joined = b"".join(memoryview(part).cast("B") for part in parts)
            self.pwrite(fd, memoryview(joined)[written:], position + written)
        return total

    def copy_range(self, source_fd: int, source_position: int, fd: int, position: int,
                   size: int) -> None:  # fmt: skip
        """Copy ``size`` bytes of ``source_fd`` at ``source_position`` to ``fd`` at
        ``position``, in the kernel (``copy_file_range``: the bytes never reach this
        process); a short copy is retried to the end. Where the kernel cannot (another
        file system, no such call), or in a subclass that models writes (its ``pwrite``
        is its own: a test file system sees every byte written), the bytes are read and
        written in pieces (also once the kernel copies nothing: 0 before ``size``). A source
        shorter than ``size`` is an error (``StorageIOError``)."""
        done = 0
        native = type(self).pwrite is FileSystem.pwrite and hasattr(os, "copy_file_range")
        try:
            while done < size and native:
                try:
                    copied = os.copy_file_range(
                        source_fd, fd, size - done, source_position + done, position + done)
                except OSError as error:
                    if error.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL,
                                           errno.EOPNOTSUPP):  # fmt: skip
                        raise
                    native = False
                    break
                if copied == 0:
                    # Some file systems copy nothing where they cannot (rather than an
                    # error): the loop below copies the rest, and tells a real end of file.
                    native = False
                    break
                done += copied
            while done < size:
                piece = os.pread(source_fd, min(size - done, _COPY_PIECE_BYTES),
                                 source_position + done)  # fmt: skip
                if not piece:
                    raise OSError(errno.EIO, "the source ended before the copy")
                self.pwrite(fd, piece, position + done)
                done += len(piece)
        except OSError as error:
            raise _io_error("copy into", self._paths.get(fd, str(fd)), error) from error

    def pread(self, fd: int, size: int, position: int) -> bytes:
        """Read up to ``size`` bytes at ``position`` (fewer at end of file)."""
        try:
            return os.pread(fd, size, position)
        except OSError as error:
            raise _io_error("read", self._paths.get(fd, str(fd)), error) from error

    def pread_into(self, fd: int, target: memoryview, position: int) -> int:
        """Read up to ``len(target)`` bytes at ``position`` into ``target`` (no bytes
        object made); the bytes read (fewer at end of file)."""
        try:
            return os.preadv(fd, [target], position)
        except OSError as error:
            raise _io_error("read", self._paths.get(fd, str(fd)), error) from error

    def map_read(self, fd: int, size: int) -> pa.Buffer | None:
        """A read-only map of bytes ``[0, size)`` of ``fd``'s file (``storage.file_map``),
        or None: then the caller reads with ``pread``. Only for bytes that never change
        while the map lives. A file system that models reads itself (a subclass with its
        own ``pread``: faults, page-cache images) gets None, so every read goes through it."""
        if type(self).pread is not FileSystem.pread or size <= 0:
            return None
        return file_map.map_file(fd, size)

    def start_writeback(self, fd: int, position: int, size: int) -> None:
        """Ask the kernel to start writing ``size`` bytes at ``position`` to disk, without waiting.

        A hint, not a durability point (nothing is promised, nothing is counted):
        it spreads the disk work of a later ``sync`` (a segment seal) over the
        writes, so that sync finds little left to do. Linux ``sync_file_range``
        with ``SYNC_FILE_RANGE_WRITE`` only; elsewhere it does nothing. A failure
        is reported as ``StorageIOError`` like a failed write: the pages it
        concerns may never reach the disk.
        """
        if _sync_file_range is None:
            return
        if _sync_file_range(fd, position, size, _SYNC_FILE_RANGE_WRITE) == 0:
            return
        code = ctypes.get_errno()
        if code in (errno.ENOSYS, errno.EINVAL, errno.ESPIPE):
            return  # not supported for this file: the hint is simply not given
        error = OSError(code, os.strerror(code))
        raise _io_error("start writeback of", self._paths.get(fd, str(fd)), error)

    def wait_writeback(self, fd: int, position: int, size: int) -> bool:
        """Wait for the writeback already under way of ``size`` bytes at ``position``
        (``sync_file_range`` with ``SYNC_FILE_RANGE_WAIT_BEFORE`` only: it starts none) and
        report a writeback error of the file not yet reported on ``fd`` (Linux errseq) as
        ``StorageIOError``. False where there is no such call (nothing waited, nothing
        checked); True once waited without error."""
        if _sync_file_range is None or size <= 0:
            return False
        if _sync_file_range(fd, position, size, _SYNC_FILE_RANGE_WAIT_BEFORE) == 0:
            return True
        code = ctypes.get_errno()
        if code in (errno.ENOSYS, errno.EINVAL, errno.ESPIPE):
            return False
        error = OSError(code, os.strerror(code))
        raise _io_error("wait for the writeback of", self._paths.get(fd, str(fd)), error)

    def drop_cache(self, fd: int, position: int, size: int) -> bool:
        """Hint the kernel to drop ``size`` bytes at ``position`` from the page cache
        (``POSIX_FADV_DONTNEED``). A hint: nothing on disk changes and dirty pages (not yet
        written back) are skipped by the kernel, so it is safe for unsynced bytes too. A
        failure, or a platform without the call, is ignored: a hint, not an operation.
        Whether the hint was given (False: nothing was dropped)."""
        advise = getattr(os, "posix_fadvise", None)
        if advise is None or size <= 0:
            return False
        try:
            advise(fd, position, size, os.POSIX_FADV_DONTNEED)
        except OSError:
            return False
        return True

    def sync(self, fd: int) -> None:
        """Make the file's data durable (fdatasync). Counted."""
        failpoints.hit("fs.before_sync")
        try:
            os.fdatasync(fd)
        except OSError as error:
            raise _io_error("fsync", self._paths.get(fd, str(fd)), error) from error
        finally:
            with self._counter_lock:
                self._fsync_count += 1
        failpoints.hit("fs.after_sync")

    def open_sync_handle(self, directory: str) -> int | None:
        """A descriptor of ``directory`` for ``sync_file_system``, opened now: it reports
        the file system's write-back failures from this moment on (Linux samples them per
        open file), so open it before the writes it is to cover. None where one sync of a
        whole file system is not offered: not Linux, or a subclass that models syncs
        itself (its own ``sync``: faults, torn or dropped data), whose every sync must go
        through it."""
        if _syncfs is None or type(self).sync is not FileSystem.sync:
            return None
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as error:
            raise _io_error("open", directory, error) from error
        self._paths[fd] = directory
        return fd

    def sync_file_system(self, handle: int) -> bool:
        """Make durable the data of every file on the file system of ``handle`` (from
        ``open_sync_handle``) written before this call (Linux ``syncfs``: one journal
        commit and one cache flush for them all, where ``sync`` of each file pays one
        of each). True when it reported success: no write-back on that file system
        failed since the handle was opened or since the last failure it reported. False
        when it reported one: the caller then syncs file by file (``sync``), and the
        kernel reports the failure to the syncs of the files it concerns, so nothing is
        acknowledged as durable that is not. Counted as one sync."""
        assert _syncfs is not None
        failpoints.hit("fs.before_sync")
        try:
            done = _syncfs(handle) == 0
        finally:
            with self._counter_lock:
                self._fsync_count += 1
        if done:
            failpoints.hit("fs.after_sync")
        return done

    def truncate(self, fd: int, size: int) -> None:
        try:
            os.ftruncate(fd, size)
        except OSError as error:
            raise _io_error("truncate", self._paths.get(fd, str(fd)), error) from error

    def file_size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    # -- paths ------------------------------------------------------------------------
    def make_directory(self, path: str) -> None:
        """Create ``path`` and missing parents; each new entry is synced into its parent."""
        created = []
        parent = os.path.abspath(path)
        while not os.path.isdir(parent):
            created.append(parent)
            parent = os.path.dirname(parent)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as error:
            raise _io_error("mkdir", path, error) from error
        for directory in reversed(created):
            self.sync_directory(os.path.dirname(directory))

    def sync_directory(self, path: str) -> None:
        """Make a directory's entries (created, renamed, removed files) durable."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as error:
            raise _io_error("fsync directory", path, error) from error
        with self._counter_lock:
            self._directory_fsync_count += 1

    def list_directory(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []
        except OSError as error:
            raise _io_error("list", path, error) from error

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def path_size(self, path: str) -> int:
        try:
            return os.stat(path).st_size
        except OSError as error:
            raise _io_error("stat", path, error) from error

    def remove(self, path: str) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            return
        except OSError as error:
            raise _io_error("remove", path, error) from error

    def remove_tree(self, path: str) -> None:
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            return
        except OSError as error:
            raise _io_error("remove", path, error) from error

    def rename(self, source: str, target: str) -> None:
        try:
            os.replace(source, target)
        except OSError as error:
            raise _io_error("rename", source, error) from error

    def read_file(self, path: str) -> bytes:
        """Read a whole (small) file. Raises FileNotFoundError if it is missing."""
        try:
            with open(path, "rb") as file:
                return file.read()
        except FileNotFoundError:
            raise
        except OSError as error:
            raise _io_error("read", path, error) from error

    def write_file_atomic(self, path: str, data: bytes, *, durable: bool = True) -> None:
        """Replace ``path`` with ``data`` all at once: temp file, sync, rename, sync dir."""
        temp_path = path + ".tmp"
        fd = self.open_write(temp_path)
        try:
            self.truncate(fd, 0)
            self.pwrite(fd, data, 0)
            if durable:
                self.sync(fd)
        finally:
            self.close(fd)
        self.rename(temp_path, path)
        if durable:
            self.sync_directory(os.path.dirname(path) or ".")

    def lock_directory(self, path: str) -> int:
        """Take an exclusive, process-wide lock on a data directory.

        Returns the lock file's descriptor (keep it open while the directory is
        in use). Another process holding the lock gets ``ObjectInUseError``
        naming the owner's pid.
        """
        lock_path = os.path.join(path, "LOCK")
        fd = self.open_write(lock_path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            owner = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            self.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise ObjectInUseError(
                    f"data directory {path} is in use by another process (pid {owner})"
                ) from error
            raise _io_error("lock", lock_path, error) from error
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def unlock_directory(self, fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        self.close(fd)


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (Linux), or None where there is none.

    Looked up in the symbols the interpreter already has loaded (``dlopen(NULL)``),
    which include libc's: no library search, no subprocess at import.
    """
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


def _load_syncfs() -> Callable[[int], int] | None:
    """libc's ``syncfs`` (Linux), or None where there is none (as ``sync_file_range``)
    or where it does not report write-back failures: before Linux 5.8 it returned 0
    whatever became of the data. ctypes releases the GIL for the call."""
    if _linux_version() < (5, 8):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


def _linux_version() -> tuple[int, int]:
    """The running Linux kernel's (major, minor), or (0, 0) elsewhere."""
    uname = os.uname()
    if uname.sysname != "Linux":
        return (0, 0)
    numbers = uname.release.split("-")[0].split(".")
    try:
        return (int(numbers[0]), int(numbers[1]))
    except (IndexError, ValueError):
        return (0, 0)


_syncfs = _load_syncfs()
_SYNC_FILE_RANGE_WAIT_BEFORE = 1  # <linux/fs.h>: wait for writeback under way, report errors
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of dirty pages, do not wait
_sync_file_range = _load_sync_file_range()


def _io_error(operation: str, path: str, error: OSError) -> StorageIOError:
    name = errno.errorcode.get(error.errno or 0, str(error.errno))
    return StorageIOError(
        f"could not {operation} {path}: {error.strerror or error} ({name})",
        path=path,
        errno=error.errno,
    )


DEFAULT_FILE_SYSTEM = FileSystem()
