"""The Java Spark SQL catalog: SHOW TABLES, SELECT, CREATE TABLE, INSERT INTO, DROP TABLE,
topics as tables, readStream.table, and bare names with spark.sql.defaultCatalog."""

from __future__ import annotations

import itertools

from spark_sql_ext import CATALOG_CLASS
from tests.spark.conftest import PASSWORD, finish, sql_rows

_names = itertools.count(1)


def _catalog(spark, url: str) -> str:
    """A catalog of its own for this test's server (Spark caches a catalog by name)."""
    name = f"tb{next(_names)}"
    for key, value in (("", CATALOG_CLASS), (".url", url), (".user", "sparky"),
                       (".password", PASSWORD)):  # fmt: skip
        spark.conf.set(f"spark.sql.catalog.{name}{key}", value)
    return name


def test_tables_and_topics_through_the_catalog(spark, database, url) -> None:
    session = database.connect()
    session.execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
    session.execute("INSERT INTO TOPIC events (data, partition) VALUES ('a', 0), ('b', 1), "
                    "('c', 1)")  # fmt: skip
    session.execute("CREATE TABLE users (id BIGINT, name VARCHAR); "
                    "INSERT INTO users VALUES (1, 'ann')")  # fmt: skip
    session.close()
    tb = _catalog(spark, url)
    shown = {r.tableName for r in spark.sql(f"SHOW TABLES IN {tb}.main").collect()}
    assert shown == {"events", "users"}
    assert spark.sql(f"SELECT count(*) AS n FROM {tb}.main.events").first().n == 3
    assert [r.name for r in spark.sql(f"SELECT name FROM {tb}.main.users").collect()] == ["ann"]
    described = {r.col_name for r in spark.sql(f"DESCRIBE TABLE {tb}.main.events").collect()}
    assert {"partition", "offset", "data", "written_at"} <= described

    spark.sql(f"CREATE TABLE {tb}.main.totals (k STRING, n BIGINT)")
    spark.sql(f"INSERT INTO {tb}.main.totals VALUES ('x', 1), ('y', 2)")
    assert sql_rows(database, "SELECT * FROM totals ORDER BY k") == [
        {"k": "x", "n": 1}, {"k": "y", "n": 2}]
    assert sorted(tuple(r) for r in spark.sql(f"SELECT * FROM {tb}.main.totals").collect()) == [
        ("x", 1), ("y", 2)]
    spark.sql(f"DROP TABLE {tb}.main.totals")
    assert "totals" not in {r.tableName for r in spark.sql(f"SHOW TABLES IN {tb}.main").collect()}

    spark.sql(f"CREATE TABLE {tb}.main.clicks (data BINARY) "
              "TBLPROPERTIES ('kind' = 'topic', 'partitions' = '3')")  # fmt: skip
    partitions = sql_rows(database, "SELECT count(*) AS n FROM sys.partitions "
                          "WHERE topic = 'clicks'")  # fmt: skip
    assert partitions == [{"n": 3}]
    spark.table(f"{tb}.main.events").select("data").writeTo(f"{tb}.main.clicks").append()
    assert sql_rows(database, "SELECT count(*) AS n FROM TOPIC clicks") == [{"n": 3}]
    spark.sql(f"DROP TABLE {tb}.main.clicks")
    assert database.catalog.entry("clicks") is None


def test_bare_names_and_a_stream_from_a_catalog_table(spark, database, url, tmp_path) -> None:
    session = database.connect()
    session.execute("CREATE TOPIC logs")
    session.execute("INSERT INTO TOPIC logs (data) VALUES ('one'), ('two')")
    session.close()
    tb = _catalog(spark, url)
    previous = spark.conf.get("spark.sql.defaultCatalog")
    spark.conf.set("spark.sql.defaultCatalog", tb)
    try:
        assert spark.sql("SELECT count(*) AS n FROM logs").first().n == 2
        stream = spark.readStream.option("startingOffsets", "earliest").table("logs")
        query = (stream.selectExpr("CAST(data AS STRING) AS d").writeStream.format("memory")
                 .queryName("logs_copy").option("checkpointLocation", str(tmp_path / "cp"))
                 .trigger(availableNow=True).start())  # fmt: skip
        finish(query)
        assert sorted(r.d for r in spark.sql("SELECT d FROM logs_copy").collect()) == [
            "one", "two"]
    finally:
        spark.conf.set("spark.sql.defaultCatalog", previous)


def test_write_stream_to_table_through_the_catalog(spark, database, url, client,
                                                   tmp_path) -> None:  # fmt: skip
    """``writeStream.toTable("<catalog>.main.<topic>")``: the catalog resolves the topic and
    the stream's options (its sink id) reach the source's stream writer, so a restarted
    query publishes each message once."""
    session = database.connect()
    session.execute("CREATE TOPIC src WITH (min_active_partitions = 2)")
    session.execute("CREATE TOPIC dst WITH (min_active_partitions = 2)")
    session.execute("INSERT INTO TOPIC src (data, partition) VALUES ('a', 0), ('b', 1)")
    session.close()
    tb = _catalog(spark, url)
    checkpoint = str(tmp_path / "cp")

    def run() -> None:
        stream = spark.readStream.option("startingOffsets", "earliest").table(f"{tb}.main.src")
        query = (stream.select("data", "partition").writeStream.option("sinkId", "src-to-dst")
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True)
                 .toTable(f"{tb}.main.dst"))  # fmt: skip
        finish(query)

    run()
    session = database.connect()
    session.execute("INSERT INTO TOPIC src (data, partition) VALUES ('c', 0)")
    session.close()
    run()  # restarted from the checkpoint: only 'c' is new
    rows = sql_rows(database, "SELECT partition, CAST(data AS VARCHAR) AS d FROM TOPIC dst "
                    "ORDER BY partition, offset")  # fmt: skip
    assert rows == [{"partition": 0, "d": "a"}, {"partition": 0, "d": "c"},
                    {"partition": 1, "d": "b"}]  # fmt: skip
    assert client.action("last_batch", {"sink_id": "src-to-dst"}) == {"batch_id": 1}


def test_the_catalog_reads_only_the_columns_a_query_needs(spark, database, url,
                                                          monkeypatch) -> None:  # fmt: skip
    """Column pruning (Spark's Python tables have none): a GROUP BY partition and a count
    over a topic read no frame, a projection of data still reads it, and a table read asks
    for its columns."""
    session = database.connect()
    session.execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
    session.execute("INSERT INTO TOPIC events (data, partition) VALUES ('a', 0), ('b', 1), "
                    "('c', 1)")  # fmt: skip
    session.execute("CREATE TABLE people (id BIGINT, name VARCHAR, note VARCHAR); "
                    "INSERT INTO people VALUES (1, 'ann', 'x')")  # fmt: skip
    session.close()
    tb = _catalog(spark, url)
    assert [tuple(r) for r in spark.sql(f"SELECT data FROM {tb}.main.events ORDER BY offset, "
                                        "partition").collect()] == [(b"a",), (b"b",), (b"c",)]
    from storage.partition_log import PartitionLog

    def no_frames(*args, **kwargs):
        raise AssertionError("a frame was read")

    monkeypatch.setattr(PartitionLog, "read", no_frames)  # the door runs in this process
    counts = spark.sql(f"SELECT partition, count(*) AS n FROM {tb}.main.events "
                       "GROUP BY partition ORDER BY partition").collect()  # fmt: skip
    assert [tuple(r) for r in counts] == [(0, 1), (1, 2)]
    assert spark.sql(f"SELECT count(*) AS n FROM {tb}.main.events").first().n == 3
    plan = spark.sql(f"SELECT name FROM {tb}.main.people")._jdf.queryExecution().toString()
    scanned = plan.split("BatchScan topicbase[")[1].split("]")[0]
    assert scanned.startswith("name#") and "," not in scanned, plan  # not id, name, note
    assert [r.name for r in spark.sql(f"SELECT name FROM {tb}.main.people").collect()] == ["ann"]


def test_the_catalog_resolves_a_name_in_one_call(spark, database, url) -> None:
    """A name resolves through one schema() call of the source (option ``describe``), not
    a Spark job listing every relation: a topic gets the source's topic schema, a table its
    own, a missing name is Spark's table-not-found."""
    from pyspark.errors import AnalysisException

    from spark_sql_ext.options import TOPIC_DDL

    session = database.connect()
    session.execute("CREATE TOPIC events")
    session.execute("CREATE TABLE people (id BIGINT, name VARCHAR)")
    session.close()
    tb = _catalog(spark, url)
    jobs = spark.sparkContext.statusTracker()
    before = len(jobs.getJobIdsForGroup(None))
    topic_schema = spark.table(f"{tb}.main.events").schema
    table_schema = spark.table(f"{tb}.main.people").schema
    assert len(jobs.getJobIdsForGroup(None)) == before  # no job ran to resolve them
    ddl = ", ".join(f"`{c}` {t}" for c, t in TOPIC_DDL.items())
    assert topic_schema == spark.createDataFrame([], ddl).schema
    assert [(f.name, f.dataType.simpleString()) for f in table_schema] == [
        ("id", "bigint"), ("name", "string")]
    assert all(not f.metadata for f in topic_schema)
    try:
        spark.table(f"{tb}.main.nothing")
    except AnalysisException as error:
        assert "TABLE_OR_VIEW_NOT_FOUND" in str(error)
    else:
        raise AssertionError("a missing relation resolved")


def test_the_catalog_reaches_a_door_that_asks_for_client_certificates(
        spark, database, tmp_path) -> None:  # fmt: skip
    """``serve --flight-client-ca``: the catalog hands ``tlsClientCert``/``tlsClientKey`` to
    the source its scans and writes run in, as it does ``tlsRootCerts``."""
    from sql.flight.server import start_flight
    from tests.tls_certificates import self_signed

    (tmp_path / "server").mkdir()
    (tmp_path / "client").mkdir()
    cert, key = self_signed(tmp_path / "server", alt_names="IP:127.0.0.1,DNS:localhost")
    client_cert, client_key = self_signed(tmp_path / "client", common_name="etl", alt_names=None)
    session = database.connect()
    session.execute("CREATE TOPIC mutual")
    session.execute("INSERT INTO TOPIC mutual (data) VALUES ('a'), ('b')")
    session.close()
    door = start_flight(database, "127.0.0.1", 0, "scram", tls_cert=cert, tls_key=key,
                        tls_client_ca=client_cert)  # fmt: skip
    name = "tbmutual"
    try:
        for suffix, value in (("", CATALOG_CLASS),
                              (".url", f"topicbase+tls://127.0.0.1:{door.port}"),
                              (".user", "sparky"), (".password", PASSWORD),
                              (".tlsRootCerts", cert), (".tlsClientCert", client_cert),
                              (".tlsClientKey", client_key)):  # fmt: skip
            spark.conf.set(f"spark.sql.catalog.{name}{suffix}", value)
        spark.sql(f"INSERT INTO {name}.main.mutual (data) VALUES (CAST('c' AS BINARY))")
        got = sorted(bytes(r.data) for r in spark.table(f"{name}.main.mutual").collect())
    finally:
        door.stop()
    assert got == [b"a", b"b", b"c"]
