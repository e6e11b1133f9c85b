"""A statement over DuckDB's memory limit fails alone, with 53200, and the session and
database carry on: one user's query cannot take the memory of all."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.database import Database
from storage.errors import OutOfMemoryError


def test_a_query_over_the_memory_limit_is_53200_and_nothing_else_breaks(tmp_path: Path) -> None:
    database = Database.open(str(tmp_path / "data"), memory_limit_bytes=64 << 20)
    session, other = database.connect(), database.connect()
    try:
        other.execute("CREATE TABLE t (v INTEGER); INSERT INTO t VALUES (1)")
        with pytest.raises(OutOfMemoryError) as error:
            session.execute("SELECT list(range) FROM range(50000000)")  # a list cannot spill
        assert error.value.sqlstate == "53200" and "SET threads" not in error.value.message
        assert session.execute("SELECT count(*) AS n FROM t")[0].table.to_pylist() == [{"n": 1}]
        assert other.execute("SELECT v FROM t")[0].table.to_pylist() == [{"v": 1}]
        # a sort larger than the limit spills to <data>/tmp and finishes
        sorted_ = session.execute(
            "SELECT max(x) AS m FROM (SELECT range AS x FROM range(3000000) ORDER BY x DESC)"
        )[0].table
        assert sorted_.to_pylist() == [{"m": 2999999}]
    finally:
        session.close()
        other.close()
        database.close()
