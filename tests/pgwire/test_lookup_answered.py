"""A prepared primary-key lookup over the wire answered by ``Session.answer_lookup`` (its
plan kept, docs/statement_cost.md round 9): a REVOKE takes effect on the next execution
even with the index built again meanwhile, a write is seen by the next lookup, a
transaction reads its own write, and with a ``statement_timeout`` the ordinary way runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engine.session import Session
from sql.pgwire.server import ServerThread
from tests.key_lookup_spy import served_lookups
from tests.pgwire.scram_users import login, scram_server

LOOKUP = "SELECT v FROM kv WHERE k = %s"


@pytest.fixture
def wire(tmp_path: Path) -> Iterator[ServerThread]:
    """A server where ``alice`` is a superuser and ``bob`` an ordinary user."""
    with scram_server(tmp_path) as server:
        yield server


@pytest.fixture
def answered(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The user of every statement ``Session.answer_lookup`` answered (indexes built after
    one lookup: ``served_lookups``)."""
    served_lookups(monkeypatch)
    users_answered: list[str] = []
    original = Session.answer_lookup

    def spying(self: Session, statement: Any, parameters: Any = None) -> Any:
        result = original(self, statement, parameters)
        if result is not None:
            users_answered.append(self.identity.name)
        return result

    monkeypatch.setattr(Session, "answer_lookup", spying)
    return users_answered


def _lookup(conn: psycopg.Connection, key: int) -> Any:
    row = conn.execute(LOOKUP, [key], prepare=True).fetchone()
    return None if row is None else row[0]


def _table(admin: psycopg.Connection) -> None:
    admin.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    admin.execute("INSERT INTO kv SELECT i, 'value ' || i FROM range(1000) t(i)")


def test_a_revoke_takes_effect_on_the_next_execution_with_the_index_built_again(
    wire: ServerThread, answered: list[str]
) -> None:
    with login(wire, "alice") as admin, login(wire, "bob") as bob:
        _table(admin)
        admin.execute("GRANT SELECT ON kv TO bob")
        for key in range(5):
            assert _lookup(bob, key) == f"value {key}"
        assert answered.count("bob") >= 3
        admin.execute("REVOKE SELECT ON kv FROM bob")
        for key in range(3):  # admin's lookups build the index again
            assert _lookup(admin, key) == f"value {key}"
        assert answered[-1] == "alice"
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            _lookup(bob, 7)
        admin.execute("GRANT SELECT ON kv TO bob")
        for key in range(3):
            assert _lookup(bob, key) == f"value {key}"
        assert answered[-1] == "bob"


def test_a_write_is_seen_by_the_next_lookup_and_a_transaction_reads_its_own(
    wire: ServerThread, answered: list[str]
) -> None:
    with login(wire, "alice") as admin, login(wire, "alice") as other:
        _table(admin)
        for _ in range(3):
            assert _lookup(admin, 7) == "value 7"
        assert answered
        other.execute("UPDATE kv SET v = 'new' WHERE k = 7")
        assert _lookup(admin, 7) == "new"
        other.execute("DELETE FROM kv WHERE k = 7")
        assert _lookup(admin, 7) is None
        other.execute("INSERT INTO kv VALUES (7, 'again')")
        assert _lookup(admin, 7) == "again"
        for _ in range(3):
            assert _lookup(admin, 7) == "again"
        count = len(answered)
        admin.autocommit = False
        admin.execute("UPDATE kv SET v = 'mine' WHERE k = 7")
        assert _lookup(admin, 7) == "mine"  # its own write, read in its transaction
        assert _lookup(other, 7) == "again"
        admin.commit()
        assert _lookup(other, 7) == "mine"
        assert _lookup(other, 7) == "mine"
        assert len(answered) > count  # the kept way again once the index was built


def test_a_statement_timeout_takes_the_ordinary_way(
    wire: ServerThread, answered: list[str]
) -> None:
    with login(wire, "alice") as admin:
        _table(admin)
        for _ in range(3):
            assert _lookup(admin, 7) == "value 7"
        assert answered
        answered.clear()
        admin.execute("SET statement_timeout = '10s'")
        for _ in range(3):
            assert _lookup(admin, 7) == "value 7"
        assert answered == []
