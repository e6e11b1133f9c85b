"""A client's Arrow IPC stream with compressed bodies is checked before pyarrow decodes it
(``sql.pgwire.codec.ipc_bounds``; review R1 round 22: 16 KiB of zstd declaring 512 MiB raised
the server's peak RSS by 1.5 GiB before the 54000).

Both COPY paths are covered with psycopg against the real server: ``COPY t FROM STDIN
(FORMAT arrow)`` (held whole, then read) and ``... WRITE_ID 'w'`` (streamed through the
staging pipe). Over the limit: 54000 and the peak RSS of this process (server and client
both: the peak is reset just before the COPY, the payload is built before) grows by less
than 200 MiB; malformed: 22P04. Nothing is written or staged after a refusal, and the
connection stays usable. Compressed streams within the limits round-trip.
"""

from __future__ import annotations

import io
import os
import re
import struct
from collections.abc import Callable

import psycopg
import pyarrow as pa
import pytest

from sql.pgwire.codec import copy_arrow, ipc_bounds
from sql.pgwire.codec.copy_format import BadCopyFormatError
from sql.pgwire.server import ServerThread
from storage import limits
from storage.errors import LimitExceededError
from tests.pgwire.test_copy_staged import staged_ids

Connect = Callable[..., psycopg.Connection]
MIB = 1 << 20
GROWTH_MAX_MIB = 200


def stream(values: list[bytes], codec: str | None) -> bytes:
    table = pa.table({"data": pa.array(values, pa.binary())})
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def peak_mib() -> int:
    with open("/proc/self/status") as status:
        found = re.search(r"VmHWM:\s+(\d+) kB", status.read())
    assert found is not None
    return int(found.group(1)) >> 10


def reset_peak() -> int:
    with open("/proc/self/clear_refs", "w") as handle:  # 5: reset the peak RSS (Linux)
        handle.write("5")
    return peak_mib()


def with_prefix(data: bytes, declared: int, new: int) -> bytes:
    """``data`` with the data buffer's 8-byte uncompressed-length prefix ``declared`` set to
    ``new`` (the last buffer of the body: the offsets buffer before it may hold the same
    bytes, stored as they are)."""
    at = data.rfind(struct.pack("<q", declared))
    assert at > 0
    return data[:at] + struct.pack("<q", new) + data[at + 8 :]


def batch_metadata(data: bytes) -> tuple[int, int]:
    """(start, end) of the record batch message's metadata (the stream's second message)."""
    schema_length = struct.unpack_from("<i", data, 4)[0]
    at = 8 + schema_length + pa.ipc.read_message(data).body.size
    length = struct.unpack_from("<i", data, at + 4)[0]
    return at + 8, at + 8 + length


def copy_in(connection: psycopg.Connection, data: bytes, write_id: str | None = None) -> int:
    """``COPY TOPIC t FROM STDIN (FORMAT arrow)`` of ``data``, staged under ``write_id``."""
    staged = "" if write_id is None else f", WRITE_ID '{write_id}'"
    cursor = connection.cursor()
    with cursor.copy(f"COPY TOPIC t FROM STDIN (FORMAT arrow{staged})") as copy:
        for start in range(0, len(data), 65536):
            copy.write(data[start : start + 65536])
    return cursor.rowcount


@pytest.fixture
def db(connect: Connect) -> psycopg.Connection:
    connection = connect(autocommit=True)
    connection.execute("CREATE TOPIC t")
    return connection


# -- the check alone ----------------------------------------------------------------------
@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_bomb_is_refused_before_anything_is_decoded(codec: str) -> None:
    size = limits.BATCH_BYTES_MAX + MIB
    data = stream([bytes(size)], codec)
    assert len(data) < size // 100  # the amplification the check is about
    before = reset_peak()
    for check in (lambda: ipc_bounds.check_stream(data, ipc_bounds.Bounds()),
                  lambda: pa.ipc.open_stream(ipc_bounds.CheckedStream(
                      io.BytesIO(data), ipc_bounds.Bounds())).read_all()):  # fmt: skip
        with pytest.raises(LimitExceededError, match="declares"):
            check()
    assert peak_mib() - before < GROWTH_MAX_MIB


def test_the_stream_total_counts_declared_sizes() -> None:
    data = stream([bytes(4 * MIB)], "zstd")
    with pytest.raises(LimitExceededError, match="decodes to more than"):
        ipc_bounds.check_stream(data, ipc_bounds.Bounds(total_bytes_max=2 * MIB))
    ipc_bounds.check_stream(data, ipc_bounds.Bounds(total_bytes_max=5 * MIB))


def test_malformed_compressed_buffers_are_refused_as_not_arrow() -> None:
    size = 100_003  # a length found once in the stream: the data buffer's prefix
    data = stream([bytes(size)], "zstd")
    start, end = batch_metadata(data)
    metadata = data[start:end]
    cases = {"declares -2 bytes": with_prefix(data, size, -2)}
    # The buffers vector: its count (3: validity, offsets, data) and (offset, length) pairs.
    found = re.search(rb"\x03\x00\x00\x00" + b"\x00" * 16 + rb"\x00{8}(.{8})(.{8})(.{8})",
                      metadata, re.DOTALL)  # fmt: skip
    assert found is not None
    offsets_length = struct.unpack("<q", found.group(1))[0]
    data_offset, _ = struct.unpack("<qq", found.group(2) + found.group(3))
    assert offsets_length > 8 and data_offset >= offsets_length
    short = found.start(1)
    cases["has no 8-byte length prefix"] = (
        data[: start + short] + struct.pack("<q", 4) + data[start + short + 8 :]
    )
    outside = found.start(3)
    cases["outside its body"] = (
        data[: start + outside] + struct.pack("<q", 1 << 40) + data[start + outside + 8 :]
    )
    table = ipc_bounds._Table(memoryview(metadata), struct.unpack_from("<I", metadata)[0],
                              BadCopyFormatError)  # fmt: skip
    compression = table.table(2).table(3)  # Message.header, RecordBatch.compression
    codec_at = compression._field(0)
    assert metadata[codec_at] == 1
    cases["unknown body compression"] = (
        data[: start + codec_at] + b"\x07" + data[start + codec_at + 1 :]
    )
    for why, bad in cases.items():
        with pytest.raises(BadCopyFormatError, match=why):
            ipc_bounds.check_stream(bad, ipc_bounds.Bounds())
        with pytest.raises(BadCopyFormatError, match=why):
            checked = ipc_bounds.CheckedStream(io.BytesIO(bad), ipc_bounds.Bounds())
            pa.ipc.open_stream(checked).read_all()


# -- through the server ---------------------------------------------------------------------
def test_a_bomb_through_copy_is_54000_and_bounded(db: psycopg.Connection) -> None:
    data = stream([bytes(512 * MIB)], "zstd")
    before = reset_peak()
    with pytest.raises(psycopg.Error) as refused:
        copy_in(db, data)
    assert refused.value.sqlstate == "54000"
    assert peak_mib() - before < GROWTH_MAX_MIB
    assert db.execute("SELECT count(*) FROM TOPIC t").fetchone() == (0,)


def test_a_bomb_through_a_staged_copy_is_54000_bounded_and_stages_nothing(
        db: psycopg.Connection, server: ServerThread) -> None:  # fmt: skip
    data = stream([bytes(512 * MIB)], "lz4")
    before = reset_peak()
    with pytest.raises(psycopg.Error) as refused:
        copy_in(db, data, "w1")
    assert refused.value.sqlstate == "54000"
    assert peak_mib() - before < GROWTH_MAX_MIB
    assert staged_ids(server) == []


def test_a_malformed_stream_is_22p04_and_stages_nothing(db: psycopg.Connection,
                                                       server: ServerThread) -> None:  # fmt: skip
    size = 100_003
    bad = with_prefix(stream([bytes(size)], "zstd"), size, -5)
    for write_id in (None, "w2"):
        with pytest.raises(psycopg.Error) as refused:
            copy_in(db, bad, write_id)
        assert refused.value.sqlstate == "22P04"
    cut = stream([bytes(size)], "zstd")[:-20]  # ends inside the body
    with pytest.raises(psycopg.Error) as refused:
        copy_in(db, cut, "w3")
    assert refused.value.sqlstate == "22P04"
    assert staged_ids(server) == []
    assert db.execute("SELECT count(*) FROM TOPIC t").fetchone() == (0,)


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_compressed_uploads_within_the_limits_round_trip(db: psycopg.Connection,
                                                         codec: str) -> None:  # fmt: skip
    values = [os.urandom(100) + bytes(5000) for _ in range(200)]
    assert copy_in(db, stream(values, codec)) == 200
    assert copy_in(db, stream(values, codec), "ok") == 200
    db.execute("COMMIT WRITES ('ok') SINK 's' BATCH 1")
    got = [row[0] for row in db.execute('SELECT data FROM TOPIC t ORDER BY "offset"')]
    assert got == values + values


# -- dictionary columns, cast plain after decoding --------------------------------------------
def dictionary_stream(rows: int, value_bytes: int) -> bytes:
    value = pa.array([bytes(value_bytes)], pa.binary())
    column = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), value)
    table = pa.table({"data": column})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_plain_bytes_bounds_what_the_cast_makes() -> None:
    words = pa.array([b"a" * 10, b"bb" * 100, None], pa.binary())
    indices = pa.array([0, 1, 1, None, 2, 0], pa.int32())
    flat = pa.DictionaryArray.from_arrays(indices, words)
    listed = pa.ListArray.from_arrays(pa.array([0, 2, 6], pa.int32()), flat)
    nested = pa.StructArray.from_arrays([listed, pa.array(range(2))], ["l", "n"])
    numbers = pa.DictionaryArray.from_arrays(indices, pa.array([1.5, 2.5, 3.5]))
    for array in (flat, listed, nested, numbers):
        plain = array.cast(copy_arrow.plain_type(array.type))
        assert ipc_bounds.plain_bytes(array) >= plain.nbytes - 8 * (len(array) + 1)
        assert ipc_bounds.plain_bytes(array) <= plain.nbytes + 16 * (len(flat) + 1)


@pytest.mark.parametrize("write_id", [None, "wd"])
def test_a_dictionary_bomb_is_54000_before_the_cast(db: psycopg.Connection, server: ServerThread,
                                                    write_id: str | None) -> None:  # fmt: skip
    data = dictionary_stream(1000, MIB)  # 1 MiB sent, 1000 MiB once plain
    before = reset_peak()
    with pytest.raises(psycopg.Error) as refused:
        copy_in(db, data, write_id)
    assert refused.value.sqlstate == "54000"
    assert "dictionary-encoded" in str(refused.value)
    assert peak_mib() - before < GROWTH_MAX_MIB
    assert staged_ids(server) == []
    assert db.execute("SELECT count(*) FROM TOPIC t").fetchone() == (0,)


def test_dictionary_uploads_within_the_limits_round_trip(db: psycopg.Connection) -> None:
    assert copy_in(db, dictionary_stream(50, 1000)) == 50
    assert copy_in(db, dictionary_stream(50, 1000), "okd") == 50
    db.execute("COMMIT WRITES ('okd') SINK 'd' BATCH 1")
    got = [row[0] for row in db.execute('SELECT data FROM TOPIC t ORDER BY "offset"')]
    assert got == [bytes(1000)] * 100
