"""The catalog: topics, their settings and consumers, committed offsets, owners, grants.

Lives in DuckDB beside the user's tables (schema ``__topicbase``), so it
survives restarts and changes atomically with DDL and, later, with the
transactions that move offsets. An in-memory mirror answers the planner
(``planner.catalog.Catalog``) without touching DuckDB.

Owners and grants (``engine.privileges`` reads and writes them through the session's
own DuckDB cursor, so they are transactional) have no mirror: ``owners`` holds one row
per topic, table and view (namespace "topic" or "relation"; "schema" rows are never
stored, a schema is the superusers'), ``grants`` one row per privilege given
(grantee "" is PUBLIC). A topic's owner row is written and deleted in the same DuckDB
transaction as its catalog row.

Invariants: the mirror equals the tables after every committed change; a
topic's ``topic_id`` is the storage id and never changes; a committed offset
never moves backwards except by an explicit reset.
Thread-safety: all mutations hold ``lock``; reads of the mirror are safe
(dicts are replaced, not edited in place, where readers could race).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from engine import tables
from engine.clock import Clock, utc_from_us
from engine.identity import LOCAL_SUPERUSER_NAME
from planner.catalog import TopicInfo
from storage import limits
from storage.errors import InvalidParameterValueError, LimitExceededError

SCHEMA = "__topicbase"
OffsetKey = tuple[str, str, int]  # (topic id, consumer, partition)
_NO_OFFSETS: dict[int, int] = {}  # a consumer that never committed (never changed)

DDL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS {SCHEMA}.topics (
    name VARCHAR PRIMARY KEY, topic_id VARCHAR NOT NULL UNIQUE, settings VARCHAR NOT NULL,
    consumers VARCHAR NOT NULL, created_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS {SCHEMA}.offsets (
    topic_id VARCHAR NOT NULL, consumer VARCHAR NOT NULL, partition INTEGER NOT NULL,
    committed BIGINT NOT NULL, committed_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (topic_id, consumer, partition));
CREATE TABLE IF NOT EXISTS {SCHEMA}.owners (
    namespace VARCHAR NOT NULL, name VARCHAR NOT NULL, kind VARCHAR NOT NULL,
    owner VARCHAR NOT NULL);
CREATE TABLE IF NOT EXISTS {SCHEMA}.grants (
    namespace VARCHAR NOT NULL, name VARCHAR NOT NULL, grantee VARCHAR NOT NULL,
    privilege VARCHAR NOT NULL, grantor VARCHAR NOT NULL, grantable BOOLEAN NOT NULL);
"""
# No primary keys on owners and grants: rows are deleted and re-inserted in one
# transaction (REVOKE then GRANT, DROP then CREATE), which DuckDB's index checks refuse;
# engine.privileges keeps them unique.
OWNER_SUPERUSER = LOCAL_SUPERUSER_NAME  # owns what has no owner row (older data directories)


@dataclass(frozen=True)
class TopicEntry:
    name: str
    topic_id: str
    settings: dict[str, Any]
    consumers: dict[str, dict[str, Any]]
    created_at: datetime


def encode_settings(settings: dict[str, Any]) -> str:
    """JSON for settings whose values may be timedeltas, datetimes or tuples."""

    def default(value: Any) -> Any:
        if isinstance(value, timedelta):
            return {"$interval_us": round(value.total_seconds() * 1_000_000)}
        if isinstance(value, datetime):
            return {"$timestamp": value.isoformat()}
        raise TypeError(f"cannot store setting value {value!r}")

    return json.dumps(settings, default=default, sort_keys=True)


def decode_settings(text: str) -> dict[str, Any]:
    def hook(item: dict[str, Any]) -> Any:
        if "$interval_us" in item:
            return timedelta(microseconds=item["$interval_us"])
        if "$timestamp" in item:
            return datetime.fromisoformat(item["$timestamp"])
        return item

    decoded = json.loads(text, object_hook=hook)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in decoded.items()}


class CatalogStore:
    def __init__(self, cursor: tables.Connection, clock: Clock) -> None:
        self._cursor = cursor
        self._clock = clock
        self._pending: dict[OffsetKey, list[tuple[int, int]]] = {}
        self.lock = threading.RLock()
        tables.run(cursor, DDL)
        self._topics: dict[str, TopicEntry] = {}
        # (topic id, consumer) -> partition -> committed offset. Copy on write: a
        # consumer's map is never changed once in place (``apply_offsets`` puts a new one),
        # so a reader takes it without the lock and a commit copies only its consumers'.
        self._offsets: dict[tuple[str, str], dict[int, int]] = {}
        self.changes = 0  # topics added or removed (engine.privilege_cache's generation)
        # Entries added, altered or removed (``engine.kept_plans``' generation, with the
        # partitions' ``topic_log.layout_generation``); bumped after each change.
        self.entries_changed = 0
        self._load()

    def _load(self) -> None:
        topics = tables.fetch_rows(
            self._cursor,
            f"SELECT name, topic_id, settings, consumers, created_at FROM {SCHEMA}.topics",
        )
        for name, topic_id, settings, consumers_text, created_at in topics:
            consumers = json.loads(consumers_text)
            self._topics[name] = TopicEntry(
                name,
                topic_id,
                decode_settings(settings),
                {consumer: decode_settings(json.dumps(s)) for consumer, s in consumers.items()},
                created_at,
            )
        offsets = tables.fetch_rows(
            self._cursor, f"SELECT topic_id, consumer, partition, committed FROM {SCHEMA}.offsets"
        )
        for topic_id, consumer, partition, committed in offsets:
            self._offsets.setdefault((topic_id, consumer), {})[partition] = committed

    # -- reads ------------------------------------------------------------------------
    def entry(self, name: str) -> TopicEntry | None:
        return self._topics.get(name)

    def entries(self) -> list[TopicEntry]:
        return sorted(self._topics.values(), key=lambda e: e.name)

    def topic_ids(self) -> set[str]:
        return {e.topic_id for e in self._topics.values()}

    def has_consumer(self, topic_id: str, consumer: str) -> bool:
        return any(
            e.topic_id == topic_id and consumer in e.consumers for e in self._topics.values()
        )

    def committed(self, topic_id: str, consumer: str, partition: int) -> int | None:
        offsets = self._offsets.get((topic_id, consumer))
        return None if offsets is None else offsets.get(partition)

    def committed_offsets(self, topic_id: str, consumer: str) -> Mapping[int, int]:
        """The consumer's committed offsets, partition -> offset (a partition never
        committed is absent): one snapshot, taken without copying, that no later commit
        changes (``apply_offsets`` replaces a consumer's map, never edits it)."""
        return MappingProxyType(self._offsets.get((topic_id, consumer), _NO_OFFSETS))

    def consumers_offsets(self, topic_id: str) -> list[Mapping[int, int]] | None:
        """Each of the topic's consumers' committed offsets (``committed_offsets``
        snapshots), None for a topic with no consumer (or none by that id): what the
        topic's ledger asks of its readers (``storage.ledger_route.Readers``), from the
        copier's thread (the topics and offsets are replaced on change, never edited)."""
        for entry in self._topics.values():
            if entry.topic_id == topic_id:
                return [self.committed_offsets(topic_id, c) for c in entry.consumers] or None
        return None

    def info(
        self, entry: TopicEntry, partitions: tuple[int, ...], active: tuple[int, ...]
    ) -> TopicInfo:
        return TopicInfo(
            entry.name, entry.topic_id, entry.settings, entry.consumers, partitions, active
        )

    # -- DDL --------------------------------------------------------------------------
    def add_topic(self, entry: TopicEntry, owner: str = OWNER_SUPERUSER) -> None:
        """Add the topic and its owner row in one DuckDB transaction."""
        with self.lock:
            tables.run(self._cursor, "BEGIN")
            try:
                tables.run(
                    self._cursor,
                    f"INSERT INTO {SCHEMA}.topics VALUES (?, ?, ?, ?, ?)",
                    [
                        entry.name,
                        entry.topic_id,
                        encode_settings(entry.settings),
                        _encode_consumers(entry.consumers),
                        entry.created_at,
                    ],
                )
                _forget_object(self._cursor, "topic", entry.name)
                tables.run(
                    self._cursor,
                    f"INSERT INTO {SCHEMA}.owners VALUES ('topic', ?, 'topic', ?)",
                    [entry.name, owner],
                )
                tables.run(self._cursor, "COMMIT")
            except BaseException:
                tables.run(self._cursor, "ROLLBACK")
                raise
            self._topics = {**self._topics, entry.name: entry}
            self.entries_changed += 1
            self.changes += 1

    def update_topic(self, entry: TopicEntry) -> None:
        """Store new settings and consumers; dropped consumers lose their offsets."""
        with self.lock:
            old = self._topics[entry.name]
            dropped = set(old.consumers) - set(entry.consumers)
            tables.run(self._cursor, "BEGIN")
            try:
                tables.run(
                    self._cursor,
                    f"UPDATE {SCHEMA}.topics SET settings = ?, consumers = ? WHERE name = ?",
                    [
                        encode_settings(entry.settings),
                        _encode_consumers(entry.consumers),
                        entry.name,
                    ],
                )
                for consumer in dropped:
                    tables.run(
                        self._cursor,
                        f"DELETE FROM {SCHEMA}.offsets WHERE topic_id = ? AND consumer = ?",
                        [entry.topic_id, consumer],
                    )
                tables.run(self._cursor, "COMMIT")
            except BaseException:
                tables.run(self._cursor, "ROLLBACK")
                raise
            self._topics = {**self._topics, entry.name: replace(entry)}
            self.entries_changed += 1
            self._offsets = {
                k: v
                for k, v in self._offsets.items()
                if not (k[0] == entry.topic_id and k[1] in dropped)
            }  # keys (topic id, consumer)

    def remove_topic(self, name: str) -> TopicEntry:
        with self.lock:
            entry = self._topics[name]
            tables.run(self._cursor, "BEGIN")
            try:
                tables.run(self._cursor, f"DELETE FROM {SCHEMA}.topics WHERE name = ?", [name])
                tables.run(
                    self._cursor,
                    f"DELETE FROM {SCHEMA}.offsets WHERE topic_id = ?",
                    [entry.topic_id],
                )
                _forget_object(self._cursor, "topic", name)
                tables.run(self._cursor, "COMMIT")
            except BaseException:
                tables.run(self._cursor, "ROLLBACK")
                raise
            self._topics = {k: v for k, v in self._topics.items() if k != name}
            self.entries_changed += 1
            self.changes += 1
            self._offsets = {k: v for k, v in self._offsets.items() if k[0] != entry.topic_id}
            return entry

    # -- offsets ----------------------------------------------------------------------
    def write_offsets(self, cursor: tables.Connection, moves: dict[OffsetKey, int]) -> None:
        """Write offset moves through ``cursor`` inside its open transaction.

        The caller commits that transaction and then calls ``apply_offsets``.
        """
        if not moves:
            return
        now = utc_from_us(self._clock.now_us())
        keys = list(moves)
        # One set-based statement whatever the number of rows (executemany costs a
        # statement per row); keys are unique, so the upsert sees each row once.
        tables.run(
            cursor,
            f"INSERT INTO {SCHEMA}.offsets SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), "
            "unnest(?::INTEGER[]), unnest(?::BIGINT[]), ?::TIMESTAMPTZ "
            "ON CONFLICT (topic_id, consumer, partition) DO UPDATE "
            "SET committed = EXCLUDED.committed, committed_at = EXCLUDED.committed_at",
            [
                [k[0] for k in keys],
                [k[1] for k in keys],
                [k[2] for k in keys],
                [moves[k] for k in keys],
                now,
            ],
        )

    def apply_offsets(self, moves: dict[OffsetKey, int]) -> None:
        """Update the mirror after the transaction holding ``moves`` committed.

        All or nothing: the new offsets and ranges are made first and put in place by two
        assignments, which allocate nothing; so a refused allocation (``MemoryError``
        under the process memory cap) changes nothing, and the committer's retry
        (``Committer._past_point``) moves the mirror once, as a first attempt would."""
        if moves:
            with self.lock:
                changed: dict[tuple[str, str], dict[int, int]] = {}
                for (topic_id, consumer, partition), offset in moves.items():
                    key = (topic_id, consumer)
                    if key not in changed:
                        changed[key] = dict(self._offsets.get(key, _NO_OFFSETS))
                    changed[key][partition] = offset
                offsets = {**self._offsets, **changed}
                pending = self._pending
                if pending and not pending.keys().isdisjoint(moves):
                    pending = dict(pending)
                    for key, offset in moves.items():
                        ranges = pending.get(key)
                        if ranges and offset < (self.committed(*key) or 0):
                            # A move back (SET OFFSETS) starts over: ranges committed ahead
                            # before it must not carry the offset past a rewound gap.
                            del pending[key]
                        elif ranges:
                            pending[key] = [r for r in ranges if r[1] > offset]
                self._offsets = offsets
                self._pending = pending

    def plan_ranges(
        self,
        ranges: dict[OffsetKey, tuple[int | None, int]],
        own: dict[OffsetKey, list[tuple[int, int]]],
    ) -> tuple[dict[OffsetKey, int], dict[OffsetKey, list[tuple[int, int]]]]:
        """Offset moves for ranges committed in any order (YDB's CommitOffset).

        A range ``[start, end)`` (``start`` None: from the committed offset) is remembered
        until the committed offset reaches it; the committed offset then advances over the
        gap-free prefix of the remembered ranges (the catalog's, committed, and ``own``:
        the calling transaction's earlier ones). Returns the moves and, per key, the
        transaction's ranges still ahead of where its move leaves the offset. Nothing is
        stored here: the caller commits the moves (then ``apply_offsets``) and, once its
        transaction committed, hands the ranges to ``remember_ranges``; a rollback drops
        them. 54000 past ``PENDING_RANGES_MAX`` ranges of one key, before anything changes.
        """
        with self.lock:
            moves: dict[OffsetKey, int] = {}
            ahead: dict[OffsetKey, list[tuple[int, int]]] = {}
            for key, (start, end) in ranges.items():
                committed = self.committed(*key) or 0
                begin = committed if start is None else start
                if end < begin:
                    raise InvalidParameterValueError(
                        f"offset range [{begin}, {end}) of partition {key[2]} is empty or reversed"
                    )
                mine = [*own.get(key, []), (begin, end)]
                pending = sorted([*self._pending.get(key, []), *mine])
                position = committed
                for range_start, range_end in pending:
                    if range_start <= position < range_end:
                        position = range_end
                if sum(1 for r in pending if r[1] > position) > limits.PENDING_RANGES_MAX:
                    raise LimitExceededError(
                        f"more than {limits.PENDING_RANGES_MAX} uncommitted offset ranges"
                    )
                ahead[key] = [r for r in mine if r[1] > position]
                if position != committed:
                    moves[key] = position
            return moves, ahead

    def remember_ranges(self, ranges: dict[OffsetKey, list[tuple[int, int]]]) -> None:
        """Keep a committed transaction's ranges that its moves did not reach (see
        ``plan_ranges``), for a later COMMIT OFFSETS that fills the gap before them.

        At most ``PENDING_RANGES_MAX`` a key, the lowest kept, each range once: every
        transaction open at once passed ``plan_ranges``'s bound against the same committed
        list, so without this N of them held N times the bound (round 26: 2 messages and
        N connections, each ``[1, 2)`` 10,000 times, made N x 10,000 ranges of one key,
        sorted under the catalog's lock at every later COMMIT OFFSETS of it, which the
        bound then refused). A range dropped here only means its messages are delivered
        again once the gap before it is committed, never skipped."""
        with self.lock:
            for key, added in ranges.items():
                committed = self.committed(*key) or 0
                kept = sorted({r for r in [*self._pending.get(key, []), *added]
                               if r[1] > committed})  # fmt: skip
                del kept[limits.PENDING_RANGES_MAX :]
                if kept:
                    self._pending[key] = kept
                else:
                    self._pending.pop(key, None)


def _forget_object(cursor: tables.Connection, namespace: str, name: str) -> None:
    """Delete the owner and grants of an object (dropped, or about to be re-created)."""
    for table in ("owners", "grants"):
        tables.run(
            cursor, f"DELETE FROM {SCHEMA}.{table} WHERE namespace = ? AND name = ?",
            [namespace, name],
        )  # fmt: skip


def _encode_consumers(consumers: dict[str, dict[str, Any]]) -> str:
    return json.dumps({name: json.loads(encode_settings(s)) for name, s in consumers.items()})
