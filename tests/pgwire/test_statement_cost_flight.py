"""A prepared statement's flight (Bind/Describe/Execute/Sync) without repeated work
(issue 14, docs/statement_cost.md "Round 6 (wire)"): the PostgreSQL surface classifies a
text once (``surface._goes_unchanged``), the flight's messages are taken from the
reader's buffer with the same length checks, and the parsers of Bind, Describe, Execute
and Close answer hostile bytes with the same errors as field-by-field reading."""

from __future__ import annotations

import re
import struct
from typing import Any

import pytest

from sql.pgwire.codec import messages as m
from sql.pgwire.emulation import surface


class _CountingPattern:
    """A compiled pattern that counts its ``match`` calls."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern
        self.texts: list[str] = []

    def match(self, text: str, *arguments: Any) -> re.Match[str] | None:
        self.texts.append(text)
        return self.pattern.match(text, *arguments)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pattern, name)


def test_a_repeated_statement_is_classified_once(connect, monkeypatch) -> None:
    counting = _CountingPattern(surface._SESSION_COMMAND)
    monkeypatch.setattr(surface, "_SESSION_COMMAND", counting)
    surface._unchanged.clear()
    conn = connect(autocommit=True)
    text = "SELECT 40 + %s::INTEGER AS answer"
    for value in range(12):  # psycopg prepares it from the 6th run on
        assert conn.execute(text, [value]).fetchone() == (40 + value,)
    assert counting.texts.count("SELECT 40 + $1::INTEGER AS answer") == 1
    # Session commands and catalog queries are still the surface's.
    conn.execute("SET statement_timeout = '5s'")
    for _ in range(3):
        assert conn.execute("SHOW statement_timeout").fetchone() == ("5000ms",)
        assert conn.execute("SELECT current_setting('statement_timeout')").fetchone() == ("5000ms",)
        assert conn.execute("SELECT count(*) FROM pg_catalog.pg_type WHERE typname = 'int4'"
                            ).fetchone() == (1,)  # fmt: skip


def test_surface_keeps_a_bounded_number_of_texts(monkeypatch) -> None:
    monkeypatch.setattr(surface, "_UNCHANGED_KEPT", 4)
    surface._unchanged.clear()
    for value in range(10):
        assert surface._goes_unchanged(f"SELECT {value}")
    assert len(surface._unchanged) <= 4
    assert not surface._goes_unchanged("SHOW search_path")
    assert not surface._goes_unchanged("  set search_path = x")
    assert not surface._goes_unchanged("CREATE TABLE t (id SERIAL)")
    assert not surface._goes_unchanged("SELECT * FROM pg_catalog.pg_class")
    surface._unchanged.clear()


def _reference_describe(body: bytes) -> tuple[str, str]:
    reader = m.Reader(body)
    kind = reader.byte().decode("latin-1")
    if kind not in ("S", "P"):
        raise m.ProtocolError(f"invalid DESCRIBE message subtype {kind!r}")
    return kind, reader.cstring()


def _reference_execute(body: bytes) -> tuple[str, int]:
    reader = m.Reader(body)
    return reader.cstring(), reader.int32()


def _outcome(function: Any, body: bytes) -> Any:
    try:
        return function(body)
    except m.ProtocolError as error:
        return ("error", error.sqlstate, error.message)


def _parsed_describe(data: bytes) -> tuple[str, str]:
    describe = m.parse_describe(data)
    return describe.kind, describe.name


def _parsed_execute(data: bytes) -> tuple[str, int]:
    execute = m.parse_execute(data)
    return execute.portal, execute.max_rows


DESCRIBES = [b"", b"P", b"S\0", b"Pname\0", b"X\0", b"\xff\0", b"Pna\xc3\x28\0", b"Pname",
             b"S\0extra"]  # fmt: skip
EXECUTES = [b"", b"\0", b"\0\0\0\0\0", b"p\0" + struct.pack("!i", 7), b"p\0\0\0",
            b"\xc3\x28\0\0\0\0\0", b"portal",
            b"\0" + struct.pack("!i", -3) + b"more"]  # fmt: skip


@pytest.mark.parametrize(
    ("parsed", "reference", "body"),
    [pytest.param(_parsed_describe, _reference_describe, body, id=f"describe-{body!r}")
     for body in DESCRIBES]
    + [pytest.param(_parsed_execute, _reference_execute, body, id=f"execute-{body!r}")
       for body in EXECUTES],
)  # fmt: skip
def test_describe_and_execute_read_as_field_by_field(
    parsed: Any, reference: Any, body: bytes
) -> None:
    assert _outcome(parsed, body) == _outcome(reference, body)


@pytest.mark.parametrize(
    "body",
    [b"\0\0", b"\0\0\0", b"\0\0\0\x01", b"\0\0\0\x01\0", b"\0\0\xff\xff", b"\0\0\0\0\0\x01",
     b"\0\0\0\0\0\x01\xff\xff\xff\xfe", b"\0\0\0\0\0\x01\0\0\0\x05ab", b"\0\0\0\0\0\0\0\x01"],
)  # fmt: skip
def test_bind_refuses_what_field_by_field_reading_refuses(body: bytes) -> None:
    with pytest.raises(m.ProtocolError, match="shorter than its fields"):
        m.parse_bind(body)


def test_a_result_shape_goes_out_without_working_out_its_description_again(
    connect, monkeypatch
) -> None:
    from sql.pgwire.connection import extended, portals

    made: list[tuple[str, ...]] = []
    original = portals.described_row

    def counting(names: list[str], oids: list[int], formats: list[int]) -> bytes:
        made.append(tuple(names))
        return original(names, oids, formats)

    monkeypatch.setattr(portals, "described_row", counting)
    def of_table(table: Any, oids: list[int], formats: list[int]) -> bytes:
        return counting(table.column_names, oids, formats)

    monkeypatch.setattr(extended, "row_description", of_table)
    portals._rows_shapes.clear()
    conn = connect(autocommit=True)
    text = "SELECT %s::INTEGER AS n, 'v' || %s::INTEGER AS s, %s::DOUBLE AS d"
    for value in range(8):  # psycopg prepares it from the 6th run on
        conn.execute(text, [value] * 3).fetchone()
    assert ("n", "s", "d") in made
    del made[:]
    for value in range(8, 14):
        assert conn.execute(text, [value] * 3).fetchone() == (value, f"v{value}", float(value))
    assert made == []  # made for the shape, not per run
    binary = conn.cursor(binary=True)
    assert binary.execute(text, [1] * 3, prepare=True).fetchone() == (1, "v1", 1.0)
    assert made == [("n", "s", "d")]  # binary formats: a shape of its own
    for value in range(3):
        assert binary.execute(text, [value] * 3, prepare=True).fetchone() == (
            value, f"v{value}", float(value))  # fmt: skip
    assert made == [("n", "s", "d")]


def test_a_fixed_width_shape_s_bound_is_worked_out_once_and_still_refuses(
    tmp_path, monkeypatch
) -> None:
    import psycopg

    from engine.api import Rows
    from sql.pgwire.connection import connection as wire_connection
    from sql.pgwire.limits import ServerLimits
    from sql.pgwire.server import ServerThread

    bounds: list[int] = []
    original = Rows.nbytes_bound

    def counting(self: Rows) -> int:
        bounds.append(len(self.rows))
        return original(self)

    monkeypatch.setattr(Rows, "nbytes_bound", counting)
    wire_connection._fixed_bounds.clear()
    # 10 BIGINT columns: 64 rows take 5,120 bytes as Arrow, over this limit; the bound of
    # one or two rows (2,560 bytes) is within it.
    running = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0,
                           limits=ServerLimits(result_bytes_max=3_000))  # fmt: skip
    try:
        with psycopg.connect(f"host=127.0.0.1 port={running.port} user=u dbname=x",
                             autocommit=True) as conn:  # fmt: skip
            columns = ", ".join(f"i + {n} AS c{n}" for n in range(10))
            text = f"SELECT {columns} FROM range(%s::BIGINT) t(i)"
            for _ in range(12):  # prepared from the 6th run on
                assert conn.execute(text, [1]).fetchone() == tuple(range(10))
            del bounds[:]
            for _ in range(6):
                assert conn.execute(text, [1]).fetchone() == tuple(range(10))
            assert bounds == []  # kept for the shape and row count
            with pytest.raises(psycopg.errors.ProgramLimitExceeded):
                conn.execute(text, [64]).fetchall()
            assert bounds == [64]
            assert conn.execute(text, [2]).fetchall()[1] == tuple(range(1, 11))
    finally:
        running.stop()
