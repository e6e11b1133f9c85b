"""Crash safety of the copy from the ledger into the partitions' logs
(``storage.ledger_copy``): a real process appending and copying is killed.

Each round starts ``ledger_copy_writer.py`` on the same directory (so every start recovers
the logs, then the ledger with their ends, and copies on from there), kills it (SIGKILL
at a random moment, or a failpoint at a random hit: between a partition's synced append
and the ledger's release, a copy's frame written and not synced, between two ledger file
removals, half a ledger round written), then opens everything here and checks against
the ack journal: every acknowledged share is readable exactly once, at its offsets, from
the partition's log below its end or from the ledger above it; each partition's offsets
are dense over log then ledger, no message twice. At the end the copy is run here to
completion: the ledger holds nothing more and every share is in the logs.
``LEDGER_CRASH_SEED`` repeats a run.
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from pathlib import Path

from storage.ledger import Ledger
from storage.ledger_copy import copy_ledger
from storage.partition_log import PartitionLog

HERE = Path(__file__).resolve().parent
WRITER = HERE / "ledger_copy_writer.py"
sys.path.insert(0, str(HERE))
from ledger_copy_writer import open_topic  # noqa: E402
from ledger_writer import PARTITIONS, crash_seed, log_rows, payload, run_and_kill  # noqa: E402

KINDS = (
    "sigkill",
    "ledger.copy_after_append",
    "partition.after_write",
    "ledger.mid_drop",
    "ledger.torn_frame",
)


def _run(tmp: Path, run: int, seed: int, failpoints: str, kill_after_acks: int) -> None:
    run_and_kill(
        [sys.executable, str(WRITER), f"--root={tmp / 'topic'}", f"--acks={tmp / 'acks.log'}",
         f"--run={run}", f"--seed={seed}"],
        tmp / "acks.log", failpoints, kill_after_acks,
    )  # fmt: skip


def _check(ledger: Ledger, logs: dict[int, PartitionLog], acks: Path) -> tuple[int, int]:
    """Every acknowledged share once, at its offsets, from log or ledger; returns the
    acknowledged shares and how many of them were read from the logs."""
    contents: dict[int, list[bytes]] = {}
    for partition in range(PARTITIONS):
        log = logs[partition]
        offsets, data = log_rows(log)
        assert ledger.start_offset(partition) == log.end_offset, partition
        batch = ledger.read(partition, log.end_offset)
        offsets += batch.column("offset").to_pylist()
        data += batch.column("data").to_pylist()
        assert offsets == list(range(ledger.end_offset(partition))), partition
        repeated = [m for m, n in Counter(data).items() if n > 1]
        assert not repeated, f"partition {partition}: {repeated[:3]} twice"
        contents[partition] = data
    acked = from_logs = 0
    for line in acks.read_text().splitlines():
        if not line.startswith("A ") or not line.endswith(tuple("0123456789")):
            continue  # a torn last line
        _, statement, shares = line.split(" ")
        for share in shares.split(","):
            partition, base, count = (int(x) for x in share.split(":"))
            held = contents[partition][base : base + count]
            assert held == [payload(statement, partition, i) for i in range(count)], (
                statement, partition, base)  # fmt: skip
            acked += 1
            from_logs += base + count <= logs[partition].end_offset
    return acked, from_logs


def _close(ledger: Ledger, logs: dict[int, PartitionLog]) -> None:
    ledger.close()
    for log in logs.values():
        log.close()


def test_killed_appends_and_copies_keep_every_acknowledged_share_once(tmp_path: Path) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    moments: list[str] = []
    acks = tmp_path / "acks.log"
    copied = []
    for run in range(10):
        kind = KINDS[run % len(KINDS)]
        nth = rng.randint(1, 12 if kind == "ledger.mid_drop" else 60)
        spec = "" if kind == "sigkill" else f"{kind}=crash@{nth}"
        moments.append(spec or f"sigkill after {nth} acks")
        try:
            _run(tmp_path, run, seed + run, spec, nth)
            ledger, logs = open_topic(str(tmp_path / "topic"))
            try:
                acked, from_logs = _check(ledger, logs, acks)
            finally:
                _close(ledger, logs)
        except AssertionError as error:
            raise AssertionError(f"seed {seed}, moments {moments}: {error}") from error
        copied.append(from_logs)
    assert acked > 0 and copied[-1] > 0, (seed, moments, copied)
    assert copied == sorted(copied), "the copy went back"
    # the copy resumes to the end here: nothing left in the ledger, every share in the logs
    ledger, logs = open_topic(str(tmp_path / "topic"))
    try:
        while copy_ledger(ledger, logs, max_messages=500).messages:
            pass
        assert ledger.pending() == {}
        acked_end, from_logs = _check(ledger, logs, acks)
        assert acked_end == acked == from_logs, (seed, moments)
    finally:
        _close(ledger, logs)
