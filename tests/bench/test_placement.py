"""bench.placement and the pgwire latency rounds' placement samples: a serving thread held
on the client's CPU reads as together, one held on the other CPU as apart."""

from __future__ import annotations

import os
import queue
import struct
import threading
from collections.abc import Callable, Iterator

import pytest

from bench import placement
from bench.pgwire_bench import PLACEMENT_EVERY, Way, latency_rounds

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/thread-self/stat") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux /proc and two CPUs",
)


def _server_on(cpu: int) -> tuple[Callable[[int], None], Callable[[], None], int]:
    """A serving thread of this process held on ``cpu`` that does a little work per call:
    (the call, a stop, its thread id)."""
    requests: queue.Queue[int | None] = queue.Queue()
    replies: queue.Queue[int] = queue.Queue()
    ready: queue.Queue[int] = queue.Queue()

    def serve() -> None:
        os.sched_setaffinity(0, {cpu})
        ready.put(threading.get_native_id())
        while (item := requests.get()) is not None:
            replies.put(sum(range(100_000)) + item)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    tid = ready.get(timeout=10)

    def call(key: int) -> None:
        requests.put(key)
        replies.get(timeout=10)

    def stop() -> None:
        requests.put(None)
        thread.join(timeout=10)

    return call, stop, tid


@pytest.fixture
def client_on_cpu0() -> Iterator[list[int]]:
    cpus = sorted(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpus[0]})
    try:
        yield cpus
    finally:
        os.sched_setaffinity(0, before)


def test_last_cpu_and_own_cpu_follow_affinity(client_on_cpu0: list[int]) -> None:
    assert placement.own_cpu() == client_on_cpu0[0]
    me = threading.get_native_id()
    assert placement.last_cpu(os.getpid(), me) == client_on_cpu0[0]
    assert placement.last_cpu(os.getpid(), 10**9) is None  # no such thread


def test_busiest_finds_the_thread_that_ran() -> None:
    call, stop, tid = _server_on(sorted(os.sched_getaffinity(0))[-1])
    try:
        before = placement.thread_times(os.getpid())
        assert tid in before
        for key in range(50):
            call(key)
        # The caller waits in the queue; the serving thread sums: it ran longest... or
        # the caller did; either way the answer is a live thread of this process.
        assert placement.busiest(os.getpid(), before) in placement.thread_times(os.getpid())
    finally:
        stop()


def _server_process_on(cpu: int) -> tuple[Callable[[int], None], Callable[[], None], int]:
    """A serving *process* held on ``cpu`` (forked: one thread, as ``topicbase serve``'s
    busiest is its serving one) that does a little work per call: (the call, a stop, its
    pid). Its own process, so the busiest thread the rounds look for is the serving one,
    whatever other threads the test process holds (a whole suite's leave some behind)."""
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only reads, sums and writes (no lock of the parent's)
        try:
            os.close(requests_write)
            os.close(replies_read)
            os.sched_setaffinity(0, {cpu})
            while len(request := os.read(requests_read, 8)) == 8:
                os.write(replies_write, struct.pack("!q", sum(range(100_000)) + request[0]))
        finally:
            os._exit(0)
    os.close(requests_read)
    os.close(replies_write)

    def call(key: int) -> None:
        os.write(requests_write, struct.pack("!q", key))
        assert len(os.read(replies_read, 8)) == 8

    def stop() -> None:
        os.close(requests_write)
        os.waitpid(pid, 0)
        os.close(replies_read)

    return call, stop, pid


@pytest.mark.parametrize("apart", [False, True])
def test_latency_rounds_sample_apart_and_together(client_on_cpu0: list[int], apart: bool) -> None:
    """The serving process on the other CPU reads 1.0 in every round, on the client's CPU
    0.0 (the thread found is its serving one: the caller only waits)."""
    cpu = client_on_cpu0[-1] if apart else client_on_cpu0[0]
    call, stop, pid = _server_process_on(cpu)
    try:
        way = Way("wire", None, None, None, lookup=call, serving_pid=pid)
        rounds = latency_rounds([way], 5 * 2 * PLACEMENT_EVERY, lambda w: w.lookup)
    finally:
        stop()
    shares = rounds.apart["wire"]
    assert len(shares) == 5
    assert shares == [1.0 if apart else 0.0] * 5


def test_a_way_without_a_serving_process_records_no_placement() -> None:
    way = Way("embedded", None, None, None, lookup=lambda key: None)
    rounds = latency_rounds([way], 5 * PLACEMENT_EVERY, lambda w: w.lookup)
    assert rounds.apart == {}
    assert len(rounds.samples["embedded"]) == 5
