"""The pipelines exactly once through a killed server: ``topicbase serve`` runs as a child
process and dies (the ``sink.after_commit`` failpoint: ``os._exit(137)``, no cleanup, as
SIGKILL) just after a sink's batch committed and before Spark heard of it, so Spark's
checkpoint has the batch's offsets and no commit. The query fails; the server restarts on
the same data directory and ports, the query from the same checkpoint, and the replayed
batch must publish nothing (the sink's ``(sink id, batch id)`` record). Each server run
also ends by SIGKILL (no clean close), so what the checks read is what a kill leaves."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.database import Database
from spark_sql_ext import pipelines
from sql.pgwire.users import add_user, default_users_path
from tests.spark.conftest import PASSWORD, QUERY_S, finish, sql_rows
from tests.spark.test_pipelines import _produce

ROOT = Path(__file__).resolve().parents[2]
SERVERS, USERS, PER_SERVER = 3, 5, 300
RESHARD_BATCH, FOLD_BATCH = 200, 300  # messages a micro-batch: 5 and 3 batches
TOTAL = SERVERS * PER_SERVER
SERVE = "import sys; from sql.console import main; sys.exit(main())"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """``topicbase serve`` on fixed loopback ports over ``data``, restartable."""

    def __init__(self, data: Path, log: Path) -> None:
        self.data, self.log = data, log
        self.port, self.flight_port = _free_port(), _free_port()
        self.proc: subprocess.Popen | None = None
        self.runs = 0

    @property
    def url(self) -> str:
        return f"topicbase://127.0.0.1:{self.flight_port}"

    def start(self, failpoints: str = "") -> None:
        environment = {**os.environ, "PYTHONPATH": str(ROOT), "TOPICBASE_FAILPOINTS": failpoints}
        self.runs += 1
        out = open(self.log / f"serve-{self.runs}.out", "w")  # noqa: SIM115 (the child's)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, "serve", "--data-dir", str(self.data),
             "--host", "127.0.0.1", "--port", str(self.port),
             "--flight-port", str(self.flight_port)],
            env=environment, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        out.close()
        deadline = time.monotonic() + 60
        while "Arrow Flight at" not in (self.log / f"serve-{self.runs}.out").read_text():
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, "the server did not start in 60 s"
            time.sleep(0.05)

    def output(self) -> str:
        return (self.log / f"serve-{self.runs}.out").read_text()

    def kill(self) -> None:
        """SIGKILL (if still alive) and reap."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def wait_crashed(self, query) -> None:
        """The failpoint ended the server (exit 137) under ``query``; fails at once if the
        query ended with the server still alive (no crash: the failpoint is gone)."""
        assert self.proc is not None
        deadline = time.monotonic() + QUERY_S
        while self.proc.poll() is None:
            if not query.isActive:
                time.sleep(2)  # the crash may still be on its way
                assert self.proc.poll() is not None, "the query ended, the server lives on"
            assert time.monotonic() < deadline, "the server did not crash"
            time.sleep(0.1)
        assert self.proc.returncode == 137, self.output()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    data = tmp_path / "data"
    database = Database.open(str(data), retention_interval_s=None)
    add_user(default_users_path(database.path), "sparky", PASSWORD, superuser=True)
    _produce(database, PER_SERVER)
    database.close()
    served = Server(data, tmp_path)
    yield served
    if served.proc is not None and served.proc.poll() is None:
        served.kill()


def _offline(server: Server, sql: str) -> list[dict]:
    """``sql`` over the data directory while no server runs (recovery runs on open)."""
    database = Database.open(str(server.data), retention_interval_s=None)
    try:
        return sql_rows(database, sql)
    finally:
        database.close()


def _crashed_query(query) -> str:
    """The query ended with an error (the server died under its commit): its text."""
    from pyspark.errors import StreamingQueryException

    with pytest.raises(StreamingQueryException) as failed:
        query.awaitTermination(QUERY_S)
    assert not query.isActive
    assert "Writing job failed" in str(failed.value), str(failed.value)[:2000]
    return str(failed.value)


def test_reshard_and_to_table_exactly_once_through_a_killed_server(spark, server, tmp_path
                                                                   ) -> None:  # fmt: skip
    connection = pipelines.Connection(server.url, "sparky", PASSWORD)
    checkpoint = str(tmp_path / "reshard")

    def reshard():
        return pipelines.reshard(
            spark,
            connection,
            "logs_by_server",
            "logs_by_user",
            "user",
            checkpoint,
            consumer="resharder",
            max_per_trigger=RESHARD_BATCH,
        )

    # The server dies once the sink committed batch 1 (its second commit).
    server.start("sink.after_commit=crash@2")
    query = reshard()
    server.wait_crashed(query)
    _crashed_query(query)
    commits = os.listdir(os.path.join(checkpoint, "commits"))
    assert "0" in commits and "1" not in commits, commits  # Spark never heard of batch 1
    assert os.path.exists(os.path.join(checkpoint, "offsets", "1"))
    moved = _offline(server, "SELECT count(*) AS n FROM TOPIC logs_by_user")[0]["n"]
    assert moved == 2 * RESHARD_BATCH, moved  # batches 0 and 1 published; the rest not

    server.start()
    finish(reshard())  # runs batch 1 again (a duplicate for the sink), then the rest
    assert os.path.exists(os.path.join(checkpoint, "commits", "1"))
    server.kill()
    rows = _offline(
        server,
        "SELECT partition, CAST(data AS VARCHAR) AS d FROM TOPIC "
        'logs_by_user WITH (max_messages = 100000) ORDER BY partition, "offset"',
    )
    messages = [(r["partition"], json.loads(r["d"])) for r in rows]
    assert len(messages) == TOTAL
    assert len({(m["server"], m["seq"]) for _, m in messages}) == TOTAL
    placement: dict[str, int] = {}
    last_seq: dict[tuple[str, int], int] = {}
    for partition, message in messages:
        assert placement.setdefault(message["user"], partition) == partition
        key = (message["user"], message["server"])
        assert message["seq"] > last_seq.get(key, -1), "per-user order per source"
        last_seq[key] = message["seq"]
    offsets = _offline(
        server,
        "SELECT partition, committed_offset, end_offset FROM "
        "sys.consumers WHERE topic = 'logs_by_server' ORDER BY partition",
    )
    assert [r["end_offset"] for r in offsets] == [PER_SERVER] * SERVERS
    assert sum(r["committed_offset"] or 0 for r in offsets) >= TOTAL - RESHARD_BATCH, offsets

    fold = str(tmp_path / "to_table")

    def to_table():
        return pipelines.to_table(
            spark,
            connection,
            "logs_by_user",
            "clicks_per_user",
            "user",
            fold,
            consumer="counter",
            max_per_trigger=FOLD_BATCH,
        )

    server.start("sink.after_commit=crash@2")
    query = to_table()
    server.wait_crashed(query)
    _crashed_query(query)
    assert "1" not in os.listdir(os.path.join(fold, "commits"))
    server.start()
    finish(to_table())
    assert os.path.exists(os.path.join(fold, "commits", "1"))
    server.kill()
    expected: dict[str, int] = {}
    for _, message in messages:
        expected[message["user"]] = expected.get(message["user"], 0) + 1
    totals = {r["key"]: r["n"] for r in _offline(server, "SELECT * FROM clicks_per_user")}
    assert totals == expected
    offsets = _offline(
        server,
        "SELECT committed_offset, end_offset FROM sys.consumers "
        "WHERE topic = 'logs_by_user' AND consumer = 'counter'",
    )
    assert sum(r["end_offset"] for r in offsets) == TOTAL
    assert sum(r["committed_offset"] or 0 for r in offsets) >= TOTAL - FOLD_BATCH, offsets
