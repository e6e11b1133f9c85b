"""PostgreSQL array parameters, text (``{1,2,NULL}``) and binary, as nested Python lists.

DuckDB binds a Python list as a LIST, so ``WHERE id = ANY($1)`` and ``INSERT … VALUES
($1)`` into an ``INTEGER[]`` column take what psycopg, asyncpg and pg8000 send for a list.
Elements are decoded by the caller's element decoder (``types.decode_parameter`` with the
element's OID), so an array of a type is read as its elements are.

Text form: ``{…}`` with ``,`` between elements, nested braces for more dimensions,
elements either bare (surrounding blanks dropped; ``NULL`` in any case is a null) or in
double quotes with backslash escapes. Dimension decorations (``[1:3]={…}``) are refused.
Binary form: ndim, has-null flag, element OID, (size, lower bound) per dimension, then
each element as length (-1: null) and bytes. Errors are 22P02 (text) and 22P03 (binary);
an element OID other than the array's is 42804, as PostgreSQL says.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from storage.errors import (
    DatatypeMismatchError,
    InvalidBinaryDataError,
    InvalidTextRepresentationError,
)
from storage.limits import ARRAY_DIMENSIONS_MAX

# Array type OID -> element type OID.
ELEMENT_OIDS = {
    1000: 16, 1001: 17, 1005: 21, 1007: 23, 1009: 25, 1014: 1042, 1015: 1043, 1016: 20,
    1021: 700, 1022: 701, 1115: 1114, 1182: 1082, 1183: 1083, 1185: 1184, 1187: 1186,
    1231: 1700, 2951: 2950, 199: 114, 3807: 3802,
}  # fmt: skip
ARRAY_OIDS = {element: array for array, element in ELEMENT_OIDS.items()}

_HEADER = struct.Struct("!iiI")
_DIMENSION = struct.Struct("!ii")
_LENGTH = struct.Struct("!i")


class ArrayTextError(InvalidTextRepresentationError):
    """A malformed array literal (``{1,2``) (22P02)."""


class ArrayBinaryError(InvalidBinaryDataError):
    """A malformed binary array parameter (22P03)."""


class ArrayElementTypeError(DatatypeMismatchError):
    """An array element of another type than the array's (42804)."""


def decode_text(text: str, element: Callable[[str], Any]) -> list[Any]:
    """``{…}`` as nested lists, each non-null element through ``element``."""
    parser = _TextParser(text, element)
    value = parser.array(0)
    parser.skip_blanks()
    if parser.position != len(text):
        raise parser.error("junk after closing right brace")
    return value


def decode_binary(data: bytes, element_oid: int, element: Callable[[bytes], Any]) -> list[Any]:
    """The binary array form as nested lists; its element OID must be ``element_oid``."""
    try:
        dimensions, _has_null, oid = _HEADER.unpack_from(data, 0)
        if oid != element_oid:
            raise ArrayElementTypeError(
                f"wrong element type in a binary array: OID {oid}, expected {element_oid}"
            )
        if not 0 <= dimensions <= ARRAY_DIMENSIONS_MAX:
            raise ArrayBinaryError(f"invalid number of dimensions: {dimensions}")
        position = _HEADER.size
        sizes = []
        for _ in range(dimensions):
            size, _lower = _DIMENSION.unpack_from(data, position)
            position += _DIMENSION.size
            if size < 0:
                raise ArrayBinaryError(f"invalid array dimension size: {size}")
            sizes.append(size)
        flat: list[Any] = []
        for _ in range(_product(sizes) if sizes else 0):
            (length,) = _LENGTH.unpack_from(data, position)
            position += _LENGTH.size
            if length == -1:
                flat.append(None)
                continue
            if length < 0 or position + length > len(data):
                raise ArrayBinaryError("insufficient data left in a binary array element")
            flat.append(element(data[position : position + length]))
            position += length
    except struct.error:
        raise ArrayBinaryError("insufficient data left in a binary array") from None
    if position != len(data):
        raise ArrayBinaryError("incorrect binary data format in an array: bytes left over")
    return _nested(flat, sizes) if sizes else []


def _product(sizes: list[int]) -> int:
    count = 1
    for size in sizes:
        count *= size
    return count


def _nested(flat: list[Any], sizes: list[int]) -> list[Any]:
    """Row-major ``flat`` cut into lists of ``sizes``."""
    if len(sizes) == 1:
        return flat
    step = len(flat) // sizes[0] if sizes[0] else 0
    return [_nested(flat[i * step : (i + 1) * step], sizes[1:]) for i in range(sizes[0])]


class _TextParser:
    def __init__(self, text: str, element: Callable[[str], Any]) -> None:
        self.text = text
        self.position = 0
        self.element = element

    def error(self, detail: str) -> ArrayTextError:
        return ArrayTextError(f'malformed array literal: "{self.text}" ({detail})')

    def skip_blanks(self) -> None:
        while self.position < len(self.text) and self.text[self.position].isspace():
            self.position += 1

    def array(self, depth: int) -> list[Any]:
        self.skip_blanks()
        if depth >= ARRAY_DIMENSIONS_MAX:
            raise self.error(f"more than {ARRAY_DIMENSIONS_MAX} dimensions")
        if self.position >= len(self.text) or self.text[self.position] != "{":
            raise self.error('array value must start with "{" or dimension information')
        self.position += 1
        items: list[Any] = []
        self.skip_blanks()
        if self.position < len(self.text) and self.text[self.position] == "}":
            self.position += 1
            return items
        while True:
            self.skip_blanks()
            if self.position >= len(self.text):
                raise self.error("unexpected end of input")
            char = self.text[self.position]
            if char == "{":
                items.append(self.array(depth + 1))
            elif char == '"':
                items.append(self.element(self.quoted()))
            else:
                items.append(self.bare())
            self.skip_blanks()
            if self.position >= len(self.text):
                raise self.error("unexpected end of input")
            char = self.text[self.position]
            self.position += 1
            if char == "}":
                break
            if char != ",":
                raise self.error(f'unexpected "{char}"')
        nested = [isinstance(item, list) for item in items]
        ragged = any(nested) and (not all(nested) or len({len(item) for item in items}) > 1)
        if ragged:
            raise self.error("sub-arrays must have matching dimensions")
        return items

    def quoted(self) -> str:
        self.position += 1  # the opening quote
        out = []
        while self.position < len(self.text):
            char = self.text[self.position]
            self.position += 1
            if char == "\\":
                if self.position >= len(self.text):
                    break
                out.append(self.text[self.position])
                self.position += 1
            elif char == '"':
                return "".join(out)
            else:
                out.append(char)
        raise self.error("unterminated quoted element")

    def bare(self) -> Any:
        start = self.position
        while self.position < len(self.text) and self.text[self.position] not in ",}{\"":
            self.position += 1
        token = self.text[start : self.position].strip()
        if not token:
            raise self.error("empty element")
        if token.upper() == "NULL":
            return None
        return self.element(token)
