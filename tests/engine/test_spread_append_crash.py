"""An autocommit write spread over many partitions across crashes (``engine.spread_append``).

``spread_worker.py`` runs journaled autocommit INSERTs of 72 messages from 24 producers
over an 8-partition topic (each statement reaches every partition, so it commits by one
record in the staging log and is then published to the partitions without their syncs).
It is crashed at every failpoint of that path (``name=crash@n``: ``os._exit(137)``) and
SIGKILLed at random moments. After every crash a copy of the data directory is opened
here (recovery runs on the copy) and checked; the next worker recovers the original
itself and first resends every statement it did not see acknowledged, which must come
back wholly written or wholly duplicate (``spread_worker``).

What is checked (``_check``): every statement is wholly in the topic or wholly absent,
each message once; every acknowledged statement is there; each producer's messages lie
in one partition with seq_nos strictly increasing; each producer's last seq_no in the
producer state equals its last message's (dedup state consistent with the log).

With the store's ledger on (``pytest --ledger``: a statement over 4 partitions or more
goes to the topic's ledger, ``storage.ledger_route``) the statements commit by one ledger
frame, and the failpoints are the ledger's (``LEDGER_FAILPOINTS``); the crash after the
commit point is tried on both paths whatever the lane.

Settings: ``SPREAD_KILLS`` (default 6 random SIGKILLs), ``SPREAD_SEED`` (default random,
printed in failures).
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.database import Database
from storage.config import ledger_enabled, ledger_shares_min
from tests.fork_server import ModuleForkServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKER = HERE / "spread_worker.py"
sys.path.insert(0, str(HERE))
import spread_worker as sw  # noqa: E402

KILLS = int(os.environ.get("SPREAD_KILLS", "6"))
CRASHED = 137
WORKER_TIMEOUT_S = 300  # catches a hung worker only (two shared cores under load)
# The spread write's path: a topic-only commit's failpoints, then the checkpoint's.
FAILPOINTS = (
    "commit.before_log_append",  # nothing appended: absent
    "staging.torn_record",  # the record torn: absent
    "commit.after_log_append",  # appended, maybe not synced: either, but whole
    "staging.after_sync",  # the record durable, nothing published: recovery publishes
    "commit.after_commit_point",
    "commit.mid_publish",  # some partitions have their share: recovery adds the rest
    "publish.mid_spread",  # the same, inside the publish of the other shares together
    "commit.checkpoint_before_delete",
    "commit.checkpoint_before_release",
    "recovery.after_republish",  # a crash in the recovery of a crash
)
# The same statements through the topic's ledger (the switch on): its append's failpoints,
# then the open's copy of what it holds into the partitions.
LEDGER_FAILPOINTS = (
    "ledger.torn_frame",  # half the frame written: absent
    "ledger.after_write",  # written, maybe not synced: either, but whole
    "ledger.after_sync",  # the commit point: present, copied into the partitions at the open
    "ledger.copy_after_append",  # a crash in the open's copy of the ledger
)
# The worker's statements reach every one of its topic's partitions.
WORKER_PARTITIONS = 8
# Environments of the worker for each path, whatever the lane.
ON_THE_LEDGER = {"TOPICBASE_LEDGER": "1", "TOPICBASE_LEDGER_SHARES_MIN": "4"}
ON_THE_STAGING_LOG = {"TOPICBASE_LEDGER": "0"}


def _failpoints() -> tuple[str, ...]:
    """The failpoints of the path this run's statements take."""
    on = ledger_enabled() and ledger_shares_min() <= WORKER_PARTITIONS
    return LEDGER_FAILPOINTS if on else FAILPOINTS


# Runs that end by themselves or at a failpoint are forked by ``tests.fork_server`` (same
# worker, same crash points); the random kills still start real processes.
_SERVER = ModuleForkServer(WORKER)
_fork_server = _SERVER.fixture()


def _seed() -> int:
    return int(os.environ.get("SPREAD_SEED") or random.SystemRandom().randrange(2**32))


def _run_worker(
    data: Path,
    journal: Path,
    statements: int,
    failpoints: str = "",
    kill_after_s: float | None = None,
) -> tuple[int, str]:
    arguments = ["--data", str(data), "--journal", str(journal), "--statements",
                 str(statements), "--checkpoint-every", "3"]  # fmt: skip
    if kill_after_s is None:  # runs to its end or its failpoint: forked, ~1 s of imports saved
        done = _SERVER.run(arguments, failpoints=failpoints, timeout=WORKER_TIMEOUT_S)
        return done.returncode, done.stderr
    environment = {k: v for k, v in os.environ.items() if k != "TOPICBASE_FAILPOINTS"}
    process = subprocess.Popen(
        [sys.executable, str(WORKER), "--data", str(data), "--journal", str(journal),
         "--statements", str(statements), "--checkpoint-every", "3"],
        cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None
    process.stdout.readline()  # "ready" (or EOF if it died first)
    time.sleep(kill_after_s)
    process.kill()
    _, stderr = process.communicate(timeout=WORKER_TIMEOUT_S)
    return process.returncode, stderr.decode()


def _check(data: Path, journal: Path, context: str) -> int:
    """Open ``data`` (recovery runs) and check the invariants; returns statements present."""
    intents, acks = sw.read_journal(str(journal))
    database = Database.open(str(data))
    try:
        entry = database.catalog.entry("t")
        if entry is None:
            assert not acks, context
            return 0
        topic = database.topic_log(entry.topic_id)
        seen: dict[str, int] = {}  # data -> partition
        order: dict[tuple[int, str], list[int]] = {}  # (partition, producer) -> seq_nos
        for partition_id in topic.partition_ids():
            log = topic.partition(partition_id)
            offset = log.start_offset
            while offset < log.end_offset:
                result = log.read(offset, max_messages=10_000)
                for batch in result.batches:
                    columns = batch.to_pydict()
                    for data_, producer, seq_no in zip(
                        columns["data"], columns["producer_id"], columns["seq_no"], strict=True
                    ):
                        text = data_.decode()
                        assert text not in seen, f"{context}: {text} twice"
                        seen[text] = partition_id
                        order.setdefault((partition_id, producer), []).append(seq_no)
                offset = result.next_offset
        present = {int(text.split(":")[0]) for text in seen}
        for n in present:
            rows = sw.statement_rows(n)[0]
            missing = [r for r in rows if r not in seen]
            assert not missing, f"{context}: statement {n} is half there (missing {missing[:3]})"
        assert acks <= present, f"{context}: acknowledged but absent: {sorted(acks - present)}"
        assert present <= intents, f"{context}: statements nobody sent: {present - intents}"
        producers: dict[str, int] = {}
        for (partition_id, producer), seq_nos in order.items():
            assert producers.setdefault(producer, partition_id) == partition_id, (
                f"{context}: producer {producer} in two partitions"
            )
            assert all(a < b for a, b in itertools.pairwise(seq_nos)), (
                f"{context}: {producer} out of order in partition {partition_id}"
            )
            assert topic.partition(partition_id).last_seq_no(producer) == seq_nos[-1], context
        return len(present)
    finally:
        database.close()


def _round(tmp: Path, data: Path, journal: Path, label: str, **run) -> None:
    code, stderr = _run_worker(data, journal, **run)
    assert "FAIL" not in stderr, f"{label}: {stderr}"
    if run.get("failpoints"):  # the failpoint is on the path: it fired
        assert code == CRASHED, f"{label}: exit {code}: {stderr[-2000:]}"
    else:
        assert code in (0, -9), f"{label}: exit {code}: {stderr[-2000:]}"
    copy = tmp / "copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(data, copy)
    _check(copy, journal, label)


def test_spread_writes_are_whole_or_absent_across_failpoints_and_kills(tmp_path: Path) -> None:
    seed = _seed()
    rng = random.Random(seed)
    data, journal = tmp_path / "data", tmp_path / "journal"
    failpoints = _failpoints()
    hits = {name: rng.choice((1, 2)) for name in failpoints}
    for name in failpoints:
        if name == "recovery.after_republish":  # needs a crash that left publishing to do
            _round(tmp_path, data, journal, f"seed {seed} setup for {name}", statements=3,
                   failpoints="staging.after_sync=crash@2")  # fmt: skip
        if name == "ledger.copy_after_append":  # needs a crash that left the ledger rows
            _round(tmp_path, data, journal, f"seed {seed} setup for {name}", statements=3,
                   failpoints="ledger.after_sync=crash@2")  # fmt: skip
        label = f"seed {seed} failpoint {name}@{hits[name]}"
        _round(tmp_path, data, journal, label, statements=8,
               failpoints=f"{name}=crash@{hits[name]}")  # fmt: skip
    for kill in range(KILLS):
        label = f"seed {seed} kill {kill}"
        _round(tmp_path, data, journal, label, statements=400,
               kill_after_s=rng.uniform(0.0, 1.5))  # fmt: skip
    code, stderr = _run_worker(data, journal, statements=3)  # resends, then runs to the end
    assert code == 0, f"seed {seed}: {stderr}"
    present = _check(data, journal, f"seed {seed} final")
    intents, acks = sw.read_journal(str(journal))
    assert intents == acks and present == len(acks), f"seed {seed}"


@pytest.mark.parametrize(
    ("failpoint", "hit"),
    # publish.mid_spread: hit 6 times a statement (8 shares: the first is published
    # alone, the other 7 together), so the 9th is in the second statement;
    # ledger.after_sync: the second statement's frame synced (its commit point)
    [("staging.after_sync", 2), ("commit.mid_publish", 2), ("publish.mid_spread", 9),
     ("ledger.after_sync", 2)],
)  # fmt: skip
def test_a_crash_after_the_commit_point_is_published_by_recovery(
    tmp_path: Path, failpoint: str, hit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statement crashed after its record (or its ledger frame) was synced, before
    (or while) publishing: it was not acknowledged, yet recovery puts all of it in the
    partitions, and the resent statement is wholly duplicate. Each failpoint on its own
    path, whatever the lane (the fork server passes the switches on)."""
    path = ON_THE_LEDGER if failpoint.startswith("ledger.") else ON_THE_STAGING_LOG
    for name, value in path.items():
        monkeypatch.setenv(name, value)
    data, journal = tmp_path / "data", tmp_path / "journal"
    code, _ = _run_worker(data, journal, statements=2, failpoints=f"{failpoint}=crash@{hit}")
    assert code == CRASHED
    intents, acks = sw.read_journal(str(journal))
    assert intents - acks == {1}
    assert _check(data, journal, failpoint) == 2  # statement 1 is there, whole
    code, stderr = _run_worker(data, journal, statements=0)
    assert code == 0, stderr  # the resend came back wholly duplicate
