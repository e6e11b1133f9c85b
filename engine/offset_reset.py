"""Running ``SetConsumerOffsets``: a consumer's committed offsets moved anywhere.

``ALTER TOPIC t ALTER CONSUMER c SET OFFSETS TO EARLIEST | LATEST | TIMESTAMP '...' |
(PARTITION p OFFSET o, ...) [FORCE]`` (planned by ``planner.offsets``).

Rules:

- **Refused while the consumer has live members** (55006, naming them): their leases
  mean someone is consuming right now, as Kafka refuses to reset an active group.
  ``FORCE`` moves the offsets anyway; a member whose transaction read before the move
  then fails its COMMIT with 40001 (its read no longer starts at the committed offset).
- **Transactional.** The move is recorded in the session's transaction as an empty
  range read at the target (``ReadRange(basis, target, target)``): it goes through
  the commit protocol (``engine.commit``: the commit record, then the catalog) when the
  transaction commits, and vanishes if it rolls back. Autocommit makes it a
  transaction of its own.
- **Validated like a read.** A reader whose range started at the old offset gets 40001
  at its COMMIT; and if the consumer's offset moved between the statement and its
  COMMIT, the move gets 40001 (retry it). Why not a blind write: recovery replays
  commit records in transaction-id order, and only validated moves of one consumer
  partition are sure to commit in that order.
- **Inside the transaction** the move is seen by later reads of the same consumer
  (they continue from the target, and their end is where the offset goes); a move
  after a read replaces where that read would have left the offset, and keeps that
  read's validation.
- **Targets.** EARLIEST: each partition's first retained offset. LATEST: each
  partition's end, all taken at one cut under the publish lock (a transaction's
  publish is skipped whole or not at all). TIMESTAMP: the first message written at or
  after it (the end if none). Explicit offsets: below the first retained offset they
  mean that offset; past the end they are refused (22023).

Offsets are dense and a move sets the committed offset, i.e. the next offset to read.
"""

from __future__ import annotations

from engine.protocols import TopicSource
from engine.transaction import ReadRange, Transaction
from planner.operations import CommitConsumerOffsets, SetConsumerOffsets
from storage.errors import InvalidParameterValueError, ObjectInUseError


def set_consumer_offsets(
    database: TopicSource, transaction: Transaction, operation: SetConsumerOffsets
) -> int:
    """Stage the moves of ``operation`` in ``transaction``; returns how many partitions."""
    if not operation.force:
        members = database.leases.members((operation.topic_id, operation.consumer))
        if members:
            listed = ", ".join(f'"{m}"' for m in members)
            raise ObjectInUseError(
                f'consumer "{operation.consumer}" of topic "{operation.topic}" has live '
                f"members ({listed}); stop them, or add FORCE to move its offsets anyway"
            )
    targets = _targets(database, operation)
    for partition, offset in targets.items():
        key = (operation.topic_id, operation.consumer, partition)
        _move(transaction, key, database.catalog.committed(*key), offset)
    return len(targets)


def _targets(database: TopicSource, operation: SetConsumerOffsets) -> dict[int, int]:
    topic = database.topic_log(operation.topic_id)
    with database.publish_lock:
        ends = {p: topic.partition(p).end_offset for p in operation.partitions}
    explicit = dict(operation.offsets)
    targets: dict[int, int] = {}
    for partition_id in operation.partitions:
        partition = topic.partition(partition_id)
        end = ends[partition_id]
        if operation.target == "earliest":
            offset = partition.start_offset
        elif operation.target == "latest":
            offset = end
        elif operation.target == "timestamp":
            assert operation.timestamp_us is not None
            offset = min(partition.offset_for_time(operation.timestamp_us), end)
        else:
            offset = explicit[partition_id]
            if offset > end:
                raise InvalidParameterValueError(
                    f"offset {offset} of partition {partition_id} is past its end ({end}); "
                    f'topic "{operation.topic}" holds offsets {partition.start_offset} to '
                    f"{end - 1}, and {end} means nothing left to read"
                )
            offset = max(offset, partition.start_offset)
        targets[partition_id] = offset
    return targets


def _move(
    transaction: Transaction, key: tuple[str, str, int], committed: int | None, offset: int
) -> None:
    """The committed offset of ``key`` goes to ``offset`` when ``transaction`` commits,
    provided it is still ``committed`` then (or what an earlier read of it saw)."""
    transaction.offset_moves.pop(key, None)  # an earlier COMMIT OFFSETS: overridden
    read = transaction.reads.get(key)
    if read is None:
        transaction.reads[key] = ReadRange(committed, offset, offset)
        return
    # The transaction read this partition before: keep that read's validation (its
    # basis), but the offset now goes to ``offset``, and a later read continues there.
    read.start = min(read.start, offset)
    read.end = offset


def check_commit_ranges(database: TopicSource, operation: CommitConsumerOffsets) -> None:
    """Refuse (22023) a ``COMMIT OFFSETS`` range ending past its partition's end.

    Such a range would set the committed offset ahead of every message written so far:
    the consumer would silently skip the messages written up to it (lag shown as 0),
    an important consumer would stop holding them against retention, and a range kept
    pending past the end would do the same later. Ends only grow, so a range within
    the end now stays within it at COMMIT. Explicit ``SET OFFSETS`` refuses the same."""
    topic = database.topic_log(operation.topic_id)
    with database.publish_lock:
        ends = {p: topic.partition(p).end_offset for p, _, _ in operation.ranges}
    for partition_id, _, range_end in operation.ranges:
        end = ends[partition_id]
        if range_end > end:
            raise InvalidParameterValueError(
                f"offset range of partition {partition_id} ends at {range_end}, past the "
                f'partition\'s end ({end}); topic "{operation.topic}" holds offsets below {end}'
            )
