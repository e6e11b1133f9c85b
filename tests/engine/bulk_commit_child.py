"""A process that stages a bulk write and commits it, for ``test_bulk_commit_crash.py``.

    python bulk_commit_child.py DATA_DIR stage-and-commit|stage|commit|open

``stage-and-commit`` creates topic ``t`` (``PARTITIONS`` partitions) and table ``totals``
if needed, stages ``ROWS`` messages over ``WRITES`` write ids ``w0``.. (each row names its
partition, ``row % PARTITIONS``, as Spark's tasks do) plus one table row under ``wt``,
commits them as ``(SINK, BATCH)`` and runs a checkpoint (so that crash points inside it
are reached); ``stage`` only stages, ``commit`` only commits (and checkpoints); ``open``
only opens and closes (recovery runs). Crash points come from ``TOPICBASE_FAILPOINTS`` (exit 137);
a clean run prints ``done <status>`` and exits 0. ``BULK_FRAME_MESSAGES`` lowers
``limits.FRAME_TARGET_MESSAGES`` so that each partition's share is published as several
frames (``storage.frame_cuts``). Topic rows are staged as frames (``storage.staged_frames``)
unless ``BULK_STAGE_FORMAT=arrows``, which adds a codec column ("raw": a column frames
cannot hold, ``engine.staged_refs.framed_batch``): the rows are then staged as they came and
committed by reference to those files; ``BULK_STAGE_FORMAT=mixed`` stages each write's
first file as frames and its second with the codec column (a write holding a frames file
then an Arrow file: the commit publishes each partition's frames, then its Arrow rows by
reference, as one share of one transaction); ``BULK_STAGE_FORMAT=column`` stages each
write's two files as a client's staged frames (``COPY ... (FORMAT frames)``), one frame a
partition, each frame's data column compressed whole (``storage.column_codec``: the Spark
writer's). ``BULK_BATCH_MESSAGES`` lowers
``limits.BATCH_MESSAGES_MAX`` (what one transaction may write to a partition) below a
partition's share; ``BULK_SPLIT_BEFORE_PUBLISH`` splits partition 0 between the commit's
routing and its publish. ``BULK_ADOPT=bytes,files,switch`` sets ``limits.ADOPT_BYTES_MIN``,
``limits.ADOPT_FILES_MAX`` and ``limits.ADOPT_SWITCH_BYTES``: each COPY stages up to
``files`` partitions' frames past ``switch`` bytes in files of their own, adopted as
segments by the publish from ``bytes`` (``storage.staged_frames``).
``BULK_DROP_BEHIND=keep,step,interval`` sets ``limits.DROP_BEHIND_KEEP_BYTES``,
``limits.DROP_BEHIND_STEP_BYTES`` and ``limits.WRITEBACK_INTERVAL_BYTES``: own files' pages
dropped behind their writeback within a small write (``staged_frames.DropBehind``).
``BULK_PUBLISH_THREADS`` sets ``engine.commit.FRAMED_PUBLISH_THREADS`` (1: the shares
published one after another in partition order, so that a failpoint's ``@n`` counts the
same hits in every run). ``BULK_HOLD_PARTITION_0`` holds partition 0's publish (30 s)
while the others publish, so that a kill at ``commit.mid_publish`` (hit once another
share is published) finds partition 0 without its share.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow as pa

from engine import bulk_write
from engine.database import Database
from storage import limits

PARTITIONS = 4
WRITES = 4
ROWS = 2000
SINK, BATCH = "sink", 1
TABLE_WRITE = "wt"


def message(index: int) -> bytes:
    return b"m%06d-" % index + b"x" * 200


def expected() -> dict[int, list[bytes]]:
    """Each partition's messages, sorted."""
    per_write = ROWS // WRITES
    found: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for index in range(per_write * WRITES):
        found[index % PARTITIONS].append(message(index))
    return found


def write_ids() -> list[str]:
    return [f"w{i}" for i in range(WRITES)] + [TABLE_WRITE]


def stage(database: Database) -> None:
    session = database.connect()
    try:
        if database.catalog.entry("t") is None:
            ranged = (", auto_partitioning_strategy = 'paused'"  # partitions that can split
                      if os.environ.get("BULK_SPLIT_BEFORE_PUBLISH") else "")  # fmt: skip
            session.execute(f"CREATE TOPIC t WITH (min_active_partitions = {PARTITIONS}{ranged})")
            session.execute("CREATE TABLE totals (k VARCHAR, n BIGINT)")
        bulk = bulk_write.for_database(database)
        per_write = ROWS // WRITES
        for number in range(WRITES):
            indexes = range(number * per_write, (number + 1) * per_write)
            columns = {
                "data": pa.array([message(i) for i in indexes], pa.binary()),
                "partition": pa.array([i % PARTITIONS for i in indexes], pa.int32())}
            stage_format = os.environ.get("BULK_STAGE_FORMAT")
            framed = pa.record_batch(dict(columns))
            if stage_format in ("arrows", "mixed"):
                columns["codec"] = pa.array(["raw"] * len(indexes))
            batch = pa.record_batch(columns)
            first = framed if stage_format == "mixed" else batch
            bulk.start(session, f"w{number}", "topic", "t")
            half = per_write // 2  # two files per write
            if stage_format == "column":
                for part in (framed.slice(0, half), framed.slice(half)):
                    stream = io.BytesIO(_column_frames(part))
                    bulk.append_frames(session, f"w{number}", stream.read)
                continue
            bulk.append(session, f"w{number}", [first.slice(0, half)], first.schema)
            bulk.append(session, f"w{number}", [batch.slice(half)], batch.schema)
        rows = pa.record_batch({"k": ["a"], "n": pa.array([1], pa.int64())})
        bulk.start(session, TABLE_WRITE, "table", "totals")
        bulk.append(session, TABLE_WRITE, [rows], rows.schema)
    finally:
        session.close()


def _column_frames(rows: pa.RecordBatch) -> bytes:
    """``rows`` (``data``, ``partition``) as a client's stream of staged frames, one a
    partition, each frame's data column compressed whole (``storage.column_codec``)."""
    from storage.column_codec import compress_body
    from tests.pgwire.test_copy_frames import frame, wire

    pieces = []
    partitions = rows.column("partition").to_pylist()
    data = rows.column("data").to_pylist()
    for partition in range(PARTITIONS):
        messages = [d for d, p in zip(data, partitions, strict=True) if p == partition]
        if messages:
            batch = wire(messages)
            pieces.append(frame(partition, batch, body=compress_body(batch).to_pybytes()))
    return b"".join(pieces)


def commit(database: Database) -> str:
    session = database.connect()
    try:
        outcome = bulk_write.for_database(database).commit(session, SINK, BATCH, write_ids())
    finally:
        session.close()
    database.committer.checkpoint()
    return outcome["status"]


def split_before_publish() -> None:
    """Split partition 0 after the commit routed its share there and before the publish:
    the share goes to a child (``TopicLog._publish_staged_to_lineage``)."""
    from engine import commit as commit_module

    publish = commit_module.Committer._publish_in_turn

    def split_first(self, transaction_id, items, log_end):
        for item in items:
            if item.frames is not None and item.partition == 0:
                assert self._database.topic_log(item.topic_id).split(0, force=True)
        return publish(self, transaction_id, items, log_end)

    commit_module.Committer._publish_in_turn = split_first


def hold_partition_0() -> None:
    """Partition 0's staged share waits 30 s before it is published (the others not)."""
    from storage.partition_log import PartitionLog

    publish = PartitionLog.publish_staged

    def held(self: PartitionLog, *args: Any, **kwargs: Any) -> Any:
        if self.partition_id == 0:
            threading.Event().wait(30)
        return publish(self, *args, **kwargs)

    PartitionLog.publish_staged = held


def main() -> None:
    data, action = sys.argv[1], sys.argv[2]
    if os.environ.get("BULK_FRAME_MESSAGES"):  # small frames: each share is cut in several
        limits.FRAME_TARGET_MESSAGES = int(os.environ["BULK_FRAME_MESSAGES"])
    if os.environ.get("BULK_BATCH_MESSAGES"):  # shares over one transaction's limit
        limits.BATCH_MESSAGES_MAX = int(os.environ["BULK_BATCH_MESSAGES"])
    if os.environ.get("BULK_ADOPT"):  # "bytes,files,switch": own files adopted
        adopt_bytes, adopt_files, switch = os.environ["BULK_ADOPT"].split(",")
        limits.ADOPT_BYTES_MIN, limits.ADOPT_FILES_MAX = int(adopt_bytes), int(adopt_files)
        limits.ADOPT_SWITCH_BYTES = int(switch)
    if os.environ.get("BULK_DROP_BEHIND"):  # "keep,step,interval": own files' pages dropped
        keep, step, interval = (int(v) for v in os.environ["BULK_DROP_BEHIND"].split(","))
        limits.DROP_BEHIND_KEEP_BYTES, limits.DROP_BEHIND_STEP_BYTES = keep, step
        limits.WRITEBACK_INTERVAL_BYTES = interval
    if os.environ.get("BULK_SPLIT_BEFORE_PUBLISH"):  # partition 0 splits after routing
        split_before_publish()
    if os.environ.get("BULK_PUBLISH_THREADS"):
        from engine import commit as commit_module

        commit_module.FRAMED_PUBLISH_THREADS = int(os.environ["BULK_PUBLISH_THREADS"])
    if os.environ.get("BULK_HOLD_PARTITION_0"):
        hold_partition_0()
    database = Database.open(data, retention_interval_s=None)
    try:
        status = "opened"
        if action == "stage-and-commit":
            stage(database)
            status = commit(database)
        elif action == "stage":
            stage(database)
        elif action == "commit":
            status = commit(database)
        else:
            assert action == "open", action
    finally:
        database.close()
    print(f"done {status}", flush=True)


if __name__ == "__main__":
    main()
