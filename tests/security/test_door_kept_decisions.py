"""The door's shortcuts for a plan the session keeps (``Session._guard`` with ``door_memo``,
round 18): a kept decision lets the plan through without either check, and each shortcut
ends exactly when its answer could change.

- **Topic reads and writes are kept too** (``privileges._decided_by_cache``): an autocommit
  ``INSERT INTO TOPIC`` or consume is checked once, then again after a REVOKE or GRANT
  (the privilege cache's generation) or a topic dropped and made again under its name
  (the catalog's count of topics created and dropped), both parts of the stamp.
- **A kept decision stands for the sandbox too**: the memo is filled only after the
  sandbox let the plan through for the same identity object, so a statement the sandbox
  refuses is refused every time, and a new identity (SET ROLE) is checked again.
- **Both checks judge the settled identity**: a SET ROLE undone by a ROLLBACK is undone
  before the sandbox judges the next statement (it used to judge the identity the
  rolled-back transaction left, a superuser's).
- Inside an explicit transaction nothing is kept (review R3-17-1): a REVOKE committed
  between two transactions refuses the second's statement.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import privileges, sandbox
from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from planner.operations import AppendRecords, Plan, ReadRecords
from storage.errors import InsufficientPrivilegeError

ALICE = Identity("alice", superuser=False)
PRODUCE = "INSERT INTO TOPIC events (data) VALUES ('m')"
CONSUME = "SELECT data FROM TOPIC src WITH (consumer = 'c', max_messages = 1)"


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    opened = Database.open(str(tmp_path / "data"))
    yield opened
    opened.close()


@pytest.fixture
def root(database: Database) -> Iterator[Session]:
    session = database.connect()
    session.execute("CREATE TOPIC events")
    session.execute("CREATE TOPIC src (CONSUMER c)")
    session.execute("INSERT INTO TOPIC src (data) VALUES ('a'), ('b'), ('c'), ('d'), ('e')")
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    session.execute("INSERT INTO kv VALUES (1, 'one')")
    for grant in ("GRANT INSERT ON TOPIC events TO alice", "GRANT SELECT ON TOPIC src TO alice",
                  "GRANT SELECT ON kv TO alice"):  # fmt: skip
        session.execute(grant)
    yield session
    session.close()


@pytest.fixture
def alice(root: Session, database: Database) -> Iterator[Session]:
    session = database.connect(ALICE)
    yield session
    session.close()


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """One entry per full privilege check of a plan that touches a topic (not answered by
    the memo): ``"write"`` or ``"read"``."""
    made: list[str] = []
    original = privileges._check_operations

    def spying(plan: Plan, identity: Identity, session: Any) -> None:
        kinds = {type(operation) for operation in plan.operations}
        if AppendRecords in kinds:
            made.append("write")
        elif ReadRecords in kinds:
            made.append("read")
        original(plan, identity, session)

    monkeypatch.setattr(privileges, "_check_operations", spying)
    return made


@pytest.fixture
def sandbox_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The identity of every sandbox check ``Session._guard`` made of a plan that reads
    ``kv`` or calls ``getenv`` (not of the statements around them)."""
    made: list[str] = []
    original = sandbox.check_plan

    def spying(plan: Plan, identity: Identity) -> None:
        if any(word in getattr(o, "sql", "") for o in plan.operations
               for word in ("kv", "getenv")):  # fmt: skip
            made.append(identity.name)
        original(plan, identity)

    monkeypatch.setattr(sandbox, "check_plan", spying)
    return made


def _refused(session: Session, sql: str) -> bool:
    try:
        session.execute(sql)
    except InsufficientPrivilegeError:
        return True
    return False


def test_an_autocommit_topic_insert_is_checked_once_until_a_revoke(
    root: Session, alice: Session, checks: list[str]
) -> None:
    for _ in range(4):
        assert not _refused(alice, PRODUCE)
    assert checks == ["write"]  # the decision on the kept plan is kept
    root.execute("REVOKE INSERT ON TOPIC events FROM alice")
    assert _refused(alice, PRODUCE)  # the very next run
    assert _refused(alice, PRODUCE)  # a refusal is never kept
    root.execute("GRANT INSERT ON TOPIC events TO alice")
    assert not _refused(alice, PRODUCE)
    assert checks == ["write"] * 4


def test_a_grant_to_public_revoked_reaches_the_next_run(
    root: Session, alice: Session
) -> None:
    root.execute("REVOKE INSERT ON TOPIC events FROM alice")
    root.execute("GRANT INSERT ON TOPIC events TO PUBLIC")
    assert not _refused(alice, PRODUCE) and not _refused(alice, PRODUCE)
    root.execute("REVOKE INSERT ON TOPIC events FROM PUBLIC")
    assert _refused(alice, PRODUCE)


def test_a_topic_made_again_under_its_name_is_checked_again(
    root: Session, alice: Session
) -> None:
    """The same plan object (a lookup or a literal's plan outlives topic DDL): the catalog's
    count of topics created and dropped is part of the stamp."""
    (statement,) = _parsed(PRODUCE)
    plan = alice._kept_plans.plan(statement, alice.database, alice._has_duckdb_relation)
    alice._guard(plan, kept=True)
    alice._guard(plan, kept=True)
    root.execute("DROP TOPIC events")
    root.execute("CREATE TOPIC events")  # owned by the superuser, never granted to alice
    with pytest.raises(InsufficientPrivilegeError):
        alice._guard(plan, kept=True)


def test_an_autocommit_consume_is_checked_once_until_a_revoke(
    root: Session, alice: Session, checks: list[str]
) -> None:
    for expected in ("a", "b", "c"):
        assert alice.execute(CONSUME)[-1].table.to_pylist() == [{"data": expected.encode()}]
    assert checks == ["read"]
    root.execute("REVOKE SELECT ON TOPIC src FROM alice")
    assert _refused(alice, CONSUME)
    root.execute("GRANT SELECT ON TOPIC src TO alice")
    assert alice.execute(CONSUME)[-1].table.to_pylist() == [{"data": b"d"}]


def test_a_revoke_between_two_transactions_refuses_the_second(
    root: Session, alice: Session, checks: list[str]
) -> None:
    """Inside BEGIN … COMMIT the memo is neither used nor filled: each transaction's
    statement is checked on its own snapshot."""
    for _ in range(2):
        alice.execute("BEGIN")
        alice.execute(PRODUCE)
        alice.execute("COMMIT")
    assert checks == ["write", "write"]
    root.execute("REVOKE INSERT ON TOPIC events FROM alice")
    alice.execute("BEGIN")
    assert _refused(alice, PRODUCE)
    alice.execute("ROLLBACK")
    root.execute("GRANT INSERT ON TOPIC events TO alice")
    alice.execute(PRODUCE)  # kept now, in autocommit
    alice.execute("BEGIN")
    root.execute("REVOKE INSERT ON TOPIC events FROM alice")
    assert _refused(alice, PRODUCE)  # begun before its first read: the REVOKE counts
    alice.execute("ROLLBACK")


def test_a_kept_decision_stands_for_the_sandbox_only_once_it_let_the_plan_through(
    alice: Session, sandbox_checks: list[str]
) -> None:
    """``getenv`` is the sandbox's to refuse (the privileges find no relation in it): were
    the memo filled before the sandbox judged, the second run would skip it."""
    for _ in range(3):
        with pytest.raises(InsufficientPrivilegeError, match="getenv"):
            alice.execute("SELECT getenv('HOME') AS home")
    assert sandbox_checks == ["alice"] * 3
    sandbox_checks.clear()
    for _ in range(3):
        alice.execute("SELECT v FROM kv WHERE v <> 'x'")
    assert sandbox_checks == ["alice"]  # then kept for both checks


def test_a_new_identity_is_judged_by_both_checks_again(
    root: Session, sandbox_checks: list[str]
) -> None:
    for _ in range(2):
        root.execute("SET ROLE alice")
        root.execute("SELECT v FROM kv WHERE v <> 'x'")
    assert sandbox_checks == ["alice", "alice"]  # each SET ROLE makes a new identity
    root.execute("SET ROLE carol")  # no grant
    with pytest.raises(InsufficientPrivilegeError):
        root.execute("SELECT v FROM kv WHERE v <> 'x'")
    root.execute("RESET ROLE")


def test_a_search_path_set_after_a_kept_decision_sends_the_next_run_the_full_way(
    root: Session, alice: Session
) -> None:
    root.execute("CREATE SCHEMA s")
    root.execute("CREATE TABLE s.kv (k BIGINT, v VARCHAR)")  # never granted to alice
    for _ in range(2):
        alice.execute("SELECT v FROM kv WHERE v <> 'x'")
    alice.execute("SET search_path = 's'")  # kv may now be s.kv: every candidate checked
    assert _refused(alice, "SELECT v FROM kv WHERE v <> 'x'")
    alice.execute("SET search_path = 'main'")
    alice.execute("SELECT v FROM kv WHERE v <> 'x'")


def test_the_sandbox_judges_the_role_a_rollback_restored(root: Session) -> None:
    """A superuser's session acting as alice ends a transaction that reset the role with
    ROLLBACK: the next statement is alice's, for the sandbox too (CHECKPOINT is for
    superusers)."""
    root.execute("SET ROLE alice")
    root.execute("BEGIN")
    root.execute("RESET ROLE")
    root.execute("ROLLBACK")
    with pytest.raises(InsufficientPrivilegeError, match="CHECKPOINT needs a superuser"):
        root.execute("CHECKPOINT")
    assert root.identity.name == "alice"
    root.execute("RESET ROLE")
    root.execute("CHECKPOINT")


def _parsed(sql: str) -> list[Any]:
    from engine.session import _parse_cached

    return list(_parse_cached(sql))
