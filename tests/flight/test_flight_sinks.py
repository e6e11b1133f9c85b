"""The Flight door's ``commit`` and ``last_batch`` actions on a sink that belongs to
another user (``engine.bulk_publish``): refused with 42501, so no one can pre-record the
batches of someone else's stream or move where it resumes."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_sql_ext.client import TopicbaseFlightError


def test_another_users_sink_cannot_be_committed_to_nor_read(database, client) -> None:
    session = database.connect()
    session.execute("CREATE TOPIC events")
    session.execute("GRANT INSERT ON TOPIC events TO bob")
    session.close()
    batch = pa.record_batch({"data": pa.array([b"m%d" % i for i in range(50)])})
    bob = client("bob")
    assert bob.commit("bobs-sink", 0, [bob.put({"topic": "events"}, [batch], batch.schema)]) == {
        "status": "committed", "rows": 50}
    writer = client("alice")  # a superuser reads any sink, commits to superusers' only
    assert writer.action("last_batch", {"sink_id": "bobs-sink"}) == {"batch_id": 0}
    with pytest.raises(TopicbaseFlightError) as caught:
        writer.commit("bobs-sink", 1, [])
    assert caught.value.sqlstate == "42501"
    assert writer.commit("alices-sink", 9, []) == {"status": "committed", "rows": 0}
    for forged in ({"sink_id": "alices-sink", "batch_id": 10, "write_ids": []},
                   {"sink_id": "alices-sink", "batch_id": 9, "write_ids": []}):  # fmt: skip
        with pytest.raises(TopicbaseFlightError) as caught:
            bob.action("commit", forged)
        assert caught.value.sqlstate == "42501"
    with pytest.raises(TopicbaseFlightError) as caught:
        bob.action("last_batch", {"sink_id": "alices-sink"})
    assert caught.value.sqlstate == "42501"
    assert writer.action("last_batch", {"sink_id": "alices-sink"}) == {"batch_id": 9}
    assert bob.commit("bobs-sink", 0, []) == {"status": "duplicate", "rows": 0}
    assert bob.action("last_batch", {"sink_id": "bobs-sink"}) == {"batch_id": 0}
