"""Crash safety of the ledger wired to a topic (``storage.ledger_route``): a real process
producing through the ledger, writing single partitions the usual way and copying in the
background is killed.

Each round starts ``ledger_route_writer.py`` on the same directory (every start recovers
the logs, then the ledger with their ends, and copies everything the ledger holds into
the logs), kills it (SIGKILL after a random number of acks, or a failpoint at a random
hit: half a ledger round written, a round written and not synced, synced and not yet
indexed, a partition frame written and not synced (a copy's or a plain append's), between
two ledger file removals), then opens the topic here and checks against the ack journal:
every acknowledged share is read exactly once, at its offsets; each partition's offsets
are dense, no message twice; the ledger holds nothing uncopied after the open; and
producer dedup holds: every acknowledged share of the last run sent again is wholly
duplicate. ``LEDGER_CRASH_SEED`` repeats a run.
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from pathlib import Path

from storage.partition_log import DUPLICATE
from storage.record_batch import build_wire_batch
from storage.topic_log import TopicLog

HERE = Path(__file__).resolve().parent
WRITER = HERE / "ledger_route_writer.py"
sys.path.insert(0, str(HERE))
from ledger_route_writer import PARTITIONS, open_topic, payload, seq_no  # noqa: E402
from ledger_writer import crash_seed, log_rows, run_and_kill  # noqa: E402

KINDS = (
    "sigkill",
    "ledger.torn_frame",
    "ledger.after_write",
    "ledger.after_sync",
    "partition.after_write",
    "ledger.mid_drop",
)


def _contents(topic: TopicLog) -> dict[int, list[bytes]]:
    contents = {}
    for partition in range(PARTITIONS):
        log = topic.partition(partition)
        offsets, data = log_rows(log)
        assert offsets == list(range(log.end_offset)), partition
        repeated = [m for m, n in Counter(data).items() if n > 1]
        assert not repeated, f"partition {partition}: {repeated[:3]} twice"
        contents[partition] = data
    return contents


def _check(topic: TopicLog, acks: Path, run: int) -> int:
    contents = _contents(topic)
    acked = 0
    statements = set()
    for line in acks.read_text().splitlines():
        if not line.startswith("A ") or not line.endswith(tuple("0123456789")):
            continue  # a torn last line
        _, statement, shares = line.split(" ")
        statements.add(statement)
        for share in shares.split(","):
            partition, base, count = (int(x) for x in share.split(":"))
            held = contents[partition][base : base + count]
            assert held == [payload(statement, partition, i) for i in range(count)], (
                statement, partition, base)  # fmt: skip
            acked += 1
            if statement.startswith(f"{run}."):  # sent again: wholly duplicate
                _, thread, k = statement.split(".")
                batch = build_wire_batch(
                    [payload(statement, partition, i) for i in range(count)],
                    producer_id=f"w{thread}p{partition}",
                    seq_no=[seq_no(run, int(k), i) for i in range(count)])  # fmt: skip
                result = topic.append(batch, partition)
                assert result.status.tolist() == [DUPLICATE] * count, (statement, partition)
    return acked


def test_killed_ledger_topic_keeps_every_acknowledged_share_once(tmp_path: Path) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    moments: list[str] = []
    acks = tmp_path / "acks.log"
    acked = 0
    for run in range(8):
        kind = KINDS[run % len(KINDS)]
        nth = rng.randint(1, 8 if kind == "ledger.mid_drop" else 60)
        spec = "" if kind == "sigkill" else f"{kind}=crash@{nth}"
        moments.append(spec or f"sigkill after {nth} acks")
        try:
            run_and_kill(
                [sys.executable, str(WRITER), f"--root={tmp_path}", f"--acks={acks}",
                 f"--run={run}", f"--seed={seed + run}"],
                acks, spec, nth,
            )  # fmt: skip
            topic = open_topic(str(tmp_path))
            try:
                acked = _check(topic, acks, run)
                assert topic.ledger is not None and topic.ledger.ledger.pending() == {}
            finally:
                topic.close()
        except AssertionError as error:
            raise AssertionError(f"seed {seed}, moments {moments}: {error}") from error
    assert acked > 0, (seed, moments)
