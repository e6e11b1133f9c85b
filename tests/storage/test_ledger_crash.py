"""Crash safety of the ledger (``storage.ledger``): a real writer process is killed.

Each round starts ``ledger_writer.py`` on the same directory (so every start recovers
from the previous crash and appends on top of it), kills it (SIGKILL at a random
moment, or a failpoint: half a round's frames written, frames written but not synced,
synced but not acknowledged), then opens the ledger here and checks against the ack
journal: every acknowledged share is at its acknowledged offsets with its messages;
every partition's offsets are dense from 0 to its end; no message is there twice
(unacknowledged statements may be present, whole). ``LEDGER_CRASH_SEED`` repeats a run.
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from pathlib import Path

import pytest

from storage.fs import FileSystem
from storage.ledger import Ledger

HERE = Path(__file__).resolve().parent
WRITER = HERE / "ledger_writer.py"
sys.path.insert(0, str(HERE))
from ledger_writer import (  # noqa: E402
    PARTITIONS,
    copied_ends,
    crash_seed,
    payload,
    run_and_kill,
)


def _run_writer(tmp: Path, run: int, seed: int, failpoints: str, kill_after_acks: int,
                copy: bool = False) -> None:  # fmt: skip
    """One writer run: it dies by its failpoint, or is SIGKILLed once the ack journal has
    ``kill_after_acks`` more lines."""
    run_and_kill(
        [sys.executable, str(WRITER), f"--root={tmp / 'ledger'}", f"--acks={tmp / 'acks.log'}",
         f"--run={run}", f"--seed={seed}", *(["--copy"] if copy else [])],
        tmp / "acks.log", failpoints, kill_after_acks,
    )  # fmt: skip


def _check(tmp: Path) -> int:
    """Open the ledger after a crash and check it against the journal; the acked shares."""
    own = copied_ends(str(tmp / "acks.log"))
    ledger = Ledger(FileSystem(), str(tmp / "ledger"), partition_ends=own)
    try:
        contents = {}
        for partition in range(PARTITIONS):
            start = own.get(partition, 0)
            assert ledger.start_offset(partition) == start
            batch = ledger.read(partition, start)
            offsets = batch.column("offset").to_pylist()
            assert offsets == list(range(start, ledger.end_offset(partition)))
            data = batch.column("data").to_pylist()
            repeated = [m for m, n in Counter(data).items() if n > 1]
            assert not repeated, f"partition {partition}: {repeated[:3]} twice"
            contents[partition] = [None] * start + data
        acked = 0
        for line in (tmp / "acks.log").read_text().splitlines():
            if not line.startswith("A ") or not line.endswith(tuple("0123456789")):
                continue  # a copy's line, or a torn last line
            _, statement, shares = line.split(" ")
            for share in shares.split(","):
                partition, base, count = (int(x) for x in share.split(":"))
                if base < own.get(partition, 0):
                    continue  # copied: in the partition's segments, not the ledger's to hold
                held = contents[partition][base : base + count]
                assert held == [payload(statement, partition, i) for i in range(count)], (
                    statement, partition, base)  # fmt: skip
                acked += 1
        return acked
    finally:
        ledger.close()


KINDS = ("sigkill", "ledger.torn_frame", "ledger.after_write", "ledger.after_sync")


@pytest.mark.parametrize("rounds", [8])
def test_killed_writer_loses_no_acknowledged_share(tmp_path: Path, rounds: int) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    moments = []
    acked_before = 0
    for run in range(rounds):
        kind = KINDS[run % len(KINDS)]
        nth = rng.randint(1, 40)
        spec = "" if kind == "sigkill" else f"{kind}=crash@{nth}"
        moments.append(spec or f"sigkill after {nth} acks")
        try:
            _run_writer(tmp_path, run, seed + run, spec, nth)
            acked = _check(tmp_path)
        except AssertionError as error:
            raise AssertionError(f"seed {seed}, moments {moments}: {error}") from error
        assert acked >= acked_before, (seed, moments)
        acked_before = acked
    assert acked_before > 0, "no share was ever acknowledged"
    # recovery crossed files: every run appends at least one frame and starts a file of its
    # own (a roll past 64 KiB within a run depends on the random moments: the unit tests
    # roll deterministically)
    ledger = Ledger(FileSystem(), str(tmp_path / "ledger"))
    try:
        assert len(ledger.file_numbers) >= rounds
    finally:
        ledger.close()


COPY_KINDS = ("sigkill", "ledger.mid_drop", "ledger.torn_frame", "ledger.after_sync")


def test_killed_writer_with_a_copier_keeps_every_uncopied_share(tmp_path: Path) -> None:
    """The copier releases partitions and deletes files from the front while statements
    are appended; kills (also between two removals) never lose an acknowledged share that
    was not copied, nor leave a hole the open refuses."""
    seed = crash_seed()
    rng = random.Random(seed)
    moments = []
    for run in range(8):
        kind = COPY_KINDS[run % len(COPY_KINDS)]
        nth = rng.randint(1, 12 if kind == "ledger.mid_drop" else 40)
        spec = "" if kind == "sigkill" else f"{kind}=crash@{nth}"
        moments.append(spec or f"sigkill after {nth} acks")
        try:
            _run_writer(tmp_path, run, seed + run, spec, nth, copy=True)
            _check(tmp_path)
        except AssertionError as error:
            raise AssertionError(f"seed {seed}, moments {moments}: {error}") from error
    assert copied_ends(str(tmp_path / "acks.log")), "the copier never copied"
