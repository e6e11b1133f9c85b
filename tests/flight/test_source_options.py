"""The data source's options resolved against a live Flight door (no Spark needed):
earliest/latest, per-partition JSON with -2/-1, and a start time."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from spark_sql_ext.options import OptionError, parse_options, resolve


def test_positions_resolve_to_offsets(database, client, door) -> None:
    session = database.connect()
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 2)")
    session.execute("INSERT INTO TOPIC t (data, partition) VALUES ('a', 0), ('b', 0), ('c', 1)")
    session.close()
    middle = datetime.now(UTC)
    session = database.connect()
    session.execute("INSERT INTO TOPIC t (data, partition) VALUES ('d', 0), ('e', 1), ('f', 1)")
    session.close()
    options = parse_options({"url": f"topicbase://127.0.0.1:{door.port}", "topic": "t",
                             "startingOffsets": json.dumps({"0": -1, "1": 1}),
                             "endingOffsets": middle.isoformat()})  # fmt: skip
    reader = client()
    bounds = reader.partitions("t")
    assert [(b["partition"], b["start"], b["end"]) for b in bounds] == [(0, 0, 3), (1, 0, 3)]
    assert resolve(reader, options, options.starting, bounds) == {0: 3, 1: 1}
    # the first messages written at or after `middle`: d (offset 2) and e (offset 1)
    assert resolve(reader, options, options.ending, bounds) == {0: 2, 1: 1}
    earliest = parse_options({"url": "topicbase://h:1", "topic": "t"})
    assert resolve(reader, earliest, earliest.starting, bounds) == {0: 0, 1: 0}
    assert parse_options({"url": "topicbase://h:1", "topic": "t"}, streaming=True
                         ).starting.kind == "latest"  # fmt: skip


@pytest.mark.parametrize("raw, message", [
    ({"topic": "t"}, '"url"'),
    ({"url": "topicbase://h:1"}, '"topic" and "table"'),
    ({"url": "topicbase://h:1", "topic": "t", "columns": "data,nope"}, '"nope"'),
    ({"url": "topicbase://h:1", "topic": "t", "startingOffsets": "yesterday"}, "ISO-8601"),
    ({"url": "topicbase://h:1", "table": "x", "mode": "add"}, '"key"'),
    ({"url": "topicbase://h:1", "topic": "t", "maxMessagesPerTrigger": "0"}, "at least 1"),
])  # fmt: skip
def test_bad_options_are_refused_clearly(raw, message) -> None:
    with pytest.raises(OptionError, match=message):
        parse_options(raw)
