"""The atomic commit of a transaction across topics, offsets and tables.

Protocol (DESIGN.md §4, YDB's "stage, then publish"):

1. *stage*: the transaction's topic writes, routed to their partitions, are
   appended to the staging log and synced (fsync 1; concurrent transactions
   share it). Invisible to every reader.
2. *commit point*: one DuckDB transaction holds the session's table changes
   and one record row of the transaction (id, time, its consumer offset moves,
   and where its staged batches lie), and commits (fsync 2: DuckDB's WAL).
   The offset ranges read are validated under the commit lock just before the
   COMMIT; the record row is written before taking the lock, so the lock
   covers only validation, COMMIT and publish.
3. *publish*: each partition gets the transaction's batches as one frame
   tagged with the transaction id, without a sync; readers see it whole.
4. *checkpoint* (every ``CHECKPOINT_TRANSACTIONS`` commits and at close):
   sync the partitions published to, then in one DuckDB transaction write the
   current committed offsets of every consumer moved into the offsets table
   and delete the records; release staging. Between checkpoints the records
   are the durable home of offset moves (append-only: one statement per
   commit instead of an upsert per consumer partition).

Recovery (``recover``) replays the records' offset moves in order over the
offsets table and re-publishes, for every record, the batches whose tagged
frame is not in its partition: idempotent, so a crash during recovery is
harmless. Staging that no record needs is deleted.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from engine import tables
from engine.catalog import SCHEMA
from storage import failpoints
from storage.errors import UndefinedTopicError
from storage.staging import StagedBatch, StagingLog

log = logging.getLogger(__name__)

CHECKPOINT_TRANSACTIONS = 256
# Published frames are searched from this long before the commit time, in
# case the wall clock stepped back a little between commit and publish.
CLOCK_SLACK_US = 60 * 1_000_000

RECORDS_DDL = f"""
CREATE TABLE IF NOT EXISTS {SCHEMA}.transactions (
    transaction_id BIGINT PRIMARY KEY, committed_at_us BIGINT NOT NULL, items VARCHAR NOT NULL,
    offsets VARCHAR NOT NULL);
"""


@dataclass(frozen=True, slots=True)
class PublishItem:
    """One partition's share of a transaction: a batch and where it is staged."""

    topic_id: str
    partition: int
    batch: pa.RecordBatch
    staged: StagedBatch | None = None


def route_writes(database, writes) -> list[PublishItem]:
    """Split pending writes by target partition; one batch per partition, in write order."""
    grouped: dict[tuple[str, int], list[pa.RecordBatch]] = {}
    for write in writes:
        topic = database.topic_log(write.topic_id)
        if write.partition is not None:
            topic.partition(write.partition)  # refuses an unknown partition now
            grouped.setdefault((write.topic_id, write.partition), []).append(write.batch)
            continue
        targets = topic.route(write.batch)
        for partition in np.unique(targets):
            rows = np.flatnonzero(targets == partition)
            piece = (
                write.batch.take(pa.array(rows))
                if len(rows) < write.batch.num_rows
                else (write.batch)
            )
            grouped.setdefault((write.topic_id, int(partition)), []).append(piece)
    return [
        PublishItem(topic_id, partition, pa.concat_batches(batches))
        for (topic_id, partition), batches in grouped.items()
    ]


class Committer:
    def __init__(self, database, staging: StagingLog) -> None:
        self._database = database
        self.staging = staging
        self._lock = threading.Lock()
        self._cursor = database.root.cursor()
        tables.run(self._cursor, RECORDS_DDL)
        self._last_id = 0
        self._published: list[tuple[int, list[tuple[str, int]]]] = []
        self._unfinished: list[tuple[int, list[PublishItem]]] = []
        self._publishing: set[int] = set()
        # Offset moves committed since the last checkpoint (their keys).
        self._moved: dict[tuple[str, str, int], int] = {}

    def next_transaction_id(self) -> int:
        """Unique and increasing across restarts: microseconds of wall time, bumped."""
        with self._lock:
            self._last_id = max(self._last_id + 1, self._database.clock.now_us())
            return self._last_id

    def stage(self, transaction_id: int, items: list[PublishItem]) -> list[PublishItem]:
        placed = self.staging.stage(transaction_id, [item.batch for item in items])
        failpoints.hit("commit.after_stage")
        return [
            PublishItem(i.topic_id, i.partition, i.batch, s)
            for i, s in zip(items, placed, strict=True)
        ]

    def write_record(
        self,
        cursor,
        transaction_id: int,
        items: list[PublishItem],
        moves: dict[tuple[str, str, int], int],
    ) -> None:
        """Insert the commit record through the session's cursor (inside its transaction)."""
        payload = [
            [i.topic_id, i.partition, i.staged.file_number, i.staged.position, i.staged.frame_bytes]
            for i in items
            if i.staged is not None
        ]
        offsets = [[t, c, p, o] for (t, c, p), o in moves.items()]
        tables.run(
            cursor,
            f"INSERT INTO {SCHEMA}.transactions VALUES (?, ?, ?, ?)",
            [
                transaction_id,
                self._database.clock.now_us(),
                json.dumps(payload),
                json.dumps(offsets),
            ],
        )

    def committed(self, transaction_id: int, moves: dict[tuple[str, str, int], int]) -> None:
        """Note a transaction past its commit point; its offsets reach the table later.

        Transactions without topic writes are counted for the checkpoint here;
        ``publish`` counts the others.
        """
        with self._lock:
            self._moved.update(moves)
        if not self._pending_publish(transaction_id):
            self._note_done(transaction_id, [])

    def _pending_publish(self, transaction_id: int) -> bool:
        return transaction_id in self._publishing

    def publish(self, transaction_id: int, items: list[PublishItem]) -> None:
        """Step 3: one tagged frame per partition, no sync. Called after the commit point.

        If publishing fails half way (an I/O error, an interrupt), the
        transaction is remembered and the next checkpoint publishes what is
        missing, exactly as recovery would after a crash.
        """
        try:
            if self._unfinished:
                with self._lock:
                    self._finish_unfinished()
            with self._database.publish_lock:
                for index, item in enumerate(items):
                    if index == 1:
                        failpoints.hit("commit.mid_publish")
                    self._publish_item(transaction_id, item)
        except BaseException:
            with self._lock:
                self._unfinished.append((transaction_id, items))
            raise
        self._publishing.discard(transaction_id)
        self._note_done(transaction_id, [(i.topic_id, i.partition) for i in items])

    def expect_publish(self, transaction_id: int) -> None:
        self._publishing.add(transaction_id)

    def _note_done(self, transaction_id: int, targets: list[tuple[str, int]]) -> None:
        with self._lock:
            self._published.append((transaction_id, targets))
            due = len(self._published) >= CHECKPOINT_TRANSACTIONS
        if due:
            self.checkpoint()

    def _publish_item(self, transaction_id: int, item: PublishItem, *, check: bool = False) -> None:
        """Publish one partition's batch; with ``check``, only if it is not there yet."""
        topic = self._database.topic_log(item.topic_id)
        if check:
            since = transaction_id - CLOCK_SLACK_US  # ids are commit-time microseconds
            if topic.partition(item.partition).contains_transaction(transaction_id, since):
                return
        topic.publish_transactional(item.batch, item.partition, transaction_id)

    def _finish_unfinished(self) -> None:
        """Publish what failed publishes left out (caller holds ``_lock``)."""
        while self._unfinished:
            transaction_id, items = self._unfinished[0]
            for item in items:
                self._publish_item(transaction_id, item, check=True)
            self._unfinished.pop(0)  # only once all of it is published
            self._published.append((transaction_id, [(i.topic_id, i.partition) for i in items]))

    def abandon(self, transaction_id: int) -> None:
        """The transaction will never commit: its staging may go."""
        self.staging.release({transaction_id})

    def checkpoint(self) -> None:
        """Sync published partitions, delete their records, release their staging."""
        with self._lock:
            self._finish_unfinished()
            published, self._published = self._published, []
            if not published and not self._moved:
                return
            partitions = {p for _, targets in published for p in targets}
            try:
                for topic_id, partition in sorted(partitions):
                    try:
                        topic = self._database.topic_log(topic_id)
                    except UndefinedTopicError:
                        continue  # dropped since: nothing to sync
                    topic.partition(partition).sync()
            except BaseException:
                self._published = published + self._published  # not durable: keep them
                raise
            ids = [transaction_id for transaction_id, _ in published]
            failpoints.hit("commit.checkpoint_before_delete")
            catalog = self._database.catalog
            current = {key: catalog.committed(*key) for key in self._moved}
            offsets = {
                key: offset
                for key, offset in current.items()
                if offset is not None and catalog.has_consumer(key[0], key[1])
            }
            tables.run(self._cursor, "BEGIN TRANSACTION")
            try:
                catalog.write_offsets(self._cursor, offsets)
                tables.run(
                    self._cursor,
                    f"DELETE FROM {SCHEMA}.transactions WHERE transaction_id IN "
                    f"(SELECT unnest(?::BIGINT[]))",
                    [ids],
                )
                tables.run(self._cursor, "COMMIT")
            except BaseException:
                tables.run(self._cursor, "ROLLBACK")
                raise
            self._moved.clear()
            self.staging.release(set(ids))

    def recover(self) -> int:
        """Re-publish what committed transactions left unpublished. Returns how many."""
        result = tables.query_arrow(
            self._cursor,
            f"SELECT transaction_id, committed_at_us, items, offsets FROM {SCHEMA}.transactions "
            "ORDER BY transaction_id",
        )
        assert result is not None
        republished = 0
        for row in result.to_pylist():
            transaction_id = row["transaction_id"]
            self._last_id = max(self._last_id, transaction_id)
            catalog = self._database.catalog
            moves = {
                (t, c, p): o
                for t, c, p, o in json.loads(row["offsets"])
                if catalog.has_consumer(t, c)
            }
            catalog.apply_offsets(moves)
            self._moved.update(moves)
            targets = []
            for topic_id, partition, number, position, length in json.loads(row["items"]):
                staged = StagedBatch(number, position, length)
                self.staging.keep(transaction_id, [staged])
                try:
                    topic = self._database.topic_log(topic_id)
                except UndefinedTopicError:
                    continue  # the topic was dropped since
                log_ = topic.partition(partition)
                since = row["committed_at_us"] - CLOCK_SLACK_US
                if not log_.contains_transaction(transaction_id, since):
                    batch = self.staging.read(staged)
                    log_.publish_transactional([batch], transaction_id)
                    republished += 1
                    failpoints.hit("recovery.after_republish")
                targets.append((topic_id, partition))
            self._published.append((transaction_id, targets))
        self.staging.release(set())  # files no record needs: aborted or undecided staging
        self.checkpoint()
        return republished

    def close(self) -> None:
        try:
            self.checkpoint()
        finally:
            self.staging.close()
            self._cursor.close()
