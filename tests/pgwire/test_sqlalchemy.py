"""SQLAlchemy 2 (``postgresql+psycopg``) against the real server: the dialect's start-up
queries, Core insert/select, transactions, reflection, topics through ``text()``."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import exc

from sql.pgwire.server import ServerThread


@pytest.fixture
def engine(server: ServerThread) -> Iterator[sa.Engine]:
    created = sa.create_engine(
        f"postgresql+psycopg://tester@127.0.0.1:{server.port}/topicbase",
        connect_args={"connect_timeout": 10},
    )
    yield created
    created.dispose()


@pytest.fixture
def autocommit(engine: sa.Engine) -> Iterator[sa.Connection]:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        yield connection


def test_dialect_starts_up(engine: sa.Engine) -> None:
    with engine.connect() as connection:
        assert connection.dialect.server_version_info == (15, 0)
        assert connection.dialect.default_schema_name == "main"
        assert connection.dialect.default_isolation_level == "REPEATABLE READ"
        version = connection.exec_driver_sql("select pg_catalog.version()").scalar_one()
        assert version.startswith("PostgreSQL 15.0 (Topicbase ")


def test_core_insert_select_and_transactions(engine: sa.Engine) -> None:
    metadata = sa.MetaData()
    people = sa.Table(
        "people", metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(40), nullable=False),
        sa.Column("score", sa.Numeric(6, 2)),
    )  # fmt: skip
    metadata.create_all(engine)
    with engine.begin() as connection:
        connection.execute(people.insert(), [{"id": 1, "name": "ann", "score": 1.5},
                                             {"id": 2, "name": "bob", "score": None}])  # fmt: skip
    with engine.connect() as connection:
        connection.execute(people.insert(), {"id": 3, "name": "eve", "score": 9})
        connection.rollback()
        rows = connection.execute(sa.select(people.c.id, people.c.name)
                                  .where(people.c.id >= 1).order_by(people.c.id)).all()  # fmt: skip
        assert [tuple(row) for row in rows] == [(1, "ann"), (2, "bob")]
        connection.execute(people.update().where(people.c.id == 2).values(name="bo"))
        connection.commit()
        assert connection.execute(sa.select(people.c.name).where(people.c.id == 2)).scalar() == "bo"


def test_inspector_reflects_tables(engine: sa.Engine) -> None:
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner VARCHAR DEFAULT 'x' UNIQUE, "
            "balance DECIMAL(12, 2) NOT NULL, CHECK (balance >= 0))"
        )
        connection.exec_driver_sql(
            "CREATE TABLE transfers (account INTEGER REFERENCES accounts(id), note VARCHAR)"
        )
        connection.exec_driver_sql("CREATE INDEX transfers_note ON transfers(note)")
    inspector = sa.inspect(engine)
    assert sorted(inspector.get_table_names()) == ["accounts", "transfers"]  # any order, as PG
    assert inspector.has_table("accounts") and not inspector.has_table("missing")
    assert "__topicbase" not in inspector.get_schema_names()
    columns = inspector.get_columns("accounts")
    assert [(c["name"], str(c["type"]), c["nullable"], c["default"]) for c in columns] == [
        ("id", "INTEGER", False, None),
        ("owner", "TEXT", True, "'x'"),
        ("balance", "NUMERIC(12, 2)", False, None),
    ]
    assert inspector.get_pk_constraint("accounts")["constrained_columns"] == ["id"]
    assert [u["column_names"] for u in inspector.get_unique_constraints("accounts")] == [["owner"]]
    assert [c["sqltext"] for c in inspector.get_check_constraints("accounts")] == ["balance >= 0"]
    foreign = inspector.get_foreign_keys("transfers")
    assert [(f["constrained_columns"], f["referred_table"], f["referred_columns"])
            for f in foreign] == [(["account"], "accounts", ["id"])]  # fmt: skip
    indexes = inspector.get_indexes("transfers")
    assert [(i["name"], i["column_names"], i["unique"]) for i in indexes] == [
        ("transfers_note", ["note"], False)
    ]
    reflected = sa.Table("transfers", sa.MetaData(), autoload_with=engine)
    assert [c.name for c in reflected.columns] == ["account", "note"]


def test_topics_are_foreign_tables_and_read_through_text(
    engine: sa.Engine, autocommit: sa.Connection
) -> None:
    autocommit.exec_driver_sql("CREATE TOPIC events (CONSUMER reader)")
    autocommit.execute(sa.text("INSERT INTO TOPIC events (data) VALUES (:a), (:b)"),
                       {"a": "one", "b": "two"})  # fmt: skip
    inspector = sa.inspect(engine)
    assert inspector.get_foreign_table_names() == ["events"]
    assert "events" not in inspector.get_table_names()
    assert [c["name"] for c in inspector.get_columns("events")][:3] == [
        "partition",
        "offset",
        "seq_no",
    ]
    with engine.connect() as connection:
        peek = connection.execute(sa.text(
            'SELECT "offset", CAST(data AS VARCHAR) AS body FROM TOPIC events '
            "WITH (partition = 0, from_offset = 0)"
        )).all()  # fmt: skip
        assert [tuple(row) for row in peek] == [(0, "one"), (1, "two")]
        consumed = connection.execute(sa.text(
            "SELECT CAST(data AS VARCHAR) FROM TOPIC events WITH (consumer = 'reader')"
        )).scalars().all()  # fmt: skip
        connection.commit()
        assert consumed == ["one", "two"]
        again = connection.execute(sa.text(
            "SELECT data FROM TOPIC events WITH (consumer = 'reader')"
        )).all()  # fmt: skip
        assert again == []


def test_show_set_and_reset(autocommit: sa.Connection) -> None:
    show = autocommit.exec_driver_sql
    assert show("SHOW transaction isolation level").scalar() == "repeatable read"
    assert show("SHOW standard_conforming_strings").scalar() == "on"
    assert show("SHOW DateStyle").scalar() == "ISO, MDY"
    show("SET application_name TO 'reporting'")
    assert show("SHOW application_name").scalar() == "reporting"
    assert show("SELECT current_setting('application_name')").scalar() == "reporting"
    show("RESET application_name")
    assert show("SHOW application_name").scalar() == ""
    show("SET TIME ZONE 'UTC'")
    assert show("SHOW TimeZone").scalar() == "UTC"
    with pytest.raises(exc.DBAPIError) as refused:
        show("SET TIME ZONE 'Europe/Berlin'")
    assert refused.value.orig.sqlstate == "22023"
    with pytest.raises(exc.DBAPIError) as serializable:
        show("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE")
    assert serializable.value.orig.sqlstate == "0A000"
    with pytest.raises(exc.DBAPIError) as read_only:
        show("SET server_version = '16'")
    assert read_only.value.orig.sqlstate == "55P02"
    assert show("SELECT setting FROM pg_settings WHERE name = 'server_version_num'").scalar() \
        == "150000"  # fmt: skip


def test_savepoints_mark_nothing_and_rollback_to_is_refused(engine: sa.Engine) -> None:
    with engine.connect() as connection:
        connection.exec_driver_sql("CREATE TABLE kept (x INTEGER)")
        nested = connection.begin_nested()  # SAVEPOINT
        connection.exec_driver_sql("INSERT INTO kept VALUES (1)")
        nested.commit()  # RELEASE SAVEPOINT
        connection.commit()
        assert connection.exec_driver_sql("SELECT count(*) FROM kept").scalar() == 1
        connection.rollback()
        nested = connection.begin_nested()
        connection.exec_driver_sql("INSERT INTO kept VALUES (2)")
        with pytest.raises(exc.DBAPIError) as refused:
            nested.rollback()  # ROLLBACK TO SAVEPOINT: refused, DuckDB has no savepoints
        assert refused.value.orig.sqlstate == "0A000"
        connection.rollback()
        assert connection.exec_driver_sql("SELECT count(*) FROM kept").scalar() == 1


def test_release_of_an_unknown_savepoint_fails_the_transaction(server: ServerThread) -> None:
    with psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                         dbname="topicbase", connect_timeout=10) as connection:  # fmt: skip
        with pytest.raises(psycopg.errors.InvalidSavepointSpecification):
            connection.execute("RELEASE SAVEPOINT nowhere")
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            connection.execute("SELECT 1")
        connection.rollback()
        connection.autocommit = True
        with pytest.raises(psycopg.errors.NoActiveSqlTransaction):
            connection.execute("SAVEPOINT outside")
