"""Database and Session keep the protocols the lower modules know them by
(``engine.protocols``): introspection, offset resets and bulk statements would otherwise
fail only at the call that reads a member that is gone."""

from __future__ import annotations

import pyarrow as pa

from engine import bulk, result
from engine import session as session_module
from engine.database import Database
from engine.protocols import StatementRunner, TopicSource
from engine.session import Session


def test_database_is_a_topic_source_and_session_a_statement_runner(
    database: Database, session: Session
) -> None:
    assert isinstance(database, TopicSource)
    assert isinstance(session, StatementRunner)
    assert not isinstance(object(), TopicSource)
    assert not isinstance(database, StatementRunner)


def test_one_result_type_for_the_session_and_bulk_statements(session: Session) -> None:
    assert session_module.Result is result.Result
    session.execute("CREATE TABLE t (a INTEGER)")
    outcome = bulk.run_over_relation(session, pa.table({"a": [1, 2]}),
                                     ["INSERT INTO t SELECT a FROM {relation}"])  # fmt: skip
    assert isinstance(outcome[0], result.Result)
    assert outcome[0].rowcount == 2
