"""Transactions across crashes: a worker process is killed mid-transaction, again and again.

``txn_worker.py`` runs the resharding loop (topic ``a`` -> topic ``b`` with
consumer ``mover``) or the topic-to-table loop (topic ``a`` -> table
``counts`` with consumer ``counter``) on one data directory, each run a
separate process forked by ``txn_worker.py --serve`` (imports paid once). It
is killed with SIGKILL at random moments (some while it opens and recovers),
and crashed at the commit protocol's failpoints (``name=crash@n``:
``os._exit(137)`` at the n-th hit). After every crash a *copy* of the data
directory is opened here (recovery runs on the copy) and checked in a thread
while the next worker runs, so that the next worker recovers the original
itself; at the end the worker runs to completion and the directory is checked
in place. In-process tests cover failed publishes, fencing and fsync counts.

What is checked (``txn_worker.check_moved`` / ``check_counted``): after any
crash and recovery, ``b`` holds exactly the messages of ``a`` below the
consumer's committed offsets, each exactly once, with its message group, each
group in one ``b`` partition, and a source's messages in seq_no order within
every ``b`` partition; ``counts`` equals per key the number of consumed
messages. At the end the consumer's committed offsets equal ``a``'s end
offsets, so ``b`` holds every message of ``a`` once and the counts equal
``a``'s totals.

A failpoint round must reach its failpoint: it first tops ``a`` up (kill rounds move
as much as they have time for, so on a fast machine they may drain it), and a worker
that ends cleanly reports its commits and failpoint hits, so the round's failure says
whether the plan gave it too little to do (PLAN MISTAKE) or a failpoint passed often
enough did not fire (BUG). Time limits on the workers only catch hangs (minutes, not
seconds: two shared cores under load), and a worker's lines are kept from its first,
which may arrive before the server's ``started``.

Settings: ``TXN_KILLS`` (default 25: random SIGKILLs of the resharding loop;
the topic-to-table loop gets half), ``TXN_SEED`` (default random; printed,
and named in every failure).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import queue
import random
import shutil
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from engine.database import Database

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKER = HERE / "txn_worker.py"


def _load_worker_module():
    spec = importlib.util.spec_from_file_location("txn_worker", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("txn_worker", module)
    spec.loader.exec_module(module)
    return module


tw = sys.modules.get("txn_worker") or _load_worker_module()

KILLS = int(os.environ.get("TXN_KILLS", "25"))
CRASHED = 137  # os._exit code of a failpoint crash
KILLED = -9  # SIGKILL
# The move is topic-only: it commits by one append to the staging log (engine.commit).
MOVE_FAILPOINTS = (
    "commit.before_log_append",  # validated, nothing appended: not committed
    "staging.torn_record",  # the append torn inside its commit record: not committed
    "commit.after_log_append",  # appended, maybe not synced: either outcome, consistent
    "staging.after_sync",  # the record durable: committed, nothing published
    "commit.after_commit_point",
    "commit.mid_publish",
    "commit.checkpoint_before_delete",
    "commit.checkpoint_before_release",  # offsets and watermark in DuckDB, log not released
)
# Both kinds of commit on one consumer (txn_worker's mode mix).
MIX_FAILPOINTS = (
    "staging.torn_record",
    "commit.after_log_append",
    "commit.after_commit_point",
    "commit.checkpoint_before_delete",
    "commit.checkpoint_before_release",
)
FAILPOINT_HITS = (1, 3)
# Limits that only catch a hung worker, never a slow one: on 2 shared cores under load a
# fork, the first line or a recovery can take many seconds. What a round checks does not
# depend on them.
WORKER_START_S = 120  # fork to "started", and to "opening" (printed before any work)
WORKER_READY_S = 300  # to "ready": the database opened, recovery done
WORKER_RUN_S = 300  # to the end of a run (a failpoint round, a drain)
CHECKPOINT_EVERY = 3  # during failpoint runs, so that checkpoint_before_delete is hit
INITIAL_PER_SOURCE = 300
REFILL_PER_SOURCE = 200
REFILL_BELOW = 400  # unconsumed messages of ``a`` under which more are produced


def _seed() -> int:
    return int(os.environ.get("TXN_SEED") or random.SystemRandom().randrange(2**32))


class WorkerServer:
    """``txn_worker.py --serve``: forks one worker at a time; its lines arrive on a queue."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        environment = {k: v for k, v in os.environ.items() if k != "TOPICBASE_FAILPOINTS"}
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--serve"],
            cwd=ROOT,
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.runs = 0
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.decode().strip())
        self.lines.put(None)

    def _send(self, command: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=WORKER_START_S)  # a hang bound only (loaded machines)

    def start(self, data: Path, mode: str, *, seed: int, failpoints: str = "", **options):
        """Fork a worker (``txn_worker.main`` with these arguments); returns its handle."""
        self.runs += 1
        arguments = [f"--data={data}", f"--mode={mode}", f"--seed={seed}"]
        arguments += [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
        stderr = self.tmp / f"worker-{self.runs}.err"
        self._send({"run": arguments, "failpoints": failpoints, "stderr": str(stderr)})
        worker = Worker(self, stderr)
        assert worker.wait_for("started", WORKER_START_S), (
            f"the server did not fork a worker within {WORKER_START_S} s: {worker.account()}"
        )
        return worker


class Worker:
    """One forked worker: wait for its lines, kill it, reap it.

    Every line between the previous worker's ``exit`` and this one's is this worker's
    (one worker at a time), and each is kept in ``lines``: the server's ``started`` and
    the child's own ``opening`` share one pipe from two processes, so ``opening`` may
    come first, and a wait for a word already passed must still see it.
    """

    def __init__(self, server: WorkerServer, stderr: Path) -> None:
        self.server = server
        self.stderr = stderr
        self.code: int | None = None
        self.lines: list[str] = []

    def printed(self, word: str) -> str | None:
        """The first line the worker printed that starts with ``word``, if any."""
        return next((line for line in self.lines if line.split()[:1] == [word]), None)

    def wait_for(self, word: str, timeout: float) -> bool:
        """True once the worker printed ``word`` (now or before); False if it exited
        or ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        while self.printed(word) is None:
            remaining = deadline - time.monotonic()
            if self.code is not None or remaining <= 0:
                return False
            try:
                line = self.server.lines.get(timeout=remaining)
            except queue.Empty:
                return False
            if line is None:
                raise AssertionError("the worker server died")
            if line.startswith("exit "):
                self.code = int(line.split()[1])
            elif line:
                self.lines.append(line)
        return True

    def account(self) -> str:
        """What the worker printed and how it ended, for failure messages."""
        ended = "still running" if self.code is None else f"exit code {self.code}"
        return f"worker printed {self.lines}, {ended}; stderr: {self._stderr_tail()}"

    def _stderr_tail(self) -> str:
        try:
            return self.stderr.read_text()[-4000:] or "(empty)"
        except FileNotFoundError:
            return "(no file)"

    def report(self) -> tuple[int, dict[str, int]] | None:
        """(commits, failpoint hits) from the worker's ``done`` line, if it printed one."""
        line = self.printed("done")
        if line is None:
            return None
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        return int(fields["commits"]), json.loads(fields["failpoints"])

    def kill(self) -> None:
        if self.code is None:
            self.server._send({"kill": True})

    def finish(self, *expected: int, timeout: float = WORKER_RUN_S) -> int:
        """Wait for the worker's end (killing it after ``timeout``); its code must be expected."""
        self.wait_for("<exit>", timeout)
        if self.code is None:
            self.kill()
            self.wait_for("<exit>", 10)
            raise AssertionError(
                f"worker still running after {timeout} s; killed; {self.account()}"
            )
        if self.code not in expected:
            raise AssertionError(
                f"worker exited with {self.code}, expected {expected}: {self.account()}"
            )
        return self.code


@contextlib.contextmanager
def _reported(seed: int, what: str):
    try:
        yield
    except BaseException as error:
        raise AssertionError(f"{what} failed (TXN_SEED={seed}): {error}") from error


@contextlib.contextmanager
def _opened(data: Path, *, copy: bool):
    """The database at ``data`` (or at a fresh copy of it), opened here and closed after."""
    path = data
    if copy:
        path = data.parent / "check"
        shutil.rmtree(path, ignore_errors=True)
        shutil.copytree(data, path)
    database = Database.open(str(path))
    session = database.connect()
    try:
        yield session
    finally:
        session.close()
        database.close()
        if copy:
            shutil.rmtree(path)


def _create(data: Path, per_source: int) -> None:
    with _opened(data, copy=False) as session:
        tw.create(session)
        tw.produce(session, 1, per_source)


def _unconsumed(data: Path, mode: str) -> int:
    """Messages of ``a`` the mode's consumer has not committed, counted (and checked) on a
    copy, so that the next worker still runs the recovery itself."""
    with _opened(data, copy=True) as session:
        if mode in ("move", "mix"):
            found = tw.check_moved(session, table=mode == "mix")
            return found.a_messages - found.consumed
        return len(tw.topic_rows(session, "a")) - tw.check_counted(session)


class Source:
    """Topic ``a``'s producers: tops ``a`` up in place (seq_nos continue) when it runs low."""

    def __init__(self, data: Path, per_source: int) -> None:
        self.data = data
        self.next_seq = per_source + 1
        _create(data, per_source)

    def top_up(self, unconsumed: int) -> int:
        """Produce ``REFILL_PER_SOURCE`` more per source if fewer than ``REFILL_BELOW``
        messages are unconsumed; returns the unconsumed count after."""
        if unconsumed >= REFILL_BELOW:
            return unconsumed
        with _opened(self.data, copy=False) as session:
            tw.produce(session, self.next_seq, REFILL_PER_SOURCE)
        self.next_seq += REFILL_PER_SOURCE
        return unconsumed + REFILL_PER_SOURCE * tw.SOURCES


@pytest.fixture
def server(tmp_path: Path):
    server = WorkerServer(tmp_path)
    yield server
    server.close()


def _kill_round(server, data: Path, mode: str, rng: random.Random, **options) -> str:
    """Start a worker and SIGKILL it: mostly after it is ready, sometimes while it opens."""
    worker = server.start(data, mode, seed=rng.randrange(2**31), **options)
    try:
        if rng.random() < 0.15:
            assert worker.wait_for("opening", WORKER_START_S), (
                f"worker did not start within {WORKER_START_S} s: {worker.account()}"
            )
            time.sleep(rng.uniform(0.0, 0.1))
            where = "open"
        else:
            assert worker.wait_for("ready", WORKER_READY_S), (
                f"worker did not get ready within {WORKER_READY_S} s: {worker.account()}"
            )
            time.sleep(rng.uniform(0.0, 0.5))
            where = "run"
    finally:
        worker.kill()
    code = worker.finish(KILLED, 0)
    return where if code == KILLED else "finished"


def _failpoint_round(
    server,
    data: Path,
    mode: str,
    failpoint: str,
    rng: random.Random,
    unconsumed: int | None = None,
    **options,
) -> None:
    """Run a worker with ``failpoint`` (``name=crash@n``) armed; it must crash there (exit
    137). ``unconsumed``: the messages the round had to work with, for the message.

    A worker that ends cleanly instead reports its commits and failpoint hits: fewer
    than n hits means the round's plan gave it too little to do (a test mistake); n hits
    or more without a crash means the failpoint did not fire (a bug)."""
    worker = server.start(data, mode, seed=rng.randrange(2**31), failpoints=failpoint, **options)
    try:
        worker.finish(CRASHED)
    except AssertionError as error:
        raise AssertionError(f"{_verdict(worker, failpoint, unconsumed)}; {error}") from None


def _verdict(worker: Worker, failpoint: str, unconsumed: int | None) -> str:
    """Why a failpoint round did not crash: a plan mistake or a bug (see _failpoint_round)."""
    name, _, action = failpoint.partition("=")
    nth = int(action.partition("@")[2] or 1)
    report = worker.report()
    if worker.code != 0 or report is None:
        return "BUG? the worker neither crashed at its failpoint nor ended cleanly"
    commits, hits = report
    had = "" if unconsumed is None else f", with {unconsumed} unconsumed messages to start from"
    if hits.get(name, 0) < nth:
        return (
            f"PLAN MISTAKE: the worker ran out of work after {commits} commits{had}, "
            f"passing {name} {hits.get(name, 0)} times, short of the {nth} to crash at"
        )
    return f"BUG: {name} was passed {hits[name]} times ({commits} commits) and never crashed"


def _run_to_completion(server, data: Path, mode: str, rng: random.Random) -> None:
    worker = server.start(data, mode, seed=rng.randrange(2**31), max_messages=50)
    worker.finish(0)


class CopyCheck:
    """Check a copy of the data directory in a thread, while the next worker runs.

    The copy is taken at once (the worker is dead); opening it runs recovery
    here, on the copy, so the next worker still recovers the original itself.
    """

    def __init__(self, data: Path, number: int, check, what: str) -> None:
        self.path = data.parent / f"check-{number}"
        self.what = what
        shutil.copytree(data, self.path)
        self.result = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(check,))
        self.thread.start()

    def _run(self, check) -> None:
        try:
            with _opened(self.path, copy=False) as session:
                self.result = check(session)
        except BaseException as error:
            self.error = error
        finally:
            shutil.rmtree(self.path, ignore_errors=True)

    def join(self, seed: int):
        self.thread.join()
        if self.error is not None:
            raise AssertionError(
                f"check after {self.what} failed (TXN_SEED={seed}): {self.error}"
            ) from self.error
        return self.result


def test_resharding_loop_moves_every_message_exactly_once_across_kills_and_failpoints(
    tmp_path: Path, server
) -> None:
    """The YDB resharding loop, killed ~TXN_KILLS times and crashed at every commit failpoint.

    ``a``: 3 partitions, 5 producers (a producer's messages lie in one partition,
    seq_no order); ``b``: 3 partitions, routed by message_group_id (12 users), so
    most transactions publish to 2-3 partitions (``commit.mid_publish`` is hit).
    Rounds are shuffled; each failpoint crashes at its 1st and 3rd hit (with a
    checkpoint every 3 commits, so ``commit.checkpoint_before_delete`` is hit, at
    times inside the recovery of the next open). After each round a copy is
    recovered and checked (``check_moved``); unconsumed messages are topped up in
    place when they run low. Finally the worker drains ``a`` and: ``b`` == ``a``
    exactly once, per-source order holds in every ``b`` partition, and the
    committed offsets equal ``a``'s end offsets.
    """
    seed = _seed()
    print(f"TXN_SEED={seed}")
    rng = random.Random(seed)
    data = tmp_path / "data"
    source = Source(data, INITIAL_PER_SOURCE)
    rounds: list[tuple[str, str]] = [("kill", "")] * KILLS
    rounds += [("failpoint", f"{n}=crash@{k}") for n in MOVE_FAILPOINTS for k in FAILPOINT_HITS]
    rng.shuffle(rounds)
    outcomes: dict[str, int] = {}
    check: CopyCheck | None = None
    for number, (kind, failpoint) in enumerate(rounds):
        what = f"round {number} ({kind} {failpoint})".strip()
        with _reported(seed, what):
            if kind == "kill":
                every = rng.choice((2, 5, 256))
                outcome = _kill_round(
                    server, data, "move", rng, checkpoint_every=every, max_messages=20
                )
            else:
                # The refill below looks at the previous round's copy, one round late; a
                # failpoint round must find messages to move, or it ends cleanly (exit 0).
                unconsumed, check = _unconsumed_now(source, data, "move", check, seed)
                _failpoint_round(
                    server,
                    data,
                    "move",
                    failpoint,
                    rng,
                    unconsumed,
                    checkpoint_every=CHECKPOINT_EVERY,
                    max_messages=20,
                )
                outcome = failpoint
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if check is not None:
            found = check.join(seed)
            source.top_up(found.a_messages - found.consumed)
        check = CopyCheck(data, number, tw.check_moved, what)
    if check is not None:
        check.join(seed)
    with _reported(seed, "final run"):
        _run_to_completion(server, data, "move", rng)
        with _opened(data, copy=False) as session:
            found = tw.check_moved(session)
            assert found.consumed == found.a_messages == found.b_messages
            assert found.b_partitions_used == tw.B_PARTITIONS
            assert tw.committed_offsets(session, "mover") == tw.end_offsets(session, "a")
    print(f"resharding: {found.a_messages} messages moved; rounds by outcome: {outcomes}")


def _unconsumed_now(source: Source, data: Path, mode: str, check: CopyCheck | None, seed: int):
    """(unconsumed messages of ``a`` after a top-up, the pending check: None once joined).

    The pending check (of the last round) copied the directory as it is now: nothing ran
    on it since. Its count is the one ``_unconsumed`` would take on a second copy, so it is
    joined and used (the round's state checked once, not twice); without one (round 0),
    ``_unconsumed`` counts."""
    if check is None:
        return source.top_up(_unconsumed(data, mode)), None
    found = check.join(seed)
    return source.top_up(found.a_messages - found.consumed), None


def _check_mixed(session):
    return tw.check_moved(session, table=True)


def test_topic_only_and_table_commits_on_one_consumer_stay_exactly_once_across_crashes(
    tmp_path: Path, server
) -> None:
    """The mix: one consumer ``mover`` whose transactions either move messages to topic
    ``b`` (topic-only: committed by a commit record in the staging log) or into table
    ``moved`` (committed through DuckDB), chosen at random per transaction. Killed
    ~TXN_KILLS/2 times and crashed at both paths' failpoints (1st and 2nd hit), with
    checkpoints every 3 or 5 commits: after each crash and recovery, ``b`` and ``moved``
    together hold exactly the messages below ``mover``'s committed offsets, each once
    (the offsets of both kinds end where the commit order says); at the end, all of
    ``a`` and the offsets at ``a``'s end."""
    seed = _seed()
    print(f"TXN_SEED={seed}")
    rng = random.Random(seed)
    data = tmp_path / "data"
    source = Source(data, INITIAL_PER_SOURCE)
    rounds: list[tuple[str, str]] = [("kill", "")] * max(1, KILLS // 2)
    rounds += [("failpoint", f"{n}=crash@{k}") for n in MIX_FAILPOINTS for k in (1, 2)]
    rng.shuffle(rounds)
    check: CopyCheck | None = None
    for number, (kind, failpoint) in enumerate(rounds):
        what = f"round {number} ({kind} {failpoint})".strip()
        every = rng.choice((3, 5))
        with _reported(seed, what):
            if kind == "kill":
                _kill_round(server, data, "mix", rng, checkpoint_every=every, max_messages=20)
            else:
                unconsumed, check = _unconsumed_now(source, data, "mix", check, seed)
                _failpoint_round(server, data, "mix", failpoint, rng, unconsumed,
                                 checkpoint_every=every, max_messages=20)  # fmt: skip
        if check is not None:
            found = check.join(seed)
            source.top_up(found.a_messages - found.consumed)
        check = CopyCheck(data, number, _check_mixed, what)
    if check is not None:
        check.join(seed)
    with _reported(seed, "final run"):
        _run_to_completion(server, data, "mix", rng)
        with _opened(data, copy=False) as session:
            found = tw.check_moved(session, table=True)
            assert found.consumed == found.a_messages
            assert tw.committed_offsets(session, "mover") == tw.end_offsets(session, "a")
    print(f"mix: {found.a_messages} messages, {found.b_messages} of them through b")


def test_topic_to_table_counts_every_message_exactly_once_across_kills(
    tmp_path: Path, server
) -> None:
    """Consumer ``counter`` upserts per-group counts into a DuckDB table in one transaction.

    Killed ~TXN_KILLS/2 times at random and crashed at ``commit.after_commit_point``
    (1st, 2nd, 4th hit). After each crash the recovered copy's counts equal, per
    key, the messages below the committed offsets; at the end they equal ``a``'s
    totals per key and the offsets equal ``a``'s end offsets.
    """
    _topic_to_table_across_kills(tmp_path, server, _seed())


def test_topic_to_table_across_kills_regression_seed_2422922104(tmp_path: Path, server) -> None:
    """The seed whose last round (``commit.after_commit_point=crash@2``, after 12 kill
    rounds) found ``a`` drained when the kill rounds had run fast: the worker had
    nothing to commit, ended cleanly (exit 0), and the round failed for want of work,
    not for a bug. Failpoint rounds now top ``a`` up first, as the resharding test's do.
    On a slow machine the kill rounds move less; this seed must pass either way."""
    _topic_to_table_across_kills(tmp_path, server, 2422922104)


def _topic_to_table_across_kills(tmp_path: Path, server, seed: int) -> None:
    print(f"TXN_SEED={seed}")
    rng = random.Random(seed)
    data = tmp_path / "data"
    source = Source(data, 400)
    rounds = [("kill", "")] * max(1, KILLS // 2)
    rounds += [("failpoint", f"commit.after_commit_point=crash@{k}") for k in (1, 2, 4)]
    rng.shuffle(rounds)
    check: CopyCheck | None = None
    for number, (kind, failpoint) in enumerate(rounds):
        what = f"round {number} ({kind} {failpoint})".strip()
        with _reported(seed, what):
            if kind == "kill":
                _kill_round(server, data, "count", rng, max_messages=10)
            else:
                # Kill rounds move as much as they have time for: crash@k needs k commits
                # of at most 10 messages each left to do.
                unconsumed = source.top_up(_unconsumed(data, "count"))
                _failpoint_round(server, data, "count", failpoint, rng, unconsumed, max_messages=10)
        if check is not None:
            check.join(seed)
        check = CopyCheck(data, number, tw.check_counted, what)
    counted = 0 if check is None else check.join(seed)
    with _reported(seed, "final run"):
        _run_to_completion(server, data, "count", rng)
        with _opened(data, copy=False) as session:
            totals = tw.a_totals(session)
            assert tw.check_counted(session) == sum(totals.values())
            table = session.execute("SELECT k, n FROM counts")[-1].table
            assert table is not None
            assert {r["k"]: r["n"] for r in table.to_pylist()} == totals
            assert tw.committed_offsets(session, "counter") == tw.end_offsets(session, "a")
    print(f"topic to table: last crash left {counted} counted; {sum(totals.values())} in all")


def test_a_worker_line_that_arrives_before_the_servers_started_still_counts(
    tmp_path: Path,
) -> None:
    """The forked worker and the server share one pipe: the worker's ``opening`` may
    arrive before the server's ``started``. Waiting for ``started`` passes it, and a
    wait for ``opening`` after that must still see it (it once failed a round with
    "worker did not start" a few seconds into the test, no timeout involved)."""
    lines: queue.Queue[str | None] = queue.Queue()
    for line in ("opening", "started 4242", "ready", "exit -9"):
        lines.put(line)
    worker = Worker(types.SimpleNamespace(lines=lines), tmp_path / "worker.err")
    assert worker.wait_for("started", 1)
    assert worker.wait_for("opening", 1)
    assert worker.wait_for("ready", 1)
    assert not worker.wait_for("done", 1) and worker.code == -9
    assert worker.lines == ["opening", "started 4242", "ready"]


def test_a_failpoint_round_without_work_is_reported_as_a_plan_mistake(
    tmp_path: Path, server
) -> None:
    """The diagnosis the crash loops rely on: a failpoint round whose worker finds too
    little to do ends cleanly, reports its commits and failpoint hits, and the round's
    failure says PLAN MISTAKE (not a bug) with the numbers; given enough work, the same
    round crashes at its failpoint."""
    rng = random.Random(0)
    data = tmp_path / "data"
    _create(data, 2)  # 2 messages per source: 10
    failpoint = "commit.after_commit_point=crash@4"
    with pytest.raises(AssertionError) as caught:
        _failpoint_round(server, data, "count", failpoint, rng, 10, min_messages=4, max_messages=4)
    message = str(caught.value)
    assert "PLAN MISTAKE" in message, message
    assert "after 3 commits, with 10 unconsumed messages" in message, message
    assert "passing commit.after_commit_point 3 times, short of the 4" in message, message
    with _opened(data, copy=False) as session:
        tw.produce(session, 3, 4)  # 20 more: 5 commits of 4
    _failpoint_round(server, data, "count", failpoint, rng, 20, min_messages=4, max_messages=4)


def test_recovery_crashing_after_each_republish_still_publishes_exactly_once(
    tmp_path: Path, server, caplog
) -> None:
    """Crash after the commit point of a transaction writing 2-3 partitions of ``b``, then
    crash recovery itself after every re-published batch (``recovery.after_republish``):
    each recovery re-publishes only what is still missing, so it takes one crash per
    partition of the transaction and then completes, leaving ``b`` exactly once."""
    seed = _seed()
    print(f"TXN_SEED={seed}")
    rng = random.Random(seed)
    data = tmp_path / "data"
    _create(data, 40)
    with _reported(seed, "recovery crashes"):
        _failpoint_round(
            server,
            data,
            "move",
            "commit.after_commit_point=crash@2",
            rng,
            min_messages=60,
            max_messages=60,
        )
        crashes = 0
        for _ in range(tw.B_PARTITIONS + 1):
            worker = server.start(data, "open", seed=0, failpoints="recovery.after_republish=crash")
            if worker.finish(CRASHED, 0) == 0:
                break
            crashes += 1
        assert 2 <= crashes <= tw.B_PARTITIONS, f"{crashes} crashes in recovery"
        print(f"recovery crashed {crashes} times, once per partition left to re-publish")
        with caplog.at_level(logging.WARNING), _opened(data, copy=False) as session:
            found = tw.check_moved(session)
            assert found.consumed == 120, found
            assert found.b_messages == 120
        assert "re-published" not in caplog.text  # the last recovery left nothing to redo
        _run_to_completion(server, data, "move", rng)
        with _opened(data, copy=False) as session:
            found = tw.check_moved(session)
            assert found.consumed == found.a_messages == found.b_messages == 200


def test_crash_between_partitions_of_the_first_publish_to_fresh_partitions_recovers(
    tmp_path: Path, server
) -> None:
    """The very first move transaction (30 messages, 12 groups: all 3 partitions of ``b``,
    all still empty) crashes at ``commit.mid_publish``, after its first partition's frame.
    Reopening must re-publish the rest: recovery asks the not-yet-written partitions
    whether they hold the transaction, and an empty partition must answer "no"."""
    seed = _seed()
    print(f"TXN_SEED={seed}")
    rng = random.Random(seed)
    data = tmp_path / "data"
    _create(data, 20)
    with _reported(seed, "mid-publish crash on fresh partitions"):
        _failpoint_round(
            server,
            data,
            "move",
            "commit.mid_publish=crash@1",
            rng,
            min_messages=30,
            max_messages=30,
        )
        with _opened(data, copy=False) as session:
            found = tw.check_moved(session)
            assert found.consumed == found.b_messages == 30
            assert found.b_partitions_used == tw.B_PARTITIONS


def test_a_publish_that_failed_half_way_is_finished_before_the_next_one(tmp_path: Path) -> None:
    """An I/O error between two partitions' publishes (``commit.mid_publish=error``),
    in process: the transaction committed (COMMIT may report the I/O error, 58030, as
    the outcome of a commit interrupted past its commit point is the client's to
    find out). The next commit first publishes
    the missing share, so ``b``'s partitions keep commit order; closing and reopening
    leaves every message once. Partition 1 is still empty when the publish fails."""
    from storage import errors, failpoints

    database = Database.open(str(tmp_path / "data"))
    try:
        session = database.connect()
        session.execute("CREATE TOPIC b WITH (min_active_partitions = 2)")
        failpoints.activate("commit.mid_publish=error")
        try:
            session.execute("BEGIN")
            session.execute("INSERT INTO TOPIC b (data, partition) VALUES ('t1.0', 0), ('t1.1', 1)")
            try:
                session.execute("COMMIT")
            except errors.StorageIOError as error:  # past the commit point: still committed
                assert error.sqlstate == "58030"
        finally:
            failpoints.deactivate()
        assert _payloads(session, 0) == ["t1.0"]
        session.execute("BEGIN")
        session.execute("INSERT INTO TOPIC b (data, partition) VALUES ('t2.0', 0), ('t2.1', 1)")
        session.execute("COMMIT")
        assert _payloads(session, 0) == ["t1.0", "t2.0"]
        assert _payloads(session, 1) == ["t1.1", "t2.1"]
        session.close()
    finally:
        database.close()
    database = Database.open(str(tmp_path / "data"))
    try:
        session = database.connect()
        assert _payloads(session, 0) == ["t1.0", "t2.0"]
        assert _payloads(session, 1) == ["t1.1", "t2.1"]
        session.close()
    finally:
        database.close()


def test_checkpoints_keep_the_records_of_transactions_on_a_partition_fenced_after_a_write_error(
    tmp_path: Path, monkeypatch
) -> None:
    """Published frames are not synced at commit; a checkpoint syncs the partitions and
    only then passes the commit records (the watermark) and releases the staging (the
    durable copy). T1 is
    published to partitions 0 and 1, unsynced; then T2's publish to partition 1 fails
    with a write error, which fences partition 1 (fsyncgate: its dirty pages, T1's
    frame among them, may be lost). T1's frame in partition 1 can no longer be made
    durable, so no checkpoint may delete T1's record before a reopen re-published it;
    else a power loss loses a committed message."""
    from engine.catalog import SCHEMA
    from storage import errors

    database = Database.open(str(tmp_path / "data"))
    try:
        session = database.connect()
        session.execute("CREATE TOPIC b WITH (min_active_partitions = 2)")
        session.execute("BEGIN")
        session.execute("INSERT INTO TOPIC b (data, partition) VALUES ('t1.0', 0), ('t1.1', 1)")
        session.execute("COMMIT")
        _fence_partition_1(database, monkeypatch, session, "('t2.1', 1)")
        for _ in range(2):  # e.g. the next one due, and the one at close
            with contextlib.suppress(errors.TopicbaseError):
                database.committer.checkpoint()
        # Topic-only: their commit records are in the staging log; none may be passed
        # by the watermark (nor its staging released) while T1's frame is not durable.
        cursor = database.root.cursor()
        marks = cursor.execute(f"SELECT * FROM {SCHEMA}.commit_log_watermark").fetchall()
        cursor.close()
        assert marks == [], f"{marks}: a record of a transaction never synced was passed"
        assert database.committer.backlog == 1  # T1 (T2 waits as an unfinished publish)
        session.close()
    finally:
        with contextlib.suppress(errors.TopicbaseError):
            database.close()
    database = Database.open(str(tmp_path / "data"))
    try:
        session = database.connect()
        assert _payloads(session, 0) == ["t1.0"]
        assert _payloads(session, 1) == ["t1.1", "t2.1"]
        session.close()
    finally:
        database.close()


def test_commit_order_holds_in_a_healthy_partition_while_another_is_fenced(
    tmp_path: Path, monkeypatch
) -> None:
    """T2 writes partitions 0 and 1; its publish to partition 1 fails with a write error
    (partition 1 fenced until reopen). T3 and T4 then write partition 0 only. Their
    publishes must not overtake each other: after the reopen (whose recovery publishes
    whatever is still missing) partition 0 holds T1..T4 in commit order."""
    from storage import errors

    database = Database.open(str(tmp_path / "data"))
    try:
        session = database.connect()
        session.execute("CREATE TOPIC b WITH (min_active_partitions = 2)")
        session.execute("BEGIN")
        session.execute("INSERT INTO TOPIC b (data, partition) VALUES ('t1.0', 0), ('t1.1', 1)")
        session.execute("COMMIT")
        _fence_partition_1(database, monkeypatch, session, "('t2.0', 0), ('t2.1', 1)")
        for name in ("t3", "t4"):
            session.execute("BEGIN")
            session.execute(f"INSERT INTO TOPIC b (data, partition) VALUES ('{name}.0', 0)")
            with contextlib.suppress(errors.StorageIOError):  # committed either way
                session.execute("COMMIT")
        session.close()
    finally:
        with contextlib.suppress(errors.TopicbaseError):
            database.close()
    database = Database.open(str(tmp_path / "data"))
    try:
        session = database.connect()
        assert _payloads(session, 0) == ["t1.0", "t2.0", "t3.0", "t4.0"]
        assert _payloads(session, 1) == ["t1.1", "t2.1"]
        session.close()
    finally:
        database.close()


def _fence_partition_1(database, monkeypatch, session, values: str) -> None:
    """Commit a transaction writing ``values`` to ``b`` while every write to a log file
    of partition 1 fails: it commits, its publish to partition 1 fails and fences it."""
    from storage import errors

    fs = database.store.fs

    def failing(write):
        def wrapper(fd: int, data, position: int) -> None:
            path = fs._paths.get(fd, "")
            if path.endswith(".log") and f"{os.sep}p1{os.sep}" in path:
                raise errors.StorageIOError(f"injected write failure on {path}")
            write(fd, data, position)

        return wrapper

    with monkeypatch.context() as patch:
        for name in ("pwrite", "pwritev"):  # every way a frame reaches a log file
            if hasattr(fs, name):
                patch.setattr(fs, name, failing(getattr(fs, name)))
        session.execute("BEGIN")
        session.execute(f"INSERT INTO TOPIC b (data, partition) VALUES {values}")
        with contextlib.suppress(errors.StorageIOError):
            session.execute("COMMIT")  # committed; its publish failed and fenced p1


def _payloads(session, partition: int) -> list[str]:
    result = session.execute(
        f"SELECT CAST(data AS VARCHAR) AS d FROM TOPIC b WITH (partition = {partition}) "
        'ORDER BY "offset"'
    )[-1]
    assert result.table is not None
    return result.table.column("d").to_pylist()


def test_a_move_commit_costs_one_counted_fsync_and_no_duckdb_commit(tmp_path: Path) -> None:
    """50 move transactions (each reading 10 messages and publishing to 3 partitions of
    ``b``) plus one checkpoint (normally one per 256 commits; here its whole cost is
    charged to these 50). The move touches no table, so it commits in the staging log:
    one staging fdatasync per commit on the commit path (one session: no sharing) and no
    DuckDB record or COMMIT (DuckDB's WAL fsync, which our FileSystem does not count, is
    off the path). Counting every data and directory sync through ``FileSystem``: the
    commits' 50, the checkpoint's partition syncs and a staging file's creation."""
    database = Database.open(str(tmp_path / "data"))
    try:
        session = database.connect()
        tw.create(session)
        tw.produce(session, 1, 100)
        fs = database.store.fs
        before = fs.fsync_count + fs.directory_fsync_count
        counters = database.commit_counters()
        commits = 50
        for _ in range(commits):
            session.execute("BEGIN")
            assert session.execute(tw.MOVE.format(k=10))[-1].tag == "INSERT 0 10"
            session.execute("COMMIT")
        after = database.commit_counters()
        database.committer.checkpoint()
        used = fs.fsync_count + fs.directory_fsync_count - before
        print(f"{used} counted fsyncs for {commits} commits and a checkpoint")
        assert after["log_commits"] - counters["log_commits"] == commits
        assert after["table_commits"] == counters["table_commits"]
        assert after["staging_syncs"] - counters["staging_syncs"] == commits
        assert used <= commits + 10, f"{used} fsyncs for {commits} commits"
        found = tw.check_moved(session)
        assert found.consumed == found.b_messages == commits * 10
        session.close()
    finally:
        database.close()
