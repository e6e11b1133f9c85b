"""A topic of any size streams whole to a client: COPY TOPIC, COPY (SELECT … FROM TOPIC …)
and a simple-protocol query over a topic read DuckDB-side from a reader of the statement's
cut, never refused by the single-read limit and never cut short. What the engine must hold
whole (a Bind/Execute result) is still refused over it (54000), never truncated."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from sql.pgwire.server import ServerThread
from storage import limits

MESSAGES = 30_000
READ_LIMIT = 10_000


@pytest.fixture
def loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(limits, "READ_MESSAGES_MAX", READ_LIMIT)
    server = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0)
    client = psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                             autocommit=True, connect_timeout=10)  # fmt: skip
    client.execute("CREATE TOPIC big WITH (min_active_partitions = 3)")
    for start in range(0, MESSAGES, 5000):
        client.execute(
            f"INSERT INTO TOPIC big (data) SELECT 'm' || i FROM range({start}, {start + 5000}) t(i)"
        )
    yield client
    client.close()
    server.stop()


def _copy_lines(client: psycopg.Connection, sql: str) -> list[bytes]:
    out = bytearray()
    with client.cursor().copy(sql) as copy:
        for chunk in copy:
            out += chunk
    return bytes(out).splitlines()


def test_copy_topic_exports_every_message(loaded: psycopg.Connection) -> None:
    lines = _copy_lines(loaded, "COPY TOPIC big TO STDOUT")
    assert len(lines) == MESSAGES
    data = _copy_lines(loaded, "COPY (SELECT CAST(data AS VARCHAR) FROM TOPIC big) TO STDOUT")
    assert sorted(data) == sorted(f"m{i}".encode() for i in range(MESSAGES))


def test_simple_query_over_a_whole_topic_counts_everything(loaded: psycopg.Connection) -> None:
    assert loaded.execute("SELECT count(*) FROM TOPIC big").fetchone() == (MESSAGES,)
    assert loaded.execute("SELECT count(*) FROM big").fetchone() == (MESSAGES,)  # plain name
    rows = loaded.execute('SELECT partition, "offset" FROM TOPIC big').fetchall()
    assert len(set(rows)) == MESSAGES


def test_a_result_held_whole_is_refused_not_cut(loaded: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.ProgramLimitExceeded):
        loaded.execute("SELECT count(*) FROM TOPIC big WHERE length(data) > %s", (0,))
    assert loaded.execute("SELECT 1").fetchone() == (1,)
