"""Round 23 (H3): SQL-level PREPARE is bounded per session.

``PREPARE name AS ...`` was kept by DuckDB on the session's connection; nothing bounded
how many, or how much text, one session kept, and every session shares the server's
process (measured on main: 100 PREPAREs of 1 MiB over the wire grew the server by
711 MiB). Past the wire's bounds on named statements (``limits``), a PREPARE is refused
with 54000, the session goes on, and DEALLOCATE makes room again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from storage import limits
from storage.errors import DuplicatePreparedStatementError, LimitExceededError
from tests.security.conftest import WireServer


@pytest.fixture
def alice(tmp_path: Path) -> Iterator[Session]:
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    session = database.connect(Identity("alice", superuser=False))
    yield session
    session.close()
    database.close()


def held(session: Session) -> int:
    """The session's SQL-level statements (kept as text: DuckDB holds none of them, asked
    of the connection itself; the session's own listing shows the kept ones)."""
    result = session.cursor.execute("SELECT count(*) FROM duckdb_prepared_statements() "
                                    "WHERE NOT starts_with(name, '__topicbase')").fetchone()
    assert result == (0,)
    return len(session.sql_statements)


def test_prepared_statements_are_counted(alice: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "SQL_PREPARED_STATEMENTS_PER_SESSION_MAX", 3)
    for index in range(3):
        alice.execute(f"PREPARE p{index} AS SELECT {index} + ?")
    with pytest.raises(DuplicatePreparedStatementError):  # 42P05, not a replacement
        alice.execute("PREPARE p1 AS SELECT 10 + ?")
    with pytest.raises(LimitExceededError, match="too many prepared statements") as caught:
        alice.execute("PREPARE p3 AS SELECT 3")
    assert caught.value.sqlstate == "54000"
    assert held(alice) == 3
    assert alice.execute("EXECUTE p1(5)")[-1].table.to_pylist() == [{"(1 + $1)": 6}]
    alice.execute("DEALLOCATE p0")
    alice.execute("PREPARE p3 AS SELECT 3")
    assert held(alice) == 3


def test_few_are_kept_by_default(alice: Session) -> None:
    """DuckDB keeps each one's folded constants (R2 F1): the count is small, not 10,000."""
    count = limits.SQL_PREPARED_STATEMENTS_PER_SESSION_MAX
    for index in range(count):
        alice.execute(f"PREPARE p{index} AS SELECT {index}")
    with pytest.raises(LimitExceededError, match=f"limit {count}"):
        alice.execute(f"PREPARE p{count} AS SELECT 0")
    assert held(alice) == count <= 16


def test_prepared_text_is_bounded(alice: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "PREPARED_TEXT_CHARS_PER_CONNECTION_MAX", 4096)
    text = "x" * 1500
    alice.execute(f"PREPARE a AS SELECT '{text}'")
    alice.execute(f"PREPARE b AS SELECT '{text}'")
    with pytest.raises(LimitExceededError, match="characters of text") as caught:
        alice.execute(f"PREPARE c AS SELECT '{text}'")
    assert caught.value.sqlstate == "54000"
    with pytest.raises(DuplicatePreparedStatementError):  # a kept name: not replaced
        alice.execute(f"PREPARE b AS SELECT '{text}' || 'y'")
    alice.execute("DEALLOCATE a")
    alice.execute(f"PREPARE c AS SELECT '{text}'")
    assert held(alice) == 2


def test_refused_inside_a_transaction_fails_it_and_nothing_is_kept(
    alice: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "SQL_PREPARED_STATEMENTS_PER_SESSION_MAX", 1)
    alice.execute("PREPARE first AS SELECT 1")
    alice.execute("BEGIN")
    with pytest.raises(LimitExceededError):
        alice.execute("PREPARE more AS SELECT 2")
    alice.execute("ROLLBACK")
    assert held(alice) == 1


def test_over_the_wire_a_prepare_flood_is_54000_and_the_connection_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logging.getLogger("sqlglot").setLevel(logging.CRITICAL)
    monkeypatch.setattr(limits, "PREPARED_TEXT_CHARS_PER_CONNECTION_MAX", 4 << 20)
    server = WireServer(tmp_path)
    try:
        connection = server.login()
        big = "x" * (1 << 20)
        for index in range(3):
            connection.execute(f"PREPARE p{index} AS SELECT '{big}' || $1")
        with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="characters of text"):
            connection.execute(f"PREPARE p3 AS SELECT '{big}' || $1")
        assert connection.execute("EXECUTE p0('y')").fetchone()[0] == big + "y"
        connection.execute("DEALLOCATE p0")  # SQL-level names: the engine's, freed there
        connection.execute(f"PREPARE p3 AS SELECT '{big}' || $1")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            connection.execute("DEALLOCATE p0")  # gone
        for clean in ("DEALLOCATE ALL", "DISCARD ALL"):  # a pooler's reset frees them too
            connection.execute(clean)
            for index in range(3):
                connection.execute(f"PREPARE p{index} AS SELECT '{big}' || $1")
        assert connection.execute("EXECUTE p2('z')").fetchone()[0] == big + "z"
    finally:
        server.stop()
