"""A committed transaction's shares of many partitions of one topic, published together.

A statement spread over a topic's partitions (``engine.spread_append``) publishes one
small share to each: 5,000 messages over 1000 partitions are shares of about 5. Share
by share, ``PartitionLog.publish_transactional`` costs ~100 us of Python each, most of
it fixed per call (the producer-state decision and update, result arrays). Here every
partition's write lock is taken (in the given order, ascending partition ids: nobody
holds two partition locks otherwise, so no cycle), the producer state of all shares is
decided in one vectorized pass (``producer_state.decide_shares``), and then each share
is written as one frame, its producer state recorded and the frame published, partition
by partition, as the share-by-share path does.

Same outcome as publishing share by share (the tests compare the two): the same
frames (one per share, tagged with the transaction id), dedup decided under each
partition's write lock against its state, in the given order, each partition's frame
visible once its producer state is recorded. An I/O error on a partition fences it and
is raised after the partitions before it were written, as share by share. Anything out
of the usual (a partition not publishable, a share to be cut into frames, a duplicate
or anything ``decide_shares`` does not decide) returns None before anything is written:
the caller then publishes share by share.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage import failpoints, limits
from storage.config import TopicConfig
from storage.partition_log import PartitionLog
from storage.producer_state import SpreadDecision, decide_shares
from storage.record_batch import WIRE_SCHEMA, serialize_body_buffer
from storage.wire_columns import refill_seq_nos

SEQ_NO_COLUMN = 0  # of ``record_batch.WIRE_SCHEMA``
CODEC_COLUMN = 4
DATA_COLUMN = 5


def publish_shares(
    logs: Sequence[PartitionLog],
    batches: Sequence[pa.RecordBatch],
    bodies: Sequence[pa.Buffer | None],
    data_bytes: Sequence[int],
    transaction_id: int,
    table: pa.Table | None = None,
) -> list[int] | None:
    """Publish ``batches[i]`` to ``logs[i]`` (distinct partitions, ascending ids), each as
    one frame tagged ``transaction_id``; ``bodies[i]``: its encoded body, reused if the
    batch is written unchanged. Returns each share's base offset: every message was
    written, the share's ``k``-th at base + ``k``. None (nothing written) when the usual
    case does not hold (see the module doc). The batches passed ``checked_data_bytes``,
    which gave ``data_bytes`` (and ``table``, all of them as one table: ``checked_shares``)."""
    assert len(logs) == len(batches) == len(bodies) == len(data_bytes) and transaction_id > 0
    assert all(a.partition_id < b.partition_id for a, b in itertools.pairwise(logs))
    messages, target = limits.FRAME_TARGET_MESSAGES, limits.FRAME_TARGET_BYTES
    if any(
        b.num_rows > messages or size > target for b, size in zip(batches, data_bytes, strict=True)
    ):
        return None  # cut into several frames (``frame_cuts.frame_slices``): share by share
    taken: list[threading.Lock] = []
    bases: list[int] = []
    try:
        for log in logs:
            log.write_lock.acquire()
            taken.append(log.write_lock)
        if not all(log.publishable_locked() for log in logs):
            return None
        for log in logs:  # the topic's ledger rows first (``storage.ledger_route``)
            log.settle_locked()
        decision = decide_shares([log.producers for log in logs], list(batches), table)
        if decision is None:
            return None
        final = _frame_bodies(decision, bodies, data_bytes)
        for index, (log, body) in enumerate(zip(logs, final, strict=True)):
            if bases:  # between two partitions' shares
                failpoints.hit("publish.mid_spread")
            # Framed from its body when it has one (the batch gives the row count only).
            batch = decision.originals[index] if body is not None else decision.batch(index)
            try:
                bases.append(log.write_share_locked(batch, transaction_id, body, decision, index))
            except BaseException as error:  # its frame may be written, not published:
                log.fence_if_unpublished(error)  # cut it (recovery republishes the share)
                raise
    finally:
        for lock in taken:
            lock.release()
        # Wake the readers once per condition (a topic's partitions share its one).
        written = {id(log.data_ready): log for log in logs[: len(bases)]}
        for log in written.values():
            log.notify_readers()
    return bases


def _frame_bodies(
    decision: SpreadDecision,
    staged: Sequence[pa.Buffer | None],
    data_bytes: Sequence[int],
) -> list[pa.Buffer | None]:
    """Each decided share's body for its frame. A share written unchanged keeps its
    staged body. A share the decision numbered (its seq_nos were all null: the writer
    numbers them) differs from its staged body only in that column: a small one gets the
    staged body with the seq_nos filled in (``wire_columns.refill_seq_nos``, the bytes
    ``serialize_body_buffer`` would give, for all such shares at once, from the
    decision's numbers: no batch is built per share); a large one, or any a refill does
    not take, is serialized if small (as ``FrameEncoder`` would copy it, without its size
    checks first), else left to the frame encoder (None)."""
    final: list[pa.Buffer | None] = []
    refill: list[int] = []
    for index, (body, size) in enumerate(zip(staged, data_bytes, strict=True)):
        if decision.seq_nos is None and body is not None:
            final.append(body)
            continue
        final.append(None)
        if size <= limits.SPREAD_COPIED_BYTES_MAX:
            refill.append(index)
    if refill:
        given = [staged[i] for i in refill]
        refilled = None
        numbers = decision.seq_nos
        if numbers is not None and all(b is not None for b in given):
            counts = np.fromiter(
                (decision.originals[i].num_rows for i in refill), np.int64, len(refill)
            )
            if len(refill) == len(staged):  # all of them: the numbers as decided
                values = numbers
            else:
                values = np.concatenate(
                    [numbers[decision.starts[i] : decision.starts[i] + int(n)]
                     for i, n in zip(refill, counts.tolist(), strict=True)]
                )  # fmt: skip
            refilled = refill_seq_nos(given, counts, values)  # type: ignore[arg-type]
        bodies = refilled or [serialize_body_buffer(decision.batch(i)) for i in refill]
        for index, body in zip(refill, bodies, strict=True):
            final[index] = body
    return final


def checked_data_bytes(batches: Sequence[pa.RecordBatch], config: TopicConfig) -> list[int] | None:
    """Each batch's message bytes, if every batch passes the checks of itself that
    ``PartitionLog.check_append`` makes (``check_wire_batch``: the schema, its messages'
    count and sizes, its buffers' size; the topic's codecs), else None (share by share,
    the failing check raises). One pass over all batches' columns together."""
    checked = checked_shares(batches, config)
    return None if checked is None else checked[0]


def checked_shares(
    batches: Sequence[pa.RecordBatch],
    config: TopicConfig,
    whole: pa.RecordBatch | None = None,
    counts: np.ndarray | None = None,
) -> tuple[list[int], pa.Table] | None:
    """``checked_data_bytes``, with the table of all batches it read them through
    (``publish_shares`` decides the producer state over the same table). ``whole``: the
    batch ``batches`` are consecutive slices of (``topic_log.Shares.whole``), read as the
    table's one chunk instead of one chunk a share (the same rows in the same order).
    ``counts``: the batches' row counts, if known (then no batch is read unless the
    whole is over the byte limit: ``topic_log.Shares.pieces`` makes each when read)."""
    if counts is None:
        counts = np.fromiter((b.num_rows for b in batches), np.int64, len(batches))
    assert len(counts) == len(batches)
    if not len(counts) or counts.min() <= 0 or counts.max() > limits.BATCH_MESSAGES_MAX:
        return None
    try:  # all columns of all shares
        table = pa.Table.from_batches([whole] if whole is not None else batches, WIRE_SCHEMA)
    except (pa.ArrowInvalid, TypeError):  # another schema
        return None
    assert table.num_rows == int(counts.sum())
    # Buffers shared by the shares (slices of one batch) are counted once here; a share's
    # own count is at most the total, so only a total over the limit needs each share's.
    if table.get_total_buffer_size() > limits.BATCH_BYTES_MAX and any(
        batch.get_total_buffer_size() > limits.BATCH_BYTES_MAX for batch in batches
    ):
        return None
    sizes = pc.binary_length(table.column(DATA_COLUMN)).to_numpy().astype(np.int64)
    if int(sizes.max()) > limits.MESSAGE_BYTES_MAX:
        return None
    codecs = table.column(CODEC_COLUMN)
    if codecs.null_count:
        return None
    supported = {int(codec) for codec in config.supported_codecs}
    if not set(np.unique(codecs.to_numpy()).tolist()) <= supported:
        return None
    return np.add.reduceat(sizes, np.cumsum(counts) - counts).tolist(), table
