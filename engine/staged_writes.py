"""Topic writes of open transactions: a small buffer in memory, the rest spilled to disk,
all of it under one cap for the whole database.

An explicit transaction's ``INSERT INTO TOPIC`` rows wait for COMMIT (``engine.transaction``).
Kept in memory, a few idle sessions could hold gigabytes; so each transaction keeps at most
``TRANSACTION_MEMORY_BYTES_MAX`` in memory (and all transactions together at most
``TRANSACTIONS_MEMORY_BYTES_MAX``), and every further batch goes to the transaction's
*spill file*, ``<data>/spill/<serial>.spill``, read back only when the transaction commits.
Across every open transaction, staged bytes (in memory and spilled) are capped by
``TRANSACTIONS_STAGED_BYTES_MAX``: a write past it fails with 54000 and the rest of the
database carries on. A transaction's bytes are given back and its spill file deleted
when it ends (commit, rollback, a failed commit, a closed or timed-out session).

A batch committed *by reference* (a bulk write's, ``engine.staged_refs``) is counted
against the same cap but never spilled (``TransactionStaging.count``): its rows are in
files on disk already, which the commit's record names instead of a staging copy.

At COMMIT the spilled batches are read back into memory for staging and publishing
(``engine.commit``); at most ``SPILLED_COMMITS_MAX`` commits do so at once (the others
wait, holding no lock of the commit path), which bounds the memory large commits take.

Spill file format: Arrow IPC record-batch messages (``RecordBatch.serialize``) back to
back, each found by its (position, length) kept in memory with its schema; no header, no
checksum: the file lives only as long as its transaction in this process, and a spill file
found at open belongs to a process that died (its transaction never committed: a commit
stages its writes in ``storage.staging`` first), so ``StagedWrites`` deletes every file of
the directory when the database opens.

Thread-safety: ``StagedWrites`` is shared by all sessions (one lock guards the counters and
the serial numbers); a ``SpillFile`` belongs to one transaction, used by its session's
thread only.
"""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.ipc

from storage import limits
from storage.errors import LimitExceededError
from storage.fs import FileSystem

SPILL_DIRECTORY = "spill"
SPILL_SUFFIX = ".spill"


@dataclass(frozen=True, slots=True)
class SpilledBatch:
    """Where one batch lies in a spill file, and what it is."""

    position: int
    length: int
    schema: pa.Schema
    nbytes: int  # its Arrow size in memory (what it counted when staged)


class StagedWrites:
    """The database's account of open transactions' staged writes, and its spill area."""

    def __init__(self, fs: FileSystem, directory: str,
                 total_bytes_max: int = limits.TRANSACTIONS_STAGED_BYTES_MAX,
                 memory_bytes_max: int = limits.TRANSACTIONS_MEMORY_BYTES_MAX) -> None:  # fmt: skip
        self.fs = fs
        self.directory = directory
        self.total_bytes_max = total_bytes_max
        self.memory_bytes_max = memory_bytes_max
        self._lock = threading.Lock()
        self._serials = itertools.count(1)
        self.total_bytes = 0  # staged by open transactions, in memory and spilled
        self.read_back = threading.BoundedSemaphore(limits.SPILLED_COMMITS_MAX)
        self.memory_bytes = 0  # of which in memory
        self.removed_at_open = self._remove_leftovers()

    def _remove_leftovers(self) -> int:
        """Delete the spill files of a process that died; returns how many there were."""
        names = self.fs.list_directory(self.directory)
        for name in names:
            self.fs.remove(os.path.join(self.directory, name))
        self.fs.make_directory(self.directory)
        return len(names)

    def spill_files(self) -> list[str]:
        return [n for n in self.fs.list_directory(self.directory) if n.endswith(SPILL_SUFFIX)]

    def reserve(self, nbytes: int, *, in_memory: bool) -> bool:
        """Count ``nbytes`` more staged; True if they may stay in memory (when asked and the
        memory budget allows), False if they must be spilled. 54000 past the total cap."""
        with self._lock:
            if self.total_bytes + nbytes > self.total_bytes_max:
                raise LimitExceededError(
                    f"open transactions staged more than {self.total_bytes_max} bytes of topic "
                    "writes in all; commit or roll back some (this statement was refused)"
                )
            self.total_bytes += nbytes
            keep = in_memory and self.memory_bytes + nbytes <= self.memory_bytes_max
            if keep:
                self.memory_bytes += nbytes
            return keep

    def hold(self, nbytes: int) -> bool:
        """Count ``nbytes`` more in memory if both budgets allow, else count nothing and
        return False (for what cannot spill: a transaction's kept counter deltas)."""
        with self._lock:
            if (self.total_bytes + nbytes > self.total_bytes_max
                    or self.memory_bytes + nbytes > self.memory_bytes_max):  # fmt: skip
                return False
            self.total_bytes += nbytes
            self.memory_bytes += nbytes
            return True

    def release(self, total_bytes: int, memory_bytes: int) -> None:
        with self._lock:
            self.total_bytes -= total_bytes
            self.memory_bytes -= memory_bytes
            assert self.total_bytes >= 0 and self.memory_bytes >= 0

    def new_spill_path(self) -> str:
        with self._lock:
            serial = next(self._serials)
        return os.path.join(self.directory, f"{os.getpid()}-{serial:012d}{SPILL_SUFFIX}")


class TransactionStaging:
    """One transaction's share: what it keeps in memory, its spill file (opened at the
    first spilled batch), and what it reserved, given back by ``release``."""

    def __init__(self, staged: StagedWrites) -> None:
        self._staged = staged
        self.total_bytes = 0
        self.memory_bytes = 0
        self._path: str | None = None
        self._fd: int | None = None
        self._size = 0
        self._reading_back = False  # holds one of StagedWrites.read_back

    @property
    def spill_path(self) -> str | None:
        return self._path

    def place(self, batch: pa.RecordBatch, nbytes: int | None = None) -> SpilledBatch | None:
        """Account for ``batch`` (``nbytes``: its ``batch.nbytes`` if the caller has it,
        ~20 us a batch); None if it stays in memory, else where it was spilled. 54000 if it
        would take the database's staged writes past their cap."""
        nbytes = batch.nbytes if nbytes is None else nbytes
        wanted = self.memory_bytes + nbytes <= limits.TRANSACTION_MEMORY_BYTES_MAX
        in_memory = self._staged.reserve(nbytes, in_memory=wanted)
        self.total_bytes += nbytes
        if in_memory:
            self.memory_bytes += nbytes
            return None
        return self._spill(batch)

    def hold(self, nbytes: int) -> bool:
        """Account for ``nbytes`` this transaction keeps in memory and cannot spill (its
        counter deltas, ``engine.deltas``): False, counting nothing, past its memory budget
        or the database's (the caller then does without: the upsert runs the DuckDB way)."""
        if self.memory_bytes + nbytes > limits.TRANSACTION_MEMORY_BYTES_MAX:
            return False
        if not self._staged.hold(nbytes):
            return False
        self.total_bytes += nbytes
        self.memory_bytes += nbytes
        return True

    def count(self, nbytes: int) -> None:
        """Account for a batch committed *by reference* (``engine.staged_refs``): its rows
        are on disk already, in files its record will name, so it is counted against the
        database's cap (54000 past it) but neither spilled nor counted as memory."""
        self._staged.reserve(nbytes, in_memory=False)
        self.total_bytes += nbytes

    def _spill(self, batch: pa.RecordBatch) -> SpilledBatch:
        fs = self._staged.fs
        if self._fd is None:
            self._path = self._staged.new_spill_path()
            self._fd = fs.open_write(self._path)
        message = batch.serialize()
        fs.pwritev(self._fd, [message], self._size)
        spilled = SpilledBatch(self._size, message.size, batch.schema, batch.nbytes)
        self._size += message.size
        return spilled

    def start_read_back(self) -> None:
        """Before a COMMIT reads spilled batches back: wait for a turn (``release`` gives
        it back). Nothing to wait for when nothing was spilled."""
        if self._fd is not None and not self._reading_back:
            self._staged.read_back.acquire()
            self._reading_back = True

    def read(self, spilled: SpilledBatch) -> pa.RecordBatch:
        """A spilled batch back (at COMMIT)."""
        assert self._fd is not None, "nothing was spilled"
        data = self._staged.fs.pread(self._fd, spilled.length, spilled.position)
        assert len(data) == spilled.length, "a spill file is never cut short while open"
        return pyarrow.ipc.read_record_batch(pa.py_buffer(data), spilled.schema)

    def release(self) -> None:
        """The transaction ended: give back its bytes, delete its spill file (idempotent)."""
        self._staged.release(self.total_bytes, self.memory_bytes)
        self.total_bytes = self.memory_bytes = 0
        if self._reading_back:
            self._reading_back = False
            self._staged.read_back.release()
        if self._fd is not None:
            self._staged.fs.close(self._fd)
            self._fd = None
        if self._path is not None:
            self._staged.fs.remove(self._path)
            self._path = None
