"""Offline check, and careful repair, of a store's files (``topicbase check``).

Works on the files themselves, never through ``Store.open``: opening a store
recovers it (cuts torn tails, rebuilds indexes, deletes leftovers), and a check
changes nothing unless asked to repair. It holds the store's lock while it runs,
so no process opens the store meanwhile; when another process holds the lock it
reports the owner's pid and checks nothing.

Checked, for every topic ``store.json`` lists, every partition its
``topic.json`` lists, and every segment of it:
- every frame: a well-formed header (``record_batch``) and its CRC-32C;
- dense offsets: the first frame starts at the segment's base offset, each frame
  where the one before ended, each segment where the one before ended;
- ``written_at`` never goes backwards within a partition;
- offset and time indexes: whole entries, increasing, each entry naming a frame
  start (offset index) or a frame's base offset and time (time index); an index missing
  or empty (not written yet when a process stopped) is no damage: reported as
  "recovered at open", since the open rebuilds it, and the report stays ok;
- producer snapshots parse, match their name, and claim no offset past the log end (nor
  past their name, but in a topic with a ledger: ``check_frames.snapshot_issue``);
- leftovers (``*.tmp``, ``*.deleted``, indexes without a log, directories no
  metadata lists) and unknown files;
- staging files (``<data>/staging``): every frame well-formed and checksummed;
- a topic's ledger (``<topic>/ledger/``, ``storage.ledger_route``, when the store's ledger
  switch is or was on): every ``<number>.ledger`` file's frames well-formed and
  checksummed (``ledger_format.scan``), their sequence numbers following one another
  across files; a torn tail (a crash's unacknowledged round: the open reads the valid
  prefix and writes on in a new file) is reported as recovered at open; anything else
  there is an unknown file; then, the frames being whole, the open's rule for their
  shares (``storage.ledger``): each partition's share wholly below its log's end (copied)
  or continuing its offsets from there, share after share, and of a partition the topic
  lists; anything else is reported, not repaired.

Repair (``repair=True``) takes the steps recovery takes, limited to those that
lose nothing: cut a torn tail (damage with no valid frame after it, in the last
segment, or in a sealed segment whose frames already reach the next segment's
base offset), rebuild both indexes of a segment from its frames, delete
unreadable snapshots, snapshots past the log end, temp and ``.deleted`` files
and orphan indexes. Never cut or deleted: a frame whose checksum holds. Damage
in the middle of a log keeps its place and stays reported, as do offset gaps,
unlisted directories and bad metadata: they need a person.

Damage is told apart as in ``log_loader``: a bad region followed by a valid frame
is corruption in the middle; one with no valid frame after it is a torn tail.
The problem kinds and the report are in ``check_report``; walking frames and
checking indexes and snapshots, in ``check_frames``.
Thread-safety: none; one call owns the files while it holds the store lock.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from storage import file_names, ledger_format
from storage.autopartition import HASH_SPACE
from storage.check_frames import (
    LogWalk,
    index_entries,
    offset_index_issue,
    snapshot_issue,
    time_index_issue,
    walk_frames,
)
from storage.check_report import (
    BAD_INDEX,
    BAD_METADATA,
    BAD_SNAPSHOT,
    BROKEN_FRAME,
    CORRUPT_FRAME,
    IN_USE,
    LEFTOVER,
    MISSING,
    OFFSET_GAP,
    TIME_BACKWARDS,
    TORN_TAIL,
    UNKNOWN_FILE,
    UNREADABLE,
    CheckReport,
    Problem,
)
from storage.commit_log import walk_staging
from storage.errors import CorruptSegmentError, ObjectInUseError, StorageIOError
from storage.fs import DEFAULT_FILE_SYSTEM, FileSystem
from storage.ledger import SUFFIX as LEDGER_SUFFIX
from storage.ledger_route import DIRECTORY as LEDGER_DIRECTORY
from storage.offset_index import OffsetIndex
from storage.record_batch import FrameHeader
from storage.staging import STAGE_SUFFIX
from storage.store import MANIFEST
from storage.time_index import TimeIndex
from storage.topic_log import METADATA_FILE

LOCK_FILE = "LOCK"
TOPICS_DIRECTORY = "topics"


# -- entry points ---------------------------------------------------------------------------
def check_store(
    root: str,
    repair: bool = False,
    *,
    staging_directory: str | None = None,
    fs: FileSystem = DEFAULT_FILE_SYSTEM,
) -> CheckReport:
    """Check the store at ``root`` (and a staging directory) under the store's lock."""
    root = os.path.abspath(root)
    report = CheckReport(root, repair)
    with locked_store(root, report, fs) as held:
        if held:
            check_store_files(
                report, root, repair=repair, staging_directory=staging_directory, fs=fs
            )
    return report


@contextmanager
def locked_store(root: str, report: CheckReport, fs: FileSystem) -> Iterator[bool]:
    """Hold the store's lock for the block; yields False (and reports why) if it cannot."""
    if not os.path.isdir(root):
        report.add(Problem(MISSING, root, "no store here (the directory does not exist)"))
        report.ran = False
        yield False
        return
    try:
        lock_fd = fs.lock_directory(root)
    except (ObjectInUseError, StorageIOError) as error:
        kind = IN_USE if isinstance(error, ObjectInUseError) else UNREADABLE
        report.add(Problem(kind, root, error.message))
        report.ran = False
        yield False
        return
    try:
        yield True
    finally:
        fs.unlock_directory(lock_fd)


def check_store_files(
    report: CheckReport,
    root: str,
    *,
    repair: bool = False,
    staging_directory: str | None = None,
    fs: FileSystem = DEFAULT_FILE_SYSTEM,
) -> None:
    """The check itself; the caller holds the store's lock (``locked_store``)."""
    checker = _Checker(fs, report, repair)
    checker.check_store(root)
    if staging_directory is not None:
        checker.check_staging(staging_directory)


# -- the checker ------------------------------------------------------------------------------
class _Checker:
    def __init__(self, fs: FileSystem, report: CheckReport, repair: bool) -> None:
        self.fs = fs
        self.report = report
        self.repair = repair

    def problem(
        self,
        kind: str,
        path: str,
        message: str,
        position: int | None = None,
        *,
        fix: Callable[[], None] | None = None,
        recovered_at_open: bool = False,
    ) -> None:
        """Record a problem; when repairing and a ``fix`` exists, apply it first.
        ``recovered_at_open``: a crash's state the next open undoes (``Problem``)."""
        repaired = False
        if fix is not None and self.repair:
            try:
                fix()
                repaired = True
            except StorageIOError as error:
                message += f" (repair failed: {error})"
        self.report.add(Problem(kind, path, message, position, fix is not None, repaired,
                                recovered_at_open))  # fmt: skip

    def remove_fix(self, path: str) -> Callable[[], None]:
        return partial(self.fs.remove, path)

    # -- store and topics -------------------------------------------------------------------
    def check_store(self, root: str) -> None:
        for name in self.fs.list_directory(root):
            path = os.path.join(root, name)
            if name.endswith(file_names.TEMP_SUFFIX):
                self.problem(
                    LEFTOVER, path, "temp file (repair deletes it)", fix=self.remove_fix(path)
                )
            elif name not in (LOCK_FILE, MANIFEST, TOPICS_DIRECTORY):
                self.problem(UNKNOWN_FILE, path, "not a file of a store")
        topics_directory = os.path.join(root, TOPICS_DIRECTORY)
        on_disk = self.fs.list_directory(topics_directory)
        listed = self._listed_topics(os.path.join(root, MANIFEST), on_disk)
        self.report.topic_ids = listed
        for name in on_disk:
            if listed is not None and name not in listed:
                path = os.path.join(topics_directory, name)
                text = f"not listed in {MANIFEST} (opening the store deletes it)"
                self.problem(LEFTOVER, path, text)
        for topic_id in listed if listed is not None else on_disk:
            self.report.topics += 1
            self.check_topic(topic_id, os.path.join(topics_directory, topic_id))

    def _listed_topics(self, manifest_path: str, on_disk: list[str]) -> list[str] | None:
        try:
            payload = json.loads(self.fs.read_file(manifest_path))
        except FileNotFoundError:
            if on_disk:
                text = "missing while topics/ holds directories (opening would delete them)"
                self.problem(BAD_METADATA, manifest_path, text)
                return None
            return []  # a store that never had a topic
        except ValueError:
            self.problem(BAD_METADATA, manifest_path, "not valid JSON")
            return None
        issue = _manifest_issue(payload)
        if issue is not None:
            self.problem(BAD_METADATA, manifest_path, issue)
            return None
        return sorted(payload["topics"])

    def check_topic(self, topic_id: str, directory: str) -> None:
        if not os.path.isdir(directory):
            self.problem(MISSING, directory, f"topic {topic_id} is listed but has no directory")
            return
        names = self.fs.list_directory(directory)
        found = self._listed_partitions(os.path.join(directory, METADATA_FILE), topic_id)
        listed, removed = found if found is not None else (None, frozenset[int]())
        on_disk = []
        for name in names:
            path = os.path.join(directory, name)
            number = name[1:] if name.startswith("p") else ""
            if name == METADATA_FILE:
                continue
            if name.endswith(file_names.TEMP_SUFFIX):
                self.problem(
                    LEFTOVER, path, "temp file (repair deletes it)", fix=self.remove_fix(path)
                )
            elif name == LEDGER_DIRECTORY and os.path.isdir(path):
                continue  # checked after the partitions, against their ends
            elif number.isdigit() and os.path.isdir(path):
                on_disk.append(int(number))
                if listed is not None and int(number) not in listed:
                    self.problem(
                        LEFTOVER,
                        path,
                        f"partition directory not in {METADATA_FILE}: a split cut short before "
                        "its commit point (opening and repair delete it)",
                        fix=partial(self.fs.remove_tree, path),
                    )
            else:
                self.problem(UNKNOWN_FILE, path, "not a file of a topic")
        partition_ids = listed if listed is not None else sorted(on_disk)
        self.report.partition_ids[topic_id] = partition_ids
        ends: dict[int, int | None] = {}  # each partition's log end (None: not known)
        for partition_id in partition_ids:
            partition_directory = os.path.join(directory, f"p{partition_id}")
            if partition_id not in on_disk:
                text = "listed partition has no directory (opening creates it empty)"
                self.problem(MISSING, partition_directory, text)
                ends[partition_id] = 0  # (as the open: created empty)
                continue
            self.report.partitions += 1
            ends[partition_id] = self.check_partition(
                topic_id, partition_id, partition_directory, ledger=LEDGER_DIRECTORY in names)
        ledger_directory = os.path.join(directory, LEDGER_DIRECTORY)
        if LEDGER_DIRECTORY in names and os.path.isdir(ledger_directory):
            self.check_ledger(ledger_directory, ends if listed is not None else None, removed)

    def _listed_partitions(self, path: str, topic_id: str
                           ) -> tuple[list[int], frozenset[int]] | None:  # fmt: skip
        """The partitions the topic's metadata lists, and the ids it handed out and no
        longer lists (removed: inactive, every row expired); None when it cannot be read."""
        try:
            payload = json.loads(self.fs.read_file(path))
        except FileNotFoundError:
            self.problem(MISSING, path, "the topic has no metadata file")
            return None
        except ValueError:
            self.problem(BAD_METADATA, path, "not valid JSON")
            return None
        issue = _topic_metadata_issue(payload, topic_id)
        if issue is not None:
            self.problem(BAD_METADATA, path, issue)
            return None
        listed = sorted(item["id"] for item in payload["partitions"])
        next_id = payload.get("next_partition_id")
        if not isinstance(next_id, int):  # (as the open: the partitions created)
            next_id = payload.get("config", {}).get("partition_count", 0)
        return listed, frozenset(range(next_id)) - set(listed)

    # -- partitions ---------------------------------------------------------------------------
    def check_partition(self, topic_id: str, partition_id: int, directory: str, *,
                        ledger: bool = False) -> int | None:  # fmt: skip
        """Check a partition; returns its log's end offset (None when a segment could not
        be read). ``ledger``: the topic has a ledger directory (its snapshots may claim
        offsets past their names: ``check_frames.snapshot_issue``)."""
        names = self.fs.list_directory(directory)
        bases = sorted(
            base
            for base in (file_names.parse_offset(n, file_names.LOG_SUFFIX) for n in names)
            if base is not None
        )
        self._check_partition_names(directory, names, set(bases))
        self.report.segments += len(bases)
        published = self.report.published.setdefault((topic_id, partition_id), set())
        end_offset: int | None = 0  # a partition without segments ends at 0 (log_loader)
        last_time_us = -(2**63)
        for index, base in enumerate(bases):
            path = os.path.join(directory, file_names.log_file(base))
            try:
                walk = walk_frames(self.fs, path, base)
            except StorageIOError as error:
                self.problem(UNREADABLE, path, str(error))
                end_offset = None
                continue
            following = bases[index + 1] if index + 1 < len(bases) else None
            end_offset = self._check_segment(base, walk, following)
            last_time_us = self._check_times(walk, last_time_us)
            self._check_indexes(directory, base, walk)
            self.report.frames += len(walk.frames)
            published.update(h.transaction_id for _, h in walk.frames if h.transaction_id)
        self._check_snapshots(directory, names, end_offset, ledger)
        return end_offset

    def _check_partition_names(self, directory: str, names: list[str], bases: set[int]) -> None:
        for name in names:
            path = os.path.join(directory, name)
            if name.endswith(file_names.TEMP_SUFFIX) or name.endswith(file_names.DELETED_SUFFIX):
                text = "leftover of interrupted work (repair deletes it)"
                self.problem(LEFTOVER, path, text, fix=self.remove_fix(path))
                continue
            kinds = (
                file_names.LOG_SUFFIX,
                file_names.OFFSET_INDEX_SUFFIX,
                file_names.TIME_INDEX_SUFFIX,
                file_names.SNAPSHOT_SUFFIX,
            )
            kind = next((k for k in kinds if file_names.parse_offset(name, k) is not None), None)
            if kind is None:
                self.problem(UNKNOWN_FILE, path, "not a file of a partition")
            elif kind in kinds[1:3] and file_names.parse_offset(name, kind) not in bases:
                text = "index without its log (repair deletes it)"
                self.problem(LEFTOVER, path, text, fix=self.remove_fix(path))

    def _check_segment(self, base: int, walk: LogWalk, following: int | None) -> int:
        """Report the walk's damage, a torn tail and gaps; returns the segment's end offset."""
        path = walk.path
        for kind, position, text in walk.damage:
            self.problem(kind, path, text, position)
        end = walk.end_offset if walk.end_offset is not None else base
        # A first frame not at the segment's base was reported as a gap at byte 0.
        named_right = not walk.frames or walk.frames[0][1].base_offset == base
        if walk.tail_position is not None:
            torn = walk.size_bytes - walk.tail_position
            if named_right and (following is None or end == following):
                text = f"the last {torn} bytes hold no valid frame: a torn tail (repair cuts it)"
                fix = partial(_truncate, self.fs, path, walk.tail_position)
                self.problem(TORN_TAIL, path, text, walk.tail_position, fix=fix)
            else:
                text = f"the sealed segment ends in {torn} damaged bytes (not repairable)"
                if following is not None and end < following:
                    text += f"; offsets {end} to {following - 1} are lost"
                self.problem(BROKEN_FRAME, path, text, walk.tail_position)
        elif following is not None and end != following:
            text = f"the segment ends at offset {end} but the next one starts at {following}"
            self.problem(OFFSET_GAP, path, text + " (not repairable)")
        return end

    def _check_times(self, walk: LogWalk, last_time_us: int) -> int:
        for position, header in walk.frames:
            if header.written_at_us < last_time_us:
                text = f"written_at {header.written_at_us} µs is before {last_time_us} µs"
                self.problem(TIME_BACKWARDS, walk.path, text, position)
                return walk.frames[-1][1].written_at_us  # one report per segment
            last_time_us = header.written_at_us
        return last_time_us

    def _check_indexes(self, directory: str, base: int, walk: LogWalk) -> None:
        if walk.frames and walk.frames[0][1].base_offset != base:
            return  # the frames do not fit the segment's name: no index could be right
        paths = (
            os.path.join(directory, file_names.offset_index_file(base)),
            os.path.join(directory, file_names.time_index_file(base)),
        )
        raws = (self._read_or_none(paths[0]), self._read_or_none(paths[1]))
        issues = (
            offset_index_issue(raws[0], base, walk.frames),
            time_index_issue(raws[1], base, walk.frames),
        )
        fix = partial(_rebuild_indexes, self.fs, directory, base, walk.frames)
        for path, raw, issue in zip(paths, raws, issues, strict=True):
            if issue is None:
                continue
            if not raw:
                # Missing or empty: not written yet when the process stopped (a segment's
                # index is created at its first flush; an adopted segment's after its
                # rename, over the empty one of the segment it replaced): the open
                # rebuilds it from the frames (``log_loader``), as repair does.
                text = issue[0] if raw is None else "the index file is empty"
                text += " (the next open rebuilds both indexes from the frames)"
                self.problem(BAD_INDEX, path, text, fix=fix, recovered_at_open=True)
            else:
                text = issue[0] + " (repair rebuilds both indexes from the frames)"
                self.problem(BAD_INDEX, path, text, issue[1], fix=fix)

    def _check_snapshots(self, directory: str, names: list[str], end_offset: int | None,
                         ledger: bool) -> None:  # fmt: skip
        for name in names:
            offset = file_names.parse_offset(name, file_names.SNAPSHOT_SUFFIX)
            if offset is None:
                continue
            path = os.path.join(directory, name)
            if end_offset is not None and offset > end_offset:
                text = f"snapshot of offset {offset} lies past the log end {end_offset}"
                self.problem(
                    BAD_SNAPSHOT, path, text + " (repair deletes it)", fix=self.remove_fix(path)
                )
                continue
            try:
                issue = snapshot_issue(self.fs.read_file(path), offset, ledger=ledger)
            except (FileNotFoundError, StorageIOError) as error:
                issue = f"unreadable ({error})"
            if issue is not None:
                self.problem(
                    BAD_SNAPSHOT, path, issue + " (repair deletes it)", fix=self.remove_fix(path)
                )

    # -- staging ------------------------------------------------------------------------------
    def check_staging(self, directory: str) -> None:
        """Staged frames carry no offset chain, and commit records (``storage.commit_log``)
        lie between them; a torn tail is an unsynced, uncommitted append."""
        for name in self.fs.list_directory(directory):
            path = os.path.join(directory, name)
            if file_names.parse_offset(name, STAGE_SUFFIX) is None:
                self.problem(UNKNOWN_FILE, path, "not a staging file")
                continue
            self.report.staging_files += 1
            try:
                walk = walk_staging(self.fs.read_file(path))
            except (FileNotFoundError, StorageIOError) as error:
                self.problem(UNREADABLE, path, str(error))
                continue
            for position, damaged, kept_place in walk.damage:
                if kept_place:
                    text = "checksum mismatch; the frame keeps its place (not repairable)"
                    self.problem(CORRUPT_FRAME, path, text, position)
                    continue
                text = f"{damaged} damaged bytes before the next valid frame (not repairable)"
                self.problem(BROKEN_FRAME, path, text, position)
            if walk.tail_position is not None:
                torn = walk.size_bytes - walk.tail_position
                text = f"the last {torn} bytes hold no valid frame: a torn tail (repair cuts it)"
                fix = partial(_truncate, self.fs, path, walk.tail_position)
                self.problem(TORN_TAIL, path, text, walk.tail_position, fix=fix)

    # -- a topic's ledger ----------------------------------------------------------------
    def check_ledger(self, directory: str, ends: dict[int, int | None] | None = None,
                     removed: frozenset[int] = frozenset()) -> None:  # fmt: skip
        """The ledger's files in number order: each one's valid frames (``scan``), their
        sequence numbers one after another across files, a torn tail reported; then,
        when the frames are whole and ``ends`` (each listed partition's log end, None
        where not known) is given, the open's rule for the shares (``_check_shares``),
        the shares of ``removed`` partitions counting as copied."""
        numbered = []
        for name in self.fs.list_directory(directory):
            number = file_names.parse_offset(name, LEDGER_SUFFIX)
            if number is None:
                self.problem(UNKNOWN_FILE, os.path.join(directory, name), "not a ledger file")
            else:
                numbered.append((number, os.path.join(directory, name)))
        previous: int | None = None  # the sequence number of the last frame seen
        whole = True  # every file read and no frame missing: the shares can be followed
        walked: list[tuple[str, list[ledger_format.LedgerFrame]]] = []
        for _, path in sorted(numbered):
            try:
                raw = self.fs.read_file(path)
                frames, valid_end = ledger_format.scan(raw, path)
            except FileNotFoundError as error:
                self.problem(UNREADABLE, path, str(error))
                whole = False
                continue
            except CorruptSegmentError as error:
                text = f"{error} (not repairable)"
                self.problem(CORRUPT_FRAME, path, text, error.position)
                previous = None  # the chain is not known past the damage
                whole = False
                continue
            if frames and previous is not None and frames[0].sequence != previous + 1:
                text = (f"the file's first frame is number {frames[0].sequence}, the one "
                        f"before it {previous}: frames are missing (not repairable)")  # fmt: skip
                self.problem(OFFSET_GAP, path, text)
                whole = False
            if frames:
                previous = frames[-1].sequence
            walked.append((path, frames))
            if valid_end < len(raw):
                torn = len(raw) - valid_end
                text = (f"the last {torn} bytes hold no valid frame: a torn tail, never "
                        "acknowledged (the open writes on in a new file; repair cuts it)"
                        )  # fmt: skip
                fix = partial(_truncate, self.fs, path, valid_end)
                self.problem(TORN_TAIL, path, text, valid_end, fix=fix, recovered_at_open=True)
        if whole and ends is not None:
            self._check_shares(walked, ends, removed)

    def _check_shares(self, walked: list[tuple[str, list[ledger_format.LedgerFrame]]],
                      ends: dict[int, int | None],
                      removed: frozenset[int] = frozenset()) -> None:  # fmt: skip
        """The open's rule (``Ledger._index_recovered``): each share of a partition is
        either wholly below its log's end (copied) or continues the partition's offsets
        from there, share after share; a share across the log's end, one that leaves a
        gap, or one of a partition the topic does not list stops the open (``Store.open``
        raises ``CorruptSegmentError``) and is reported, not repaired: it needs a person.
        Partitions whose end is not known are passed over, and so are the shares of a
        removed partition (an id the topic handed out and no longer lists): the open
        counts them as copied."""
        following = {p: end for p, end in ends.items() if end is not None}
        reported: set[int] = set()  # one problem a partition: the first share that fails
        for path, frames in walked:
            for frame in frames:
                shares = frame.shares
                triples = zip(shares["partition"].tolist(), shares["base"].tolist(),
                              shares["count"].tolist(), strict=True)  # fmt: skip
                for partition, base, count in triples:
                    if partition in reported or partition in removed:
                        continue
                    if partition not in ends:
                        reported.add(partition)
                        text = (f"ledger frame {frame.sequence} holds rows of partition "
                                f"{partition}, which the topic does not list (the open "
                                "refuses it; not repairable)")  # fmt: skip
                        self.problem(MISSING, path, text, frame.position)
                        continue
                    own = ends[partition]
                    if own is None:
                        continue
                    if base + count <= own:
                        continue  # copied into the log already
                    issue = None
                    if base < own:
                        issue = (f"its share of partition {partition} (offsets {base} to "
                                 f"{base + count - 1}) straddles the log's end {own}")  # fmt: skip
                    elif base != following[partition]:
                        issue = (f"its share of partition {partition} starts at {base}, "
                                 f"where {following[partition]} was next: a gap in the "
                                 "partition's offsets")  # fmt: skip
                    if issue is not None:
                        reported.add(partition)
                        text = (f"ledger frame {frame.sequence}: {issue} (the open refuses "
                                "it; not repairable)")  # fmt: skip
                        self.problem(OFFSET_GAP, path, text, frame.position)
                        continue
                    following[partition] = base + count

    def _read_or_none(self, path: str) -> bytes | None:
        try:
            return self.fs.read_file(path)
        except FileNotFoundError:
            return None


# -- repairs ----------------------------------------------------------------------------------
def _truncate(fs: FileSystem, path: str, size: int) -> None:
    fd = fs.open_write(path)
    try:
        assert fs.file_size(fd) >= size
        fs.truncate(fd, size)
        fs.sync(fd)
    finally:
        fs.close(fd)


def _rebuild_indexes(
    fs: FileSystem, directory: str, base: int, frames: list[tuple[int, FrameHeader]]
) -> None:
    offset_entries, time_entries = index_entries(base, frames)
    OffsetIndex(fs, os.path.join(directory, file_names.offset_index_file(base)), base).rewrite(
        offset_entries
    )
    TimeIndex(fs, os.path.join(directory, file_names.time_index_file(base)), base).rewrite(
        time_entries
    )


def _manifest_issue(payload: Any) -> str | None:
    """What is wrong with a parsed ``store.json``; None if it is well-formed."""
    if not isinstance(payload, dict) or not isinstance(payload.get("next_topic_id"), int):
        return "malformed: no next_topic_id"
    topics = payload.get("topics")
    if not isinstance(topics, list):
        return "malformed: no topic list"
    for topic_id in topics:
        number = topic_id[1:] if isinstance(topic_id, str) and topic_id[:1] == "t" else ""
        if not number.isdigit() or not 0 < int(number) < payload["next_topic_id"]:
            return f"malformed topic id {topic_id!r}"
    return None


def _topic_metadata_issue(payload: Any, topic_id: str) -> str | None:
    """What is wrong with a parsed ``topic.json``; None if it is well-formed."""
    if not isinstance(payload, dict) or payload.get("id") != topic_id:
        return f"it does not name topic {topic_id}"
    if not isinstance(payload.get("config"), dict):
        return "malformed: no config"
    partitions = payload.get("partitions")
    if not isinstance(partitions, list) or not all(isinstance(p, dict) for p in partitions):
        return "malformed: no partition list"
    ids = [item.get("id") for item in partitions]
    if not all(isinstance(i, int) and i >= 0 for i in ids) or len(set(ids)) != len(ids):
        return f"malformed partition ids {ids!r}"
    return _lineage_issue(payload, partitions)


def _lineage_issue(payload: dict[str, Any], partitions: list[dict[str, Any]]) -> str | None:
    """What is wrong with the partitions' lineage and key ranges (autopartitioning splits).

    A child names its parent and the parent lists it; a partition with children is
    inactive; ids lie below ``next_partition_id``; on a ranged topic the active
    ranges cover the hash space without overlap, and a split parent's range is its
    children's together. A parent deleted by retention leaves children naming it.
    """
    by_id = {item["id"]: item for item in partitions}
    next_id = payload.get("next_partition_id")
    if isinstance(next_id, int) and any(i >= next_id for i in by_id):
        return f"a partition id is not below next_partition_id {next_id}"
    for item in partitions:
        parent = item.get("parent")
        children = item.get("children") or []
        if children and item.get("active"):
            return f"partition {item['id']} has children but is active"
        if (
            parent is not None
            and parent in by_id
            and item["id"] not in (by_id[parent].get("children") or [])
        ):
            return f"partition {item['id']} names parent {parent}, which does not list it"
        for child in children:
            if child in by_id and by_id[child].get("parent") != item["id"]:
                return f"partition {item['id']} lists child {child}, which names another parent"
    ranges = [(item["id"], item.get("range")) for item in partitions]
    if all(key_range is None for _, key_range in ranges):
        return None
    if any(not (isinstance(r, list) and len(r) == 2) for _, r in ranges):
        return "some partitions have a key range and some do not"
    active = sorted(tuple(r) for (i, r) in ranges if by_id[i].get("active"))
    position = 0
    for low, high in active:
        if low != position or high <= low:
            return f"the active key ranges do not tile the hash space at {position:#x}"
        position = high
    if position != HASH_SPACE:
        return "the active key ranges do not reach the end of the hash space"
    for item in partitions:
        kids = [by_id[c] for c in item.get("children") or [] if c in by_id]
        if len(kids) == len(item.get("children") or []) and kids:
            spans = sorted(tuple(k["range"]) for k in kids)
            if (
                spans[0][0] != item["range"][0]
                or spans[-1][1] != item["range"][1]
                or any(a[1] != b[0] for a, b in itertools.pairwise(spans))
            ):
                return f"the children of partition {item['id']} do not split its key range"
    return None
