"""One local SparkSession for the whole run, and a Flight door over a fresh data directory.

The session (local[2], UI off, 2 shuffle partitions, loopback, UTC, quiet log, C1-only JIT
and the serial GC: see FACTS.md) is made once per pytest run; each test gets its own data
directory and door. Every test here runs on one pytest-xdist worker (the unit
``spark``: tests/conftest.py). Spark's Python workers import the repository's code: the
repository root is put on their PYTHONPATH (also how they find ``pyspark_topicbase``),
after ``spark_sql_ext.WORKER_SITE``, whose ``sitecustomize`` has them import the installed
pyspark instead of Spark's ``pyspark.zip`` copy (a stream's worker must connect back
within Spark's fixed 10 s; from the zip its imports took 15-16 s at load ~16).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyspark  # noqa: F401  (the test extra pins it: a missing pyspark fails the run)
import pytest

if shutil.which("java") is None:
    pytest.fail("java is missing: `make test` installs openjdk-17-jdk-headless", pytrace=False)

from engine.database import Database
from spark_sql_ext import WORKER_SITE
from spark_sql_ext.client import TopicbaseClient
from sql.flight.server import TopicbaseFlightServer, start_flight
from sql.pgwire.users import add_user, default_users_path

ROOT = Path(__file__).resolve().parents[2]
LOG4J = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory,
          count_spark_session: Callable[[], None]) -> Iterator[object]:
    from pyspark.sql import SparkSession

    log4j = tmp_path_factory.mktemp("spark") / "log4j2.properties"
    log4j.write_text(LOG4J)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (WORKER_SITE, str(ROOT), os.environ.get("PYTHONPATH")) if p)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    jvm = f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Dlog4j2.configurationFile=file:{log4j}"
    builder = (SparkSession.builder.master("local[2]").appName("topicbase-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.extraJavaOptions", jvm)
               .config("spark.sql.python.filterPushdown.enabled", "true"))  # fmt: skip
    from spark_sql_ext.build_jar import build

    builder = builder.config("spark.jars", build())  # the catalog's jar (make spark-jar)
    session = builder.getOrCreate()
    count_spark_session()  # tests/conftest.py: a run that makes two fails
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


PASSWORD = "spark-secret"


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    db = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    add_user(default_users_path(db.path), "sparky", PASSWORD, superuser=True)
    yield db
    db.close()


@pytest.fixture
def door(database: Database) -> Iterator[TopicbaseFlightServer]:
    server = start_flight(database, "127.0.0.1", 0, "scram")
    yield server
    server.stop()


@pytest.fixture
def url(door: TopicbaseFlightServer) -> str:
    return f"topicbase://127.0.0.1:{door.port}"


@pytest.fixture
def options(url: str) -> dict[str, str]:
    return {"url": url, "user": "sparky", "password": PASSWORD}


@pytest.fixture
def client(url: str) -> Iterator[TopicbaseClient]:
    connection = TopicbaseClient(url, "sparky", PASSWORD)
    yield connection
    connection.close()


# How long a test waits for an AvailableNow query (a few micro-batches) to end: generous
# for a loaded machine. A query still running then is stopped and the test fails saying
# so; the tests used to ignore ``awaitTermination``'s answer and check a running query's
# partial output (round 20, Python workers starved at load ~15: a test read 400 of 500
# messages, failed with a diff, and its query ran on in the shared session).
QUERY_S = 300.0


def finish(query: Any) -> None:
    """Wait for ``query`` to end (``QUERY_S`` at most); stop it and fail if it has not,
    fail with its error if it failed."""
    if not query.awaitTermination(QUERY_S):
        query.stop()
        raise AssertionError(f"streaming query {query.name or query.id} still ran after "
                             f"{QUERY_S:.0f} s (stopped)")  # fmt: skip
    assert query.exception() is None, query.exception()


def sql_rows(database: Database, sql: str) -> list[dict]:
    session = database.connect()
    try:
        return session.execute(sql)[-1].table.to_pylist()
    finally:
        session.close()
