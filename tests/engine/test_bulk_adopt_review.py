"""Adoption of staged frames (review R2 of round 14): the staging cap charged what is on
disk, a refused stream leaves no file, own files synced before the commit point, two bulk
commits adopting into the same partitions at once, readers tailing while segments are
adopted."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from engine import bulk_write
from storage import limits
from storage.check import check_store
from storage.staged_frames import OWN_FILE, BadStagedFrameError
from tests.engine.test_bulk_commit_framed import (
    _commit,
    _frames_files,
    _open,
    _partitions,
    _stage,
)


@pytest.fixture
def own_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every partition's frames staged in files of their own and adopted from 1 KiB."""
    monkeypatch.setattr(limits, "ADOPT_SWITCH_BYTES", 0)
    monkeypatch.setattr(limits, "ADOPT_BYTES_MIN", 1024)


def _frames_of_an_aborted_write(database: Any) -> tuple[Any, Any, bytes]:
    """A session, the bulk writer with write ``w2`` started, and the frames a staged write
    ``w1`` held (``w1`` aborted): a stream as the JVM writer sends it."""
    _stage(database, "w1", 0, 3000)
    session = database.connect()
    bulk = bulk_write.for_database(database)
    bulk.start(session, "w2", "topic", "t")
    frames = b"".join(Path(p).read_bytes() for p in _frames_files(database, "w1"))
    bulk.abort(session, ["w1"])
    return session, bulk, frames


def test_append_frames_abort_gives_back_every_byte_it_charged(tmp_path) -> None:
    database = _open(tmp_path)
    try:
        session, bulk, frames = _frames_of_an_aborted_write(database)
        base = bulk.staged_bytes
        assert bulk.append_frames(session, "w2", io.BytesIO(frames).read) == 3000
        on_disk = sum(Path(p).stat().st_size for p in _frames_files(database, "w2"))
        charged = bulk.staged_bytes - base
        bulk.abort(session, ["w2"])
        after = bulk.staged_bytes
        session.close()
        assert (charged, after) == (on_disk, base), (charged, on_disk, after, base)
    finally:
        database.close()


def test_append_frames_refused_mid_stream_leaves_no_file(tmp_path, own_files) -> None:
    database = _open(tmp_path)
    try:
        session, bulk, frames = _frames_of_an_aborted_write(database)
        base = bulk.staged_bytes
        with pytest.raises(BadStagedFrameError):  # a torn last frame: 22P04
            bulk.append_frames(session, "w2", io.BytesIO(frames + b"\x00" * 64).read)
        left = [n for _, _, names in os.walk(os.path.join(bulk.root, "w2")) for n in names]
        assert [n for n in left if n != "write.json"] == [], left
        assert bulk.staged_bytes == base
        session.close()
    finally:
        database.close()


def test_own_files_are_synced_before_the_commit_point(tmp_path, monkeypatch, own_files) -> None:
    database = _open(tmp_path)
    synced: list[str] = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(bulk_write.failpoints, "hit", lambda name: synced.append("<point>")
                        if name == "bulk.before_commit" else None)  # fmt: skip
    try:
        _stage(database, "w1", 0, 3000)
        own = [os.path.basename(p) for p in _frames_files(database, "w1")
               if OWN_FILE.match(os.path.basename(p))]  # fmt: skip
        assert own
        assert _commit(database, 0, ["w1"])["rows"] == 3000
        point = synced.index("<point>")
        assert set(own) <= {os.path.basename(p) for p in synced[:point]}, (own, synced)
    finally:
        database.close()


def test_two_bulk_commits_adopting_into_the_same_partitions_at_once(tmp_path, own_files) -> None:
    database = _open(tmp_path)
    try:
        writes = [f"w{i}" for i in range(9)]
        for number, write in enumerate(writes):
            _stage(database, write, number * 3000, 3000)
        # The sink is claimed by its first commit: two first commits at once would race
        # for the claim (one refused, 23505), which is not what this test is about.
        assert _commit(database, 100, writes[8:])["status"] == "committed"
        writes = writes[:8]
        errors: list[BaseException] = []

        def commit(batch: int, ids: list[str]) -> None:
            try:
                assert _commit(database, batch, ids)["status"] == "committed"
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=commit, args=(b, writes[b::4])) for b in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        database.committer.checkpoint()
        found = _partitions(database)
        for p in (0, 1):
            expected = sorted(b"m%05d" % i for i in range(0, 27000) if i % 2 == p)
            assert sorted(found[p]) == expected
        topic = database.topic_log(database.catalog.entry("t").topic_id)
        adopted = [len([s for s in topic.partition(p).segments if s.size_bytes]) for p in (0, 1)]
        assert min(adopted) >= 8, adopted
    finally:
        database.close()
    report = check_store(str(tmp_path / "data" / "store"))
    assert report.ok, report.lines()


def test_readers_tailing_while_segments_are_adopted(tmp_path, own_files) -> None:
    database = _open(tmp_path)
    try:
        writes = [f"w{i}" for i in range(12)]
        for number, write in enumerate(writes):
            _stage(database, write, number * 3000, 3000)
        topic = database.topic_log(database.catalog.entry("t").topic_id)
        stop = threading.Event()
        errors: list[BaseException] = []
        seen = {0: 0, 1: 0}

        def tail(partition: int) -> None:
            log = topic.partition(partition)
            offset = 0
            try:
                while not stop.is_set() or offset < log.end_offset:
                    read = log.read(offset, max_messages=500)
                    for batch in read.batches:
                        offsets = batch.column("offset").to_pylist()
                        assert offsets == list(range(offset, offset + len(offsets))), offsets[:3]
                        data = batch.column("data").to_pylist()
                        assert all(int(d[1:]) % 2 == partition for d in data)
                        offset += len(offsets)
                    seen[partition] = offset
            except BaseException as error:
                errors.append(error)

        readers = [threading.Thread(target=tail, args=(p,)) for p in (0, 1) for _ in range(2)]
        for reader in readers:
            reader.start()
        for batch, write in enumerate(writes):
            assert _commit(database, batch, [write])["status"] == "committed"
        stop.set()
        for reader in readers:
            reader.join(60)
        assert not errors, errors
        assert seen == {0: 18000, 1: 18000}, seen
        adopted = [len([s for s in topic.partition(p).segments if s.size_bytes]) for p in (0, 1)]
        assert min(adopted) >= 12, adopted
    finally:
        database.close()


def test_a_shares_own_files_are_adopted_together_with_fewer_syncs(
        tmp_path, monkeypatch, own_files) -> None:  # fmt: skip
    """Round 15: a partition's own files of one commit (6 COPYs, so 6 per partition) are
    adopted in one run (``PartitionLog._adopt_locked`` once per partition): each patched
    file synced and one directory sync per file, its two index files synced when the next
    file seals it (review R2-A3), one producer snapshot (its file and the directory) at
    the end: at most 4 syncs per file and 2 more, where adopting them one by one took 5
    per file (the file, its indexes, a snapshot and the directory each). The rows are
    whole and in order, the store checks clean."""
    from storage.partition_log import PartitionLog

    database = _open(tmp_path)
    writes = [f"w{i}" for i in range(6)]
    for number, write in enumerate(writes):
        _stage(database, write, number * 3000, 3000)
    syncs: dict[int, int] = {}  # per adoption call, its fdatasyncs and fsyncs
    adopting = threading.local()
    real_adopt, real_fdatasync, real_fsync = PartitionLog._adopt_locked, os.fdatasync, os.fsync

    def adopt(self: Any, *args: Any) -> None:
        adopting.call = len(syncs)
        syncs[adopting.call] = 0
        try:
            real_adopt(self, *args)
        finally:
            adopting.call = None

    def counted(real: Any) -> Any:
        def sync(fd: int) -> None:
            if getattr(adopting, "call", None) is not None:
                syncs[adopting.call] += 1
            real(fd)
        return sync

    monkeypatch.setattr(PartitionLog, "_adopt_locked", adopt)
    monkeypatch.setattr(os, "fdatasync", counted(real_fdatasync))
    monkeypatch.setattr(os, "fsync", counted(real_fsync))
    try:
        assert _commit(database, 0, writes)["rows"] == 18000
        assert len(syncs) == 2, syncs  # one run per partition
        assert all(count <= 4 * 6 + 2 for count in syncs.values()), syncs
        database.committer.checkpoint()
        found = _partitions(database)
        for p in (0, 1):
            assert found[p] == [b"m%05d" % i for i in range(18000) if i % 2 == p]
        topic = database.topic_log(database.catalog.entry("t").topic_id)
        for p in (0, 1):
            assert len([s for s in topic.partition(p).segments if s.size_bytes]) == 6
    finally:
        database.close()
    report = check_store(str(tmp_path / "data" / "store"))
    assert report.ok, report.lines()
