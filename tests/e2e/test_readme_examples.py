"""Every ```sql block of README.md runs, in order, against a fresh data directory."""

from __future__ import annotations

import re
from pathlib import Path

from engine.database import Database

README = Path(__file__).resolve().parents[2] / "README.md"


def sql_blocks() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_sql_examples() -> None:
    assert len(sql_blocks()) >= 5


def test_every_readme_sql_example_runs(tmp_path) -> None:
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    try:
        results = []
        for block in sql_blocks():
            results += session.execute(block)
        tags = [r.tag for r in results]
        assert tags[0] == "CREATE TOPIC" and tags[-1] == "DROP TOPIC"
        duplicate = next(r for r in results if r.table is not None and "status" in r.columns)
        assert duplicate.table.column("status").to_pylist() == ["duplicate"]
        clicks = session.execute("SELECT * FROM clicks_per_user ORDER BY 1")[0].table
        assert clicks.to_pylist() == [{"user_id": "ann", "n": 2}, {"user_id": "bob", "n": 1}]
    finally:
        session.close()
        database.close()
