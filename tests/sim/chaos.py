"""`make chaos`: workload -> kill or failpoint crash -> restart -> recover -> check, N times.

Each cycle forks a workload process (``tests.sim.chaos_worker.run_worker``) from this
process, which imported Topicbase, DuckDB and pyarrow once and never opens the
database itself (every database access happens in a forked child, so forking is
safe). The worker recovers the database by opening it, records an observation of the
recovered state (incremental: only what changed since the previous observation),
reports ready, and runs its workload; the runner either SIGKILLs it at a random moment
or has armed a random failpoint (``name=crash@n``) and lets it run into it, or the cycle
is a *power cut*: the worker runs on a ``FaultyFileSystem`` (``tests.sim.faulty_fs``,
strict directories) with checkpoints every few commits, and at a random moment (in
recovery or in the workload) a thread of its own cuts the power and ends the process
(``FaultyFileSystem.cut_power_and_exit``): every file goes back to what was synced, every
directory entry to what was synced into its directory, with a random part of the dirty
pages written back or none. A kill keeps the page cache; a power cut does not, so what
was acknowledged only because a later sync was to make it durable (a checkpoint deleting
commit records before syncing the partitions it published to) is lost and shows up.
Transactions whose process died during COMMIT are then recorded as outcome unknown
(``info``).

The runner follows the history file incrementally (``history.HistoryTail``): what the
next worker needs (the producers' last seq_nos, the last observation of each key) and
the transactions left without an outcome come from the lines appended since the last
cycle, so a cycle's cost does not grow with the history. Every ``--check-every``
cycles, and at the end, a forked observer recovers the database and records it (the
whole of every partition every ``FULL_OBSERVATION_EVERY`` cycles and at the end, which
verifies by digest everything the tail observations did not read; else only the tails),
and the history checker (``tests.sim.checker``) checks the whole history, plus
exactly-once delivery of every consumed message in the rebuilt final state, whether it
was moved by copy or by reference (``check_exactly_once_moves``).
Failpoints passed rarely (``RARE_FAILPOINTS``) are armed at their first hit, the others
at a random one of the first six. After a cycle that crashed inside retention or a split
(``CHECKED_FAILPOINTS``), and at every full observation, a forked child recovers the
database, closes it and runs ``topicbase check`` on it (``engine.check.check_database``);
every problem it finds is a violation.

The last line is exactly::

    chaos: <cycles> cycles, <kills> kills, <failpoints> failpoints, <power cuts> power cuts,
    <messages> messages, <transactions> transactions, <violations> violations

(on one line), and the exit status is 1 on any violation. A failing run prints
its seed; ``--seed`` replays it (the kill moments depend on timing, the choices
of failpoints, workload and delays do not).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import random
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from engine import commit as commit_module
from engine import tables
from engine.check import check_database
from engine.database import Database
from storage import failpoints as failpoint_switch
from storage import limits
from storage.config import ledger_enabled
from tests.sim.chaos_worker import (
    AGED,
    CHAIN,
    CHAINER,
    MOVER,
    REAPER,
    Known,
    Observed,
    idle_cycle,
    moved_origin,
    observe_database,
    run_worker,
    setup,
    warm_up,
)
from tests.sim.checker import Report, check_file
from tests.sim.faulty_fs import FaultyFileSystem
from tests.sim.history import HistoryTail, HistoryWriter, ListDigest

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
    "commit.before_log_append",
    "commit.after_log_append",
    "staging.torn_record",
    "commit.checkpoint_before_release",
    "recovery.after_republish",
    "retention.before_delete",
    "split.before_save",
    "retention.before_roll",
    "retention.after_roll",
    "split.after_child",
    "split.after_save",
    "deltas.before_commit",  # inside a counter-delta group (engine.deltas), not committed
    "deltas.after_commit",  # the group and its applied-through position committed
    "page_cache.after_drop_behind",  # in a small-pages cycle (``small_page_cache_steps``)
    "staging.prewrite",  # the zeros of a staging file's pre-written window (storage.staging)
)
# An idle cycle (``chaos_worker.idle_cycle``: no writes, retention passes on the idle
# topic) arms one of these: the steps of rolling and deleting an expired active segment.
IDLE_FAILPOINTS = (
    "retention.before_roll",
    "segment.roll_after_seal",
    "segment.roll_before_snapshot",
    "retention.after_roll",
    "retention.before_delete",
)
# With the store's ledger on (``pytest --ledger``, or ``TOPICBASE_LEDGER=1
# TOPICBASE_LEDGER_SHARES_MIN=4 make chaos``: the wide statements of
# ``chaos_worker.produce_wide`` spread over 4-6 partitions), these too: a ledger append's
# steps (its frame torn, written, synced), a ledger file's drop and the copy of the ledger
# into the partitions at the open. Armed at their first hit (a cycle writes a few wide
# statements), and followed by ``topicbase check``.
LEDGER_FAILPOINTS = (
    "ledger.torn_frame",
    "ledger.after_write",
    "ledger.after_sync",
    "ledger.mid_drop",
    "ledger.copy_after_append",
)


def failpoints_of_the_run() -> tuple[str, ...]:
    """``FAILPOINTS``, and ``LEDGER_FAILPOINTS`` when the store's ledger is on."""
    return FAILPOINTS + LEDGER_FAILPOINTS if ledger_enabled() else FAILPOINTS


# Passed a few times per cycle at most (a segment rolls every ~20 cycles per partition,
# recovery republishes only after a crash inside a commit, a worker splits once, and a
# retention pass deletes only when the aged topic is over its budget): armed at their
# first hit.
RARE_FAILPOINTS = frozenset(
    {
        "page_cache.after_drop_behind",
        "staging.prewrite",  # a process's first file, then ~1 in 2,000 commits
        "segment.roll_after_seal",
        "segment.roll_before_snapshot",
        "recovery.after_republish",
        "commit.checkpoint_before_release",
        "retention.before_delete",
        "split.before_save",
        "retention.before_roll",
        "retention.after_roll",
        "split.after_child",
        "split.after_save",
        *LEDGER_FAILPOINTS,
    }
)
# A crash there is followed by recovery and ``topicbase check`` (``check_recovered``).
CHECKED_FAILPOINTS = frozenset(
    {
        "retention.before_delete",
        "split.before_save",
        "split.after_child",
        "split.after_save",
        "retention.before_roll",
        "retention.after_roll",
        "segment.roll_after_seal",
        "segment.roll_before_snapshot",
        *LEDGER_FAILPOINTS,
    }
)
# A crash at these leaves a committed transaction unpublished: the next recovery republishes.
REPUBLISHING_FAILPOINTS = frozenset(
    {"commit.after_commit_point", "commit.mid_publish", "staging.after_sync"}
)
CHECK_EVERY = 25
FULL_OBSERVATION_EVERY = 100  # cycles; the other checks' observations read only tails
WORKER_SECONDS = 1.5
CHILD_TIMEOUT_S = 60
# Power-cut cycles checkpoint every few commits (not every 256), so that cuts land after
# checkpoints that deleted the records of transactions published in the same process.
POWER_CUT_CHECKPOINT_TRANSACTIONS = (2, 5, 16)
CRASHED = (137, -signal.SIGKILL)  # os._exit(137) at a failpoint, or SIGKILL


# -- forked children ----------------------------------------------------------------------------
class Child:
    """A forked process running ``body(ready)``; ``ready()`` tells the parent.

    The child's stdout and stderr go to ``log`` (kept for the error message of a
    failed child). It exits 0 when ``body`` returns, 3 on an exception (traceback in
    the log), 137 at a crash failpoint; it never returns into the parent's code.
    """

    def __init__(self, body: Callable[[Callable[[], None]], None], log: Path, arm: str = ""):
        self.log = log
        sys.stdout.flush()
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 3
            try:
                os.close(read_end)
                gc.freeze()  # the parent's objects: the child's collector leaves them alone
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.close(fd)
                failpoint_switch.activate(arm)
                body(lambda: os.write(write_end, b"ready\n"))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(write_end)
        self.pid = pid
        self.pipe = read_end
        self.status: int | None = None

    def wait_ready(self, timeout: float = CHILD_TIMEOUT_S) -> bool:
        """True once the child said ready; False if it ended first."""
        if not select.select([self.pipe], [], [], timeout)[0]:
            self.kill()
            raise RuntimeError(f"child {self.pid} not ready after {timeout} s; killed")
        return os.read(self.pipe, 64).startswith(b"ready")

    def kill(self) -> None:
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            self.wait()

    def wait(self, timeout: float = CHILD_TIMEOUT_S) -> int:
        """The child's exit code (negative: killed by that signal); kills it after
        ``timeout`` and raises."""
        if self.status is None:
            # The pipe reaches end of file when the child has exited.
            if not select.select([self.pipe], [], [], timeout)[0]:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
                os.close(self.pipe)
                self.status = -signal.SIGKILL
                raise RuntimeError(f"child {self.pid} still running after {timeout} s; killed")
            while os.read(self.pipe, 64):  # drain until the child's end closes
                continue
            os.close(self.pipe)
            self.status = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.status

    def failure(self, what: str) -> RuntimeError:
        return RuntimeError(
            f"{what} failed with status {self.status}:\n{self.log.read_text()[-3000:]}"
        )


def warm_up_for_forking() -> None:
    """Import and initialise everything once here (``chaos_worker.warm_up``), so that a
    forked worker starts at once; refuse to go on if the warm-up left native threads
    running (DuckDB's end with its database), since forking would not be safe then."""
    before = _threads()
    warm_up()
    tables.close_parsers()  # the sandbox's DuckDB parser connections hold native threads
    gc.collect()
    after = _threads()
    if after > before:
        raise RuntimeError(f"the warm-up left {after - before} thread(s) running")


def _threads() -> int:
    """Threads of this process (native ones too)."""
    return len(os.listdir("/proc/self/task"))


def run_in_child(body: Callable[[], None], log: Path, what: str) -> None:
    """Run ``body`` in a forked child to its end; raise if it did not exit 0."""
    child = Child(lambda ready: body(), log)
    if child.wait() != 0:
        raise child.failure(what)


# -- what the runner follows in the history ----------------------------------------------------
class Follower:
    """Reads the history's new lines after each cycle and keeps what the next cycle needs."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tail = HistoryTail(path)
        self.known = Known()
        self.pending: dict[str, list] = {}  # txn id -> ops: logged COMMIT, no outcome yet
        # Per key, the digest of its observation rebuilt from the increments (as the
        # checker rebuilds it), and the offset after its last value.
        self.digests: dict[str, tuple[ListDigest, int]] = {}

    def update(self) -> None:
        known = self.known
        touched: set[str] = set()
        for event in self.tail.read_new():
            kind = event.get("type")
            if kind == "invoke":
                if "id" in event:
                    self.pending[event["id"]] = event.get("ops", [])
                elif event.get("producer"):
                    producer = event["producer"]
                    seq_no = int(event["seq_no"])
                    known.seq_nos[producer] = max(known.seq_nos.get(producer, 0), seq_no)
            elif kind == "txn":
                self.pending.pop(event["id"], None)
            elif kind == "final":
                self.observed(event)
                touched.add(event["key"])
        for key in touched:
            if key in self.digests:
                digest, end = self.digests[key]
                known.observed[key] = Observed(digest.count, digest.hexdigest(), end)
            else:
                known.observed.pop(key, None)

    def observed(self, event: dict) -> None:
        """Follow one observation of a key: a full one starts over, an increment
        after all the values known extends them; anything else forgets the key (the
        next observation of it is then a full one)."""
        key, values, offsets = event["key"], event.get("values") or [], event.get("offsets")
        base = event.get("base")
        if base is None:
            digest, end = ListDigest(), event.get("start") or 0
        elif key in self.digests and self.digests[key][0].count == base:
            digest, end = self.digests[key]
        else:
            self.digests.pop(key, None)
            return
        digest.update(values)
        if offsets:
            end = offsets[-1] + 1
        self.digests[key] = (digest, end)

    def settle_unknown_transactions(self) -> None:
        """Transactions that logged their COMMIT but no outcome: outcome unknown (info).
        Called when no worker runs, so that none of them can still finish."""
        self.update()
        if self.pending:
            with HistoryWriter(self.path, "runner") as writer:
                for txn_id, ops in self.pending.items():
                    writer.txn(txn_id, "info", ops)
            self.update()


# -- one cycle -------------------------------------------------------------------------------
def run_cycle(
    data_dir: str,
    history: str,
    work: Path,
    cycle: int,
    known: Known,
    rng: random.Random,
    previous: str | None = None,
) -> tuple[str, str | None, float]:
    """One workload process; returns ("kill"|"failpoint"|"power"|"clean", the failpoint it
    hit, seconds from the fork to ready: recovery and observation).

    ``previous`` is the failpoint the last cycle crashed at: after a crash between the
    commit point and the end of a publish, this cycle's recovery may republish, and it is
    armed to crash right after that (``recovery.after_republish`` is reachable only then:
    chosen among all failpoints, it was hit 0-2 times in 1,000 cycles). A transaction
    that wrote only tables has nothing to republish; the cycle then runs on unharmed.
    """
    if previous in REPUBLISHING_FAILPOINTS:
        mode, failpoint = "failpoint", "recovery.after_republish"
    else:
        mode = rng.choice(("kill", "kill", "failpoint", "power"))
        failpoint = rng.choice(failpoints_of_the_run()) if mode == "failpoint" else None
        if failpoint is not None and idle_cycle(cycle):
            failpoint = rng.choice(IDLE_FAILPOINTS)  # around the idle roll and delete
    nth = 1 if failpoint in RARE_FAILPOINTS else rng.randint(1, 6)
    arm = f"{failpoint}=crash@{nth}" if failpoint is not None else ""
    seed = rng.getrandbits(32)
    power = (
        (
            rng.uniform(0.0, WORKER_SECONDS),
            rng.random() < 0.5,
            rng.choice(POWER_CUT_CHECKPOINT_TRANSACTIONS),
        )
        if mode == "power"
        else None
    )

    # One cycle in four (and every cycle armed at the drop-behind's failpoint) drops pages
    # behind every write (``small_page_cache_steps``): at the real sizes (8 MiB kept, 4 MiB
    # steps) and floors a cycle's few KiB a partition never reach ``drop_behind``.
    small_pages = failpoint == "page_cache.after_drop_behind" or seed % 4 == 0

    def body(ready: Callable[[], None]) -> None:
        if small_pages:
            small_page_cache_steps()
        if power is None:
            run_worker(data_dir, history, cycle, seed, WORKER_SECONDS, known, ready)
            return
        cut_after_s, partial, checkpoint_every = power
        commit_module.CHECKPOINT_TRANSACTIONS = checkpoint_every  # in this child only
        fs = FaultyFileSystem(seed, strict_directories=True)
        cut = threading.Timer(
            cut_after_s, fs.cut_power_and_exit, kwargs={"partial_writeback": partial}
        )
        cut.daemon = True
        cut.start()  # from the fork: the cut may land in recovery, or in the workload
        run_worker(data_dir, history, cycle, seed, WORKER_SECONDS, known, ready, fs=fs)

    forked = time.monotonic()
    child = Child(body, work / "worker.log", arm)
    ready = child.wait_ready()
    to_ready = time.monotonic() - forked
    if mode == "kill" and ready:
        time.sleep(rng.uniform(0.0, WORKER_SECONDS))
        child.kill()
    status = child.wait()
    if status != 0 and status not in CRASHED:
        raise child.failure(f"worker {cycle}")
    if mode in ("failpoint", "power") and status not in CRASHED:
        mode, failpoint = "clean", None  # the failpoint (or the cut) was not reached in time
    return mode, failpoint, to_ready


def small_page_cache_steps() -> None:
    """In this forked worker only: writeback, drop-behind and the synced drops at every
    write with nothing kept, up to any frame (an index entry each), under floors that
    ignore the consumers, so that chaos writes reach ``page_cache.drop_behind`` and its
    failpoint, and readers (consumers, peeks, moves by reference) read dropped bytes back
    from the disk while the writer drops more."""
    limits.WRITEBACK_INTERVAL_BYTES = 1
    limits.INDEX_INTERVAL_BYTES = 1  # drops reach up to the indexed frame below the floor
    limits.DROP_BEHIND_KEEP_BYTES = 0
    limits.DROP_BEHIND_STEP_BYTES = 1
    limits.PAGE_CACHE_KEEP_BYTES = 0
    commit_module.CHECKPOINT_TRANSACTIONS = 2  # floors given often
    # Floors as if no topic had consumers: every page behind the writer may go, those a
    # consumer reads next too (a hint: its reads then come from the disk, checked again).
    commit_module.Committer._current_floor = _every_offset  # type: ignore[method-assign]
    commit_module.Committer._consumed_floor = _every_offset  # type: ignore[method-assign]


def _every_offset(self: object, topic_id: str, partition: int) -> int:
    return commit_module.EVERY_OFFSET


class Pace:
    """Wall and CPU time per cycle since the previous progress line (CPU: this process
    and its reaped children, i.e. the workers, observers and the checker)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.reset()

    def reset(self) -> None:
        self.since = time.monotonic()
        self.cpu = _cpu()
        self.cycles = 0
        self.to_ready = 0.0

    def line(self) -> str:
        n = max(self.cycles, 1)
        wall = (time.monotonic() - self.since) / n
        cpu = (_cpu() - self.cpu) / n
        text = (
            f"last {self.cycles} cycles {wall:.2f} s/cycle (to ready {self.to_ready / n:.2f} s, "
            f"CPU {cpu:.2f} s); {time.monotonic() - self.started:.0f} s in all"
        )
        self.reset()
        return text


def _cpu() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


# -- checks --------------------------------------------------------------------------------------
def check_recovered(data_dir: str, work: Path) -> list[str]:
    """Problems ``topicbase check`` finds after a forked child recovered the database
    (opened and closed it): a recovered store must be clean."""
    out = work / "check.json"

    def body() -> None:
        Database.open(data_dir).close()
        report = check_database(data_dir)
        problems = [p.line() for p in report.problems]
        if not report.ran:
            problems.append("topicbase check could not run")
        out.write_text(json.dumps(problems))

    run_in_child(body, work / "check.log", "topicbase check")
    return json.loads(out.read_text())


def check_exactly_once_moves(report: Report) -> list[str]:
    """Every message a moving consumer committed (``src`` and the split topics below
    ``mover``'s committed offset) is in ``dst`` exactly once, whether it was moved by
    copy or by reference (``chaos_worker.moved_origin``), and nothing else is (the
    resharding promise); a message of ``AGED`` moved by ``reaper`` (which also consumes
    without moving) is in ``dst`` at most once and lies below ``reaper``'s committed
    offset unless retention expired it since; a message of a source a move dropped
    after it (``chaos_worker.DROPPED``, never observed) is in ``dst`` at most once;
    every ``dst`` message below the tabler's committed offset is in one table row once.
    On the final state the checker rebuilt, with the committed offsets of the last
    observation."""
    moving = ["src", *sorted({key[2:].split("/")[0] for key in report.final
                              if key.startswith("t:fork")})]  # fmt: skip
    consumed = [v for topic in moving for v in _consumed(report, topic, MOVER)]
    arrived: Counter[str] = Counter()
    for key, values in report.final.items():
        if key.startswith("t:dst/"):
            for value in values:
                arrived[moved_origin(value)] += 1
    problems = [f"{v!r} moved {arrived[v]} times" for v in consumed if arrived[v] != 1]
    reaped = set(_consumed(report, AGED, REAPER))
    unread = {v for key, values in report.final.items() if key.startswith(f"t:{AGED}/")
              for v in values} - reaped  # fmt: skip
    aged = {v for v in arrived if v.startswith("g")}  # AGED's values (``Worker.age``)
    once = {v for v in arrived if v.startswith("d")}  # the dropped sources' values
    unconsumed = (set(arrived) - aged - once - set(consumed)) | (aged & unread)
    problems += [f"{v!r} arrived without being consumed" for v in unconsumed]
    problems += [f"{v!r} moved {arrived[v]} times" for v in aged | once if arrived[v] != 1]
    # dst -> chain (by reference, consumer chainer): keyed by the data moved, which is
    # unique in dst while the moves into it are exactly-once.
    chained = [v if v.startswith("m:") else v.rsplit("@", 1)[0]
               for v in _consumed(report, "dst", CHAINER)]  # fmt: skip
    landed_chain: Counter[str] = Counter(
        v.rsplit("@", 1)[0] for key, values in report.final.items()
        if key.startswith(f"t:{CHAIN}/") for v in values
    )  # fmt: skip
    problems += [f"{v!r} chained {landed_chain[v]} times" for v in chained if landed_chain[v] != 1]
    problems += [f"{v!r} chained without being consumed"
                 for v in set(landed_chain) - set(chained)]  # fmt: skip
    tabled = _consumed(report, "dst", "tabler")
    landed: Counter[str] = Counter()
    for key, values in report.final.items():
        if key.startswith("r:"):
            for value in values:
                landed[value.removeprefix("x:").rsplit("#", 1)[0]] += 1
    problems += [f"{v!r} tabled {landed[v]} times" for v in tabled if landed[v] != 1]
    problems += [f"{v!r} tabled without being consumed" for v in set(landed) - set(tabled)]
    counted = report.counters.get("move_counts")
    if counted is not None:  # the counting moves' messages, each counted exactly once
        moved = sum(1 for key, values in report.final.items() if key.startswith("t:dst/")
                    for value in values if value.rsplit("@", 1)[-1].startswith("C"))  # fmt: skip
        if moved != counted:
            problems.append(f"move_counts adds up to {counted}, the counting moves put "
                            f"{moved} messages in dst")  # fmt: skip
    return problems


def _consumed(report: Report, topic: str, consumer: str) -> list[str]:
    """Values of ``topic`` below ``consumer``'s committed offset, in the final state."""
    consumed = []
    prefix = f"t:{topic}/"
    for key, values in report.final.items():
        if not key.startswith(prefix):
            continue
        committed = report.committed.get((topic, consumer, int(key[len(prefix) :])), 0)
        offsets = report.final_offsets.get(key) or range(len(values))
        consumed += [v for o, v in zip(offsets, values, strict=True) if o < committed]
    return consumed


def messages_observed(report: Report) -> int:
    """Messages in the topics in the final state (each checked by the checker)."""
    return sum(len(values) for key, values in report.final.items() if key.startswith("t:"))


# -- the runner ----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=int(os.environ.get("CHAOS_CYCLES", 50)))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--data-dir", default=None, help="default: a temporary directory")
    parser.add_argument(
        "--check-every", type=int, default=CHECK_EVERY, help="cycles between full checks"
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    rng = random.Random(seed)
    work = Path(args.data_dir or tempfile.mkdtemp(prefix="topicbase-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    data_dir, history = str(work / "data"), str(work / "history.jsonl")
    print(f"chaos: seed {seed}, {args.cycles} cycles, data in {work}", flush=True)
    warm_up_for_forking()
    run_in_child(lambda: setup(data_dir), work / "setup.log", "setup")
    follower = Follower(history)
    outcomes: Counter[str] = Counter()
    failpoints_hit: Counter[str] = Counter()
    idle_outcomes: Counter[str] = Counter()  # of the idle cycles, by outcome
    violations = 0
    store_problems = 0  # found by ``topicbase check`` after recovery
    report: Report | None = None
    pace = Pace()
    failpoint: str | None = None  # the failpoint the last cycle crashed at
    for cycle in range(1, args.cycles + 1):
        mode, failpoint, to_ready = run_cycle(
            data_dir, history, work, cycle, follower.known, rng, failpoint
        )
        pace.cycles += 1
        pace.to_ready += to_ready
        outcomes[mode] += 1
        if idle_cycle(cycle):
            idle_outcomes[mode] += 1
        if failpoint is not None:
            failpoints_hit[failpoint] += 1
        follower.settle_unknown_transactions()
        full = cycle % FULL_OBSERVATION_EVERY == 0 or cycle == args.cycles
        if failpoint in CHECKED_FAILPOINTS or mode == "power" or full:
            problems = check_recovered(data_dir, work)
            for problem in problems[:20]:
                print(
                    f"VIOLATION check after cycle {cycle} ({failpoint or mode}): {problem}",
                    flush=True,
                )
            store_problems += len(problems)
            if problems:
                violations = store_problems
                print(f"chaos: failing seed {seed} (replay: --seed {seed})", flush=True)
                break
        if cycle % args.check_every and cycle != args.cycles:
            continue
        observe_started = time.monotonic()
        run_in_child(
            functools.partial(
                observe_database, data_dir, history, follower.known.observed, full=full
            ),
            work / "observer.log",
            "observation",
        )
        follower.update()
        check_started = time.monotonic()
        report = check_file(history)
        moved = check_exactly_once_moves(report)
        violations = len(report.violations) + len(moved) + store_problems
        for problem in moved[:20]:
            print(f"VIOLATION exactly-once: {problem}", flush=True)
        print(
            f"cycle {cycle}: {dict(outcomes)}; {report.summary(limit=5).splitlines()[0]}; "
            f"history {os.path.getsize(history) / 1e6:.1f} MB; "
            f"observe {check_started - observe_started:.1f} s, "
            f"check {time.monotonic() - check_started:.1f} s; {pace.line()}; "
            f"violations {violations}",
            flush=True,
        )
        if violations:
            print(report.summary(limit=20), flush=True)
            print(f"chaos: failing seed {seed} (replay: --seed {seed})", flush=True)
            break
    print(f"idle retention cycles: {dict(idle_outcomes)}", flush=True)
    print(
        "failpoints hit: "
        + ", ".join(f"{name} {failpoints_hit[name]}" for name in failpoints_of_the_run()),
        flush=True,
    )
    if report is not None:
        by_reference = {
            topic: sum(1 for key, values in report.final.items() if key.startswith(f"t:{topic}/")
                       for v in values if "@R" in v)
            for topic in ("dst", CHAIN)
        }  # fmt: skip
        print(f"moved by reference: {by_reference['dst']} messages into dst, "
              f"{by_reference[CHAIN]} into {CHAIN}", flush=True)  # fmt: skip
    if violations:
        print(f"chaos: data and logs kept in {work}", flush=True)
    stats = report.stats if report is not None else {}
    transactions = sum(stats.get(f"txns_{status}", 0) for status in ("ok", "fail", "info"))
    messages = messages_observed(report) if report is not None else 0
    print(
        f"chaos: {sum(outcomes.values())} cycles, {outcomes['kill']} kills, "
        f"{outcomes['failpoint']} failpoints, {outcomes['power']} power cuts, "
        f"{messages} messages, {transactions} transactions, "
        f"{stats.get('splits_done', 0)} automatic splits (of {stats.get('splits_driven', 0)} "
        f"driven), {violations} violations"
    )
    if not violations and not args.data_dir:  # a clean run in its own directory leaves nothing
        shutil.rmtree(work, ignore_errors=True)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
