"""A table-touching transaction stages its topic writes before COMMIT (``Committer.stage_early``).

Once an explicit transaction may touch a table, the session stages the topic writes it
made so far (routed, appended to the staging log under a provisional id) before the
statement runs, so that the staging sync runs beside its table statements. The COMMIT
takes those frames only if the writes are still exactly those; otherwise they are
released, as at a rollback, and by recovery after a crash (no record names them).
Crash tests run ``early_stage_child.py`` (move + counter upsert) to a failpoint or a
SIGKILL and check the reopened database: ``b`` holds exactly the consumed messages of
``a``, once each, and the counter equals their number.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine import commit
from engine.database import Database
from storage.errors import SerializationFailure

HERE = Path(__file__).resolve().parent
CHILD = HERE / "early_stage_child.py"
sys.path.insert(0, str(HERE))

import early_stage_child as child  # noqa: E402

MOVE = child.MOVE
UPSERT = child.UPSERT


@pytest.fixture
def database(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(commit, "CHECKPOINT_TRANSACTIONS", 10**9)
    database = Database.open(str(tmp_path / "data"))
    child.setup(database)
    yield database
    database.close()


def _values(session, sql: str) -> list:
    result = session.execute(sql)[-1]
    assert result.table is not None
    return result.table.column(0).to_pylist()


def _b(session) -> list[bytes]:
    return _values(session, "SELECT data FROM TOPIC b WITH (max_messages = 100000)")


def _counter(session) -> int:
    found = _values(session, "SELECT n FROM counters WHERE k = 'moved'")
    return found[0] if found else 0


def _users_of(database: Database, transaction_id: int) -> list[int]:
    """Staging files that still count ``transaction_id`` as a user."""
    users = database.committer.staging._users
    return [number for number, ids in users.items() if transaction_id in ids]


def test_the_upsert_stages_the_move_and_commit_appends_nothing(database, monkeypatch):
    session = database.connect()
    committer = database.committer
    appends: list[str] = []
    original = committer.staging.append

    def counting(*args, **kwargs):
        appends.append("append")
        return original(*args, **kwargs)

    monkeypatch.setattr(committer.staging, "append", counting)
    session.execute("BEGIN")
    session.execute(MOVE)
    assert appends == []  # a topic statement alone stages nothing
    session.execute(UPSERT, ["moved", 7])
    assert appends == ["append"]  # staged before the upsert ran
    early = session.transaction.early
    assert early is not None and early.ticket is not None
    session.execute("COMMIT")
    assert appends == ["append"]  # the COMMIT took those frames
    assert committer.early_stages_used == 1
    assert _users_of(database, early.provisional_id) == []  # handed to the commit's id
    assert len(_b(session)) == 7 and _counter(session) == 7
    session.close()


def test_writes_after_the_early_staging_are_staged_again_at_commit(database):
    session = database.connect()
    session.execute("BEGIN")
    session.execute(MOVE)
    session.execute(UPSERT, ["moved", 7])
    provisional = session.transaction.early.provisional_id
    session.execute(MOVE)  # more writes: the early frames no longer hold them all
    session.execute(UPSERT, ["moved", 7])
    session.execute("COMMIT")
    committer = database.committer
    assert (committer.early_stages, committer.early_stages_used) == (1, 0)
    assert _users_of(database, provisional) == []
    moved = _b(session)
    assert len(moved) == len(set(moved)) == 14 and _counter(session) == 14
    session.close()


def test_a_rollback_releases_the_early_staging(database):
    session = database.connect()
    session.execute("BEGIN")
    session.execute(MOVE)
    session.execute(UPSERT, ["moved", 7])
    provisional = session.transaction.early.provisional_id
    assert _users_of(database, provisional)
    session.execute("ROLLBACK")
    assert _users_of(database, provisional) == []
    assert _b(session) == [] and _counter(session) == 0
    session.close()


def test_a_transaction_refused_at_commit_releases_the_frames_it_took(database):
    """Two sessions read the same range; the second COMMIT is refused (40001) after it
    took its early frames: they go with it."""
    first, second = database.connect(), database.connect()
    move = MOVE.replace("consumer = 'c'", "consumer = 'c', partition = 0")
    for session, key in ((first, "moved"), (second, "other")):
        session.execute("BEGIN")
        session.execute(move)
        session.execute(UPSERT, [key, 7])
    first.execute("COMMIT")
    with pytest.raises(SerializationFailure, match="moved from"):
        second.execute("COMMIT")
    staging = database.committer.staging
    owners = {t for ids in staging._users.values() for t in ids}
    assert len(owners) == 1  # the first's commit only (until its checkpoint)
    assert len(_b(first)) == 7 and _counter(first) == 7
    first.close()
    second.close()


def test_the_commit_after_an_early_staging_is_recovered(tmp_path: Path, monkeypatch):
    """Committed, then a crash before any checkpoint: recovery publishes the frames
    staged early, named by the commit's record row."""
    monkeypatch.setattr(commit, "CHECKPOINT_TRANSACTIONS", 10**9)
    path = str(tmp_path / "data")
    database = Database.open(path)
    child.setup(database)
    session = database.connect()
    for _ in range(3):
        session.execute("BEGIN")
        session.execute(MOVE)
        session.execute(UPSERT, ["moved", 7])
        session.execute("COMMIT")
    session.close()
    assert database.committer.early_stages_used == 3
    monkeypatch.setattr(database.committer, "checkpoint", lambda: None)
    database.close()
    _check(path, committed=21)


# -- crashes (a child process) -----------------------------------------------------------
def _run_child(path: str, transactions: int, failpoints: str = "", rollback_every: int = 0,
               kill_after_s: float | None = None) -> int:  # fmt: skip
    environment = {k: v for k, v in os.environ.items() if k != "TOPICBASE_FAILPOINTS"}
    if failpoints:
        environment["TOPICBASE_FAILPOINTS"] = failpoints
    process = subprocess.Popen(
        [sys.executable, str(CHILD), path, str(transactions), str(rollback_every)],
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    if kill_after_s is not None:
        time.sleep(kill_after_s)
        process.send_signal(signal.SIGKILL)
    _out, err = process.communicate(timeout=600)
    assert process.returncode in (0, 137, -9), err.decode()
    return process.returncode


def _check(path: str, committed: int | None = None) -> int:
    """The reopened database: b holds exactly the consumed messages of a, once each, and
    the counter counts them. Returns how many were moved."""
    database = Database.open(path)
    try:
        session = database.connect()
        moved = _b(session)
        session.execute("BEGIN")  # a consumer read, rolled back: the offsets stay
        left = _values(session, "SELECT data FROM TOPIC a WITH (consumer = 'c', "
                                "max_messages = 100000)")  # fmt: skip
        session.execute("ROLLBACK")
        everything = {f"m{i:03d}".encode() for i in range(child.MESSAGES)}
        assert len(moved) == len(set(moved)), "a message moved twice"
        assert set(moved) | set(left) == everything and not set(moved) & set(left)
        assert _counter(session) == len(moved)
        if committed is not None:
            assert len(moved) == committed
        session.close()
        return len(moved)
    finally:
        database.close()


CRASH_POINTS = [
    "commit.after_early_stage=crash@1",  # staged early, nothing committed
    "commit.after_early_stage=crash@3",
    "commit.after_stage=crash@2",  # the early frames durable, before the commit point
    "commit.after_commit_point=crash@2",  # committed, not published
    "commit.after_commit_point=crash@1",
    "staging.after_sync=crash@3",
    "commit.checkpoint_before_release=crash@1",
]


@pytest.mark.parametrize("failpoint", CRASH_POINTS)
def test_a_crash_at_a_commit_point_leaves_each_message_moved_once(tmp_path: Path, failpoint):
    path = str(tmp_path / "data")
    assert _run_child(path, 0) == 0  # set up
    code = _run_child(path, 6, failpoint, rollback_every=4)
    assert code == 137, f"{failpoint} was not reached"
    before = _check(path)
    assert _run_child(path, 4) == 0  # recovery, then more commits on the same log
    after = _check(path)
    assert after >= before


def test_sigkills_at_random_moments_leave_each_message_moved_once(tmp_path: Path):
    rng = random.Random(int(os.environ.get("TXN_SEED") or time.time()))
    path = str(tmp_path / "data")
    assert _run_child(path, 0) == 0  # set up
    for _ in range(4):
        _run_child(path, 12, rollback_every=5, kill_after_s=rng.uniform(0.3, 2.5))
        _check(path)
    assert _run_child(path, 1) == 0
    _check(path)
