"""A ``FileSystem`` that fails on purpose: torn writes, ENOSPC/EIO, failed fsync, power cuts.

``FaultyFileSystem`` is a drop-in for ``storage.fs.FileSystem``: it does the
real I/O on real files (under the test's ``tmp_path``) and keeps, beside them,
a model of what the *disk* holds, as opposed to the page cache the process
reads through. Given the same seed and the same sequence of calls it makes the
same decisions.

What it models:

- *Faults by rule* (``Fault``): on an operation (``write`` = ``pwrite`` and
  ``pwritev``, ``sync``, ``sync_directory``, ``rename``, ``truncate``), for
  paths containing a substring (or any path), on the n-th matching call or with
  a seeded probability: raise ``StorageIOError`` with an errno (ENOSPC, EIO...),
  exactly as ``storage.fs`` reports a real one, or *crash* (``SimulatedCrash``).
  A write fault may first write a prefix of the data (a torn write).
- *A crash* (``crash``): the process dies. Every descriptor opened through
  this object is closed (so the directory lock is released) and every later
  call raises ``SimulatedCrash`` until ``restart``. The page cache survives:
  file contents stay as written.
- *A power cut* (``power_cut``): a crash that also loses the page cache. Each
  file goes back to its *durable image*: the bytes of its last successful
  ``sync`` (fdatasync). Directory entries created, renamed or removed since the
  last ``sync_directory`` of their directory are forgotten. With
  ``partial_writeback`` the kernel is assumed to have written some data back on
  its own: a random prefix (in page order) of each file's dirty pages, and a
  random prefix (in call order, as a journal would) of the pending directory
  changes, survive.
- *fsyncgate*: a failed ``sync`` marks the file's dirty pages clean without
  writing them (Linux's behaviour that PostgreSQL learned of in 2018). Reads
  still return their data from the cache, but they are *lost pages*: a later
  successful ``sync`` does not write them, so after a power cut they hold what
  the disk had before (zeros past the old end). Writing a lost page again
  makes it dirty, hence durable at the next sync.

What it does not model: reordering of writes within a page or across files
other than the above; data written by ``pwrite`` in the middle of a file
without a sync is lost whole at a power cut (no partial writeback of
overwrites, only of dirty pages); directories created with
``make_directory`` are durable at once unless ``strict_directories`` asks for
their parent to be synced too; files that existed before this object first
touched them are taken as durable; a removed file whose removal is undone by a
power cut comes back with its durable image only. Reads never fail.

Thread-safety: one re-entrant lock guards the model, and every call that changes a
file or a name does its real I/O under it too, after checking (under it) that the
process is alive. So ``cut_power_and_exit``, which cuts power and ends the process
while it holds the lock, can be called from any thread at any moment: no write,
sync, truncate, rename or removal of another thread lands between the cut and the
end of the process (a process with several threads of I/O, like a chaos worker,
dies at one instant). Reads hold it too: a descriptor the cut closed may be reused by
the cut's own file rewrites, and a read through it would see another file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from storage.fs import FileSystem, _io_error

PAGE_BYTES = 4096
OPERATIONS = ("write", "sync", "sync_directory", "rename", "truncate")


class SimulatedCrash(BaseException):
    """The simulated process died here. A BaseException, so ``except Exception`` misses it."""


@dataclass
class Fault:
    """One fault rule. It fires at most ``times`` times (None: no limit).

    ``error`` is the errno to report; None means *crash* instead. ``torn``
    (writes only) writes ``torn_bytes`` of the data first (None: a seeded
    random length, at least 1 and short of the whole). ``nth`` fires on that
    matching call (1-based); None fires on any matching call, each with
    ``probability``.
    """

    operation: str
    error: int | None = errno.EIO
    path_contains: str = ""
    nth: int | None = 1
    probability: float = 1.0
    torn: bool = False
    torn_bytes: int | None = None
    times: int | None = 1
    calls: int = 0
    fired: int = 0

    def __post_init__(self) -> None:
        assert self.operation in OPERATIONS, self.operation
        assert not self.torn or self.operation == "write", "only writes can tear"
        assert 0.0 <= self.probability <= 1.0


@dataclass(eq=False)
class _Inode:
    """What the disk holds of one file, and which cached pages it lacks."""

    durable: bytes = b""
    dirty_pages: set[int] = field(default_factory=set)
    lost_pages: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class _NameChange:
    """A directory change not yet synced: ``kind`` is create, remove, rename or mkdir."""

    kind: str
    path: str
    inode: _Inode | None = None
    source: str = ""

    def directories(self) -> set[str]:
        return {os.path.dirname(p) for p in (self.path, self.source) if p}


class FaultyFileSystem(FileSystem):
    def __init__(self, seed: int = 0, *, strict_directories: bool = False) -> None:
        super().__init__()
        self.seed = seed
        self.strict_directories = strict_directories
        self._random = random.Random(seed)
        self._model_lock = threading.RLock()
        self._faults: list[Fault] = []
        self._crashed = False
        self._descriptors: dict[int, _Inode | None] = {}  # every fd we opened -> its file
        self._live: dict[str, _Inode] = {}  # the names the process sees
        self._durable: dict[str, _Inode] = {}  # the names the disk holds
        self._pending: list[_NameChange] = []  # directory changes not yet synced
        self._created_directories: set[str] = set()
        self._durable_directories: set[str] = set()

    # -- rules ----------------------------------------------------------------------------
    def add_fault(self, fault: Fault) -> Fault:
        with self._model_lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._model_lock:
            self._faults.clear()

    def _due_fault(self, operation: str, path: str) -> Fault | None:
        """The first armed rule that fires on this call (counting every matching call)."""
        with self._model_lock:
            for fault in self._faults:
                exhausted = fault.times is not None and fault.fired >= fault.times
                if fault.operation != operation or fault.path_contains not in path or exhausted:
                    continue
                fault.calls += 1
                if fault.nth is not None and fault.calls != fault.nth:
                    continue
                if fault.probability < 1.0 and self._random.random() >= fault.probability:
                    continue
                fault.fired += 1
                return fault
        return None

    def _fail(self, fault: Fault, operation: str, path: str) -> BaseException:
        """The exception a fired rule raises: a crash, or the errno as storage.fs reports it."""
        if fault.error is None:
            self.crash()
            return SimulatedCrash(f"simulated crash at {operation} of {path}")
        error = OSError(fault.error, os.strerror(fault.error))
        return _io_error(operation, path, error)

    # -- crash and power cut ----------------------------------------------------------------
    def crash(self) -> None:
        """The process dies: close every descriptor we opened; later calls raise."""
        with self._model_lock:
            self._crashed = True
            for fd in list(self._descriptors):
                with contextlib.suppress(OSError):  # best effort: the process is dying
                    os.close(fd)
            self._descriptors.clear()

    def restart(self) -> None:
        """A new process (or, after ``power_cut``, a rebooted machine) may use the files."""
        with self._model_lock:
            self._crashed = False

    def power_cut(self, *, partial_writeback: bool = False) -> None:
        """Crash and lose the page cache: files and names go back to what the disk holds."""
        with self._model_lock:
            cached = {inode: _read_path(path) for path, inode in self._live.items()}
            self.crash()
            pending = self._pending
            kept = self._random.randint(0, len(pending)) if partial_writeback else 0
            for change in pending[:kept]:
                self._apply(change)
            self._drop_undurable_directories()
            for path in set(self._live) - set(self._durable):
                _remove_path(path)
            survivors: dict[str, _Inode] = {}
            for path, inode in sorted(self._durable.items()):
                image = self._image_after_cut(inode, cached.get(inode), partial_writeback)
                _write_path(path, image)
                survivors[path] = _Inode(durable=image)
            self._live = dict(survivors)
            self._durable = dict(survivors)
            self._pending = []

    def cut_power_and_exit(self, *, partial_writeback: bool = False, code: int = 137) -> None:
        """Cut power and end the process at once (``os._exit(code)``), from any thread:
        under the lock no other thread's file call is half done, and none runs after."""
        with self._model_lock:
            self.power_cut(partial_writeback=partial_writeback)
            sys.stdout.flush()
            os._exit(code)

    def _image_after_cut(self, inode: _Inode, cached: bytes | None, partial: bool) -> bytes:
        """The durable image, plus (``partial``) a page-order prefix of the dirty pages."""
        image = bytearray(inode.durable)
        if not partial or cached is None or not inode.dirty_pages:
            return bytes(image)
        dirty = sorted(inode.dirty_pages)
        for page in dirty[: self._random.randint(0, len(dirty))]:
            start, end = page * PAGE_BYTES, min((page + 1) * PAGE_BYTES, len(cached))
            if start >= end:
                continue
            if len(image) < end:
                image.extend(bytes(end - len(image)))
            image[start:end] = cached[start:end]
        return bytes(image)

    def _drop_undurable_directories(self) -> None:
        if not self.strict_directories:
            return
        lost = self._created_directories - self._durable_directories
        for path in list(self._durable):
            if any(_is_under(path, directory) for directory in lost):
                del self._durable[path]
        for directory in sorted(lost, key=len):
            _remove_path(directory)
        self._created_directories -= lost

    def unsynced_paths(self) -> list[str]:
        """Files whose cached content or name the disk does not hold yet."""
        with self._model_lock:
            paths = {p for p, inode in self._live.items() if inode.dirty_pages or inode.lost_pages}
            paths.update(change.path for change in self._pending)
            return sorted(paths)

    # -- the model ------------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self._crashed:
            raise SimulatedCrash("the simulated process has crashed; call restart()")

    def _known(self, path: str) -> _Inode | None:
        """The file at ``path``; a file we never saw is adopted as durable."""
        path = os.path.normpath(path)
        inode = self._live.get(path)
        if inode is None and os.path.isfile(path):
            inode = _Inode(durable=_read_path(path))
            self._live[path] = inode
            self._durable.setdefault(path, inode)
        return inode

    def _apply(self, change: _NameChange) -> None:
        """Make one directory change durable."""
        if change.kind == "create":
            assert change.inode is not None
            self._durable[change.path] = change.inode
        elif change.kind == "rename":
            assert change.inode is not None
            self._durable.pop(change.source, None)
            self._durable[change.path] = change.inode
        elif change.kind == "remove":
            for path in [p for p in self._durable if _is_under(p, change.path)]:
                del self._durable[path]
            self._durable_directories = {
                d for d in self._durable_directories if not _is_under(d, change.path)
            }
        else:
            assert change.kind == "mkdir", change.kind
            self._durable_directories.add(change.path)

    def _note_write(self, fd: int, position: int, size: int) -> None:
        inode = self._descriptors.get(fd)
        if inode is None or size <= 0:
            return
        pages = set(range(position // PAGE_BYTES, (position + size - 1) // PAGE_BYTES + 1))
        inode.dirty_pages |= pages
        inode.lost_pages -= pages

    def _note_synced(self, fd: int) -> None:
        """fdatasync succeeded: the disk now holds the cache, except lost pages."""
        inode = self._descriptors.get(fd)
        if inode is None:
            return
        image = bytearray(_read_fd(fd))
        old = inode.durable
        for page in inode.lost_pages:
            start, end = page * PAGE_BYTES, min((page + 1) * PAGE_BYTES, len(image))
            if start < end:
                image[start:end] = old[start:end].ljust(end - start, b"\0")
        inode.durable = bytes(image)
        inode.dirty_pages.clear()

    # -- descriptors ----------------------------------------------------------------------
    def open_write(self, path: str) -> int:
        with self._model_lock:
            self._check_alive()
            path = os.path.normpath(path)
            inode = self._known(path)
            fd = super().open_write(path)
            if inode is None:
                inode = _Inode()
                self._live[path] = inode
                self._pending.append(_NameChange("create", path, inode))
            self._descriptors[fd] = inode
            return fd

    def open_read(self, path: str) -> int:
        with self._model_lock:
            self._check_alive()
            fd = super().open_read(path)
            self._descriptors[fd] = None
            return fd

    def close(self, fd: int) -> None:
        with self._model_lock:
            self._check_alive()
            self._descriptors.pop(fd, None)
            super().close(fd)

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> None:
        self._write(fd, memoryview(data).cast("B"), position)

    def pwritev(self, fd: int, parts: Sequence[object], position: int) -> None:
        joined = b"".join(memoryview(part).cast("B") for part in parts)  # type: ignore[arg-type]
        self._write(fd, memoryview(joined), position)

    def _write(self, fd: int, view: memoryview, position: int) -> None:
        with self._model_lock:  # the real write too: see the module doc
            self._check_alive()
            self._write_locked(fd, view, position)

    def _write_locked(self, fd: int, view: memoryview, position: int) -> None:
        path = self._paths.get(fd, str(fd))
        fault = self._due_fault("write", path)
        if fault is None:
            super().pwrite(fd, view, position)
            with self._model_lock:
                self._note_write(fd, position, len(view))
            return
        if fault.torn and len(view) > 1:
            size = fault.torn_bytes
            if size is None:
                size = self._random.randint(1, len(view) - 1)
            super().pwrite(fd, view[:size], position)
            with self._model_lock:
                self._note_write(fd, position, size)
        raise self._fail(fault, "write", path)

    def sync(self, fd: int) -> None:
        with self._model_lock:  # the real sync too: see the module doc
            self._check_alive()
            self._sync_locked(fd)

    def _sync_locked(self, fd: int) -> None:
        path = self._paths.get(fd, str(fd))
        fault = self._due_fault("sync", path)
        if fault is not None and fault.error is None:
            raise self._fail(fault, "fsync", path)
        super().sync(fd)  # the real call runs (and is counted) even when we report failure
        with self._model_lock:
            inode = self._descriptors.get(fd)
            if fault is None:
                self._note_synced(fd)
                return
            if inode is not None:  # fsyncgate: the dirty pages are marked clean, unwritten
                inode.lost_pages |= inode.dirty_pages
                inode.dirty_pages.clear()
        raise self._fail(fault, "fsync", path)

    def truncate(self, fd: int, size: int) -> None:
        with self._model_lock:  # the real truncate too: see the module doc
            self._check_alive()
            path = self._paths.get(fd, str(fd))
            fault = self._due_fault("truncate", path)
            if fault is not None:
                raise self._fail(fault, "truncate", path)
            super().truncate(fd, size)
            inode = self._descriptors.get(fd)
            if inode is not None:  # the new size reaches the disk with the next sync
                inode.dirty_pages.add(size // PAGE_BYTES)

    def file_size(self, fd: int) -> int:
        with self._model_lock:
            self._check_alive()
            return super().file_size(fd)

    def pread(self, fd: int, size: int, position: int) -> bytes:
        with self._model_lock:
            self._check_alive()
            return super().pread(fd, size, position)

    def pread_into(self, fd: int, target: memoryview, position: int) -> int:
        with self._model_lock:
            self._check_alive()
            return super().pread_into(fd, target, position)

    # -- paths ----------------------------------------------------------------------------
    def make_directory(self, path: str) -> None:
        path = os.path.normpath(os.path.abspath(path))
        with self._model_lock:
            self._check_alive()
            missing = []
            parent = path
            while parent and not os.path.isdir(parent):
                missing.append(parent)
                parent = os.path.dirname(parent)
            # Noted before the real call, which may sync the parents it creates into.
            for directory in reversed(missing):
                self._created_directories.add(directory)
                if self.strict_directories:
                    self._pending.append(_NameChange("mkdir", directory))
                else:
                    self._durable_directories.add(directory)
            super().make_directory(path)

    def sync_directory(self, path: str) -> None:
        path = os.path.normpath(path)
        with self._model_lock:  # the real sync too: see the module doc
            self._check_alive()
            fault = self._due_fault("sync_directory", path)
            if fault is not None:
                raise self._fail(fault, "fsync directory", path)
            super().sync_directory(path)
            remaining = []
            for change in self._pending:
                if path in change.directories():
                    self._apply(change)
                else:
                    remaining.append(change)
            self._pending = remaining

    def rename(self, source: str, target: str) -> None:
        source, target = os.path.normpath(source), os.path.normpath(target)
        with self._model_lock:
            self._check_alive()
            fault = self._due_fault("rename", source)
            if fault is not None:
                raise self._fail(fault, "rename", source)
            inode = self._known(source)
            self._known(target)
            super().rename(source, target)
            if inode is None:
                return
            del self._live[source]
            self._live[target] = inode
            self._pending.append(_NameChange("rename", target, inode, source))

    def remove(self, path: str) -> None:
        path = os.path.normpath(path)
        with self._model_lock:
            self._check_alive()
            self._known(path)
            super().remove(path)
            if self._live.pop(path, None) is not None:
                self._pending.append(_NameChange("remove", path))

    def remove_tree(self, path: str) -> None:
        path = os.path.normpath(path)
        with self._model_lock:
            self._check_alive()
            for directory, _, names in os.walk(path):
                for name in names:
                    self._known(os.path.join(directory, name))
            super().remove_tree(path)
            for known in [p for p in self._live if _is_under(p, path)]:
                del self._live[known]
            self._pending.append(_NameChange("remove", path))

    def list_directory(self, path: str) -> list[str]:
        with self._model_lock:
            self._check_alive()
            return super().list_directory(path)

    def exists(self, path: str) -> bool:
        with self._model_lock:
            self._check_alive()
            return super().exists(path)

    def path_size(self, path: str) -> int:
        with self._model_lock:
            self._check_alive()
            return super().path_size(path)

    def read_file(self, path: str) -> bytes:
        with self._model_lock:
            self._check_alive()
            return super().read_file(path)

    def lock_directory(self, path: str) -> int:
        with self._model_lock:
            self._check_alive()
            return super().lock_directory(path)

    def unlock_directory(self, fd: int) -> None:
        self._check_alive()  # after a crash the lock died with the descriptor
        super().unlock_directory(fd)


def _is_under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + os.sep)


# Raw helpers for the model: they bypass the faults and the counters on purpose.
def _read_fd(fd: int) -> bytes:
    return os.pread(fd, os.fstat(fd).st_size, 0)


def _read_path(path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        return b""


def _write_path(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as file:
        file.write(data)


def _remove_path(path: str) -> None:
    if os.path.isdir(path):
        for directory, _, names in os.walk(path, topdown=False):
            for name in names:
                os.remove(os.path.join(directory, name))
            os.rmdir(directory)
    elif os.path.exists(path):
        os.remove(path)
