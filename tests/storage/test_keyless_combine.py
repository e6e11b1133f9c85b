"""Keyless batches of many sessions combined into one append while the topic is busy
(``TopicLog.append_keyless``).

Below ``KEYLESS_JOIN_BUSY_APPENDS`` appends in progress, or for a batch over
``COMBINE_MESSAGES_MAX`` messages or ``COMBINE_BYTES_MAX`` bytes (all its buffers), a
keyless batch is appended alone (``append``). Busy, it is checked as ``append`` would
check it, queued, and one thread appends everything queued in chunks of at most
``COMBINED_MESSAGES_MAX`` messages and ``COMBINED_BYTES_MAX`` bytes; each batch gets its
own rows' outcome, a failing combined append fails exactly the batches in it, and a
joined batch the topic refuses before writing is appended one batch at a time.
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
import pytest

from storage import limits, topic_log
from storage.codecs import Codec
from storage.config import FsyncPolicy, TopicConfig
from storage.errors import LimitExceededError, UnsupportedCodecError
from storage.group_commit import GroupCommitter, Request, _outcome
from storage.record_batch import build_wire_batch
from storage.topic_log import TopicAppendResult, TopicLog

BUSY = limits.KEYLESS_JOIN_BUSY_APPENDS


def _stored(topic: TopicLog, result: TopicAppendResult) -> list[bytes]:
    """The data stored at each message's reported partition and offset."""
    out = []
    for partition, offset in zip(result.partitions.tolist(), result.offsets.tolist(), strict=True):
        read = topic.read(partition, offset, max_messages=1)
        out.append(read.batches[0].column("data")[0].as_py())
    return out


def test_a_quiet_topic_appends_alone(topic: TopicLog) -> None:
    result = topic.append_keyless(build_wire_batch([b"a", b"b"]))
    assert _stored(topic, result) == [b"a", b"b"]
    assert topic._combiner.rounds == 0


def test_big_batches_append_alone_even_when_busy(topic: TopicLog) -> None:
    topic._appending = BUSY
    many = build_wire_batch([b"m"] * (limits.COMBINE_MESSAGES_MAX + 1))
    large = build_wire_batch([b"x" * (limits.COMBINE_BYTES_MAX + 1)])
    for batch in (many, large):
        result = topic.append_keyless(batch)
        assert (result.status == 0).all()
    assert topic._combiner.rounds == 0
    assert topic._appending == BUSY


def test_concurrent_batches_are_combined_and_each_gets_its_own_rows(
    topic: TopicLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first round is held until nine more batches queued: the second round carries
    all nine as one append (one partition, consecutive offsets), each its own slice."""
    topic._appending = BUSY
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
    results: dict[int, TopicAppendResult] = {}

    def run(index: int) -> None:
        data = [b"%d.%d" % (index, j) for j in range(index % 3 + 1)]
        results[index] = topic.append_keyless(build_wire_batch(data))

    first = threading.Thread(target=run, args=(0,))
    first.start()
    assert entered.wait(10)
    others = [threading.Thread(target=run, args=(i,)) for i in range(1, 10)]
    for thread in others:
        thread.start()
    for _ in range(10_000):  # until all nine queued (a bounded poll, no timing)
        if topic._combiner.waiting == 9:
            break
        threading.Event().wait(0.001)
    assert topic._combiner.waiting == 9
    release.set()
    for thread in [first, *others]:
        thread.join(10)
        assert not thread.is_alive()
    assert calls == [1, sum(i % 3 + 1 for i in range(1, 10))]  # two appends in all
    assert topic._combiner.rounds == 2
    for index, result in results.items():
        assert _stored(topic, result) == [b"%d.%d" % (index, j) for j in range(index % 3 + 1)]
        assert (result.status == 0).all()
    combined = [results[i] for i in range(1, 10)]
    assert len({int(r.partitions[0]) for r in combined}) == 1  # one append, one partition
    offsets = sorted(o for r in combined for o in r.offsets.tolist())
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    assert topic._appending == BUSY


def test_a_failing_combined_append_fails_the_batches_in_it_alone(
    topic: TopicLog, monkeypatch: pytest.MonkeyPatch
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
    requests = [Request(build_wire_batch([b"r%d" % i])) for i in range(5)]
    topic._append_combined(requests)
    assert seen == [3, 2]
    assert all(isinstance(r.error, OSError) for r in requests[:3])
    assert all(r.error is None for r in requests[3:])
    assert [_stored(topic, r.result) for r in requests[3:]] == [[b"r3"], [b"r4"]]


def test_a_batch_the_topic_refuses_is_refused_before_it_is_queued(topic: TopicLog) -> None:
    topic.alter(TopicConfig(partition_count=4, fsync_policy=FsyncPolicy.GROUP,
                            supported_codecs=frozenset({Codec.RAW})))  # fmt: skip
    topic._appending = BUSY
    with pytest.raises(UnsupportedCodecError):
        topic.append_keyless(build_wire_batch([b"z"], codec=Codec.GZIP))
    assert topic._combiner.rounds == 0
    assert topic._appending == BUSY


def test_the_check_before_queueing_is_the_batchs_not_a_partitions_state(
    topic: TopicLog,
) -> None:
    """A fenced first partition does not refuse a combined batch: routing decides where it
    goes, as for ``append``."""
    from storage.errors import StorageIOError

    first = topic.active_partition_ids()[0]
    topic.partition(first)._fenced = StorageIOError("gone")
    topic._round_robin = 1  # keyless routing goes on from the next partition
    topic._appending = BUSY
    result = topic.append_keyless(build_wire_batch([b"ok"]))
    assert int(result.partitions[0]) != first
    assert _stored(topic, result) == [b"ok"]


def test_a_batch_heavy_in_metadata_appends_alone_even_when_busy(topic: TopicLog) -> None:
    """The combine gate counts every buffer (as ``check_wire_batch`` does), not only the
    data: one byte of data with large metadata is not combined."""
    topic._appending = BUSY
    heavy = build_wire_batch([b"x"], metadata=[{"k": b"m" * limits.COMBINE_BYTES_MAX}])
    result = topic.append_keyless(heavy)
    assert _stored(topic, result) == [b"x"]
    assert topic._combiner.rounds == 0


def test_a_round_is_chunked_by_bytes_so_no_chunk_passes_the_batch_limit(
    topic: TopicLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2's repro: enough one-message batches, each just under the combine gate, that
    together they pass ``BATCH_BYTES_MAX``; chunked at ``COMBINED_BYTES_MAX`` each is
    written (before: one combined batch, every statement refused with 54000)."""
    append = TopicLog.append
    seen: list[int] = []

    def counting(self: TopicLog, batch: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(batch.get_total_buffer_size())
        return append(self, batch, *args, **kwargs)

    monkeypatch.setattr(TopicLog, "append", counting)
    message = b"x" * (limits.COMBINE_BYTES_MAX - 1024)
    count = limits.BATCH_BYTES_MAX // limits.COMBINE_BYTES_MAX + 4
    requests = [Request(build_wire_batch([message])) for _ in range(count)]
    assert all(r.payload.get_total_buffer_size() <= limits.COMBINE_BYTES_MAX for r in requests)
    assert sum(r.payload.get_total_buffer_size() for r in requests) > limits.BATCH_BYTES_MAX
    topic._append_combined(requests)
    assert [r.error for r in requests] == [None] * count
    assert all((r.result.status == 0).all() for r in requests)
    assert len(seen) > 1 and max(seen) <= limits.COMBINED_BYTES_MAX
    assert [_stored(topic, r.result) for r in requests[:: count - 1]] == [[message]] * 2


def test_a_joined_batch_the_topic_refuses_is_appended_one_request_at_a_time(
    topic: TopicLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R2's second repro, with the chunk bound lifted (the safety net): two batches of
    one data byte and metadata over half the batch limit each are written alone (before:
    both refused, for a batch neither sent); one refused alone fails only itself."""
    monkeypatch.setattr(limits, "BATCH_BYTES_MAX", 1024 * 1024)
    monkeypatch.setattr(limits, "COMBINED_BYTES_MAX", 64 * 1024 * 1024)
    append = TopicLog.append
    seen: list[int] = []

    def counting(self: TopicLog, batch: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(batch.num_rows)
        return append(self, batch, *args, **kwargs)

    monkeypatch.setattr(TopicLog, "append", counting)
    half = {"k": b"m" * (limits.BATCH_BYTES_MAX // 2 + 1024)}
    whole = {"k": b"m" * limits.BATCH_BYTES_MAX}
    requests = [
        Request(build_wire_batch([b"a"], metadata=[half])),
        Request(build_wire_batch([b"b"], metadata=[whole])),  # over the limit alone too
        Request(build_wire_batch([b"c"], metadata=[half])),
    ]
    topic._append_combined(requests)
    assert seen == [1, 1, 1]  # the joined batch never reached ``append``
    assert isinstance(requests[1].error, LimitExceededError)
    assert requests[0].error is None and requests[2].error is None
    assert [_stored(topic, requests[i].result) for i in (0, 2)] == [[b"a"], [b"c"]]


def test_a_later_chunk_failing_to_join_leaves_the_written_chunks_their_results(
    topic: TopicLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any error joining a chunk (here Arrow out of memory) fails that chunk's statements
    only: the chunks written and synced before it keep their results (a session told its
    stored rows failed would send them again)."""
    monkeypatch.setattr(limits, "COMBINED_MESSAGES_MAX", 2)  # two chunks of two requests
    real, joins = pa.concat_batches, []

    def failing_second_join(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
        joins.append(len(batches))
        if len(joins) == 2:
            raise pa.ArrowMemoryError("malloc of size 1234 failed")
        return real(batches)

    monkeypatch.setattr(topic_log.pa, "concat_batches", failing_second_join)
    requests = [Request(build_wire_batch([f"m{i}".encode()])) for i in range(4)]
    committer = GroupCommitter(topic._append_combined)
    committer._queue = list(requests)
    committer._leader_active = True
    committer._lead()
    assert [_outcome(r).offsets.tolist() for r in requests[:2]] == [[0], [1]]
    for request in requests[2:]:
        with pytest.raises(pa.ArrowMemoryError):
            _outcome(request)
    stored = topic.read(0, 0, max_messages=10)
    assert [m for b in stored.batches for m in b.column("data").to_pylist()] == [b"m0", b"m1"]
