"""Publishing staged bulk writes (``engine.bulk_write``) exactly once.

A commit publishes its writes in ONE transaction of the caller's session together with the
idempotency record ``(sink id, batch id)``: all or nothing, and a replay finds the record.

A transaction writes at most ``BATCH_BYTES_MAX``/``BATCH_MESSAGES_MAX`` to one partition
(``engine.commit`` refuses more with 54000, before anything is staged). A commit whose
topic rows are over that goes *in parts*: consecutive slices of its topic rows, each under
the limits for the whole topic (so under them for any one partition), each published in a
transaction of its own with a part record ``(sink id, batch id, part)``; the last part
also carries the table rows and the batch's record. A replay (after a crash in between)
skips the parts already recorded and publishes the rest, so every message is published
exactly once; what is given up is atomicity: readers may see the first parts of such a
batch before its last. The slicing depends only on the rows and their order, which a
replayed Spark batch reproduces.

Invariants: a part's record and its messages commit together; the batch's record commits
with the last part, so a batch is "committed" exactly when every part is.

Sinks belong to a user (``SINKS_TABLE``): every transaction that writes a record of a sink
claims the sink for the committing user if no one has (``claim``), in that transaction,
and is refused (42501) if another user holds it. So only the sink's owner can record its
batches, see whether a batch is recorded, or read its last batch (``require_sink``): no
one can pre-record another user's future batches. Superusers may read any sink's last
batch and commit to sinks of superusers, not to a sink a non-superuser claimed (see
``require_sink``: a squatted name is refused loudly rather than taken as a replay). A
sink whose records predate the claims (a database made before them) has no claim row:
its first commit claims it. Two users committing one new sink at once cannot both claim
it: the claim's primary key fails the second (40001 at its COMMIT, then 42501 once the
claim is visible, ``engine.bulk_write``; one user's two commits: the loser retries).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from engine import privileges, tables
from engine.bulk import run_over_relation
from engine.catalog import SCHEMA
from engine.staged_refs import FramedRows
from engine.tables import quote_identifier
from grammar.parse import parse_one
from storage import limits
from storage.errors import (
    InsufficientPrivilegeError,
    InvalidParameterValueError,
    LimitExceededError,
    SerializationFailure,
    TopicbaseError,
    UniqueViolationError,
)

IDEMPOTENCY_TABLE = f"{SCHEMA}.sink_batches"
PARTS_TABLE = f"{SCHEMA}.sink_batch_parts"
SINKS_TABLE = f"{SCHEMA}.sinks"
IDEMPOTENCY_DDL = (
    f"CREATE TABLE IF NOT EXISTS {IDEMPOTENCY_TABLE} (sink_id VARCHAR NOT NULL, "
    "batch_id BIGINT NOT NULL, rows BIGINT NOT NULL, committed_at_us BIGINT NOT NULL, "
    "PRIMARY KEY (sink_id, batch_id));"
    f"CREATE TABLE IF NOT EXISTS {PARTS_TABLE} (sink_id VARCHAR NOT NULL, "
    "batch_id BIGINT NOT NULL, part INTEGER NOT NULL, PRIMARY KEY (sink_id, batch_id, part));"
    f"CREATE TABLE IF NOT EXISTS {SINKS_TABLE} (sink_id VARCHAR PRIMARY KEY, "
    "owner VARCHAR NOT NULL)"
)
# A part stays well under the per-partition limits (room for the frame's own columns).
PART_ROWS = limits.BATCH_MESSAGES_MAX * 9 // 10
PART_BYTES = limits.BATCH_BYTES_MAX * 8 // 10
# The column numbering an upsert write's rows in staged order (``table_statement``).
ORDINAL = "__topicbase_ordinal"

# (the write's meta, its rows; a write staged as frames: ``FramedRows``, counted unread)
Write = tuple[dict[str, Any], "pa.Table | FramedRows"]
# stage_topic(session, meta, rows, whole): stage a topic write's rows in the open
# transaction; ``whole`` is True when they are all of the write's rows (not a part), which
# may then be committed by reference to its files (``engine.staged_refs``).
StageTopic = Callable[[Any, dict[str, Any], pa.Table, bool], None]


class PartsRefused(LimitExceededError):
    """A commit that must go in parts holds writes staged as frames (54000, before its
    commit point): parts would decode them whole into memory."""


def publish(session: Any, sink_id: str, batch_id: int, writes: list[Write],
            stage_topic: StageTopic, now_us: int,
            on_commit_point: Callable[[], None] | None = None,
            on_recorded: Callable[[], None] | None = None) -> int:  # fmt: skip
    """Publish ``writes`` as ``(sink_id, batch_id)``; returns the rows published.

    ``on_commit_point`` is called once the transaction holding the whole of the writes
    (not in parts) has passed its commit point, even if its publish then fails: from
    there on, files it references belong to the committer. ``on_recorded`` is called
    once the transaction carrying the batch's record (the whole, or the last part) has
    passed its commit point, even if it then fails: the record is this call's."""

    def whole_committed() -> None:
        if on_commit_point is not None:
            on_commit_point()
        if on_recorded is not None:
            on_recorded()

    rows = sum(data.num_rows for _, data in writes)
    topic_rows = [(m, d) for m, d in writes if m["kind"] == "topic" and d.num_rows]
    try:
        _transaction(session, topic_rows, [w for w in writes if w[0]["kind"] != "topic"],
                     stage_topic, lambda: _record(session, sink_id, batch_id, rows, now_us),
                     whole=True, on_commit_point=whole_committed)  # fmt: skip
        return rows
    except LimitExceededError:
        size = sum(d.num_rows for _, d in topic_rows)
        nbytes = sum(d.nbytes for _, d in topic_rows)
        if size <= PART_ROWS and nbytes <= PART_BYTES:
            raise  # not the per-partition limit: one part could not be smaller
        if all(isinstance(d, FramedRows) for _, d in topic_rows):
            # Writes staged as frames are never held to the per-partition limits
            # (``engine.commit._check_publishable``): this is another bound, which parts
            # would not lift, and parts would decode the frames whole into memory.
            raise
        if any(isinstance(d, FramedRows) for _, d in topic_rows):
            # Parts would decode the frames whole into memory (a write of any size) and
            # cut a write that one transaction could publish: refused before the commit
            # point, the writes stay staged.
            raise PartsRefused(
                "this commit must go in parts (a write staged as Arrow is over what one "
                "transaction may write to a partition), which cannot hold writes staged "
                "as frames: commit the frames writes apart") from None
    parts = _slices(topic_rows)
    done = _parts_done(session, sink_id, batch_id)
    for number, part in enumerate(parts):
        if number in done:
            continue
        last = number == len(parts) - 1
        tables_rows = [w for w in writes if w[0]["kind"] != "topic"] if last else []

        def records(number: int = number, last: bool = last) -> None:
            claim(session, sink_id)
            _insert_record(session, PARTS_TABLE, [sink_id, batch_id, number])
            if last:
                _record(session, sink_id, batch_id, rows, now_us)

        _transaction(session, part, tables_rows, stage_topic, records,
                     on_commit_point=on_recorded if last else None)  # fmt: skip
    return rows


def sink_owner(session: Any, sink_id: str) -> str | None:
    """The user who claimed ``sink_id`` (None: unclaimed), as the session sees it."""
    table = tables.query_arrow(
        session.cursor, f"SELECT owner FROM {SINKS_TABLE} WHERE sink_id = ?", [sink_id])
    return None if table is None or table.num_rows == 0 else table.column(0)[0].as_py()


def require_sink(session: Any, sink_id: str, *, commit: bool = True) -> str | None:
    """Refuse (42501) unless the session's user owns ``sink_id`` or nobody has claimed
    it; returns the owner. A superuser may read any sink (``commit=False``) and commit to
    a sink of any superuser, but not to one a non-superuser claimed: the sink id is all
    that names a stream, so a superuser's commit cannot tell a squatter's sink (claimed
    with pre-recorded batches before the superuser's first commit) from its own, and
    would take the squatter's records for its replays (a silent loss of its writes)."""
    owner = sink_owner(session, sink_id)
    identity = session.identity
    if owner is None or owner == identity.name:
        return owner
    if identity.superuser and (not commit or privileges.is_superuser_name(session.database,
                                                                          owner)):  # fmt: skip
        return owner
    raise InsufficientPrivilegeError(f"permission denied for sink {sink_id!r}: it belongs "
                                     f"to another user")  # fmt: skip


def claim(session: Any, sink_id: str) -> None:
    """In the open transaction: claim ``sink_id`` for the session's user unless claimed;
    42501 if another user holds it (a superuser may record any sink's batches)."""
    if require_sink(session, sink_id) is None:
        _insert_record(session, SINKS_TABLE, [sink_id, session.identity.name])


def _record(session: Any, sink_id: str, batch_id: int, rows: int, now_us: int) -> None:
    claim(session, sink_id)
    _insert_record(session, IDEMPOTENCY_TABLE, [sink_id, batch_id, rows, now_us])


def _insert_record(session: Any, table: str, values: list[Any]) -> None:
    """Insert a row of a sink's records (its claim, a batch, a part) in the open
    transaction. Its key taken already means a concurrent commit of the same sink
    committed it after this transaction's snapshot (the session saw no such row): a
    conflict like any other, 40001 (retryable; a retry sees the row), never 23505."""
    marks = ", ".join("?" * len(values))
    try:
        tables.run(session.cursor, f"INSERT INTO {table} VALUES ({marks})", values)
    except UniqueViolationError as error:
        raise SerializationFailure(
            f"could not serialize access due to a concurrent commit of sink {values[0]!r}"
        ) from error


def _transaction(session: Any, topic_rows: list[Write], table_rows: list[Write],
                 stage_topic: StageTopic, records: Callable[[], None], *, whole: bool = False,
                 on_commit_point: Callable[[], None] | None = None) -> None:  # fmt: skip
    session.execute_statement(parse_one("BEGIN"))
    transaction = session.transaction
    # its records go into tables (the named ones and the catalog's): a DuckDB commit
    transaction.note_table_write(tuple(str(meta["name"]) for meta, _ in table_rows))
    try:
        for meta, data in topic_rows:
            stage_topic(session, meta, data, whole)
        for meta, data in table_rows:
            if data.num_rows:
                relation, text = table_statement(meta, data)
                run_over_relation(session, relation, [text])
        records()
    except BaseException:
        with contextlib.suppress(TopicbaseError):
            session.execute_statement(parse_one("ROLLBACK"))
        raise
    try:
        session.execute_statement(parse_one("COMMIT"))
    finally:
        if transaction.committed and on_commit_point is not None:
            on_commit_point()


def _slices(topic_rows: list[Write]) -> list[list[Write]]:
    """The topic rows cut into parts of at most PART_ROWS rows and PART_BYTES bytes."""
    parts: list[list[Write]] = [[]]
    room_rows, room_bytes = PART_ROWS, PART_BYTES
    for meta, data in topic_rows:
        per_row = max(1, data.nbytes // max(1, data.num_rows))
        start = 0
        while start < data.num_rows:
            take = min(data.num_rows - start, room_rows, max(room_bytes // per_row, 0))
            if take == 0:
                parts.append([])
                room_rows, room_bytes = PART_ROWS, PART_BYTES
                continue
            parts[-1].append((meta, data.slice(start, take)))
            start += take
            room_rows -= take
            room_bytes -= take * per_row
    return [p for p in parts if p]


def _parts_done(session: Any, sink_id: str, batch_id: int) -> set[int]:
    table = tables.query_arrow(
        session.cursor, f"SELECT part FROM {PARTS_TABLE} WHERE sink_id = ? AND batch_id = ?",
        [sink_id, batch_id])  # fmt: skip
    return set() if table is None else set(table.column(0).to_pylist())


def table_statement(meta: dict[str, Any], data: pa.Table) -> tuple[pa.Table, str]:
    """The relation and the statement that publish one staged table write.

    In modes ``upsert`` and ``add`` the relation gets a column of its own (``ORDINAL``, a
    name no column of the rows has): each row's index in ``data``, materialised here so
    that the statement picks the latest row of a key by value, never by DuckDB's scan
    order, and keeps apart the rows whose key holds a NULL (``table_insert``).
    ``data`` is the write's rows in staged order (``BulkWrites.read_write``: its staged
    files in name order, which is staging order, each file's rows as they came)."""
    if meta.get("mode", "append") not in ("upsert", "add"):
        return data, table_insert(meta, data.column_names)
    ordinal = ORDINAL
    while ordinal in data.column_names:
        ordinal += "_"
    relation = data.append_column(ordinal, pa.array(range(data.num_rows), pa.int64()))
    return relation, table_insert(meta, data.column_names, ordinal=ordinal)


def table_insert(meta: dict[str, Any], columns: list[str], ordinal: str | None = None) -> str:
    """The statement that publishes a staged table write, by its mode.

    ``append``: every row inserted. ``add``: the rows summed by key (order-free), then
    added to the stored row's other columns. ``upsert``: the LAST row of each key wins,
    as in a compacted Kafka topic. "Last" is the commit's order: its writes are published
    one statement each, in the order the commit lists their ids (a later write's row
    replaces an earlier write's); within a write, its staged files in staging order, then
    each file's rows in order, which is the order of ``ordinal`` (required in this mode:
    the relation's column numbering the rows, ``table_statement``). The statement keeps
    exactly one row per key, the one with the greatest ordinal: ``DISTINCT ON (key)``
    yields one row per distinct key, the first by its ``ORDER BY key, ordinal DESC``,
    and ordinals are unique, so there is no tie. A NULL in another column is a value
    like any other (the latest row's NULL replaces a stored value).

    A row whose key holds a NULL conflicts with nothing (a nullable UNIQUE key: NULLs
    are distinct, in PostgreSQL's ``ON CONFLICT`` as in DuckDB's), so in both folding
    modes it is inserted as it came: the fold is by the key and ``CASE WHEN <a key
    column> IS NULL THEN ordinal END``, NULL for every whole key (folded by the key
    alone) and the row's own ordinal otherwise (a group of one)."""
    names = ", ".join(quote_identifier(c) for c in columns)
    target = quote_name(meta["name"])
    mode, key = meta.get("mode", "append"), list(meta.get("key") or [])
    if mode == "append":
        return f"INSERT INTO {target} ({names}) SELECT {names} FROM {{relation}}"
    missing = [k for k in key if k not in columns]
    if missing:
        raise InvalidParameterValueError(f'the rows have no key column "{missing[0]}"')
    keys = ", ".join(quote_identifier(k) for k in key)
    others = [c for c in columns if c not in key]
    assert ordinal is not None and ordinal not in columns, "a fold needs its ordinal"
    apart = null_key_apart(key, ordinal)
    if mode == "upsert":
        updates = ", ".join(
            f"{quote_identifier(c)} = EXCLUDED.{quote_identifier(c)}" for c in others
        )
        source = (f"SELECT DISTINCT ON ({keys}, {apart}) {names} FROM {{relation}} "
                  f"ORDER BY {keys}, {apart}, {quote_identifier(ordinal)} DESC")  # fmt: skip
    else:
        # DuckDB applies one row per key of an upsert batch: sum by key first.
        updates = ", ".join(f"{quote_identifier(c)} = {target}.{quote_identifier(c)} + "
                            f"EXCLUDED.{quote_identifier(c)}" for c in others)  # fmt: skip
        sums = ", ".join(f"sum({quote_identifier(c)}) AS {quote_identifier(c)}" for c in others)
        source = f"SELECT {keys}, {sums} FROM {{relation}} GROUP BY {keys}, {apart}"
        names = ", ".join([keys, *(quote_identifier(c) for c in others)])
    action = f"DO UPDATE SET {updates}" if others else "DO NOTHING"
    return f"INSERT INTO {target} ({names}) {source} ON CONFLICT ({keys}) {action}"


def null_key_apart(key: list[str], ordinal: str) -> str:
    """``CASE WHEN k1 IS NULL OR … THEN ordinal END``: NULL for a row whose key is whole,
    the row's ordinal for one whose key holds a NULL (``table_insert``; the shape
    ``planner.upsert_check`` recognises as keeping such rows apart)."""
    nulls = " OR ".join(f"{quote_identifier(k)} IS NULL" for k in key)
    return f"CASE WHEN {nulls} THEN {quote_identifier(ordinal)} END"


def quote_name(name: str) -> str:
    """A (possibly schema-qualified) name quoted part by part."""
    return ".".join(quote_identifier(part) for part in name.split("."))
