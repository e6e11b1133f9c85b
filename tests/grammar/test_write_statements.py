"""``COMMIT WRITES`` and ``ABORT WRITES``: parsed by the Lark grammar, planned by
``planner.write_statements``; ``COMMIT`` and ``ABORT`` alone stay transaction control."""

from __future__ import annotations

import pytest

from grammar import ast
from grammar.parse import parse_one
from planner.catalog import TopicInfo
from planner.planner import plan
from planner.write_statements import AbortStagedWrites, CommitStagedWrites
from storage.errors import NumericValueOutOfRangeError, SqlSyntaxError


def test_commit_writes_reads_ids_sink_and_batch() -> None:
    statement = parse_one("commit Writes ('a-1', 'it''s') SINK 'job.7' batch 42")
    assert statement == ast.CommitWrites(("a-1", "it's"), "job.7", 42,
                                         statement.position, statement.text)  # fmt: skip
    assert parse_one("COMMIT WRITES () SINK 's' BATCH 0").write_ids == ()


def test_abort_writes_and_the_plain_transaction_words() -> None:
    assert parse_one("ABORT WRITES ('a', 'b')").write_ids == ("a", "b")
    assert isinstance(parse_one("ABORT"), ast.Rollback)
    assert isinstance(parse_one("COMMIT"), ast.Commit)
    assert isinstance(parse_one("COMMIT WORK"), ast.Commit)


@pytest.mark.parametrize("text", [
    "COMMIT WRITES ('a', 'a') SINK 's' BATCH 0",  # a repeated id
    "COMMIT WRITES ('a') SINK 's' BATCH -1",
    "COMMIT WRITES ('a') BATCH 1",
    "COMMIT WRITES ('a') SINK s BATCH 1",  # the sink is a string
    "COMMIT WRITES (a) SINK 's' BATCH 1",
    'COMMIT WRITES ("a") SINK \'s\' BATCH 1',  # ids are string literals
    "ABORT WRITES",
    "EXPLAIN COMMIT WRITES () SINK 's' BATCH 0",
    "EXPLAIN ABORT WRITES ('a')",
])
def test_malformed_statements_are_42601(text: str) -> None:
    with pytest.raises(SqlSyntaxError):
        parse_one(text)


def test_a_batch_beyond_bigint_is_22003() -> None:
    with pytest.raises(NumericValueOutOfRangeError):
        parse_one(f"COMMIT WRITES () SINK 's' BATCH {2**63}")


class _NoTopics:
    def topic(self, name: str) -> TopicInfo | None:
        return None

    def topic_names(self) -> list[str]:
        return []


def test_the_plans_carry_the_statement() -> None:
    committed = plan(parse_one("COMMIT WRITES ('a', 'b') SINK 's' BATCH 3"), _NoTopics())
    assert committed.tag == "COMMIT WRITES"
    assert committed.operations == (CommitStagedWrites(("a", "b"), "s", 3),)
    aborted = plan(parse_one("ABORT WRITES ('a')"), _NoTopics())
    assert aborted.operations == (AbortStagedWrites(("a",)),)
