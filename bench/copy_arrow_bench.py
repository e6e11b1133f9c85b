"""COPY (range read) TO STDOUT (FORMAT arrow) over the PostgreSQL wire vs Flight DoGet.

One topic of one partition holding ``--rows`` messages of 1 KiB (default 200k), served by
``topicbase serve`` in a process of its own (wire and Flight ports). The sides, alternated
(A B C D A B C D ..., ``bench.harness.alternate``), each read all of ``[0, rows)`` with every
column of the topic relation and end with a ``pyarrow.Table`` in the client:

- ``copy_range``: psycopg ``COPY (SELECT * FROM TOPIC t WHERE partition = 0 AND "offset"
  >= 0 AND "offset" < rows) TO STDOUT (FORMAT arrow)``, the CopyData joined and read by
  ``pyarrow.ipc.open_stream`` (the storage fast path, ``engine.api.read_range``);
- ``copy_streamed``: the same COPY, its CopyData read by pyarrow as they arrive (a file
  object over psycopg's blocks, ``CopyReader``), never joined into one bytes object;
- ``flight_doget``: the Flight door's DoGet of the same range (``spark_sql_ext.client``);
- ``copy_general``: the same query with ``ORDER BY "offset"``, so not the range shape: the
  ordinary engine path (DuckDB over a peek of the topic), for comparison.

Run alone: ``.venv/bin/python -m bench.copy_arrow_bench [--rows N] [--reps N]`` prints the
spreads (median, min-max) in messages/s and MB/s; ``python -m bench.run --only copy_arrow``
records them (``run``). docs/copy_arrow.md has the figures.
"""

from __future__ import annotations

import argparse
import io
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pyarrow as pa

from bench.demo_spark import kill_group, start_server
from bench.harness import Side, Spread, alternate, record
from bench.results import Recorder
from engine.database import Database
from spark_sql_ext.client import TopicbaseClient
from sql.pgwire.users import add_user, default_users_path

USER, PASSWORD = "bench", "bench-password"
MESSAGE_BYTES = 1024


def _fill(data_dir: str, rows: int) -> None:
    database = Database.open(data_dir, retention_interval_s=None)
    session = database.connect()
    session.execute("CREATE TOPIC bench")
    for start in range(0, rows, 10000):
        count = min(10000, rows - start)
        session.execute("INSERT INTO TOPIC bench (data) SELECT CAST(repeat(CAST(i % 10 AS "
                        f"VARCHAR), {MESSAGE_BYTES}) AS BLOB) FROM range({count}) t(i)")
    session.close()
    database.close()
    add_user(default_users_path(data_dir), USER, PASSWORD, superuser=True)


def _copy_reader(wire: int, query: str) -> Callable[[], pa.Table]:
    connection = psycopg.connect(host="127.0.0.1", port=wire, user=USER, password=PASSWORD,
                                 dbname="topicbase", autocommit=True)  # fmt: skip

    def read() -> pa.Table:
        with connection.cursor().copy(f"COPY ({query}) TO STDOUT (FORMAT arrow)") as copy:
            data = b"".join(copy)
        return pa.ipc.open_stream(data).read_all()

    return read


class CopyReader(io.RawIOBase):
    """The CopyData payloads of a psycopg ``Copy`` as one readable byte stream."""

    def __init__(self, copy: Any) -> None:
        self._blocks = iter(copy)
        self._view = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._view:
            block = next(self._blocks, None)
            if block is None:
                return 0
            self._view = memoryview(block)
        count = min(len(buffer), len(self._view))
        buffer[:count] = self._view[:count]
        self._view = self._view[count:]
        return count

    def drain(self) -> None:
        """Read what follows the stream's end (psycopg needs the COPY read to its end)."""
        for _ in self._blocks:
            pass


def _streamed_reader(wire: int, query: str) -> Callable[[], pa.Table]:
    connection = psycopg.connect(host="127.0.0.1", port=wire, user=USER, password=PASSWORD,
                                 dbname="topicbase", autocommit=True)  # fmt: skip

    def read() -> pa.Table:
        with connection.cursor().copy(f"COPY ({query}) TO STDOUT (FORMAT arrow)") as copy:
            stream = CopyReader(copy)
            table = pa.ipc.open_stream(io.BufferedReader(stream, 1 << 20)).read_all()
            stream.drain()
        return table

    return read


def _timed_side(name: str, read: Callable[[], pa.Table], rows: int) -> Side:
    def run(_rep: int) -> dict[str, float]:
        start = time.perf_counter()
        table = read()
        seconds = time.perf_counter() - start
        assert table.num_rows == rows, (name, table.num_rows)
        return {"msgs/s": rows / seconds, "MB/s": rows * MESSAGE_BYTES / seconds / 1e6}

    return Side(name, run)


def measure(rows: int, reps: int, progress: Callable[[str], None]
            ) -> dict[str, dict[str, Spread]]:  # fmt: skip
    """Fill a topic of ``rows`` messages, serve it, and alternate the four sides ``reps``
    times: side -> metric -> spread."""
    work = tempfile.mkdtemp(prefix="copy-arrow-bench-")
    data_dir = f"{work}/data"
    _fill(data_dir, rows)
    server, wire, flight = start_server(data_dir, timeout_s=60)
    try:
        query = (f'SELECT * FROM TOPIC bench WHERE partition = 0 AND "offset" >= 0 '
                 f'AND "offset" < {rows}')  # fmt: skip
        client = TopicbaseClient(f"topicbase://127.0.0.1:{flight}", USER, PASSWORD)
        ticket = {"topic": "bench", "partition": 0, "start": 0, "end": rows, "columns": None}

        def doget() -> pa.Table:
            return pa.Table.from_batches(list(client.read_ticket(ticket)))

        sides = [
            _timed_side("copy_range", _copy_reader(wire, query), rows),
            _timed_side("copy_streamed", _streamed_reader(wire, query), rows),
            _timed_side("flight_doget", doget, rows),
            _timed_side("copy_general", _copy_reader(wire, query + ' ORDER BY "offset"'), rows),
        ]
        try:
            return alternate(sides, reps, progress=progress)
        finally:
            client.close()
    finally:
        kill_group(server, signal.SIGTERM)
        shutil.rmtree(work, ignore_errors=True)


def run(recorder: Recorder) -> None:
    """``bench.run``'s entry: quick 100k messages x 3 repetitions, full 200k x 5."""
    rows, reps = (100_000, 3) if recorder.suite == "quick" else (200_000, 5)
    recorder.progress(f"copy_arrow: {rows} x 1 KiB, COPY (FORMAT arrow) vs Flight DoGet")
    spreads = measure(rows, reps, recorder.progress)
    flight = spreads["flight_doget"]["msgs/s"]
    what = f"{rows // 1000}k x 1 KiB, 1 partition, all columns"
    record(recorder, f"COPY range read (FORMAT arrow), streamed client ({what})",
           spreads["copy_streamed"]["msgs/s"], flight, unit="msgs/s", group="copy_arrow",
           baseline="Flight DoGet of the same range",
           note="psycopg COPY, CopyData fed to pyarrow.ipc.open_stream as they come")  # fmt: skip
    record(recorder, f"COPY range read (FORMAT arrow), joined client ({what})",
           spreads["copy_range"]["msgs/s"], flight, unit="msgs/s", group="copy_arrow",
           baseline="Flight DoGet of the same range",
           note='b"".join(copy), then pyarrow.ipc.open_stream')  # fmt: skip
    record(recorder, f"COPY range read (FORMAT arrow) vs the general path ({what})",
           spreads["copy_range"]["msgs/s"], spreads["copy_general"]["msgs/s"], unit="msgs/s",
           group="copy_arrow", baseline='the same COPY with ORDER BY "offset" (DuckDB path)',
           note="both joined clients")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.copy_arrow_bench")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    spreads = measure(args.rows, args.reps, print)
    for side, metrics in spreads.items():
        for metric, spread in metrics.items():
            print(f"{side:>13} {metric:>6}: {spread.describe()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
