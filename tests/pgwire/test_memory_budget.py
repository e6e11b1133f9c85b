"""The server-wide budget of client bytes held between messages (``sql.pgwire.memory_budget``):
COPY FROM STDIN data and held portals' Bind messages of all connections together stay
within ``held_bytes_max``; the connection that would pass it gets 53200 and goes on, and
every byte is given back when the COPY ends, the portal goes or the connection closes."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from sql.pgwire.codec import messages as m
from sql.pgwire.connection.portals import HeldPortals, Portal
from sql.pgwire.limits import ServerLimits
from sql.pgwire.memory_budget import (
    HELD_PORTALS_STEP_BYTES,
    MemoryBudget,
    MemoryBudgetExceededError,
)
from sql.pgwire.server import ServerThread
from tests.pgwire.rawclient import RawClient, query

BUDGET_BYTES = 1024 * 1024
PIECE_BYTES = 400 * 1024  # two pieces fit, three do not


@pytest.fixture
def small_budget(tmp_path: Path) -> Iterator[ServerThread]:
    running = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0,
                           ServerLimits(held_bytes_max=BUDGET_BYTES))  # fmt: skip
    setup = _connect(running)
    setup.execute("CREATE TABLE lines (s VARCHAR)")
    setup.close()
    yield running
    running.stop()


def _connect(server: ServerThread) -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                           dbname="topicbase", connect_timeout=10, autocommit=True)  # fmt: skip


def _copy_bytes(server: ServerThread) -> int:
    """What the budget counts beyond the connections' portals' reservations: COPY data."""
    portals = sum(c.portals.reserved_bytes for c in list(server.server.connections.values()))
    return server.server.memory_budget.held_bytes - portals


def _wait_for(count: Callable[[], int], expected: int) -> None:
    """``count()`` once the server has handled what was sent (it runs apart)."""
    deadline = time.monotonic() + 20
    while count() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert count() == expected


def _wait_for_held(server: ServerThread, expected: int) -> None:
    _wait_for(lambda: _copy_bytes(server), expected)


def _step_up(nbytes: int) -> int:
    return -(-nbytes // HELD_PORTALS_STEP_BYTES) * HELD_PORTALS_STEP_BYTES


def _copy_lines(count_bytes: int) -> bytes:
    line = b"x" * 1023 + b"\n"
    return line * (count_bytes // len(line))


def _open_copy(server: ServerThread) -> RawClient:
    """A raw connection in COPY lines FROM STDIN holding PIECE_BYTES of data, not done."""
    client = RawClient(server.port)
    client.start()
    client.send(query("COPY lines FROM STDIN"))
    kind, _ = client.read()
    assert kind == b"G"
    client.send(m.copy_data(_copy_lines(PIECE_BYTES)))
    return client


def test_copy_data_of_all_connections_stays_within_the_budget(small_budget: ServerThread) -> None:
    holders = [_open_copy(small_budget) for _ in range(2)]
    _wait_for_held(small_budget, 2 * PIECE_BYTES)
    victim = _connect(small_budget)
    with (
        pytest.raises(psycopg.errors.OutOfMemory) as refused,
        victim.cursor().copy("COPY lines FROM STDIN") as copy,
    ):
        copy.write(_copy_lines(PIECE_BYTES))
    assert refused.value.sqlstate == "53200"
    assert victim.execute("SELECT count(*) FROM lines").fetchone() == (0,)  # usable, nothing in
    _wait_for_held(small_budget, 2 * PIECE_BYTES)  # the refused COPY gave its bytes back
    holders[0].send(m.copy_done())
    assert [kind for kind, _ in holders[0].until_ready()] == [b"C", b"Z"]
    _wait_for_held(small_budget, PIECE_BYTES)
    with victim.cursor().copy("COPY lines FROM STDIN") as copy:  # room again
        copy.write(_copy_lines(PIECE_BYTES))
    assert victim.execute("SELECT count(*) FROM lines").fetchone() == (2 * (PIECE_BYTES // 1024),)
    holders[1].close()  # a connection lost mid-COPY gives its bytes back too
    victim.close()
    holders[0].close()
    _wait_for(lambda: small_budget.server.memory_budget.held_bytes, 0)


def _bind_named(client: RawClient, portal: str, value: bytes) -> int:
    """Bind ``portal`` of the unnamed statement to ``value``; the Bind body's size."""
    body = (m.cstr(portal) + m.cstr("") + struct.pack("!hh", 0, 1)
            + struct.pack("!i", len(value)) + value + struct.pack("!h", 0))  # fmt: skip
    client.send(m.message(b"B", body))
    return len(body)


def test_bound_parameters_of_all_connections_stay_within_the_budget(
    small_budget: ServerThread,
) -> None:
    holder = RawClient(small_budget.port)
    holder.start()
    holder.send(query("BEGIN"))
    holder.until_ready()
    holder.send(m.message(b"P", m.cstr("") + m.cstr("SELECT length($1)") + struct.pack("!h", 0)))
    held = 0
    for name in ("p1", "p2"):  # named portals live until the transaction ends
        held += _bind_named(holder, name, b"y" * PIECE_BYTES)
    holder.send(m.message(b"S"))
    assert [kind for kind, _ in holder.until_ready()] == [b"1", b"2", b"2", b"Z"]
    budget = small_budget.server.memory_budget
    _wait_for(lambda: budget.held_bytes, _step_up(held))  # taken in steps
    victim = _connect(small_budget)
    with pytest.raises(psycopg.errors.OutOfMemory):
        victim.execute("SELECT length(%s)", ["z" * PIECE_BYTES])
    assert victim.execute("SELECT length(%s)", ["small"]).fetchone() == (5,)  # usable
    holder.send(query("COMMIT"))  # the transaction's portals go at its end
    assert [kind for kind, _ in holder.until_ready()] == [b"C", b"Z"]
    # the holder keeps one step, the victim one (its small statements)
    _wait_for(lambda: budget.held_bytes, 2 * HELD_PORTALS_STEP_BYTES)
    assert victim.execute("SELECT length(%s)", ["z" * PIECE_BYTES]).fetchone() == (PIECE_BYTES,)
    holder.close()
    victim.close()
    _wait_for(lambda: budget.held_bytes, 0)


def test_small_binds_take_the_budget_once_and_big_ones_give_back_all_but_a_step() -> None:
    class CountingBudget(MemoryBudget):
        def __init__(self) -> None:
            super().__init__(BUDGET_BYTES)
            self.calls = 0

        def take(self, nbytes: int, what: str) -> None:
            self.calls += 1
            super().take(nbytes, what)

        def give(self, nbytes: int) -> None:
            self.calls += 1
            super().give(nbytes)

    budget = CountingBudget()
    portals = HeldPortals(budget)
    for _ in range(1000):  # a statement: Bind, then Sync drops its portal
        portals.hold("", Portal(None, [], []), 100)  # type: ignore[arg-type]
        portals.clear()
    assert budget.calls == 1 and budget.held_bytes == HELD_PORTALS_STEP_BYTES
    portals.hold("big", Portal(None, [], []), PIECE_BYTES)  # type: ignore[arg-type]
    assert budget.held_bytes == _step_up(PIECE_BYTES)
    with pytest.raises(MemoryBudgetExceededError):  # past the budget: nothing stored
        portals.hold("bigger", Portal(None, [], []), 2 * PIECE_BYTES)  # type: ignore[arg-type]
    assert list(portals) == ["big"] and portals.held_bytes == PIECE_BYTES
    portals.pop("big")
    assert budget.held_bytes == HELD_PORTALS_STEP_BYTES and portals.held_bytes == 0
    portals.release()
    assert budget.held_bytes == 0
