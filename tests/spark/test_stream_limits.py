"""The stream reader's offset arithmetic, without a Spark session: read limits spread over
partitions in order, and a split's children wait until their parent is read to its end."""

from __future__ import annotations

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import StructType

from spark_sql_ext.options import parse_options
from spark_sql_ext.streaming import TopicbaseStreamReader


def _reader(bounds: list[dict]) -> TopicbaseStreamReader:
    reader = TopicbaseStreamReader(
        parse_options({"url": "topicbase://127.0.0.1:1", "topic": "t"}, streaming=True),
        StructType([]))
    reader._bounds = lambda: bounds  # type: ignore[method-assign]
    return reader


def test_limits_and_parents_before_children() -> None:
    bounds = [
        {"partition": 0, "start": 0, "end": 100, "active": False, "parent": None},
        {"partition": 1, "start": 0, "end": 50, "active": True, "parent": None},
        {"partition": 2, "start": 0, "end": 30, "active": True, "parent": 0},
        {"partition": 3, "start": 0, "end": 30, "active": True, "parent": 0},
    ]
    reader = _reader(bounds)
    start = {"0": 20, "1": 0}
    assert reader.latestOffset(start, ReadMaxRows(100)) == {"0": 100, "1": 20, "2": 0, "3": 0}
    # The parent is read to its end: its children may go now.
    done = {"0": 100, "1": 50}
    assert reader.latestOffset(done, ReadMaxRows(40)) == {"0": 100, "1": 50, "2": 30, "3": 10}
    # A batch that reaches the parent's end may take the children too: its ranges are
    # published parent first, in one transaction.
    assert reader.latestOffset(start, ReadAllAvailable()) == {
        "0": 100, "1": 50, "2": 30, "3": 30}
    assert reader.latestOffset({"0": 20}, ReadMaxRows(10)) == {
        "0": 30, "1": 0, "2": 0, "3": 0}
    ranges = reader.partitions({"0": 20, "1": 50}, {"0": 100, "1": 50, "2": 30})
    assert [(p.ticket["partition"], p.ticket["start"], p.ticket["end"]) for p in ranges] == [
        (0, 20, 100), (2, 0, 30)]
