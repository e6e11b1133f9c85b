"""sys.partitions' end offsets are one cut, taken under the publish lock, as
``engine.bulk_read.partition_bounds`` takes it: a reader planning ranges from the view (the
Spark reader over ``COPY ... (FORMAT arrow)``) never sees part of a transaction's publish."""

from __future__ import annotations

import pytest

from storage.partition_log import PartitionLog
from tests.engine.conftest import rows


def test_sys_partitions_reads_every_end_offset_under_the_publish_lock(
        database, session, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 3)")
    session.execute("INSERT INTO TOPIC t (data, partition) VALUES ('a', 0), ('b', 2), ('c', 2)")
    held: list[bool] = []
    visible = PartitionLog.end_offset

    def watched(partition: PartitionLog) -> int:
        held.append(database.publish_lock.locked())
        return visible.fget(partition)

    monkeypatch.setattr(PartitionLog, "end_offset", property(watched))
    found = rows(session, "SELECT partition, start_offset, end_offset FROM sys.partitions "
                          "WHERE topic = 't' ORDER BY partition")  # fmt: skip
    monkeypatch.undo()
    assert found == [{"partition": 0, "start_offset": 0, "end_offset": 1},
                     {"partition": 1, "start_offset": 0, "end_offset": 0},
                     {"partition": 2, "start_offset": 0, "end_offset": 2}]  # fmt: skip
    assert len(held) >= 3 and all(held)
