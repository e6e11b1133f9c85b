"""The rows of a SQL cursor, kept out of Python's heap once they are large.

DuckDB allows no other statement on the session's cursor while a result of it is open, so a
cursor cannot keep reading its query between FETCHes (the session runs other statements in
between). DECLARE therefore drains the query at once, batch by batch (``ResultStream``):
the first ``SPILL_BYTES`` stay in memory; past that, every batch goes to an Arrow IPC file
in the temporary directory (``TMPDIR``), which is then memory-mapped and read back as one
zero-copy table (the page cache holds it, not the heap) and unlinked at once, so nothing is
left behind whatever happens to the process: the mapping lives as long as the table.

Invariants: what is held in memory at a time is at most ``SPILL_BYTES`` plus one batch; the
returned table has the stream's schema and its rows in order; the stream is closed on
return and on error; a partly written file is removed on error.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

import pyarrow as pa

from sql.pgwire.connection.result_stream import ResultStream

SPILL_BYTES = 8 * 1024 * 1024
SPILL_PREFIX = "topicbase-cursor-"


def collect(stream: ResultStream, spill_bytes: int = SPILL_BYTES) -> pa.Table:
    """All rows of ``stream``: in memory if small, else memory-mapped from a spill file."""
    return collect_counted(stream, spill_bytes)[0]


def collect_counted(stream: ResultStream, spill_bytes: int = SPILL_BYTES) -> tuple[pa.Table, int]:
    """``collect``, and the bytes of the table in the heap (0 if memory-mapped)."""
    held: list[pa.Table] = []
    held_bytes = 0
    writer: pa.ipc.RecordBatchFileWriter | None = None
    path: str | None = None
    try:
        while (batch := stream.next_batch()) is not None:
            if writer is not None:
                writer.write_table(batch)
                continue
            held.append(batch)
            held_bytes += batch.nbytes
            if held_bytes > spill_bytes:
                descriptor, path = tempfile.mkstemp(prefix=SPILL_PREFIX, suffix=".arrow")
                os.close(descriptor)
                writer = pa.ipc.new_file(path, stream.schema)
                for table in held:
                    writer.write_table(table)
                held, held_bytes = [], 0
        if writer is None:
            table = pa.concat_tables(held) if held else stream.schema.empty_table()
            return table, table.nbytes
        writer.close()
        writer = None
        assert path is not None
        return pa.ipc.open_file(pa.memory_map(path)).read_all(), 0
    finally:
        stream.close()
        if writer is not None:
            with contextlib.suppress(OSError, pa.ArrowException):
                writer.close()
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
