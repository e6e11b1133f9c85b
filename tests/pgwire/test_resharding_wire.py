"""The YDB article's resharding loop through the server: worker processes on psycopg, killed.

A server (``ServerThread``, in this process) serves one data directory. ``WORKERS``
worker processes (``resharding_worker.py``) each loop BEGIN; SELECT from topic ``a``
with consumer ``mover``; INSERT INTO TOPIC ``b`` with parameters; COMMIT, retrying on
40001, either as members of the consumer's group (leases) or optimistically (the offset
check at COMMIT decides). While they run, the test keeps producing into ``a`` and
SIGKILLs a random worker (seeded) a random 0-400 ms after it entered its loop, starting
a new one in its place; a kill may land anywhere: mid-statement, between COMMIT and its
reply, while its rows are in flight. The server learns of it only from the closed socket.
At the end every worker runs until ``mover`` has consumed all of ``a``, and the checks of
``tests/engine/txn_worker.check_moved`` hold: ``b`` holds every message of ``a`` exactly
once, each source's messages in order within a partition of ``b``, each user's messages
in one partition.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sql.pgwire.server import ServerThread
from tests.engine import txn_worker

WORKER = Path(__file__).with_name("resharding_worker.py")
WORKERS = 4
ROUNDS = 4  # production rounds into topic a, the first before the workers start
PER_ROUND = 60  # messages per source per round
KILL_PHASE_S = 3.0
KILLS_MIN = 4
DRAIN_TIMEOUT_S = 90.0
READY_POLLS = 1500  # x 20 ms
SEED = 20261121


class WorkerPool:
    """The worker processes; slot ``i`` always runs as member ``w<i>`` (in members mode)."""

    def __init__(self, port: int, members: bool, directory: Path) -> None:
        self.port = port
        self.members = members
        self.directory = directory
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * WORKERS
        self.outputs: list[Path | None] = [None] * WORKERS
        self.starts = 0
        self.kills = 0
        self.kills_while_connected = 0  # the worker had printed "ready": it was in its loop

    def _output(self, slot: int, stream: str) -> Path:
        return self.directory / f"worker{slot}.{self.starts}.{stream}"

    def start(self, slot: int) -> None:
        assert self.processes[slot] is None
        self.starts += 1
        command = [sys.executable, str(WORKER), "--port", str(self.port),
                   "--seed", str(SEED + self.starts)]  # fmt: skip
        if self.members:
            command += ["--member", f"w{slot}"]
        with self._output(slot, "out").open("wb") as out, \
                self._output(slot, "err").open("wb") as err:  # fmt: skip
            self.processes[slot] = subprocess.Popen(command, stdout=out, stderr=err)
        self.outputs[slot] = self._output(slot, "out")

    def kill(self, slot: int) -> None:
        process = self.processes[slot]
        output = self.outputs[slot]
        assert process is not None and output is not None
        connected = output.read_text().startswith("ready")
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        self.processes[slot] = None
        self.kills += 1
        self.kills_while_connected += connected

    def wait_ready(self, slot: int) -> None:
        """Wait (bounded) until the worker in ``slot`` has connected and entered its loop."""
        output = self.outputs[slot]
        assert output is not None
        for _ in range(READY_POLLS):
            if output.read_text().startswith("ready"):
                return
            self.check_alive()
            time.sleep(0.02)
        raise AssertionError(f"worker {slot} did not connect")

    def check_alive(self) -> None:
        """No worker may end by itself: that is an error in it (its stderr says which)."""
        for slot, process in enumerate(self.processes):
            if process is not None and process.poll() is not None:
                errors = sorted(self.directory.glob(f"worker{slot}.*.err"))
                text = "\n".join(p.read_text() for p in errors)
                raise AssertionError(f"worker {slot} exited with {process.returncode}:\n{text}")

    def stop_all(self) -> None:
        for slot, process in enumerate(self.processes):
            if process is not None:
                process.kill()
                process.wait(timeout=30)
                self.processes[slot] = None

    def count(self, word: str) -> int:
        return sum(
            1
            for path in self.directory.glob("worker*.out")
            for line in path.read_text().splitlines()
            if line.startswith(word)
        )


def consumed_all(session) -> bool:
    committed = txn_worker.committed_offsets(session, "mover")
    ends = txn_worker.end_offsets(session, "a")
    return all(committed.get(p, 0) == end for p, end in ends.items())


@pytest.mark.parametrize("mode", ["members", "optimistic"])
def test_resharding_loop_through_the_wire(tmp_path: Path, mode: str) -> None:
    rng = random.Random(SEED)
    server = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0)
    session = server.database.connect()  # the producer and the checker, embedded
    pool = WorkerPool(server.port, mode == "members", tmp_path)
    try:
        txn_worker.create(session)
        txn_worker.produce(session, 1, PER_ROUND)
        produced = 1
        for slot in range(WORKERS):
            pool.start(slot)
        deadline = time.monotonic() + KILL_PHASE_S
        while time.monotonic() < deadline or pool.kills_while_connected < KILLS_MIN:
            slot = rng.randrange(WORKERS)
            pool.wait_ready(slot)
            time.sleep(rng.uniform(0.0, 0.4))  # into its loop: mid-statement, mid-commit ...
            pool.check_alive()
            pool.kill(slot)
            pool.start(slot)
            if produced < ROUNDS and rng.random() < 0.5:
                txn_worker.produce(session, 1 + produced * PER_ROUND, PER_ROUND)
                produced += 1
        while produced < ROUNDS:
            txn_worker.produce(session, 1 + produced * PER_ROUND, PER_ROUND)
            produced += 1
        drain_deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while not consumed_all(session):
            pool.check_alive()
            assert time.monotonic() < drain_deadline, "the workers did not consume topic a"
            time.sleep(0.1)
        pool.stop_all()
        check = txn_worker.check_moved(session)
        total = txn_worker.SOURCES * PER_ROUND * ROUNDS
        assert check.a_messages == total
        assert check.consumed == total and check.b_messages == total
        assert check.b_partitions_used == txn_worker.B_PARTITIONS
        assert pool.kills_while_connected >= KILLS_MIN and pool.count("commit") > 0
        print(f"{mode}: {pool.kills} kills ({pool.kills_while_connected} of connected workers), "
              f"{pool.count('commit')} commits acknowledged, "
              f"{pool.count('retry')} retries on 40001")  # fmt: skip
    finally:
        pool.stop_all()
        session.close()
        server.stop()
