"""`make chaos`: workload -> kill or failpoint crash -> restart -> recover -> check, N times.

Each cycle starts a workload process (``tests.sim.chaos_worker``) on the same
data directory and history file, then either SIGKILLs it at a random moment or
arms a random failpoint (``TOPICBASE_FAILPOINTS``, crash at its n-th hit) and
lets it run into it. Every few cycles, and at the end, the runner recovers the
database (by opening it), records what it observes — every partition's
contents with offsets, every table row, the committed offsets — and runs the
history checker (``tests.sim.checker``). Transactions whose process died during
COMMIT are recorded as outcome unknown (``info``).

The last line is exactly::

    chaos: <cycles> cycles, <kills> kills, <failpoints> failpoints, <messages> messages,
    <transactions> transactions, <violations> violations

(on one line), and the exit status is 1 on any violation. A failing run prints
its seed; ``--seed`` replays it (the kill moments depend on timing, the choices
of failpoints, workload and delays do not).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from engine.database import Database
from tests.sim.chaos_worker import ROWS, setup
from tests.sim.checker import check_file
from tests.sim.history import HistoryWriter, load, row_key, topic_key

FAILPOINTS = (
    "fs.before_sync",
    "fs.after_sync",
    "index.before_flush",
    "segment.torn_write",
    "segment.roll_after_seal",
    "segment.roll_before_snapshot",
    "staging.after_sync",
    "commit.after_stage",
    "commit.after_commit_point",
    "commit.mid_publish",
    "commit.checkpoint_before_delete",
    "recovery.after_republish",
)
# Observations record the whole state of every topic and table, so they are taken
# at doubling intervals (10, 20, 40, ...) and at the end: the history stays small
# enough for long runs while state regressions between recoveries are still seen.
FIRST_OBSERVATION = 10
WORKER_SECONDS = 1.5
WORKER_TIMEOUT_S = 60


def run_cycle(
    data_dir: str, history: str, cycle: int, rng: random.Random
) -> tuple[str, str | None]:
    """One workload process; returns ("kill"|"failpoint"|"clean", the failpoint it hit)."""
    environment = dict(os.environ)
    mode = rng.choice(("kill", "kill", "failpoint"))
    failpoint = rng.choice(FAILPOINTS) if mode == "failpoint" else None
    if failpoint is not None:
        environment["TOPICBASE_FAILPOINTS"] = f"{failpoint}=crash@{rng.randint(1, 6)}"
    command = [
        sys.executable,
        "-m",
        "tests.sim.chaos_worker",
        "--data-dir",
        data_dir,
        "--history",
        history,
        "--cycle",
        str(cycle),
        "--seed",
        str(rng.getrandbits(32)),
        "--seconds",
        str(WORKER_SECONDS),
    ]
    process = subprocess.Popen(
        command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    ready = process.stdout.readline()  # imports and recovery done
    if mode == "kill" and ready:
        time.sleep(rng.uniform(0.0, WORKER_SECONDS))
        process.send_signal(signal.SIGKILL)
    try:
        _, stderr = process.communicate(timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
    status = process.returncode
    if status not in (0, 137, -signal.SIGKILL):
        raise RuntimeError(f"worker {cycle} failed with status {status}:\n{stderr[-3000:]}")
    if mode == "failpoint" and status != 137:
        mode, failpoint = "clean", None  # the failpoint was not reached in time
    return mode, failpoint


def settle_unknown_transactions(history: str) -> None:
    """Transactions that logged their COMMIT but no outcome: outcome unknown (info)."""
    events = load(history)
    finished = {e["id"] for e in events if e.get("type") == "txn"}
    writer = HistoryWriter(history, "runner")
    for event in events:
        if event.get("type") == "invoke" and "id" in event and event["id"] not in finished:
            writer.txn(event["id"], "info", event.get("ops", []))
            finished.add(event["id"])
    writer.close()


def observe(data_dir: str, history: str) -> None:
    """Recover (open) the database and record its whole state as ``final`` events."""
    db = Database.open(data_dir)
    session = db.connect()
    writer = HistoryWriter(history, "observer")
    try:
        for topic in ("src", "dst"):
            table = session.execute(
                f'SELECT partition, "offset", CAST(data AS VARCHAR) AS v FROM TOPIC {topic} '
                'WITH (max_messages = 1000000) ORDER BY partition, "offset"'
            )[0].table.to_pylist()
            for partition in range(3):
                rows = [r for r in table if r["partition"] == partition]
                writer.final(
                    topic_key(topic, partition),
                    [r["v"] for r in rows],
                    offsets=[r["offset"] for r in rows],
                )
        lists = session.execute("SELECT k, v FROM lists")[0].table.to_pylist()
        found = {r["k"]: r["v"].split(",") for r in lists}
        for key in ROWS:
            writer.final(row_key(key), found.get(key, []))
        consumers = session.execute(
            "SELECT topic, consumer, partition, committed_offset FROM sys.consumers"
        )[0].table.to_pylist()
        for row in consumers:
            writer.offsets(
                row["topic"], row["consumer"], row["partition"], row["committed_offset"] or 0
            )
    finally:
        writer.close()
        session.close()
        db.close()


def check_exactly_once_moves(history: str) -> list[str]:
    """Every ``src`` message below the mover's committed offset is in ``dst`` exactly
    once, and nothing else is (the resharding promise), at the last observation."""
    finals: dict[str, dict] = {}
    committed: dict[int, int] = {}
    for event in load(history):
        if event.get("type") == "final":
            finals[event["key"]] = event
        elif event.get("type") == "offsets" and event["consumer"] == "mover":
            committed[event["partition"]] = event["committed"]
    consumed = []
    for partition in range(3):
        final = finals.get(topic_key("src", partition), {"values": [], "offsets": []})
        for offset, value in zip(final["offsets"], final["values"], strict=True):
            if offset < committed.get(partition, 0):
                consumed.append(value)
    arrived: Counter[str] = Counter()
    for partition in range(3):
        for value in finals.get(topic_key("dst", partition), {"values": []})["values"]:
            arrived[value.removeprefix("m:").rsplit("@", 1)[0]] += 1
    problems = [f"{v!r} moved {arrived[v]} times" for v in consumed if arrived[v] != 1]
    problems += [f"{v!r} arrived without being consumed" for v in set(arrived) - set(consumed)]
    return problems + _tabled_exactly_once(finals, committed_tabler(history))


def committed_tabler(history: str) -> dict[int, int]:
    committed: dict[int, int] = {}
    for event in load(history):
        if event.get("type") == "offsets" and event["consumer"] == "tabler":
            committed[event["partition"]] = event["committed"]
    return committed


def _tabled_exactly_once(finals: dict[str, dict], committed: dict[int, int]) -> list[str]:
    """Every ``dst`` message below the tabler's committed offset is in one table row once."""
    consumed = []
    for partition in range(3):
        final = finals.get(topic_key("dst", partition), {"values": [], "offsets": []})
        for offset, value in zip(final["offsets"], final["values"], strict=True):
            if offset < committed.get(partition, 0):
                consumed.append(value)
    landed: Counter[str] = Counter()
    for key in ROWS:
        for value in finals.get(row_key(key), {"values": []})["values"]:
            landed[value.removeprefix("x:").rsplit("#", 1)[0]] += 1
    problems = [f"{v!r} tabled {landed[v]} times" for v in consumed if landed[v] != 1]
    problems += [f"{v!r} tabled without being consumed" for v in set(landed) - set(consumed)]
    return problems


def _messages_observed(history: str) -> int:
    """Messages in the topics at the last observation (each checked by the checker)."""
    last: dict[str, int] = {}
    for event in load(history):
        if event.get("type") == "final" and str(event.get("key", "")).startswith("t:"):
            last[event["key"]] = len(event.get("values", []))
    return sum(last.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=int(os.environ.get("CHAOS_CYCLES", 50)))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--data-dir", default=None, help="default: a temporary directory")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    rng = random.Random(seed)
    work = Path(args.data_dir or tempfile.mkdtemp(prefix="topicbase-chaos-"))
    data_dir, history = str(work / "data"), str(work / "history.jsonl")
    print(f"chaos: seed {seed}, {args.cycles} cycles, data in {work}", flush=True)
    setup(data_dir)
    outcomes: Counter[str] = Counter()
    failpoints_hit: Counter[str] = Counter()
    next_observation = FIRST_OBSERVATION
    violations = 0
    report = None
    for cycle in range(1, args.cycles + 1):
        mode, failpoint = run_cycle(data_dir, history, cycle, rng)
        outcomes[mode] += 1
        if failpoint is not None:
            failpoints_hit[failpoint] += 1
        settle_unknown_transactions(history)
        if cycle == next_observation or cycle == args.cycles:
            next_observation *= 2
            observe(data_dir, history)
            report = check_file(history)
            moved = check_exactly_once_moves(history)
            violations = len(report.violations) + len(moved)
            for problem in moved[:20]:
                print(f"VIOLATION exactly-once: {problem}", flush=True)
            print(
                f"cycle {cycle}: {dict(outcomes)}; {report.summary(limit=5).splitlines()[0]}; "
                f"violations {violations}",
                flush=True,
            )
            if violations:
                print(report.summary(limit=20), flush=True)
                print(f"chaos: failing seed {seed} (replay: --seed {seed})", flush=True)
                break
    print("failpoints hit: " + json.dumps(dict(sorted(failpoints_hit.items()))), flush=True)
    stats = report.stats if report is not None else {}
    transactions = sum(stats.get(f"txns_{status}", 0) for status in ("ok", "fail", "info"))
    messages = _messages_observed(history)
    print(
        f"chaos: {sum(outcomes.values())} cycles, {outcomes['kill']} kills, "
        f"{outcomes['failpoint']} failpoints, {messages} messages, {transactions} transactions, "
        f"{violations} violations"
    )
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
