"""The sandbox reads DuckDB's tokens of a statement (``tables.sql_tokens``); DuckDB gives
their starts in bytes of the UTF-8 text. Cut from the ``str`` at those positions, every
token after a multi-byte character was shifted, and a refused call after one (``query``,
which runs SQL given as a string) went through. Each statement here is refused without
non-ASCII text; with it, it must be refused alike."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine import tables
from engine.database import Database
from engine.identity import LOCAL_SUPERUSER, Identity
from engine.session import Session
from storage.errors import InsufficientPrivilegeError

PREFIXES = ["", "'é' AS a, ", "'ü €€€€€€€€€€€€€€€€€€€€€€' AS a, ", "'😀😀' AS a, "]
REFUSED = [
    "SELECT {prefix}* FROM query('SELECT 42')",
    "SELECT {prefix}* FROM query_table('t')",
    "SELECT {prefix}* FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
    "SELECT {prefix}* FROM __topicbase.topics",
    "SELECT {prefix}* FROM duckdb_secrets()",
]


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """One database for the module: its tests only see statements refused, which change
    nothing; at the end its tables (the internal catalog's too) are what they were."""
    path = tmp_path_factory.mktemp("non_ascii") / "data"
    opened = Database.open(str(path), retention_interval_s=None)
    admin = opened.connect()
    admin.execute("CREATE TABLE t (a INT)")
    tables_at_start = _tables(admin)
    admin.close()
    yield opened
    admin = opened.connect()
    assert _tables(admin) == tables_at_start
    admin.close()
    opened.close()


def _tables(session: Session) -> list[dict]:
    result = session.execute("SELECT database_name, schema_name, table_name, estimated_size "
                             "FROM duckdb_tables() ORDER BY ALL")[-1]  # fmt: skip
    assert result.table is not None
    return result.table.to_pylist()


@pytest.fixture(params=["superuser", "alice"])
def session(request: pytest.FixtureRequest, database: Database) -> Iterator[Session]:
    identity = LOCAL_SUPERUSER if request.param == "superuser" else Identity("alice", False)
    opened = database.connect(identity)
    yield opened
    opened.close()


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("template", REFUSED)
def test_refused_after_non_ascii_text(session: Session, template: str, prefix: str) -> None:
    with pytest.raises(InsufficientPrivilegeError) as raised:
        session.execute(template.format(prefix=prefix))
    assert raised.value.sqlstate == "42501"


def test_token_texts_and_starts_are_characters_of_the_text() -> None:
    sql = "SELECT 'ü €', \"naïve\", abs(1) -- é\n, '😀' AS x"
    tokens = tables.sql_tokens(sql)
    assert [token.text for token in tokens] == [
        "SELECT", "'ü €'", ",", '"naïve"', ",", "abs", "(", "1", ")", ",", "'😀'", "AS", "x",
    ]  # fmt: skip
    assert all(sql[token.start:].startswith(token.text) for token in tokens)
