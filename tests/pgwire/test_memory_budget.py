"""The server-wide budget of client bytes held between messages (``sql.pgwire.memory_budget``):
COPY FROM STDIN data and held portals' Bind messages of all connections together stay
within ``held_bytes_max`` beyond each connection's floor, one connection's within its share;
the connection that would pass either gets 53200 and goes on, every other connection can
still bind and COPY within its floor (review R1-6), and every byte is given back when the
COPY ends, the portal goes or the connection closes."""

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
from sql.pgwire.memory_budget import LoginAccount, MemoryBudget, MemoryBudgetExceededError
from sql.pgwire.server import ServerThread
from tests.pgwire.rawclient import RawClient, error_fields, query

BUDGET_BYTES = 1024 * 1024
FLOOR_BYTES = 64 * 1024
SHARE_BYTES = BUDGET_BYTES // 4  # what one connection may be charged beyond its floor
PIECE_BYTES = 300 * 1024  # charges 236 KiB: four connections' pieces fit, five do not
SMALL_BYTES = 16 * 1024  # within the floor


@pytest.fixture
def small_budget(tmp_path: Path) -> Iterator[ServerThread]:
    limits = ServerLimits(held_bytes_max=BUDGET_BYTES, held_bytes_floor=FLOOR_BYTES)
    running = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0, limits)
    setup = _connect(running)
    setup.execute("CREATE TABLE lines (s VARCHAR)")
    setup.close()
    yield running
    running.stop()


def _connect(server: ServerThread, user: str = "tester") -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=server.port, user=user,
                           dbname="topicbase", connect_timeout=10, autocommit=True)  # fmt: skip


def _charged(server: ServerThread) -> int:
    return server.server.memory_budget.held_bytes


def _wait_for(count: Callable[[], int], expected: int) -> None:
    """``count()`` once the server has handled what was sent (it runs apart)."""
    deadline = time.monotonic() + 20
    while count() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert count() == expected


def _wait_for_charged(server: ServerThread, expected: int) -> None:
    _wait_for(lambda: _charged(server), expected)


def _copy_lines(count_bytes: int) -> bytes:
    line = b"x" * 1023 + b"\n"
    return line * (count_bytes // len(line))


def _open_copy(server: ServerThread, nbytes: int = PIECE_BYTES, user: str = "tester") -> RawClient:
    """A raw connection of ``user`` in COPY lines FROM STDIN holding ``nbytes`` of data, not
    done."""
    client = RawClient(server.port)
    client.start(user=user)
    client.send(query("COPY lines FROM STDIN"))
    kind, _ = client.read()
    assert kind == b"G"
    client.send(m.copy_data(_copy_lines(nbytes)))
    return client


def _copy(connection: psycopg.Connection, nbytes: int) -> None:
    with connection.cursor().copy("COPY lines FROM STDIN") as copy:
        copy.write(_copy_lines(nbytes))


def _count(connection: psycopg.Connection) -> int:
    row = connection.execute("SELECT count(*) FROM lines").fetchone()
    assert row is not None
    return int(row[0])


def test_copy_data_of_all_connections_stays_within_the_budget(small_budget: ServerThread) -> None:
    holders = [_open_copy(small_budget, user=f"holder{n}") for n in range(4)]  # a share each
    _wait_for_charged(small_budget, 4 * (PIECE_BYTES - FLOOR_BYTES))
    victim = _connect(small_budget)
    with pytest.raises(psycopg.errors.OutOfMemory) as refused:
        _copy(victim, PIECE_BYTES)
    assert refused.value.sqlstate == "53200"
    assert "server's limit" in str(refused.value)
    assert _count(victim) == 0  # usable, nothing in
    _wait_for_charged(small_budget, 4 * (PIECE_BYTES - FLOOR_BYTES))  # the refused COPY's back
    _copy(victim, SMALL_BYTES)  # within its floor: taken however full the budget is
    assert _count(victim) == SMALL_BYTES // 1024
    holders[0].send(m.copy_done())
    assert [kind for kind, _ in holders[0].until_ready()] == [b"C", b"Z"]
    _wait_for_charged(small_budget, 3 * (PIECE_BYTES - FLOOR_BYTES))
    _copy(victim, PIECE_BYTES)  # room again
    assert _count(victim) == (SMALL_BYTES + 2 * PIECE_BYTES) // 1024
    holders[1].close()  # a connection lost mid-COPY gives its bytes back too
    victim.close()
    for holder in (holders[0], *holders[2:]):
        holder.close()
    _wait_for_charged(small_budget, 0)


def test_one_connection_is_refused_past_its_share_of_an_empty_budget(
    small_budget: ServerThread,
) -> None:
    client = _connect(small_budget)
    with pytest.raises(psycopg.errors.OutOfMemory) as refused:
        _copy(client, FLOOR_BYTES + SHARE_BYTES + 1024)
    assert "past its share" in str(refused.value)
    _wait_for_charged(small_budget, 0)
    _copy(client, FLOOR_BYTES + SHARE_BYTES)  # its floor and its whole share
    assert _count(client) == (FLOOR_BYTES + SHARE_BYTES) // 1024
    client.close()
    _wait_for_charged(small_budget, 0)


def _bind_named(portal: str, value_bytes: int) -> bytes:
    """A Bind of ``portal`` of the unnamed statement to a text of ``value_bytes``."""
    value = b"y" * value_bytes
    return m.message(b"B", m.cstr(portal) + m.cstr("") + struct.pack("!hh", 0, 1)
                     + struct.pack("!i", len(value)) + value + struct.pack("!h", 0))  # fmt: skip


def _holder_of_its_share(server: ServerThread, user: str) -> RawClient:
    """A raw connection of ``user`` in a transaction block holding a named portal whose Bind
    message is its floor and its whole share, then idle (it lives until the block ends)."""
    holder = RawClient(server.port)
    holder.start(user=user)
    holder.send(query("BEGIN"))
    holder.until_ready()
    holder.send(m.message(b"P", m.cstr("") + m.cstr("SELECT length($1)") + struct.pack("!h", 0)))
    bind = _bind_named("p", 0)
    bind = _bind_named("p", FLOOR_BYTES + SHARE_BYTES - (len(bind) - 5))  # the body counts
    assert len(bind) - 5 == FLOOR_BYTES + SHARE_BYTES
    holder.send(bind + m.message(b"S"))
    assert [kind for kind, _ in holder.until_ready()] == [b"1", b"2", b"Z"]
    return holder


def test_holders_that_fill_the_budget_leave_every_other_connection_its_floor(
    small_budget: ServerThread,
) -> None:
    holders = [_holder_of_its_share(small_budget, f"holder{n}") for n in range(4)]
    _wait_for_charged(small_budget, BUDGET_BYTES)  # full, each idle in its block
    victim = _connect(small_budget)
    with pytest.raises(psycopg.errors.OutOfMemory) as refused:  # past its floor: no room
        victim.execute("SELECT length(%s)", ["z" * PIECE_BYTES])
    assert "server's limit" in str(refused.value)
    for _ in range(3):  # within its floor: bound, run, and a small COPY taken
        assert victim.execute("SELECT length(%s)", ["small"]).fetchone() == (5,)
        _copy(victim, SMALL_BYTES)
    assert _count(victim) == 3 * SMALL_BYTES // 1024
    holders[0].send(_bind_named("one_more", 1) + m.message(b"S"))  # past its share
    got = holders[0].until_ready()
    assert [kind for kind, _ in got] == [b"E", b"Z"]
    assert error_fields(got[0][1])["C"] == "53200" and "past its share" in error_fields(
        got[0][1])["M"]  # fmt: skip
    _wait_for_charged(small_budget, BUDGET_BYTES)
    for holder in holders[:2]:  # the portals go at the block's end
        holder.send(query("ROLLBACK"))
        assert [kind for kind, _ in holder.until_ready()] == [b"C", b"Z"]
    _wait_for_charged(small_budget, 2 * SHARE_BYTES)
    assert victim.execute("SELECT length(%s)", ["z" * PIECE_BYTES]).fetchone() == (PIECE_BYTES,)
    for holder in holders[2:]:  # a connection closed in its block gives its bytes back
        holder.close()
    victim.close()
    holders[0].close()
    holders[1].close()
    _wait_for_charged(small_budget, 0)


class _CountingBudget(MemoryBudget):
    """A budget that counts its lock-taking calls."""

    def __init__(self) -> None:
        super().__init__(BUDGET_BYTES, FLOOR_BYTES)
        self.calls = 0

    def charge(self, nbytes: int, what: str, account: LoginAccount | None = None) -> None:
        self.calls += 1
        super().charge(nbytes, what, account)

    def give(self, nbytes: int, account: LoginAccount | None = None) -> None:
        self.calls += 1
        super().give(nbytes, account)


def test_binds_within_the_floor_never_touch_the_budget() -> None:
    budget = _CountingBudget()
    holdings = budget.connection()
    portals = HeldPortals(holdings)
    for _ in range(1000):  # a statement: Bind, then Sync drops its portal
        portals.hold("", Portal(None, [], []), 100)  # type: ignore[arg-type]
        portals.clear()
    holdings.take(FLOOR_BYTES, "COPY FROM STDIN data")  # exactly the floor: still free
    assert budget.calls == 0 and budget.held_bytes == 0
    holdings.give(FLOOR_BYTES)
    portals.hold("big", Portal(None, [], []), PIECE_BYTES)  # type: ignore[arg-type]
    assert budget.held_bytes == PIECE_BYTES - FLOOR_BYTES == holdings.charged
    with pytest.raises(MemoryBudgetExceededError, match="past its share"):  # nothing stored
        portals.hold("bigger", Portal(None, [], []), PIECE_BYTES)  # type: ignore[arg-type]
    assert list(portals) == ["big"] and portals.held_bytes == holdings.held == PIECE_BYTES
    portals.hold("big", Portal(None, [], []), 200)  # type: ignore[arg-type]  # replaced
    assert budget.held_bytes == 0 and holdings.held == 200
    portals.release()
    assert budget.held_bytes == 0 and holdings.held == 0 and not portals


def test_the_budget_refuses_past_its_limit_whatever_each_share() -> None:
    budget = MemoryBudget(BUDGET_BYTES, FLOOR_BYTES)
    connections = [budget.connection() for _ in range(5)]
    for holdings in connections[:4]:
        holdings.take(FLOOR_BYTES + SHARE_BYTES, "a Bind message")
    assert budget.held_bytes == BUDGET_BYTES
    with pytest.raises(MemoryBudgetExceededError, match="server's limit"):
        connections[4].take(FLOOR_BYTES + 1, "a Bind message")
    assert connections[4].held == connections[4].charged == 0
    connections[4].take(FLOOR_BYTES, "a Bind message")  # its floor is never refused
    for holdings in connections:
        holdings.give(holdings.held)
    assert budget.held_bytes == 0


# -- messages still arriving (review R1-7) -------------------------------------------------------
def _long_query(body_bytes: int) -> bytes:
    """A Query message of ``body_bytes`` (SELECT 1 and a comment) as sent."""
    text = b"SELECT 1 --"
    return m.message(b"Q", text + b"x" * (body_bytes - len(text) - 1) + b"\0")


def test_a_long_message_holds_its_length_while_it_arrives(small_budget: ServerThread) -> None:
    senders = []
    for n in range(4):  # each announces PIECE_BYTES and sends two thirds of it
        sender = RawClient(small_budget.port)
        sender.start(user=f"sender{n}")
        whole = _long_query(PIECE_BYTES)
        sender.send(whole[: 2 * len(whole) // 3])
        senders.append((sender, whole))
    _wait_for_charged(small_budget, 4 * (PIECE_BYTES - FLOOR_BYTES))
    late = RawClient(small_budget.port)  # a fifth long message does not fit: skipped, 53200
    late.start()
    late.send(_long_query(PIECE_BYTES))
    got = late.until_ready()
    assert [kind for kind, _ in got] == [b"E", b"Z"]
    assert error_fields(got[0][1])["C"] == "53200"
    late.send(query("SELECT 2"))  # the stream goes on after the skipped body
    assert [kind for kind, _ in late.until_ready()] == [b"T", b"D", b"C", b"Z"]
    victim = _connect(small_budget)  # short messages are within every floor
    assert victim.execute("SELECT length(%s)", ["small"]).fetchone() == (5,)
    for sender, whole in senders:  # the rest comes: run, and the bytes given back
        sender.send(whole[2 * len(whole) // 3 :])
        assert [kind for kind, _ in sender.until_ready()] == [b"T", b"D", b"C", b"Z"]
    _wait_for_charged(small_budget, 0)
    senders[0][0].send(_long_query(PIECE_BYTES)[:1000])  # never finished: given back at close
    _wait_for_charged(small_budget, PIECE_BYTES - FLOOR_BYTES)
    for client in (late, *(sender for sender, _ in senders)):
        client.close()
    victim.close()
    _wait_for_charged(small_budget, 0)


def test_a_long_message_past_the_share_is_skipped_in_a_block_and_fails_it(
    small_budget: ServerThread,
) -> None:
    client = RawClient(small_budget.port)
    client.start()
    client.send(query("BEGIN"))
    client.until_ready()
    client.send(_long_query(FLOOR_BYTES + SHARE_BYTES + 1))
    got = client.until_ready()
    assert [kind for kind, _ in got] == [b"E", b"Z"] and got[1][1] == b"E"  # failed block
    assert "past its share" in error_fields(got[0][1])["M"]
    client.send(query("ROLLBACK"))
    assert [kind for kind, _ in client.until_ready()] == [b"C", b"Z"]
    client.send(_long_query(FLOOR_BYTES + SHARE_BYTES))  # its floor and share: taken
    assert [kind for kind, _ in client.until_ready()] == [b"T", b"D", b"C", b"Z"]
    client.close()
    _wait_for_charged(small_budget, 0)


# -- one login's connections together (R1-6's remainder) -----------------------------------------
def _wait_for_accounts(server: ServerThread, expected: dict[str, int]) -> None:
    deadline = time.monotonic() + 20
    while server.server.memory_budget.accounts() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.server.memory_budget.accounts() == expected


def test_the_connections_of_one_user_are_charged_one_share_together(
    small_budget: ServerThread,
) -> None:
    charged = PIECE_BYTES - FLOOR_BYTES  # 236 KiB: two fit a user's half of the budget, three not
    first = _open_copy(small_budget, user="alice")
    second = _open_copy(small_budget, user="alice")
    _wait_for_accounts(small_budget, {"alice": 2 * charged})
    third = _connect(small_budget, user="alice")
    with pytest.raises(psycopg.errors.OutOfMemory) as refused:
        _copy(third, PIECE_BYTES)
    assert refused.value.sqlstate == "53200"
    assert "user 'alice'" in str(refused.value) and "one user's share" in str(refused.value)
    assert _count(third) == 0  # nothing of the refused COPY, and the connection goes on
    _copy(third, SMALL_BYTES)  # within its own floor: never refused
    other = _connect(small_budget, user="bob")  # another user's share is its own
    _copy(other, PIECE_BYTES)
    assert _count(other) == (SMALL_BYTES + PIECE_BYTES) // 1024
    first.send(m.copy_done())  # alice's first COPY ends: room in her share again
    assert [kind for kind, _ in first.until_ready()] == [b"C", b"Z"]
    _wait_for_accounts(small_budget, {"alice": charged, "bob": 0})
    _copy(third, PIECE_BYTES)
    assert _count(third) == (SMALL_BYTES + 3 * PIECE_BYTES) // 1024  # one table: four COPYs
    for client in (third, other):
        client.close()
    first.close()
    second.close()  # lost mid-COPY: its bytes come back too
    _wait_for_accounts(small_budget, {})  # no account outlives its connections
    _wait_for_charged(small_budget, 0)


def test_a_login_account_is_kept_while_a_connection_or_a_charge_keeps_it() -> None:
    budget = MemoryBudget(BUDGET_BYTES, FLOOR_BYTES)
    login_share = budget.login_share_max
    assert login_share == BUDGET_BYTES // 2
    one, two, three, other = (budget.connection() for _ in range(4))
    for holdings in (one, two, three):
        budget.join(holdings, "alice")
    budget.join(other, "bob")
    one.take(FLOOR_BYTES + SHARE_BYTES, "COPY FROM STDIN data")
    two.take(FLOOR_BYTES + SHARE_BYTES // 2, "COPY FROM STDIN data")
    with pytest.raises(MemoryBudgetExceededError, match="one user's share"):
        three.take(FLOOR_BYTES + SHARE_BYTES // 2 + 1, "COPY FROM STDIN data")
    assert three.held == three.charged == 0  # nothing counted for the refused take
    assert budget.accounts() == {"alice": SHARE_BYTES + SHARE_BYTES // 2, "bob": 0}
    three.take(FLOOR_BYTES + SHARE_BYTES // 2, "COPY FROM STDIN data")  # exactly her share
    other.take(FLOOR_BYTES + SHARE_BYTES, "a Bind message")
    assert budget.held_bytes == login_share + SHARE_BYTES
    for holdings in (one, one, two, three, other):  # ended before their COPYs gave back;
        budget.leave(holdings)  # a second leave of ``one`` changes nothing
    assert budget.accounts() == {"alice": login_share, "bob": SHARE_BYTES}
    for holdings in (one, two, three, other):
        holdings.give(holdings.held)
    assert budget.accounts() == {} and budget.held_bytes == 0
