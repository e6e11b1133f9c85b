"""``statement_timeout`` and a CancelRequest end a statement while the engine's front still
works on its text (round 28, H2: ``engine.interrupts.front_checked``): megabytes of text
cost the front tens of seconds of Python before DuckDB sees it, which nothing interrupted.
57014 within a moment, nothing written, the connection usable; over the simple and the
extended protocol, for a write and for a query (which the wire reads as a stream)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from psycopg import errors

Connect = Callable[..., psycopg.Connection]

# ~3 MiB: the front alone takes >15 s of a core for it on this machine (round 27: 33.9 s as
# an ordinary user); interrupted, the statement ends well within BOUND_S.
ROWS = 160_000
BOUND_S = 6.0
CANCEL_AFTER_S = 3.0


def _insert() -> str:
    # rows of expressions ("+ 0"): rows of plain literals skip sqlglot's parse (round 29,
    # ``planner.literal_rows``) and the whole statement now ends within CANCEL_AFTER_S
    return "INSERT INTO t VALUES " + ", ".join(f"({i} + 0, 'v{i}')" for i in range(ROWS))


def _query() -> str:
    return "SELECT count(*) FROM t WHERE a IN (" + ", ".join(map(str, range(4 * ROWS))) + ")"


def _cursor(connection: psycopg.Connection, protocol: str) -> psycopg.Cursor:
    if protocol == "simple":
        return psycopg.ClientCursor(connection)  # a Query message
    return connection.cursor()  # Parse, Bind, Execute


@pytest.mark.parametrize("protocol", ["simple", "extended"])
@pytest.mark.parametrize("statement", ["insert", "query"])
def test_statement_timeout_ends_a_long_front(connect: Connect, protocol: str,
                                             statement: str) -> None:  # fmt: skip
    connection = connect(autocommit=True)
    connection.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
    connection.execute("SET statement_timeout = '400ms'")
    sql = _insert() if statement == "insert" else _query()
    started = time.monotonic()
    with pytest.raises(errors.QueryCanceled, match="statement timeout"):
        _cursor(connection, protocol).execute(sql)
    assert time.monotonic() - started < BOUND_S
    connection.execute("RESET statement_timeout")
    assert connection.execute("SELECT count(*) FROM t").fetchone() == (0,)
    connection.execute("INSERT INTO t VALUES (1, 'one')")
    assert connection.execute("SELECT count(*) FROM t").fetchone() == (1,)


def test_a_cancel_request_ends_a_long_front(connect: Connect) -> None:
    """A CancelRequest once the engine works on the text (the wire's reading and rewriting
    of the message come first, ~0.2-2 s here: a cancel in them is dropped by
    ``Session.execute_statement``'s reset of the flag, as before this round)."""
    connection = connect(autocommit=True)
    connection.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
    sql = _insert()
    # cancel_safe: the blocking cancel() holds the GIL, and the server runs in this process
    timer = threading.Timer(CANCEL_AFTER_S, connection.cancel_safe)
    started = time.monotonic()
    timer.start()
    try:
        with pytest.raises(errors.QueryCanceled):
            connection.execute(sql)
    finally:
        timer.cancel()
    assert time.monotonic() - started < CANCEL_AFTER_S + BOUND_S
    assert connection.execute("SELECT count(*) FROM t").fetchone() == (0,)
