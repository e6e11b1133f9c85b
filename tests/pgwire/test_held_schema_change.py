"""A COPY of a statement that may change the schema, held in a transaction of its own
(``copy_commit.open_held``), leaves no schema change under way once it committed and the
client went away (review R2-1: ``Session.transaction_control``'s COMMIT opened one that
nothing ended, and every session of the process lost the schema-generation caches)."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from engine import tables


@pytest.mark.parametrize("statement", ["VALUES (1)", "SUMMARIZE SELECT 1 AS a"])
def test_a_held_copy_leaves_no_schema_change_under_way(
    connect: Callable[..., psycopg.Connection], statement: str
) -> None:
    before = tables.SCHEMA_GENERATIONS._under_way
    db = connect(autocommit=True)
    with db.cursor() as cursor, cursor.copy(f"COPY ({statement}) TO STDOUT") as copy:
        rows = list(copy)
    assert rows
    db.close()
    assert tables.SCHEMA_GENERATIONS._under_way == before
    assert tables.SCHEMA_GENERATIONS.stable() is not None
