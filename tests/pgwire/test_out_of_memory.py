"""Round 24 (H1): a ``MemoryError`` in a wire statement (an allocation refused under
``topicbase serve``'s process memory cap, ``sql.pgwire.memory_cap``) is 53200, not an
internal error: the connection goes on, its transaction rolls back whole, other
connections and the server are unaffected."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from engine.session import Session

MARK = "oom_probe"


@pytest.fixture
def failing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A statement whose text names ``MARK`` fails with ``MemoryError`` inside the engine's
    statement (at its checks, ``Session._guard``, after it began), whether it runs whole
    (``execute_statement``) or streamed (``open_stream``: a SELECT's rows)."""
    armed = threading.local()
    for name in ("execute_statement", "open_stream"):
        run = getattr(Session, name)

        def marked(self: Session, statement: Any, *args: Any, _run: Any = run,
                   **kwargs: Any) -> Any:  # fmt: skip
            armed.on = MARK in statement.text
            try:
                return _run(self, statement, *args, **kwargs)
            finally:
                armed.on = False

        monkeypatch.setattr(Session, name, marked)
    guard = Session._guard

    def refused(self: Session, *args: Any, **kwargs: Any) -> Any:
        if getattr(armed, "on", False):
            raise MemoryError("an allocation failed (injected)")
        return guard(self, *args, **kwargs)

    monkeypatch.setattr(Session, "_guard", refused)


@pytest.mark.usefixtures("failing")
@pytest.mark.parametrize("parameters", [None, [1]], ids=["simple", "extended"])
def test_a_memory_error_is_53200_and_the_connection_goes_on(
        connect: Callable[..., psycopg.Connection], parameters: list | None) -> None:  # fmt: skip
    first, other = connect(autocommit=True), connect(autocommit=True)
    sql = (f"SELECT count(*) AS {MARK} FROM range(3)" if parameters is None
           else f"SELECT count(*) + %s::INT AS {MARK} FROM range(3)")  # not a kept literal
    with pytest.raises(psycopg.Error) as caught:
        first.execute(sql, parameters)
    assert caught.value.sqlstate == "53200", caught.value
    assert "out of memory" in str(caught.value)
    assert first.execute("SELECT 42").fetchone() == (42,)
    assert other.execute("SELECT 7").fetchone() == (7,)


@pytest.mark.usefixtures("failing")
def test_a_memory_error_in_a_transaction_rolls_it_back_whole(
        connect: Callable[..., psycopg.Connection]) -> None:  # fmt: skip
    setup = connect(autocommit=True)
    setup.execute("CREATE TABLE kept (k INT)")
    setup.execute("CREATE TOPIC events")
    writer = connect(autocommit=True)
    writer.execute("BEGIN")
    writer.execute("INSERT INTO kept VALUES (1)")
    writer.execute("INSERT INTO TOPIC events (data) VALUES ('one')")
    with pytest.raises(psycopg.Error) as caught:
        writer.execute(f"SELECT count(*) AS {MARK} FROM range(3)")
    assert caught.value.sqlstate == "53200"
    with pytest.raises(psycopg.Error) as aborted:
        writer.execute("SELECT 1")
    assert aborted.value.sqlstate == "25P02"  # the transaction is aborted, as in PostgreSQL
    writer.execute("ROLLBACK")
    assert setup.execute("SELECT count(*) FROM kept").fetchone() == (0,)
    assert setup.execute("SELECT count(*) FROM TOPIC events").fetchone() == (0,)
    writer.execute("INSERT INTO kept VALUES (2)")  # the connection commits again
    assert setup.execute("SELECT k FROM kept").fetchall() == [(2,)]
