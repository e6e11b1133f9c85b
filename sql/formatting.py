"""Turning results and errors into text: the output formats of the console.

This module owns how a value looks outside Python, the same way in every format:

- ``bytes`` (topic ``data`` and other BLOBs): the text itself when the bytes are valid
  UTF-8 without control characters other than tab, newline and carriage return;
  otherwise PostgreSQL's bytea hex form, ``\\x`` followed by two lowercase hex digits per
  byte (``b"\\xff\\x00"`` -> ``\\xff00``). So ``'a'`` written to a topic reads back as
  ``a``, and binary payloads stay unambiguous and copy-pasteable into ``X'...'``;
- NULL: an empty field in table and csv output, ``null`` in json;
- times and dates: ISO 8601; decimals: their exact digits (a JSON *string*, so no
  precision is lost); NaN and infinities: ``"NaN"``, ``"Infinity"``, ``"-Infinity"``
  in json; lists, structs and maps: JSON text in table and csv output, JSON values
  in json output (a map becomes an object).

Formats: ``table`` (psql's aligned layout with a ``(n rows)`` footer), ``csv`` (a
header line, then one line per row, RFC 4180 quoting), ``json`` (one JSON object per
row, keys in column order). Rows are converted one Arrow record batch at a time, so
csv and json output streams. Pure functions over their arguments; no shared state.
"""

from __future__ import annotations

import csv
import datetime
import decimal
import json
import math
import re
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TextIO

from storage.errors import TopicbaseError

if TYPE_CHECKING:  # Arrow is imported where it runs: the console's `user` and --help need none
    import pyarrow as pa

FORMATS = ("table", "csv", "json")
# Control characters that make bytes show as hex (tab, newline and CR may stand in text).
_CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# Tags of row-changing statements: with RETURNING they show rows *and* their tag.
_DML_TAGS = ("INSERT", "UPDATE", "DELETE", "MERGE")


# -- values ---------------------------------------------------------------------------
def bytes_text(value: bytes) -> str:
    """A byte string as text if it is printable UTF-8, else ``\\x`` hex (see module doc)."""
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return "\\x" + value.hex()
    if _CONTROL_CHARACTER.search(text):
        return "\\x" + value.hex()
    return text


def json_value(value: Any) -> Any:
    """``value`` as something ``json.dumps`` writes as described in the module doc."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes_text(bytes(value))
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(key): json_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        if value and all(isinstance(item, tuple) and len(item) == 2 for item in value):
            # Arrow hands a MAP over as a list of (key, value) pairs.
            return {str(json_value(key)): json_value(item) for key, item in value}
        return [json_value(item) for item in value]
    if isinstance(value, decimal.Decimal | uuid.UUID | datetime.timedelta):
        return str(value)
    return str(value)


def text_value(value: Any) -> str:
    """How ``value`` reads in a table cell or a csv field."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes_text(bytes(value))
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, dict | list | tuple):
        return json.dumps(json_value(value), ensure_ascii=False)
    converted = json_value(value)
    return converted if isinstance(converted, str) else str(converted)


def iter_rows(table: pa.Table) -> Iterator[tuple[Any, ...]]:
    """The rows of ``table`` as tuples of Python values, one record batch at a time."""
    for batch in table.to_batches():
        columns = [column.to_pylist() for column in batch.columns]
        yield from zip(*columns, strict=True)


def is_numeric(data_type: pa.DataType) -> bool:
    import pyarrow as pa

    return (
        pa.types.is_integer(data_type)
        or pa.types.is_floating(data_type)
        or pa.types.is_decimal(data_type)
    )


def shows_tag_after_rows(tag: str) -> bool:
    """True for INSERT/UPDATE/DELETE ... RETURNING: psql prints their tag below the rows."""
    return tag.split(" ", 1)[0] in _DML_TAGS


def rows_footer(count: int) -> str:
    return "(1 row)" if count == 1 else f"({count} rows)"


# -- formats ----------------------------------------------------------------------------
def write_table(table: pa.Table, out: TextIO, *, footer: bool = True) -> None:
    """psql's aligned layout: a header, a rule, right-aligned numbers, ``(n rows)``."""
    names = table.column_names
    numeric = [is_numeric(field.type) for field in table.schema]
    cells = [[_one_line(text_value(v)) for v in row] for row in iter_rows(table)]
    widths = [len(name) for name in names]
    for row in cells:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=True)]
    header = " | ".join(_centered(name, width) for name, width in zip(names, widths, strict=True))
    out.write(" " + header.rstrip() + "\n")
    out.write("-" + "-+-".join("-" * width for width in widths) + "-\n")
    for row in cells:
        parts = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(row, widths, numeric, strict=True)
        ]
        out.write((" " + " | ".join(parts)).rstrip() + "\n")
    if footer:
        out.write(rows_footer(table.num_rows) + "\n")


def _centered(text: str, width: int) -> str:
    """psql's header centring: the odd space of padding goes to the right."""
    left = (width - len(text)) // 2
    return (" " * left + text).ljust(width)


def _one_line(text: str) -> str:
    """Table cells stay on one line: newlines and tabs show as escapes."""
    if "\n" in text or "\r" in text or "\t" in text:
        return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")
    return text


def write_csv(table: pa.Table, out: TextIO) -> None:
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(table.column_names)
    for row in iter_rows(table):
        writer.writerow([text_value(value) for value in row])


def write_json(table: pa.Table, out: TextIO) -> None:
    names = table.column_names
    for row in iter_rows(table):
        record = {name: json_value(value) for name, value in zip(names, row, strict=True)}
        out.write(json.dumps(record, ensure_ascii=False) + "\n")


WRITERS = {"table": write_table, "csv": write_csv, "json": write_json}


# -- errors -----------------------------------------------------------------------------
def error_text(error: BaseException, script: str | None = None) -> str:
    """``ERROR: <SQLSTATE>: <message>``, as the console prints it.

    A Topicbase error keeps its SQLSTATE and message unchanged. When the error knows
    a line and column but its message has no ``LINE n:`` excerpt (settings checked
    at parse time), the excerpt and caret from ``script`` are added below, as psql
    does with a server's error position. Anything that is not a Topicbase error is
    a bug or an unexpected failure: XX000 with its type.
    """
    if isinstance(error, KeyboardInterrupt):
        return "ERROR: 57014: canceling statement due to user request"
    if not isinstance(error, TopicbaseError):
        return f"ERROR: XX000: {type(error).__name__}: {error}"
    text = f"ERROR: {error.sqlstate}: {error.message}"
    line, column = error.context.get("line"), error.context.get("column")
    has_position = isinstance(line, int) and isinstance(column, int)
    if script is not None and has_position and "\nLINE " not in error.message:
        text += "\n" + caret_excerpt(script, line, column)
    return text


def caret_excerpt(script: str, line: int, column: int) -> str:
    """``LINE n: <text of the line>`` and a caret under ``column`` (both 1-based)."""
    lines = script.split("\n")
    if not 1 <= line <= len(lines):
        return f"LINE {line}"
    prefix = f"LINE {line}: "
    return f"{prefix}{lines[line - 1].rstrip(chr(13))}\n{' ' * (len(prefix) + column - 1)}^"
