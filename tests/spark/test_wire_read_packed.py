"""The JVM's wire read of frames stored with their data column compressed whole (the JVM
writer's default on compressible rows, ``storage.column_codec``): when the server announces
``topicbase_copy_compression``, the reader asks for ``COPY ... (FORMAT arrow, COMPRESSION
zstd)``, the server sends such frames as stored (``engine.packed_read``) and the JVM's Arrow
reader decompresses them. Without the announcement (an older server) nothing is asked and
every batch is plain; a compressed batch the reader did not ask for fails the read.
"""

from __future__ import annotations

import struct

import pytest
import zstandard

from engine import bulk_read
from sql.pgwire.codec import ipc_views
from sql.pgwire.connection import connection as wire_connection
from sql.pgwire.connection import copy_arrow as wire_copy_arrow
from tests.spark.conftest import sql_rows
from tests.spark.test_wire_read import (
    _catalog,
    _Wire,
    certificate,  # noqa: F401  (a fixture)
)

ROWS = 9000


@pytest.fixture
def packed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of each frame the server sent packed (as stored)."""
    sent: list[int] = []
    original = bulk_read.packed_slice

    def counting(*args, **kwargs):
        found = original(*args, **kwargs)
        if found is not None:
            sent.append(found.num_rows)
        return found

    monkeypatch.setattr(bulk_read, "packed_slice", counting)
    return sent


def _written(spark, database, wire: _Wire, url: str) -> str:
    """``ROWS`` compressible rows written with ``frameCodec=column`` into topic ``events``
    (2 partitions) through a wire catalog; the catalog's name."""
    session = database.connect()
    session.execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
    session.close()
    tb = _catalog(spark, url, wire)
    frame = spark.range(0, ROWS, numPartitions=2).selectExpr(
        "CAST(concat(lpad(CAST(id AS STRING), 8, '0'), repeat('y', 1016)) AS BINARY) AS data",
        "CAST(id % 2 AS INT) AS partition", "id AS seq_no")  # fmt: skip
    frame.writeTo(f"{tb}.main.events").option("frameCodec", "column").append()
    return tb


def _check_reads(spark, database, tb: str) -> None:
    """Every column, and the bench's two scans, as the SQL read gives them."""
    expected = sorted((r["partition"], r["offset"], r["seq_no"], r["codec"], r["data"])
                      for r in sql_rows(database, "SELECT * FROM TOPIC events"))  # fmt: skip
    got = sorted((r.partition, r.offset, r.seq_no, r.codec, bytes(r.data))
                 for r in spark.table(f"{tb}.main.events").collect())  # fmt: skip
    assert len(got) == ROWS and got == expected
    assert {row[4] for row in got} == {f"{i:08d}".encode() + b"y" * 1016 for i in range(ROWS)}
    frame = spark.table(f"{tb}.main.events")
    assert frame.selectExpr("sum(length(data))").collect()[0][0] == ROWS * 1024
    counts = sorted(tuple(r) for r in frame.groupBy("partition").count().collect())
    assert counts == [(0, ROWS // 2), (1, ROWS // 2)]


def test_compressed_frames_come_as_stored_and_the_jvm_decodes_them(
        spark, database, url, packed) -> None:  # fmt: skip
    wire = _Wire(database)
    try:
        tb = _written(spark, database, wire, url)
        _check_reads(spark, database, tb)
    finally:
        wire.stop()
    # every frame of both reads of data went as stored: whole partitions, whole frames
    assert packed and sum(packed) == 2 * ROWS


def test_over_tls_compressed_frames_come_as_stored_too(
        spark, database, url, certificate, packed) -> None:  # noqa: F811  # fmt: skip
    """The TLS connection reads payloads through its transfer array, not the socket
    channel: the compressed batches are decoded the same."""
    plain = _Wire(database)
    try:
        _written(spark, database, plain, url)
    finally:
        plain.stop()
    cert, key = certificate
    tls = _Wire(database, tls_cert=cert, tls_key=key)
    try:
        tb = _catalog(spark, url, tls, sslmode="verify-full", sslrootcert=cert)
        packed.clear()
        _check_reads(spark, database, tb)
    finally:
        tls.stop()
    assert sum(packed) == 2 * ROWS


def test_a_server_that_does_not_announce_it_is_not_asked(
        spark, database, url, packed, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(wire_connection, "COPY_COMPRESSION_PARAMETER", "topicbase_other")
    wire = _Wire(database)
    try:
        tb = _written(spark, database, wire, url)
        _check_reads(spark, database, tb)
    finally:
        wire.stop()
    assert packed == []  # no COPY asked for COMPRESSION: every batch plain


def test_a_compressed_batch_the_reader_did_not_ask_for_fails_the_read(
        spark, database, url, packed, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A server that sends body-compressed batches unasked (not Topicbase's: this one is
    made to) fails the task: Arrow's reader without a codec refuses them."""
    monkeypatch.setattr(wire_connection, "COPY_COMPRESSION_PARAMETER", "topicbase_other")
    original = wire_copy_arrow.copy_arrow_to_client

    async def always_packed(context, statement, packed=False):
        return await original(context, statement, True)

    monkeypatch.setattr(wire_copy_arrow, "copy_arrow_to_client", always_packed)
    wire = _Wire(database)
    try:
        tb = _written(spark, database, wire, url)
        with pytest.raises(Exception, match=r"(?i)compress"):
            spark.table(f"{tb}.main.events").selectExpr("sum(length(data))").collect()
    finally:
        wire.stop()
    assert packed


def test_a_buffer_declaring_more_than_a_frame_may_hold_is_refused_by_the_jvm(
        spark, database, url, packed, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Arrow's zstd codec allocates what a buffer declares, then decompresses into it: a
    server (not Topicbase's: this one is made to) sending 64 MiB of zeros as ~2 KB of zstd
    would have the task allocate and fill 64 MiB a batch. The reader refuses a buffer that
    declares more than a stored frame may (16 MiB) before decoding it."""
    bomb = struct.pack("<q", 64 << 20) + zstandard.ZstdCompressor().compress(bytes(64 << 20))
    original = ipc_views.packed_views

    def bombed(rows, nodes, buffers):
        swapped = [bomb if len(b) >= 8 and struct.unpack_from("<q", b)[0] != -1 else b
                   for b in buffers]  # fmt: skip
        return original(rows, nodes, swapped)

    monkeypatch.setattr(ipc_views, "packed_views", bombed)
    wire = _Wire(database)
    try:
        tb = _written(spark, database, wire, url)
        with pytest.raises(Exception, match=r"declares 67108864 decoded bytes"):
            spark.table(f"{tb}.main.events").selectExpr("sum(length(data))").collect()
    finally:
        wire.stop()
    assert packed
