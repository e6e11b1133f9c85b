"""An autocommit ``INSERT INTO TOPIC ... VALUES`` of plain rows goes from its checked plan
straight to ``spread_append.append_plain`` (``Session._append_plain_now``): no autocommit
transaction around it, the door (``Session._guard``: the sandbox and privilege checks, or a
kept plan's kept decision of both) on every statement, the
same tags, stored messages and errors as the usual way; every other statement (options,
RETURNING, a block, values that are not bytes or text) goes the usual way."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from engine import session as session_module
from engine import spread_append
from engine.database import Database
from engine.session import Session
from engine.transaction import SessionState
from storage.errors import CharacterNotInRepertoireError, InvalidParameterValueError

INSERT = "INSERT INTO TOPIC t (data) VALUES ($1)"


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Autocommit transactions made, doors passed, ``append_plain`` calls."""
    counts = {"transactions": 0, "door": 0, "append_plain": 0}
    transaction = session_module.Transaction

    def made(*args: Any, **kwargs: Any) -> Any:
        counts["transactions"] += 1
        return transaction(*args, **kwargs)

    def spy(name: str, function: Any) -> Any:
        def counting(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return function(*args, **kwargs)
        return counting

    monkeypatch.setattr(session_module, "Transaction", made)
    # The door: its checks, or a kept plan's kept decision of both (``Session._guard``).
    monkeypatch.setattr(Session, "_guard", spy("door", Session._guard))
    monkeypatch.setattr(spread_append, "append_plain",
                        spy("append_plain", spread_append.append_plain))  # fmt: skip
    return counts


def _stored(session: Session) -> list[bytes]:
    table = session.execute("SELECT data FROM TOPIC t")[-1].table
    return [row["data"] for row in table.to_pylist()]


def test_a_plain_autocommit_insert_makes_no_transaction_and_is_checked_each_time(
    database: Database, session: Session, counted: dict[str, int]
) -> None:
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 1)")
    before = dict(counted)
    for value in (b"a", "b", b"c"):
        assert session.execute(INSERT, [value])[-1].tag == "INSERT 0 1"
    two = session.execute("INSERT INTO TOPIC t (data) VALUES ($1), ('lit')", [b"d"])
    assert two[-1].tag == "INSERT 0 2"
    assert counted["transactions"] == before["transactions"]  # none around the appends
    assert counted["door"] - before["door"] == 4  # the door, every statement
    assert counted["append_plain"] - before["append_plain"] == 4
    assert session.state is SessionState.IDLE and session.transaction is None
    assert _stored(session) == [b"a", b"b", b"c", b"d", b"lit"]


@pytest.mark.parametrize("text, values", [
    ("INSERT INTO TOPIC t (data) VALUES ($1) WITH (producer_id = 'p')", [b"x"]),
    ("INSERT INTO TOPIC t (data) VALUES ($1) RETURNING offset", [b"x"]),
    ("INSERT INTO TOPIC t (data, producer_id) VALUES ($1, 'p')", [b"x"]),
    ("INSERT INTO TOPIC t (data) VALUES ($1)", [7]),  # not bytes or text
])  # fmt: skip
def test_other_inserts_go_the_usual_way(
    database: Database, session: Session, counted: dict[str, int], text: str,
    values: list[Any],
) -> None:  # fmt: skip
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 1)")
    before = counted["transactions"]
    with contextlib.suppress(InvalidParameterValueError):  # an integer's data: its error
        session.execute(text, values)
    assert counted["transactions"] == before + 1
    assert session.state is SessionState.IDLE


def test_an_insert_in_a_block_goes_the_usual_way(
    database: Database, session: Session, counted: dict[str, int]
) -> None:
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 1)")
    session.execute("BEGIN")
    calls = counted["append_plain"]
    assert session.execute(INSERT, [b"staged"])[-1].tag == "INSERT 0 1"
    assert counted["append_plain"] == calls  # staged, not appended
    session.execute("COMMIT")
    assert _stored(session) == [b"staged"]


def test_a_failing_plain_insert_leaves_the_session_idle_and_writes_nothing(
    database: Database, session: Session, counted: dict[str, int]
) -> None:
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 1)")
    with pytest.raises(CharacterNotInRepertoireError):
        session.execute(INSERT, ["lone \ud800 surrogate"])
    assert session.state is SessionState.IDLE and session.transaction is None
    with pytest.raises(InvalidParameterValueError):
        session.execute("INSERT INTO TOPIC t (data) VALUES ($1), ($2)", [b"ok", None])
    assert session.state is SessionState.IDLE
    assert session.execute(INSERT, [b"after"])[-1].tag == "INSERT 0 1"
    assert _stored(session) == [b"after"]
