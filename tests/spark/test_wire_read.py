"""The catalog's JVM read of topics over the PostgreSQL wire (``spark.sql.catalog.<name>.wire``):
the Java client (SCRAM-SHA-256, COPY ... TO STDOUT (FORMAT arrow)) and the columnar scan.

Each test serves its database twice: the Flight door (the catalog's ``url``: tables,
writes, streams) and the PostgreSQL wire (``wire``: topic scans).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator

import pytest

from engine.database import Database
from spark_sql_ext import CATALOG_CLASS
from sql.pgwire.server import PgServer
from sql.pgwire.users import add_user, default_users_path
from tests.spark.conftest import PASSWORD, finish, sql_rows
from tests.tls_certificates import self_signed

_names = itertools.count(1)


class _Wire:
    """``topicbase serve``'s PostgreSQL wire over an open database, on a thread of its own."""

    def __init__(self, database: Database, port: int = 0, **options: object) -> None:
        self.server = PgServer(database, "127.0.0.1", port, "scram", **options)
        self.loop = asyncio.new_event_loop()
        self.port = self.loop.run_until_complete(self.server.start())
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture
def wire(database: Database) -> Iterator[_Wire]:
    server = _Wire(database)
    yield server
    server.stop()


def _catalog(spark, url: str, wire: _Wire, *, user: str = "sparky", password: str = PASSWORD,
             **extra: str) -> str:  # fmt: skip
    """A catalog of its own (Spark caches a catalog by name) reading topics over the wire."""
    name = f"tbw{next(_names)}"
    settings = {"": CATALOG_CLASS, ".url": url, ".user": user, ".password": password,
                ".wire": f"127.0.0.1:{wire.port}", **{f".{k}": v for k, v in extra.items()}}
    for key, value in settings.items():
        spark.conf.set(f"spark.sql.catalog.{name}{key}", value)
    return name


def _fill(database: Database, topic: str = "events") -> None:
    session = database.connect()
    session.execute(f"CREATE TOPIC {topic} WITH (min_active_partitions = 3)")
    values = ", ".join(f"('m{i}', {i % 3}, 'g{i % 2}')" for i in range(50))
    session.execute(f"INSERT INTO TOPIC {topic} (data, partition, message_group_id) "
                    f"VALUES {values}")  # fmt: skip
    session.execute(f"INSERT INTO TOPIC {topic} (data, partition, metadata) "
                    """VALUES ('x', 1, '{"k": "v"}')""")  # fmt: skip
    session.close()


def _key(row: dict) -> tuple:
    return row["partition"], row["offset"]


def _wire_scans(frame) -> bool:
    return "TopicbaseWireScan" in frame._jdf.queryExecution().executedPlan().toString()


def test_a_catalog_read_over_the_wire_equals_sql(spark, database, url, wire) -> None:
    _fill(database)
    tb = _catalog(spark, url, wire, splitRows="7")
    frame = spark.table(f"{tb}.main.events")
    assert _wire_scans(frame)
    expected = sorted(sql_rows(database, "SELECT * FROM TOPIC events"), key=_key)
    got = sorted((row.asDict() for row in frame.collect()), key=_key)
    assert len(got) == 51
    for row in got:  # Spark gives a map as a dict, timestamps naive in the session's UTC
        row["created_at"] = row["created_at"].replace(tzinfo=None)
        row["written_at"] = row["written_at"].replace(tzinfo=None)
        row["metadata"] = sorted(row["metadata"].items()) if row["metadata"] else None
    for row in expected:
        row["created_at"] = row["created_at"].replace(tzinfo=None)
        row["written_at"] = row["written_at"].replace(tzinfo=None)
        row["metadata"] = sorted(row["metadata"]) if row["metadata"] else None
    assert got == expected


def test_a_pruned_read_over_the_wire(spark, database, url, wire) -> None:
    _fill(database)
    tb = _catalog(spark, url, wire)
    frame = spark.sql(f"SELECT `offset`, CAST(data AS STRING) AS d FROM {tb}.main.events "
                      "WHERE partition = 1")  # fmt: skip
    assert "columns=partition,offset,data" in frame._jdf.queryExecution().executedPlan().toString()
    expected = sql_rows(database, "SELECT \"offset\", CAST(data AS VARCHAR) AS d FROM TOPIC "
                        "events WHERE partition = 1")  # fmt: skip
    assert sorted(tuple(r) for r in frame.collect()) == sorted(
        (r["offset"], r["d"]) for r in expected)
    counted = spark.sql(f"SELECT partition, count(*) AS n FROM {tb}.main.events GROUP BY partition")
    assert "columns=partition)" in counted._jdf.queryExecution().executedPlan().toString()
    assert sorted(tuple(r) for r in counted.collect()) == [(0, 17), (1, 18), (2, 16)]


def test_the_wire_scan_has_the_python_sources_schema(spark, database, url, wire) -> None:
    _fill(database)
    over_wire = spark.table(f"{_catalog(spark, url, wire)}.main.events").schema
    assert over_wire == spark.read.format("topicbase").option("url", url).option(
        "user", "sparky").option("password", PASSWORD).option("topic", "events").load().schema


def test_a_user_without_select_gets_42501(spark, database, url, wire) -> None:
    _fill(database)
    add_user(default_users_path(database.path), "reader", "reader-secret")
    tb = _catalog(spark, url, wire, user="reader", password="reader-secret")
    frame = spark.table(f"{tb}.main.events")
    assert _wire_scans(frame)
    with pytest.raises(Exception, match=r"permission denied for topic events.*SQLSTATE 42501"):
        frame.collect()


def test_a_wrong_password_fails_clearly(spark, database, url, wire) -> None:
    _fill(database)
    tb = _catalog(spark, url, wire, password="not-the-password")
    with pytest.raises(Exception, match=rf"cannot reach 127.0.0.1:{wire.port}: password "
                       r"authentication failed.*SQLSTATE 28P01"):  # fmt: skip
        spark.table(f"{tb}.main.events").collect()


HOUR_US = 3600 * 1_000_000


def test_a_range_cut_then_deleted_by_retention_fails_clearly(spark, tmp_path, url) -> None:
    from engine.clock import ManualClock

    clock = ManualClock(1_700_000_000_000_000)
    database = Database.open(str(tmp_path / "clocked"), clock=clock, retention_interval_s=None)
    add_user(default_users_path(database.path), "sparky", PASSWORD, superuser=True)
    server = _Wire(database)
    try:
        session = database.connect()
        session.execute("CREATE TOPIC aging WITH (retention_period = Interval('PT1H'))")
        for hour in range(4):
            session.execute(f"INSERT INTO TOPIC aging (data) VALUES ('h{hour}')")
            clock.advance(seconds=3600)
        session.close()
        tb = _catalog(spark, url, server)
        frame = spark.table(f"{tb}.main.aging")
        scan = frame._jdf.queryExecution().executedPlan().collectLeaves().head()
        assert scan.inputPartitions().size() == 1  # cut: [0, 4) of partition 0
        assert database.run_retention().segments_deleted > 0
        with pytest.raises(Exception, match=r"removed by retention.*SQLSTATE 22023"):
            frame.collect()
    finally:
        server.stop()
        database.close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (its own CA): (certificate, key)."""
    return self_signed(tmp_path_factory.mktemp("tls"))


def test_a_read_over_tls(spark, database, url, certificate, tmp_path) -> None:
    _fill(database)
    cert, key = certificate
    server = _Wire(database, tls_cert=cert, tls_key=key)
    try:
        tb = _catalog(spark, url, server, sslmode="verify-full", sslrootcert=cert)
        rows = spark.sql(f"SELECT partition, count(*) AS n FROM {tb}.main.events "
                         "GROUP BY partition").collect()  # fmt: skip
        assert sorted(tuple(r) for r in rows) == [(0, 17), (1, 18), (2, 16)]
        # a CA that did not sign the server's certificate
        other, _ = self_signed(tmp_path, common_name="other", alt_names=None)
        untrusted = _catalog(spark, url, server, sslmode="require", sslrootcert=other)
        with pytest.raises(Exception, match=r"PKIX path building failed"):
            spark.table(f"{untrusted}.main.events").collect()
    finally:
        server.stop()


def test_configure_sets_the_wire_address() -> None:
    import spark_sql_ext

    class Builder:
        def __init__(self) -> None:
            self.settings: dict[str, str] = {}

        def config(self, key: str, value: str) -> Builder:
            self.settings[key] = value
            return self

    built = spark_sql_ext.configure(Builder(), url="topicbase://h:1", user="u", password="p",
                                    wire_url="postgresql://h:5432", sslmode="require")  # fmt: skip
    assert built.settings["spark.sql.catalog.topicbase.wire"] == "h:5432"
    assert built.settings["spark.sql.catalog.topicbase.sslmode"] == "require"
    assert "spark.sql.catalog.topicbase.wire" not in spark_sql_ext.configure(
        Builder(), url="topicbase://h:1", user="u").settings
    with pytest.raises(ValueError, match="is not host:port"):
        spark_sql_ext.configure(Builder(), url="topicbase://h:1", user="u", wire_url="h")


def test_streams_of_a_wire_catalog_keep_the_python_source(
        spark, database, url, wire, tmp_path) -> None:  # fmt: skip
    """Streaming reads go through the Python source (batch writes: test_wire_write)."""
    _fill(database)
    tb = _catalog(spark, url, wire)
    spark.sql(f"INSERT INTO {tb}.main.events (data) VALUES (CAST('w1' AS BINARY)), "
              "(CAST('w2' AS BINARY))")  # fmt: skip
    assert sql_rows(database, "SELECT count(*) AS n FROM TOPIC events") == [{"n": 53}]

    out = str(tmp_path / "out")

    def drain() -> None:  # from the checkpoint's offsets (the first run: latest)
        stream = spark.readStream.table(f"{tb}.main.events")
        query = (stream.selectExpr("CAST(data AS STRING) AS d").writeStream.format("parquet")
                 .option("path", out).option("checkpointLocation", str(tmp_path / "cp"))
                 .trigger(availableNow=True).start())  # fmt: skip
        finish(query)

    drain()
    session = database.connect()
    session.execute("INSERT INTO TOPIC events (data) VALUES ('s1'), ('s2')")
    session.close()
    drain()
    assert sorted(r.d for r in spark.read.parquet(out).collect()) == ["s1", "s2"]


def test_connections_kept_idle_and_closed_by_a_restart_are_replaced(spark, database,
                                                                    url) -> None:  # fmt: skip
    _fill(database)
    server = _Wire(database)
    port = server.port
    tb = _catalog(spark, url, server)
    query = f"SELECT partition, count(*) AS n FROM {tb}.main.events GROUP BY partition"
    expected = [(0, 17), (1, 18), (2, 16)]
    try:
        assert sorted(tuple(r) for r in spark.sql(query).collect()) == expected
        assert sorted(tuple(r) for r in spark.sql(query).collect()) == expected  # reused
    finally:
        server.stop()  # closes the connections the JVM keeps idle
    server = _Wire(database, port=port)
    try:
        assert sorted(tuple(r) for r in spark.sql(query).collect()) == expected
        counted = spark.sql(f"SELECT count(data) AS n FROM {tb}.main.events").first().n
        assert counted == 51
    finally:
        server.stop()


def test_filters_on_partition_and_offset_narrow_the_cut(spark, database, url, wire) -> None:
    _fill(database)
    tb = _catalog(spark, url, wire, splitRows="4")
    frame = spark.sql(f"SELECT partition, `offset` FROM {tb}.main.events "
                      "WHERE partition IN (1, 2) AND `offset` >= 5 AND `offset` < 11")  # fmt: skip
    scan = frame._jdf.queryExecution().executedPlan().collectLeaves().head()
    assert "partitions=[1, 2], offsets=[5, 11)" in scan.toString()
    assert scan.inputPartitions().size() == 4  # [5, 9) and [9, 11) of each, of 14 ranges
    expected = sql_rows(database, 'SELECT partition, "offset" FROM TOPIC events WHERE '
                        'partition IN (1, 2) AND "offset" >= 5 AND "offset" < 11')  # fmt: skip
    assert sorted(tuple(r) for r in frame.collect()) == sorted(
        (r["partition"], r["offset"]) for r in expected)
    both = spark.sql(f"SELECT count(*) AS n FROM {tb}.main.events WHERE partition = 0 "
                     "AND partition = 1")  # fmt: skip
    assert both.first().n == 0
