"""Bulk writes staged on disk and published exactly once: the engine side of the Flight
door's ``stage`` action (and of ``COPY ... WRITE_ID``).

A *write* is a set of Arrow record batches for one target (a topic or a table), owned by
the user who started it and named by a client-chosen *write id*. Its batches are staged
as Arrow IPC stream files under ``<data>/bulk_writes/<write id>/`` — not in memory, so a
write is bounded by the staging disk cap (``staging_bytes_max``), not by the in-memory
transaction limit. ``commit`` publishes a set of writes atomically, in one transaction of
the caller's session, together with an idempotency record ``(sink id, batch id)`` in the
catalog schema (``engine.bulk_publish``, which also says how a batch over a transaction's
per-partition limit goes in parts): a commit whose record exists already publishes
nothing and reports ``duplicate`` (a replay after a crash, or a second driver). Two
concurrent commits of the same record cannot both succeed: the record's primary key fails
the second at COMMIT.

Layout and invariants:
- ``<write id>/write.json`` names the target and owner; it is written first, so a
  directory without it is a write that never started (collected like an abandoned one).
- a batch file is written as ``*.part`` and renamed to ``<name>.<crc32c>.arrows`` once
  whole (its CRC-32C, taken then, is what a commit by reference records; the kernel is
  asked then to start writing it back, so the commit's sync finds little left to do);
  only ``.arrows`` files are published, so a writer killed mid-stream leaves nothing
  that a commit could pick up.
- a write's directory is deleted after its commit (or duplicate), its abort, or when it
  has not been touched for ``abandon_after_s`` (``collect``).
- privileges: starting or adding to a write needs INSERT on the target; the commit's
  table inserts run as SQL statements of the session (planned and checked as any
  statement), topic writes are checked again with ``privileges.require``.
- a sink belongs to the user whose commit first recorded it (``engine.bulk_publish``):
  a commit, duplicate check or ``last_batch`` of another user's sink gets 42501.
- a write being committed takes no appends (55000): its files were read, and are
  deleted, by the commit; a write with an append in flight cannot start committing.
- a numbered *part* (the Flight door's ``stage`` action: part ``n`` of the client's
  ``stream``, one token per ``put``) is staged at most once: its files' names carry
  ``(stream, n)`` (``_staged_name``), and once all of them are whole an empty marker
  ``<stream><n>.done`` is created; the same part again stages nothing (``append``
  returns None) once the marker is there, and 55006 while another call stages it. A
  part's files without their marker (a process killed between a part's frames file and
  its rest file) are no part of the write: commits skip them, a retry of the part
  deletes them first. A
  write started with a schema (``start(schema=...)``) records it in ``write.json``, and
  every later ``start`` naming a schema must name an equal one (42804).
Thread-safety: the staged-bytes counter, the directory set and the committing/appending
marks are guarded by a lock; a write id may be appended to by several streams at once
(each stream has its own file).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from engine import bulk_publish, privileges, staged_refs, tables
from engine.bulk_publish import IDEMPOTENCY_DDL, IDEMPOTENCY_TABLE
from engine.staged_refs import FramedWrite, ReferencedWrite, partition_groups
from engine.transaction import PendingWrite
from engine.writes import build_batches
from storage import failpoints, limits
from storage.codecs import Codec
from storage.errors import (
    DatatypeMismatchError,
    DuplicateColumnError,
    InsufficientPrivilegeError,
    InvalidParameterValueError,
    LimitExceededError,
    ObjectInUseError,
    ObjectNotInPrerequisiteStateError,
    SerializationFailure,
    TopicbaseError,
    UndefinedObjectError,
    UndefinedTopicError,
)
from storage.record_batch import HEADER_BYTES
from storage.staged_frames import FrameFileWriter, own_file, own_file_sealed, read_incoming

WRITES_DIRECTORY = "bulk_writes"
COMMITS_DIRECTORY = "bulk_commits"  # writes moved out for a commit by reference
MANIFEST = "commit.json"
FRAMES_SUFFIX = ".frames"  # a staged file of frames (``storage.staged_frames``)
STAGED_SUFFIXES = (".arrows", FRAMES_SUFFIX)  # whole staged files
ABANDON_AFTER_S_DEFAULT = 3600.0
WRITE_MODES = ("append", "upsert", "add")  # under storage.limits.BATCH_MESSAGES_MAX
_STREAM = re.compile(r"[0-9a-f]{32}")  # a put's stream token
DONE_SUFFIX = ".done"  # a numbered part's marker: all its files are whole
_WRITE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True)
class WriteInfo:
    write_id: str
    kind: str  # "topic" or "table"
    name: str
    owner: str
    files: int
    bytes: int
    idle_s: float


def check_write_id(write_id: str) -> str:
    if not isinstance(write_id, str) or not _WRITE_ID.fullmatch(write_id):
        raise InvalidParameterValueError(
            f"write id {write_id!r} must be 1-128 letters, digits, '_', '.' or '-'"
        )
    return write_id


class BulkWrites:
    """The staged writes of one database (one per database: see ``for_database``)."""

    def __init__(self, database: Any,
                 staging_bytes_max: int = limits.BULK_STAGING_BYTES_MAX_DEFAULT,
                 abandon_after_s: float = ABANDON_AFTER_S_DEFAULT) -> None:  # fmt: skip
        self.database = database
        self.root = os.path.join(database.path, WRITES_DIRECTORY)
        self.staging_bytes_max = staging_bytes_max
        self.abandon_after_s = abandon_after_s
        self._lock = threading.Lock()
        # Writes being committed, and appends in flight per write (under ``_lock``): a
        # write is never appended to while it is committed (the rows would be lost).
        self._committing: set[str] = set()
        self._appending: dict[str, int] = {}
        # (write id, stream, part) being staged
        self._parts_in_flight: set[tuple[str, str, int]] = set()
        # (owner, prefix) -> wall time of an abort of ``prefix*`` (``abort``), oldest first
        self._aborted_prefixes: dict[tuple[str, str], float] = {}
        # A commit by reference holds its partitions' batches in memory from their
        # derivation to the publish (none are spilled): as many at once as spilled
        # commits may read back (``limits.SPILLED_COMMITS_MAX``), the others wait.
        self._by_reference_turns = threading.BoundedSemaphore(limits.SPILLED_COMMITS_MAX)
        self.commits_root = os.path.join(database.path, COMMITS_DIRECTORY)
        # Committed writes' files (a commit directory's bytes, by directory) stay on disk
        # until the checkpoint that makes their partitions durable deletes them
        # (``Committer._release_references``): they stay charged to the staging cap until
        # then (``_hold``; ``_prune_held`` gives back those gone), so the cap bounds them.
        self._held: dict[str, int] = {}
        # Own frames files staged here whose pages were dropped behind: the commit does
        # not read them back from the disk (round 20; a new instance, after a restart,
        # remembers none and reads every file back).
        self._staged_here = staged_refs.StagedHere()
        os.makedirs(self.root, exist_ok=True)
        os.makedirs(self.commits_root, exist_ok=True)
        cursor = database.root.cursor()
        try:
            tables.run(cursor, IDEMPOTENCY_DDL)
            self._settle_commits(cursor)
        finally:
            cursor.close()
        self._staged_bytes = sum(w.bytes for w in self._scan())

    # -- staging ------------------------------------------------------------------------
    def start(self, session: Any, write_id: str, kind: str, name: str,
              mode: str = "append", key: tuple[str, ...] = (),
              schema: pa.Schema | None = None, create: bool = True) -> bool:  # fmt: skip
        """Create write ``write_id`` for the target, or check an existing one matches;
        True when it was created. Without ``create`` a missing write is 42704 (a later
        part of a write that was aborted or committed meanwhile: nothing re-creates it).

        With ``schema``: a new write records it; an existing write that recorded one
        refuses another (42804), one that recorded none records it now.

        ``mode`` says how table rows are published: ``append`` (INSERT), ``upsert``
        (rows replace those with the same ``key``; of a key's rows in one commit, the last
        wins: ``bulk_publish.table_insert`` defines the order) or ``add``
        (rows are summed by ``key``, then added to the existing row's other columns): the
        fold of a stream into a table of totals. Topics take ``append`` only.
        """
        check_write_id(write_id)
        _check_target(session, kind, name)
        if mode not in WRITE_MODES or (mode != "append" and (kind != "table" or not key)):
            raise InvalidParameterValueError(
                f"write mode {mode!r}: append, or upsert/add to a table with a key")
        directory = os.path.join(self.root, write_id)
        meta_path = os.path.join(directory, "write.json")
        owner = session.identity.name
        with self._lock:
            if os.path.exists(meta_path):
                meta = _read_meta(meta_path)
                if (meta["kind"], meta["name"]) != (kind, name):
                    raise InvalidParameterValueError(
                        f"write {write_id} targets {meta['kind']} {meta['name']}, "
                        f"not {kind} {name}"
                    )
                if meta["owner"] != owner:
                    raise InsufficientPrivilegeError(f"write {write_id} belongs to another user")
                if schema is not None:
                    if meta.get("schema") is None:
                        _write_meta(meta_path, {**meta, "schema": _schema_text(schema)})
                    elif not _schema_of(meta["schema"]).equals(schema):
                        raise DatatypeMismatchError(
                            f"write {write_id} was started with the schema "
                            f"({_schema_of(meta['schema']).to_string(show_schema_metadata=False)})"
                            f", not ({schema.to_string(show_schema_metadata=False)}): "
                            "every part of a write has the same schema")  # fmt: skip
                return False
            if not create:
                raise UndefinedObjectError(
                    f"no staged write {write_id}: it was committed or aborted (or its first "
                    "part was never staged)")  # fmt: skip
            closed = self._closed_prefix(owner, write_id)
            if closed is not None:
                raise UndefinedObjectError(f"write {write_id}: the writes {closed}* were "
                                           "aborted (its job failed)")  # fmt: skip
            os.makedirs(directory, exist_ok=True)
            meta = {"kind": kind, "name": name, "owner": owner, "mode": mode, "key": list(key)}
            if schema is not None:
                meta["schema"] = _schema_text(schema)
            _write_meta(meta_path, meta)
            return True

    def append(self, session: Any, write_id: str, batches: Iterable[pa.RecordBatch],
               schema: pa.Schema, part: int | None = None, stream: str | None = None
               ) -> int | None:  # fmt: skip
        """Stage ``batches`` as one file of write ``write_id``; returns the rows staged.

        Past the staging disk cap the file is deleted and 54000 raised; a schema naming
        a column twice is refused (42701) before anything is staged. With ``part`` and
        ``stream`` (32 hex digits: a put's token; a retried call sends both again): None,
        reading nothing of ``batches``, when that part is staged whole already; 55006
        while another call stages it.
        """
        meta = self._meta(session, write_id)
        _check_target(session, meta["kind"], meta["name"])
        names = schema.names
        if len(set(names)) != len(names):
            twice = sorted({name for name in names if names.count(name) > 1})
            raise DuplicateColumnError(
                f"a bulk write's rows name column{'s' if len(twice) > 1 else ''} "
                f"{', '.join(repr(n) for n in twice)} more than once")
        if part is None:
            with self._adding(write_id):
                return self._append(write_id, batches, schema)
        if isinstance(part, bool) or not isinstance(part, int) or not (
            0 <= part < limits.STAGED_PARTS_MAX
        ):
            raise InvalidParameterValueError(
                f"a part number is 0 to {limits.STAGED_PARTS_MAX - 1}, not {part!r}"
            )
        if not isinstance(stream, str) or not _STREAM.fullmatch(stream):
            raise InvalidParameterValueError(f"a part's stream is 32 hex digits, not {stream!r}")
        key = f"{stream}{part:0{_PART_DIGITS}x}"
        with self._staging_part(write_id, key) as staged:
            if staged:
                return None
            with self._adding(write_id):
                rows = self._append(write_id, batches, schema, key)
                with open(os.path.join(self.root, write_id, key + DONE_SUFFIX), "wb"):
                    pass  # the part is whole: a retry is answered "duplicate"
                return rows

    def _closed_prefix(self, owner: str, write_id: str) -> str | None:
        """The prefix of ``write_id`` that ``owner`` aborted within ``abandon_after_s``
        (under ``_lock``)."""
        now = _wall_clock_s()
        for end in range(1, len(write_id) + 1):
            when = self._aborted_prefixes.get((owner, write_id[:end]))
            if when is not None and now - when < self.abandon_after_s:
                return write_id[:end]
        return None

    @contextlib.contextmanager
    def _staging_part(self, write_id: str, key: str) -> Iterator[bool]:
        """Part ``key`` (stream and number) of ``write_id`` marked in flight (55006 if it
        is already); yields whether it is staged whole already. Files of it without its
        marker (torn by a killed process) are deleted first, their bytes given back."""
        directory = os.path.join(self.root, write_id)
        with self._lock:
            if (write_id, key) in self._parts_in_flight:
                raise ObjectInUseError(f"part {int(key[32:], 16)} of write {write_id} is being "
                                       "staged by another call")  # fmt: skip
            staged = os.path.exists(os.path.join(directory, key + DONE_SUFFIX))
            self._parts_in_flight.add((write_id, key))
        try:
            if not staged:
                self._delete_torn(directory, key)
            yield staged
        finally:
            with self._lock:
                self._parts_in_flight.discard((write_id, key))

    def _delete_torn(self, directory: str, key: str) -> None:
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return
        for name in names:
            if _part_of(name) == key:
                path = os.path.join(directory, name)
                with contextlib.suppress(FileNotFoundError):
                    size = os.path.getsize(path)
                    os.remove(path)
                    if name.endswith((*STAGED_SUFFIXES, ".part")):
                        self._release(size)

    def append_frames(self, session: Any, write_id: str,
                      read: Callable[[int], bytes | bytearray | memoryview]) -> int:  # fmt: skip
        """Stage a client's stream of partition frames (``COPY TOPIC t FROM STDIN (FORMAT
        frames, WRITE_ID 'id')``, read with ``read(n)``: ``staged_frames.read_incoming``)
        as one frames file of topic
        write ``write_id``, each frame checked (``staged_refs.check_incoming_frame``) and
        written as it came; returns the messages staged. The first refused frame fails
        the whole stream: its file is deleted, nothing of it is staged."""
        meta = self._meta(session, write_id)
        _check_target(session, meta["kind"], meta["name"])
        if meta["kind"] != "topic":
            raise InvalidParameterValueError("staged frames are a topic's rows: write "
                                             f"{write_id} targets a table")  # fmt: skip
        entry = self.database.catalog.entry(meta["name"])
        if entry is None:
            raise UndefinedTopicError(f'topic "{meta["name"]}" does not exist')
        topic = self.database.topic_log(entry.topic_id)
        zstd = Codec.ZSTD in topic.config.supported_codecs  # client-compressed frames
        raw = Codec.RAW in topic.config.supported_codecs  # else raw frames are refused now
        with self._adding(write_id):
            base = os.path.join(self.root, write_id, _staged_name())
            writer = FrameFileWriter(self.database.store.fs, base + ".part",
                                     own_files=limits.ADOPT_FILES_MAX)  # fmt: skip
            reserved = 0
            known: set[int] = set()
            try:
                for frame, body in read_incoming(read):
                    if frame.partition not in known:
                        topic.partition(frame.partition)  # 22023 if the topic has none
                        known.add(frame.partition)
                    staged_refs.check_incoming_frame(frame, body, zstd, raw)
                    # At most a segment header and the body (an own file's frame); a
                    # frame of the shared file takes less: the rest is given back, so
                    # the cap is charged what is on disk (review R2-A1 of round 14).
                    self._reserve(HEADER_BYTES + frame.body_bytes)
                    reserved += HEADER_BYTES + frame.body_bytes
                    writer.add_checked(frame, body)
                    if reserved > writer.size:
                        self._release(reserved - writer.size)
                        reserved = writer.size
                if writer.rows:
                    writer.seal(base, FRAMES_SUFFIX)  # synced by the commit that names it
                    self._staged_here.remember(writer.dropped_behind)
                else:  # an empty stream stages nothing
                    writer.close()
                    os.remove(base + ".part")
            except BaseException:
                self._drop_part(base, reserved, writer)
                raise
            return writer.rows

    @contextlib.contextmanager
    def _adding(self, write_id: str) -> Iterator[None]:
        """An append in flight to ``write_id`` (none may start while it is committed)."""
        with self._lock:
            if write_id in self._committing:
                raise ObjectNotInPrerequisiteStateError(
                    f"write {write_id} is being committed: no rows can be added to it now")
            self._appending[write_id] = self._appending.get(write_id, 0) + 1
        failed = True
        try:
            yield
            failed = False
        except FileNotFoundError as error:
            if os.path.exists(os.path.join(self.root, write_id, "write.json")):
                raise
            raise UndefinedObjectError(f"write {write_id} was aborted while rows were being "
                                       "added to it: nothing of them is staged") from error
        finally:
            with self._lock:
                self._appending[write_id] -= 1
                if not self._appending[write_id]:
                    del self._appending[write_id]
            if failed:
                self.drop_if_empty(write_id)

    def drop_if_empty(self, write_id: str) -> None:
        """After a failed append or COPY: the write is removed when nothing of it is staged
        and no other append is adding to it (its stream was its only one). A Spark task killed as
        its job failed may have started its write just after the driver's abort swept the
        job's ids; its COPY then fails, and an empty write would wait for the collector
        (an hour) although nothing of it can ever be committed. A write with staged files
        (an earlier COPY's) stays, as before."""
        directory = os.path.join(self.root, write_id)
        with self._lock:
            if write_id in self._appending or write_id in self._committing:
                return
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                return  # aborted or committed meanwhile
            if any(name != "write.json" for name in names):
                return  # staged files (or a stream's ``.part`` being deleted): kept
            discarded = os.path.join(self.commits_root, f"aborted-{uuid.uuid4().hex}")
            try:  # renamed out at once, as ``abort`` does; deleted outside the lock
                os.rename(directory, discarded)
            except FileNotFoundError:
                return
        shutil.rmtree(discarded, ignore_errors=True)

    def _append(self, write_id: str, batches: Iterable[pa.RecordBatch],
                schema: pa.Schema, key: str | None = None) -> int:  # fmt: skip
        base = os.path.join(self.root, write_id, _staged_name(key))
        batches = iter(batches)
        if self._meta_of(write_id)["kind"] == "topic":
            first = next((b for b in batches if b.num_rows), None)
            batches = itertools.chain([] if first is None else [first], batches)
            if first is not None and staged_refs.framed_batch(first):
                rows, rest, framed = self._append_framed(base, batches)
                if rest is None:
                    return rows
                # A batch the frames cannot hold: the rest of the stream as it came, in a
                # file named to sort right after the frames file (the stream's order).
                try:
                    return rows + self._append_arrows(base + "~", rest, schema)
                except BaseException:
                    for path in [framed, *_own_files_of(base)]:  # the COPY's frames
                        size = os.path.getsize(path)
                        os.remove(path)
                        self._release(size)
                    raise
        return self._append_arrows(base, batches, schema)

    def _append_arrows(self, base: str, batches: Iterable[pa.RecordBatch],
                       schema: pa.Schema) -> int:  # fmt: skip
        """Stage the batches as they came: one Arrow IPC stream file."""
        rows = written = 0
        try:
            with pa.OSFile(base + ".part", "wb") as sink, pa.ipc.new_stream(sink, schema) as out:
                for batch in batches:
                    out.write_batch(batch)
                    rows += batch.num_rows
                    grown = sink.tell() - written
                    written += grown
                    self._reserve(grown)
            self._reserve(os.path.getsize(base + ".part") - written)
            written = os.path.getsize(base + ".part")
            checksum = staged_refs.seal_file(base + ".part", self.database.store.fs)
            os.replace(base + ".part", f"{base}.{checksum:08x}.arrows")
        except BaseException:
            self._drop_part(base, written)
            raise
        return rows

    def _append_framed(self, base: str, batches: Iterator[pa.RecordBatch]
                       ) -> tuple[int, Iterator[pa.RecordBatch] | None, str]:  # fmt: skip
        """Stage a topic stream whose rows name their partition as a frames file
        (``storage.staged_frames``): the rows grouped by partition and encoded as the
        partitions' frames now, so that the commit copies them as they are. The file is
        renamed ``<name>.<crc32c>.frames`` when whole (fdatasynced by the commit that
        names it, as the Arrow files are). Stops at the first batch that frames cannot hold
        (``staged_refs.framed_batch``): returns the rows framed, the rest of the stream
        from that batch on (None: none) and the frames file's path."""
        writer = FrameFileWriter(self.database.store.fs, base + ".part",
                                 own_files=limits.ADOPT_FILES_MAX)  # fmt: skip
        rows = reserved = 0
        rest: Iterator[pa.RecordBatch] | None = None
        try:
            for batch in batches:
                if not batch.num_rows:
                    continue
                if not staged_refs.framed_batch(batch):
                    rest = itertools.chain([batch], batches)
                    break
                for partition, wire in staged_refs.framed_groups(batch, self.database.clock):
                    writer.add(partition, wire)
                rows += batch.num_rows
                self._reserve(writer.size - reserved)
                reserved = writer.size
            # synced by the commit that names it; the shared file is renamed last
            path = writer.seal(base, FRAMES_SUFFIX)[-1]
            self._staged_here.remember(writer.dropped_behind)
            self._reserve(writer.size - reserved)
            reserved = writer.size
        except BaseException:
            self._drop_part(base, reserved, writer)
            raise
        return rows, rest, path

    def _drop_part(self, base: str, reserved: int,
                   writer: FrameFileWriter | None = None) -> None:  # fmt: skip
        """Undo an append that failed: close its frames ``writer`` (if any), delete its
        half-written ``base.part`` (if it exists) and give back the ``reserved`` bytes."""
        if writer is not None:
            writer.discard()  # its own files, sealed or not
            for path in _own_files_of(base):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
        with contextlib.suppress(FileNotFoundError):
            os.remove(base + ".part")
        self._release(reserved)

    def _meta_of(self, write_id: str) -> dict[str, str]:
        return _read_meta(os.path.join(self.root, write_id, "write.json"))

    def _reserve(self, grown: int) -> None:
        """Charge ``grown`` bytes to the staging cap; 54000 past it. When committed
        writes' files still count (``_held``), a checkpoint is run first (it deletes
        those of published transactions), then the cap is checked again."""
        for attempt in range(2):
            with self._lock:
                if self._staged_bytes + grown <= self.staging_bytes_max:
                    self._staged_bytes += grown
                    return
                held = bool(self._held)
            if attempt or not held:
                break
            self._prune_held()
            with self._lock:
                still = self._staged_bytes + grown > self.staging_bytes_max and self._held
            if still:
                with contextlib.suppress(TopicbaseError):  # then 54000 below
                    self.database.committer.checkpoint()
                self._prune_held()
        raise LimitExceededError(
            f"staged bulk writes would exceed the staging cap of "
            f"{self.staging_bytes_max} bytes; commit or abort writes first"
        )

    def _hold(self, directory: str, size: int) -> None:
        """A commit directory handed to the committer: its ``size`` bytes stay charged
        to the staging cap until the directory is deleted."""
        with self._lock:
            self._held[directory] = self._held.get(directory, 0) + size
            self._staged_bytes += size

    def _prune_held(self) -> None:
        """Give back the bytes of commit directories deleted since (by the checkpoint)."""
        with self._lock:
            gone = [d for d in self._held if not os.path.isdir(d)]
            for directory in gone:
                self._staged_bytes = max(0, self._staged_bytes - self._held.pop(directory))

    def _release(self, size: int) -> None:
        with self._lock:
            self._staged_bytes = max(0, self._staged_bytes - size)

    @property
    def staged_bytes(self) -> int:
        """Bytes charged to the staging cap: staged writes, and committed writes' files
        not deleted yet."""
        self._prune_held()
        with self._lock:
            return self._staged_bytes

    # -- listing, abort, collection -----------------------------------------------------
    def list(self, session: Any) -> list[WriteInfo]:
        """The staged writes this session's user may see (a superuser sees all)."""
        identity = session.identity
        return [w for w in self._scan() if identity.superuser or w.owner == identity.name]

    def abort(self, session: Any, write_ids: Iterable[str]) -> int:
        """Discard the writes (unknown ids are ignored: an abort may be replayed).

        An id ending in ``*`` (``'job-7-*'``: a write id's shape, then ``*``) names every
        staged write of this user (any user's for a superuser; others' are skipped, where
        a named one is 42501) whose id starts with what precedes it: the writes of a job
        whose driver did not learn every task's id (a Spark task that staged its rows just
        as the job failed, its commit message dropped). A write's directory is renamed out
        of the staged writes at once, then deleted: a COPY still adding to it fails (42704:
        its file's directory is gone) and leaves nothing staged. Such a prefix is then
        closed to this user for ``abandon_after_s``: a write it names is not created
        (42704), so a task that starts its write just after its job's abort swept the
        prefix leaves nothing behind (remembered in memory, at most
        ``limits.ABORTED_WRITE_PREFIXES_MAX``, the oldest forgotten first)."""
        write_ids = list(write_ids)
        owner = session.identity.name
        with self._lock:  # before the sweep: a write started after it sees the prefix
            for write_id in write_ids:
                if isinstance(write_id, str) and write_id.endswith("*"):
                    prefix = check_write_id(write_id[:-1])
                    self._aborted_prefixes.pop((owner, prefix), None)
                    self._aborted_prefixes[(owner, prefix)] = _wall_clock_s()
                    while len(self._aborted_prefixes) > limits.ABORTED_WRITE_PREFIXES_MAX:
                        del self._aborted_prefixes[next(iter(self._aborted_prefixes))]
        count = 0
        for write_id, named in _expand(self.root, write_ids):
            if not os.path.isdir(os.path.join(self.root, write_id)):
                continue
            try:
                self._meta(session, write_id)
            except UndefinedObjectError:  # removed meanwhile (another abort, a commit)
                continue
            except InsufficientPrivilegeError:
                if named:
                    raise
                continue  # matched by a prefix: another user's write is not this abort's
            with self._lock:
                if write_id in self._committing:
                    raise ObjectNotInPrerequisiteStateError(
                        f"write {write_id} is being committed: it cannot be aborted now")
                discarded = os.path.join(self.commits_root, f"aborted-{uuid.uuid4().hex}")
                try:  # no manifest: the next start deletes it if this process dies now
                    os.rename(os.path.join(self.root, write_id), discarded)
                except FileNotFoundError:
                    continue
                # A COPY in flight releases its own ``.part``'s bytes (a crash's are ours).
                size = _directory_bytes(discarded, STAGED_SUFFIXES if write_id in
                                        self._appending else (*STAGED_SUFFIXES, ".part"))
            self._staged_here.forget(discarded)
            shutil.rmtree(discarded, ignore_errors=True)
            self._release(size)
            count += 1
        return count

    def collect(self) -> list[str]:
        """Delete writes untouched for ``abandon_after_s`` (a killed writer's leftovers)."""
        collected = []
        for write in self._scan():
            with self._lock:
                busy = write.write_id in self._committing or write.write_id in self._appending
            if write.idle_s >= self.abandon_after_s and not busy:
                self._remove(write.write_id)
                collected.append(write.write_id)
        return collected

    def _scan(self) -> list[WriteInfo]:
        writes = []
        now = _wall_clock_s()
        for write_id in sorted(os.listdir(self.root)):
            directory = os.path.join(self.root, write_id)
            with contextlib.suppress(FileNotFoundError):
                entries = [os.path.join(directory, n) for n in os.listdir(directory)]
                stats = [os.stat(e) for e in entries] or [os.stat(directory)]
                touched = max(s.st_mtime for s in stats)
                meta_path = os.path.join(directory, "write.json")
                meta = _read_meta(meta_path) if os.path.exists(meta_path) else {
                    "kind": "?", "name": "?", "owner": "?"}  # fmt: skip
                files = sum(1 for e in entries if e.endswith(STAGED_SUFFIXES))
                size = sum(s.st_size for e, s in zip(entries, stats, strict=False)
                           if e.endswith((*STAGED_SUFFIXES, ".part")))  # fmt: skip
                writes.append(WriteInfo(write_id, meta["kind"], meta["name"], meta["owner"],
                                        files, size, now - touched))  # fmt: skip
        return writes

    def _remove(self, write_id: str) -> None:
        directory = os.path.join(self.root, write_id)
        size = 0
        with contextlib.suppress(FileNotFoundError):
            for entry in os.listdir(directory):
                if entry.endswith((*STAGED_SUFFIXES, ".part")):
                    size += os.path.getsize(os.path.join(directory, entry))
        self._staged_here.forget(directory)
        shutil.rmtree(directory, ignore_errors=True)
        self._release(size)

    def _meta(self, session: Any, write_id: str) -> dict[str, str]:
        check_write_id(write_id)
        path = os.path.join(self.root, write_id, "write.json")
        if not os.path.exists(path):
            raise UndefinedObjectError(f"no staged write {write_id}")
        meta = _read_meta(path)
        identity = session.identity
        if meta["owner"] != identity.name and not identity.superuser:
            raise InsufficientPrivilegeError(f"write {write_id} belongs to another user")
        return meta

    def read_write(self, write_id: str, *, frames: bool = True) -> pa.Table:
        """Every whole staged file of the write as one table (memory-mapped, no copy; a
        frames file decoded, with its ``WIRE_SCHEMA`` columns and ``partition``; without
        ``frames``, the Arrow files alone: the frames go as staged, ``_framed_topics``)."""
        directory = os.path.join(self.root, write_id)
        pieces = []
        for entry in _whole_parts(sorted(os.listdir(directory))):
            path = os.path.join(directory, entry)
            if entry.endswith(".arrows"):
                pieces.append(pa.ipc.open_stream(pa.memory_map(path)).read_all())
            elif entry.endswith(FRAMES_SUFFIX) and frames:
                fs = self.database.store.fs
                pieces.append(staged_refs.framed_table(fs, staged_refs.index_framed(fs, [path])))
        if not pieces:
            return pa.table({})
        return pa.concat_tables(pieces, promote_options="permissive")

    # -- the exactly-once commit ---------------------------------------------------------
    def commit(self, session: Any, sink_id: str, batch_id: int, write_ids: list[str]
               ) -> dict[str, Any]:  # fmt: skip
        """Publish the writes and record ``(sink_id, batch_id)`` in one transaction.

        Returns ``{"status": "committed"|"duplicate", "rows": n}``; the writes' staged
        files are deleted in either case (those committed by reference once the commit's
        checkpoint made the partitions durable: ``engine.staged_refs``). The session must
        be idle (no open transaction). See ``_publish`` for the by-reference protocol.
        """
        if not sink_id or not isinstance(batch_id, int):
            raise InvalidParameterValueError("a commit needs a sink id and an integer batch id")
        owner = bulk_publish.require_sink(session, sink_id)  # this user's, or unclaimed
        if self.committed_rows(session, sink_id, batch_id) is not None:
            # A replay: its writes were published (and deleted) by the first commit, or
            # are a re-run's copies, which go unpublished.
            self.abort(session, write_ids)
            return {"status": "duplicate", "rows": 0}
        metas = {w: self._meta(session, w) for w in dict.fromkeys(write_ids)}
        with self._committing_writes(list(metas)):
            try:
                answer = self._commit(session, sink_id, batch_id, metas)
            except SerializationFailure:
                # Two commits of one user claimed a new sink at once and ours lost (the
                # claim's key): nothing of ours committed, the sink is ours: once more.
                if owner is not None or bulk_publish.sink_owner(
                        session, sink_id) != session.identity.name:  # fmt: skip
                    raise
                answer = self._commit(session, sink_id, batch_id, metas)
        if answer["status"] == "committed":
            # The batch and its record are committed, the client not yet told: a crash
            # here is the one the record exists for (the client's replay is a duplicate).
            failpoints.hit("sink.after_commit")
        return answer

    def _commit(self, session: Any, sink_id: str, batch_id: int,
                metas: dict[str, dict[str, str]]) -> dict[str, Any]:  # fmt: skip
        handed: list[str] = []  # the commit directory, once the committer owns it
        moved: dict[str, str] = {}  # write id -> its directory under the commit directory
        recorded: list[bool] = []  # set once the transaction with our record committed
        split: list[str] = []  # topics whose frames went beside their Arrow rows
        try:
            try:
                rows = self._publish(session, sink_id, batch_id, metas, moved, handed,
                                     recorded, split)  # fmt: skip
            except bulk_publish.PartsRefused:
                # A topic's Arrow rows beside its frames are over what one transaction may
                # write to a partition: parts (not atomic) cannot hold frames, so such a
                # commit goes as before this path existed: its frames decoded (bounded:
                # ``_check_decoded_frames``) and copied with the rows, in parts.
                if not split or handed or recorded:
                    raise
                self._move_back(moved)
                rows = self._publish(session, sink_id, batch_id, metas, moved, handed,
                                     recorded, None)  # fmt: skip
        except Exception:  # an error of ours, or one nothing expected (a MemoryError)
            if not handed:
                self._move_back(moved)
            if recorded:  # past our commit point (its publish finishes later): committed
                rows = self.committed_rows(session, sink_id, batch_id)
                assert rows is not None, "a committed record is visible to its session"
            else:
                # A concurrent commit by another user may have claimed the sink: 42501.
                bulk_publish.require_sink(session, sink_id)
                if self.committed_rows(session, sink_id, batch_id) is None:
                    raise
                rows = None  # a concurrent commit of the same record won: ours is a replay
        except BaseException:
            if not handed:
                self._move_back(moved)
            raise
        if moved and not handed:  # committed in parts (copied): the files are not needed
            self._move_back(moved)
        self._discard({w: m for w, m in metas.items() if w not in moved or not handed})
        if rows is None:
            return {"status": "duplicate", "rows": 0}
        return {"status": "committed", "rows": rows}

    @contextlib.contextmanager
    def _committing_writes(self, write_ids: list[str]) -> Iterator[None]:
        """Mark the writes as being committed: appends to them, other commits and aborts
        of them are refused with 55000 (and ``collect`` leaves them) until the commit
        ends; a write with an append in flight cannot start committing (its rows would be
        lost)."""
        with self._lock:
            for write_id in write_ids:
                if write_id in self._committing or self._appending.get(write_id):
                    raise ObjectNotInPrerequisiteStateError(
                        f"write {write_id} is being "
                        f"{'committed' if write_id in self._committing else 'appended to'}"
                        "; retry once that has ended")  # fmt: skip
            self._committing.update(write_ids)
        try:
            yield
        finally:
            with self._lock:
                self._committing.difference_update(write_ids)

    def committed_rows(self, session: Any, sink_id: str, batch_id: int) -> int | None:
        table = tables.query_arrow(
            session.cursor, f"SELECT rows FROM {IDEMPOTENCY_TABLE} WHERE sink_id = ? "
            "AND batch_id = ?", [sink_id, batch_id])  # fmt: skip
        return None if table is None or table.num_rows == 0 else table.column(0)[0].as_py()

    def last_batch(self, session: Any, sink_id: str) -> int | None:
        """The largest batch id committed for ``sink_id`` (None if none); 42501 if the
        sink belongs to another user (any sink's for a superuser)."""
        bulk_publish.require_sink(session, sink_id, commit=False)
        table = tables.query_arrow(
            session.cursor, f"SELECT max(batch_id) FROM {IDEMPOTENCY_TABLE} WHERE sink_id = ?",
            [sink_id])  # fmt: skip
        return None if table is None else table.column(0)[0].as_py()

    def _publish(self, session: Any, sink_id: str, batch_id: int,
                 metas: dict[str, dict[str, str]], moved: dict[str, str],
                 handed: list[str], recorded: list[bool],
                 split: list[str] | None) -> int:  # fmt: skip
        """Publish the writes in one transaction (``engine.bulk_publish``).

        Data written once: the topic writes whose rows all name their partition are
        committed *by reference* (``engine.staged_refs``) instead of being copied to the
        transaction's spill and the staging log. Before the transaction, their write
        directories are moved (renamed, each whole) into a new commit directory
        ``bulk_commits/<uuid>/`` beside a manifest naming the commit's ``(sink id, batch
        id)`` and the writes, and the files and directories are synced in one pass; the
        record row then names the files (size, CRC-32C) and the publish derives each
        partition's batch from them. ``moved`` gets the moved writes (moved back if the
        transaction ends before its commit point); ``handed`` gets the commit directory
        once the commit point passed: from then on the committer deletes it, after the
        checkpoint that makes the partitions durable. A crash before the commit point
        leaves a commit directory without a committed record, which ``_settle_commits``
        moves back at the next start.

        A topic whose writes hold frames files and Arrow files (``split``: None turns this
        off) publishes its frames as staged and its Arrow rows by reference, in the same
        transaction (``_framed_topics``): a partition that gets both gets one share, its
        frames followed by its rows (``engine.commit``). ``split`` gets those topics.
        """
        framed, split_ids = self._framed_topics(metas, split is not None)
        if split_ids:
            try:
                return self._publish_writes_of(session, sink_id, batch_id, metas, moved,
                                               handed, recorded, framed, split_ids, split)
            except _NotSplit:
                framed, split_ids = self._framed_topics(metas, False)
        return self._publish_writes_of(session, sink_id, batch_id, metas, moved, handed,
                                       recorded, framed, split_ids, split)  # fmt: skip

    def _publish_writes_of(self, session: Any, sink_id: str, batch_id: int,
                           metas: dict[str, dict[str, str]], moved: dict[str, str],
                           handed: list[str], recorded: list[bool],
                           framed: dict[str, list[str]], split_ids: set[str],
                           split: list[str] | None) -> int:  # fmt: skip
        """``_publish`` once the topics staged as frames are known (``framed``; the ids
        of ``split_ids`` have their Arrow files read apart from their frames); raises
        ``_NotSplit`` before anything moves when a split topic's Arrow rows cannot be
        committed by reference."""
        writes: list[bulk_publish.Write] = []
        # The tasks' rows of one topic with one schema go as one write (one batch per
        # partition, published without concatenation); rows of another shape stay apart
        # (a task without a partition column is routed by the topic).
        topics: dict[tuple[str, str], int] = {}
        sources: dict[int, list[str]] = {}  # index in writes -> its write ids
        framed_ids = {w for ids in framed.values() for w in ids}
        decoding = _check_decoded_frames(metas, framed_ids, self.root)
        with contextlib.ExitStack() as turn:
            if decoding:  # frames decoded into memory: a turn, as derived batches take
                turn.enter_context(self._by_reference_turns)
            for write_id, meta in metas.items():
                if write_id in framed_ids and write_id not in split_ids:
                    continue
                data = (self.read_write(write_id, frames=False) if write_id in split_ids
                        else self.read_write(write_id))  # fmt: skip
                if write_id in split_ids and not data.num_rows:
                    continue  # its Arrow files hold no row: a frames write
                shape = (meta["name"], data.schema.to_string(show_schema_metadata=False))
                if meta["kind"] != "topic" or data.num_columns == 0:
                    writes.append((meta, data))
                elif shape in topics:
                    index = topics[shape]
                    writes[index] = (writes[index][0], pa.concat_tables([writes[index][1], data]))
                    sources[index].append(write_id)
                else:
                    topics[shape] = len(writes)
                    sources[len(writes)] = [write_id]
                    writes.append((meta, data))
            # By reference only if every topic write of its topic is: a share mixing rows by
            # reference with rows copied (routed by the topic, or frames decoded: a frames
            # file after an Arrow file) is copied whole (its record could not derive it),
            # and its moved files would then wait for the next start to be deleted.
            copied = {writes[i][0]["name"] for i in sources
                      if writes[i][1].num_rows and not (
                          staged_refs.by_reference(writes[i][1])
                          and all(p.endswith(".arrows") or w in split_ids
                                  for w in sources[i]
                                  for p in _staged_files(os.path.join(self.root, w))))}
            eligible = [i for i in sources if staged_refs.by_reference(writes[i][1])
                        and writes[i][0]["name"] not in copied]  # fmt: skip
            split_topics = {metas[w]["name"] for w in split_ids}
            if any(writes[i][0]["name"] in split_topics for i in sources if i not in eligible):
                # A split topic's Arrow rows that cannot go by reference (rows routed by
                # the topic) would be copied beside frames as staged: not this path.
                raise _NotSplit
            if split is not None:
                split.extend(sorted(split_topics))
            if not eligible and not framed:
                return self._publish_writes(session, sink_id, batch_id, writes, moved, handed,
                                            recorded)  # fmt: skip
            # Framed writes hold nothing in memory (their frames are copied file to file):
            # only derived batches need a turn (one turn a commit: the semaphore is not
            # reentrant).
            if eligible and not decoding:
                turn.enter_context(self._by_reference_turns)
            return self._publish_by_reference(session, sink_id, batch_id, writes, metas,
                                              sources, eligible, framed, moved, handed,
                                              recorded)  # fmt: skip

    def _framed_topics(self, metas: dict[str, dict[str, str]], split: bool
                       ) -> tuple[dict[str, list[str]], set[str]]:  # fmt: skip
        """The topics whose frames files are published as staged
        (``engine.staged_refs.FramedWrite``) in the commit's one transaction, whatever
        their size (a framed share is not held to what one transaction may write to a
        partition: ``engine.commit._check_publishable``), with the ids of their writes
        holding frames; and the ids of the writes whose Arrow files are read apart.

        A topic whose every write is frames files goes so. With ``split``, so does a topic
        whose writes also hold Arrow files (another column, or the rest of a stream after
        a row a frame cannot hold), provided each of its writes' files are frames files
        first, then Arrow files (the order a write's rows keep: a partition's share is its
        frames followed by its Arrow rows); all of its writes' ids are then in the second
        set (``_NotSplit`` if their Arrow rows cannot go by reference). Any other topic
        with frames has them decoded and copied with its rows (``read_write``), up to a
        bound (``_check_decoded_frames``)."""
        kinds: dict[str, dict[str, list[bool]]] = {}  # topic -> write id -> is frames
        for write_id, meta in metas.items():
            files = _staged_files(os.path.join(self.root, write_id))
            if meta["kind"] == "topic" and files:
                kinds.setdefault(meta["name"], {})[write_id] = [
                    p.endswith(FRAMES_SUFFIX) for p in files]
        framed: dict[str, list[str]] = {}
        split_ids: set[str] = set()
        for name, writes in kinds.items():
            with_frames = [w for w, found in writes.items() if any(found)]
            if not with_frames:
                continue
            if all(all(found) for found in writes.values()):
                framed[name] = with_frames
            elif split and all(found == sorted(found, reverse=True)
                               for found in writes.values()):  # frames, then Arrow
                framed[name] = with_frames
                split_ids.update(writes)
        return framed, split_ids

    def _publish_by_reference(self, session: Any, sink_id: str, batch_id: int,
                              writes: list[bulk_publish.Write],
                              metas: dict[str, dict[str, str]], sources: dict[int, list[str]],
                              eligible: list[int], framed: dict[str, list[str]],
                              moved: dict[str, str], handed: list[str],
                              recorded: list[bool]) -> int:  # fmt: skip
        """Move, checksum and sync the eligible and framed writes' files, then publish
        (``_publish``). Every file the record names is fdatasynced here, before the
        commit point (none is synced when staged: a COPY's reply does not wait for the
        disk, the kernel was asked to write the files back as they were written)."""
        directory = self._move_for_commit(
            sink_id, batch_id, {w: metas[w] for i in eligible for w in sources[i]}
            | {w: metas[w] for ids in framed.values() for w in ids}, moved)  # fmt: skip
        relative = os.path.relpath(directory, self.database.path)
        fs = self.database.store.fs
        named: list[list] = []  # every other file the record names, synced below
        shares = []
        for ids in framed.values():
            paths = [p for w in ids for p in _staged_files(moved[w]) if p.endswith(FRAMES_SUFFIX)]
            shares.append((ids, paths, [staged_refs.file_entry(self.database.path, p)
                                        for p in paths]))  # fmt: skip

        def check(entry: list) -> None:
            relative, size, crc = entry
            path = os.path.join(self.database.path, relative)
            if not self._staged_here.vouches(path, size, crc):  # else not read back
                staged_refs.check_frames_file(fs, path, size, crc, "staged")

        # The frames files' bytes the record will name, checked before the commit point
        # (a file damaged since it was staged is refused, XX001, and the writes moved
        # back), each by the thread that then fdatasyncs it: the checks' reads overlap
        # the other files' writeback waits (round 15; before, all checks, then all syncs).
        # An own file this instance staged and dropped behind is vouched for by identity
        # instead of read back from the disk (``staged_refs.StagedHere``, round 20).
        staged_refs.sync_files(self.database.path, [e for _, _, es in shares for e in es], [],
                               check=check)  # fmt: skip
        for ids, paths, entries in shares:
            meta = {**metas[ids[0]], "dirs": [relative], "frames": entries}
            writes.append((meta, staged_refs.FramedRows(fs, paths,
                                                        staged_refs.index_framed(fs, paths))))
        for index in eligible:
            meta, _ = writes[index]
            files = [staged_refs.file_entry(self.database.path, path)
                     for w in sources[index] for path in _staged_files(moved[w])
                     if path.endswith(".arrows")]  # a split write's frames: above
            meta = {**meta, "files": files, "dirs": [relative]}
            # Read back from the moved files: the rows the record names.
            writes[index] = (meta, staged_refs.read_files(self.database.path, files,
                                                          check=False))  # fmt: skip
        named.extend(f for i in eligible for f in writes[i][0]["files"])
        staged_refs.sync_files(
            self.database.path, named,
            [os.path.relpath(d, self.database.path)
             for d in [*moved.values(), directory, self.commits_root, self.root]])
        failpoints.hit("bulk.before_commit")
        return self._publish_writes(session, sink_id, batch_id, writes, moved, handed, recorded)

    def _publish_writes(self, session: Any, sink_id: str, batch_id: int,
                        writes: list[bulk_publish.Write], moved: dict[str, str],
                        handed: list[str], recorded: list[bool]) -> int:  # fmt: skip
        def committed() -> None:
            if moved:
                directory = os.path.dirname(next(iter(moved.values())))
                handed.append(directory)
                self._hold(directory, sum(_directory_bytes(p) for p in moved.values()))

        return bulk_publish.publish(session, sink_id, batch_id, writes, self._stage_topic,
                                    self.database.clock.now_us(), committed,
                                    lambda: recorded.append(True))  # fmt: skip

    def _move_for_commit(self, sink_id: str, batch_id: int, metas: dict[str, dict[str, str]],
                         moved: dict[str, str]) -> str:  # fmt: skip
        """Move the writes' directories into a new commit directory (manifest first)."""
        directory = os.path.join(self.commits_root, uuid.uuid4().hex)
        os.makedirs(directory)
        # Whole or absent: written and synced under a temporary name, then renamed (a
        # process killed between the manifest's creation and its write left it empty,
        # and the next start failed to parse it). ``_settle_commits`` deletes a commit
        # directory without a manifest: no write moved into it.
        manifest = os.path.join(directory, MANIFEST)
        with open(manifest + ".part", "w", encoding="utf-8") as handle:
            failpoints.hit("bulk.mid_manifest")
            json.dump({"sink_id": sink_id, "batch_id": batch_id, "writes": list(metas)}, handle)
            handle.flush()
            os.fdatasync(handle.fileno())
        os.replace(manifest + ".part", manifest)
        # The manifest's name is durable before any write moves (``_settle_commits``
        # finds every moved write through it).
        staged_refs.sync_files(self.database.path, [], [directory, self.commits_root])
        for write_id in metas:
            target = os.path.join(directory, write_id)
            os.rename(os.path.join(self.root, write_id), target)
            moved[write_id] = target
            self._release(_directory_bytes(target))
            failpoints.hit("bulk.mid_move")
        return directory

    def _move_back(self, moved: dict[str, str]) -> None:
        """The commit did not reach its commit point: the writes are staged again."""
        for write_id, path in moved.items():
            size = _directory_bytes(path)
            _restore(path, os.path.join(self.root, write_id))
            with self._lock:
                self._staged_bytes += size
        if moved:
            shutil.rmtree(os.path.dirname(next(iter(moved.values()))), ignore_errors=True)
        moved.clear()

    def _settle_commits(self, cursor: Any) -> None:
        """At start (recovery has run): a commit directory whose record committed is no
        longer needed (its partitions are durable: recovery's checkpoint); one whose
        record did not commit goes back to staged writes, as if the commit never ran."""
        for name in sorted(os.listdir(self.commits_root)):
            directory = os.path.join(self.commits_root, name)
            manifest = os.path.join(directory, MANIFEST)
            if os.path.exists(manifest):
                meta = _read_meta(manifest)
                found = tables.query_arrow(
                    cursor, f"SELECT rows FROM {IDEMPOTENCY_TABLE} WHERE sink_id = ? "
                    "AND batch_id = ?", [meta["sink_id"], meta["batch_id"]])  # fmt: skip
                if found is None or found.num_rows == 0:  # not committed: staged again
                    for write_id in meta["writes"]:
                        path = os.path.join(directory, write_id)
                        if os.path.isdir(path):
                            _restore(path, os.path.join(self.root, write_id))
            shutil.rmtree(directory, ignore_errors=True)

    def _stage_topic(self, session: Any, meta: dict[str, Any], data: pa.Table,
                     whole: bool) -> None:  # fmt: skip
        name = meta["name"]
        privileges.require(session, "topic", name, "INSERT")
        entry = self.database.catalog.entry(name)
        if entry is None:
            raise UndefinedTopicError(f'topic "{name}" does not exist')
        transaction = session.transaction
        assert transaction is not None, "inside the commit's BEGIN"
        if whole and "frames" in meta:
            # Staged as frames: each partition's frames, published as they are.
            assert isinstance(data, staged_refs.FramedRows)
            topic = self.database.topic_log(entry.topic_id)
            for partition, frames in data.frames.items():
                topic.partition(partition).check_staged()  # 0A000/fenced before the commit
                reference = {"frames": meta["frames"], "dirs": meta["dirs"],
                             "partition": partition}  # fmt: skip
                transaction.add_write(FramedWrite(entry.topic_id, partition, frames,
                                                  reference, self.database.store.fs))  # fmt: skip
            return
        if isinstance(data, staged_refs.FramedRows):  # a commit in parts: the rows
            data = data.table()
        if whole and "files" in meta:
            # By reference: one batch per partition, derived as recovery will derive it.
            at = self.database.clock.now_us()
            for partition, rows in partition_groups(data):
                assert partition is not None, "every row names its partition"
                reference = {"files": meta["files"], "dirs": meta["dirs"],
                             "partition": partition, "at": at}  # fmt: skip
                batch = staged_refs.wire_batch(rows, at)
                transaction.add_write(ReferencedWrite(entry.topic_id, batch, partition,
                                                      reference))  # fmt: skip
            return
        # One wire batch per partition (of at most BATCH_MESSAGES_MAX rows): the commit
        # then publishes each partition's batch as it is, with no concatenation.
        for partition, rows in partition_groups(data):
            for start in range(0, rows.num_rows, limits.BATCH_MESSAGES_MAX):
                piece = rows.slice(start, limits.BATCH_MESSAGES_MAX)
                for routed, batch in build_batches(piece, {}, self.database.clock):
                    if batch.num_rows:
                        target = routed if partition is None else partition
                        transaction.add_write(PendingWrite(entry.topic_id, batch, target))

    def _discard(self, metas: dict[str, dict[str, str]]) -> None:
        for write_id in metas:
            self._remove(write_id)


_instances: dict[str, BulkWrites] = {}
_instances_lock = threading.Lock()


def for_database(database: Any, **settings: Any) -> BulkWrites:
    """The database's ``BulkWrites`` (created on first use; ``settings`` apply then or
    replace the cap and timeout of the existing one)."""
    with _instances_lock:
        writes = _instances.get(database.path)
        if writes is None or writes.database is not database:
            writes = _instances[database.path] = BulkWrites(database, **settings)
        else:
            for key, value in settings.items():
                setattr(writes, key, value)
        return writes


class _NotSplit(Exception):
    """A topic's Arrow rows cannot be committed beside its frames as staged (rows routed
    by the topic): ``_publish`` goes on with its frames decoded."""


def _check_target(session: Any, kind: str, name: str) -> None:
    if kind == "topic":
        if session.database.catalog.entry(name) is None:
            raise UndefinedTopicError(f'topic "{name}" does not exist')
        privileges.require(session, "topic", name, "INSERT")
    elif kind == "table":
        privileges.require(session, "table", name, "INSERT")
    else:
        raise InvalidParameterValueError(f"a write targets a topic or a table, not {kind!r}")


def _staged_name(key: str | None = None) -> str:
    """A new staged file's name (before its suffixes): the staging time first, so a
    write's files sort in the order they were staged (a client that sends a stream's
    rows in two COPYs one after the other, e.g. partition frames then an Arrow stream,
    keeps their order: a write's files are read in name order), then 32 random hex
    digits, or for a numbered part its key (``append``: the stream's 32 hex digits, the
    part in 8 more). Hex digits and one '-' only: ``staged_frames.OWN_FILE`` parses it."""
    return f"{time.time_ns():016x}-{key or uuid.uuid4().hex}"


_PART_DIGITS = 8  # limits.STAGED_PARTS_MAX is 2**31


def _part_of(name: str) -> str | None:
    """The part key (stream and number) in a staged file's name (``_staged_name``), or of
    a part's marker; None for a file staged without one."""
    base = os.path.basename(name).split(".")[0].rstrip("~")
    key = base.partition("-")[2] if "-" in base else base
    return key if len(key) == 32 + _PART_DIGITS else None


def _whole_parts(names: list[str]) -> list[str]:
    """``names`` without the files of numbered parts whose marker is missing (torn)."""
    done = {n[: -len(DONE_SUFFIX)] for n in names if n.endswith(DONE_SUFFIX)}
    return [n for n in names if n.endswith(DONE_SUFFIX) or (key := _part_of(n)) is None
            or key in done]  # fmt: skip


def _check_decoded_frames(metas: dict[str, dict[str, str]], framed_ids: set[str],
                          root: str) -> int:  # fmt: skip
    """Refuse (54000), before anything moves or is read, a commit that would decode more
    than ``TRANSACTION_STAGED_BYTES_MAX`` of frames into memory.

    A topic whose writes mix frames files with Arrow files publishes its frames as staged
    beside its Arrow rows (``_framed_topics``), except when those rows are routed by the
    topic (no partition), over what one transaction may write to a partition, or when a
    write holds a frames file after an Arrow file: then the frames files are decoded
    whole by ``read_write`` and copied with the Arrow rows. Unbounded, that would read up
    to the bulk staging cap into memory (review R1-5). The
    bound is what one transaction may read back into memory at its COMMIT; the files'
    sizes (headers included) bound their bodies, so nothing is read to check it. The
    writes stay staged: the client commits the frames writes apart from the topic's
    Arrow writes, or stages such a write again with smaller writes. Returns the bytes to
    decode: a commit decoding any takes one of ``SPILLED_COMMITS_MAX`` turns, so at most
    that many commits hold decoded frames at once."""
    total = 0
    for write_id, meta in metas.items():
        if meta["kind"] != "topic" or write_id in framed_ids:
            continue
        total += sum(os.path.getsize(p) for p in _staged_files(os.path.join(root, write_id))
                     if p.endswith(FRAMES_SUFFIX))  # fmt: skip
    if total > limits.TRANSACTION_STAGED_BYTES_MAX:
        raise LimitExceededError(
            f"this commit would decode {total} bytes of rows staged as frames into memory "
            f"(at most {limits.TRANSACTION_STAGED_BYTES_MAX}): a topic's writes mix rows "
            "staged as frames with rows staged as Arrow that cannot go beside them (rows "
            "without a partition, or over what one transaction may write to a partition); "
            "commit the frames writes apart from that topic's Arrow writes, or in smaller "
            "writes (a Spark write: the option writeFrames=false stages every row as Arrow)")
    return total


def _staged_files(directory: str) -> list[str]:
    """The write's whole staged files in name order (the rows' order); an own frames file
    (``storage.staged_frames``) only once its COPY's shared file is there (a crash between
    their renames leaves the COPY unstaged, as one that failed)."""
    names = _whole_parts(sorted(os.listdir(directory)))
    return [os.path.join(directory, n) for n in names
            if n.endswith(STAGED_SUFFIXES)
            and (own_file(n) is None or own_file_sealed(n, names))]  # fmt: skip


def _own_files_of(base: str) -> list[str]:
    """The own frames files (sealed) of the COPY staged as ``base``."""
    directory, lead = os.path.split(base)
    with contextlib.suppress(FileNotFoundError):
        return [os.path.join(directory, n) for n in os.listdir(directory)
                if n.startswith(lead + ".~p") and own_file(n) is not None]  # fmt: skip
    return []


def _directory_bytes(directory: str,
                     suffixes: tuple[str, ...] = (*STAGED_SUFFIXES, ".part")) -> int:  # fmt: skip
    total = 0
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(directory):
            if name.endswith(suffixes):
                with contextlib.suppress(FileNotFoundError):  # a COPY's .part, just renamed
                    total += os.path.getsize(os.path.join(directory, name))
    return total


def _expand(root: str, write_ids: Iterable[str]) -> list[tuple[str, bool]]:
    """The ids an abort names, each once with whether it was named itself: each checked
    (22023), an id ending in ``*`` replaced by the staged writes whose ids start with what
    precedes it (which must be a write id's shape: ``'*'`` alone is refused)."""
    found: dict[str, bool] = {}
    for write_id in write_ids:
        if isinstance(write_id, str) and write_id.endswith("*"):
            prefix = check_write_id(write_id[:-1])
            with contextlib.suppress(FileNotFoundError):
                for name in sorted(os.listdir(root)):
                    if name.startswith(prefix):
                        found.setdefault(name, False)
        else:
            found[check_write_id(write_id)] = True
    return list(found.items())


def _restore(path: str, target: str) -> None:
    """Move a write's directory back to the staged writes (a write started again under
    the same id meanwhile wins: the moved one is dropped)."""
    try:
        os.rename(path, target)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)


def _write_meta(path: str, meta: dict[str, Any]) -> None:
    """``write.json`` written whole or not at all (a temporary file, then renamed)."""
    temporary = path + ".part"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(meta, handle)
    os.replace(temporary, path)


def _schema_text(schema: pa.Schema) -> str:
    """The schema as ``write.json`` keeps it (read at every part's ``start``: bounded)."""
    data = schema.remove_metadata().serialize().to_pybytes()
    if len(data) > limits.FLIGHT_COMMAND_BYTES_MAX:
        raise LimitExceededError(f"a bulk write's schema is limited to "
                                 f"{limits.FLIGHT_COMMAND_BYTES_MAX} bytes, not "
                                 f"{len(data)}")  # fmt: skip
    return base64.b64encode(data).decode()


def _schema_of(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def _read_meta(path: str) -> dict[str, str]:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _wall_clock_s() -> float:
    # File modification times are wall-clock: compare them with the wall clock.
    return time.time()
