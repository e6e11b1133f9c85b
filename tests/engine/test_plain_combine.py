"""Plain rows of many sessions' autocommit ``INSERT INTO TOPIC`` statements combined into
one batch and one append while the topic is busy (``engine.spread_append.append_plain``,
``PlainCombiner``).

Quiet (fewer than ``KEYLESS_JOIN_BUSY_APPENDS`` other statements in), a statement's rows
are appended alone, as before. Busy, its values are queued and one thread appends
everything queued as one plain batch; each statement gets its own rows' count and its
messages are stored as its own statement would store them; a failing combined append
fails exactly the statements whose rows were in it; a combined batch the topic refuses
before writing goes statement by statement. Statements of another shape (a transaction,
RETURNING, an option, another column, a NULL, over the size bounds, a topic not synced)
never come here.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from engine import spread_append
from engine.database import Database
from engine.session import Session
from storage import limits
from storage.codecs import Codec
from storage.config import FsyncPolicy, TopicConfig
from storage.errors import CharacterNotInRepertoireError, UnsupportedCodecError
from storage.group_commit import Request
from storage.topic_log import TopicAppendResult, TopicLog

BUSY = limits.KEYLESS_JOIN_BUSY_APPENDS
INSERT = "INSERT INTO TOPIC t (data) VALUES ($1)"


@pytest.fixture
def topic(database: Database, session: Session) -> TopicLog:
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 4)")
    return database.topic_log(database.catalog.entry("t").topic_id)


def _combiner(topic: TopicLog) -> spread_append.PlainCombiner:
    with spread_append._COMBINERS_LOCK:
        combiner = spread_append._COMBINERS.get(topic)
        if combiner is None:
            combiner = spread_append._COMBINERS[topic] = spread_append.PlainCombiner()
    return combiner


def _messages(topic: TopicLog) -> list[dict[str, Any]]:
    """Every message of the topic, partition by partition in offset order: its stored
    columns and its partition."""
    out = []
    for partition in topic.partition_ids():
        offset = 0
        while True:
            read = topic.read(partition, offset, max_messages=1000)
            if not read.batches:
                break
            for batch in read.batches:
                for message in batch.to_pylist():  # in offset order
                    message["partition"] = partition
                    out.append(message)
            offset = read.next_offset
    return out


def test_a_quiet_topic_appends_alone(database: Database, session: Session,
                                     topic: TopicLog) -> None:  # fmt: skip
    assert session.execute(INSERT, [b"a"])[-1].tag == "INSERT 0 1"
    assert session.execute("INSERT INTO TOPIC t (data) VALUES ($1), ($2)",
                           ["b", b"c"])[-1].tag == "INSERT 0 2"  # fmt: skip
    assert _combiner(topic).rounds == 0
    assert sorted(m["data"] for m in _messages(topic)) == [b"a", b"b", b"c"]


def test_busy_statements_are_combined_and_each_gets_its_own_rows(
    database: Database, topic: TopicLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first round is held until nine more statements queued: the second round
    carries all nine as one append (one partition, consecutive offsets)."""
    combiner = _combiner(topic)
    combiner._inside = BUSY  # as if BUSY other statements were in
    entered, release = threading.Event(), threading.Event()
    append = TopicLog.append
    calls: list[int] = []

    def held(self: TopicLog, batch: Any, *args: Any, **kwargs: Any) -> TopicAppendResult:
        calls.append(batch.num_rows)
        if len(calls) == 1:
            entered.set()
            assert release.wait(10)
        return append(self, batch, *args, **kwargs)

    monkeypatch.setattr(TopicLog, "append", held)
    sessions = [database.connect() for _ in range(10)]
    tags: dict[int, str] = {}

    def run(index: int) -> None:
        values = [b"%d.%d" % (index, j) for j in range(index % 3 + 1)]
        text = "INSERT INTO TOPIC t (data) VALUES " + ", ".join(
            f"(${k + 1})" for k in range(len(values)))  # fmt: skip
        tags[index] = sessions[index].execute(text, values)[-1].tag

    try:
        first = threading.Thread(target=run, args=(0,))
        first.start()
        assert entered.wait(10)
        others = [threading.Thread(target=run, args=(i,)) for i in range(1, 10)]
        for thread in others:
            thread.start()
        for _ in range(10_000):  # until all nine queued (a bounded poll, no timing)
            if combiner._group.waiting == 9:
                break
            threading.Event().wait(0.001)
        assert combiner._group.waiting == 9
        release.set()
        for thread in [first, *others]:
            thread.join(10)
            assert not thread.is_alive()
    finally:
        for s in sessions:
            s.close()
    assert calls == [1, sum(i % 3 + 1 for i in range(1, 10))]  # two appends in all
    assert combiner.rounds == 2
    assert tags == {i: f"INSERT 0 {i % 3 + 1}" for i in range(10)}
    stored = _messages(topic)
    assert sorted(m["data"] for m in stored) == sorted(
        b"%d.%d" % (i, j) for i in range(10) for j in range(i % 3 + 1))  # fmt: skip
    combined = [m for m in stored if not m["data"].startswith(b"0.")]
    assert len({m["partition"] for m in combined}) == 1  # one append, one partition
    for message in stored:  # as the statement's own plain batch would have stored it
        assert message["producer_id"] is None and message["seq_no"] is None
        assert message["message_group_id"] is None and message["metadata"] is None
    assert combiner._inside == BUSY


def test_a_failing_combined_append_fails_its_statements_alone(
    database: Database, topic: TopicLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunked at three messages: the round's first chunk fails, the second is written."""
    monkeypatch.setattr(limits, "COMBINED_MESSAGES_MAX", 3)
    append = TopicLog.append
    seen: list[int] = []

    def failing_first(self: TopicLog, batch: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(batch.num_rows)
        if len(seen) == 1:
            raise OSError("disk gone")
        return append(self, batch, *args, **kwargs)

    monkeypatch.setattr(TopicLog, "append", failing_first)
    requests = [Request((topic, [b"r%d" % i], database.clock)) for i in range(5)]
    _combiner(topic)._round(requests)
    assert seen == [3, 2]
    assert all(isinstance(r.error, OSError) for r in requests[:3])
    assert [(r.error, r.result) for r in requests[3:]] == [(None, 1), (None, 1)]
    assert sorted(m["data"] for m in _messages(topic)) == [b"r3", b"r4"]


def test_a_combined_batch_the_topic_refuses_goes_statement_by_statement(
    database: Database, topic: TopicLog
) -> None:
    """A topic that takes no raw messages refuses the combined batch before anything is
    written: each statement then meets its own append's error."""
    topic.alter(TopicConfig(partition_count=4, fsync_policy=FsyncPolicy.GROUP,
                            supported_codecs=frozenset({Codec.GZIP})))  # fmt: skip
    requests = [Request((topic, [b"q%d" % i], database.clock)) for i in range(3)]
    _combiner(topic)._round(requests)
    assert all(isinstance(r.error, UnsupportedCodecError) for r in requests)
    assert _messages(topic) == []


@pytest.mark.parametrize(
    ("columns", "rows"),
    [
        (("data", "producer_id"), [(b"a", "p")]),  # another column
        (("data",), [(None,)]),  # NULL: the usual way's error
        (("data",), [(12,)]),  # another type
        (("data",), []),
        (("data",), [(b"m",)] * (limits.COMBINE_MESSAGES_MAX + 1)),  # too many rows
        (("data",), [(b"x" * (limits.COMBINE_BYTES_MAX + 1),)]),  # too much data
    ],
    ids=["column", "null", "type", "empty", "many", "large"],
)
def test_other_rows_are_not_for_this_way(database: Database, topic: TopicLog,
                                         columns: tuple, rows: list) -> None:  # fmt: skip
    _combiner(topic)._inside = BUSY
    assert spread_append.append_plain(database, topic_id(database), columns, rows) is None
    assert _combiner(topic).rounds == 0 and _messages(topic) == []


def topic_id(database: Database) -> str:
    return database.catalog.entry("t").topic_id


def test_a_topic_without_syncs_is_not_for_this_way(tmp_path: Any) -> None:
    database = Database.open(str(tmp_path / "never"), fsync_policy=FsyncPolicy.NEVER)
    try:
        session = database.connect()
        session.execute("CREATE TOPIC t")
        assert spread_append.append_plain(database, topic_id(database), ("data",),
                                          [(b"a",)]) is None  # fmt: skip
        assert session.execute(INSERT, [b"a"])[-1].tag == "INSERT 0 1"  # the usual way
        session.close()
    finally:
        database.close()


def test_statements_of_other_shapes_never_reach_it(
    session: Session, topic: TopicLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    reached: list[Any] = []
    original = spread_append.append_plain

    def spy(*args: Any) -> Any:
        reached.append(args[3])
        return original(*args)

    monkeypatch.setattr(spread_append, "append_plain", spy)
    session.execute("INSERT INTO TOPIC t (data) VALUES ('r') RETURNING offset")
    session.execute("INSERT INTO TOPIC t (data) VALUES ('o') WITH (producer_id = 'p')")
    session.execute("BEGIN")
    session.execute(INSERT, [b"in a transaction"])
    session.execute("COMMIT")
    assert reached == []
    session.execute(INSERT, [b"plain"])
    assert reached == [[(b"plain",)]]


def test_text_with_a_lone_surrogate_is_the_statements_own_error(
    session: Session, topic: TopicLog
) -> None:
    _combiner(topic)._inside = BUSY
    with pytest.raises(CharacterNotInRepertoireError):
        session.execute(INSERT, ["\ud800"])
    assert _combiner(topic).rounds == 0 and _messages(topic) == []


def test_many_sessions_at_once_write_every_message_once(database: Database,
                                                        topic: TopicLog) -> None:  # fmt: skip
    """16 sessions, 40 one-message statements each: every message is stored once, and
    each session's messages in one partition are in the order it sent them."""
    sessions = [database.connect() for _ in range(16)]
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            for j in range(40):
                value = b"%02d.%03d" % (index, j) if j % 2 else f"{index:02d}.{j:03d}"
                assert sessions[index].execute(INSERT, [value])[-1].tag == "INSERT 0 1"
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive()
    finally:
        for s in sessions:
            s.close()
    assert errors == []
    stored = _messages(topic)
    assert sorted(m["data"] for m in stored) == sorted(
        b"%02d.%03d" % (i, j) for i in range(16) for j in range(40))  # fmt: skip
    for partition in topic.partition_ids():
        mine = [m["data"] for m in stored if m["partition"] == partition]
        for index in range(16):
            sent = [d for d in mine if d.startswith(b"%02d." % index)]
            assert sent == sorted(sent)
