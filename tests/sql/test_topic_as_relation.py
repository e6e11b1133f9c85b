"""A topic named as a plain relation (``FROM events``, ``FROM main.events``, ``FROM "events"``)
reads the topic as ``FROM TOPIC events`` without a consumer does (``planner/relations.py``).

The first part plans statements against a catalog of plain dicts (planning is pure); the
second runs them through the DB-API front over a real database on disk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import sql
from grammar.parse import parse_one
from planner import planner
from planner.catalog import SessionCatalog, TopicInfo
from planner.operations import AppendRecords, Plan, ReadRecords, RunQuery
from planner.relations import PLAIN_READ_OPTIONS
from sql import dbapi
from storage import limits
from storage.errors import FeatureNotSupportedError

# -- planning against a catalog of dicts ----------------------------------------------------


@dataclass
class DictCatalog:
    """Topics by name, and the DuckDB relations a session would see."""

    topics: dict[str, TopicInfo]
    duckdb_relations: set[str] = field(default_factory=set)
    asked: list[str] = field(default_factory=list)

    def topic(self, name: str) -> TopicInfo | None:
        return self.topics.get(name)

    def topic_names(self) -> list[str]:
        return sorted(self.topics)

    def has_duckdb_relation(self, name: str) -> bool:
        self.asked.append(name)
        return name.lower() in {r.lower() for r in self.duckdb_relations}

    def session(self) -> SessionCatalog:
        return SessionCatalog(self, self.has_duckdb_relation)


def topic(name: str, partitions: int = 2) -> TopicInfo:
    ids = tuple(range(partitions))
    return TopicInfo(name, f"id-{name}", {}, {"reader": {}}, ids, ids)


@pytest.fixture
def catalog() -> DictCatalog:
    return DictCatalog({"events": topic("events"), "Mixed": topic("Mixed", 1)})


def plan_of(text: str, catalog: DictCatalog) -> Plan:
    return planner.plan(parse_one(text), catalog.session())


def reads_of(plan: Plan) -> list[ReadRecords]:
    return [op for op in plan.operations if isinstance(op, ReadRecords)]


def query_of(plan: Plan) -> RunQuery:
    queries = [op for op in plan.operations if isinstance(op, RunQuery)]
    assert len(queries) == 1, plan.describe()
    return queries[0]


def test_plain_name_of_a_topic_plans_a_peek_of_every_partition(catalog: DictCatalog) -> None:
    plan = plan_of("SELECT count(*) FROM events", catalog)
    [read] = reads_of(plan)
    assert (read.topic, read.topic_id, read.partitions) == ("events", "id-events", (0, 1))
    assert read.consumer is None  # a peek: nothing is committed
    assert read.options == PLAIN_READ_OPTIONS
    assert read.options["max_messages"] == limits.READ_MESSAGES_MAX
    assert query_of(plan).sql == f"SELECT COUNT(*) FROM {read.placeholder} AS events"
    assert plan.tag == "SELECT"


@pytest.mark.parametrize(
    "text",
    [
        "SELECT data FROM main.events",
        'SELECT data FROM "events"',
        'SELECT data FROM "main"."events"',
        "SELECT data FROM EVENTS",
        "select data from Events e where e.seq_no > 1",
    ],
)
def test_schema_main_quoted_and_case_folded_names_read_the_topic(
    text: str, catalog: DictCatalog
) -> None:
    [read] = reads_of(plan_of(text, catalog))
    assert read.topic == "events"


def test_quoted_name_matches_exactly_and_unquoted_matches_as_written(
    catalog: DictCatalog,
) -> None:
    assert [r.topic for r in reads_of(plan_of('SELECT * FROM "Mixed"', catalog))] == ["Mixed"]
    assert [r.topic for r in reads_of(plan_of("SELECT * FROM Mixed", catalog))] == ["Mixed"]
    assert reads_of(plan_of('SELECT * FROM "EVENTS"', catalog)) == []
    assert reads_of(plan_of("SELECT * FROM mixed", catalog)) == []


def test_duckdb_table_of_the_same_name_wins_and_the_statement_is_untouched(
    catalog: DictCatalog,
) -> None:
    catalog.duckdb_relations.add("EVENTS")
    text = "SELECT count(*) FROM events WHERE seq_no > 1"
    plan = plan_of(text, catalog)
    assert reads_of(plan) == []
    assert query_of(plan).sql == text
    assert query_of(plan).tables_read == ("events",)


def test_duckdb_is_asked_only_about_names_that_name_a_topic(catalog: DictCatalog) -> None:
    plan_of("SELECT * FROM items JOIN other.events USING (id) JOIN events USING (id)", catalog)
    assert catalog.asked == ["events"]
    catalog.asked.clear()
    plan_of("SELECT * FROM items", catalog)
    plan_of("SELECT * FROM TOPIC events", catalog)
    assert catalog.asked == []


def test_a_cte_of_the_same_name_wins(catalog: DictCatalog) -> None:
    plan = plan_of("WITH events AS (SELECT 1 AS a) SELECT a FROM events", catalog)
    assert reads_of(plan) == []


def test_cte_over_a_topic_reads_it(catalog: DictCatalog) -> None:
    plan = plan_of("WITH recent AS (SELECT * FROM events WHERE seq_no > 1) "
                   "SELECT count(*) FROM recent", catalog)  # fmt: skip
    [read] = reads_of(plan)
    assert f"FROM {read.placeholder} AS events WHERE" in query_of(plan).sql


@pytest.mark.parametrize("text", ["SELECT * FROM other.events", "SELECT * FROM db.main.events"])
def test_names_in_other_schemas_or_catalogs_are_not_topics(text: str, catalog: DictCatalog) -> None:
    assert reads_of(plan_of(text, catalog)) == []


def test_a_topic_named_twice_is_read_once_under_each_alias(catalog: DictCatalog) -> None:
    plan = plan_of("SELECT a.data FROM events a JOIN events b ON a.\"offset\" = b.\"offset\"",
                   catalog)  # fmt: skip
    [read] = reads_of(plan)
    sql_text = query_of(plan).sql
    assert f"{read.placeholder} AS a" in sql_text and f"{read.placeholder} AS b" in sql_text


def test_spellings_of_one_topic_share_one_read(catalog: DictCatalog) -> None:
    plan = plan_of('SELECT * FROM events JOIN main."events" x USING (partition) JOIN EVENTS y '
                   "USING (partition)", catalog)  # fmt: skip
    [read] = reads_of(plan)
    assert query_of(plan).sql.count(read.placeholder) == 3


def test_topic_keyword_and_plain_names_get_distinct_placeholders(catalog: DictCatalog) -> None:
    plan = plan_of("SELECT * FROM TOPIC Mixed m JOIN main.events e ON m.data = main.events.data",
                   catalog)  # fmt: skip
    scanned, plain = reads_of(plan)
    assert (scanned.topic, plain.topic) == ("Mixed", "events")
    assert scanned.placeholder != plain.placeholder
    sql_text = query_of(plan).sql
    assert f"JOIN {plain.placeholder} AS e" in sql_text
    assert "main.events.data" not in sql_text and "events.data" in sql_text


def test_plain_catalog_without_duckdb_lookup_never_reads_topics_by_name(
    catalog: DictCatalog,
) -> None:
    plan = planner.plan(parse_one("SELECT * FROM events"), catalog)
    assert reads_of(plan) == []


def test_single_topic_column_pick_keeps_the_fast_projection(catalog: DictCatalog) -> None:
    plan = plan_of('SELECT "offset", data AS body FROM events', catalog)
    [read] = reads_of(plan)
    assert query_of(plan).projection == (read.placeholder, (("offset", "offset"), ("data", "body")))


@pytest.mark.parametrize("verb", ["DESCRIBE", "SUMMARIZE"])
def test_statement_operands_take_the_placeholder_without_an_alias(
    verb: str, catalog: DictCatalog
) -> None:
    plan = plan_of(f"{verb} events", catalog)
    [read] = reads_of(plan)
    assert query_of(plan).sql == f"{verb} {read.placeholder}"


def test_insert_into_a_plain_topic_name_plans_an_append(catalog: DictCatalog) -> None:
    plan = plan_of("INSERT INTO events (data, producer_id) VALUES ('a', 'p'), ($1, 'p') "
                   "RETURNING partition, \"offset\"", catalog)  # fmt: skip
    query, append = plan.operations
    assert isinstance(query, RunQuery) and isinstance(append, AppendRecords)
    assert query.sql == "VALUES ('a', 'p'), ($1, 'p')"
    assert (append.topic, append.columns, append.rows) == ("events", ("data", "producer_id"), None)
    assert append.returning == ("partition", "offset")
    assert plan.tag == "INSERT"


def test_insert_without_columns_writes_data_and_a_select_reads_topics(
    catalog: DictCatalog,
) -> None:
    values = plan_of("INSERT INTO events VALUES ('x')", catalog)
    assert values.operations[-1].columns == ("data",)  # type: ignore[union-attr]
    copied = plan_of("INSERT INTO events SELECT data FROM Mixed", catalog)
    read, query, append = copied.operations
    assert isinstance(read, ReadRecords) and read.topic == "Mixed"
    assert isinstance(append, AppendRecords) and append.topic == "events"
    assert isinstance(query, RunQuery) and read.placeholder in query.sql


def test_insert_into_a_plain_topic_name_may_consume_another_topic(catalog: DictCatalog) -> None:
    plan = plan_of("INSERT INTO events (data) SELECT data FROM TOPIC Mixed "
                   "WITH (consumer = 'reader')", catalog)  # fmt: skip
    read, query, append = plan.operations
    assert isinstance(read, ReadRecords) and (read.topic, read.consumer) == ("Mixed", "reader")
    assert isinstance(query, RunQuery) and query.sql == f"SELECT data FROM {read.placeholder}"
    assert isinstance(append, AppendRecords) and append.topic == "events"


def test_insert_into_a_table_of_the_topics_name_stays_a_table_insert(
    catalog: DictCatalog,
) -> None:
    catalog.duckdb_relations.add("events")
    plan = plan_of("INSERT INTO events VALUES (1)", catalog)
    assert [type(op) for op in plan.operations] == [RunQuery]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("UPDATE events SET data = 'x'", "append-only: UPDATE"),
        ("DELETE FROM main.events", "append-only: DELETE"),
        ("TRUNCATE events", "append-only: TRUNCATE"),
        ("CREATE VIEW v AS SELECT * FROM events", 'a view cannot read topic "events"'),
        ("INSERT INTO events (data) VALUES ('a') ON CONFLICT DO NOTHING", "ON CONFLICT"),
        ("INSERT OR REPLACE INTO events (data) VALUES ('a')", "OR REPLACE"),
        ("INSERT INTO events (data) VALUES ('a') RETURNING partition + 1", "RETURNING"),
    ],
)
def test_writes_a_topic_cannot_take_are_refused_with_0a000(
    text: str, message: str, catalog: DictCatalog
) -> None:
    with pytest.raises(FeatureNotSupportedError, match=message) as refused:
        plan_of(text, catalog)
    assert refused.value.sqlstate == "0A000"


# -- end to end through the DB-API front ----------------------------------------------------
Factory = Callable[..., dbapi.Connection]


@pytest.fixture
def connect(tmp_path: Path) -> Iterator[Factory]:
    opened: list[dbapi.Connection] = []

    def open_connection(autocommit: bool = True) -> dbapi.Connection:
        connection = sql.connect(str(tmp_path / "data"), autocommit=autocommit)
        opened.append(connection)
        return connection

    yield open_connection
    for connection in reversed(opened):
        connection.close()


@pytest.fixture
def db(connect: Factory) -> dbapi.Connection:
    """Topic ``events`` (2 partitions: producer p -> 2 messages, producer q -> 1), table
    ``producers``."""
    connection = connect()
    connection.execute("CREATE TOPIC events (CONSUMER reader) WITH (min_active_partitions = 2)")
    connection.execute(
        "INSERT INTO TOPIC events (data, producer_id, seq_no) "
        "VALUES ('a', 'p', 1), ('b', 'p', 2), ('c', 'q', 1)"
    )
    connection.execute("CREATE TABLE producers (id VARCHAR PRIMARY KEY, owner VARCHAR)")
    connection.execute("INSERT INTO producers VALUES ('p', 'ann'), ('q', 'bob')")
    return connection


def fetch(connection: dbapi.Connection, query: str, parameters: object = None) -> list[tuple]:
    return [tuple(row) for row in connection.execute(query, parameters).fetchall()]


def test_select_star_reads_every_retained_message_like_from_topic(db: dbapi.Connection) -> None:
    plain = fetch(db, 'SELECT * FROM events ORDER BY partition, "offset"')
    keyword = fetch(db, 'SELECT * FROM TOPIC events ORDER BY partition, "offset"')
    assert plain == keyword and len(plain) == 3
    columns = [d[0] for d in db.execute("SELECT * FROM events").description]
    assert columns == ["partition", "offset", "seq_no", "producer_id", "message_group_id",
                       "created_at", "written_at", "codec", "data", "metadata"]  # fmt: skip


def test_count_where_order_by_and_limit(db: dbapi.Connection) -> None:
    assert fetch(db, "SELECT count(*) FROM events") == [(3,)]
    assert fetch(db, "SELECT count(*) FROM main.events WHERE producer_id = ?", ["p"]) == [(2,)]
    bodies = fetch(db, 'SELECT CAST(data AS VARCHAR) FROM "events" ORDER BY data DESC LIMIT 2')
    assert bodies == [("c",), ("b",)]


def test_join_with_a_table_subquery_and_cte(db: dbapi.Connection) -> None:
    joined = fetch(db, "SELECT p.owner, count(*) FROM events e JOIN producers p "
                       "ON p.id = e.producer_id GROUP BY p.owner ORDER BY 1")  # fmt: skip
    assert joined == [("ann", 2), ("bob", 1)]
    nested = fetch(db, "SELECT owner FROM producers WHERE id IN "
                       "(SELECT producer_id FROM events WHERE seq_no = 2)")  # fmt: skip
    assert nested == [("ann",)]
    cte = fetch(db, "WITH firsts AS (SELECT * FROM events WHERE seq_no = 1) "
                    "SELECT CAST(data AS VARCHAR) FROM firsts ORDER BY 1")  # fmt: skip
    assert cte == [("a",), ("c",)]
    self_join = fetch(db, "SELECT count(*) FROM events x JOIN events y ON "
                          'x.producer_id = y.producer_id AND x."offset" < y."offset"')  # fmt: skip
    assert self_join == [(1,)]


def test_plain_read_commits_no_offsets(db: dbapi.Connection) -> None:
    assert fetch(db, "SELECT count(*) FROM events") == [(3,)]
    consumed = fetch(db, "SELECT CAST(data AS VARCHAR) FROM TOPIC events "
                         "WITH (consumer = 'reader') ORDER BY 1")  # fmt: skip
    assert consumed == [("a",), ("b",), ("c",)]
    assert fetch(db, "SELECT count(*) FROM events") == [(3,)]  # still the whole topic
    assert fetch(db, "SELECT count(*) FROM TOPIC events WITH (consumer = 'reader')") == [(0,)]


def test_a_table_of_the_same_name_wins_until_it_is_dropped(db: dbapi.Connection) -> None:
    db.execute("CREATE TABLE events (n INTEGER)")
    db.execute("INSERT INTO events VALUES (41), (42)")  # the table, not the topic
    assert fetch(db, "SELECT sum(n) FROM events") == [(83,)]
    assert fetch(db, "SELECT count(*) FROM TOPIC events") == [(3,)]  # the topic is untouched
    db.execute("DROP TABLE events")
    assert fetch(db, "SELECT count(*) FROM events") == [(3,)]


def test_duckdb_catalog_views_win_over_a_topic_of_the_same_name(db: dbapi.Connection) -> None:
    db.execute("CREATE TOPIC pg_class")
    columns = [d[0] for d in db.execute("SELECT * FROM pg_class LIMIT 0").description]
    assert "relname" in columns and "data" not in columns
    assert fetch(db, "SELECT count(*) FROM TOPIC pg_class") == [(0,)]


def test_a_table_created_in_an_open_transaction_wins_in_that_transaction(
    db: dbapi.Connection, connect: Factory
) -> None:
    writer = connect(autocommit=False)
    writer.execute("CREATE TABLE events (n INTEGER)")
    assert fetch(writer, "SELECT count(*) FROM events") == [(0,)]
    assert fetch(db, "SELECT count(*) FROM events") == [(3,)]  # others still see the topic
    writer.rollback()
    assert fetch(writer, "SELECT count(*) FROM events") == [(3,)]


def test_describe_of_a_topic_name_lists_the_topic_columns(db: dbapi.Connection) -> None:
    described = fetch(db, "DESCRIBE events")
    assert [row[0] for row in described][:3] == ["partition", "offset", "seq_no"]


def test_create_table_as_select_copies_the_topic(db: dbapi.Connection) -> None:
    db.execute("CREATE TABLE snapshot AS SELECT producer_id, data FROM events")
    assert fetch(db, "SELECT count(*) FROM snapshot") == [(3,)]


def test_unknown_name_fails_as_before_with_42p01(db: dbapi.Connection) -> None:
    with pytest.raises(sql.ProgrammingError) as failed:
        db.execute("SELECT * FROM no_such_thing")
    assert failed.value.sqlstate == "42P01"
    assert "no_such_thing" in str(failed.value)


def test_insert_into_a_plain_topic_name_appends_to_the_topic(db: dbapi.Connection) -> None:
    cursor = db.execute(
        "INSERT INTO events (data, producer_id, seq_no) VALUES (?, 'r', 1), ('e', 'r', 2) "
        'RETURNING partition, "offset", status',
        ["d"],
    )
    returned = [tuple(row) for row in cursor.fetchall()]
    assert [status for _, _, status in returned] == ["written", "written"]
    assert cursor.rowcount == 2
    resent = fetch(db, "INSERT INTO events (data, producer_id, seq_no) VALUES ('d', 'r', 1) "
                       "RETURNING status")  # fmt: skip
    assert resent == [("duplicate",)]
    with pytest.raises(sql.DataError, match='needs a "data" column'):  # names, as INSERT INTO TOPIC
        db.execute("INSERT INTO events SELECT owner FROM producers WHERE id = 'q'")
    db.execute("INSERT INTO events SELECT owner AS data FROM producers WHERE id = 'q'")
    bodies = fetch(db, "SELECT CAST(data AS VARCHAR) FROM TOPIC events "
                       "WHERE producer_id = 'r' OR producer_id IS NULL ORDER BY 1")  # fmt: skip
    assert bodies == [("bob",), ("d",), ("e",)]


def test_insert_into_a_plain_topic_name_in_a_transaction_publishes_at_commit(
    db: dbapi.Connection, connect: Factory
) -> None:
    writer = connect(autocommit=False)
    writer.execute("INSERT INTO events (data) VALUES ('staged')")
    assert fetch(db, "SELECT count(*) FROM events") == [(3,)]
    writer.commit()
    assert fetch(db, "SELECT count(*) FROM events") == [(4,)]


def test_update_of_a_topic_name_is_refused_and_changes_nothing(db: dbapi.Connection) -> None:
    with pytest.raises(sql.NotSupportedError) as refused:
        db.execute("UPDATE events SET data = 'x'")
    assert refused.value.sqlstate == "0A000"
    assert fetch(db, "SELECT count(*) FROM events WHERE data = 'x'") == [(0,)]


def test_a_topic_larger_than_one_read_is_refused_not_cut_short(
    db: dbapi.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain relation is read whole or not at all: count(*) never undercounts."""
    from planner import relations

    small = {**relations.PLAIN_READ_OPTIONS, "max_messages": 2}
    monkeypatch.setattr(relations, "PLAIN_READ_OPTIONS", small)
    with pytest.raises(dbapi.Error) as raised:
        fetch(db, "SELECT count(*) AS whole_or_nothing FROM events")
    assert raised.value.sqlstate == "54000"
    assert "FROM TOPIC" in str(raised.value)
    # Explicit ranges stay cut at their max_messages, as asked.
    assert len(fetch(db, "SELECT * FROM TOPIC events WITH (max_messages = 2)")) == 2
    monkeypatch.setattr(relations, "PLAIN_READ_OPTIONS", {**small, "max_messages": 3})
    assert fetch(db, "SELECT count(*) AS exactly_enough FROM events") == [(3,)]
