"""PostgreSQL's COPY text and CSV formats: rows to bytes (COPY TO) and bytes to rows (COPY FROM).

Text format (PostgreSQL docs, "COPY ... File Formats"): one line per row, fields split by
the delimiter (tab), NULL written as ``\\N``; a backslash escapes ``\\b \\f \\n \\r \\t \\v``,
``\\ooo`` (octal), ``\\xhh`` (hex) and any other character stands for itself. A line
``\\.`` ends the data. CSV: fields split by the delimiter (comma), an unquoted empty field is
NULL, a quoted one (``""``) the empty string; quotes inside a quoted field are written
with the escape character (default: the quote itself); quoted fields may hold newlines.

Invariants: the decoder only parses complete lines (a line may arrive split across
CopyData messages; newline bytes never occur inside a UTF-8 sequence), so what it holds
between ``feed`` calls is one unfinished line at most. Rows are kept column-wise as
``str | None`` with the 1-based input line each row started on, and every
``ARROW_CHUNK_ROWS`` rows become an Arrow chunk (far smaller than Python strings). Pure
code, no I/O; one decoder belongs to one COPY and is used from one thread at a time.
"""

from __future__ import annotations

import binascii
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sql.pgwire.codec import wire_types
from storage.errors import (
    CharacterNotInRepertoireError,
    DataError,
    InvalidTextRepresentationError,
    TopicbaseError,
)

ROWS_PER_CHUNK = 2000
ARROW_CHUNK_ROWS = 65536  # COPY FROM rows held as Python strings before becoming Arrow
LINE_COLUMN = "__copy_line"


class BadCopyFormatError(DataError):
    """Malformed COPY data: wrong number of columns, an unterminated quote (22P04)."""

    sqlstate = "22P04"

    def __init__(self, message: str, where: str | None = None) -> None:
        super().__init__(message, where=where)


@dataclass(frozen=True)
class CopyFormat:
    """The options that shape COPY data (already checked by ``connection.copy_statement``)."""

    csv: bool = False
    binary: bool = False  # sql.pgwire.codec.copy_binary
    arrow: bool = False  # sql.pgwire.codec.copy_arrow (COPY TO only, binary on the wire)
    # FORMAT arrow, COMPRESSION zstd (COPY TO only): the client decodes record batches with
    # Arrow IPC body compression ZSTD, so stored column-compressed frames go out as stored
    arrow_zstd: bool = False
    delimiter: str = "\t"
    null: str = "\\N"
    header: bool = False
    header_match: bool = False
    quote: str = '"'
    escape: str = '"'
    force_quote: tuple[str, ...] | None = ()  # None: every column (FORCE_QUOTE *)
    force_not_null: tuple[str, ...] = ()
    force_null: tuple[str, ...] = ()


# -- COPY TO ------------------------------------------------------------------------------------
_TEXT_ESCAPES = {b"\\": b"\\\\", b"\n": b"\\n", b"\r": b"\\r", b"\t": b"\\t"}


def _text_escaper(delimiter: bytes) -> re.Pattern[bytes]:
    specials = {b"\\", b"\n", b"\r", b"\t", delimiter}
    return re.compile(b"[" + b"".join(re.escape(s) for s in sorted(specials)) + b"]")


def encode_table(table: pa.Table, fmt: CopyFormat, rows_per_chunk: int = ROWS_PER_CHUNK
                 ) -> Iterator[bytes]:  # fmt: skip
    """CopyData payloads for ``table``: the header line (if asked), then chunks of rows.

    Each chunk holds at most ``rows_per_chunk`` rows, so a large result never becomes
    one large bytes object.
    """
    oids = [wire_types.type_oid(f.type) for f in table.schema]
    header = encode_header(table.column_names, fmt)
    if header:
        yield header
    for start in range(0, table.num_rows, rows_per_chunk):
        yield encode_rows(table.slice(start, rows_per_chunk), fmt, oids)


def encode_header(names: list[str], fmt: CopyFormat) -> bytes:
    """The header line of COPY TO (empty unless HEADER was asked)."""
    if not fmt.header:
        return b""
    return _encode_line([name.encode() for name in names], fmt, None, [])


def encode_rows(table: pa.Table, fmt: CopyFormat, oids: list[int]) -> bytes:
    """The lines of the rows of ``table``, whose columns have the type OIDs ``oids``."""
    return b"".join(encode_lines(table, fmt, oids))


def encode_lines(table: pa.Table, fmt: CopyFormat, oids: list[int]) -> list[bytes]:
    """One line (newline included) per row of ``table``."""
    forced = _forced_columns(table.column_names, fmt)
    rows = wire_types.encode_rows(table, oids, [0] * len(oids))
    return [_encode_line(row, fmt, fmt.null.encode(), forced) for row in rows]


def _forced_columns(names: list[str], fmt: CopyFormat) -> list[bool]:
    if fmt.force_quote is None:
        return [True] * len(names)
    return [name in fmt.force_quote for name in names]


def _encode_line(fields: list[bytes | None], fmt: CopyFormat, null: bytes | None,
                 forced: list[bool]) -> bytes:  # fmt: skip
    delimiter = fmt.delimiter.encode()
    if fmt.csv:
        parts = [
            (null or b"") if value is None
            else _csv_field(value, fmt, null, bool(forced) and forced[index])
            for index, value in enumerate(fields)
        ]  # fmt: skip
    else:
        escaper = _escaper_for(delimiter)
        parts = [
            (null or b"") if value is None
            else escaper.sub(lambda m: _TEXT_ESCAPES.get(m.group(), b"\\" + m.group()), value)
            for value in fields
        ]  # fmt: skip
    return delimiter.join(parts) + b"\n"


_ESCAPERS: dict[bytes, re.Pattern[bytes]] = {}


def _escaper_for(delimiter: bytes) -> re.Pattern[bytes]:
    escaper = _ESCAPERS.get(delimiter)
    if escaper is None:
        escaper = _ESCAPERS[delimiter] = _text_escaper(delimiter)
    return escaper


def _csv_field(value: bytes, fmt: CopyFormat, null: bytes | None, forced: bool) -> bytes:
    quote, escape = fmt.quote.encode(), fmt.escape.encode()
    needs_quotes = (
        forced
        or value == null
        or value == b"\\."
        or any(c in value for c in (fmt.delimiter.encode(), quote, b"\n", b"\r"))
        or (null is not None and not value and not null)
    )
    if not needs_quotes:
        return value
    if escape != quote:
        value = value.replace(escape, escape + escape)
    return quote + value.replace(quote, escape + quote) + quote


# -- COPY FROM ----------------------------------------------------------------------------------
_TEXT_UNESCAPE = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|(.))", re.DOTALL)
_SIMPLE_ESCAPES = {b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r", b"t": b"\t", b"v": b"\v"}


def _unescape_match(match: re.Match[bytes]) -> bytes:
    octal, hexadecimal, other = match.groups()
    if octal is not None:
        return bytes([int(octal, 8) & 0xFF])
    if hexadecimal is not None:
        return bytes([int(hexadecimal, 16)])
    return _SIMPLE_ESCAPES.get(other, other)


def _unescape(field: bytes) -> bytes:
    return _TEXT_UNESCAPE.sub(_unescape_match, field) if b"\\" in field else field


class RowBuffer(ABC):
    """Rows decoded column-wise, as Python values, that become Arrow chunks as they grow.

    The common part of the text/CSV and binary COPY FROM decoders. A subclass (a
    dataclass) holds the fields named below and says how its held values become Arrow
    arrays (``_column_arrays``). Invariants: ``columns`` has one list per name of
    ``column_names``, each as long as ``lines`` (the input line each held row started
    on); the held rows and the ``_chunks`` together are every row decoded so far, in order.
    """

    column_names: list[str]
    columns: list[list[Any]]
    lines: list[int]
    _chunks: list[pa.Table]  # rows already made Arrow
    _rows_in_chunks: int

    @property
    def row_count(self) -> int:
        return self._rows_in_chunks + len(self.lines)

    def to_arrow(self) -> pa.Table:
        """The rows so far: one column per target column, plus the line numbers."""
        if self.lines or not self._chunks:
            self._chunks.append(self._pending_arrow())
        return pa.concat_tables(self._chunks)

    def _chunk_when_full(self) -> None:
        """Turn the held rows into an Arrow chunk once there are ``ARROW_CHUNK_ROWS``."""
        if len(self.lines) >= ARROW_CHUNK_ROWS:
            self._chunks.append(self._pending_arrow())

    def _pending_arrow(self) -> pa.Table:
        """The rows still held as Python values, as Arrow (and forgotten here)."""
        arrays = self._column_arrays()
        arrays[LINE_COLUMN] = pa.array(self.lines, pa.int64())
        self._rows_in_chunks += len(self.lines)
        self.columns = [[] for _ in self.column_names]
        self.lines = []
        return pa.table(arrays)

    @abstractmethod
    def _column_arrays(self) -> dict[str, pa.Array]:
        """The held values of each column as an Arrow array, by column name."""


@dataclass
class CopyDecoder(RowBuffer):
    """Parses COPY FROM data into columns, line by line as data arrives.

    Columns listed in ``bytea_columns`` hold bytes (PostgreSQL's bytea input: ``\\x`` hex
    or the escape format), the others UTF-8 text; a bad value is 22P02 / 22021 with its
    line and column."""

    fmt: CopyFormat
    column_names: list[str]
    relation: str  # for error context: "COPY <relation>, line n"
    bytea_columns: frozenset[int] = frozenset()
    columns: list[list[Any]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    line_number: int = 0
    bytes_seen: int = 0
    ended: bool = False
    _tail: bytes = b""
    _pending_record: list[bytes] = field(default_factory=list)  # CSV: lines of an open quote
    _header_left: bool = False
    _chunks: list[pa.Table] = field(default_factory=list)  # rows already made Arrow
    _rows_in_chunks: int = 0

    def __post_init__(self) -> None:
        self.columns = [[] for _ in self.column_names]
        self._header_left = self.fmt.header

    def feed(self, data: bytes) -> None:
        """Parse every complete line of ``self._tail + data``; keep the unfinished rest."""
        self.bytes_seen += len(data)
        if self.ended:
            return
        buffer = self._tail + data
        cut = buffer.rfind(b"\n")
        if cut < 0:
            self._tail = buffer
            return
        self._tail = buffer[cut + 1 :]
        lines = buffer[:cut].split(b"\n")
        if self.fmt.csv:
            for line in lines:
                self._line(line)
                if self.ended:
                    break
        else:
            self._text_lines(lines)
        self._chunk_when_full()

    def finish(self) -> None:
        """The data is complete: parse a last line without a newline, refuse open quotes."""
        if not self.ended and self._tail:
            tail, self._tail = self._tail, b""
            self._line(tail)
        if self._pending_record and not self.ended:
            raise BadCopyFormatError("unterminated CSV quoted field", self._context())

    def _column_arrays(self) -> dict[str, pa.Array]:
        """Strings, or bytes for the ``bytea_columns``."""
        return {
            name: pa.array(values, pa.binary() if index in self.bytea_columns else pa.string())
            for index, (name, values) in enumerate(zip(self.column_names, self.columns,
                                                       strict=True))
        }  # fmt: skip

    # -- one line -------------------------------------------------------------------------------
    def _context(self, column: str | None = None, value: str | None = None) -> str:
        text = f"COPY {self.relation}, line {self.line_number}"
        if column is not None:
            text += f", column {column}"
        if value is not None:
            text += f': "{value}"'
        return text

    def _text_lines(self, lines: list[bytes]) -> None:
        """The text format's hot loop over whole rows. A line it does not take as a plain
        row (the header, ``\\.``, a wrong width, a bad value) goes to ``_line``, which
        handles it exactly or raises the error with its line and column."""
        delimiter, null = self.fmt.delimiter.encode(), self.fmt.null.encode()
        width = len(self.column_names)
        converters = [_bytea_field if index in self.bytea_columns else _text_field
                      for index in range(width)]  # fmt: skip
        columns, line_numbers = self.columns, self.lines
        for line in lines:
            if self._header_left or line[:2] == b"\\.":
                self._line(line)
                if self.ended:
                    return
                continue
            fields = (line[:-1] if line[-1:] == b"\r" else line).split(delimiter)
            try:
                if len(fields) != width:
                    raise ValueError("width")
                values = [None if value == null else convert(value)
                          for convert, value in zip(converters, fields, strict=True)]  # fmt: skip
            except ValueError:  # includes UnicodeDecodeError and binascii.Error
                self._line(line)  # raises the precise error (or takes the row itself)
                continue
            self.line_number += 1
            for column, value in zip(columns, values, strict=True):
                column.append(value)
            line_numbers.append(self.line_number)

    def _line(self, line: bytes) -> None:
        self.line_number += 1
        if self.fmt.csv:
            self._csv_line(line)
            return
        if line.endswith(b"\r"):  # a raw CR in text data is always escaped: a line end
            line = line[:-1]
        if line == b"\\.":
            self.ended = True
            return
        fields = line.split(self.fmt.delimiter.encode())
        if self._header_left:
            self._header(fields)
            return
        null = self.fmt.null.encode()
        row: list[str | bytes | None] = []
        for index, value in enumerate(fields):
            if value == null:
                row.append(None)
            elif index in self.bytea_columns and value[:3] == b"\\\\x" and value.count(b"\\") == 2:
                row.append(self._hex(index, value[3:]))  # the common \\x hex form, unescaped
            else:
                row.append(self._value(index, _unescape(value)))
        self._add_row(row)

    def _csv_line(self, line: bytes) -> None:
        if not self._pending_record and line.rstrip(b"\r") == b"\\.":
            self.ended = True
            return
        self._pending_record.append(line)
        record = b"\n".join(self._pending_record)
        if record.endswith(b"\r"):  # CRLF line end, unless the CR is inside quotes
            record = record[:-1]
        parsed = _split_csv(record, self.fmt)
        if parsed is None:  # a quoted field continues on the next line
            return
        self._pending_record = []
        if self._header_left:
            self._header([value for value, _ in parsed])
            return
        null = self.fmt.null.encode()
        row: list[str | bytes | None] = []
        for index, (value, quoted) in enumerate(parsed):
            name = self.column_names[index] if index < len(self.column_names) else ""
            is_null = value == null and not quoted and name not in self.fmt.force_not_null
            if name in self.fmt.force_null and value == null:
                is_null = True
            row.append(None if is_null else self._value(index, value))
        self._add_row(row)

    def _header(self, fields: list[bytes]) -> None:
        self._header_left = False
        if not self.fmt.header_match:
            return
        names = [self._decode(f) for f in fields]
        if names != self.column_names:
            raise BadCopyFormatError(
                f"column names in the header ({', '.join(names)}) do not match the "
                f"columns of the COPY ({', '.join(self.column_names)})",
                self._context(),
            )

    def _value(self, index: int, value: bytes) -> str | bytes:
        if index not in self.bytea_columns:
            return self._decode(value)
        try:
            return bytea_from_bytes(value)
        except ValueError:
            column = self.column_names[index]
            raise InvalidTextRepresentationError(
                "invalid input syntax for type bytea", where=self._context(column)) from None

    def _hex(self, index: int, digits: bytes) -> bytes:
        try:
            return bytes.fromhex(digits.decode("ascii"))
        except ValueError:
            raise InvalidTextRepresentationError(
                "invalid input syntax for type bytea",
                where=self._context(self.column_names[index])) from None  # fmt: skip

    def _decode(self, value: bytes) -> str:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise CharacterNotInRepertoireError(
                'invalid byte sequence for encoding "UTF8"', where=self._context()
            ) from None

    def _add_row(self, row: list[str | bytes | None]) -> None:
        expected = len(self.column_names)
        if len(row) > expected:
            raise BadCopyFormatError("extra data after last expected column", self._context())
        if len(row) < expected:
            missing = self.column_names[len(row)]
            raise BadCopyFormatError(f'missing data for column "{missing}"', self._context())
        for column, value in zip(self.columns, row, strict=True):
            column.append(value)
        self.lines.append(self.line_number - self._record_extra_lines(row))

    def _record_extra_lines(self, row: list[str | bytes | None]) -> int:
        """Lines a CSV record spans beyond its first (quoted newlines)."""
        if not self.fmt.csv:
            return 0
        return sum(
            value.count(b"\n" if isinstance(value, bytes) else "\n")
            for value in row if value is not None
        )  # fmt: skip


def _split_csv(record: bytes, fmt: CopyFormat) -> list[tuple[bytes, bool]] | None:
    """Fields of one CSV record as (value, was quoted); None if a quote is still open."""
    delimiter, quote, escape = fmt.delimiter.encode(), fmt.quote.encode(), fmt.escape.encode()
    if quote not in record:
        return [(value, False) for value in record.split(delimiter)]
    fields: list[tuple[bytes, bool]] = []
    value = bytearray()
    quoted = in_quotes = False
    index, size = 0, len(record)
    while index < size:
        char = record[index : index + 1]
        if in_quotes:
            if char == escape and record[index + 1 : index + 2] == quote:
                value += quote
                index += 2
                continue
            if char == quote:
                in_quotes = False
            elif char == escape and escape != quote and record[index + 1: index + 2] == escape:
                value += escape
                index += 1
            else:
                value += char
        elif char == quote:
            in_quotes = quoted = True
        elif char == delimiter:
            fields.append((bytes(value), quoted))
            value, quoted = bytearray(), False
        else:
            value += char
        index += 1
    if in_quotes:
        return None
    fields.append((bytes(value), quoted))
    return fields


def _text_field(value: bytes) -> str:
    return (_TEXT_UNESCAPE.sub(_unescape_match, value) if b"\\" in value else value).decode()


def _bytea_field(value: bytes) -> bytes:
    if value[:3] == b"\\\\x" and value.count(b"\\") == 2:  # \\x hex, the usual form
        return binascii.unhexlify(value[3:])
    return bytea_from_bytes(_unescape(value))


def bytea_from_bytes(raw: bytes) -> bytes:
    """PostgreSQL's bytea input: ``\\x`` + hex digits, or the escape format
    (``\\\\`` and ``\\ooo`` octal); ValueError for anything else."""
    if raw.startswith(b"\\x"):
        return bytes.fromhex(raw[2:].decode("ascii"))
    if b"\\" not in raw:
        return raw
    out = bytearray()
    index = 0
    while index < len(raw):
        if raw[index] != 0x5C:
            out.append(raw[index])
            index += 1
        elif raw[index + 1 : index + 2] == b"\\":
            out.append(0x5C)
            index += 2
        elif _OCTAL.fullmatch(raw[index + 1 : index + 4]):
            out.append(int(raw[index + 1 : index + 4], 8) & 0xFF)
            index += 4
        else:
            raise ValueError("invalid bytea escape")
    return bytes(out)


_OCTAL = re.compile(rb"[0-3][0-7][0-7]")


def error_context(error: TopicbaseError) -> str | None:
    """The CONTEXT text ("COPY t, line 3 ...") a COPY data error carries, if any."""
    where = error.context.get("where")
    return where if isinstance(where, str) else None
