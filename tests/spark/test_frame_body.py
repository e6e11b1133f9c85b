"""The JVM writer's staged frames (``WireFrames``), whose bodies are laid out by hand around
each partition's pending data since round 19 (``FrameBody.java``: the messages' bytes go
from the pending array to the socket, not through Arrow vectors and a serialized copy).

``tests/spark/java/.../FrameBodyCheck.java`` runs rows through the writer and compares each
body, byte for byte, with the body the writer made before (the rows in a
``VectorSchemaRoot`` of the wire schema, then Arrow's ``VectorUnloader`` and
``MessageSerializer``); here the same frames are then read as the server reads them
(``staged_frames.read_incoming`` + ``check_incoming``: CRC-32C, the wire layout, every
buffer validated) and by pyarrow, row for row against the rows the check wrote."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pyspark

from spark_sql_ext.build_jar import build
from storage.column_codec import compressed_values
from storage.staged_frames import check_incoming, read_incoming

HERE = Path(__file__).resolve().parent
CHECK = HERE / "java" / "io" / "topicbase" / "spark" / "FrameBodyCheck.java"
CREATED_BASE = 1_700_000_000_000_000
# (rows, partitions, longest data + 1, codec) of each case, as FrameBodyCheck.main writes them
CASES = [(9001, 3, 2048, "raw"), (9001, 3, 2048, "zstd"), (700, 2, 300, "raw"),
         (20000, 2, 40, "raw"), (6000, 60, 2048, "raw"), (40, 2, 100, "raw"),
         (9001, 3, 2048, "column"), (40, 2, 100, "column")]  # fmt: skip


def _rows(count: int, partitions: int, longest: int) -> list[tuple[bytes, int, int | None, int]]:
    """FrameBodyCheck.rows: (data, partition, seq_no, created_at µs) of each row."""
    rows = []
    for i in range(count):
        length = (i * 2654435761) % longest
        digits = str(i).encode()
        data = bytes(digits[b] if b < len(digits) else ord("a") + (i + b // 64) % 26
                     for b in range(length))  # fmt: skip
        rows.append((data, i * 7 % partitions, None if i % 5 == 0 else i,
                     CREATED_BASE + 1000 * i))  # fmt: skip
    return rows


def _run_check(out: Path) -> str:
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")
    classpath = os.pathsep.join([jars, build()])
    classes = out / "classes"
    subprocess.run(["javac", "--release", "17", "-nowarn", "-cp", classpath, "-d",
                    str(classes), str(CHECK)], check=True, timeout=300)  # fmt: skip
    done = subprocess.run(["java", "-ea", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                           "--add-opens=java.base/java.nio=ALL-UNNAMED", "-cp",
                           os.pathsep.join([classpath, str(classes)]),
                           "io.topicbase.spark.FrameBodyCheck", str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout


def test_the_frames_bodies_are_the_old_paths_byte_for_byte_and_read_back_equal(
        tmp_path) -> None:  # fmt: skip
    """Raw and zstd messages, Spark's UnsafeRows and other rows, null and given seq_no,
    empty messages to one of 5 MB, frames cut by count (4,096) and by bytes (4 MiB), 60
    partitions (frames sent early by the pending bound): every body equal to the old
    path's (the Java side), every frame accepted by the server's check, every row read
    back by pyarrow in its partition's order."""
    printed = _run_check(tmp_path)
    assert printed.splitlines()[-1] == "frames 85 rows 53785"
    for case, (count, partitions, longest, codec) in enumerate(CASES):
        expected = _rows(count, partitions, longest)
        if case in (5, 7):
            expected.insert(20, (b"q" * 5_000_000, 1, 7, CREATED_BASE))
        got: dict[int, list[tuple[bytes, int | None, int]]] = {}
        with open(tmp_path / f"{case}.frames", "rb") as stream:
            for frame, body in read_incoming(stream.read):
                batch = check_incoming(frame, body, zstd=codec == "zstd", raw=codec != "zstd")
                assert set(batch.column(4).to_pylist()) == {4 if codec == "zstd" else 1}
                packed = compressed_values(body)  # the data column compressed whole (text)
                assert (packed is not None and packed.compressed) == (codec == "column")
                assert batch.column(1).null_count == batch.column(2).null_count == len(batch)
                assert batch.column(6).null_count == len(batch)
                columns = (batch.column(5).to_pylist(), batch.column(0).to_pylist(),
                           batch.column(3).cast(pa.int64()).to_pylist())  # fmt: skip
                for data, seq, at in zip(*columns, strict=True):
                    got.setdefault(frame.partition, []).append((data, seq, at))
        want: dict[int, list[tuple[bytes, int | None, int]]] = {}
        for data, partition, seq, at in expected:
            want.setdefault(partition, []).append((data, seq, at))
        assert sorted(got) == sorted(want), case
        for partition, rows in want.items():
            mine = got[partition]
            assert [(s, a) for _, s, a in mine] == [(s, a) for _, s, a in rows], case
            for (sent, _, _), (data, _, _) in zip(mine, rows, strict=True):
                if codec == "zstd":
                    sent = pa.decompress(sent, decompressed_size=len(data), codec="zstd",
                                         asbytes=True)  # fmt: skip
                assert sent == data, (case, partition)
