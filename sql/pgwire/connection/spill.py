"""The rows of a SQL cursor, kept out of Python's heap once they are large.

DuckDB allows no other statement on the session's cursor while a result of it is open, so a
cursor cannot keep reading its query between FETCHes (the session runs other statements in
between). DECLARE therefore drains the query at once, batch by batch (``ResultStream``):
the first ``SPILL_BYTES`` stay in memory; past that, every batch goes to an Arrow IPC file
in the temporary directory (``TMPDIR``), which is then memory-mapped and read back as one
zero-copy table (the page cache holds it, not the heap).

The file is unlinked as soon as it is created, before anything is written: it has no name
while it is written or mapped, so nothing is left behind whatever happens to the process (a
kill mid-spill included; before round 26 it was unlinked only at the end of the spill). Its
disk space is freed once the descriptor is closed (at the end of the spill) and the mapping
is gone (when the last reference to the table's buffers goes).

Disk is bounded (round 26, H2): each write to the file is first charged to a
``SpillCharge`` of the server's ``SpillBudget`` (53400 past the server's or the login's
bound of spilled bytes, nothing more written). A failed write of the operating system is a
``DiskFullError`` (53100, ENOSPC/EDQUOT) or a ``StorageIOError`` (58030). On any error the
file is dropped and the charge given back; on success the charge stays with the table until
its cursor is dropped, and is given back at the latest when the mapping is freed.

Invariants: what is held in memory at a time is at most ``SPILL_BYTES`` plus one batch; the
returned table has the stream's schema and its rows in order; the stream is closed on
return and on error; no file of a spill has a name in TMPDIR past its creation; the bytes
charged are the bytes written to the file.
"""

from __future__ import annotations

import errno
import mmap
import os
import tempfile
import weakref
from typing import TYPE_CHECKING

import pyarrow as pa

from sql.pgwire.connection.result_stream import ResultStream
from storage.errors import DiskFullError, StorageIOError, TopicbaseError

if TYPE_CHECKING:
    from sql.pgwire.spill_budget import SpillCharge

SPILL_BYTES = 8 * 1024 * 1024
SPILL_PREFIX = "topicbase-cursor-"
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def collect(stream: ResultStream, spill_bytes: int = SPILL_BYTES,
            charge: SpillCharge | None = None) -> pa.Table:  # fmt: skip
    """All rows of ``stream``: in memory if small, else memory-mapped from a spill file."""
    return collect_counted(stream, spill_bytes, charge)[0]


def collect_counted(stream: ResultStream, spill_bytes: int = SPILL_BYTES,
                    charge: SpillCharge | None = None) -> tuple[pa.Table, int]:  # fmt: skip
    """``collect``, and the bytes of the table in the heap (0 if memory-mapped). A spill
    file's bytes are charged to ``charge`` as they are written (none: uncounted), given back
    if this raises."""
    held: list[pa.Table] = []
    held_bytes = 0
    spill: SpillFile | None = None
    try:
        while (batch := stream.next_batch()) is not None:
            if spill is not None:
                spill.writer.write_table(batch)
                continue
            held.append(batch)
            held_bytes += batch.nbytes
            if held_bytes > spill_bytes:
                spill = SpillFile(stream.schema, charge)
                for table in held:
                    spill.writer.write_table(table)
                held, held_bytes = [], 0
        if spill is None:
            table = pa.concat_tables(held) if held else stream.schema.empty_table()
            return table, table.nbytes
        return spill.mapped(), 0
    except BaseException:
        if charge is not None:
            charge.release()
        raise
    finally:
        stream.close()
        if spill is not None:
            spill.close()


class SpillFile:
    """An unlinked temporary file written by Arrow's IPC file writer (``writer``) through
    ``write``, which charges each piece before writing it; ``mapped`` reads it back."""

    def __init__(self, schema: pa.Schema, charge: SpillCharge | None) -> None:
        self.charge = charge
        self.closed = False  # what ``pa.PythonFile`` asks of its file
        self.written = 0
        try:
            descriptor, path = tempfile.mkstemp(prefix=SPILL_PREFIX, suffix=".arrow")
        except OSError as error:
            raise _os_error(error, "create") from error
        self.descriptor: int | None = descriptor
        try:
            os.unlink(path)  # nameless from now on: nothing outlives the process
            self.writer = pa.ipc.new_file(pa.PythonFile(self, mode="w"), schema)
        except OSError as error:
            self.close()
            raise _os_error(error, "create") from error
        except BaseException:
            self.close()
            raise

    def write(self, data: pa.Buffer | bytes) -> int:
        """Charge and write one piece the IPC writer hands over (53400, 53100, 58030)."""
        if self.descriptor is None:  # closed (an error ended the spill): nothing charged
            raise ValueError("write to a closed spill file")
        view = memoryview(data)
        nbytes = view.nbytes
        if self.charge is not None:
            self.charge.take(nbytes)
        try:
            while view:
                view = view[_write(self.descriptor, view) :]
        except OSError as error:
            raise _os_error(error, "write to") from error
        self.written += nbytes
        return nbytes

    def flush(self) -> None:
        """Nothing is buffered here: each ``write`` went to the kernel."""

    def mapped(self) -> pa.Table:
        """Finish the file and read it back, memory-mapped: a zero-copy table whose charge
        is given back, at the latest, when the mapping is freed."""
        self.writer.close()
        assert self.descriptor is not None
        try:
            mapping = mmap.mmap(self.descriptor, 0, access=mmap.ACCESS_READ)
        except OSError as error:
            raise _os_error(error, "map") from error
        if self.charge is not None:
            weakref.finalize(mapping, self.charge.release)
        return pa.ipc.open_file(pa.BufferReader(pa.py_buffer(mapping))).read_all()

    def close(self) -> None:
        """Close the descriptor (idempotent); the space is freed with the last mapping."""
        self.closed = True
        if self.descriptor is not None:
            descriptor, self.descriptor = self.descriptor, None
            os.close(descriptor)


def _write(descriptor: int, view: memoryview) -> int:
    """One ``os.write`` (a seam: tests make it fail as a full disk would)."""
    return os.write(descriptor, view)


def _os_error(error: OSError, doing: str) -> TopicbaseError:
    """The error a client gets for a spill file the operating system refused."""
    reason = error.strerror or str(error)
    directory = tempfile.gettempdir()
    if error.errno in _DISK_FULL:
        return DiskFullError(
            f"could not {doing} a cursor's temporary file in {directory}: {reason}; "
            f"close cursors or fetch less at once"
        )
    return StorageIOError(f"could not {doing} a cursor's temporary file in {directory}: {reason}")
