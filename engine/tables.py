"""DuckDB: the only module of Topicbase that imports ``duckdb``.

Holds the database file beside the store (``<data>/tables.duckdb``), hands out
one cursor per session, and translates DuckDB's exceptions into Topicbase
errors with a PostgreSQL SQLSTATE. DuckDB gives each cursor its own
transaction context (MVCC); a write-write conflict surfaces as
``SerializationFailure`` (40001).

The sandbox (issue 10): ``connect`` opens every DuckDB database with external access
off (no host files, no network, no ``ATTACH`` of a file), no extension auto-install
or auto-load, no Python replacement scans (a name in FROM never reads a Python
variable of the calling frame), a memory limit with spilling to a temp directory
Topicbase chose, and a fixed expression depth; then it locks the configuration, so
no SQL can change a global setting afterwards (only ``search_path`` and ``schema``,
which DuckDB keeps per connection, stay settable). ``statement_types`` and
``sql_tokens`` give ``engine.sandbox`` DuckDB's own view of a statement: its parser's
statement types and its lexer's tokens; each thread parses on a DuckDB connection of
its own, since a DuckDB connection may not be used by two threads at once.

Two process-wide settings come from measurements (issue 14; figures in
``docs/statement_cost.md``):

- DuckDB's ``threads``: one per core (``duckdb_threads``; ``TOPICBASE_DUCKDB_THREADS``
  overrides it). One thread saves ~0.04 ms per small statement of a lone session, but
  with 4 and 16 sessions committing small transactions two threads did 25-40 % more
  transactions per second on this 2-core machine, and a group-by over 1M rows ran up
  to 1.7x faster with a free core.
- Python's switch interval: ``SWITCH_INTERVAL_S`` (1 ms instead of Python's 5 ms), set
  by ``set_switch_interval`` when a database opens. A thread coming back from DuckDB (which
  releases the GIL while it runs) waits for the GIL up to one interval while another
  thread computes: a DuckDB loop beside a CPU-bound Python thread did 2.2-2.5x the
  transactions at 1 ms, the CPU-bound thread itself within the noise of the 5 ms runs.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import sys
import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

import duckdb
import pyarrow as pa

from engine import unnest_source
from engine.result import Rows
from grammar.bounded_cache import SCHEMA_COLUMN_BYTES, TEXT_COST_PER_CHAR, BoundedCache
from storage import errors, failpoints, limits
from storage.fs import FileSystem

TABLES_FILE = "tables.duckdb"
# The settings every DuckDB database of Topicbase is opened with; see the module doc.
# (External access is turned off right after the open, see ``connect``.)
SANDBOX_CONFIG: dict[str, Any] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "allow_unsigned_extensions": False,
    "allow_persistent_secrets": False,
    "python_enable_replacements": False,
    "max_expression_depth": limits.DUCKDB_EXPRESSION_DEPTH_MAX,
}


# DuckDB's errors map to these classes of storage.errors (one home for errors).
UndefinedColumnError = errors.UndefinedColumnError
UndefinedFunctionError = errors.UndefinedFunctionError
UniqueViolationError = errors.UniqueViolationError
NotNullViolationError = errors.NotNullViolationError
NumericOutOfRangeError = errors.NumericValueOutOfRangeError
DivisionByZeroError = errors.DivisionByZeroError
InvalidTextRepresentationError = errors.InvalidTextRepresentationError
DuplicateTableError = errors.DuplicateTableError


Connection = duckdb.DuckDBPyConnection


# Python's default switch interval (``sys.getswitchinterval()`` in a fresh interpreter).
PYTHON_SWITCH_INTERVAL_S = 0.005
SWITCH_INTERVAL_S = 0.001
THREADS_VARIABLE = "TOPICBASE_DUCKDB_THREADS"


def duckdb_threads() -> int:
    """DuckDB's worker threads: ``$TOPICBASE_DUCKDB_THREADS`` if set, else one per core."""
    text = os.environ.get(THREADS_VARIABLE, "").strip()
    if text:
        try:
            threads = int(text)
        except ValueError:
            threads = 0
        if threads < 1:
            raise errors.InvalidParameterValueError(
                f"{THREADS_VARIABLE} must be a whole number of threads, at least 1 (got {text!r})"
            )
        return threads
    return max(os.cpu_count() or 1, 1)


def set_switch_interval() -> None:
    """Python's thread switch interval to ``SWITCH_INTERVAL_S``, unless the process chose
    its own already (anything but Python's default stays as it is). Called where a
    database opens, which every front (wire server, DB-API, console, Flight) goes through."""
    if sys.getswitchinterval() == PYTHON_SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)


# PostgreSQL's arithmetic in DuckDB's SQL: ``/`` of integers is integer division (5/2 = 2)
# and any division by zero raises (22012), where DuckDB would give 2.5 and inf or NULL.
DIALECT_CONFIG = {"integer_division": True, "error_on_division_by_zero": True}


def connect(
    path: str,
    *,
    read_only: bool = False,
    memory_limit_bytes: int | None = None,
    temp_directory: str | None = None,
    threads: int | None = None,
) -> Connection:
    """Open the DuckDB file (or ``:memory:``) sandboxed, refusing a file another process holds.

    ``read_only`` opens an existing file without ever writing it (``topicbase check``).
    ``memory_limit_bytes`` caps DuckDB's memory (default: ``default_memory_limit_bytes``);
    beyond it DuckDB spills to ``temp_directory`` (None: no spilling; the directory is
    created by the caller), at most ``limits.DUCKDB_TEMP_DISK_FRACTION`` of the free disk.
    The configuration is locked before the connection is returned.
    """
    config = {**SANDBOX_CONFIG, **DIALECT_CONFIG}
    config["memory_limit"] = f"{memory_limit_bytes or default_memory_limit_bytes()}B"
    # An empty temp directory turns spilling off (else DuckDB would pick ``.tmp`` in the
    # working directory, or beside the file).
    config["temp_directory"] = temp_directory or ""
    if temp_directory:
        size_bytes = _temp_directory_bytes_max(temp_directory)
        config["max_temp_directory_size"] = f"{size_bytes}B"
    config["threads"] = duckdb_threads() if threads is None else threads
    try:
        connection = duckdb.connect(path, read_only=read_only, config=config)
    except duckdb.IOException as error:
        raise errors.ObjectInUseError(f"cannot open {path}: {error}") from error
    # External access goes off after the open, not in its config: DuckDB 2.0.1 applies the
    # config's entries in hash order, and refuses the temp directory ("modifying the
    # temp_directory has been disabled") whenever this one happens to come first. No SQL
    # has run yet, and nothing can turn it back on.
    connection.execute("SET enable_external_access = false")
    # From here on no statement can change a global setting (the sandbox refuses them
    # with 42501 before DuckDB would, but this holds even for a statement it missed).
    connection.execute("SET lock_configuration = true")
    return connection


# A new DuckDB file is made under this suffix, then renamed into place (``create_whole``).
NEW_FILE_SUFFIX = ".new"


def create_whole(path: str, fs: FileSystem) -> None:
    """Make the DuckDB file ``path`` if there is none, whole or not at all.

    DuckDB writes a new file's headers as it opens it: a process killed meanwhile (a
    crash test caught one) left a file DuckDB then refuses ("not a valid DuckDB database
    file"), and the data directory could not be opened again. So a new file is made at
    ``path + NEW_FILE_SUFFIX`` (what a killed creation left there first removed), closed
    after a checkpoint, synced, renamed to ``path`` and the directory synced. Invariant:
    ``path`` exists only as a file DuckDB wrote whole; an existing one is left alone."""
    if os.path.exists(path):
        return
    new = path + NEW_FILE_SUFFIX
    for leftover in (new, new + ".wal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(leftover)
    connection = duckdb.connect(new, config={**SANDBOX_CONFIG, "threads": 1})
    try:
        connection.execute("CHECKPOINT")
    finally:
        connection.close()
    failpoints.hit("tables.new_file_made")
    fd = os.open(new, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fs.sync(fd)
    finally:
        os.close(fd)
    os.replace(new, path)
    fs.sync_directory(os.path.dirname(path) or ".")


def default_memory_limit_bytes() -> int:
    """``limits.DUCKDB_MEMORY_FRACTION`` of the machine's physical memory."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # not a POSIX system: DuckDB's own default (80 %)
        physical = 0
    if physical <= 0:
        return 4 * 1024**3
    return int(physical * limits.DUCKDB_MEMORY_FRACTION)


def _temp_directory_bytes_max(temp_directory: str) -> int:
    """``limits.DUCKDB_TEMP_DISK_FRACTION`` of the space free on the temp directory's disk."""
    stats = os.statvfs(temp_directory)
    return max(int(stats.f_bavail * stats.f_frsize * limits.DUCKDB_TEMP_DISK_FRACTION), 1)


class SqlToken(NamedTuple):
    """One token as DuckDB's lexer sees it: kind is identifier, keyword, string_const,
    numeric_const or operator; text is its source text (quotes kept), from ``start``."""

    kind: str
    text: str
    start: int


def quote_identifier(name: str) -> str:
    """``name`` as a DuckDB quoted identifier (its double quotes doubled), whatever it holds."""
    return '"' + name.replace('"', '""') + '"'


def sql_tokens(sql: str) -> list[SqlToken]:
    """DuckDB's tokens of ``sql`` (its parser's own scanner), comments left out.

    DuckDB gives each token's start in bytes of the UTF-8 text: for a text that is not
    ASCII they are turned into character positions here (a token's text cut at byte
    positions from the ``str`` would be shifted past every multi-byte character, and the
    sandbox, which reads these texts, would miss a call after one)."""
    try:
        positions = duckdb.tokenize(sql)
    except duckdb.Error as error:
        raise translate(error) from error
    if not sql.isascii():
        positions = _character_positions(sql, positions)
    ends = [start for start, _ in positions[1:]] + [len(sql)]
    return [
        SqlToken(_TOKEN_KINDS[kind], sql[start:end].rstrip(), start)
        for (start, kind), end in zip(positions, ends, strict=True)
        if kind is not _COMMENT
    ]


def _character_positions(sql: str, positions: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """DuckDB's token starts (bytes of ``sql``'s UTF-8 form) as positions in ``sql``."""
    data = sql.encode("utf-8", "surrogatepass")
    converted = []
    character, byte = 0, 0
    for start, kind in positions:
        assert start >= byte, "DuckDB's tokens come in order"
        character += len(data[byte:start].decode("utf-8", "surrogatepass"))
        byte = start
        converted.append((character, kind))
    return converted


# DuckDB's token kinds by member (``.name`` on each token costs more than the lexer).
_TOKEN_KINDS = {member: name for name, member in duckdb.token_type.__members__.items()}
_COMMENT = duckdb.token_type.comment


# DuckDB statement types this DuckDB has but its Python enum lacks (UPDATE EXTENSIONS).
UNKNOWN_STATEMENT = "UNKNOWN"


def statement_types(sql: str) -> list[tuple[str, str]] | None:
    """``(type, text)`` of each statement DuckDB's parser finds in ``sql``: type is a
    ``duckdb.StatementType`` name (``SELECT``, ``COPY``, ``ATTACH`` …) or ``UNKNOWN``.

    None when DuckDB cannot parse it: then DuckDB will refuse to run it as well.
    Too deep an expression is ``StatementTooComplexError`` (54001).
    """
    try:
        statements = _parser().extract_statements(sql)
    except duckdb.ParserException as error:
        translated_error = translate(error)
        if isinstance(translated_error, errors.StatementTooComplexError):
            raise translated_error from error
        return None
    except duckdb.Error as error:
        raise translate(error) from error
    kinds = []
    for statement in statements:
        try:
            kind = statement.type.name
        except ValueError:
            kind = UNKNOWN_STATEMENT
        kinds.append((kind, statement.query))
    return kinds


# A DuckDB connection may not be used from two threads at once, and sessions classify
# statements on their own threads: each thread parses on a connection of its own (an
# empty sandboxed in-memory database; the module-level functions share one default
# connection).
_PARSER_MEMORY_BYTES = 64 * 1024 * 1024
_parsers = threading.local()
# Every parser connection made, closed at exit: one left for the interpreter's teardown
# to destroy can abort the process after DuckDB's module is gone ("terminate called
# after throwing an instance of ''", seen in CI at a console's exit). Each holds DuckDB's
# native threads too (about 8, even with threads = 1), so a process about to fork closes
# them first (``close_parsers``); a thread's next parse then opens a new one. A thread
# that ended leaves its connection here: the next new parser closes those (a server
# gives every client a thread of its own, so they would pile up otherwise).
_parser_connections: list[tuple[threading.Thread, Connection]] = []
_parser_connections_lock = threading.Lock()
_parser_generation = 0  # moves at each close_parsers: a thread's older connection is closed


def _parser() -> Connection:
    connection = getattr(_parsers, "connection", None)
    if connection is None or getattr(_parsers, "generation", None) != _parser_generation:
        # One thread: it only parses, and a database per thread should not bring a pool.
        connection = connect(":memory:", memory_limit_bytes=_PARSER_MEMORY_BYTES, threads=1)
        with _parser_connections_lock:
            _parsers.connection, _parsers.generation = connection, _parser_generation
            ended = [c for thread, c in _parser_connections if not thread.is_alive()]
            _parser_connections[:] = [
                (thread, c) for thread, c in _parser_connections if thread.is_alive()
            ]
            _parser_connections.append((threading.current_thread(), connection))
        for old in ended:
            with contextlib.suppress(Exception):
                old.close()
    return connection


def literal_cursor() -> Connection:
    """This thread's cursor of one process-wide empty sandboxed in-memory database with one
    DuckDB thread, for a SELECT of literals and parameters alone (``planner.literal_select``,
    ``literal_tokens``): it reads nothing of any database or session, so it gives there
    what it gives on a session's connection, without a hand-off to the database's worker
    thread (threads = 2 there: DuckDB schedules each statement's tasks on its scheduler,
    which wakes the worker, ~50-60 us of server CPU a statement; docs/statement_cost.md,
    round 7). One database for the process, a cursor (connection) of it per thread: a
    database per thread would bring DuckDB's native threads per client thread (review
    R5-2). The caller reads the result whole before anything else runs on this thread's
    cursor (``query_rows``: at most one row here)."""
    global _literal_database
    cursor = getattr(_literal_cursors, "cursor", None)
    if cursor is not None and getattr(_literal_cursors, "generation", None) == _parser_generation:
        return cursor
    with _parser_connections_lock:
        if _literal_database is None:
            _literal_database = connect(":memory:", memory_limit_bytes=_PARSER_MEMORY_BYTES,
                                        threads=1)  # fmt: skip
        cursor = _literal_database.cursor()
        _literal_cursors.cursor, _literal_cursors.generation = cursor, _parser_generation
        ended = [c for thread, c in _literal_cursor_list if not thread.is_alive()]
        _literal_cursor_list[:] = [(t, c) for t, c in _literal_cursor_list if t.is_alive()]
        _literal_cursor_list.append((threading.current_thread(), cursor))
    for old in ended:
        with contextlib.suppress(Exception):
            old.close()
    return cursor


_literal_database: Connection | None = None
_literal_cursors = threading.local()
_literal_cursor_list: list[tuple[threading.Thread, Connection]] = []

# A SELECT of literals alone, without parameters, gives the same one row every time it
# runs (``literal_result``): text -> that result. Bounded: at most ``limits.LITERAL_RESULTS_MAX``
# texts of at most ``limits.LITERAL_RESULT_TEXT_CHARS_MAX`` characters each (a row's values are
# no bigger than the text's literals). Emptied with the literal database (``close_parsers``).
# Each entry costs its text and ``LITERAL_COLUMN_BYTES`` a column (``BoundedCache``).
_literal_results = BoundedCache("engine.tables.literal_results", limits.LITERAL_RESULTS_MAX)
# The same for the streamed way (``literal_stream_result``), with DuckDB's type names.
_literal_streamed = BoundedCache("engine.tables.literal_streamed", limits.LITERAL_RESULTS_MAX)
# What a kept literal row holds a column, at most: DuckDB's Arrow of a literal row ~2 KB.
LITERAL_COLUMN_BYTES = 2048


def literal_result(sql: str, parameters: Any, *, line_offset: int = 0) -> pa.Table | Rows | None:
    """``query_rows`` of a SELECT of literals and parameters alone (``literal_tokens`` and
    ``RunQuery.literal_only`` both said so) on this thread's ``literal_cursor``. Without
    parameters its result depends on the text alone: no table, function, operator, cast
    or setting of any session is read (the literal database is empty, sandboxed and never
    configured by a user), and DuckDB evaluates constants deterministically. So that
    result is kept by text and given again without running DuckDB (~90-100 us of a
    server's CPU per ``SELECT 1``: docs/statement_cost.md, round 8). Only the DuckDB run
    is skipped: the caller plans and checks the statement (sandbox, privileges, the
    transaction's state) as for every statement. ``Rows`` come back as a new object with
    a new list each time (a caller may hold or change what it got); an Arrow table is
    immutable. An error is never kept: the text runs again and raises again. What is kept
    is the text's steady form: ``Rows`` for plain types (after the first run, which takes
    DuckDB's relation and teaches the rows' way the text), else DuckDB's Arrow table."""
    if parameters or len(sql) > limits.LITERAL_RESULT_TEXT_CHARS_MAX:
        return query_rows(literal_cursor(), sql, parameters, line_offset=line_offset)
    kept = _literal_results.get(sql)
    if kept is not None:
        return Rows(list(kept.rows), kept.schema) if type(kept) is Rows else kept
    result = query_rows(literal_cursor(), sql, None, line_offset=line_offset)
    # A text's first run gives DuckDB's Arrow even when its later runs give ``Rows`` (the
    # rows' way learns the text from it): kept is what the text gives from now on.
    if result is not None and _keepable(sql, result):
        assert result.num_rows == 1, "a SELECT of literals alone gives one row"
        kept = Rows(list(result.rows), result.schema) if type(result) is Rows else result
        _literal_results.put(sql, kept, _literal_cost(sql, result))
    return result


def kept_literal_result(sql: str) -> pa.Table | Rows | None:
    """What ``literal_result(sql, None)`` gives once ``sql``'s row is kept (a new ``Rows``
    object and list, or the immutable Arrow table), without running DuckDB; None while it
    is not kept (the caller then runs the statement the ordinary way, which keeps it)."""
    kept = _literal_results.get(sql)
    if kept is None:
        return None
    return Rows(list(kept.rows), kept.schema) if type(kept) is Rows else kept


def _keepable(sql: str, result: Rows | pa.Table) -> bool:
    """Whether ``result``, the run of the literal text ``sql``, is kept: its steady form
    (``Rows``, or an Arrow table the rows' way will not take) of at most
    ``limits.LITERAL_RESULT_COLUMNS_MAX`` columns, so that the kept results are bounded in bytes
    as well as in number."""
    if result.num_columns > limits.LITERAL_RESULT_COLUMNS_MAX:
        return False
    return type(result) is Rows or not _rows_way(sql)


def _literal_cost(sql: str, result: Rows | pa.Table) -> int:
    """What keeping ``result`` (one row) by ``sql`` costs, at most (``BoundedCache``)."""
    return TEXT_COST_PER_CHAR * len(sql) + LITERAL_COLUMN_BYTES * result.num_columns


def literal_stream_result(sql: str, parameters: Any,
                          batch_rows: int) -> tuple[Rows | pa.Table, list[str]]:  # fmt: skip
    """``literal_result`` for the streamed way (``Session.open_stream``: the simple
    protocol): the whole result read on this thread's ``literal_cursor`` (``batch_reader``,
    a row) and DuckDB's type name of each column, kept by text alike (the same bounds,
    the same steady form, nothing kept of an error or of a text with parameters)."""
    keep = not parameters and len(sql) <= limits.LITERAL_RESULT_TEXT_CHARS_MAX
    if keep:
        kept = _literal_streamed.get(sql)
        if kept is not None:
            result, duckdb_types = kept
            if type(result) is Rows:
                result = Rows(list(result.rows), result.schema)
            return result, list(duckdb_types)
    reader, duckdb_types = batch_reader(literal_cursor(), sql, parameters, batch_rows)
    result = reader.rows if isinstance(reader, RowsReader) else reader.read_all()
    if keep and _keepable(sql, result):
        assert result.num_rows == 1, "a SELECT of literals alone gives one row"
        copy = Rows(list(result.rows), result.schema) if type(result) is Rows else result
        _literal_streamed.put(sql, (copy, list(duckdb_types)), _literal_cost(sql, result))
    return result, duckdb_types


# Texts known to be (True) or not to be (False) a SELECT of literals and parameters alone
# by DuckDB's own tokens (``literal_tokens``); bounded as the small results' texts are.
_SMALL_RESULT_TEXTS_MAX = 1024
_literal_texts = BoundedCache("engine.tables.literal_texts", _SMALL_RESULT_TEXTS_MAX)
_LITERAL_KEYWORDS = frozenset({"NULL", "TRUE", "FALSE"})


def literal_tokens(sql: str) -> bool:
    """Whether DuckDB's own tokens of ``sql`` are those of a SELECT of literals and
    parameters alone: ``SELECT item, ...``, each item a number (a minus sign right before
    it is folded into the constant by DuckDB's parser: not an operator call), a string,
    a parameter (``$n``, ``?``), NULL, TRUE or FALSE, optionally followed by ``[AS] name``;
    nothing else (no parenthesis, cast, dot, operator, other keyword, or name but an
    alias). The planner's judgement of the same text (``RunQuery.literal_only``, from
    sqlglot's tree) is relied on only with this one: a text the two parsers read
    differently is not taken for one."""
    known = _literal_texts.get(sql)
    if known is not None:
        return known
    if len(sql) > limits.CACHED_TEXT_CHARS_MAX:
        return False
    try:
        tokens = sql_tokens(sql)
    except (errors.TopicbaseError, duckdb.Error):
        tokens = []
    literal = _literal_token_list(tokens)
    _literal_texts.put(sql, literal, TEXT_COST_PER_CHAR * len(sql))
    return literal


def _literal_token_list(tokens: list[SqlToken]) -> bool:
    """``SELECT item [, item ...]``, each item a value (``[-]number``, a string, ``$n``,
    ``?``, NULL, TRUE, FALSE) and optionally ``[AS] name``."""
    if not tokens or tokens[0].kind != "keyword" or tokens[0].text.upper() != "SELECT":
        return False
    index, count = 1, len(tokens)
    while True:
        index = _literal_value_end(tokens, index)
        if index < 0:
            return False
        if index < count and tokens[index].kind == "keyword" and tokens[index].text.upper() == "AS":
            index += 1
            if index >= count or tokens[index].kind != "identifier":
                return False
        if index < count and tokens[index].kind == "identifier":
            index += 1
        if index == count:
            return True
        if tokens[index].kind != "operator" or tokens[index].text != ",":
            return False
        index += 1


def _literal_value_end(tokens: list[SqlToken], index: int) -> int:
    """The index after the value starting at ``index`` (see ``_literal_token_list``), or -1."""
    if index >= len(tokens):
        return -1
    token = tokens[index]
    if token.kind in ("numeric_const", "string_const"):
        return index + 1
    if token.kind == "keyword" and token.text.upper() in _LITERAL_KEYWORDS:
        return index + 1
    if token.kind == "operator" and token.text == "?":
        return index + 1
    if token.kind == "operator" and token.text in ("-", "$") and index + 1 < len(tokens):
        following = tokens[index + 1]
        if following.kind == "numeric_const" and (token.text == "-" or following.text.isdigit()):
            return index + 2
    return -1


@atexit.register
def close_parsers() -> None:
    """Close every thread's parser connection and the literal database with its cursors
    (``literal_cursor``), and so DuckDB's threads behind them: at exit, and before a fork
    (``tests/sim/chaos.py``)."""
    global _parser_generation, _literal_database
    with _parser_connections_lock:
        connections, _parser_connections[:] = list(_parser_connections), []
        connections += _literal_cursor_list
        _literal_cursor_list[:] = []
        if _literal_database is not None:
            connections.append((threading.current_thread(), _literal_database))
            _literal_database = None
        _parser_generation += 1
        _literal_results.clear()
        _literal_streamed.clear()
    for _, connection in connections:
        with contextlib.suppress(Exception):
            connection.close()


def table_function_names() -> frozenset[str]:
    """Every table function and table macro DuckDB has built in (lower case)."""
    return _function_names()[0]


def expression_function_names() -> frozenset[str]:
    """Every scalar, aggregate and window function and macro DuckDB has built in (lower
    case); a few names are both (``histogram``)."""
    return _function_names()[1]


def _builtin_catalog_rows(sql: str) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` (a query of DuckDB's own catalog functions) on a new empty
    in-memory database, closed after: what DuckDB has built in, whatever the session."""
    connection = connect(":memory:", memory_limit_bytes=_PARSER_MEMORY_BYTES)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


@functools.cache
def builtin_view_queries() -> tuple[tuple[str, str], ...]:
    """(name in lower case, defining SQL) of every view DuckDB has built in
    (``duckdb_logs``, ``pg_catalog.pg_database`` …): the sandbox looks at what they call."""
    rows = _builtin_catalog_rows(
        "SELECT lower(view_name), sql FROM duckdb_views() WHERE internal"
    )
    return tuple((str(name), str(sql)) for name, sql in rows)


@functools.cache
def builtin_scalar_macros() -> tuple[tuple[str, str], ...]:
    """(name in lower case, body) of every scalar macro DuckDB has built in
    (``get_block_size`` …): the sandbox looks at what they call."""
    rows = _builtin_catalog_rows(
        "SELECT DISTINCT lower(function_name), macro_definition FROM duckdb_functions() "
        "WHERE internal AND function_type = 'macro' AND macro_definition IS NOT NULL"
    )
    return tuple((str(name), str(body)) for name, body in rows)


@functools.cache
def reserved_keywords() -> frozenset[str]:
    """DuckDB's reserved keywords in lower case (``AS``, ``AND``, ``FROM`` …): none of
    them names a column or an alias unless quoted."""
    rows = _builtin_catalog_rows(
        "SELECT keyword_name FROM duckdb_keywords() WHERE keyword_category = 'reserved'"
    )
    return frozenset(str(row[0]).lower() for row in rows)


@functools.cache
def builtin_macro_definitions() -> tuple[tuple[str, tuple[str, ...], str], ...]:
    """(name in lower case, parameter names, body) of every overload of DuckDB's built-in
    scalar macros: the sandbox counts what a call of one copies."""
    rows = _builtin_catalog_rows(
        "SELECT lower(function_name), parameters, macro_definition FROM duckdb_functions() "
        "WHERE internal AND function_type = 'macro' AND macro_definition IS NOT NULL"
    )
    return tuple((str(name), tuple(map(str, parameters or ())), str(body))
                 for name, parameters, body in rows)  # fmt: skip


def builtin_macro_bodies() -> tuple[tuple[str, bool, str], ...]:
    """(name in lower case, whether a table macro, body) of every overload of DuckDB's
    built-in macros: the sandbox counts the relations a call of one adds to a join."""
    rows = _builtin_catalog_rows(
        "SELECT lower(function_name), function_type = 'table_macro', macro_definition "
        "FROM duckdb_functions() WHERE internal AND function_type IN ('macro', "
        "'table_macro') AND macro_definition IS NOT NULL"
    )
    return tuple((str(name), bool(table), str(body)) for name, table, body in rows)


@functools.cache
def _function_names() -> tuple[frozenset[str], frozenset[str]]:
    rows = _builtin_catalog_rows(
        "SELECT DISTINCT lower(function_name), function_type IN ('table', 'table_macro') "
        "FROM duckdb_functions() WHERE function_type <> 'pragma'"
    )
    return (
        frozenset(str(name) for name, is_table in rows if is_table),
        frozenset(str(name) for name, is_table in rows if not is_table),
    )


# DuckDB's words for a text that is no integer of a PostgreSQL integer type (its INT16,
# INT32 and INT64 are smallint, integer and bigint; its INT8 is a TINYINT, left alone).
_INTEGER_CONVERSION = re.compile(r"^Could not convert string '(.*)' to INT(16|32|64)$")
_INTEGER_TYPE_NAMES = {"16": "smallint", "32": "integer", "64": "bigint"}
# PostgreSQL 15's integer input: blanks, a sign, ASCII digits, blanks
_POSTGRES_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)


def _integer_conversion_error(text: str) -> errors.TopicbaseError | None:
    """PostgreSQL's error for DuckDB's failed cast of a text to smallint, integer or bigint
    (a text parameter, a literal): 22003 for a well-formed integer out of the type's range
    (DuckDB reads every in-range one), else 22P02; None for any other message."""
    match = _INTEGER_CONVERSION.match(text.split("\n", 1)[0])
    if match is None:
        return None
    value, type_name = match.group(1), _INTEGER_TYPE_NAMES[match.group(2)]
    if _POSTGRES_INTEGER.fullmatch(value):
        return NumericOutOfRangeError(f'value "{value}" is out of range for type {type_name}')
    return InvalidTextRepresentationError(f'invalid input syntax for type {type_name}: "{value}"')


# DuckDB's binder refusals that PostgreSQL files under a narrower code (class 42 mostly), matched
# against the message's first line in lower case (DuckDB's own words: a quoted statement
# follows on later lines), in order: the first match decides.
_BINDER_CODES: tuple[tuple[re.Pattern[str], type[errors.TopicbaseError]], ...] = tuple(
    (re.compile(pattern), error_class)
    for pattern, error_class in (
        (r"must appear in the group by clause", errors.GroupingError),
        (r"cannot contain aggregates", errors.GroupingError),
        (r"aggregate function calls cannot be nested", errors.GroupingError),
        (r"aggregate functions are not allowed", errors.GroupingError),
        (r"cannot contain window functions", errors.WindowingError),
        (r"^window functions are not (supported|allowed)", errors.WindowingError),
        (r"^(order|group) by term out of range|^order term out of range",
         errors.InvalidColumnReferenceError),
        (r"^ambiguous reference to column", errors.AmbiguousColumnError),
        (r"^ambiguous reference to table", errors.DuplicateAliasError),
        (r"^grouping (child .* must be a grouping column|statement cannot be used)",
         errors.GroupingError),
        (r"^at least one window function must appear", errors.WindowingError),
        (r"^could not choose a best candidate function", errors.AmbiguousFunctionError),
        (r"^collate can only be applied to", errors.DatatypeMismatchError),
        (r"^limit/offset cannot be negative", errors.InvalidRowCountError),
        (r"not supported", errors.FeatureNotSupportedError),
        # PostgreSQL's "each UNION query must have the same number of columns" and
        # "subquery must return only one column" are syntax errors
        (r"^set operations can only apply to expressions with the same number",
         errors.SqlSyntaxError),
        (r"^subquery returns \d+ columns - expected 1", errors.SqlSyntaxError),
        (r'^table ".*" has \d+ columns but \d+ values were supplied', errors.SqlSyntaxError),
        (r"^star expression is only allowed as the root", errors.SqlSyntaxError),
    )
)


def _narrower_binder_error(text: str) -> errors.TopicbaseError | None:
    """PostgreSQL's narrower class 42 error for a DuckDB binder refusal (42803 grouping,
    42P20 windowing, 42P10 a position out of range, 42702 an ambiguous column, 42712 a
    duplicate alias, 42725 an ambiguous function, 42804, 2201W, 0A000, 42601), None when no
    narrower one fits."""
    first_line = text.split("\n", 1)[0].lower()
    for pattern, error_class in _BINDER_CODES:
        if pattern.search(first_line):
            return error_class(text)
    return None


def translate(error: duckdb.Error) -> errors.TopicbaseError:
    """Map a DuckDB exception to a Topicbase error carrying a SQLSTATE."""
    message = str(error)
    text = _hidden_hints(_strip_prefix(message))
    lowered = message.lower()
    if isinstance(error, duckdb.ParserException | duckdb.BinderException) and (
        text.lower().startswith("max expression depth")  # not the quoted query after it
    ):
        return errors.StatementTooComplexError(
            f"statement too complex: nesting deeper than {limits.DUCKDB_EXPRESSION_DEPTH_MAX}"
        )
    if isinstance(error, duckdb.ParserException):
        return errors.SqlSyntaxError(text)
    if isinstance(error, duckdb.PermissionException):
        # The sandbox's last line (external access off): a host file, the network,
        # another database or an extension.
        return errors.InsufficientPrivilegeError(f"not allowed in Topicbase: {text}")
    if "transaction is aborted" in lowered:
        return errors.InFailedTransactionError(
            "current transaction is aborted, commands ignored until end of transaction block"
        )
    # Only DuckDB's own words: a quoted statement (``LINE 1: … ON CONFLICT …``) is not one.
    if isinstance(error, duckdb.TransactionException) or "conflict" in lowered.split("\n", 1)[0]:
        return errors.SerializationFailure(
            f"could not serialize access due to concurrent update: {text}"
        )
    if isinstance(error, duckdb.ConstraintException):
        if "not null" in lowered:
            return NotNullViolationError(text)
        return UniqueViolationError(text)
    if isinstance(error, duckdb.CatalogException):
        if "already exists" in lowered:
            return DuplicateTableError(text)
        if "function" in lowered or "macro" in lowered:
            return UndefinedFunctionError(text)
        if text.lower().startswith("type with name"):
            return errors.UndefinedObjectError(text)  # PostgreSQL's 'type "x" does not exist'
        return errors.UndefinedTopicError(text)
    if isinstance(error, duckdb.BinderException):
        narrower = _narrower_binder_error(text)
        if narrower is not None:
            return narrower
        if text.lower().startswith("cannot extract field"):
            # ``s.a.a`` where ``s.a`` is no struct (DuckDB's words quote the expression,
            # whose text may say "column" or "function")
            return errors.WrongObjectTypeError(text)
        if ("column" in lowered or "referenced" in lowered
                or text.lower().startswith("could not find key")):  # fmt: skip
            # (a struct's missing field: PostgreSQL's "could not identify column")
            return UndefinedColumnError(text)
        if "function" in lowered:
            return UndefinedFunctionError(text)
        return errors.SyntaxErrorOrAccessRuleViolation(text)
    if isinstance(error, duckdb.OutOfRangeException):
        return NumericOutOfRangeError(text)
    if "division by zero" in lowered:
        return DivisionByZeroError("division by zero")  # PostgreSQL's words, no DuckDB advice
    if "configuration has been locked" in lowered:
        return errors.InsufficientPrivilegeError(
            f"DuckDB's settings are fixed by Topicbase and cannot be changed: {text}"
        )
    if isinstance(error, duckdb.ConversionException | duckdb.InvalidInputException):
        return _integer_conversion_error(text) or InvalidTextRepresentationError(text)
    if isinstance(error, duckdb.IOException):
        return errors.StorageIOError(text)
    if isinstance(error, duckdb.NotImplementedException):
        return errors.FeatureNotSupportedError(text)
    if isinstance(error, duckdb.OutOfMemoryException):
        # DuckDB's advice (SET threads, …) names settings users may not change.
        return errors.OutOfMemoryError(
            "out of memory: " + text.split("\n", 1)[0] + " (the statement needs more memory "
            "than the server's limit and could not spill to disk)"
        )
    if isinstance(error, duckdb.InterruptException):
        return errors.QueryCanceledError("canceling statement due to user request")
    return errors.TopicbaseError(text)


def _strip_prefix(message: str) -> str:
    return re.sub(r"^[A-Za-z ]+ Error: ", "", message, count=1)


# DuckDB's "Did you mean ...?" hint when it names the internal schema's tables: a user
# who misspells a table must not learn the internal catalog's names from it.
_INTERNAL_HINT = re.compile(r'\nDid you mean "__topicbase\.[^"\n]*"\?', re.IGNORECASE)


def _hidden_hints(text: str) -> str:
    return _INTERNAL_HINT.sub("", text) if "__topicbase" in text.lower() else text


class translated:  # lower case: used as ``with translated(...)``, as the function was
    """Run a block, turning DuckDB exceptions into Topicbase errors.

    ``line_offset`` moves the ``LINE n:`` of DuckDB's syntax errors to the
    statement's place in its script. A class rather than a generator's context manager:
    every statement enters one or more (a generator's costs several times as much).
    """

    __slots__ = ("line_offset",)

    def __init__(self, line_offset: int = 0) -> None:
        self.line_offset = line_offset

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: Any) -> bool:  # fmt: skip
        if error is None:
            return False
        if isinstance(error, duckdb.Error):
            translated_error = translate(error)
            if self.line_offset and isinstance(translated_error, errors.SqlSyntaxError):
                translated_error = _shift_lines(translated_error, self.line_offset)
            raise translated_error from error
        if isinstance(error, pa.ArrowInvalid):
            # A result type nested deeper than Arrow follows ([[[...]]] 150 levels deep).
            if "recursion level" in str(error).lower():
                raise errors.StatementTooComplexError(
                    f"statement too complex: its result type is nested too deeply ({error})"
                ) from error
            return False
        if isinstance(error, RuntimeError) and "interrupted" in str(error).lower():
            # DuckDB reports an interrupt this way
            raise errors.QueryCanceledError("canceling statement due to user request") from error
        if isinstance(error, OSError) and str(error).startswith("INTERRUPT Error"):
            # ... and this way through its Arrow batch reader (pyarrow's IOError status): a
            # statement_timeout or cancel while a DECLARE reads its batches (round 26)
            raise errors.QueryCanceledError("canceling statement due to user request") from error
        return False


def _shift_lines(error: errors.SqlSyntaxError, offset: int) -> errors.SqlSyntaxError:
    def shift(match: re.Match[str]) -> str:
        return f"LINE {int(match.group(1)) + offset}:"

    message = re.sub(r"LINE (\d+):", shift, error.message)
    # Keep the caret under the same character: the "LINE n: " prefix may have grown.
    old_prefix = re.search(r"LINE (\d+): ", error.message)
    if old_prefix:
        grown = len(str(int(old_prefix.group(1)) + offset)) - len(old_prefix.group(1))
        if grown:
            lines = message.split("\n")
            message = "\n".join(
                " " * grown + line if set(line.strip()) == {"^"} else line for line in lines
            )
    return errors.SqlSyntaxError(message)


def run(cursor: Connection, sql: str, parameters: Any = None) -> None:
    with translated():
        _execute(cursor, sql, parameters)


def _execute(cursor: Connection, sql: str, parameters: Any = None) -> None:
    """``cursor.execute(sql, parameters)``, from ``sql``'s parsed statement once the cursor
    has one (``CursorPlans.statement``): DuckDB's parse of the text is skipped."""
    cursor.execute(_plans_of(cursor).statement(cursor, sql), parameters)


def query_arrow(
    cursor: Connection, sql: str, parameters: Any = None, *, line_offset: int = 0
) -> pa.Table | None:
    """Run ``sql``; return its result as Arrow (DML gives DuckDB's one-row ``Count``).

    None when the statement produced no relation at all.

    Two ways, the same table: DuckDB's relation (``cursor.sql``: it binds the statement
    before running it, ~0.3-0.6 ms more per statement) and ``execute`` + ``fetchmany`` with
    the Arrow table built here from the rows. The second is taken for a text whose last
    result had only ``_ROW_ARROW_TYPES`` columns and at most ``SMALL_RESULT_ROWS`` rows
    (``_small_results``, learnt per text), and for a text not seen yet whose shape (the
    text with its literals taken out) gave such results and never a big one
    (``_rows_way``); should a result turn out bigger, the rest comes as Arrow from DuckDB
    and the text (and its shape, for good) goes back to the relation. A SELECT of
    nothing but unnested list parameters is built without DuckDB (``engine.unnest_source``).
    """
    if parameters and (built := unnest_source.unnested(sql, parameters)) is not None:
        return built  # DuckDB's table of it, built here
    with translated(line_offset):
        if _rows_way(sql):
            return _query_small(cursor, sql, parameters)
        relation = cursor.sql(_plans_of(cursor).statement(cursor, sql), params=parameters or None)
        if relation is None:
            return None
        table = relation.to_arrow_table()
        _learn(sql, [str(kind) for kind in relation.types], table.num_rows)
        return table


def query_rows(
    cursor: Connection, sql: str, parameters: Any = None, *, line_offset: int = 0
) -> pa.Table | Rows | None:
    """``query_arrow``, except that a result the rows' way read whole comes as ``Rows``
    (the same values and schema, its Arrow table not built: ``Rows.to_arrow`` gives it).
    For a caller that hands the result on (``Session``: ``Result`` builds the table
    when it is read)."""
    with translated(line_offset):
        if _rows_way(sql):
            head, more, _ = _small_rows(cursor, sql, parameters)
            if not more:
                return head
            rest = _rest_as_arrow(cursor)  # a big result after all, or other types
            if head is None or rest is None:
                return head.to_arrow() if rest is None and head is not None else rest
            return pa.concat_tables([head.to_arrow(), rest])
    return query_arrow(cursor, sql, parameters, line_offset=line_offset)


# Column types whose Python values (``fetchmany``) convert to DuckDB's own Arrow types
# exactly (``tests/engine/test_statement_cost_results.py`` compares both ways); dates and
# timestamps are not among them (DuckDB gives Python its infinities as the largest date).
_ROW_ARROW_TYPES: dict[str, pa.DataType] = {
    "BOOLEAN": pa.bool_(), "TINYINT": pa.int8(), "SMALLINT": pa.int16(),
    "INTEGER": pa.int32(), "BIGINT": pa.int64(), "UTINYINT": pa.uint8(),
    "USMALLINT": pa.uint16(), "UINTEGER": pa.uint32(), "UBIGINT": pa.uint64(),
    "FLOAT": pa.float32(), "DOUBLE": pa.float64(), "VARCHAR": pa.string(), "BLOB": pa.binary(),
}  # fmt: skip
SMALL_RESULT_ROWS = 64
_LITERAL_KINDS = frozenset({"string_const", "numeric_const"})


class _SmallResults:
    """Statement text -> whether its last result was small and plain (True: the rows'
    way), and beside it ``shapes``: a text's shape (its DuckDB tokens with every string and
    number literal taken out: the texts of a client that binds values on its side, such as
    psycopg's ``ClientCursor`` and psycopg2, differ only there) -> True once a text of that
    shape gave a small plain result, False for good once one gave another (a big result
    on the rows' way costs ~3x its relation's: DuckDB copies an executed result's rows for
    Arrow). A shape only decides for a text not seen yet. ``clear`` forgets both.

    Each map is a ``BoundedCache`` (entries cost their text's or shape's characters:
    a text costs ``TEXT_COST_PER_CHAR`` bytes a character, its key and its shape), so
    a client's distinct wide texts cannot make them hold more than their byte budgets.
    Shared by every session's thread: lookups take no lock; changes are made under
    ``_lock``, so a shape once False is never set True again (until cleared or evicted)."""

    def __init__(self) -> None:
        self.texts = BoundedCache("engine.tables.small_results", _SMALL_RESULT_TEXTS_MAX)
        self.shapes = BoundedCache("engine.tables.small_shapes", _SMALL_RESULT_TEXTS_MAX)
        # text -> its shape (None: none)
        self.shape_of = BoundedCache("engine.tables.shape_of", _SMALL_RESULT_TEXTS_MAX)
        self._lock = threading.Lock()
        self.get = self.texts.get  # ``sql`` -> bool or None: one call on the hot path

    def __contains__(self, sql: str) -> bool:
        return sql in self.texts

    def __getitem__(self, sql: str) -> bool:
        known = self.texts.get(sql)
        if known is None:
            raise KeyError(sql)
        return known  # type: ignore[no-any-return]

    def clear(self) -> None:
        with self._lock:
            self.texts.clear()
            self.shapes.clear()
            self.shape_of.clear()

    def shape(self, sql: str) -> str | None:
        """``sql``'s shape (None for a text too long to keep or that does not tokenize)."""
        known = self.shape_of.get(sql, _NO_SHAPE)
        if known is not _NO_SHAPE:
            return known  # type: ignore[no-any-return]
        shape = None
        if len(sql) <= limits.CACHED_TEXT_CHARS_MAX:
            try:
                tokens = sql_tokens(sql)
            except (errors.TopicbaseError, duckdb.Error):  # DuckDB's error at run time
                tokens = None
            if tokens is not None:
                shape = "\x1f".join(
                    "?" if token.kind in _LITERAL_KINDS else token.text for token in tokens
                )
            cost = TEXT_COST_PER_CHAR * (len(sql) + (0 if shape is None else len(shape)))
            self.shape_of.put(sql, shape, cost)
        return shape

    def mark(self, sql: str, small: bool) -> None:
        """Remember ``sql``'s outcome, and its shape's (a shape not small stays so)."""
        if len(sql) > limits.CACHED_TEXT_CHARS_MAX:
            return
        shape = self.shape(sql)
        with self._lock:
            self.texts.put(sql, small, TEXT_COST_PER_CHAR * len(sql))
            if shape is None or self.shapes.get(shape) is False:
                return
            self.shapes.put(shape, small, TEXT_COST_PER_CHAR * len(shape))


_NO_SHAPE = object()
_small_results = _SmallResults()


def _rows_way(sql: str) -> bool:
    """Whether ``sql`` runs on the rows' way: as its last result says, or for a text not
    seen yet, as the results of its shape say."""
    known = _small_results.get(sql)
    if known is not None:
        return known
    shape = _small_results.shape(sql)
    return shape is not None and _small_results.shapes.get(shape) is True


def _learn(sql: str, duckdb_types: list[str], rows: int | None) -> None:
    """Remember how ``sql``'s result came out; ``rows`` None: not known yet (a stream), the
    text is tried on the rows' way unless it was already known big."""
    plain = all(kind in _ROW_ARROW_TYPES for kind in duckdb_types)
    if rows is None:
        if not plain or sql in _small_results:
            return
        small = True
    else:
        small = plain and rows <= SMALL_RESULT_ROWS
    _small_results.mark(sql, small)


def _query_small(cursor: Connection, sql: str, parameters: Any) -> pa.Table | None:
    head, more = _small_head(cursor, sql, parameters)
    if not more:
        return head
    rest = _rest_as_arrow(cursor)  # a big result after all, or other types
    if head is None or rest is None:
        return head if rest is None else rest
    return pa.concat_tables([head, rest])


def _small_head(cursor: Connection, sql: str, parameters: Any) -> tuple[pa.Table | None, bool]:
    """Execute ``sql``; its first rows as Arrow built from them (``SMALL_RESULT_ROWS``
    and one), and whether the result holds more. A result of other types (changed by
    DDL) gives no head and more = True: all of it is left to DuckDB."""
    head, more, _ = _small_rows(cursor, sql, parameters)
    return (None if head is None else head.to_arrow()), more


def _small_rows(
    cursor: Connection, sql: str, parameters: Any
) -> tuple[Rows | None, bool, list[str] | None]:
    """``_small_head`` with the head as ``Rows`` (its Arrow table not built), and DuckDB's
    type name of each result column (None: no result). With more = True the rest of the
    result is still the cursor's, streamed by DuckDB (``execute`` of a query streams to
    ``fetchmany``; ``FetchReader`` reads it on).
    A text without parameters runs from its kept plan (``CursorPlans``) once it has one:
    afterwards the cursor may hold another statement's result (the PREPARE) unless more
    is True, so its ``description`` is read here. A plan gives at most the head and one
    row (DuckDB runs an EXECUTE to its end, holding its whole result): when its result
    is not small and plain after all, the plan is dropped and the text runs again,
    streamed (nothing of the plan's run was returned; a SELECT's only effect is
    nextval's, which may leave gaps as any sequence may)."""
    plans = _plans_of(cursor)
    plan = None if parameters else plans.name(sql)
    if plan is not None and not plans.still_viewless(cursor, sql):
        plans.failed(sql, plan)  # a view now: the text runs itself from now on
        plan = None
    if plan is not None:
        try:
            plans.run(cursor, f"EXECUTE {plan}")
        except duckdb.Error:
            plans.failed(sql, plan)
            raise
        description = cursor.description
        head = _fetch_head(cursor, sql, description)
        if not head[1] and plans.describes(sql, description):
            return head
        plans.failed(sql, plan)  # grown, other types or other names: the text itself
        cursor.abort()  # the plan's result, unfinished
    cursor.execute(plans.statement(cursor, sql), parameters or None)
    head = _fetch_head(cursor, sql, cursor.description)
    if not parameters and not head[1] and head[0] is not None:
        plans.succeeded(cursor, sql)  # the result is read whole: the cursor is free
    return head


def _fetch_head(
    cursor: Connection, sql: str, description: Any
) -> tuple[Rows | None, bool, list[str] | None]:
    """The head of the result ``cursor`` just executed for ``sql`` (see ``_small_rows``;
    ``description`` is the cursor's, read once by the caller), and what it says of ``sql``
    learnt (``_small_results``)."""
    if description is None:
        return None, False, None
    key = _shape_key(description)
    duckdb_types = [kind for _, kind in key]
    shape = _row_shape(description, key)
    if shape is None:
        _small_results.mark(sql, False)
        return None, True, duckdb_types
    _, schema = shape
    rows = cursor.fetchmany(SMALL_RESULT_ROWS + 1)
    more = len(rows) > SMALL_RESULT_ROWS
    if more:
        _small_results.mark(sql, False)  # a big result: the relation's way from now on
    return Rows(rows, schema), more, duckdb_types


# DuckDB's plans of repeated queries. ``execute("SELECT 1")`` parses, binds, plans and
# optimizes the text on every run (~200 us); ``EXECUTE`` of the same text PREPAREd once
# on the same connection runs its kept plan (~60-100 us). DuckDB binds a prepared
# statement again whenever what it was bound against moved (DDL, a registered relation
# replaced, ``SET search_path``/``schema``, a temp table shadowing a table: the same
# binding as the text's, docs/statement_cost.md), so the plan gives what the text would.
PLAN_PREFIX = "__topicbase_plan_"
PLANS_PER_CURSOR = 64
PARSED_PER_CURSOR = 128  # parsed statements kept per cursor (``CursorPlans.statement``)
# A query on the rows' way, without parameters, one statement: SELECT and no ';' at all.
_PLANNABLE = re.compile(r"\s*SELECT\b", re.IGNORECASE)
_plan_numbers = iter(range(1, sys.maxsize))
_plans_lock = threading.Lock()


# What a kept plan may hold. DuckDB folds constant expressions when it plans, and a plan
# keeps the folded values: ``SELECT repeat('x', 100000000) AS v`` (36 characters) kept
# ~100 MB a plan, 64 plans a cursor (review R2 F1, round 23: +294 MiB from 20 such texts).
# DuckDB also pulls a subquery's or an alias's constant up into every expression that
# names it, so ``concat(s, s, ..., s)`` over ``(SELECT '<30,000 x>' AS s)`` folded one
# 300 MB value from a 50 KB text (review R2 F6). So a text is kept only when no value can
# grow in folding: every call is one of ``_BOUNDED_FUNCTIONS``, none of whose values is
# larger than its largest argument (or than a row of the tables it reads: aggregates are
# never folded); no ``||``, no list, struct or row built (``[``, ``{``, a parenthesized
# list); and the text and its string literals are short (``limits.PLANNED_*``). Then each
# folded value is at most one literal and there are fewer of them than tokens. Anything
# else (``repeat``, ``lpad``, ``concat``, ``range`` (a keyword to DuckDB's lexer),
# ``replace``, list functions, a macro) keeps the text out of the plans: it runs as text
# every time, as every text did before plans were kept.
_BOUNDED_FUNCTIONS = frozenset({
    # aggregates (never folded) and window functions
    "count", "count_star", "sum", "min", "max", "avg", "mean", "any_value", "first",
    "last", "arg_min", "arg_max", "bool_and", "bool_or", "stddev", "stddev_pop",
    "stddev_samp", "variance", "var_pop", "var_samp", "median", "mode", "row_number",
    "rank", "dense_rank", "lag", "lead",
    # scalars whose value is no larger than their largest argument (or of a fixed size)
    "lower", "upper", "lcase", "ucase", "length", "len", "strlen", "octet_length",
    "abs", "round", "floor", "ceil", "ceiling", "sign", "coalesce", "ifnull", "nullif",
    "greatest", "least", "if", "substring", "substr", "left", "right", "trim", "ltrim",
    "rtrim", "starts_with", "ends_with", "contains", "prefix", "suffix", "hash", "md5",
    "now", "current_date", "current_timestamp", "date_trunc", "date_part", "extract",
    "epoch", "year", "month", "day", "hour", "minute", "second", "typeof", "isnan",
    "isinf", "error",
})  # fmt: skip
# Words before ``(`` that are syntax, not calls (nor a row built: ``ROW(`` is not here).
_SYNTAX_BEFORE_PAREN = frozenset({
    "select", "from", "where", "and", "or", "not", "in", "exists", "as", "on", "using",
    "join", "by", "having", "then", "else", "when", "case", "is", "like", "ilike",
    "between", "any", "all", "some", "over", "filter", "cast", "try_cast", "union",
    "except", "intersect", "distinct", "limit", "offset", "qualify", "order",
    "partition", "group", "window", "with", "lateral", "decimal", "numeric", "varchar",
    "char", "character",
})  # fmt: skip
# Operators that build a value from several: concatenation, lists, structs, maps.
_GROWING_OPERATORS = frozenset({"||", "[", "{"})


def bounded_constants(sql: str) -> bool:
    """Whether a plan of ``sql`` holds folded values of a size bounded by the text's (see
    ``_BOUNDED_FUNCTIONS``), read with DuckDB's lexer (quoted or qualified names alike).
    False for a text DuckDB cannot tokenize."""
    if len(sql) > limits.PLANNED_TEXT_CHARS_MAX:
        return False
    try:
        tokens = sql_tokens(sql)
    except errors.TopicbaseError:
        return False
    if _reuses_an_alias(tokens):
        return False
    for at, token in enumerate(tokens):
        if token.kind == "string_const" and len(token.text) > limits.PLANNED_LITERAL_CHARS_MAX:
            return False
        if token.kind == "operator":
            if token.text in _GROWING_OPERATORS:
                return False
            if token.text == "(" and not _called(tokens, at) and _lists(tokens, at):
                return False  # ``(a, b)``: a row (struct) built of its items
            continue
        if at + 1 >= len(tokens) or tokens[at + 1].text != "(":
            continue
        if token.kind not in ("identifier", "keyword"):
            continue
        name = token.text
        if name[:1] == '"' and name[-1:] == '"':
            name = name[1:-1].replace('""', '"')
        name = name.lower()
        if name not in _BOUNDED_FUNCTIONS and name not in _SYNTAX_BEFORE_PAREN:
            return False
    return True


# Syntax words whose ``(`` holds a list that builds no value: IN's values, USING's columns,
# a window's or a type's terms, a cast.
_LIST_SYNTAX = frozenset({"in", "using", "over", "filter", "cast", "try_cast", "exists",
                          "any", "all", "some", "decimal", "numeric", "varchar", "char",
                          "character"})  # fmt: skip


def _reuses_an_alias(tokens: list[SqlToken]) -> bool:
    """Whether a name given with ``AS`` (or written straight after an expression: an alias
    without AS) is named again in the text. DuckDB puts an alias's expression in place of
    each use (``SELECT a AS x0, x0 + x0 AS x1, ..., x15 + x15 AS x16``: 280 characters,
    a tree of 2^16 nodes, 118 MiB in a plan; review R2 F9), so such a text is not kept."""
    aliases: set[str] = set()
    for at in range(1, len(tokens)):
        token = tokens[at]
        if token.kind != "identifier":
            continue
        before = tokens[at - 1]
        if (
            before.text.upper() == "AS"
            or before.kind in ("identifier", "string_const", "numeric_const")
            or before.text == ")"
        ):
            aliases.add(_word(token.text))
    if not aliases:
        return False
    uses = [_word(t.text) for t in tokens if t.kind == "identifier"]
    return any(uses.count(alias) > 1 for alias in aliases)


def _word(text: str) -> str:
    return (text[1:-1].replace('""', '"') if text[:1] == '"' else text).lower()


def _called(tokens: list[SqlToken], at: int) -> bool:
    """Whether the ``(`` at ``at`` opens a call's arguments or a ``_LIST_SYNTAX`` list (not
    a parenthesized expression, subquery or row)."""
    if at == 0 or tokens[at - 1].kind not in ("identifier", "keyword"):
        return False
    word = tokens[at - 1].text
    word = (word[1:-1].replace('""', '"') if word[:1] == '"' else word).lower()
    return word in _BOUNDED_FUNCTIONS or word in _LIST_SYNTAX


def _lists(tokens: list[SqlToken], at: int) -> bool:
    """Whether the parentheses opened at ``at`` hold a comma at their own depth."""
    depth = 0
    for token in tokens[at:]:
        if token.text == "(":
            depth += 1
        elif token.text == ")":
            depth -= 1
            if depth == 0:
                return False
        elif token.text == "," and depth == 1:
            return True
    return False


def _names_a_view(cursor: Connection, sql: str) -> bool:
    """Whether a word of ``sql`` (DuckDB's tokens) names a view the user's SQL made: its
    body, constants and all, would be folded into a plan (``SELECT length(s) FROM v`` over
    ``v AS SELECT repeat('x', 40000000) AS s`` kept 40 MB a plan). DuckDB's own catalog
    views fold nothing large. One catalog query."""
    try:
        tokens = sql_tokens(sql)
    except errors.TopicbaseError:
        return True
    words = sorted({
        (t.text[1:-1].replace('""', '"') if t.text[:1] == '"' else t.text).lower()
        for t in tokens if t.kind in ("identifier", "keyword")
    })  # fmt: skip
    if not words:
        return False
    cursor.execute(
        "SELECT count(*) FROM duckdb_views() WHERE NOT internal AND list_contains(?, "
        "lower(view_name))",
        [words],
    )
    rows = cursor.fetchall()  # read to its end: the cursor is free again
    return not rows or int(rows[0][0]) > 0


class CursorPlans:
    """The prepared plans of one DuckDB connection (cursor), by statement text.

    A text is PREPAREd the second time it succeeds on the rows' way, right after it ran
    in the same transaction (a PREPARE that failed would abort an open transaction; one
    of a text that just bound cannot fail), and EXECUTEd from then on. At most
    ``PLANS_PER_CURSOR`` texts are remembered; the least recently used is DEALLOCATEd.
    A plan whose EXECUTE failed (its table dropped, say: the error is the text's, but
    without DuckDB's ``LINE n:`` excerpt) is forgotten, and DEALLOCATEd at the next
    PREPARE, when the cursor's transaction is known good. It also keeps the texts the
    cursor runs as DuckDB parsed them (``statement``, at most ``PARSED_PER_CURSOR``),
    for every statement with or without parameters. Used by one thread at a time (the
    cursor's session), so only the registry ``_plans`` is locked."""

    def __init__(self) -> None:
        self._names: dict[str, str | None] = {}  # text -> plan, None: seen once
        self._columns: dict[str, tuple[str, ...]] = {}  # text with a plan -> column names
        self._dropped: list[str] = []
        # Relations registered on the cursor now (``register``; the engine registers topic
        # reads and system views for one statement): a text run while any is registered
        # is not kept, so that no plan holds a registered table alive past its statement.
        self.registered: set[str] = set()
        # How far this object's own PREPARE/EXECUTE/DEALLOCATE moved DuckDB's catalog
        # version (``catalog_version``), measured around each of them.
        self.own_moves = 0
        # text -> its one statement as DuckDB parsed it (None: not one statement), and
        # the characters of those texts together.
        self._parsed: dict[str, duckdb.Statement | None] = {}
        self._parsed_chars = 0
        # text with a plan -> the catalog version it was last found to name no view at
        self._versions: dict[str, int | None] = {}

    def statement(self, cursor: Connection, sql: str) -> duckdb.Statement | str:
        """What to hand ``cursor.execute`` for ``sql``: the statement DuckDB parsed from it
        (kept: DuckDB's parse costs ~20-40 us a statement, and executing a parsed statement
        skips it), or the text itself when it is not exactly one statement, too long to
        keep, or does not parse (executing the text then gives DuckDB's own error). At
        most ``PARSED_PER_CURSOR`` texts of ``limits.PARSED_CHARS_PER_CURSOR_MAX``
        characters together are kept; the least recently used goes first.

        Executing the parsed statement is executing the text: DuckDB's Python client
        parses a text into statements and executes those, and the parse depends on the
        text alone (the parser's settings are locked by ``connect``). The statement binds
        afresh on every run (names, types, search path, parameters), and its errors quote
        the text as the text's do (``tests/engine/test_statement_cost_parsed.py``)."""
        if sql in self._parsed:
            parsed = self._parsed.pop(sql)
            self._parsed[sql] = parsed  # most recently used: last
            return sql if parsed is None else parsed
        if len(sql) > limits.PARSED_TEXT_CHARS_MAX:
            return sql
        try:
            statements = cursor.extract_statements(sql)
        except duckdb.Error:
            return sql
        parsed = statements[0] if len(statements) == 1 else None
        self._parsed[sql] = parsed
        self._parsed_chars += len(sql)
        while (
            len(self._parsed) > PARSED_PER_CURSOR
            or self._parsed_chars > limits.PARSED_CHARS_PER_CURSOR_MAX
        ):
            oldest = next(iter(self._parsed))
            del self._parsed[oldest]
            self._parsed_chars -= len(oldest)
        assert self._parsed_chars >= 0
        return sql if parsed is None else parsed

    def run(self, cursor: Connection, sql: str) -> None:
        """Run one of this object's statements, counting the catalog version it moves."""
        before = _raw_catalog_version(cursor)
        try:
            cursor.execute(self.statement(cursor, sql))
        finally:
            after = _raw_catalog_version(cursor)
            if before is not None and after is not None:
                self.own_moves += after - before

    def name(self, sql: str) -> str | None:
        """The plan of ``sql`` if it has one (the text becomes the most recently used)."""
        if sql not in self._names:
            return None
        name = self._names.pop(sql)
        self._names[sql] = name
        return name

    def failed(self, sql: str, name: str) -> None:
        if self._names.get(sql) == name:
            del self._names[sql]
            self._columns.pop(sql, None)
            self._versions.pop(sql, None)
        self._dropped.append(name)

    def still_viewless(self, cursor: Connection, sql: str) -> bool:
        """Whether ``sql``'s plan may run: it names no view, checked again whenever the
        catalog moved since (a table replaced by a view of its name: DuckDB binds the plan
        again, against the view)."""
        version = catalog_version(cursor)
        if version is not None and self._versions.get(sql) == version:
            return True
        if _names_a_view(cursor, sql):
            return False
        self._versions[sql] = version
        return True

    def describes(self, sql: str, description: Any) -> bool:
        """Whether a result of ``sql``'s plan with DuckDB's ``description`` has the column
        names ``sql`` had when PREPAREd (the plan reads the text as a subquery)."""
        names = self._columns.get(sql)
        return (
            names is not None
            and len(names) == len(description)
            and all(name == column[0] for name, column in zip(names, description, strict=True))
        )

    def succeeded(self, cursor: Connection, sql: str) -> None:
        """``sql`` just ran and its result was read whole: note it, or PREPARE it if it
        was seen before."""
        if (
            self.registered
            or len(sql) > limits.CACHED_TEXT_CHARS_MAX
            or ";" in sql
            or not _PLANNABLE.match(sql)
            or not bounded_constants(sql)
        ):
            return
        if sql not in self._names:
            self._names[sql] = None
            self._evict(cursor)
            return
        names = tuple(str(column[0]) for column in cursor.description or ())
        if len({name.lower() for name in names}) != len(names):
            return  # a subquery would rename the repeated names
        if _names_a_view(cursor, sql):  # (after ``description`` was read: it runs a query)
            return  # a view's body is folded into the plan: not kept (review R2 F2)
        name = f"{PLAN_PREFIX}{next(_plan_numbers)}"
        for dropped in self._dropped:
            self.run(cursor, f"DEALLOCATE {dropped}")
        self._dropped.clear()
        # At most the head and one row (``_small_rows``): DuckDB holds an EXECUTE's whole
        # result. The newline ends a trailing ``--`` comment of the text.
        self.run(
            cursor, f"PREPARE {name} AS SELECT * FROM (\n{sql}\n) LIMIT {SMALL_RESULT_ROWS + 1}"
        )
        self._names[sql] = name
        self._columns[sql] = names
        self._versions[sql] = catalog_version(cursor)
        self._evict(cursor)

    def _evict(self, cursor: Connection) -> None:
        while len(self._names) > PLANS_PER_CURSOR:
            oldest = next(iter(self._names))
            name = self._names.pop(oldest)
            self._columns.pop(oldest, None)
            self._versions.pop(oldest, None)
            if name is not None:
                self.run(cursor, f"DEALLOCATE {name}")

    def __len__(self) -> int:
        return sum(1 for name in self._names.values() if name is not None)


_plans: weakref.WeakKeyDictionary[Connection, CursorPlans] = weakref.WeakKeyDictionary()


def run_own(cursor: Connection, sql: str) -> None:
    """Run a statement that changes no binding on ``cursor`` (a PREPARE or DEALLOCATE the
    engine makes for a session's SQL-level statement, ``engine.prepared_room``): as the
    kept plans' own, so ``catalog_version`` discounts what it moves."""
    with translated():
        _plans_of(cursor).run(cursor, sql)


def _raw_catalog_version(cursor: Any) -> int | None:
    version = getattr(cursor, "_catalog_version", None)
    try:
        return int(version()) if version is not None else None
    except (TypeError, ValueError, RuntimeError):
        return None


def catalog_version(cursor: Any) -> int | None:
    """DuckDB's count of statements that may change what a name binds to on ``cursor``
    (2.0's binder API; None where the connection does not tell), less what the engine's
    kept plans moved it by: PREPARE, EXECUTE and DEALLOCATE count there, and a plan run
    changes no binding. Read by the cursor's own thread."""
    version = _raw_catalog_version(cursor)
    if version is None:
        return None
    with _plans_lock:
        plans = _plans.get(cursor)
    return version if plans is None else version - plans.own_moves


def _plans_of(cursor: Connection) -> CursorPlans:
    with _plans_lock:
        plans = _plans.get(cursor)
        if plans is None:
            plans = _plans[cursor] = CursorPlans()
        return plans


_ROW_SHAPES_MAX = 1024
# (column name, DuckDB type name) of each column -> the Arrow types and schema of the rows'
# way, or None if a column's type is not one of ``_ROW_ARROW_TYPES``. Depends on the key
# alone, so it is kept: a repeated statement's schema is built once, not per execution.
# Bounded in bytes too: an entry costs ``SCHEMA_COLUMN_BYTES`` a column plus its names
# (2,000 columns of a wide SELECT held ~250 kB an entry).
_row_shapes = BoundedCache("engine.tables.row_shapes", _ROW_SHAPES_MAX)


def _shape_key(description: Any) -> tuple[tuple[str, str], ...]:
    """(column name, DuckDB type name) of each column of DuckDB's ``description``."""
    return tuple((str(column[0]), str(column[1])) for column in description)


def _row_shape(
    description: Any, key: tuple[tuple[str, str], ...] | None = None
) -> tuple[list[pa.DataType], pa.Schema] | None:
    """The Arrow types and schema of a result of DuckDB's ``description`` on the rows'
    way (None: a column of another type); ``key``: its ``_shape_key`` if known."""
    if key is None:
        key = _shape_key(description)
    shape = _row_shapes.get(key, _NO_SHAPE)
    if shape is not _NO_SHAPE:
        return shape  # type: ignore[return-value]
    types = [_ROW_ARROW_TYPES.get(kind) for _, kind in key]
    shape = None
    if None not in types:
        fields = [pa.field(name, kind) for (name, _), kind in zip(key, types, strict=True)]
        shape = (types, pa.schema(fields))
    _row_shapes.put(key, shape, sum(SCHEMA_COLUMN_BYTES + len(name) for name, _ in key))
    return shape


def row_schema(columns: list[tuple[str, str]]) -> pa.Schema | None:
    """The Arrow schema the rows' way gives a result of these (name, DuckDB type name)
    columns, or None when one is not of its plain types (the relation's way then)."""
    shape = _row_shape(columns)
    return None if shape is None else shape[1]


def has_registered(cursor: Connection) -> bool:
    """Whether a relation is registered on ``cursor`` (``register``) right now."""
    return bool(_plans_of(cursor).registered)


def registered_names(cursor: Connection) -> frozenset[str]:
    """The relations registered on ``cursor`` (``register``) right now."""
    return frozenset(_plans_of(cursor).registered)


def _rest_as_arrow(cursor: Connection) -> pa.Table | None:
    """What the cursor's executed result still holds, as DuckDB's own Arrow table."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the copy it warns of: rare here
        return cursor.to_arrow_table()


def execute_count(
    cursor: Connection, sql: str, parameters: Any = None, *, line_offset: int = 0
) -> int | None:
    """Run a statement that returns no rows; the number of rows it changed, if DuckDB says.

    Cheaper than ``query_arrow`` for DML: no Arrow result is built.
    """
    with translated(line_offset):
        _execute(cursor, sql, parameters or None)
        if cursor.description is None or cursor.description[0][0] != "Count":
            return None
        row = cursor.fetchone()
        return None if row is None else int(row[0])


def fetch_rows(cursor: Connection, sql: str, parameters: Any = None) -> list[tuple[Any, ...]]:
    """Run a query whose few rows the engine reads itself (catalog, privileges): rows as
    tuples through ``fetchall``, ~0.1-0.2 ms cheaper than an Arrow result per statement."""
    with translated():
        _execute(cursor, sql, parameters or None)
        return cursor.fetchall()


def register(cursor: Connection, name: str, table: pa.Table) -> None:
    with translated():
        cursor.register(name, table)
    _plans_of(cursor).registered.add(name)


def unregister(cursor: Connection, name: str) -> None:
    _plans_of(cursor).registered.discard(name)
    with translated():
        cursor.unregister(name)


def interrupt(cursor: Connection) -> None:
    cursor.interrupt()


def batch_reader(
    cursor: Connection, sql: str, parameters: Any, batch_rows: int
) -> tuple[pa.RecordBatchReader | ChainedReader | RowsReader, list[str]]:
    """Start a query; its Arrow batch reader and DuckDB's type name of each column.

    The caller translates errors (``translated``) and must close the reader before the
    cursor runs anything else."""
    if _rows_way(sql):
        return _small_reader(cursor, sql, parameters, batch_rows)
    return _relation_reader(cursor, sql, parameters, batch_rows)


def _small_reader(
    cursor: Connection, sql: str, parameters: Any, batch_rows: int
) -> tuple[pa.RecordBatchReader | ChainedReader | RowsReader, list[str]]:
    """``batch_reader`` on the rows' way (see ``query_arrow``): a result read whole as
    ``RowsReader`` (its Arrow built only if a batch is asked for); else the head built
    from rows, then DuckDB's own reader over the rest."""
    rows, more, duckdb_types = _small_rows(cursor, sql, parameters)
    assert duckdb_types is not None, "only queries that return rows are streamed"
    if not more:
        assert rows is not None
        return RowsReader(rows), duckdb_types
    if rows is None:
        # Other types (DDL, or a literal of another type in a learnt shape): nothing was
        # read, and DuckDB's Arrow over an executed result would take all of it out first.
        # The statement runs again on the relation's way (a SELECT's only effect is
        # nextval's, which may leave gaps as any sequence may); the text is marked big.
        cursor.abort()  # the executed result, unfinished (DuckDB refuses other work)
        return _relation_reader(cursor, sql, parameters, batch_rows)
    return _chained(rows.to_arrow(), FetchReader(cursor, rows.schema, batch_rows)), duckdb_types


def _relation_reader(
    cursor: Connection, sql: str, parameters: Any, batch_rows: int
) -> tuple[pa.RecordBatchReader, list[str]]:
    relation = cursor.sql(_plans_of(cursor).statement(cursor, sql), params=parameters or None)
    assert relation is not None, "only queries that return rows are streamed"
    duckdb_types = [str(t) for t in relation.types]
    _learn(sql, duckdb_types, None)
    return relation.to_arrow_reader(batch_rows), duckdb_types


class FetchReader:
    """The rest of a result executed on ``cursor`` (``execute``, its head already fetched)
    as Arrow batches of at most ``batch_rows`` rows built from ``fetchmany``, as far as
    ``engine.streams`` reads one. DuckDB streams an executed result to ``fetchmany`` one
    batch at a time, whereas its Arrow reader over an executed result takes the whole rest
    out of it first (a result of any size held at once, outside DuckDB's memory limit):
    so a stream whose text or shape was learnt small holds one batch at a time however big
    its result came out. Only for ``_ROW_ARROW_TYPES`` columns (``schema``); holds the
    cursor until read out or closed (``close`` cancels the rest: DuckDB refuses other work
    on a connection whose executed result is unfinished)."""

    def __init__(self, cursor: Connection, schema: pa.Schema, batch_rows: int) -> None:
        assert batch_rows > 0, batch_rows
        self.schema = schema
        self._cursor: Connection | None = cursor
        self._batch_rows = batch_rows

    def read_next_batch(self) -> pa.RecordBatch:
        if self._cursor is None:
            raise StopIteration  # at the end, as pyarrow's
        rows = self._cursor.fetchmany(self._batch_rows)
        if len(rows) < self._batch_rows:
            self._cursor = None  # read out: the cursor is free
        if not rows:
            raise StopIteration
        table = Rows(rows, self.schema).to_arrow()
        return table.combine_chunks().to_batches()[0]

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while True:
            try:
                yield self.read_next_batch()
            except StopIteration:
                return

    def read_all(self) -> pa.Table:
        return pa.Table.from_batches(list(self), schema=self.schema)

    def close(self) -> None:
        cursor, self._cursor = self._cursor, None
        if cursor is not None:
            cursor.abort()


class RowsReader:
    """A batch reader over a result read whole on the rows' way (``rows``: DuckDB's
    Python values, nothing left on the cursor), as far as ``engine.streams`` reads one.
    Its Arrow table is built the first time a batch is asked for: a front that encodes
    the values itself (the wire server's simple query) takes ``rows`` instead and never
    pays for it (~40-60 us right after DuckDB ran, docs/statement_cost.md)."""

    def __init__(self, rows: Rows) -> None:
        self.rows = rows
        self.schema = rows.schema
        self._batches: list[pa.RecordBatch] | None = None

    def _pending(self) -> list[pa.RecordBatch]:
        if self._batches is None:
            self._batches = list(self.rows.to_arrow().to_batches())
        return self._batches

    def read_next_batch(self) -> pa.RecordBatch:
        pending = self._pending()
        if not pending:
            raise StopIteration  # at the end, as pyarrow's
        return pending.pop(0)

    def read_all(self) -> pa.Table:
        batches, self._batches = self._pending(), []
        return pa.Table.from_batches(batches, schema=self.schema)

    def close(self) -> None:
        self._batches = []


class ChainedReader:
    """A batch reader over ``head``'s batches and then ``rest``'s, as far as
    ``engine.streams`` reads one (``schema``, ``read_next_batch``, ``read_all``,
    ``close``); closing it closes ``rest``, which holds the cursor until then."""

    def __init__(self, head: pa.Table, rest: pa.RecordBatchReader | FetchReader) -> None:
        assert head.schema.equals(rest.schema), (head.schema, rest.schema)
        self.schema = head.schema
        self._head = list(head.to_batches())
        self._rest = rest

    def read_next_batch(self) -> pa.RecordBatch:
        if self._head:
            return self._head.pop(0)
        return self._rest.read_next_batch()  # StopIteration at the end, as pyarrow's

    def read_all(self) -> pa.Table:
        batches = [*self._head, *self._rest]
        self._head = []
        return pa.Table.from_batches(batches, schema=self.schema)

    def close(self) -> None:
        self._head = []
        self._rest.close()


def _chained(head: pa.Table, rest: pa.RecordBatchReader | FetchReader) -> ChainedReader:
    return ChainedReader(head, rest)


# -- the counter upsert's shortcut (``planner.duckdb_sql.upsert_shape``) -------------------
# Key types whose equality in a WHERE is the equality of DuckDB's unique index.
_UPSERT_KEY_TYPES = frozenset({
    "VARCHAR", "BIGINT", "INTEGER", "SMALLINT", "TINYINT", "HUGEINT", "UBIGINT", "UINTEGER",
    "USMALLINT", "UTINYINT", "UUID", "DATE",
})  # fmt: skip
_UPSERT_REFUSED_WORDS = ("COLLATE", "GENERATED", " AS (")


def upsert_columns(
    cursor: Connection, table: str, conflict: tuple[str, ...],
    where: tuple[str, str] | None = None,
) -> tuple[tuple[str, str], ...] | None:  # fmt: skip
    """The columns ((name, DuckDB type), in order, lower case) of ``table`` as this cursor's
    transaction sees it, if the counter-upsert shortcut is sound on it, else None.

    Sound means: exactly one relation of that name in every schema this connection sees
    (so any search path resolves it to this base table or fails, for the UPDATE as for
    the INSERT), its only unique constraint is exactly ``conflict`` (a primary key or
    UNIQUE, so the INSERT conflicts only on it), no CHECK or FOREIGN KEY constraint, no
    other index, no collation, no generated column, and key types compared as the index
    compares them. ``where`` (database, schema): the table of that name there, whatever
    other schemas hold (the caller knows the name resolves to it).
    """
    wanted = table.lower()
    place = "" if where is None else " AND database_name = ? AND schema_name = ?"
    with translated():
        cursor.execute(
            "SELECT database_name, schema_name, sql FROM duckdb_tables() "
            f"WHERE lower(table_name) = ?{place} UNION ALL "
            "SELECT database_name, schema_name, NULL FROM duckdb_views() "
            f"WHERE lower(view_name) = ?{place}",
            [wanted, *(where or ()), wanted, *(where or ())],
        )
        relations = cursor.fetchall()
        if len(relations) != 1 or relations[0][2] is None:
            return None
        database, schema, sql = relations[0]
        if any(word in sql.upper() for word in _UPSERT_REFUSED_WORDS):
            return None
        key = [database, schema, wanted]
        cursor.execute(
            "SELECT constraint_type, constraint_column_names FROM duckdb_constraints() "
            "WHERE database_name = ? AND schema_name = ? AND lower(table_name) = ?",
            key,
        )
        constraints = cursor.fetchall()
        cursor.execute(
            "SELECT count(*) FROM duckdb_indexes() "
            "WHERE database_name = ? AND schema_name = ? AND lower(table_name) = ?",
            key,
        )
        indexes = cursor.fetchone()
        cursor.execute(
            "SELECT lower(column_name), data_type FROM duckdb_columns() "
            "WHERE database_name = ? AND schema_name = ? AND lower(table_name) = ? "
            "ORDER BY column_index",
            key,
        )
        columns = tuple((str(name), str(kind)) for name, kind in cursor.fetchall())
    unique = [sorted(c.lower() for c in names) for kind, names in constraints
              if kind in ("PRIMARY KEY", "UNIQUE")]  # fmt: skip
    others = [kind for kind, _ in constraints if kind not in ("PRIMARY KEY", "UNIQUE", "NOT NULL")]
    types = dict(columns)
    if (unique != [sorted(conflict)] or others or (indexes and indexes[0])
            or any(types.get(k) not in _UPSERT_KEY_TYPES for k in conflict)):  # fmt: skip
        return None
    return columns


class SchemaGenerations:
    """Whether two DuckDB snapshots see the same tables: a generation that moves around
    every commit that may change the schema (DDL), and a count of such commits under way.

    A statement that may change the schema calls ``changing`` before its commit can start
    and ``changed`` after it ended. A transaction reads ``stable()`` before and after its
    BEGIN: when both are the same number, no schema change committed around its snapshot,
    so every snapshot taken at that generation sees the same schema (its own uncommitted
    DDL aside: the session tracks that itself).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generation = 0
        self._under_way = 0

    def changing(self) -> None:
        with self._lock:
            self._under_way += 1
            self._generation += 1

    def changed(self) -> None:
        with self._lock:
            assert self._under_way > 0, "changed() without changing()"
            self._under_way -= 1
            self._generation += 1

    def stable(self) -> int | None:
        """The generation, or None while a schema change may be committing."""
        with self._lock:
            return None if self._under_way else self._generation


SCHEMA_GENERATIONS = SchemaGenerations()  # one per process: DuckDB files are per process
