"""The pipelines, exactly once through an interruption: reshard a topic sharded by server
into one partitioned by user, then fold it into a table of per-user counts."""

from __future__ import annotations

import json
import os
import time

from spark_sql_ext import pipelines
from spark_sql_ext.client import TopicbaseClient
from tests.spark.conftest import PASSWORD, finish, sql_rows

SERVERS, USERS, PER_SERVER = 3, 5, 400


def _produce(database, per_server: int = PER_SERVER) -> None:
    """Topics ``logs_by_server`` (3 partitions: one a server, ``per_server`` JSON lines
    each, ``seq`` per server), ``logs_by_user`` and the table ``clicks_per_user``."""
    session = database.connect()
    session.execute("CREATE TOPIC logs_by_server (CONSUMER resharder) "
                    "WITH (min_active_partitions = 3)")  # fmt: skip
    session.execute("CREATE TOPIC logs_by_user (CONSUMER counter) "
                    "WITH (min_active_partitions = 2)")  # fmt: skip
    session.execute("CREATE TABLE clicks_per_user (key VARCHAR PRIMARY KEY, n BIGINT)")
    for server in range(SERVERS):
        values = ", ".join(
            "('" + json.dumps({"server": server, "user": f"u{(i * 7 + server) % USERS}",
                               "seq": i}) + f"', 'srv-{server}', {i + 1}, {server})"
            for i in range(per_server))  # fmt: skip
        session.execute("INSERT INTO TOPIC logs_by_server (data, producer_id, seq_no, "
                        f"partition) VALUES {values}")  # fmt: skip
    session.close()


def _crash_after_last_sink_commit(checkpoint: str, client: TopicbaseClient, sink_id: str
                                   ) -> int:  # fmt: skip
    """What a kill between the sink's commit and Spark's commit log leaves behind: Spark's
    logs end with the offsets of the batch the sink committed last (``last``) and no commit
    of it, so the restarted query runs ``last`` again with the same id and offsets. Later
    batches Spark planned (a stop lands mid-batch) were not published by the sink: their
    offsets and commits go too, or Spark would run the newest planned batch instead and the
    replay would not happen. Returns ``last``."""
    last = client.action("last_batch", {"sink_id": sink_id})["batch_id"]
    assert isinstance(last, int), "the sink committed no batch: nothing to replay"
    for log in ("commits", "offsets"):
        directory = os.path.join(checkpoint, log)
        for name in os.listdir(directory):
            number = name.removeprefix(".").removesuffix(".crc")
            if number.isdigit() and (int(number) > last or (log == "commits"
                                                             and int(number) == last)):  # fmt: skip
                os.remove(os.path.join(directory, name))
    assert os.path.exists(os.path.join(checkpoint, "offsets", str(last)))
    return last


def test_reshard_and_to_table_exactly_once_through_an_interruption(
        spark, database, url, client, tmp_path) -> None:  # fmt: skip
    _produce(database)
    connection = pipelines.Connection(url, "sparky", PASSWORD)
    checkpoint = str(tmp_path / "reshard")
    query = pipelines.reshard(spark, connection, "logs_by_server", "logs_by_user", "user",
                              checkpoint, consumer="resharder", once=False,
                              interval="200 milliseconds", max_per_trigger=250)  # fmt: skip
    deadline = time.monotonic() + 60
    while query.lastProgress is None or query.lastProgress["batchId"] < 1:
        assert time.monotonic() < deadline and query.exception() is None
        time.sleep(0.2)
    query.stop()  # midway: 1,200 messages at 250 a batch
    replayed = _crash_after_last_sink_commit(checkpoint, client,
                                             "reshard:logs_by_server->logs_by_user")  # fmt: skip
    moved = sql_rows(database, "SELECT count(*) AS n FROM TOPIC logs_by_user")[0]["n"]
    assert 0 < moved < SERVERS * PER_SERVER
    finish(pipelines.reshard(spark, connection, "logs_by_server", "logs_by_user", "user",
                             checkpoint, consumer="resharder", max_per_trigger=250))
    # Spark ran the batch the sink had committed again (its commit is back in the log).
    assert os.path.exists(os.path.join(checkpoint, "commits", str(replayed)))
    rows = sql_rows(database, "SELECT partition, CAST(data AS VARCHAR) AS d FROM TOPIC "
                    "logs_by_user WITH (max_messages = 100000) ORDER BY partition, \"offset\"")
    messages = [(r["partition"], json.loads(r["d"])) for r in rows]
    assert len(messages) == SERVERS * PER_SERVER
    assert len({(m["server"], m["seq"]) for _, m in messages}) == SERVERS * PER_SERVER
    placement: dict[str, int] = {}
    last_seq: dict[tuple[str, int], int] = {}
    for partition, message in messages:
        assert placement.setdefault(message["user"], partition) == partition
        key = (message["user"], message["server"])
        assert message["seq"] > last_seq.get(key, -1), "per-user order per source"
        last_seq[key] = message["seq"]

    fold = str(tmp_path / "to_table")
    finish(pipelines.to_table(spark, connection, "logs_by_user", "clicks_per_user", "user",
                              fold, consumer="counter", max_per_trigger=500))
    replayed = _crash_after_last_sink_commit(fold, client,
                                             "to-table:logs_by_user->clicks_per_user")  # fmt: skip
    finish(pipelines.to_table(spark, connection, "logs_by_user", "clicks_per_user", "user",
                              fold, consumer="counter", max_per_trigger=500))
    assert os.path.exists(os.path.join(fold, "commits", str(replayed)))
    expected: dict[str, int] = {}
    for _, message in messages:
        expected[message["user"]] = expected.get(message["user"], 0) + 1
    totals = {r["key"]: r["n"] for r in sql_rows(database, "SELECT * FROM clicks_per_user")}
    assert totals == expected


def test_a_pipeline_and_a_read_over_tls_from_given_offsets(spark, database, tmp_path) -> None:
    """The cluster setup README gives: a ``topicbase+tls://`` door checked against a CA file
    (``tlsRootCerts``; ``Connection.tls_root_certs``, ``--tls-root-certs``), and a pipeline
    whose new checkpoint starts at given offsets (``--starting-offsets``)."""
    from sql.flight.server import start_flight
    from tests.tls_certificates import self_signed

    _produce(database)
    cert, key = self_signed(tmp_path, alt_names="IP:127.0.0.1,DNS:localhost")
    door = start_flight(database, "127.0.0.1", 0, "scram", tls_cert=cert, tls_key=key)
    try:
        url = f"topicbase+tls://127.0.0.1:{door.port}"
        read = spark.read.format("topicbase").options(
            url=url, user="sparky", password=PASSWORD, tlsRootCerts=cert,
            topic="logs_by_server", columns="partition,offset").load()  # fmt: skip
        assert read.count() == SERVERS * PER_SERVER
        connection = pipelines.Connection(url, "sparky", PASSWORD, tls_root_certs=cert)
        starting = json.dumps({"0": PER_SERVER - 10, "1": PER_SERVER - 5, "2": -1})
        finish(pipelines.reshard(spark, connection, "logs_by_server", "logs_by_user", "user",
                                 str(tmp_path / "cp"), starting_offsets=starting))  # fmt: skip
    finally:
        door.stop()
    rows = sql_rows(database, "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC logs_by_user "
                    "WITH (max_messages = 100000)")  # fmt: skip
    moved = sorted((m["server"], m["seq"]) for m in (json.loads(r["d"]) for r in rows))
    assert moved == [*((0, s) for s in range(PER_SERVER - 10, PER_SERVER)),
                     *((1, s) for s in range(PER_SERVER - 5, PER_SERVER))]  # fmt: skip


KEYS, PER_KEY = 6, 60
EVENT = "CAST(data AS VARCHAR)"


def _produce_events(database) -> None:
    """Topic ``events`` (2 partitions; each user's messages in one partition, in order)
    with a number ``amount`` and a string ``status`` per message, some without them."""
    session = database.connect()
    session.execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
    session.execute("CREATE TABLE spent (user_id VARCHAR PRIMARY KEY, total DOUBLE)")
    session.execute("CREATE TABLE last_status (user_id VARCHAR PRIMARY KEY, status VARCHAR)")
    session.execute("INSERT INTO last_status VALUES ('u0', 'before')")
    rows = []
    for seq in range(PER_KEY):
        for user in range(KEYS):
            message = {"user": f"u{user}", "seq": seq}
            if (seq + user) % 7:  # every 7th message has neither field: skipped
                message.update(amount=(seq * 3 + user) / 2, status=f"s{seq}-{user}")
            rows.append(f"('{json.dumps(message)}', {user % 2})")
    session.execute(f"INSERT INTO TOPIC events (data, partition) VALUES {', '.join(rows)}")
    session.close()


def test_to_table_sum_and_upsert_equal_sql_over_the_topic(
        spark, database, url, client, tmp_path) -> None:  # fmt: skip
    """Micro-batches of 50 messages (each user several times in a batch): the sum fold,
    interrupted and replayed, and the upsert fold equal SQL over the topic."""
    _produce_events(database)
    connection = pipelines.Connection(url, "sparky", PASSWORD)
    fold = str(tmp_path / "sum")

    def run_sum() -> None:
        finish(pipelines.to_table(spark, connection, "events", "spent", "user", fold,
                                  key_column="user_id", mode="sum", value="amount",
                                  value_column="total", max_per_trigger=50))  # fmt: skip

    run_sum()
    replayed = _crash_after_last_sink_commit(fold, client, "to-table:events->spent:sum:total")
    run_sum()
    assert os.path.exists(os.path.join(fold, "commits", str(replayed)))
    expected = sql_rows(database, f"SELECT json_extract_string({EVENT}, '$.user') AS user_id, "
                        f"sum(CAST(json_extract_string({EVENT}, '$.amount') AS DOUBLE)) AS total "
                        "FROM TOPIC events WITH (max_messages = 100000) "
                        f"WHERE json_extract_string({EVENT}, '$.amount') IS NOT NULL "
                        "GROUP BY user_id ORDER BY user_id")  # fmt: skip
    assert len(expected) == KEYS
    assert sql_rows(database, "SELECT * FROM spent ORDER BY user_id") == expected

    finish(pipelines.to_table(spark, connection, "events", "last_status", "user",
                              str(tmp_path / "upsert"), key_column="user_id", mode="upsert",
                              value="status", value_column="status", max_per_trigger=50))
    latest = sql_rows(database, "SELECT user_id, status FROM (SELECT "
                      f"json_extract_string({EVENT}, '$.user') AS user_id, "
                      f"json_extract_string({EVENT}, '$.status') AS status, row_number() OVER "
                      "(PARTITION BY user_id ORDER BY partition DESC, \"offset\" DESC) AS r "
                      "FROM TOPIC events WITH (max_messages = 100000) "
                      f"WHERE json_extract_string({EVENT}, '$.status') IS NOT NULL) AS m "
                      "WHERE r = 1 ORDER BY user_id")  # fmt: skip
    assert len(latest) == KEYS and all(r["status"].startswith("s") for r in latest)
    assert sql_rows(database, "SELECT * FROM last_status ORDER BY user_id") == latest


def test_to_table_skips_messages_without_the_key(spark, database, url, tmp_path) -> None:
    """A message lacking the key field (or with a JSON null key) is not folded by any mode;
    before, its NULL key failed the publish (23502) on every replay and stopped the fold.
    Column names with a backtick are quoted (the backtick doubled)."""
    session = database.connect()
    session.execute("CREATE TOPIC keyed_events")
    session.execute('CREATE TABLE n_per_user ("us`er" VARCHAR PRIMARY KEY, "n`" BIGINT)')
    session.execute('CREATE TABLE total_per_user ("us`er" VARCHAR PRIMARY KEY, "t`" DOUBLE)')
    session.execute('CREATE TABLE last_per_user ("us`er" VARCHAR PRIMARY KEY, "s`" VARCHAR)')
    messages = [
        {"user": "a", "x": 1, "s": "p"},
        {"x": 5, "s": "q"},
        {"user": None, "x": 7, "s": "r"},
        {"user": "b", "x": 2, "s": "t"},
        {"user": "a", "x": 3, "s": "u"},
    ]
    values = ", ".join(f"('{json.dumps(m)}')" for m in messages)
    session.execute(f"INSERT INTO TOPIC keyed_events (data) VALUES {values}")
    session.close()
    connection = pipelines.Connection(url, "sparky", PASSWORD)
    common = {"key_column": "us`er"}
    finish(
        pipelines.to_table(
            spark,
            connection,
            "keyed_events",
            "n_per_user",
            "user",
            str(tmp_path / "count"),
            count_column="n`",
            **common,
        )
    )
    finish(pipelines.to_table(spark, connection, "keyed_events", "total_per_user", "user",
                              str(tmp_path / "sum"), mode="sum", value="x", value_column="t`",
                              **common))  # fmt: skip
    finish(pipelines.to_table(spark, connection, "keyed_events", "last_per_user", "user",
                              str(tmp_path / "upsert"), mode="upsert", value="s",
                              value_column="s`", **common))  # fmt: skip
    expected = {
        "n_per_user": [("a", 2), ("b", 1)],
        "total_per_user": [("a", 4.0), ("b", 2.0)],
        "last_per_user": [("a", "u"), ("b", "t")],
    }
    for table, want in expected.items():
        got = sql_rows(database, f'SELECT * FROM {table} ORDER BY "us`er"')
        assert [tuple(r.values()) for r in got] == want, table
