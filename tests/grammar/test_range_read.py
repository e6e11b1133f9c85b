"""grammar.range_read: the exact shape of a topic range read, and nothing else."""

from __future__ import annotations

import pytest

from grammar.parse import parse_one
from grammar.range_read import RangeRead, match_range_read

SHAPE = 'SELECT {columns} FROM TOPIC t WHERE {where}'
WHERE = 'partition = 2 AND "offset" >= 5 AND "offset" < 10'


@pytest.mark.parametrize(("columns", "where", "expected"), [
    ("*", WHERE, ()),
    ('data, "offset"', WHERE, ("data", "offset")),
    ('written_at, partition, "offset"', WHERE, ("written_at", "partition", "offset")),
    ("data", '"offset" < 10 AND partition = 2 AND "offset" >= 5', ("data",)),
    ("data", "partition = 2 AND offset >= 5 AND offset < 10", ("data",)),  # unquoted offset
    ('"data", "partition"', '"partition" = 2 AND "offset" >= 5 AND "offset" < 10',
     ("data", "partition")),  # everything quoted (the JVM reader's spelling)
])  # fmt: skip
def test_the_shape_is_recognised(columns: str, where: str, expected: tuple[str, ...]) -> None:
    statement = parse_one(SHAPE.format(columns=columns, where=where))
    assert match_range_read(statement) == RangeRead("t", expected, 2, 5, 10)


@pytest.mark.parametrize("text", [
    f"SELECT data AS d FROM TOPIC t WHERE {WHERE}",
    f"SELECT DISTINCT data FROM TOPIC t WHERE {WHERE}",
    f"SELECT t.data FROM TOPIC t WHERE {WHERE}",
    f"SELECT data, data FROM TOPIC t WHERE {WHERE}",
    f"SELECT data || 'x' FROM TOPIC t WHERE {WHERE}",
    f"SELECT *, data FROM TOPIC t WHERE {WHERE}",
    f"SELECT data FROM TOPIC t AS x WHERE {WHERE}",
    f"SELECT data FROM TOPIC t WITH (partition = 2) WHERE {WHERE}",
    f"SELECT data FROM TOPIC t, TOPIC u WHERE {WHERE}",
    f"SELECT data FROM TOPIC t JOIN x USING (partition) WHERE {WHERE}",
    f"SELECT data FROM TOPIC t WHERE {WHERE} ORDER BY \"offset\"",
    f"SELECT data FROM TOPIC t WHERE {WHERE} LIMIT 3",
    f"SELECT count(*) FROM TOPIC t WHERE {WHERE}",
    f"WITH c AS (SELECT 1) SELECT data FROM TOPIC t WHERE {WHERE}",
    f"SELECT data FROM TOPIC t WHERE {WHERE} UNION ALL SELECT data FROM TOPIC t WHERE {WHERE}",
    f"SELECT data FROM TOPIC t WHERE {WHERE} AND true",
    "SELECT data FROM TOPIC t WHERE partition = 2 AND \"offset\" >= 5",
    "SELECT data FROM TOPIC t WHERE partition = 2 OR \"offset\" >= 5 AND \"offset\" < 10",
    "SELECT data FROM TOPIC t WHERE partition = 2 AND \"offset\" > 5 AND \"offset\" < 10",
    "SELECT data FROM TOPIC t WHERE partition = 2 AND \"offset\" >= 5 AND \"offset\" <= 10",
    "SELECT data FROM TOPIC t WHERE partition = -2 AND \"offset\" >= 5 AND \"offset\" < 10",
    "SELECT data FROM TOPIC t WHERE partition = '2' AND \"offset\" >= 5 AND \"offset\" < 10",
    "SELECT data FROM TOPIC t WHERE partition = 2 AND \"offset\" >= 5.0 AND \"offset\" < 10",
    "SELECT data FROM TOPIC t WHERE 2 = partition AND \"offset\" >= 5 AND \"offset\" < 10",
    "SELECT data FROM TOPIC t WHERE partition = 2 AND t.\"offset\" >= 5 AND \"offset\" < 10",
    "SELECT data FROM t WHERE partition = 2 AND \"offset\" >= 5 AND \"offset\" < 10",
])  # fmt: skip
def test_anything_else_is_not_a_range_read(text: str) -> None:
    assert match_range_read(parse_one(text)) is None
