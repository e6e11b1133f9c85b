"""SQL cursors of a connection: DECLARE, FETCH, MOVE, CLOSE (what psycopg's named cursors send).

``DECLARE name [BINARY] [ASENSITIVE | INSENSITIVE] [NO] SCROLL CURSOR [WITH | WITHOUT HOLD]
FOR query`` runs the query in the session's transaction (so a consumer read inside it is
committed with that transaction) and keeps its rows; ``FETCH``/``MOVE`` with every direction
of PostgreSQL (NEXT, PRIOR, FIRST, LAST, ABSOLUTE n, RELATIVE n, n, ALL, FORWARD [n | ALL],
BACKWARD [n | ALL]) walk them; ``CLOSE name | ALL`` drops them.

Position model (PostgreSQL's): 0 is before the first row, 1..N on a row, N+1 after the last.
Invariants: a cursor WITHOUT HOLD lives only as long as the transaction it was declared
in (it is tied to that ``Transaction`` object and is gone once the session has another
or none). A WITH HOLD cursor declared outside a transaction block lives until CLOSE or the
end of the connection; one declared inside a transaction block survives that transaction
only if it commits (PostgreSQL drops it at ROLLBACK): ``prune``, before every cursor
command and Describe, keeps it when its engine ``Transaction`` says ``committed`` and drops
it otherwise (an explicit ROLLBACK, the COMMIT of a failed transaction, a COMMIT that failed
validation). A cursor declared NO SCROLL refuses to move backward (55000). Cursors belong
to one connection; ``declare``, ``close`` and ``fetch`` run on its worker thread, the rest
on its event-loop task, never at the same time.

Rows: DECLARE reads its query in batches (``result_stream``) and keeps them in memory when
small, else in a memory-mapped spill file (``spill``): DuckDB allows no other statement on
the session's cursor while a result is open, so the query cannot stay open between FETCHes.
A spill file's bytes are charged to the server's ``SpillBudget`` and given back in
``_drop`` (CLOSE, prune, the connection's end), as the heap bytes are to the holdings.

Errors: 34000 unknown cursor, 42P03 duplicate name, 25P01 DECLARE without HOLD outside
a transaction block, 55000 backward move on a NO SCROLL cursor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from engine.api import (
    Result,
    Session,
    SessionState,
    SourceText,
    Token,
    tokenize,
    unquote_identifier,
)
from storage.errors import (
    DuplicateCursorError,
    LimitExceededError,
    NoActiveSqlTransactionError,
    ObjectNotInPrerequisiteStateError,
    SqlSyntaxError,
    UndefinedCursorError,
)
from storage.limits import CURSORS_PER_CONNECTION_MAX

if TYPE_CHECKING:
    from sql.pgwire.memory_budget import ConnectionHoldings
    from sql.pgwire.spill_budget import SpillCharge


@dataclass
class SqlCursor:
    name: str
    table: pa.Table
    scroll: bool
    hold: bool
    binary: bool
    transaction: Any  # the engine Transaction it belongs to (None once held past it)
    position: int = 0
    # Bytes of ``table`` in the process's heap (0 when memory-mapped from a spill file),
    # held in the connection's ``ConnectionHoldings`` while the cursor lives.
    heap_bytes: int = 0
    # The bytes of its spill file in the server's ``SpillBudget`` (None: not counted).
    spill: SpillCharge | None = None


@dataclass(frozen=True)
class Declare:
    name: str
    binary: bool
    scroll: bool
    hold: bool
    query: str


@dataclass(frozen=True)
class Fetch:
    name: str
    move: bool  # MOVE: position only, no rows
    kind: str  # "forward", "backward", "absolute", "relative"
    count: int | None  # None: ALL (forward/backward only)


@dataclass(frozen=True)
class Close:
    name: str | None  # None: CLOSE ALL


def _words(tokens: list[Token]) -> list[str]:
    return [t.text.upper() if t.kind == "word" else t.text for t in tokens]


def _syntax(source: SourceText, tokens: list[Token], index: int) -> SqlSyntaxError:
    if index >= len(tokens):
        return source.syntax_error(len(source.text), "syntax error at end of input")
    return source.syntax_error(tokens[index].start,
                               f'syntax error at or near "{tokens[index].text}"')  # fmt: skip


def parse_cursor_command(text: str) -> Declare | Fetch | Close:
    """A DECLARE, FETCH, MOVE or CLOSE statement (42601 when it does not parse)."""
    source = SourceText(text)
    tokens = list(tokenize(source, 0, len(text)))
    head = tokens[0].text.upper()
    if head == "DECLARE":
        return _parse_declare(source, tokens)
    if head == "CLOSE":
        if len(tokens) == 2 and tokens[1].is_word("ALL"):
            return Close(None)
        if len(tokens) != 2 or tokens[1].kind not in ("word", "quoted"):
            raise _syntax(source, tokens, min(len(tokens), 2))
        return Close(unquote_identifier(tokens[1].text))
    assert head in ("FETCH", "MOVE")
    return _parse_fetch(source, tokens, head == "MOVE")


def _parse_declare(source: SourceText, tokens: list[Token]) -> Declare:
    if len(tokens) < 2 or tokens[1].kind not in ("word", "quoted"):
        raise _syntax(source, tokens, 1)
    name = unquote_identifier(tokens[1].text)
    words = _words(tokens)
    at, binary, scroll, hold = 2, False, True, False
    while at < len(words) and words[at] in ("BINARY", "ASENSITIVE", "INSENSITIVE", "NO",
                                            "SCROLL"):  # fmt: skip
        if words[at] == "NO" and words[at + 1 : at + 2] == ["SCROLL"]:
            scroll, at = False, at + 1
        elif words[at] == "BINARY":
            binary = True
        elif words[at] == "NO":
            raise _syntax(source, tokens, at + 1)
        at += 1
    if words[at : at + 1] != ["CURSOR"]:
        raise _syntax(source, tokens, at)
    at += 1
    if words[at : at + 2] in (["WITH", "HOLD"], ["WITHOUT", "HOLD"]):
        hold, at = words[at] == "WITH", at + 2
    if words[at : at + 1] != ["FOR"] or at + 1 >= len(tokens):
        raise _syntax(source, tokens, at if words[at : at + 1] != ["FOR"] else at + 1)
    return Declare(name, binary, scroll, hold, source.text[tokens[at + 1].start :].strip())


def _count(source: SourceText, tokens: list[Token], at: int) -> tuple[int, int]:
    """A signed integer count at ``at``; returns it and the next index."""
    sign = 1
    if at < len(tokens) and tokens[at].text in ("+", "-"):
        sign, at = (-1 if tokens[at].text == "-" else 1), at + 1
    if at < len(tokens) and tokens[at].kind == "number" and tokens[at].text.isdigit():
        return sign * int(tokens[at].text), at + 1
    raise _syntax(source, tokens, at)


def _parse_fetch(source: SourceText, tokens: list[Token], move: bool) -> Fetch:
    words = _words(tokens)
    at = 1
    word = words[at] if at < len(words) else ""
    kind: str = "forward"
    count: int | None = 1
    fixed = {"NEXT": ("forward", 1), "PRIOR": ("backward", 1), "FIRST": ("absolute", 1),
             "LAST": ("absolute", -1)}  # fmt: skip
    if word in fixed:
        (kind, count), at = fixed[word], at + 1
    elif word in ("ABSOLUTE", "RELATIVE"):
        kind = word.lower()
        count, at = _count(source, tokens, at + 1)
    elif word == "ALL":
        count, at = None, at + 1
    elif word in ("FORWARD", "BACKWARD"):
        kind, at = word.lower(), at + 1
        if at < len(words) and words[at] == "ALL":
            count, at = None, at + 1
        elif _starts_count(tokens, at):
            count, at = _count(source, tokens, at)
    elif _starts_count(tokens, at):
        count, at = _count(source, tokens, at)
    if at < len(words) and words[at] in ("FROM", "IN"):
        at += 1
    if at != len(tokens) - 1 or tokens[at].kind not in ("word", "quoted"):
        raise _syntax(source, tokens, at)
    if kind in ("forward", "backward") and count is not None and count < 0:
        kind, count = ("backward" if kind == "forward" else "forward"), -count
    return Fetch(unquote_identifier(tokens[at].text), move, kind, count)


def _starts_count(tokens: list[Token], at: int) -> bool:
    return at < len(tokens) and (tokens[at].kind == "number" or tokens[at].text in ("+", "-"))


@dataclass
class CursorSet:
    """The SQL cursors of one connection, by name."""

    cursors: dict[str, SqlCursor] = field(default_factory=dict)
    # The connection's holdings (``sql.pgwire.memory_budget``): each cursor's heap bytes are
    # taken there when it is kept and given back when it is dropped (``_drop``, the one
    # place a cursor is forgotten). Used on the connection's loop only: FETCH (on the
    # worker thread) looks up without pruning, the loop having pruned just before.
    holdings: ConnectionHoldings | None = None

    def prune(self, session: Session) -> None:
        """Forget the cursors whose transaction has ended, but those WITH HOLD of a
        committed one, which from now on belong to no transaction (no DuckDB call)."""
        for name, cursor in list(self.cursors.items()):
            if not _ended(cursor, session):
                continue
            if cursor.hold and cursor.transaction.committed:
                cursor.transaction = None
            else:
                self._drop(name)

    def _drop(self, name: str) -> None:
        cursor = self.cursors.pop(name)
        if cursor.heap_bytes and self.holdings is not None:
            self.holdings.give(cursor.heap_bytes)
        if cursor.spill is not None:
            cursor.spill.release()

    def release(self) -> None:
        """Drop every cursor (the connection ends)."""
        for name in list(self.cursors):
            self._drop(name)

    def get(self, name: str, session: Session) -> SqlCursor:
        self.prune(session)
        return self._lookup(name)

    def _lookup(self, name: str) -> SqlCursor:
        cursor = self.cursors.get(name)
        if cursor is None:
            raise UndefinedCursorError(f'cursor "{name}" does not exist')
        return cursor

    def find(self, name: str, session: Session) -> SqlCursor | None:
        self.prune(session)
        return self.cursors.get(name)

    def declare(
        self,
        session: Session,
        declare: Declare,
        table: pa.Table,
        heap_bytes: int = 0,
        spill: SpillCharge | None = None,
    ) -> Result:
        """Keep ``table`` as the cursor ``declare.name``; ``heap_bytes`` of it in memory,
        taken from the holdings first (53200 past the connection's share: not kept), the
        bytes of its spill file in ``spill`` (given back when it is dropped)."""
        if heap_bytes and self.holdings is not None:
            self.holdings.take(heap_bytes, "a cursor's rows")
        in_block = session.state is not SessionState.IDLE
        self.cursors[declare.name] = SqlCursor(
            declare.name, table, declare.scroll, declare.hold, declare.binary,
            session.transaction if in_block else None, heap_bytes=heap_bytes, spill=spill,
        )  # fmt: skip
        return Result("DECLARE CURSOR")

    def check_declare(self, session: Session, declare: Declare) -> None:
        """What must hold before the query of a DECLARE runs."""
        self.prune(session)
        if not declare.hold and session.state is SessionState.IDLE:
            raise NoActiveSqlTransactionError(
                "DECLARE CURSOR can only be used in transaction blocks")
        if declare.name in self.cursors:
            raise DuplicateCursorError(f'cursor "{declare.name}" already exists')
        if len(self.cursors) >= CURSORS_PER_CONNECTION_MAX:
            raise LimitExceededError(
                f"too many open cursors (limit {CURSORS_PER_CONNECTION_MAX})")

    def close(self, session: Session, close: Close) -> Result:
        """CLOSE name or ALL."""
        if close.name is not None:
            self.get(close.name, session)
        names = list(self.cursors) if close.name is None else [close.name]
        for name in names:
            self._drop(name)
        return Result("CLOSE CURSOR")

    def fetch(self, session: Session, fetch: Fetch) -> Result:
        cursor = self._lookup(fetch.name)  # pruned by the caller, on the loop
        rows, count = _walk(cursor, fetch)
        if fetch.move:
            return Result(f"MOVE {count}")
        return Result(f"FETCH {count}", rows)


def _ended(cursor: SqlCursor, session: Session) -> bool:
    """True once the transaction ``cursor`` was declared in is over (never if none)."""
    return cursor.transaction is not None and _over(cursor.transaction, session)


def _over(transaction: Any, session: Session) -> bool:
    return session.state is SessionState.IDLE or session.transaction is not transaction


def _walk(cursor: SqlCursor, fetch: Fetch) -> tuple[pa.Table, int]:
    """Move ``cursor`` as ``fetch`` says; the rows passed over (in order) and their count."""
    total = cursor.table.num_rows
    start = cursor.position
    if fetch.count == 0 and fetch.kind in ("forward", "backward"):  # FETCH 0: current row
        fetch = Fetch(fetch.name, fetch.move, "relative", 0)
    if fetch.kind in ("absolute", "relative"):
        assert fetch.count is not None
        target = fetch.count if fetch.kind == "absolute" else start + fetch.count
        if fetch.kind == "absolute" and fetch.count < 0:
            target = total + 1 + fetch.count
        if target < start and not cursor.scroll:
            raise _no_scroll()
        cursor.position = min(max(target, 0), total + 1)
        on_row = 1 <= cursor.position <= total
        rows = cursor.table.slice(cursor.position - 1, 1) if on_row else cursor.table.slice(0, 0)
        return rows, rows.num_rows
    if fetch.kind == "forward":
        count = total - start if fetch.count is None else fetch.count
        end = min(start + count, total + 1)
        cursor.position = end
        first = min(start, total)  # rows start+1 .. min(end, total), 0-based start..
        rows = cursor.table.slice(first, max(min(end, total) - first, 0))
        return rows, rows.num_rows
    if not cursor.scroll:
        raise _no_scroll()
    count = start if fetch.count is None else fetch.count
    end = max(start - count, 0)
    cursor.position = end
    last = min(start - 1, total)  # 1-based row positions end+1 .. last, walked backward
    first = max(end, 1)
    if last < first:
        return cursor.table.slice(0, 0), 0
    rows = cursor.table.slice(first - 1, last - first + 1)
    return rows.take(pa.array(range(rows.num_rows - 1, -1, -1), pa.int64())), rows.num_rows


def _no_scroll() -> ObjectNotInPrerequisiteStateError:
    return ObjectNotInPrerequisiteStateError(
        "cursor can only scan forward; declare it with SCROLL to enable backward scan")
