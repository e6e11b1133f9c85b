"""The sandbox reads DuckDB's tokens of a statement (``tables.sql_tokens``); DuckDB gives
their starts in bytes of the UTF-8 text. Cut from the ``str`` at those positions, every
token after a multi-byte character was shifted, and a refused call after one (``query``,
which runs SQL given as a string) went through. Each statement here is refused without
non-ASCII text; with it, it must be refused alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    opened = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    admin = opened.connect()
    admin.execute("CREATE TABLE t (a INT)")
    admin.close()
    yield opened
    opened.close()


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
