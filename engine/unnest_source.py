"""A SELECT of nothing but unnested list parameters, built as Arrow without DuckDB (round 35).

``INSERT INTO TOPIC t (data, producer_id) SELECT unnest(?), unnest(?)`` is how a DB-API
client hands a batch of messages over in one statement (the scale bench's 5,000). DuckDB
binds a list parameter item by item and hands the rows back as Arrow: ~8 us a 1 KiB
message, more than the append itself costs at 10 partitions (``docs/scale.md`` round 35).
``unnested`` builds the same table with ``pyarrow.array`` from the lists, for the shapes
whose result is known to be DuckDB's own, and answers None for everything else (which then
runs in DuckDB as before):

- the text is ``SELECT unnest(P), unnest(P), ...`` and nothing more (no alias, no FROM, no
  clause; case and spaces free), every P ``?`` or every P ``$n``, each parameter once, and
  the parameters given are exactly those;
- each parameter is a ``list``, all of the same length, at least one item long, whose items
  are all ``bytes`` (DuckDB's BLOB: Arrow ``binary``) or all ``str`` (VARCHAR: ``string``),
  None (NULL) among them, at least one not None;
- the columns are named as DuckDB names them: ``unnest($n)``, n the parameter's position
  (a ``?`` is numbered by its place in the text).

A SELECT of parameters reads nothing and calls nothing a user defined, so skipping DuckDB
skips no check: the door (sandbox, privileges) decided on the plan before it runs.
``tests/engine/test_unnest_source.py`` compares the two on random inputs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import pyarrow as pa

_MARKER = r"(\?|\$[1-9][0-9]{0,3})"
# ASCII only: Python's Unicode ``\s`` and case folding take texts DuckDB refuses (``\x1c``
# or U+2028 as a blank, U+017F "long s" as "s": a statement that failed would succeed)
_ITEM = re.compile(r"\s*unnest\s*\(\s*" + _MARKER + r"\s*\)\s*", re.IGNORECASE | re.ASCII)
_SELECT = re.compile(r"\s*select\s", re.IGNORECASE | re.ASCII)
# the texts looked at: short ones only (a batch's statement is short; its values are not in it)
_TEXT_CHARS_MAX = 2000
_TYPES = {bytes: pa.binary(), str: pa.string()}


@lru_cache(maxsize=256)
def _parameters_of(sql: str) -> tuple[int, ...] | None:
    """The 0-based parameter index of each column of ``SELECT unnest(P), ...``, or None
    when ``sql`` is not exactly that shape (see the module doc)."""
    head = _SELECT.match(sql)
    if head is None:
        return None
    position = head.end()
    markers: list[str] = []
    while True:
        item = _ITEM.match(sql, position)
        if item is None:
            return None
        markers.append(item.group(1))
        position = item.end()
        if position == len(sql):
            break
        if sql[position] != ",":
            return None
        position += 1
    if all(m == "?" for m in markers):
        return tuple(range(len(markers)))
    if any(m == "?" for m in markers):
        return None  # ? and $n mixed: DuckDB refuses it
    numbers = tuple(int(m[1:]) - 1 for m in markers)
    if sorted(numbers) != list(range(len(numbers))):
        return None  # a parameter twice, or one not used
    return numbers


def unnested(sql: str, parameters: Any) -> pa.Table | None:
    """DuckDB's result of ``sql`` with ``parameters``, built here, or None (run it in
    DuckDB) unless ``sql`` and ``parameters`` are one of the module doc's shapes."""
    if len(sql) > _TEXT_CHARS_MAX or not isinstance(parameters, (list, tuple)):
        return None
    columns = _parameters_of(sql)
    if columns is None or len(parameters) != len(columns):
        return None
    values: Sequence[Any] = parameters
    length = None
    arrays = []
    for index in columns:
        items = values[index]
        if type(items) is not list or not items:
            return None
        if length is None:
            length = len(items)
        elif len(items) != length:
            return None  # DuckDB pads the shorter with NULLs: left to it
        kinds = set(map(type, items))
        kinds.discard(type(None))
        if len(kinds) != 1:
            return None  # all NULL (DuckDB's type NULL), or mixed kinds
        arrow_type = _TYPES.get(kinds.pop())
        if arrow_type is None:
            return None
        try:
            array = pa.array(items, arrow_type)
        except (pa.ArrowException, UnicodeError, OverflowError):
            return None  # (a str that is not UTF-8, say: DuckDB's own error then)
        if not isinstance(array, pa.Array):
            return None  # past Arrow's 2 GiB of one array: chunked, left to DuckDB
        arrays.append(array)
    names = [f"unnest(${index + 1})" for index in columns]
    return pa.Table.from_arrays(arrays, names=names)
