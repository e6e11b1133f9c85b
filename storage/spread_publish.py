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

import contextlib
import itertools
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from storage import failpoints, limits
from storage.partition_log import PartitionLog
from storage.producer_state import decide_shares


def publish_shares(
    logs: Sequence[PartitionLog],
    batches: Sequence[pa.RecordBatch],
    bodies: Sequence[pa.Buffer | None],
    transaction_id: int,
) -> list[int] | None:
    """Publish ``batches[i]`` to ``logs[i]`` (distinct partitions, ascending ids), each as
    one frame tagged ``transaction_id``; ``bodies[i]``: its encoded body, reused if the
    batch is written unchanged. Returns each share's base offset: every message was
    written, the share's ``k``-th at base + ``k``. None (nothing written) when the usual
    case does not hold (see the module doc). The batches passed
    ``PartitionLog.check_append``."""
    assert len(logs) == len(batches) == len(bodies) and transaction_id > 0
    assert all(a.partition_id < b.partition_id for a, b in itertools.pairwise(logs))
    if not all(_one_frame(batch) for batch in batches):
        return None
    with contextlib.ExitStack() as locks:
        for log in logs:
            locks.enter_context(log.writes_paused())
        if not all(log.publishable_locked() for log in logs):
            return None
        decision = decide_shares([log.producers for log in logs], list(batches))
        if decision is None:
            return None
        bases: list[int] = []
        for log, original, batch, body, record in zip(
            logs, batches, decision.batches, bodies, decision.records, strict=True
        ):
            if bases:  # between two partitions' shares
                failpoints.hit("publish.mid_spread")
            reused = body if batch is original else None
            bases.append(log.write_share_locked(batch, transaction_id, reused, record))
    return bases


def _one_frame(batch: pa.RecordBatch) -> bool:
    """Whether the share is published as one frame (``frame_cuts.frame_slices``)."""
    if batch.num_rows > limits.FRAME_TARGET_MESSAGES:
        return False
    data = batch.column(5)
    if not len(data):
        return False
    offsets = np.frombuffer(data.buffers()[1], np.int32, len(data) + 1, data.offset * 4)
    return int(offsets[-1] - offsets[0]) <= limits.FRAME_TARGET_BYTES
