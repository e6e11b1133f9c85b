"""Crash safety of retention on an idle partition: kills around the roll and the delete.

``idle_retention_child.py`` appends a batch, then runs a retention pass that finds the
whole partition expired, rolls the active segment and deletes it, over and over. Each
round kills it: SIGKILL at a random moment, or a crash failpoint (``os._exit(137)``)
at the n-th pass of a point of the roll/delete path. Then this process opens the store
(recovery) and checks, against what the child printed before it died:

- the log start never moves back (a start a pass returned, or a recovery showed,
  holds after every later recovery: expired data never comes back);
- every acknowledged message at or above the log start is there, at its offset, with
  its value, and the end offset is at least past every acknowledged message;
- offsets are never reused: a later round's first append lands at or after the end
  the previous recovery showed (a lost empty segment would restart the log at 0);
- ``topicbase check`` (``storage.check.check_store``) finds nothing wrong.

Half the rounds check a copy, so that the next child recovers from the crash itself.
``CRASH_KILLS`` (default 24: 12 rounds, so each of the 6 failpoints crashes once and 6
rounds are SIGKILLed; at least 12) sets the rounds, ``CRASH_SEED`` replays a run.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from storage.check import check_store
from storage.store import Store
from tests.fork_server import ModuleForkServer

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = max(12, int(os.environ.get("CRASH_KILLS", "24")) // 2)
POLICIES = ("always", "never", "group")
FAILPOINTS = (
    "retention.before_roll",
    "segment.roll_after_seal",
    "segment.roll_before_snapshot",
    "retention.after_roll",
    "retention.before_delete",
    "fs.after_sync",
)
CRASHED = (137, -signal.SIGKILL)
_SERVER = ModuleForkServer(Path(__file__).resolve().with_name("idle_retention_child.py"))
_fork_server = _SERVER.fixture()


@dataclass
class Expected:
    """What the children said before they died, and what recoveries showed."""

    values: dict[int, str] = field(default_factory=dict)  # offset -> acknowledged value
    start: int = 0  # the highest log start shown (by a pass that returned, or a recovery)
    end: int = 0  # the end offset after the last recovery
    acked_end: int = 0  # past the last acknowledged message


def _run_child(root: Path, policy: str, failpoint: str | None, delay: float) -> tuple[int, str]:
    """A round's child: forked (``tests.fork_server``: no second of imports) for a
    failpoint, which crashes where it crashes in a cold start; a real process for a
    SIGKILL, killed a random moment after its recovery."""
    if failpoint is not None:
        done = _SERVER.run([str(root), policy], failpoints=failpoint, timeout=30)
        if done.returncode not in CRASHED:
            raise AssertionError(f"child exited with {done.returncode}: {done.stderr[-3000:]}")
        return done.returncode, done.stdout
    environment = {**os.environ, "TOPICBASE_FAILPOINTS": ""}
    command = [sys.executable, "-m", "tests.storage.idle_retention_child", str(root), policy]
    child = subprocess.Popen(
        command, cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        first = child.stdout.readline()  # "open ...": recovery is over
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        stdout, stderr = child.communicate(timeout=30)
        stdout = first + stdout
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode not in CRASHED:
        raise AssertionError(f"child exited with {child.returncode}: {stderr.decode()[-3000:]}")
    return child.returncode, stdout.decode()


def _follow(output: str, expected: Expected) -> None:
    """Take in the child's acknowledged appends and returned passes."""
    for line in output.splitlines():
        word, *rest = line.split()
        if word == "ack":
            first = int(rest[0])
            assert first >= expected.end, f"offset {first} reused (the log ended at {expected.end})"
            for n, value in enumerate(rest[1:]):
                expected.values[first + n] = value
            expected.acked_end = first + len(rest) - 1
        elif word == "start":
            expected.start = max(expected.start, int(rest[0]))


def _check(root: Path, expected: Expected) -> None:
    with Store.open(str(root)) as store:
        partition = store.topic(store.topic_ids()[0]).partition(0)
        start, end = partition.start_offset, partition.end_offset
        assert start >= expected.start, f"log start {start} moved back from {expected.start}"
        assert start <= end and end >= expected.acked_end, (start, end, expected.acked_end)
        read = partition.read(start, max_messages=1000)
        offsets = [o for b in read.batches for o in b.column("offset").to_pylist()]
        values = [v.decode() for b in read.batches for v in b.column("data").to_pylist()]
        assert offsets == list(range(start, end))
        for offset, value in zip(offsets, values, strict=True):
            if offset < expected.acked_end:
                assert expected.values[offset] == value, (offset, value)
            expected.values[offset] = value  # written before the kill, kept: now known
    report = check_store(str(root))
    assert report.ok, report.lines()
    expected.start, expected.end = start, end
    expected.acked_end = max(expected.acked_end, end)


@pytest.mark.slow
def test_kills_around_the_idle_roll_and_delete(tmp_path: Path) -> None:
    seed = int(os.environ.get("CRASH_SEED") or random.SystemRandom().randrange(2**32))
    rng = random.Random(seed)
    root = tmp_path / "store"
    expected = Expected()
    crashed_at_failpoint = 0
    for round_no in range(ROUNDS):
        policy = POLICIES[round_no % len(POLICIES)]
        failpoint = None
        if round_no % 2:
            name = FAILPOINTS[(round_no // 2) % len(FAILPOINTS)]
            failpoint = f"{name}=crash@{rng.randint(1, 4)}"
        what = f"round {round_no} ({policy}, {failpoint or 'SIGKILL'}; CRASH_SEED={seed})"
        try:
            status, output = _run_child(root, policy, failpoint, rng.uniform(0.0, 0.3))
            _follow(output, expected)
            crashed_at_failpoint += failpoint is not None and status == 137
            checked = root
            if round_no % 2:  # check a copy: the next child recovers from the crash itself
                checked = tmp_path / "copy"
                shutil.rmtree(checked, ignore_errors=True)
                shutil.copytree(root, checked)
            _check(checked, expected)
        except AssertionError as error:
            raise AssertionError(f"{what}: {error}") from error
    print(
        f"\nidle retention kills (CRASH_SEED={seed}): {ROUNDS} rounds, "
        f"{crashed_at_failpoint} at failpoints, log {expected.start}..{expected.end}"
    )
    assert crashed_at_failpoint == ROUNDS // 2, "a failpoint of the roll/delete was not reached"
    assert expected.start > 0, "retention never emptied the partition"
