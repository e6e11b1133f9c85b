"""COPY through the wire server with real clients: psycopg 3 ``cursor.copy`` both ways,
psql's ``\\copy``, and a raw socket for protocol errors during COPY IN."""

from __future__ import annotations

import datetime
import io
import os
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path

import psycopg
import psycopg.types.json
import pyarrow as pa
import pytest

from sql.pgwire.codec import copy_format, wire_types
from sql.pgwire.codec import messages as m
from sql.pgwire.codec.copy_binary import BINARY_HEADER, BINARY_TRAILER, BinaryCopyDecoder
from sql.pgwire.codec.copy_format import (
    LINE_COLUMN,
    CharacterNotInRepertoireError,
    CopyDecoder,
    CopyFormat,
    InvalidTextRepresentationError,
    encode_table,
)
from sql.pgwire.connection import commands
from sql.pgwire.connection.copy_statement import parse_copy
from sql.pgwire.limits import ServerLimits
from sql.pgwire.server import ServerThread
from storage.errors import FeatureNotSupportedError, SqlSyntaxError

Connect = Callable[..., psycopg.Connection]


def copy_in(connection: psycopg.Connection, statement: str, data: bytes = b"",
            rows: Sequence[Sequence[object]] = ()) -> int:  # fmt: skip
    cursor = connection.cursor()
    with cursor.copy(statement) as copy:
        if data:
            copy.write(data)
        for row in rows:
            copy.write_row(row)
    return cursor.rowcount


def copy_out(connection: psycopg.Connection, statement: str) -> bytes:
    with connection.cursor().copy(statement) as copy:
        return b"".join(bytes(chunk) for chunk in copy)


@pytest.fixture
def db(connect: Connect) -> psycopg.Connection:
    connection = connect(autocommit=True)
    connection.execute(
        "CREATE TABLE t (a INTEGER, b VARCHAR, c BLOB, d TIMESTAMP, e DECIMAL(10,2))"
    )
    return connection


# -- COPY TO STDOUT -----------------------------------------------------------------------------
def test_copy_table_to_stdout_text_escapes_and_nulls(db: psycopg.Connection) -> None:
    db.execute("INSERT INTO t VALUES (1, 'tab\there\\back', '\\x00\\x01'::BLOB, "
               "TIMESTAMP '2024-01-02 03:04:05', 1.5), (2, NULL, NULL, NULL, NULL)")  # fmt: skip
    data = copy_out(db, "COPY t TO STDOUT")
    assert data == (b"1\ttab\\there\\\\back\t\\\\x0001\t2024-01-02 03:04:05\t1.50\n"
                    b"2\t\\N\t\\N\t\\N\t\\N\n")  # fmt: skip


def test_copy_query_to_stdout_csv_with_header_both_spellings(db: psycopg.Connection) -> None:
    db.execute("INSERT INTO t (a, b) VALUES (1, 'say \"hi\", ok'), (2, ''), (3, NULL)")
    expected = b'a,b\n1,"say ""hi"", ok"\n2,""\n3,\n'
    query = "(SELECT a, b FROM t ORDER BY a)"
    assert copy_out(db, f"COPY {query} TO STDOUT WITH (FORMAT csv, HEADER true)") == expected
    assert copy_out(db, f"COPY {query} TO STDOUT CSV HEADER") == expected
    assert copy_out(db, f"COPY {query} TO STDOUT WITH CSV FORCE QUOTE *").startswith(b'"1",')


def test_copy_table_columns_to_stdout_in_chunks(db: psycopg.Connection) -> None:
    db.execute("INSERT INTO t (a, b) SELECT i, 'row ' || i FROM range(5000) AS r(i)")
    with db.cursor().copy("COPY t (a, b) TO STDOUT") as copy:
        chunks = [bytes(chunk) for chunk in copy]
    assert len(chunks) > 1  # streamed as several CopyData messages, not one
    lines = b"".join(chunks).decode().splitlines()
    assert len(lines) == 5000
    assert lines[4999] == "4999\trow 4999"
    cursor = db.cursor()
    with cursor.copy("COPY t (a) TO STDOUT") as copy:
        data = b"".join(bytes(block) for block in copy)
    assert data.count(b"\n") == 5000
    assert cursor.rowcount == 5000


def test_copy_topic_to_stdout_as_bulk_read(db: psycopg.Connection) -> None:
    db.execute("CREATE TOPIC events")
    db.execute("INSERT INTO TOPIC events (data, message_group_id) VALUES ('a', 'g'), ('b', 'g')")
    data = copy_out(db, "COPY (SELECT \"offset\", data, message_group_id FROM TOPIC events "
                        "WITH (partition = 0)) TO STDOUT (FORMAT csv)")  # fmt: skip
    assert data == b"0,\\x61,g\n1,\\x62,g\n"
    whole = copy_out(db, "COPY TOPIC events TO STDOUT WITH (FORMAT csv, HEADER)")
    assert whole.splitlines()[0] == (b"partition,offset,seq_no,producer_id,message_group_id,"
                                     b"created_at,written_at,codec,data,metadata")  # fmt: skip
    assert len(whole.splitlines()) == 3


def test_copy_to_a_file_or_with_bad_options_is_refused(db: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        db.execute("COPY t TO '/tmp/x.csv'")
    with pytest.raises(psycopg.errors.SyntaxError, match="cannot specify DELIMITER"):
        copy_out(db, "COPY t TO STDOUT (FORMAT binary, DELIMITER ',')")
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="must return rows"):
        copy_out(db, "COPY (INSERT INTO t (a) VALUES (1)) TO STDOUT (FORMAT binary)")
    with pytest.raises(psycopg.errors.SyntaxError, match="not recognized"):
        copy_out(db, "COPY t TO STDOUT (COLOUR red)")
    with pytest.raises(psycopg.errors.UndefinedTable):
        copy_out(db, "COPY missing TO STDOUT")


# -- COPY TO STDOUT in binary -------------------------------------------------------------------
ALL_TYPES = ("CREATE TABLE {name} (bo BOOLEAN, i2 SMALLINT, i4 INTEGER, i8 BIGINT, f4 REAL, "
             "f8 DOUBLE, nu DECIMAL(12,3), tx VARCHAR, bl BLOB, da DATE, ti TIME, ts TIMESTAMP, "
             "tz TIMESTAMPTZ, iv INTERVAL, uu UUID, js JSON)")  # fmt: skip
ALL_TYPE_NAMES = ["bool", "int2", "int4", "int8", "float4", "float8", "numeric", "text", "bytea",
                  "date", "time", "timestamp", "timestamptz", "interval", "uuid", "json"]
ALL_TYPE_ROWS = [
    (True, -2, 2**31 - 1, -(2**62), 1.5, -2.25, Decimal("-12345.678"), "tab\t\\ é", b"\x00\xff",
     datetime.date(2020, 2, 29), datetime.time(23, 59, 58, 123456),
     datetime.datetime(1999, 12, 31, 23, 59, 59, 5),
     datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
     datetime.timedelta(days=3, hours=4, microseconds=7),
     uuid.UUID("12345678-1234-5678-1234-567812345678"), {"a": [1, None]}),
    (False, 0, 0, 0, 0.0, 0.0, Decimal("0.000"), "", b"", datetime.date(1970, 1, 1),
     datetime.time(0, 0), datetime.datetime(2000, 1, 1),
     datetime.datetime(1960, 6, 1, tzinfo=datetime.UTC), datetime.timedelta(0),
     uuid.UUID(int=0), []),
    (None,) * 16,
]  # fmt: skip


def _fill_all_types(db: psycopg.Connection, name: str) -> None:
    db.execute(ALL_TYPES.format(name=name))
    with db.cursor().copy(f"COPY {name} FROM STDIN") as copy:
        for row in ALL_TYPE_ROWS:
            copy.write_row([psycopg.types.json.Json(v) if isinstance(v, dict | list) else v
                            for v in row])  # fmt: skip


def _read_rows(db: psycopg.Connection, statement: str, type_names: list[str]
                      ) -> tuple[list[tuple[object, ...]], int]:  # fmt: skip
    cursor = db.cursor()
    with cursor.copy(statement) as copy:
        copy.set_types(type_names)
        rows = list(iter(copy.read_row, None))
    return rows, cursor.rowcount


def test_binary_copy_to_stdout_every_type_and_nulls(db: psycopg.Connection) -> None:
    _fill_all_types(db, "every")
    for statement in ("COPY every TO STDOUT (FORMAT binary)",
                      "COPY (SELECT * FROM every) TO STDOUT WITH BINARY"):  # fmt: skip
        rows, count = _read_rows(db, statement, ALL_TYPE_NAMES)
        assert count == 3
        assert rows == ALL_TYPE_ROWS
    text_rows, _ = _read_rows(db, "COPY every TO STDOUT", ALL_TYPE_NAMES)
    assert text_rows == ALL_TYPE_ROWS  # one row per CopyData in text too, as read_row needs


def test_binary_copy_to_stdout_bytes_on_the_wire(db: psycopg.Connection) -> None:
    data = copy_out(db, "COPY (SELECT 7::INTEGER AS a, NULL::VARCHAR AS b, 'hi' AS c) "
                        "TO STDOUT (FORMAT binary)")  # fmt: skip
    assert data == (b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)  # signature, header
                    + struct.pack("!h", 3)  # field count
                    + struct.pack("!ii", 4, 7) + struct.pack("!i", -1)  # 7, NULL
                    + struct.pack("!i", 2) + b"hi"
                    + struct.pack("!h", -1))  # trailer  # fmt: skip
    empty = copy_out(db, "COPY (SELECT 1 AS a WHERE false) TO STDOUT (FORMAT binary)")
    assert empty == b"PGCOPY\n\xff\r\n\x00" + struct.pack("!iih", 0, 0, -1)


def test_binary_copy_round_trip_to_and_from_stdin(db: psycopg.Connection) -> None:
    _fill_all_types(db, "source")
    db.execute(ALL_TYPES.format(name="target"))
    db.execute("INSERT INTO source (i4, tx) SELECT i, 'row ' || i FROM range(10, 5010) AS r(i)")
    data = copy_out(db, "COPY source TO STDOUT (FORMAT binary)")
    assert copy_in(db, "COPY target FROM STDIN (FORMAT binary)", data) == 5003
    query = "SELECT * FROM {} ORDER BY i4 NULLS FIRST, bo NULLS FIRST"
    assert db.execute(query.format("target")).fetchall() == \
        db.execute(query.format("source")).fetchall()  # fmt: skip
    assert db.execute("SELECT count(*) FROM target WHERE tx LIKE 'row %'").fetchone() == (5000,)


def test_binary_copy_topic_to_stdout(db: psycopg.Connection) -> None:
    db.execute("CREATE TOPIC events")
    db.execute("INSERT INTO TOPIC events (data, message_group_id) VALUES ('a', 'g'), ('b', NULL)")
    rows, count = _read_rows(
        db, "COPY TOPIC events (data, message_group_id) TO STDOUT (FORMAT binary)",
        ["bytea", "text"])  # fmt: skip
    assert count == 2
    assert sorted(rows) == [(b"a", "g"), (b"b", None)]
    rows, _ = _read_rows(
        db, 'COPY (SELECT "offset", data FROM TOPIC events WITH (partition = 0)) TO STDOUT '
            "(FORMAT binary)", ["int8", "bytea"])  # fmt: skip
    assert [row[1] for row in rows] in ([b"a", b"b"], [b"a"], [b"b"], [])
    assert [row[0] for row in rows] == list(range(len(rows)))


def test_psql_backslash_copy_binary_round_trip(server: ServerThread, tmp_path: Path,
                                               connect: Connect) -> None:  # fmt: skip
    connection = connect(autocommit=True)
    _fill_all_types(connection, "source")
    connection.execute(ALL_TYPES.format(name="target"))
    dump = tmp_path / "dump.bin"
    environment = {**os.environ, "PGCONNECT_TIMEOUT": "10"}
    base = ["/usr/bin/psql", "-X", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p",
            str(server.port), "-U", "tester", "-d", "topicbase"]  # fmt: skip
    for command in (f"\\copy source to '{dump}' with (format binary)",
                    f"\\copy target from '{dump}' with (format binary)"):  # fmt: skip
        ran = subprocess.run([*base, "-c", command], capture_output=True, text=True,
                             timeout=60, env=environment)  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        assert "COPY 3" in ran.stdout
    assert dump.read_bytes().startswith(b"PGCOPY\n\xff\r\n\x00")
    query = "SELECT * FROM {} ORDER BY i4 NULLS FIRST"
    assert connection.execute(query.format("target")).fetchall() == \
        connection.execute(query.format("source")).fetchall()  # fmt: skip


# -- COPY FROM STDIN into tables ------------------------------------------------------------------
def test_copy_rows_from_stdin_with_psycopg_types(db: psycopg.Connection) -> None:
    rows = [
        (1, "tab\tnew\nline\\", b"\x00\xff\\", datetime.datetime(2024, 5, 6, 7, 8, 9),
         Decimal("2.25")),
        (2, None, None, None, None),
        (3, "", b"", datetime.datetime(2000, 1, 1), Decimal("-1")),
    ]  # fmt: skip
    cursor = db.cursor()
    with cursor.copy("COPY t (a, b, c, d, e) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)
    assert cursor.rowcount == 3
    assert db.execute("SELECT * FROM t ORDER BY a").fetchall() == rows


def test_copy_from_stdin_text_escapes_and_custom_null(db: psycopg.Connection) -> None:
    with db.cursor().copy("COPY t (a, b) FROM STDIN WITH (NULL 'nil', DELIMITER '|')") as copy:
        copy.write(b"1|\\101\\x42\\n\\t\\\\\n2|nil\n3|\\N\n\\.\n")
    assert db.execute("SELECT a, b FROM t ORDER BY a").fetchall() == [
        (1, "AB\n\t\\"), (2, None), (3, "N")]  # fmt: skip


def test_copy_from_stdin_csv_quotes_newlines_and_header(db: psycopg.Connection) -> None:
    data = b'a,b\n1,"multi\nline, with ""quotes"""\n2,\n3,""\r\n'
    cursor = db.cursor()
    with cursor.copy("COPY t (a, b) FROM STDIN WITH (FORMAT csv, HEADER MATCH)") as copy:
        copy.write(data[:9])  # a row split across CopyData messages
        copy.write(data[9:])
    assert cursor.rowcount == 3
    assert db.execute("SELECT a, b FROM t ORDER BY a").fetchall() == [
        (1, 'multi\nline, with "quotes"'), (2, None), (3, "")]  # fmt: skip
    with pytest.raises(psycopg.errors.BadCopyFileFormat, match="header"):
        copy_in(db, "COPY t (a, b) FROM STDIN (FORMAT csv, HEADER match)", b"x,y\n4,z\n")


def test_copy_bad_value_is_22p02_with_line_and_writes_nothing(db: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.InvalidTextRepresentation) as caught:
        copy_in(db, "COPY t (a, b) FROM STDIN", b"1\tok\n2\tok\nnot-a-number\tbad\n4\tok\n")
    assert "line 3" in (caught.value.diag.context or "")
    assert "column a" in (caught.value.diag.context or "")
    assert db.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_copy_wrong_column_count_is_22p04_with_line(db: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.BadCopyFileFormat, match="extra data") as caught:
        copy_in(db, "COPY t (a) FROM STDIN", b"1\n2\textra\n")
    assert "line 2" in (caught.value.diag.context or "")
    with pytest.raises(psycopg.errors.BadCopyFileFormat, match='missing data for column "b"'):
        copy_in(db, "COPY t (a, b) FROM STDIN CSV", b"1,x\n2\n")
    assert db.execute("SELECT count(*) FROM t").fetchone() == (0,)
    db.execute("SELECT 1")  # the connection is usable after the failed COPYs


def test_copy_fail_from_client_is_57014_and_writes_nothing(db: psycopg.Connection) -> None:
    # psycopg sends CopyFail and re-raises the client's exception (the raw-socket test
    # below checks the server's 57014 answer).
    with pytest.raises(RuntimeError, match="client gave up"), db.cursor().copy(
        "COPY t (a) FROM STDIN"
    ) as copy:
        copy.write_row([1])
        raise RuntimeError("client gave up")
    assert db.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_copy_joins_the_transaction_and_rolls_back(connect: Connect) -> None:
    connection = connect()
    connection.execute("CREATE TABLE t (a INTEGER)")
    connection.commit()
    with connection.cursor().copy("COPY t FROM STDIN") as copy:  # psycopg sent BEGIN first
        copy.write_row([1])
    assert connection.execute("SELECT count(*) FROM t").fetchone() == (1,)  # seen inside
    connection.rollback()
    assert connection.execute("SELECT count(*) FROM t").fetchone() == (0,)
    with connection.cursor().copy("COPY t FROM STDIN") as copy:
        copy.write_row([2])
    connection.commit()
    assert connection.execute("SELECT a FROM t").fetchall() == [(2,)]


def test_failed_copy_fails_the_open_transaction(connect: Connect) -> None:
    connection = connect()
    connection.execute("CREATE TABLE t (a INTEGER)")
    connection.commit()
    connection.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        copy_in(connection, "COPY t FROM STDIN", b"x\n")
    with pytest.raises(psycopg.errors.InFailedSqlTransaction):
        connection.execute("SELECT 1")
    connection.rollback()
    assert connection.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_copy_unknown_column_is_42703_before_copy_in(db: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.UndefinedColumn):
        copy_in(db, "COPY t (nope) FROM STDIN", rows=[[1]])


# -- COPY FROM STDIN into topics ------------------------------------------------------------------
def test_copy_topic_from_stdin_writes_messages_in_order(db: psycopg.Connection) -> None:
    db.execute("CREATE TOPIC events")
    cursor = db.cursor()
    with cursor.copy("COPY TOPIC events (data, message_group_id, producer_id, seq_no) "
                     "FROM STDIN") as copy:  # fmt: skip
        for index in range(300):
            copy.write_row([f"m{index}".encode(), "g", "p1", index + 1])
        copy.write_row([b"\x00binary\xff", "g", "p1", 1000])
    assert cursor.rowcount == 301
    rows = db.execute("SELECT data, message_group_id, seq_no FROM TOPIC events "
                      "ORDER BY \"offset\"").fetchall()  # fmt: skip
    assert rows[0] == (b"m0", "g", 1)
    assert rows[299] == (b"m299", "g", 300)
    assert rows[300] == (b"\x00binary\xff", "g", 1000)


def test_copy_topic_csv_plain_text_data(db: psycopg.Connection) -> None:
    db.execute("CREATE TOPIC events")
    with db.cursor().copy("COPY TOPIC events (data, metadata) FROM STDIN (FORMAT csv)") as copy:
        copy.write(b'hello,"{""k"": ""v""}"\nworld,\n')
    assert db.execute("SELECT data, metadata FROM TOPIC events ORDER BY \"offset\"").fetchall() == [
        (b"hello", {"k": "v"}), (b"world", None)]  # fmt: skip


def test_copy_topic_in_transaction_rolls_back_and_bad_rows_write_nothing(connect: Connect) -> None:
    admin = connect(autocommit=True)
    admin.execute("CREATE TOPIC events")
    connection = connect()
    with connection.cursor().copy("COPY TOPIC events FROM STDIN") as copy:
        copy.write_row([b"staged"])
    connection.rollback()
    assert admin.execute("SELECT count(*) FROM TOPIC events").fetchone() == (0,)
    with pytest.raises(psycopg.errors.InvalidTextRepresentation) as caught:
        copy_in(admin, "COPY TOPIC events (data, seq_no) FROM STDIN", b"a\t1\nb\tnot-a-number\n")
    assert "line 2" in (caught.value.diag.context or "")
    assert admin.execute("SELECT count(*) FROM TOPIC events").fetchone() == (0,)
    with pytest.raises(psycopg.errors.UndefinedColumn):
        copy_in(admin, "COPY TOPIC events (offset) FROM STDIN", rows=[[1]])
    with pytest.raises(psycopg.errors.UndefinedTable):
        copy_in(admin, "COPY TOPIC missing FROM STDIN", rows=[[b"x"]])


# -- protocol -------------------------------------------------------------------------------
def _message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


class RawClient:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""
        body = struct.pack("!i", m.PROTOCOL_V3) + b"user\0tester\0\0"
        self.sock.sendall(struct.pack("!i", len(body) + 4) + body)
        self.until(b"Z")

    def read(self) -> tuple[bytes, bytes]:
        while len(self.buffer) < 5 or len(self.buffer) < 1 + struct.unpack(
                "!i", self.buffer[1:5])[0]:  # fmt: skip
            chunk = self.sock.recv(65536)
            assert chunk, "connection closed"
            self.buffer += chunk
        length = struct.unpack("!i", self.buffer[1:5])[0]
        kind, body = self.buffer[:1], self.buffer[5 : 1 + length]
        self.buffer = self.buffer[1 + length :]
        return kind, body

    def until(self, kind: bytes) -> list[tuple[bytes, bytes]]:
        got = [self.read()]
        while got[-1][0] != kind:
            got.append(self.read())
        return got

    def query(self, text: str) -> None:
        self.sock.sendall(_message(b"Q", text.encode() + b"\0"))


def test_other_message_during_copy_in_is_08p01_and_nothing_written(server: ServerThread) -> None:
    client = RawClient(server.port)
    client.query("CREATE TABLE t (a INTEGER)")
    client.until(b"Z")
    client.query("COPY t FROM STDIN")
    assert client.until(b"G")[-1][0] == b"G"
    client.sock.sendall(_message(b"d", b"1\n") + _message(b"H") + _message(b"S"))  # ignored
    client.sock.sendall(_message(b"Q", b"SELECT 1\0"))
    got = client.until(b"Z")
    errors = [body for kind, body in got if kind == b"E"]
    assert errors and b"C08P01" in errors[0] and b"unexpected message type 0x51" in errors[0]
    client.sock.sendall(_message(b"d", b"2\n") + _message(b"c"))  # late copy data: ignored
    client.query("SELECT count(*) FROM t")
    rows = [body for kind, body in client.until(b"Z") if kind == b"D"]
    assert rows == [struct.pack("!hi", 1, 1) + b"0"]


def test_copy_done_and_fail_travel_as_raw_messages(server: ServerThread) -> None:
    client = RawClient(server.port)
    client.query("CREATE TABLE t (a INTEGER, b VARCHAR)")
    client.until(b"Z")
    client.query("COPY t FROM STDIN (FORMAT csv)")
    _kind, body = client.until(b"G")[-1]
    assert body == b"\0" + struct.pack("!hhh", 2, 0, 0)  # text, two text columns
    client.sock.sendall(_message(b"d", b"1,a\n2,") + _message(b"d", b"b") + _message(b"c"))
    got = client.until(b"Z")
    assert (b"C", b"COPY 2\0") in got
    client.query("COPY t FROM STDIN")
    client.until(b"G")
    client.sock.sendall(_message(b"d", b"3\tc\n") + _message(b"f", b"stop\0"))
    errors = [body for kind, body in client.until(b"Z") if kind == b"E"]
    assert b"C57014" in errors[0] and b"stop" in errors[0]


def test_client_gone_during_copy_in_writes_nothing_and_server_carries_on(
    server: ServerThread, connect: Connect
) -> None:
    client = RawClient(server.port)
    client.query("CREATE TABLE t (a INTEGER)")
    client.until(b"Z")
    client.query("BEGIN; COPY t FROM STDIN; COMMIT")  # COPY inside a multi-statement Query
    client.until(b"G")
    client.sock.sendall(_message(b"d", b"1\n2\n"))
    client.sock.close()
    other = connect(autocommit=True)
    assert other.execute("SELECT count(*) FROM t").fetchone() == (0,)
    again = RawClient(server.port)
    again.query("BEGIN; COPY t FROM STDIN; COMMIT")
    before = again.until(b"G")
    again.sock.sendall(_message(b"d", b"7\n") + _message(b"c"))
    tags = [body for kind, body in before + again.until(b"Z") if kind == b"C"]
    assert tags == [b"BEGIN\0", b"COPY 1\0", b"COMMIT\0"]
    assert other.execute("SELECT a FROM t").fetchall() == [(7,)]


def test_client_gone_during_copy_out_and_copy_out_with_other_statements(
    server: ServerThread, connect: Connect
) -> None:
    client = RawClient(server.port)
    client.query("CREATE TABLE big AS SELECT range AS i FROM range(300000)")
    client.until(b"Z")
    client.query("COPY big TO STDOUT (FORMAT binary)")
    kind, body = client.read()
    assert kind == b"H" and body[:1] == b"\x01"  # binary CopyOutResponse
    assert client.read()[0] == b"d"
    client.sock.close()  # gone with the COPY half sent
    other = connect(autocommit=True)
    assert other.execute("SELECT count(*) FROM big").fetchone() == (300000,)
    # In one Query: statements before and after a COPY TO on the same session.
    again = RawClient(server.port)
    again.query("SELECT 1; COPY (SELECT i FROM big WHERE i < 3) TO STDOUT; SELECT 2")
    got = again.until(b"Z")
    assert [body for kind, body in got if kind == b"d"] == [b"0\n", b"1\n", b"2\n"]
    assert [body[-1:] for kind, body in got if kind == b"D"] == [b"1", b"2"]
    assert [body for kind, body in got if kind == b"C"] == [b"SELECT 1\0", b"COPY 3\0",
                                                            b"SELECT 1\0"]  # fmt: skip


# -- psql -----------------------------------------------------------------------------------------
def test_psql_backslash_copy_both_ways(server: ServerThread, tmp_path: Path,
                                       connect: Connect) -> None:  # fmt: skip
    connection = connect(autocommit=True)
    connection.execute("CREATE TABLE people (id INTEGER, name VARCHAR)")
    source = tmp_path / "in.csv"
    source.write_text("id,name\n1,Ann\n2,\"O'Brien, Bo\"\n3,\n")
    target = tmp_path / "out.csv"
    environment = {**os.environ, "PGCONNECT_TIMEOUT": "10"}
    base = ["/usr/bin/psql", "-X", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p",
            str(server.port), "-U", "tester", "-d", "topicbase"]  # fmt: skip
    loaded = subprocess.run(
        [*base, "-c", f"\\copy people from '{source}' csv header"],
        capture_output=True, text=True, timeout=60, env=environment)  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr
    assert "COPY 3" in loaded.stdout
    dumped = subprocess.run(
        [*base, "-c", f"\\copy (SELECT * FROM people ORDER BY id) to '{target}' csv header"],
        capture_output=True, text=True, timeout=60, env=environment)  # fmt: skip
    assert dumped.returncode == 0, dumped.stderr
    assert target.read_text() == "id,name\n1,Ann\n2,\"O'Brien, Bo\"\n3,\n"
    piped = subprocess.run([*base, "-c", "COPY people FROM STDIN"], input="4\tDee\n",
                           capture_output=True, text=True, timeout=60, env=environment)  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    assert connection.execute("SELECT name FROM people WHERE id = 4").fetchone() == ("Dee",)


# -- the codecs and the statement, without a server --------------------------------------------
def test_parse_copy_old_and_new_spellings() -> None:
    old = parse_copy("COPY s.t (a, \"B\") FROM STDIN WITH DELIMITER AS ';' NULL '' CSV HEADER")
    assert old.relation == "s.t" and old.columns == ("a", "B") and not old.to_client
    assert old.fmt.csv and old.fmt.header and old.fmt.delimiter == ";" and old.fmt.null == ""
    new = parse_copy("COPY TOPIC ev (data) FROM STDIN (FORMAT csv, QUOTE '''', ESCAPE '\\')")
    assert new.topic == "ev" and new.fmt.quote == "'" and new.fmt.escape == "\\"
    query = parse_copy("COPY (SELECT ')' FROM t) TO STDOUT")
    assert query.query == "SELECT ')' FROM t" and query.to_client
    with pytest.raises(FeatureNotSupportedError, match="only in CSV"):
        parse_copy("COPY t FROM STDIN (QUOTE '\"')")  # QUOTE outside CSV


def test_parse_copy_is_kept_by_text_and_errors_are_not() -> None:
    """A reader's loop sends the same COPY again: the second parse is the kept statement;
    a refused text is refused again (its error is not kept), and a text differing only in
    an option gets its own statement."""
    text = "COPY (SELECT data FROM TOPIC t WITH (consumer = 'c')) TO STDOUT (FORMAT arrow)"
    first = parse_copy(text)
    assert parse_copy(text) is first and first.fmt.arrow and first.to_client
    assert not parse_copy(text.replace("arrow", "binary")).fmt.arrow
    bad = "COPY t FROM STDIN (x_cache_probe)"  # an unknown option: 42601
    for _ in range(2):
        with pytest.raises(SqlSyntaxError):
            parse_copy(bad)
    statements = commands._pieces("COPY t TO STDOUT; SELECT 1")
    assert commands._pieces("COPY t TO STDOUT; SELECT 1") is statements
    assert [text for text, _ in statements] == ["COPY t TO STDOUT", "SELECT 1"]
    assert commands.handles("COPY t TO STDOUT; SELECT 1")
    assert not commands.handles("SELECT 'COPY'")


def test_text_decoder_round_trips_encoder_output() -> None:
    table = pa.table({"a": ["x\ty", None, "\\N", "back\\slash\r\n"], "b": [1, 2, 3, 4]})
    for fmt in (CopyFormat(), CopyFormat(csv=True, delimiter=",", null="")):
        data = b"".join(encode_table(table, fmt, rows_per_chunk=3))
        decoder = CopyDecoder(fmt, ["a", "b"], "t")
        for index in range(0, len(data), 5):  # arbitrary message boundaries
            decoder.feed(data[index : index + 5])
        decoder.finish()
        decoded = decoder.to_arrow()
        assert decoded.column("a").to_pylist() == table.column("a").to_pylist()
        assert decoded.column("b").to_pylist() == ["1", "2", "3", "4"]
        assert decoded.column("__copy_line").to_pylist() == [1, 2, 3, 4]


# -- other clients ----------------------------------------------------------------------------
def test_pg8000_copy_through_the_extended_protocol(server: ServerThread) -> None:
    import pg8000.native

    connection = pg8000.native.Connection("tester", host="127.0.0.1", port=server.port,
                                          database="topicbase", timeout=10)  # fmt: skip
    try:
        connection.run("CREATE TABLE t (a INTEGER, b VARCHAR)")
        connection.run("COPY t FROM STDIN WITH (FORMAT csv)", stream=io.StringIO("1,x\n2,\n"))
        assert connection.run("SELECT a, b FROM t ORDER BY a") == [[1, "x"], [2, None]]
        out = io.StringIO()
        connection.run("COPY t TO STDOUT", stream=out)
        assert out.getvalue() == "1\tx\n2\t\\N\n"
        with pytest.raises(pg8000.native.DatabaseError, match="22P02"):
            connection.run("COPY t FROM STDIN", stream=io.StringIO("oops\tx\n"))
        assert connection.run("SELECT count(*) FROM t") == [[2]]
    finally:
        connection.close()


def test_asyncpg_copy_text_and_csv(server: ServerThread) -> None:
    import asyncio

    import asyncpg

    async def run() -> None:
        connection = await asyncpg.connect(host="127.0.0.1", port=server.port, user="tester",
                                           database="topicbase", ssl=False)  # fmt: skip
        try:
            await connection.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
            status = await connection.copy_to_table("t", source=io.BytesIO(b"1,x\n2,y\n"),
                                                    format="csv")  # fmt: skip
            assert status == "COPY 2"
            out = io.BytesIO()
            await connection.copy_from_query("SELECT * FROM t ORDER BY a", output=out,
                                             format="csv", header=True)  # fmt: skip
            assert out.getvalue() == b"a,b\n1,x\n2,y\n"
            out = io.BytesIO()
            status = await connection.copy_from_table("t", output=out, format="binary")
            assert status == "COPY 2"
            assert out.getvalue() == (
                b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8
                + b"\x00\x02" + b"\x00\x00\x00\x04\x00\x00\x00\x01" + b"\x00\x00\x00\x01x"
                + b"\x00\x02" + b"\x00\x00\x00\x04\x00\x00\x00\x02" + b"\x00\x00\x00\x01y"
                + b"\xff\xff")  # fmt: skip
        finally:
            await connection.close()

    asyncio.run(run())


def test_asyncpg_copy_records_to_table_in_binary(server: ServerThread) -> None:
    import asyncio
    import uuid

    import asyncpg

    rows = [
        (1, "x", b"\x00\x01", datetime.datetime(2024, 1, 2, 3, 4, 5), Decimal("12.34"),
         uuid.UUID(int=5), datetime.date(2020, 2, 29), True, 1.5, 2**40,
         datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)),
        (2, None, None, None, None, None, None, None, None, None, None),
    ]  # fmt: skip

    async def run() -> None:
        connection = await asyncpg.connect(host="127.0.0.1", port=server.port, user="tester",
                                           database="topicbase", ssl=False)  # fmt: skip
        try:
            await connection.execute(
                "CREATE TABLE t (a INTEGER, b VARCHAR, c BLOB, d TIMESTAMP, e DECIMAL(10,2), "
                "f UUID, g DATE, h BOOLEAN, i DOUBLE, j BIGINT, k TIMESTAMPTZ)")  # fmt: skip
            status = await connection.copy_records_to_table("t", records=rows)
            assert status == "COPY 2"
            got = await connection.fetch("SELECT * FROM t ORDER BY a")
            assert [tuple(record) for record in got] == rows
        finally:
            await connection.close()

    asyncio.run(run())


def test_psycopg_binary_copy_into_a_topic(db: psycopg.Connection) -> None:
    db.execute("CREATE TOPIC events")
    cursor = db.cursor()
    with cursor.copy("COPY TOPIC events (data, message_group_id, seq_no, producer_id) "
                     "FROM STDIN (FORMAT binary)") as copy:  # fmt: skip
        copy.set_types(["bytea", "text", "int8", "text"])
        for index in range(5):
            copy.write_row([bytes([index, 255]), "g", index + 1, "p"])
    assert cursor.rowcount == 5
    rows = db.execute("SELECT data, seq_no FROM TOPIC events ORDER BY \"offset\"").fetchall()
    assert rows == [(bytes([index, 255]), index + 1) for index in range(5)]


def test_bad_binary_copy_data_is_refused_and_writes_nothing(db: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.BadCopyFileFormat, match="signature"):
        copy_in(db, "COPY t (a) FROM STDIN (FORMAT binary)", b"NOTPGCOPY\n\xff\r\n\x00" * 2)
    header = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
    one_row = struct.pack("!hi", 1, 4) + struct.pack("!i", 7)
    wrong_count = struct.pack("!hi", 2, 4) + struct.pack("!i", 8) + struct.pack("!i", -1)
    with pytest.raises(psycopg.errors.BadCopyFileFormat, match="field count is 2") as caught:
        copy_in(db, "COPY t (a) FROM STDIN (FORMAT binary)",
                header + one_row + wrong_count + struct.pack("!h", -1))  # fmt: skip
    assert "line 2" in (caught.value.diag.context or "")
    with pytest.raises(psycopg.errors.BadCopyFileFormat, match="EOF"):
        copy_in(db, "COPY t (a) FROM STDIN (FORMAT binary)", header + one_row)  # no trailer
    with pytest.raises(psycopg.errors.SyntaxError, match="DELIMITER"):
        copy_in(db, "COPY t (a) FROM STDIN (FORMAT binary, DELIMITER ',')")
    assert db.execute("SELECT count(*) FROM t").fetchone() == (0,)
    copy_in(db, "COPY t (a) FROM STDIN (FORMAT binary)",
            header + one_row + struct.pack("!h", -1))  # fmt: skip
    assert db.execute("SELECT a FROM t").fetchall() == [(7,)]


def test_text_decoder_slow_path_cases() -> None:
    decoder = CopyDecoder(CopyFormat(), ["a", "b"], "t", frozenset([1]))
    decoder.feed(b"\\.x\t\\\\x0aff\nplain\t\\\\001\\\\\\\\raw\r\n")
    decoder.finish()
    table = decoder.to_arrow()
    assert table.column("a").to_pylist() == [".x", "plain"]
    assert table.column("b").to_pylist() == [b"\n\xff", b"\x01\\raw"]
    bad_utf8 = CopyDecoder(CopyFormat(), ["a"], "t")
    with pytest.raises(CharacterNotInRepertoireError) as caught:
        bad_utf8.feed(b"ok\n\xff\xfe\n")
    assert caught.value.context["where"] == "COPY t, line 2"
    bad_hex = CopyDecoder(CopyFormat(), ["a"], "t", frozenset([0]))
    with pytest.raises(InvalidTextRepresentationError, match="bytea"):
        bad_hex.feed(b"\\\\x0g\n")


# -- the result limit applies to each batch held, not to the whole COPY ------------------------
def test_copy_to_is_streamed_within_the_result_limit(tmp_path: Path) -> None:
    limits = ServerLimits(result_bytes_max=1_000_000)
    running = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0, limits=limits)
    try:
        with psycopg.connect(host="127.0.0.1", port=running.port, user="tester",
                             connect_timeout=10, autocommit=True) as connection:  # fmt: skip
            connection.execute("CREATE TABLE wide AS SELECT range AS i, repeat('x', 40) || "
                               "range AS s FROM range(100000)")  # fmt: skip
            with pytest.raises(psycopg.errors.ProgramLimitExceeded):  # ~6 MB held whole
                connection.execute("SELECT * FROM wide WHERE i >= %s", (0,)).fetchall()
            # The simple protocol streams the same query batch by batch: all of it arrives.
            assert len(connection.execute("SELECT * FROM wide").fetchall()) == 100000
            lines = copy_out(connection, "COPY wide TO STDOUT").splitlines()
            assert len(lines) == 100000 and lines[-1] == b"99999\t" + b"x" * 40 + b"99999"
            rows, count = _read_rows(
                connection, "COPY (SELECT i FROM wide WHERE i % 1000 = 0 ORDER BY i) TO "
                "STDOUT (FORMAT binary)", ["int8"])  # fmt: skip
            assert count == 100 and rows == [(i * 1000,) for i in range(100)]
            # One batch (8192 rows of 300 bytes) over the limit: 54000, mid-COPY.
            with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="batch"):
                copy_out(connection, "COPY (SELECT repeat('y', 300) AS s FROM range(10000)) "
                                     "TO STDOUT")  # fmt: skip
            # The session carries on: the failed COPY's DuckDB result was closed.
            assert connection.execute("SELECT count(*) FROM wide").fetchone() == (100000,)
            assert copy_out(connection, "COPY (SELECT 1 AS a) TO STDOUT") == b"1\n"
    finally:
        running.stop()


def test_copy_and_cursor_over_a_topic_named_as_a_plain_relation(db: psycopg.Connection) -> None:
    """The batched read plans as the engine does: a plain ``FROM name`` of a topic reads it."""
    db.execute("CREATE TOPIC plain_events")
    db.execute("INSERT INTO TOPIC plain_events (data) VALUES ('a'), ('b')")
    query = "SELECT CAST(data AS VARCHAR) AS d FROM plain_events ORDER BY d"
    assert copy_out(db, f"COPY ({query}) TO STDOUT") == b"a\nb\n"
    db.execute(f"DECLARE held CURSOR WITH HOLD FOR {query}")
    assert db.execute("FETCH ALL FROM held").fetchall() == [("a",), ("b",)]
    db.execute("CREATE TABLE plain_events (d VARCHAR)")  # a table of the same name wins
    db.execute("INSERT INTO plain_events VALUES ('t')")
    assert copy_out(db, "COPY (SELECT d FROM plain_events) TO STDOUT") == b"t\n"


def test_both_decoders_keep_rows_in_order_across_arrow_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shared row buffer: rows become Arrow every ``ARROW_CHUNK_ROWS`` (3 here)."""
    monkeypatch.setattr(copy_format, "ARROW_CHUNK_ROWS", 3)
    text = CopyDecoder(CopyFormat(), ["a", "b"], "t", frozenset({1}))
    for index in range(10):
        text.feed(f"{index}\t\\\\x0{index}\n".encode())
    text.finish()
    assert text.row_count == 10 and len(text._chunks) == 3  # 3 chunks of 3, 1 row held
    table = text.to_arrow()
    assert table.column("a").to_pylist() == [str(i) for i in range(10)]
    assert table.column("b").to_pylist() == [bytes([i]) for i in range(10)]
    assert table.column(LINE_COLUMN).to_pylist() == list(range(1, 11))
    binary = BinaryCopyDecoder([wire_types.INT4, wire_types.DATE], ["a", "d"], "t")
    binary.feed(BINARY_HEADER)
    for index in range(7):
        binary.feed(struct.pack("!hiiii", 2, 4, index, 4, index))
    binary.feed(BINARY_TRAILER)
    binary.finish()
    assert binary.row_count == 7 and len(binary._chunks) == 2
    table = binary.to_arrow()
    assert table.column("a").to_pylist() == list(range(7))
    assert table.column("d").to_pylist() == [datetime.date(2000, 1, 1 + i) for i in range(7)]
    assert table.column(LINE_COLUMN).to_pylist() == list(range(1, 8))


def test_statement_timeout_cancels_a_batched_copy_and_declare(connect: Connect) -> None:
    connection = connect(autocommit=True)
    slow = "SELECT sum(a.range * b.range) AS s FROM range(200000) a, range(200000) b"
    connection.execute("SET statement_timeout = '300ms'")
    with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
        copy_out(connection, f"COPY ({slow}) TO STDOUT (FORMAT binary)")
    with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
        connection.execute(f"DECLARE late CURSOR WITH HOLD FOR {slow}")
    assert copy_out(connection, "COPY (SELECT 1 AS a) TO STDOUT") == b"1\n"  # carries on
    connection.execute("SET statement_timeout = 0")
    assert copy_out(connection, "COPY (SELECT 2 AS a) TO STDOUT") == b"2\n"


def test_copy_to_and_declare_check_the_transaction_duration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The streamed path reads DuckDB itself; it refuses a transaction open too long, as
    every statement through the engine does (54000, the transaction rolled back)."""
    from storage import limits as storage_limits

    running = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0)
    try:
        with psycopg.connect(host="127.0.0.1", port=running.port, user="tester",
                             connect_timeout=10) as connection:  # fmt: skip
            connection.execute("CREATE TABLE t AS SELECT range AS i FROM range(3)")
            connection.commit()
            monkeypatch.setattr(storage_limits, "TRANSACTION_DURATION_MS_MAX", 50)
            for statement in ("COPY (SELECT i FROM t) TO STDOUT",
                              "DECLARE c CURSOR FOR SELECT i FROM t"):  # fmt: skip
                connection.execute("SELECT 1")  # opens the transaction
                time.sleep(0.2)
                with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="rolled back"):
                    if statement.startswith("COPY"):
                        copy_out(connection, statement)
                    else:
                        connection.execute(statement)
                connection.rollback()
            monkeypatch.undo()
            assert copy_out(connection, "COPY (SELECT i FROM t ORDER BY i) TO STDOUT") == (
                b"0\n1\n2\n"
            )
    finally:
        running.stop()
