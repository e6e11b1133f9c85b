"""Crash safety under SIGKILL: a real writer process is killed at random moments.

Each round starts ``crash_writer.py`` on the same data directory (so state
accumulates across kills and every start recovers from the previous crash),
kills it with SIGKILL, then opens the store in this process and checks the
invariants of ``crash_writer.check_topic`` against the writer's ack file:
every acknowledged message present exactly once where it was acknowledged,
offsets dense, per-producer order, no duplicate anywhere, producer state equal
to the log. Unacknowledged messages may be present (written before the kill).

Half the rounds check a copy of the directory, so that the next writer itself
recovers from the crash (the check's clean close would otherwise leave fresh
producer snapshots behind); the other half check in place and close.

Settings: ``CRASH_KILLS`` (default 24, split 3:1 between the two tests; each of the
random test's 9 kinds of round, a fsync policy by a plain, torn-write or during-open
kill, comes twice in 18 rounds, in turn),
``CRASH_SEED`` (default: random; a failure's message names it, with every round's
kill moment so far: ``Moments``; a run with ``-s`` prints them too). The time budget
is 1.5 s per kill; a test stops early when it runs out (after at least 9 kills, 10 for rolls).
The limits on a writer's progress (``WRITER_START_S``, ``WRITER_PROGRESS_S``) only end
rounds whose writer hangs: at load 13-18 writers took up to 20.7 s to get ready.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from storage.store import Store

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WRITER = HERE / "crash_writer.py"


def _load_writer_module():
    spec = importlib.util.spec_from_file_location("crash_writer", WRITER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("crash_writer", module)
    spec.loader.exec_module(module)
    return module


cw = sys.modules.get("crash_writer") or _load_writer_module()

TOTAL_KILLS = int(os.environ.get("CRASH_KILLS", "24"))
SECONDS_PER_KILL = 1.5
MIN_KILLS = 9  # the random loop's 9 kinds of round (3 policies x plain, torn, in open)
POLICIES = ("never", "group", "always")
ROLL_INJECTIONS = ("roll-before-snapshot", "roll-before-rename", "roll-before-frame", "roll-after")


# Limits for a writer's progress, generous for a loaded machine (they only end a round
# whose writer hangs): at load 13-18 writers took up to 20.7 s to get ready (round 20).
WRITER_START_S = 60.0  # to print "opening" or "ready"
# once ready, to reach a point of its work: tear its N-th log write (N <= 60), roll a
# segment or die inside its n-th roll (n <= 6), combine keyless appends
WRITER_PROGRESS_S = 30.0


def _seed() -> int:
    return int(os.environ.get("CRASH_SEED") or random.SystemRandom().randrange(2**32))


class WriterProcess:
    """One run of crash_writer.py; its stdout lines arrive on a queue."""

    def __init__(
        self,
        tmp: Path,
        *,
        fsync: str,
        seed: int,
        segment_bytes: int,
        inject: str,
        extra: tuple[str, ...] = (),
    ):
        self.stderr_path = tmp / f"writer-{seed}.err"
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(WRITER),
                    f"--root={tmp / 'store'}",
                    f"--acks={tmp / 'acks.log'}",
                    f"--fsync={fsync}",
                    f"--segment-bytes={segment_bytes}",
                    f"--seed={seed}",
                    f"--inject={inject}",
                    "--max-seconds=60",  # > WRITER_PROGRESS_S
                    *extra,
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.decode().strip())
        self.lines.put(None)

    def wait_for(self, word: str, timeout: float) -> bool:
        """True once the writer printed ``word``; False if it exited or timed out first."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                return False
            if line is None:
                return False
            if line == word:
                return True
        return False

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)

    def finish(self) -> None:
        """Reap the process; it must have died of SIGKILL (anything else is a writer failure)."""
        code = self.proc.wait(timeout=30)
        if code != -signal.SIGKILL:
            raise AssertionError(
                f"writer exited with {code}:\n{self.stderr_path.read_text()[-4000:]}"
            )


class Moments:
    """What a test did so far, for a failure's message: the seed and every round's kill.

    Each round appends one line (what was started, how long the writer took to print
    the word the test waited for, the drawn sleep, the moment of the kill after that
    word, whether the writer had died by itself); a failure in any round, or in the
    test's final checks, reports the seed and every line, so that a CI failure can be
    replayed with ``CRASH_SEED=<seed>`` and its timing compared.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.started = time.monotonic()
        self.lines: list[str] = []

    def record(self, line: str) -> None:
        self.lines.append(f"{time.monotonic() - self.started:7.3f}s {line}")

    def report(self, what: str, error: BaseException) -> str:
        rounds = "\n".join(self.lines[-60:]) or "(no round finished)"
        return (
            f"{what} failed (CRASH_SEED={self.seed}; replay with CRASH_SEED={self.seed}): "
            f"{error}\nrounds so far (elapsed, round, kill moment):\n{rounds}"
        )


@contextlib.contextmanager
def _reported(moments: Moments, what: str):
    try:
        yield
    except BaseException as error:
        raise AssertionError(moments.report(what, error)) from error


def _check(tmp: Path, *, in_place: bool) -> object:
    """Open the store in this process, check it against the acks, close it."""
    root = tmp / "store"
    if not in_place:
        copy = tmp / "check"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(root, copy)
        root = copy
    with Store.open(str(root)) as store:
        assert len(store.topic_ids()) <= 1
        if not store.topic_ids():  # killed before the topic was created
            return cw.CheckStats()
        topic = store.topic(store.topic_ids()[0])
        stats = cw.check_topic(topic, cw.parse_acks(str(tmp / "acks.log")))
    if not in_place:
        shutil.rmtree(root)
    return stats


@dataclasses.dataclass
class RoundResult:
    """What one round of the random loop did: whether it tore a write, whether the
    writer was killed while opening the store, and the check of what it left."""

    torn: bool
    in_open: bool
    stats: object


def _random_round(
    tmp_path: Path,
    rng: random.Random,
    moments: Moments,
    round_no: int,
    *,
    tear_at: int | None = None,
    extra: tuple[str, ...] = (),
) -> RoundResult:
    """One round of the random loop: its kind by ``round_no`` (a fsync policy by a
    plain, torn-write or during-open kill), a writer started, killed, checked.

    A plain round kills the writer 20-300 ms after it is ready, a during-open round
    0-50 ms after it starts opening the store. A torn-write round's moment is its
    writer's N-th log write (N drawn from 1-60, or ``tear_at``): the test waits for
    the writer to tear that write and kill itself. (Until round 20 it slept 20-300 ms
    and then killed the writer as a plain round does: at load ~15 a writer had not
    made its N-th write by then in any of the three torn rounds the time budget left,
    and the loop failed with "no round tore a write".) So the random kill moments are
    the plain and during-open rounds' (two rounds in three); the torn rounds test the
    cut of a torn tail at a moment the writer chooses.
    """
    policy = POLICIES[round_no % len(POLICIES)]
    kind = (round_no // len(POLICIES)) % 3  # plain, torn write, kill during open
    if kind == 1:
        inject = f"torn-write:{rng.randint(1, 60) if tear_at is None else tear_at}"
    else:
        inject = "none"
    in_open = kind == 2
    what = f"round {round_no} ({policy}, inject {inject}, kill in open {in_open})"
    with _reported(moments, what):
        writer_seed = rng.randrange(2**31)
        writer = WriterProcess(
            tmp_path,
            fsync=policy,
            seed=writer_seed,
            segment_bytes=64 * 1024,
            inject=inject,
            extra=extra,
        )
        word = "opening" if in_open else "ready"
        started = time.monotonic()
        try:
            assert writer.wait_for(word, WRITER_START_S), (
                f"writer did not print {word!r} in {WRITER_START_S:.0f} s"
            )
            waited = time.monotonic()
            if inject == "none":
                pause = rng.uniform(0.0, 0.05) if in_open else rng.uniform(0.02, 0.3)
                time.sleep(pause)
            else:
                pause = -1.0  # waits for the torn write
                with contextlib.suppress(subprocess.TimeoutExpired):
                    writer.proc.wait(timeout=WRITER_PROGRESS_S)
            self_killed = writer.proc.poll() is not None
        finally:
            killed_at = time.monotonic()
            writer.kill()
        writer.finish()
        moments.record(
            f"{what}: writer seed {writer_seed}, {word!r} after {waited - started:.3f}s, "
            f"sleep {pause:.3f}s, killed {killed_at - waited:.3f}s after {word!r}, "
            f"self-killed {self_killed}"
        )
        torn = self_killed and inject != "none"
        stats = _check(tmp_path, in_place=round_no % 2 == 0)
        if torn:
            assert stats.truncated_bytes > 0, "a torn write was not cut on reopen"
        elif inject != "none":
            raise AssertionError(f"the writer did not tear its write in {WRITER_PROGRESS_S:.0f} s")
    return RoundResult(torn, in_open, stats)


@pytest.mark.slow
def test_sigkill_at_random_moments(tmp_path: Path) -> None:
    """Kill the writer at random moments (some during recovery, some mid-write), check."""
    kills = max(1, TOTAL_KILLS - TOTAL_KILLS // 4)
    budget = time.monotonic() + kills * SECONDS_PER_KILL
    seed = _seed()
    moments = Moments(seed)
    rng = random.Random(seed)
    done = torn = during_open = 0
    stats = cw.CheckStats()
    for round_no in range(kills):
        if round_no >= MIN_KILLS and time.monotonic() > budget:
            break
        result = _random_round(tmp_path, rng, moments, round_no)
        done += 1
        torn += result.torn
        during_open += result.in_open
        stats = result.stats
    print(
        f"\nSIGKILL loop (CRASH_SEED={seed}): {done} kills ({during_open} during open, "
        f"{torn} self-kills in a torn write), {stats.messages} messages stored, "
        f"{stats.acked_checked} acknowledged checked, {stats.segments} segments\n"
        + "\n".join(moments.lines)
    )
    with _reported(moments, "the loop's final checks"):
        assert stats.acked_checked > 0
        assert torn > 0, "no round tore a write: the torn-write rounds checked nothing"


def test_a_torn_write_round_tears_when_the_writer_is_slow(tmp_path: Path) -> None:
    """A writer that makes its first log write only after the longest plain-round pause
    (one batch a thread every 0.5 s, as a writer starved of CPU at load ~15) still
    tears its chosen write in a torn-write round, and the reopen cuts it. It checks the
    loop's timing; recovery's own correctness is the random loop's and the other tests'."""
    rng = random.Random(20)
    moments = Moments(20)
    result = _random_round(
        tmp_path, rng, moments, 3, tear_at=2, extra=("--append-delay=0.5",)
    )  # round 3: the first torn-write round
    assert result.torn and result.stats.truncated_bytes > 0, moments.lines


@pytest.mark.slow
def test_sigkill_around_segment_rolls(tmp_path: Path) -> None:
    """Kill inside and right after segment rolls (tiny segments roll every few batches)."""
    modes = (*ROLL_INJECTIONS, "external")
    kills = max(2 * len(modes), TOTAL_KILLS // 4)  # each mode twice, under two policies
    budget = time.monotonic() + kills * SECONDS_PER_KILL
    seed = _seed()
    moments = Moments(seed)
    rng = random.Random(seed)
    done = injected = 0
    stats = cw.CheckStats()
    for round_no in range(kills):
        if round_no >= 2 * len(modes) and time.monotonic() > budget:
            break
        policy = POLICIES[round_no % len(POLICIES)]
        mode = modes[round_no % len(modes)]
        inject = "none" if mode == "external" else f"{mode}:{rng.randint(1, 6)}"
        with _reported(moments, f"round {round_no} ({policy}, {mode})"):
            writer = WriterProcess(
                tmp_path,
                fsync=policy,
                seed=rng.randrange(2**31),
                segment_bytes=8 * 1024,
                inject=inject,
            )
            try:
                assert writer.wait_for("ready", WRITER_START_S), "writer did not get ready"
                if mode == "external":
                    assert writer.wait_for("rolled", WRITER_PROGRESS_S), "no segment roll"
                else:
                    writer.proc.wait(timeout=WRITER_PROGRESS_S)
                injected += writer.proc.poll() is not None and mode != "external"
            except subprocess.TimeoutExpired:
                pass
            finally:
                writer.kill()
            writer.finish()
            moments.record(
                f"round {round_no} ({policy}, {inject}), injected kill so far {injected}"
            )
            done += 1
            stats = _check(tmp_path, in_place=round_no % 2 == 1)
    print(
        f"\nroll kills (CRASH_SEED={seed}): {done} kills ({injected} injected inside rolls), "
        f"{stats.messages} messages stored, {stats.acked_checked} acknowledged checked, "
        f"{stats.segments} segments"
    )
    with _reported(moments, "the roll kills' final checks"):
        assert stats.segments > 3 * done // 2
        assert injected >= done // 3, "most injected kills inside rolls did not happen"


@pytest.mark.slow
def test_sigkill_while_keyless_batches_join_running_rounds(tmp_path: Path) -> None:
    """Ten threads, most batches keyless: keyless batches are combined into one append
    while the topic is busy (``TopicLog.append_keyless``) and join running group-commit
    rounds (``TopicLog._keyless_partition``); killed at random moments after both
    happened, every acknowledged message is there exactly once where it was
    acknowledged, across kills and recoveries."""
    seed = _seed()
    moments = Moments(seed)
    rng = random.Random(seed)
    rounds = max(MIN_KILLS, TOTAL_KILLS // 8)
    joined = 0
    stats = cw.CheckStats()
    for round_no in range(rounds):
        with _reported(moments, f"keyless round {round_no}"):
            writer = WriterProcess(
                tmp_path,
                fsync="group",
                seed=rng.randrange(2**31),
                segment_bytes=256 * 1024,
                inject="none",
                extra=("--threads=10", "--keyless-share=0.85"),
            )
            try:
                assert writer.wait_for("ready", WRITER_START_S), "writer did not get ready"
                joined += writer.wait_for("exercised", WRITER_PROGRESS_S)
                time.sleep(rng.uniform(0.0, 0.3))
            finally:
                writer.kill()
            writer.finish()
            moments.record(f"keyless round {round_no}, combined and joined so far {joined}")
            stats = _check(tmp_path, in_place=round_no % 2 == 0)
    print(
        f"\nkeyless SIGKILL loop (CRASH_SEED={seed}): {rounds} kills, {joined} "
        f"with combined and joined appends, "
        f"{stats.messages} messages stored, {stats.acked_checked} acknowledged checked"
    )
    with _reported(moments, "the keyless loop's final checks"):
        assert joined > 0, "no keyless batch was combined and joined a running round"
        assert stats.acked_checked > 0
