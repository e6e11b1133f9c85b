"""A ``topicbase serve`` killed (SIGKILL) in the middle of a staged COPY: after the restart
the write holds exactly its COPYs that ended, and ``COMMIT WRITES`` publishes those once.

The server is a process of its own (``serve --flight-port 0``: the staged-write protocol
without the Flight door), killed while the second COPY's stream is half sent and its file
is being written (a ``.part`` file of the write exists), for Arrow streams and for a
client's partition frames (``FORMAT frames``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from engine.bulk_write import WRITES_DIRECTORY
from tests.pgwire.test_copy_frames import frame, wire
from tests.pgwire.test_copy_staged import arrow_stream, messages, stage

ROOT = Path(__file__).parents[2]
CODE = "import sys; from sql.console import main; sys.exit(main(sys.argv[1:]))"


def _serve(data_dir: Path) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [sys.executable, "-c", CODE, "--data-dir", str(data_dir), "serve", "--port", "0",
         "--flight-port", "0", "--auth", "trust"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    line = process.stdout.readline() if process.stdout else ""
    assert "serving" in line, line
    return process, int(line.rsplit(":", 1)[1])


def _connect(port: int) -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=port, autocommit=True, connect_timeout=10)


def _wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _kill_mid_copy(process: subprocess.Popen[str], db: psycopg.Connection, sql: str,
                   stream: bytes, write_dir: Path) -> None:  # fmt: skip
    """COPY ``sql`` sends half of ``stream``; the server is SIGKILLed once the write has a
    ``.part`` file (the COPY's file being written), then the rest is sent: the COPY fails."""
    with pytest.raises(psycopg.OperationalError), db.cursor().copy(sql) as copy:
        copy.write(stream[: len(stream) // 2])
        _wait_for(lambda: any(n.endswith(".part") for n in os.listdir(write_dir)))
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=20)
        copy.write(stream[len(stream) // 2:])


@contextlib.contextmanager
def _restarted(data_dir: Path) -> Iterator[psycopg.Connection]:
    """The server started again on ``data_dir`` after the kill, and a connection to it.
    Checked on entry: nothing is published and ``COMMIT WRITES`` publishes the 100 rows
    of the whole COPY; on leaving: the same commit again is a duplicate and the write is
    gone. The server is stopped (SIGTERM) either way."""
    process, port = _serve(data_dir)
    try:
        with _connect(port) as db:
            assert db.execute("SELECT count(*) FROM TOPIC events").fetchone() == (0,)
            assert db.execute("COMMIT WRITES ('w') SINK 's' BATCH 0").fetchone() == (
                "committed", 100)
            yield db
            assert db.execute("COMMIT WRITES ('w') SINK 's' BATCH 0").fetchone() == (
                "duplicate", 0)
            assert not (data_dir / WRITES_DIRECTORY / "w").exists()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)


@pytest.mark.parametrize("framed", [False, True])
def test_a_server_killed_mid_copy_keeps_only_the_whole_copies(tmp_path: Path,
                                                              framed: bool) -> None:  # fmt: skip
    """``framed``: the rows name their partitions, so each COPY is staged as a frames
    file (``storage.staged_frames``), killed while its ``.part`` is written."""
    data_dir = tmp_path / "data"
    process, port = _serve(data_dir)
    columns = "(data, partition)" if framed else ""
    partitions = 2 if framed else None
    try:
        with _connect(port) as db:
            db.execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
            assert stage(db, f"TOPIC events {columns}", "w",
                         arrow_stream(messages(100, partitions=partitions))) == 100  # fmt: skip
            write_dir = data_dir / WRITES_DIRECTORY / "w"
            big = {"data": pa.array([os.urandom(1024)] * 20_000, pa.binary())}
            if framed:
                big["partition"] = pa.array([i % 2 for i in range(20_000)], pa.int32())
            stream = arrow_stream(pa.table(big), max_chunksize=1000)
            copy_sql = f"COPY TOPIC events {columns} FROM STDIN (FORMAT arrow, WRITE_ID 'w')"
            _kill_mid_copy(process, db, copy_sql, stream, write_dir)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    with _restarted(data_dir) as db:
        assert db.execute("SELECT count(*) FROM TOPIC events").fetchone() == (100,)
        if framed:  # every row in the partition it named
            assert db.execute("SELECT count(*) FROM TOPIC events WHERE partition = 0"
                              ).fetchone() == (50,)  # fmt: skip


def test_a_server_killed_mid_frames_copy_keeps_only_the_whole_copies(tmp_path: Path) -> None:
    """``COPY ... (FORMAT frames)`` (a client's partition frames, written as they came:
    ``BulkWrites.append_frames``) killed while its ``.part`` is written: after the restart
    the write holds its whole COPY only, the commit publishes it once, each row in its
    partition."""
    data_dir = tmp_path / "data"
    process, port = _serve(data_dir)
    try:
        with _connect(port) as db:
            db.execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
            first = b"".join(frame(p, wire([b"w%d-%d" % (p, i) for i in range(50)]))
                             for p in (0, 1))  # fmt: skip
            cursor = db.cursor()
            sql = "COPY TOPIC events FROM STDIN (FORMAT frames, WRITE_ID 'w')"
            with cursor.copy(sql) as copy:
                copy.write(first)
            assert cursor.rowcount == 100
            write_dir = data_dir / WRITES_DIRECTORY / "w"
            payload = os.urandom(1024)
            stream = b"".join(frame(i % 2, wire([payload] * 1000)) for i in range(20))
            _kill_mid_copy(process, db, sql, stream, write_dir)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    with _restarted(data_dir) as db:
        assert db.execute("SELECT partition, count(*) FROM TOPIC events GROUP BY partition "
                          "ORDER BY partition").fetchall() == [(0, 50), (1, 50)]  # fmt: skip
