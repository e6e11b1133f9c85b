"""The door's memo (``privileges.check_plan`` with a session's ``door_memo``): the privilege
decision on a plan a session keeps and checks again on every run (``Session.answer_lookup``)
is kept only while nothing it was made of can have changed, and every change that can alter
it takes effect at the very next check: a REVOKE or GRANT from another session (committed,
or still open), a DROP and CREATE of a table of the same name, a change of role (SET ROLE:
a new identity), a view's owner becoming an ordinary user in the users file (decisions
through a view are never kept), and a refusal is never kept."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine import privileges
from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from grammar.bounded_cache import BoundedCache
from grammar.parse import parse
from planner import planner
from planner.operations import Plan
from storage.errors import InsufficientPrivilegeError
from storage.limits import DOOR_DECISIONS_MAX
from tests.key_lookup_spy import served_lookups

ALICE = Identity("alice", superuser=False)
CAROL = Identity("carol", superuser=False)


@pytest.fixture
def root(session: Session) -> Session:
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    session.execute("INSERT INTO kv VALUES (1, 'one')")
    session.execute("GRANT SELECT ON kv TO alice")
    return session


@pytest.fixture
def alice(root: Session, database: Database) -> Iterator[Session]:
    connected = database.connect(ALICE)
    yield connected
    connected.close()


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The identity of every full check ``check_plan`` made (not answered by the memo) of
    a plan of a lookup of ``kv`` or ``kv_view`` (not of the statements the tests run)."""
    made: list[str] = []
    original = privileges._check_operations

    def spying(plan: Plan, identity: Identity, session: Any) -> None:
        if any("WHERE k =" in getattr(o, "sql", "") for o in plan.operations):
            made.append(identity.name)
        original(plan, identity, session)

    monkeypatch.setattr(privileges, "_check_operations", spying)
    return made


def _plan(session: Session, sql: str) -> Plan:
    (statement,) = parse(sql)
    return planner.plan(statement, session.planning_catalog)


def _memo() -> BoundedCache:
    return BoundedCache("tests.door_memo", DOOR_DECISIONS_MAX)


def _allowed(session: Session, plan: Plan, memo: BoundedCache) -> bool:
    try:
        privileges.check_plan(plan, session.identity, session, memo=memo)
    except InsufficientPrivilegeError:
        return False
    return True


def test_a_kept_plan_is_checked_once_while_nothing_changes(alice: Session, checks: list[str]
                                                           ) -> None:  # fmt: skip
    plan, memo = _plan(alice, "SELECT v FROM kv WHERE k = 1"), _memo()
    for _ in range(5):
        assert _allowed(alice, plan, memo)
    assert checks == ["alice"]
    other = _plan(alice, "SELECT v FROM kv WHERE k = 1")  # the same text, another plan
    assert _allowed(alice, other, memo)
    assert checks == ["alice", "alice"]  # a plan is kept by its object, not its text
    for _ in range(3):
        assert _allowed(alice, other, None)  # no memo: checked every time
    assert checks == ["alice"] * 5


def test_a_revoke_and_a_grant_from_another_session_take_effect_at_the_next_check(
    root: Session, alice: Session, checks: list[str]
) -> None:
    plan, memo = _plan(alice, "SELECT v FROM kv WHERE k = 1"), _memo()
    assert _allowed(alice, plan, memo) and _allowed(alice, plan, memo)
    root.execute("REVOKE SELECT ON kv FROM alice")
    assert not _allowed(alice, plan, memo)
    assert not _allowed(alice, plan, memo)  # a refusal is not kept: checked again
    root.execute("GRANT SELECT ON kv TO alice")
    assert _allowed(alice, plan, memo)
    # A REVOKE still open in another transaction: nothing is kept meanwhile, and its
    # COMMIT is seen at the next check.
    root.execute("BEGIN")
    root.execute("REVOKE SELECT ON kv FROM alice")
    before = len(checks)
    assert _allowed(alice, plan, memo) and _allowed(alice, plan, memo)  # not committed
    assert len(checks) == before + 2
    root.execute("COMMIT")
    assert not _allowed(alice, plan, memo)


def test_a_table_dropped_and_created_again_under_its_name_is_checked_again(
    root: Session, alice: Session
) -> None:
    plan, memo = _plan(alice, "SELECT v FROM kv WHERE k = 1"), _memo()
    assert _allowed(alice, plan, memo) and _allowed(alice, plan, memo)
    root.execute("DROP TABLE kv")
    root.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")  # no grant on it
    assert not _allowed(alice, plan, memo)


def test_a_new_identity_is_checked_again(root: Session, database: Database,
                                         checks: list[str]) -> None:  # fmt: skip
    plan, memo = _plan(root, "SELECT v FROM kv WHERE k = 1"), _memo()
    root.execute("SET ROLE alice")  # a superuser may become anyone
    assert root.identity == ALICE
    assert _allowed(root, plan, memo) and _allowed(root, plan, memo)
    assert checks == ["alice"]
    root.execute("SET ROLE carol")  # no grant
    assert not _allowed(root, plan, memo)
    root.execute("SET ROLE alice")
    assert _allowed(root, plan, memo)
    # An equal identity that is another object (a session of its own) is checked too.
    carol_named_alice = database.connect(Identity("alice", superuser=False))
    try:
        assert _allowed(carol_named_alice, plan, memo)
    finally:
        carol_named_alice.close()
    assert checks == ["alice", "carol", "alice", "alice"]


def test_a_decision_through_a_view_is_never_kept(root: Session, alice: Session,
                                                 database: Database, checks: list[str]
                                                 ) -> None:  # fmt: skip
    superusers = {"vic"}
    privileges.use_role_lookup(database, lambda name: name in superusers)
    root.execute("SET ROLE vic")
    root.execute("CREATE VIEW kv_view AS SELECT k, v FROM kv")  # owned by vic
    root.execute("GRANT SELECT ON kv_view TO alice")
    root.execute("RESET ROLE")
    plan, memo = _plan(alice, "SELECT v FROM kv_view WHERE k = 1"), _memo()
    assert _allowed(alice, plan, memo) and _allowed(alice, plan, memo)
    assert len(checks) == 2  # the view's owner is asked of the users file every time
    superusers.clear()  # vic is an ordinary user now, without SELECT on kv
    assert not _allowed(alice, plan, memo)


def test_the_memo_is_bounded(alice: Session) -> None:
    memo = _memo()
    plans = [_plan(alice, f"SELECT v FROM kv WHERE k = {i}") for i in range(3 * DOOR_DECISIONS_MAX)]
    for plan in plans:
        assert _allowed(alice, plan, memo)
    assert len(memo._entries) == DOOR_DECISIONS_MAX
    assert len(alice.door_memo._entries) == 0  # only kept plans fill a session's memo


def test_answer_lookup_keeps_its_decision_and_a_revoke_reaches_the_next_call(
    root: Session, alice: Session, checks: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    served_lookups(monkeypatch)  # indexes built at the first lookup
    (statement,) = parse("SELECT v FROM kv WHERE k = $1")
    root.execute_statement(statement, [1])  # builds kv's index
    for _ in range(3):
        answered = alice.answer_lookup(statement, [1])  # from the index
        assert answered is not None and answered.table.to_pylist() == [{"v": "one"}]
    assert checks == ["alice"]  # kept after the first
    assert len(alice.door_memo._entries) == 1
    root.execute("REVOKE SELECT ON kv FROM alice")
    root.execute_statement(statement, [1])  # the index built again after the REVOKE
    assert root.answer_lookup(statement, [1]) is not None
    assert alice.answer_lookup(statement, [1]) is None  # refused: left to the ordinary way
    with pytest.raises(InsufficientPrivilegeError):
        alice.execute_statement(statement, [1])


def test_a_session_whose_names_stop_resolving_plainly_is_checked_again(
    root: Session, alice: Session, checks: list[str]
) -> None:
    root.execute("CREATE SCHEMA s")
    root.execute("CREATE TABLE s.kv (k BIGINT PRIMARY KEY, v VARCHAR)")  # no grant on it
    plan, memo = _plan(alice, "SELECT v FROM kv WHERE k = 1"), _memo()
    assert _allowed(alice, plan, memo) and _allowed(alice, plan, memo)
    assert checks == ["alice"]
    alice.execute("SET search_path = 's'")  # kv may now be s.kv: both are checked
    assert not _allowed(alice, plan, memo)
    assert not _allowed(alice, plan, memo)
    alice.execute("SET search_path = 'main'")
    assert _allowed(alice, plan, memo)


def test_a_statement_run_again_the_ordinary_way_keeps_its_decision_until_a_revoke(
    root: Session, alice: Session, checks: list[str]
) -> None:
    """A plan the session keeps for a repeated text (``engine.kept_plans``, round 17) is
    the same object on every run, so its decision is kept as a lookup's is; a REVOKE from
    another session, and a new role, are checked at the very next run."""
    (statement,) = parse("SELECT v FROM kv WHERE k = 1")
    for _ in range(3):
        assert alice.execute_statement(statement).table.to_pylist() == [{"v": "one"}]
    assert checks == ["alice"]  # kept after the first
    root.execute("REVOKE SELECT ON kv FROM alice")
    with pytest.raises(InsufficientPrivilegeError):
        alice.execute_statement(statement)
    root.execute("GRANT SELECT ON kv TO alice")
    assert alice.execute_statement(statement).table.to_pylist() == [{"v": "one"}]
    root.execute("SET ROLE alice")  # a superuser may become anyone
    assert root.execute_statement(statement).table.to_pylist() == [{"v": "one"}]
    root.execute("SET ROLE carol")  # a new identity, without the grant
    with pytest.raises(InsufficientPrivilegeError):
        root.execute_statement(statement)
    root.execute("RESET ROLE")
    assert checks == ["alice", "alice", "alice", "alice", "carol"]  # each change checked


def test_a_kept_literal_select_keeps_its_decision(
    alice: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []
    original = privileges._check_operations

    def spying(plan: Plan, identity: Identity, session: Any) -> None:
        made.append(identity.name)
        original(plan, identity, session)

    (statement,) = parse("SELECT 42 AS answer")
    for _ in range(3):  # run the ordinary way until its row is kept
        alice.execute_statement(statement)
    monkeypatch.setattr(privileges, "_check_operations", spying)
    for _ in range(3):
        kept = alice.answer_literal(statement)
        assert kept is not None and kept.table.to_pylist() == [{"answer": 42}]
    assert made == ["alice"]


@pytest.mark.parametrize("change", ["revoke", "drop and create"])
def test_a_decision_made_inside_a_transaction_is_not_kept_past_its_commit(
    root: Session, alice: Session, change: str
) -> None:
    """Inside an explicit transaction the check reads the transaction's snapshot, which
    allows a plan after another session's REVOKE (or a table of the name dropped and made
    again) committed: that decision must not be kept for the runs after the COMMIT
    (review R3 round 17, R3-17-1: they read on)."""
    (statement,) = parse("SELECT v FROM kv WHERE v <> 'x'")
    alice.execute("BEGIN")
    assert alice.execute_statement(statement).table.to_pylist() == [{"v": "one"}]
    if change == "revoke":
        root.execute("REVOKE SELECT ON kv FROM alice")
    else:
        root.execute("DROP TABLE kv")
        root.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
        root.execute("INSERT INTO kv VALUES (2, 'never granted')")
    alice.execute_statement(statement)  # the transaction's snapshot: allowed, by design
    alice.execute("COMMIT")
    for _ in range(3):
        with pytest.raises(InsufficientPrivilegeError):
            alice.execute_statement(statement)


def test_names_read_inside_a_transaction_are_not_kept_past_its_commit(
    root: Session, alice: Session
) -> None:
    """A session whose names do not resolve plainly (a search_path) keeps what a name may
    resolve to (``privileges._names_fact``); read inside a transaction, on a snapshot
    older than a table another session created meanwhile, it must not be kept for the
    statements after the COMMIT (review R4 round 17, R4-17-1: ``kv`` then resolved to the
    new, ungranted ``s.kv`` unchecked)."""
    root.execute("CREATE SCHEMA s")
    alice.execute("SET search_path = 's,main'")
    assert alice.execute("SELECT v FROM kv")[-1].table.to_pylist() == [{"v": "one"}]
    alice.execute("BEGIN")
    alice.execute("SELECT v FROM kv")
    root.execute("CREATE TABLE s.kv (k BIGINT, v VARCHAR)")  # never granted to alice
    root.execute("INSERT INTO s.kv VALUES (1, 'secret')")
    alice.execute("SELECT v FROM kv WHERE k = 1")  # its own snapshot: main.kv
    alice.execute("COMMIT")
    for text in ("SELECT v FROM kv", "SELECT v FROM kv WHERE k = 1"):
        with pytest.raises(InsufficientPrivilegeError):
            alice.execute(text)
