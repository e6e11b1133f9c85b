"""Topic writes committed *by reference*: the batch is derived from files already on disk.

A bulk commit (``engine.bulk_write``) used to copy its rows three times on the server
before the partition write: the transaction's spill (``engine.staged_writes``), the
staging log (``storage.staging``, the commit's durable copy) and back. Its rows are on disk
already, as the write's staged Arrow IPC stream files, so the commit's durable record
instead names those files, and a partition's share is *derived* from them by one pure
function (``derive``), at commit and again, identically, by recovery (``Derivation``:
each of a record's file lists read, checked and grouped once for all of its partitions).

A *reference* (JSON, kept in the commit's record row: ``engine.commit``) is::

    {"files": [[path, size, crc32c], ...], "dirs": [path, ...], "partition": p, "at": us}

``files`` (paths relative to the data directory) are read in order and concatenated;
the rows whose ``partition`` column is ``p`` become one wire batch built by
``engine.writes.build_batches`` with a clock stopped at ``at`` (the only input of the
derivation that is not in the files: rows without ``created_at`` get it). ``dirs`` are
the write directories the files live in, deleted once the transaction no longer needs
them (``release``).

Invariants:
- the files are durable (fdatasynced, their directory entries synced) before the record
  that names them commits (``sync_files``), and are not changed or deleted until the
  transaction is released by the checkpoint that made its partitions durable;
- ``derive`` depends only on the reference and the files' bytes, which the sizes and
  CRC-32Cs check (a damaged file raises ``CorruptSegmentError``: recovery stops rather
  than publish other rows than those committed);
- only rows that all name their partition are committed by reference (routing by key or
  round robin depends on the topic's state, which may change before recovery).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import mmap
import os
import shutil
from collections.abc import Callable, Iterator

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.staged_writes import TransactionStaging
from engine.transaction import PendingWrite
from engine.writes import _non_negative, _readable_instants, build_batches
from grammar.bounded_cache import ENTRY_BYTES, BoundedCache
from storage import failpoints, limits
from storage.clock import ManualClock
from storage.errors import (
    CorruptSegmentError,
    InvalidParameterValueError,
    NumericValueOutOfRangeError,
    StorageIOError,
)
from storage.fs import FileSystem
from storage.staged_frames import (
    BadStagedFrameError,
    IncomingFrame,
    StagedFrame,
    check_incoming,
    check_own_file,
    file_crc,
    index_file,
    own_file,
)
from storage.staged_frames import decode as decode_frames

Reference = dict  # the JSON form above
_SYNC_THREADS = 8  # files fdatasynced at once by ``sync_files``


def seal_file(path: str, fs: FileSystem) -> int:
    """A staged file just written whole: its CRC-32C (read back from the page cache,
    mapped), and the kernel asked to start writing it to disk (a hint: the commit's
    ``sync_files`` is the durability point, and finds little left to write)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        crc = 0
        if size:
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
                crc = crc32c.crc32c(mapped)
        with contextlib.suppress(StorageIOError):  # the commit's fdatasync will tell
            fs.start_writeback(fd, 0, size)
        return crc
    finally:
        os.close(fd)


def file_entry(root: str, path: str) -> list:
    """``[path relative to root, size, crc32c]`` of a staged file: the CRC-32C from its
    name (``<uuid>.<crc32c>.arrows``, taken by ``seal_file``; an own frames file's
    ``<uuid>.~p<partition>-r<rows>.<crc32c>.frames``), else read (mapped)."""
    size = os.path.getsize(path)
    parts = os.path.basename(path).split(".")
    if len(parts) == 3 and len(parts[1]) == 8:
        crc = int(parts[1], 16)
    elif len(parts) == 4 and len(parts[2]) == 8 and own_file(path) is not None:
        crc = int(parts[2], 16)
    else:
        crc = 0
        if size:
            with (
                open(path, "rb") as handle,
                mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped,
            ):
                crc = crc32c.crc32c(mapped)
    return [os.path.relpath(path, root), size, crc]


def sync_files(root: str, files: list[list], dirs: list[str], *,
               check: Callable[[list], None] | None = None) -> None:  # fmt: skip
    """Make the files and their directory entries durable: the files' fdatasyncs at
    once (threads: each waits for its own writeback, and the waits overlap), then each
    directory's fsync. With ``check``, each file's entry is checked first
    (``check(entry)``), in the thread that then syncs it: one file's check overlaps
    another's wait. Raises the first error once all are done."""

    def sync(entry: list) -> None:
        if check is not None:
            check(entry)
        relative = entry[0]
        fd = os.open(os.path.join(root, relative), os.O_RDONLY)
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)

    if len(files) > 1:
        with concurrent.futures.ThreadPoolExecutor(min(len(files), _SYNC_THREADS)) as pool:
            for done in [pool.submit(sync, entry) for entry in files]:
                done.result()
    else:
        for entry in files:
            sync(entry)
    for relative in dirs:
        fd = os.open(os.path.join(root, relative), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def read_files(root: str, files: list[list], *, check: bool) -> pa.Table:
    """The files' rows, in order, as one table (memory-mapped, zero-copy); with ``check``,
    each file's size and CRC-32C are verified first (recovery)."""
    pieces = []
    for relative, size, crc in files:
        path = os.path.join(root, relative)
        source = pa.memory_map(path)
        if check:
            found = source.size()
            if found != size or (size and crc32c.crc32c(source.read_buffer(size)) != crc):
                raise CorruptSegmentError(
                    f"a committed bulk write's staged file is damaged ({found} bytes, "
                    f"{size} committed)", path=path, position=0)  # fmt: skip
            source.seek(0)
        pieces.append(pa.ipc.open_stream(source).read_all())
    if not pieces:
        return pa.table({})
    return pa.concat_tables(pieces, promote_options="permissive")


def partition_groups(data: pa.Table) -> Iterator[tuple[int | None, pa.Table]]:
    """Topic rows grouped by their ``partition`` (without that column), each group in the
    rows' order, groups in ascending partition order; one group ``(None, data)`` when no row
    names a partition (the topic routes them). Groups are made one at a time, so only one
    is in memory beside ``data`` (which is memory-mapped) and, when ``data`` has many
    chunks, one joined copy of it (``PartitionGroups.rows_of``) while the caller stages it.

    Refuses a partition given for some rows only (22023) or negative (22003), as an
    ``INSERT INTO TOPIC`` does, before the first group.
    """
    values = _partition_values(data)
    if values is None:
        has = "partition" in data.column_names
        yield None, data.drop_columns(["partition"]) if has else data
        return
    groups = PartitionGroups(data.drop_columns(["partition"]), values)
    for partition in groups.partitions:
        rows = groups.rows_of(int(partition))
        assert rows is not None
        yield int(partition), rows


def _partition_values(data: pa.Table) -> np.ndarray | None:
    """Each row's partition (int64), checked as ``partition_groups`` documents; None when
    no row names one (no ``partition`` column, or only nulls, or no rows)."""
    if "partition" not in data.column_names:
        return None
    column = data.column("partition")
    if column.null_count == data.num_rows:
        return None
    if column.null_count:
        raise InvalidParameterValueError("partition must be given for every row or for none")
    try:
        values = pc.cast(column, pa.int64()).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise InvalidParameterValueError(f'column "partition": {error}') from None
    if values.min() < 0:
        raise NumericValueOutOfRangeError(
            f'column "partition": {values.min()} is out of range (0 to {2**63 - 1})')
    return values


class PartitionGroups:
    """``rows`` grouped by ``values`` (each row's partition), without copying them: one
    stable sort of the row numbers by partition, cut where the partition changes (a
    filter per partition cost P passes over all rows). A group is taken (copied) only
    when asked for, its rows in their order in ``rows``: the same rows as a filter. A
    ``rows`` of many chunks is joined into one at the first group taken (once, not at
    every take: ``rows_of``).

    Invariant: ``partitions`` ascending and distinct; ``_bounds[i]:_bounds[i + 1]`` are
    the positions in ``_order`` of the rows of ``partitions[i]``."""

    __slots__ = ("_bounds", "_joined", "_order", "partitions", "rows")

    def __init__(self, rows: pa.Table, values: np.ndarray) -> None:
        assert len(values) == rows.num_rows > 0
        self.rows = rows
        self._joined: pa.Table | None = None  # ``rows`` in one chunk, at the first group taken
        self._order = np.argsort(values, kind="stable")
        self.partitions, starts = np.unique(values[self._order], return_index=True)
        self._bounds = np.append(starts, len(values))

    def rows_of(self, partition: int) -> pa.Table | None:
        """The rows of ``partition`` (None if it has none); all of ``rows`` when every row
        is of it (no copy)."""
        index = int(np.searchsorted(self.partitions, partition))
        if index == len(self.partitions) or self.partitions[index] != partition:
            return None
        if len(self.partitions) == 1:
            return self.rows
        positions = self._order[self._bounds[index]:self._bounds[index + 1]]
        if self._joined is None:
            # A ``take`` over a table of many chunks joins all of them first, a copy of
            # the whole table into fresh memory at every call (pyarrow 26: ~9 ms to take
            # 1,000 rows of a 16-chunk 160 MB table, 0.08 ms from one chunk): a staged
            # file's table is memory-mapped in many chunks and a group is taken for each
            # partition, so that was a copy of the whole file per partition. Joined once
            # here (as much memory as one of those copies, kept while the groups are
            # taken), each group is one take of its own rows.
            self._joined = self.rows.combine_chunks()
        return self._joined.take(pa.array(positions)).combine_chunks()


def by_reference(data: pa.Table) -> bool:
    """Whether ``data``'s rows can be committed by reference: every row names its partition."""
    return (
        data.num_rows > 0
        and "partition" in data.column_names
        and data.column("partition").null_count == 0
    )


def wire_batch(rows: pa.Table, at_us: int) -> pa.RecordBatch:
    """One partition group's wire batch, built as at commit (clock stopped at ``at_us``)."""
    batches = [b for _, b in build_batches(rows, {}, ManualClock(at_us)) if b.num_rows]
    assert batches, "a group has rows"
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


class Derivation:
    """Derives references' batches (``derive``) for one recovery, reading and checking each
    distinct file list once: every reference of a write names all of its files (one per
    partition the write spans), so deriving each alone read and checksummed all of the
    write's files, and grouped their rows, once per partition (P x the write's bytes).

    Each file list's rows stay memory-mapped, grouped (``PartitionGroups``: the row
    numbers sorted by partition), until ``clear`` (the caller's scope: one commit record,
    whose writes' files are all needed for its shares); a group is copied when derived.
    The batches are those ``derive`` alone gives (the same pure function of reference
    and files)."""

    __slots__ = ("_groups", "root")

    def __init__(self, root: str) -> None:
        self.root = root
        self._groups: dict[tuple, PartitionGroups | None] = {}

    def derive(self, reference: Reference) -> pa.RecordBatch:
        """The batch a reference names, verified (recovery's side of ``wire_batch``)."""
        key = tuple(tuple(entry) for entry in reference["files"])
        if key not in self._groups:
            data = read_files(self.root, reference["files"], check=True)
            values = _partition_values(data)
            self._groups[key] = (
                None if values is None
                else PartitionGroups(data.drop_columns(["partition"]), values))  # fmt: skip
        groups = self._groups[key]
        rows = None if groups is None else groups.rows_of(reference["partition"])
        if rows is None:
            raise CorruptSegmentError(
                "a committed bulk write's files hold no row of partition "
                f"{reference['partition']}",
                path=os.path.join(self.root, reference["files"][0][0]), position=0)  # fmt: skip
        return wire_batch(rows, reference["at"])

    def derive_all(self, references: list[Reference]) -> pa.RecordBatch:
        """A partition's share: its references' batches, concatenated in order."""
        batches = [self.derive(reference) for reference in references]
        return batches[0] if len(batches) == 1 else pa.concat_batches(batches)

    def clear(self) -> None:
        """Forget the files read (unmapped once their groups are no longer referenced)."""
        self._groups.clear()


def derive(root: str, reference: Reference) -> pa.RecordBatch:
    """The batch a reference names, verified (one reference alone: ``Derivation``)."""
    return Derivation(root).derive(reference)


def derive_all(root: str, references: list[Reference]) -> pa.RecordBatch:
    """A partition's share: its references' batches, concatenated in order."""
    return Derivation(root).derive_all(references)


def release(root: str, references: list[Reference]) -> None:
    """Delete the write directories the references name (idempotent: once the
    transaction's partitions are durable and its record is gone)."""
    dirs = sorted({d for reference in references for d in reference["dirs"]})
    for index, relative in enumerate(dirs):
        if index == 1:
            failpoints.hit("bulk.mid_release")
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(os.path.join(root, relative))


class ReferencedWrite(PendingWrite):
    """A topic write of an open transaction whose rows are on disk already (``reference``):
    counted against the staged-bytes cap at ``place`` without a spill copy; the commit
    records the reference instead of staging the batch (``engine.commit``)."""

    __slots__ = ("reference",)

    def __init__(self, topic_id: str, batch: pa.RecordBatch, partition: int,
                 reference: Reference) -> None:  # fmt: skip
        super().__init__(topic_id, batch, partition)
        self.reference = reference

    def place(self, staging: TransactionStaging) -> None:
        staging.count(self.nbytes)


# -- writes staged as frames (``storage.staged_frames``) ---------------------------------
# A topic stream is staged as frames while its batches' rows all name their partition and
# use no column but these (its frames are then never deduplicated, record no producer
# state, are cut freely and are raw); the columns of ``_NULL_ONLY`` may be there, null in
# every row (Spark's writer sends every write column). Any other batch, and the rest of
# its stream, is staged as it came.
FRAMED_COLUMNS = frozenset({"data", "partition", "seq_no", "created_at"})
_NULL_ONLY = frozenset({"producer_id", "message_group_id", "metadata", "codec"})
_FRAMED_PIECE_ROWS = 65_536  # an incoming batch is framed in pieces of at most this


def framed_batch(batch: pa.RecordBatch) -> bool:
    """Whether ``batch`` (rows of a topic stream) can be staged as frames (see above)."""
    names = batch.schema.names
    if "partition" not in names or "data" not in names:
        return False
    for name, column in zip(names, batch.columns, strict=True):
        if name not in FRAMED_COLUMNS and not (
                name in _NULL_ONLY and column.null_count == len(column)):  # fmt: skip
            return False
    return batch.column(names.index("partition")).null_count == 0


def framed_groups(batch: pa.RecordBatch, clock) -> Iterator[tuple[int, pa.RecordBatch]]:
    """An incoming batch of a framed stream as wire batches per partition (ascending),
    each in the rows' order: ``build_batches`` (at the staging clock: rows without
    ``created_at`` get the staging time) then one stable sort by partition. Refuses, as
    the commit would, a partition missing for some rows (22023) or negative (22003)."""
    for start in range(0, batch.num_rows, _FRAMED_PIECE_ROWS):
        piece = batch.slice(start, _FRAMED_PIECE_ROWS)
        table = pa.Table.from_batches([piece]).select(
            [name for name in piece.schema.names if name in FRAMED_COLUMNS])
        values = _partition_values(table)
        if values is None:
            raise InvalidParameterValueError(
                "partition must be given for every row or for none")
        ((_, wire),) = build_batches(table.drop_columns(["partition"]), {}, clock)
        groups = PartitionGroups(pa.Table.from_batches([wire]), values)
        for partition in groups.partitions:
            rows = groups.rows_of(int(partition))
            assert rows is not None
            yield int(partition), rows.combine_chunks().to_batches()[0]


def check_incoming_frame(frame: IncomingFrame, body: pa.Buffer, zstd: bool = False,
                         raw: bool = True) -> None:  # fmt: skip
    """A client's staged frame checked as ``staged_frames.check_incoming`` does (22P04,
    54000; zstd messages where ``zstd``, the topic accepting zstd: 22P03 unless each
    decodes), and its values as ``build_batches`` bounds a write's: ``seq_no`` not
    negative (22003), ``created_at`` given for every message and within years 1-9999
    (22008). The values are checked inside ``check_incoming`` (``then``): a
    column-compressed frame's decoded batch stays counted among the checks in flight
    until every check is done, and is dropped then."""
    check_incoming(frame, body, zstd, raw, then=_check_values)


def _check_values(batch: pa.RecordBatch) -> None:
    """``check_incoming_frame``'s checks of a decoded frame's values."""
    _non_negative(batch.column(0), "seq_no")
    created = batch.column(3)
    if created.null_count:
        raise BadStagedFrameError("a staged frame holds a message without created_at")
    _readable_instants(created)


class FramedRows:
    """A framed write's rows as ``engine.bulk_publish`` counts them (``num_rows``,
    ``nbytes``) without reading them; ``table`` decodes them (a copy) for the paths that
    need the rows: a commit in parts."""

    __slots__ = ("files", "frames", "fs", "nbytes", "num_rows")

    def __init__(self, fs: FileSystem, files: list[str],
                 frames: dict[int, list[StagedFrame]]) -> None:  # fmt: skip
        self.fs = fs
        self.files = files
        self.frames = frames
        self.num_rows = sum(f.record_count for share in frames.values() for f in share)
        self.nbytes = sum(f.body_bytes for share in frames.values() for f in share)

    def table(self) -> pa.Table:
        """The rows with their ``partition`` column, partition by partition."""
        return framed_table(self.fs, self.frames)


def index_framed(fs: FileSystem, paths: list[str]) -> dict[int, list[StagedFrame]]:
    """The frames of whole frames files per partition: each partition's frames in file
    order then frame order (its rows' order)."""
    frames: dict[int, list[StagedFrame]] = {}
    for path in paths:
        for partition, found in index_file(fs, path, os.path.getsize(path)).items():
            frames.setdefault(partition, []).extend(found)
    return dict(sorted(frames.items()))


def framed_table(fs: FileSystem, frames: dict[int, list[StagedFrame]]) -> pa.Table:
    """Frames decoded into a table of the ``FRAMED_COLUMNS`` (the others of
    ``WIRE_SCHEMA`` are null or raw in a frame: their defaults), ``partition`` last."""
    pieces = []
    for partition, share in frames.items():
        batch = decode_frames(fs, share).select(["seq_no", "created_at", "data"])
        pieces.append(pa.Table.from_batches([batch]).append_column(
            "partition", pa.array(np.full(batch.num_rows, partition, dtype=np.int64))))
    if not pieces:
        return pa.table({})
    return pa.concat_tables(pieces)


class FramedWrite(PendingWrite):
    """A topic write of an open transaction staged as frames (``storage.staged_frames``):
    its share of one partition (never spilled, never in memory); the commit records
    ``reference`` and publishes ``frames`` by copying them (``engine.commit``). ``batch``
    decodes them, for a transaction that must mix them with rows of another kind in one
    partition. Not counted against the open transactions' staged-bytes cap (``place``):
    the files are on disk already, charged to the bulk staging cap until the checkpoint
    deletes them (``BulkWrites._hold``), and hold no memory; counted there, a commit
    finding the cap taken by other sessions would go in parts (not atomic)."""

    __slots__ = ("_fs", "frames", "reference")

    def __init__(self, topic_id: str, partition: int, frames: list[StagedFrame],
                 reference: Reference, fs: FileSystem) -> None:  # fmt: skip
        self.topic_id = topic_id
        self.partition = partition
        self.nbytes = sum(frame.body_bytes for frame in frames)
        self._batch = None
        self._spilled = None
        self._staging = None
        self._fs = fs
        self.frames = frames
        self.reference = reference

    @property
    def batch(self) -> pa.RecordBatch:
        return decode_frames(self._fs, self.frames)

    def place(self, staging: TransactionStaging) -> None:
        """Nothing to stage nor to count (see the class doc)."""


class StagedHere:
    """The own frames files one ``BulkWrites`` staged and dropped behind its writeback
    (``staged_frames.DropBehind``, round 20), remembered by identity so that its commit
    need not read them back (``vouches``).

    What the commit proves before its commit point (``check_frames_file``, round 15)
    changes for these files only: their bytes are those this process wrote and whose
    CRC-32C it computed as it wrote them (the CRC-32C in their names), provided the file is
    the one it staged (device, inode), of the size that CRC-32C covers (the writer's
    count), its modification and change times as at the seal: no write, ``utime``
    (which cannot set the change time), chmod or link since. Every dropped range's
    writeback was waited for and found without error before it was dropped
    (``DropBehind``); the fdatasync of the commit reports a later one. Reading them back
    would read the dropped pages from the disk: a GB of reads for a 1M x 1 KiB write.

    A vouch is used once (``vouches`` forgets the file): a commit that fails after its
    check (an fdatasync's EIO, any error before the commit point) leaves its retry to read
    every file back, since the error, once reported, is not reported again. A write
    aborted or collected forgets its files (``forget``).

    Not refused before the commit (recovery's check after a restart still refuses it,
    and readers check every frame's CRC-32C): a file damaged behind the server's back with
    both its times unchanged (on a kernel with multigrain timestamps, 6.13 on, no change
    after ``remember``'s stat keeps them; on older ones, one within the same clock tick,
    1-10 ms), or a disk error in a page that was not dropped (the last
    ``DROP_BEHIND_KEEP_BYTES`` and the header pages) whose report is lost with the inode
    evicted before the commit's fdatasync. Not vouched for, and so read back whole as
    before: a file this process did not stage (a restart, recovery: a new ``BulkWrites``
    remembers nothing), a file none of whose pages were dropped (cached: its read-back is
    cheap; no ``posix_fadvise``), one dropped without a checked wait
    (``DropBehind.vouchable``), one forgotten (``limits.STAGED_HERE_FILES_MAX``, used or
    aborted), or one whose identity, size or times differ."""

    def __init__(self) -> None:
        self._files = BoundedCache("engine.staged_refs.StagedHere", limits.STAGED_HERE_FILES_MAX,
                                   limits.STAGED_HERE_FILES_MAX * ENTRY_BYTES)  # fmt: skip

    def remember(self, files: list[tuple[str, int]]) -> None:
        """``files``: own frames files just sealed by this process (named with their
        CRC-32C: ``staged_frames.OWN_FILE``) and the bytes that CRC-32C covers."""
        for path, size in files:
            assert own_file(path) is not None, path
            found = os.stat(path)
            assert found.st_size == size, (path, found.st_size, size)
            crc = int(os.path.basename(path).split(".")[2], 16)
            self._files.put((found.st_dev, found.st_ino),
                            (size, crc, found.st_mtime_ns, found.st_ctime_ns), 0)  # fmt: skip

    def vouches(self, path: str, size: int, crc: int) -> bool:
        """Whether ``path`` is a file remembered here, ``size`` bytes with CRC-32C ``crc``
        as staged and unchanged since (see the class doc). Forgets it: used once."""
        try:
            found = os.stat(path)
        except FileNotFoundError:
            return False
        kept = self._files.pop((found.st_dev, found.st_ino))
        return kept is not None and kept == (size, crc, found.st_mtime_ns, found.st_ctime_ns) == (
            found.st_size, crc, found.st_mtime_ns, found.st_ctime_ns)  # fmt: skip

    def forget(self, directory: str) -> None:
        """Forget the files in ``directory`` (a write about to be deleted)."""
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(directory):
                with contextlib.suppress(FileNotFoundError):
                    found = os.stat(os.path.join(directory, name))
                    self._files.pop((found.st_dev, found.st_ino))

    def __len__(self) -> int:
        return len(self._files)


def check_frames_file(fs: FileSystem, path: str, size: int, crc: int, what: str) -> None:
    """Raise ``CorruptSegmentError`` (XX001) unless the frames file at ``path`` is ``size``
    bytes whose CRC-32C is ``crc`` (read whole: the commit, before its commit point, and
    recovery)."""
    found = os.path.getsize(path) if os.path.exists(path) else -1
    if found != size or file_crc(fs, path, size) != crc:
        raise CorruptSegmentError(
            f"a {what} bulk write's frames file is damaged ({found} bytes, {size} "
            f"{what})", path=path, position=0)  # fmt: skip


def framed_reference_frames(root: str, fs: FileSystem, references: list[Reference],
                            checked: dict[tuple, dict[int, list[StagedFrame]]],
                            ) -> list[StagedFrame]:  # fmt: skip
    """Recovery: a framed share's frames from its references (each names the files and
    the partition). Each distinct file list is checked (sizes, CRC-32Cs: a damaged file
    raises ``CorruptSegmentError``) and indexed once, kept in ``checked``."""
    frames: list[StagedFrame] = []
    for reference in references:
        key = tuple(tuple(entry) for entry in reference["frames"])
        if key not in checked:
            checked[key] = _recovered_frames(root, fs, reference["frames"])
        share = checked[key].get(reference["partition"])
        if not share:
            raise CorruptSegmentError(
                "a committed bulk write's frames hold no row of partition "
                f"{reference['partition']}",
                path=os.path.join(root, reference["frames"][0][0]), position=0)  # fmt: skip
        frames.extend(share)
    return frames


def _recovered_frames(root: str, fs: FileSystem, entries: list[list]
                      ) -> dict[int, list[StagedFrame]]:  # fmt: skip
    """Recovery's ``index_framed`` of a record's frames files, each checked (sizes,
    CRC-32Cs). An own file (``staged_frames.own_file``) may have been adopted by a
    partition: gone (renamed into it), its frames are one placeholder of its rows
    (``StagedFrame.body_position`` -1: the partition must hold them, else its publish
    raises ``CorruptSegmentError``); still here with headers patched (a crash between the
    patch and the rename, some headers perhaps torn by a power cut), its staged bytes are
    rebuilt and checked against the record's CRC-32C (``check_own_file``)."""
    frames: dict[int, list[StagedFrame]] = {}
    for relative, size, crc in entries:
        path = os.path.join(root, relative)
        named = own_file(path)
        if named is not None and not os.path.exists(path):
            partition, rows = named
            frames.setdefault(partition, []).append(StagedFrame(path, -1, rows, 0, 0))
            continue
        try:
            check_frames_file(fs, path, size, crc, "committed")
        except CorruptSegmentError:
            if named is None or os.path.getsize(path) != size:
                raise
            frames.setdefault(named[0], []).extend(check_own_file(fs, path, size, crc))
            continue
        for partition, found in index_file(fs, path, size).items():
            frames.setdefault(partition, []).extend(found)
    return dict(sorted(frames.items()))
