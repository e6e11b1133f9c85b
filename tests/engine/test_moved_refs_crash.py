"""Moves committed by reference (``engine.moved_refs``) across crashes.

A child process (``moved_refs_child.py``) fills topic ``a`` and moves it to ``b`` with
``INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a WITH (consumer = ...)``, whose
commit records name ``a``'s ranges instead of staging the data. It is crashed at the
commit protocol's failpoints (``os._exit(137)``, like SIGKILL) and by SIGKILL at random
moments; after each crash the directory is opened (recovery derives the unpublished
moves from ``a``) and checked: ``b`` holds exactly the messages of ``a`` below the
consumer's committed offsets, each once. A last child then drains ``a`` and the check
is repeated: every message of ``a`` is in ``b`` once.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.database import Database
from storage import commit_log
from tests.fork_server import ModuleForkServer

HERE = Path(__file__).resolve().parent
CHILD = HERE / "moved_refs_child.py"
TIMEOUT_S = 300  # catches hangs only: two shared cores under load


# The failpoint tests' children are forked by ``tests.fork_server`` (~1 s of imports saved
# each; same crash points); the random SIGKILL test still starts real processes.
_SERVER = ModuleForkServer(CHILD)
_fork_server = _SERVER.fixture()


def _run(path: Path, failpoints: str = "", *args: str) -> subprocess.CompletedProcess:
    return _SERVER.run([str(path), *args], failpoints=failpoints, timeout=TIMEOUT_S)


def _check(path: Path, *, drained: bool = False) -> int:
    """``b`` = the messages of ``a`` below the committed offsets, each once. Returns how
    many were moved; with ``drained``, every message of ``a`` was."""
    database = Database.open(str(path), retention_interval_s=None)
    try:
        session = database.connect()
        a = session.execute('SELECT partition, "offset", data FROM TOPIC a')[-1].table.to_pylist()
        b = session.execute("SELECT data FROM TOPIC b")[-1].table.column("data").to_pylist()
        topic_id = database.catalog.entry("a").topic_id
        committed = {
            p: database.catalog.committed(topic_id, "mover", p) or 0
            for p in database.topic_log(topic_id).partition_ids()
        }
        expected = [r["data"] for r in a if r["offset"] < committed[r["partition"]]]
        counts = collections.Counter(b)
        assert not [v for v, n in counts.items() if n > 1], "a message moved twice"
        assert sorted(b) == sorted(expected), (len(b), len(expected))
        if drained:
            assert len(expected) == len(a)
        session.close()
        return len(b)
    finally:
        database.close()


def _referenced(path: Path) -> int:
    """Commit records in the staging log that name moved ranges (not yet checkpointed)."""
    staging = path / "staging"
    found = 0
    for name in sorted(os.listdir(staging)) if staging.exists() else []:
        raw = (staging / name).read_bytes()
        found += sum(b'"moved"' in record.payload for record in commit_log.scan(raw))
    return found


@pytest.mark.parametrize(
    "failpoint",
    [
        "commit.before_log_append=crash@5",
        "commit.after_log_append=crash@5",
        "staging.torn_record=crash@5",
        "commit.after_commit_point=crash@5",
        "segment.torn_write=crash@12",
        "commit.checkpoint_before_delete=crash@2",
        "commit.checkpoint_before_release=crash@2",
    ],
)
def test_a_crash_at_a_failpoint_keeps_every_move_once(tmp_path: Path, failpoint: str) -> None:
    path = tmp_path / "data"
    crashed = _run(path, failpoint)
    assert crashed.returncode == 137, (failpoint, crashed.stdout, crashed.stderr[-2000:])
    assert "started" in crashed.stdout
    referenced = _referenced(path)  # before the open below recovers and checkpoints
    moved = _check(path)
    if failpoint.startswith(("commit.after_log_append", "commit.after_commit_point")):
        assert referenced >= 1  # the crash left a record naming ranges to derive
        assert moved >= 1
    finished = _run(path, "", "--fill", "0", "--moves", "1000")
    assert finished.returncode == 0, finished.stderr[-2000:]
    _check(path, drained=True)


def test_a_crash_during_recovery_is_finished_by_the_next_open(tmp_path: Path) -> None:
    path = tmp_path / "data"
    assert _run(path, "commit.after_commit_point=crash@6").returncode == 137
    assert _referenced(path) >= 1
    again = _run(path, "recovery.after_republish=crash@1", "--fill", "0")
    assert again.returncode == 137, again.stderr[-2000:]
    _check(path)
    assert _run(path, "", "--fill", "0", "--moves", "1000").returncode == 0
    _check(path, drained=True)


def test_sigkill_at_random_moments_keeps_every_move_once(tmp_path: Path) -> None:
    seed = int(os.environ.get("MOVED_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    path = tmp_path / "data"
    for round_ in range(4):
        child = subprocess.Popen(
            [sys.executable, str(CHILD), str(path), "--moves", "100000", "--fill", "2000",
             "--seed", str(round_)],
            env={**os.environ, "TOPICBASE_FAILPOINTS": ""},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert child.stdout is not None
        child.stdout.readline()  # "started": opened (and recovered)
        time.sleep(rng.uniform(0.2, 1.5))
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=TIMEOUT_S)
        try:
            _check(path)
        except AssertionError as error:
            raise AssertionError(f"MOVED_CRASH_SEED={seed}, round {round_}") from error
    assert _run(path, "", "--fill", "0", "--moves", "100000").returncode == 0
    _check(path, drained=True)
