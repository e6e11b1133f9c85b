"""What a move transaction no longer builds per transaction (docs/move_profile.md, round
24): the commit record's JSON encoder (``engine.commit.RECORD_JSON``) and the schema of a
read of stored columns (``engine.reads._columns_schema``) are made once and reused; the
record's bytes and the read's table are what they were."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from engine import reads
from engine.database import Database
from engine.topic_relation import SCHEMA
from storage import commit_log

LARGE = 200  # messages per INSERT: one frame, over ``SMALL_SLICE_ROWS`` (a stored-column read)
MOVE = (
    "INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a "
    "WITH (consumer = 'c', member = 'w1', max_messages = 50)"
)


@pytest.fixture
def database(tmp_path: Path):
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    session.execute(
        "CREATE TOPIC a (CONSUMER c) WITH (min_active_partitions = 1); "
        "CREATE TOPIC b WITH (min_active_partitions = 1)"
    )
    for frame in range(2):
        values = ", ".join(f"('m{frame}-{i}')" for i in range(LARGE))
        session.execute(f"INSERT INTO TOPIC a (data) VALUES {values}")
    session.close()
    yield database
    database.close()


def _moves(database: Database, count: int) -> list[bytes]:
    """``count`` move transactions of one session; the messages moved, in order."""
    session = database.connect()
    moved = []
    try:
        for _ in range(count):
            session.execute("BEGIN")
            session.execute(MOVE)
            session.execute("COMMIT")
        table = session.execute("SELECT data FROM TOPIC b")[-1].table
        assert table is not None
        moved = table.column("data").to_pylist()
    finally:
        session.close()
    return moved


def test_the_commit_record_is_encoded_without_a_new_json_encoder(
    database: Database, monkeypatch: pytest.MonkeyPatch
):
    made = []
    original = json.JSONEncoder.__init__

    def counting(self, *args, **kwargs):
        made.append(kwargs)
        original(self, *args, **kwargs)

    monkeypatch.setattr(json.JSONEncoder, "__init__", counting)
    moved = _moves(database, 4)
    assert moved == [f"m0-{i}".encode() for i in range(LARGE)]
    assert made == []  # four commit records, no encoder built for any of them


def test_the_commit_records_are_the_compact_json_of_their_payload(database: Database):
    _moves(database, 3)
    staging = database.committer.staging
    found = [r for n in staging.file_numbers() for r in commit_log.scan(staging.read_file(n))]
    assert len(found) == 3
    for record in found:
        payload = json.loads(record.payload)
        assert record.payload == json.dumps(payload, separators=(",", ":")).encode()
        assert payload["items"] == [] and len(payload["moved"]) == 1
        assert payload["offsets"][0][1:3] == ["c", 0]
    assert [json.loads(r.payload)["offsets"][0][3] for r in found] == [50, 100, 150]


def test_a_read_of_stored_columns_builds_its_schema_once(
    database: Database, monkeypatch: pytest.MonkeyPatch
):
    reads._columns_schema.cache_clear()
    expected = pa.schema([SCHEMA.field("data")])  # the relation's field, as it was built
    built = []
    original = pa.schema

    def counting(fields, *args, **kwargs):
        built.append([f.name for f in fields])
        return original(fields, *args, **kwargs)

    monkeypatch.setattr(pa, "schema", counting)
    session = database.connect()
    try:
        got = []
        for _ in range(4):  # four polls of 100: each a stored-column read of one frame
            table = session.execute(
                "SELECT data FROM TOPIC a WITH (consumer = 'c', max_messages = 100)"
            )[-1].table
            assert table is not None
            assert table.schema == expected
            got += table.column("data").to_pylist()
    finally:
        session.close()
    assert got == [f"m{f}-{i}".encode() for f in range(2) for i in range(LARGE)]
    assert built == [["data"]]  # once, for four reads
    assert reads._columns_schema(("data",)) is reads._columns_schema(("data",))
    two = reads._columns_schema(("data", "created_at"))
    assert two.names == ["data", "created_at"]
    assert two.field("created_at") == SCHEMA.field("created_at")
