"""Committed transactions survive a power cut after a checkpoint.

Published frames are not synced at commit: until a checkpoint, a transaction's durable
home is its staged copy and its commit record (in DuckDB), and recovery re-publishes
from them. A checkpoint syncs the partitions it published to and only *then* deletes
the records and releases the staging. If it deleted them first, a power cut (the page
cache lost, unlike a process kill) would take the unsynced frames with it and nothing
would be left to re-publish them from.

The data directory runs on ``FaultyFileSystem``; ``power_cut`` puts every file it
wrote back to its last synced image. DuckDB does its own I/O (and syncs its WAL at
every commit), so the records it holds are taken as durable as they are.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import pytest

from engine.check import check_database
from engine.database import Database
from tests.sim.faulty_fs import Fault, FaultyFileSystem


def _open(path: Path, fs: FaultyFileSystem) -> Database:
    return Database.open(str(path), fs=fs, retention_interval_s=None)


def _cut_power(database: Database, fs: FaultyFileSystem, *, partial: bool = False) -> None:
    """The machine loses power: unsynced data is gone, and the process with it.

    The dead process must do nothing more: no ``close`` (its last checkpoint would
    delete records in DuckDB, which does not go through ``fs``). Its DuckDB connection
    is dropped without a commit (as a killed process's would be), the database leaves
    the process's registry, and every file call of the dead objects raises
    ``SimulatedCrash`` (their descriptors, the directory lock among them, are closed).
    Then the machine restarts."""
    fs.power_cut(partial_writeback=partial)
    Database._open.pop(database.path, None)  # the registry of open directories
    with contextlib.suppress(Exception):
        database.committer._cursor.close()
    database.root.close()
    fs.restart()


def _die(database: Database, fs: FaultyFileSystem) -> None:
    """The process already died (a crash fault fired): tear down what it left, restart."""
    Database._open.pop(database.path, None)
    with contextlib.suppress(Exception):
        database.committer._cursor.close()
    database.root.close()
    fs.restart()


def _payloads(session, topic: str) -> list[str]:
    result = session.execute(
        f'SELECT CAST(data AS VARCHAR) AS d FROM TOPIC {topic} ORDER BY partition, "offset"'
    )[-1]
    assert result.table is not None
    return result.table.column("d").to_pylist()


def _commit_transactions(session, count: int) -> list[str]:
    written = []
    for n in range(count):
        values = [f"t{n}.{p}" for p in range(3)]
        session.execute("BEGIN")
        session.execute(
            "INSERT INTO TOPIC b (data, partition) VALUES "
            + ", ".join(f"('{v}', {p})" for p, v in enumerate(values))
        )
        session.execute("COMMIT")
        written += values
    return sorted(written, key=lambda v: (v.split(".")[1], int(v[1 : v.index(".")])))


@pytest.mark.parametrize("strict_directories", [False, True], ids=["dirs-durable", "dirs-synced"])
def test_committed_topic_writes_survive_a_power_cut_after_a_checkpoint(
    tmp_path: Path, strict_directories: bool
) -> None:
    fs = FaultyFileSystem(seed=1, strict_directories=strict_directories)
    database = _open(tmp_path / "data", fs)
    session = database.connect()
    session.execute("CREATE TOPIC b WITH (min_active_partitions = 3)")
    expected = _commit_transactions(session, 4)
    checkpoint_syncs = database.committer.checkpoint_syncs
    database.committer.checkpoint()  # records deleted, staging released
    assert database.committer.checkpoint_syncs == checkpoint_syncs + 3
    _cut_power(database, fs)
    database = _open(tmp_path / "data", fs)
    try:
        session = database.connect()
        assert _payloads(session, "b") == expected
        session.close()
    finally:
        database.close()


def test_a_power_cut_before_the_checkpoint_is_repaired_from_the_records(tmp_path: Path) -> None:
    """Without a checkpoint the frames are lost too, but the records and the staging are
    durable: the reopen re-publishes every transaction."""
    fs = FaultyFileSystem(seed=2)
    database = _open(tmp_path / "data", fs)
    session = database.connect()
    session.execute("CREATE TOPIC b WITH (min_active_partitions = 3)")
    expected = _commit_transactions(session, 3)
    _cut_power(database, fs)
    database = _open(tmp_path / "data", fs)
    try:
        session = database.connect()
        assert _payloads(session, "b") == expected
        session.close()
    finally:
        database.close()


@pytest.mark.parametrize("seed", range(4))
def test_transactions_across_checkpoints_survive_a_power_cut_with_partial_writeback(
    tmp_path: Path, seed: int
) -> None:
    """Checkpoints between commits, then more commits, then a cut where the kernel had
    written back a random part of the dirty pages: every committed message is there,
    each once, in commit order per partition."""
    fs = FaultyFileSystem(seed=seed)
    database = _open(tmp_path / "data", fs)
    session = database.connect()
    session.execute("CREATE TOPIC b WITH (min_active_partitions = 3)")
    expected: list[str] = []
    for batch in range(3):
        session.execute("BEGIN")
        session.execute(
            "INSERT INTO TOPIC b (data, partition) VALUES "
            + ", ".join(f"('c{batch}.{p}', {p})" for p in range(3))
        )
        session.execute("COMMIT")
        expected += [f"c{batch}.{p}" for p in range(3)]
        if batch < 2:
            database.committer.checkpoint()
    _cut_power(database, fs, partial=True)
    database = _open(tmp_path / "data", fs)
    try:
        session = database.connect()
        assert _payloads(session, "b") == sorted(expected, key=lambda v: (v[-1], v))
        session.close()
    finally:
        database.close()


def test_cut_power_and_exit_leaves_only_synced_bytes_while_another_thread_writes(
    tmp_path: Path,
) -> None:
    """The chaos harness cuts power from a timer thread while the worker's threads keep
    writing: the process must end at the cut, and no write may land after it."""
    path = tmp_path / "f"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            fs = FaultyFileSystem(seed=3)
            fd = fs.open_write(str(path))
            fs.sync_directory(str(tmp_path))
            fs.pwrite(fd, b"synced", 0)
            fs.sync(fd)

            def write_forever() -> None:
                position = 6
                while True:
                    fs.pwrite(fd, b"x" * 100, position)
                    position += 100

            threading.Thread(target=write_forever, daemon=True).start()
            time.sleep(0.05)
            fs.cut_power_and_exit()
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 137
    assert path.read_bytes() == b"synced"


@pytest.mark.parametrize("metadata", ["topic.json", "store.json"])
def test_reopen_removes_the_temp_file_of_a_metadata_replace_cut_short(
    tmp_path: Path, metadata: str
) -> None:
    """A crash (or a power cut that kept the new file's name but not the rename) between
    writing ``<metadata>.tmp`` and renaming it over the metadata file leaves the temp
    file: the old metadata stands, and opening the store must delete the leftover, as
    it does in partitions; ``topicbase check`` then finds the store clean."""
    fs = FaultyFileSystem(seed=5)
    database = _open(tmp_path / "data", fs)
    session = database.connect()
    session.execute("CREATE TOPIC a")
    fs.add_fault(Fault("rename", error=None, path_contains=f"{metadata}.tmp"))
    with contextlib.suppress(BaseException):  # SimulatedCrash, however it surfaces
        # ALTER rewrites topic.json; CREATE TOPIC rewrites store.json.
        statement = "ALTER TOPIC a SET (retention_period = Interval('PT2H'))"
        session.execute(statement if metadata == "topic.json" else "CREATE TOPIC b")
    leftovers = [p for p in (tmp_path / "data").rglob(f"{metadata}.tmp")]
    assert leftovers, "the crash at the rename left no temp file: the test proves nothing"
    _die(database, fs)
    database = _open(tmp_path / "data", fs)
    try:
        session = database.connect()
        session.execute("INSERT INTO TOPIC a (data) VALUES ('still here')")
        assert _payloads(session, "a") == ["still here"]
        session.close()
    finally:
        database.close()
    report = check_database(str(tmp_path / "data"))
    assert report.ran and [p.line() for p in report.problems] == []
