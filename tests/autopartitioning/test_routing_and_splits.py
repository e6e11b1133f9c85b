"""Key ranges, hash routing and the split rule, with the injected clock: splits happen
exactly when the rule says, never earlier, never past the limit; paused stops them;
seq_no dedup follows a producer into its child; a transactional publish aimed at a
split partition lands once, in the child that holds its key."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest

from storage.autopartition import HASH_SPACE, KeyRange, even_ranges, key_hash
from storage.clock import ManualClock
from storage.partition_log import DUPLICATE, WRITTEN
from storage.record_batch import build_wire_batch
from tests.autopartitioning.conftest import OpenTopic

SECOND_US = 1_000_000


def test_the_hash_is_blake2b_of_the_utf8_key_first_8_bytes_big_endian() -> None:
    for key in ("producer-1", "ключ", ""):
        digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
        assert key_hash(key) == int.from_bytes(digest, "big")
    assert key_hash("producer-1") == key_hash("producer-1")


def test_even_ranges_cover_the_space_without_overlap() -> None:
    ranges = even_ranges(3)
    assert ranges[0].low == 0 and ranges[-1].high == HASH_SPACE
    assert all(a.high == b.low for a, b in itertools.pairwise(ranges))
    lower, upper = KeyRange(0, HASH_SPACE).halves()
    assert lower.high == upper.low == HASH_SPACE // 2


def test_a_key_goes_to_the_partition_whose_range_holds_its_hash(open_topic: OpenTopic) -> None:
    topic = open_topic(4, strategy="paused")
    for number in range(40):
        key = f"p{number}"
        partition = topic.partition_for_key(key)
        key_range = topic.partition_info(partition).key_range
        assert key_range is not None and key_range.contains(key_hash(key))
    result = topic.append(build_wire_batch([b"a", b"b"], producer_id=["p7", "p7"], seq_no=[1, 2]))
    assert set(result.partitions.tolist()) == {topic.partition_for_key("p7")}


def test_without_autopartitioning_partitions_have_no_ranges(open_topic: OpenTopic) -> None:
    topic = open_topic(2)
    assert topic.partition_info(0).key_range is None and topic.routing() == []


def _write_second(
    topic, clock: ManualClock, size: int, key: str = "k", seq: list[int] | None = None
):
    """One write of ``size`` bytes now, then the clock moves to the next whole second."""
    kwargs = {"producer_id": key, "seq_no": [seq.pop(0)]} if seq is not None else {}
    topic.append(build_wire_batch([b"x" * size], **kwargs))
    clock.advance(microseconds=SECOND_US - clock.now_us() % SECOND_US)


def test_a_split_happens_after_exactly_the_window_above_the_threshold(
    open_topic: OpenTopic, clock: ManualClock
) -> None:
    # speed 1000 B/s, up 50 %: 500 bytes in each of 3 whole seconds.
    topic = open_topic(1, strategy="scale_up", write_speed=1000, burst=2000,
                       up_percent=50, window_us=3 * SECOND_US)  # fmt: skip
    _write_second(topic, clock, 600)
    _write_second(topic, clock, 600)
    _write_second(topic, clock, 600)  # the third second's write: only 2 whole seconds before
    assert topic.active_partition_ids() == [0]
    _write_second(topic, clock, 600)  # now 3 whole seconds lie behind, each above 500
    assert topic.active_partition_ids() == [1, 2]
    info = topic.partition_info(0)
    assert not info.active and info.children == (1, 2)
    assert topic.partition_info(1).parent == 0
    low, high = topic.partition_info(1).key_range, topic.partition_info(2).key_range
    assert low is not None and high is not None
    assert (low.low, low.high, high.high) == (0, HASH_SPACE // 2, HASH_SPACE)


def test_one_second_below_the_threshold_restarts_the_window(
    open_topic: OpenTopic, clock: ManualClock
) -> None:
    topic = open_topic(1, strategy="scale_up", write_speed=1000, burst=2000,
                       up_percent=50, window_us=2 * SECOND_US)  # fmt: skip
    _write_second(topic, clock, 600)
    _write_second(topic, clock, 400)  # below 500
    _write_second(topic, clock, 600)
    assert topic.active_partition_ids() == [0]
    _write_second(topic, clock, 600)
    assert topic.active_partition_ids() == [0]  # seconds 3 and 4 only now lie behind
    _write_second(topic, clock, 10)
    assert len(topic.active_partition_ids()) == 2


def test_splits_stop_at_max_active_partitions(open_topic: OpenTopic, clock: ManualClock) -> None:
    topic = open_topic(1, strategy="scale_up", write_speed=1000, burst=2000, up_percent=10,
                       window_us=SECOND_US, max_active=3)  # fmt: skip
    keys = [f"key{i}" for i in range(64)]
    for _ in range(12):
        for key in keys[:8]:
            topic.append(build_wire_batch([b"x" * 30], producer_id=key))
        for key in keys[8:]:
            topic.append(build_wire_batch([b"y" * 30], producer_id=key))
        clock.advance(seconds=1)
    assert len(topic.active_partition_ids()) == 3
    assert topic.splits == 2


def test_paused_and_disabled_never_split(open_topic: OpenTopic, clock: ManualClock) -> None:
    topic = open_topic(1, strategy="paused", write_speed=1000, window_us=SECOND_US)
    for _ in range(5):
        _write_second(topic, clock, 990)
    assert topic.active_partition_ids() == [0] and topic.splits == 0


def test_pausing_a_topic_stops_its_splits(open_topic: OpenTopic, clock: ManualClock) -> None:
    topic = open_topic(1, strategy="scale_up", write_speed=1000, burst=2000, up_percent=10,
                       window_us=SECOND_US)  # fmt: skip
    _write_second(topic, clock, 500)
    _write_second(topic, clock, 500)
    assert topic.splits == 1
    auto = topic.autopartitioning
    from dataclasses import replace

    topic.alter(topic.config, replace(auto, strategy="paused"))
    for _ in range(4):
        for key in ("a", "b", "c", "d"):
            topic.append(build_wire_batch([b"x" * 400], producer_id=key))
        clock.advance(seconds=1)
    assert topic.splits == 1


def test_autopartitioning_cannot_be_disabled_in_storage(open_topic: OpenTopic) -> None:
    from dataclasses import replace

    from storage.errors import ObjectNotInPrerequisiteStateError

    topic = open_topic(1, strategy="paused")
    with pytest.raises(ObjectNotInPrerequisiteStateError):
        topic.alter(topic.config, replace(topic.autopartitioning, strategy="disabled"))


def test_dedup_state_follows_the_producer_into_its_child(
    open_topic: OpenTopic, clock: ManualClock
) -> None:
    topic = open_topic(1, strategy="scale_up", write_speed=10_000, window_us=SECOND_US)
    topic.append(build_wire_batch([b"a", b"b", b"c"], producer_id="prod", seq_no=[1, 2, 3]))
    assert topic.split(0) == (1, 2)
    child = topic.partition_for_key("prod")
    assert topic.last_seq_no("prod") == 3
    resend = topic.append(build_wire_batch([b"c", b"d"], producer_id="prod", seq_no=[3, 4]))
    assert resend.status.tolist() == [DUPLICATE, WRITTEN]
    assert resend.partitions.tolist() == [child, child]
    assert topic.partition(child).end_offset == 1 and topic.partition(0).end_offset == 3


def test_a_split_survives_a_reopen_with_ranges_and_dedup(open_topic: OpenTopic) -> None:
    topic = open_topic(1, strategy="scale_up", write_speed=10_000)
    topic.append(build_wire_batch([b"a"], producer_id="prod", seq_no=[5]))
    assert not topic.has_lineage()  # (reads take every partition as readable at once)
    topic.split(0)
    assert topic.has_lineage()
    child = topic.partition_for_key("prod")
    topic.close()
    again = open_topic()
    assert again.has_lineage()
    assert again.active_partition_ids() == [1, 2] and not again.partition_info(0).active
    assert again.partition_for_key("prod") == child
    result = again.append(build_wire_batch([b"a"], producer_id="prod", seq_no=[5]))
    assert result.status.tolist() == [DUPLICATE]


def test_a_write_that_meets_its_partition_split_is_routed_again(open_topic: OpenTopic) -> None:
    topic = open_topic(1, strategy="paused")
    batch = build_wire_batch([b"a", b"b"], producer_id=["left", "right"], seq_no=[1, 1])
    original_route = topic.route
    calls = []

    def route_then_split(batch):
        targets = original_route(batch)
        if not calls:
            calls.append(1)
            topic.split(0)  # the split lands between routing and the append
        return targets

    topic.route = route_then_split  # type: ignore[method-assign]
    result = topic.append(batch)
    assert result.written_count == 2
    assert 0 not in result.partitions.tolist()
    assert topic.partition(0).end_offset == 0
    assert sum(topic.partition(p).end_offset for p in (1, 2)) == 2


def test_a_transactional_publish_to_a_split_partition_lands_once_in_the_child(
    open_topic: OpenTopic,
) -> None:
    topic = open_topic(1, strategy="paused")
    keys = [f"k{i}" for i in range(20)]
    batch = build_wire_batch([k.encode() for k in keys], producer_id=keys, seq_no=[1] * 20)
    topic.split(0)
    topic.partition(0).publish_transactional([batch], 77)  # staged before, published after
    topic.partition(0).publish_transactional([batch], 77)  # a recovery's second attempt
    assert topic.partition(0).end_offset == 0
    total = 0
    for child in (1, 2):
        read = topic.read(child, 0)
        for record in read.batches:
            for key in record.column("producer_id").to_pylist():
                assert topic.partition_for_key(key) == child
                total += 1
    assert total == 20
    assert np.all(topic.publish_transactional(batch, 0, 78).partitions >= 0)


def test_a_meter_started_inside_the_first_second_counts_what_it_saw(
    open_topic: OpenTopic, clock: ManualClock
) -> None:
    clock.advance(seconds=0.5)  # the topic (and its meter) starts half way into a second
    topic = open_topic(1, strategy="scale_up", write_speed=1000, burst=2000,
                       up_percent=50, window_us=SECOND_US)  # fmt: skip
    _write_second(topic, clock, 600)  # 600 seen in the half second: above 500
    assert topic.active_partition_ids() == [0]
    _write_second(topic, clock, 1)
    assert topic.splits == 1


def test_a_meter_started_after_the_window_began_does_not_split(
    open_topic: OpenTopic, clock: ManualClock
) -> None:
    topic = open_topic(1, strategy="scale_up", write_speed=1000, burst=2000,
                       up_percent=50, window_us=2 * SECOND_US)  # fmt: skip
    clock.advance(seconds=1)
    topic.close()
    reopened = open_topic()  # the meter begins again in second 1: second 0 was not seen
    _write_second(reopened, clock, 600)
    _write_second(reopened, clock, 600)
    assert reopened.splits == 0  # the window is seconds 0 and 1: the meter missed second 0
    _write_second(reopened, clock, 1)
    assert reopened.splits == 1  # seconds 1 and 2, both seen and above 500


def test_retention_deletes_an_emptied_parent_and_the_lineage_stays_valid(
    open_topic: OpenTopic, clock: ManualClock, tmp_path
) -> None:
    from storage.cleaner import NoGuard, apply_retention
    from storage.config import TopicConfig

    topic = open_topic(1, strategy="paused")
    topic.alter(TopicConfig(partition_count=1, retention_ms=1000, segment_ms=1000))
    topic.append(build_wire_batch([b"old"], producer_id="k", seq_no=[1]))
    topic.split(0)
    topic.append(build_wire_batch([b"new"], producer_id="k", seq_no=[2]))
    clock.advance(seconds=2)
    topic.append(build_wire_batch([b"newer"], producer_id="k", seq_no=[3]))
    report = apply_retention(topic, NoGuard(), clock.now_us())
    assert report.partitions_removed == 1
    assert topic.partition_ids() == [1, 2]
    topic.close()
    again = open_topic()
    assert again.partition_ids() == [1, 2] and again.partition_info(1).parent == 0
    assert again.last_seq_no("k") == 3


def test_adding_partitions_to_an_autopartitioning_topic_splits_the_widest_ranges(
    open_topic: OpenTopic,
) -> None:
    from dataclasses import replace

    topic = open_topic(2, strategy="paused")
    topic.alter(replace(topic.config, partition_count=topic.config.partition_count + 3))
    assert len(topic.active_partition_ids()) == 5
    widths = sorted(r.high - r.low for _, r in topic.routing())
    assert widths == [HASH_SPACE // 8] * 2 + [HASH_SPACE // 4] * 3


def test_syncing_a_split_partition_syncs_where_its_redirected_publishes_went(
    open_topic: OpenTopic,
) -> None:
    topic = open_topic(1, strategy="paused")
    topic.split(0)
    synced: list[int] = []
    for child in (1, 2):
        log = topic.partition(child)
        original = log.sync
        log.sync = lambda original=original, child=child: (synced.append(child), original())[1]  # type: ignore[method-assign]
    keys = [f"k{i}" for i in range(20)]
    batch = build_wire_batch([k.encode() for k in keys], producer_id=keys, seq_no=[1] * 20)
    topic.partition(0).publish_transactional([batch], 91)  # routed to 0 before the split
    topic.partition(0).sync()  # what a commit checkpoint does before deleting the record
    assert sorted(synced) == [1, 2]  # fails without the redirect sync: a power cut loses it
    synced.clear()
    topic.partition(0).sync()
    assert synced == []  # nothing redirected since


def test_a_checkpoint_between_recording_and_writing_a_redirect_leaves_it_for_the_next_sync(
    open_topic: OpenTopic,
) -> None:
    """T1's checkpoint syncs the split partition's children while T2 is inside its
    redirected publish, before T2's frame is in child 1: T2's own checkpoint must still
    sync child 1 after that frame (fails if the target is recorded before the write)."""
    topic = open_topic(1, strategy="paused")
    topic.split(0)
    synced: list[tuple[int, int]] = []  # (child, its end offset when synced)
    for child in (1, 2):
        log = topic.partition(child)
        original = log.sync
        log.sync = lambda original=original, child=child, log=log: (  # type: ignore[method-assign]
            synced.append((child, log.end_offset)),
            original(),
        )[1]
    keys = [f"k{i}" for i in range(20)]
    batch = build_wire_batch([k.encode() for k in keys], message_group_id=keys)
    topic.partition(0).publish_transactional([batch], 91)  # T1, redirected to 1 and 2
    child = topic.partition(1)
    real_publish = child.publish_transactional

    def publish_with_a_checkpoint_first(batches, transaction_id, bodies=None):  # type: ignore[no-untyped-def]
        if transaction_id == 92:
            topic.partition(0).sync()  # T1's checkpoint runs now
        return real_publish(batches, transaction_id, bodies)

    child.publish_transactional = publish_with_a_checkpoint_first  # type: ignore[method-assign]
    topic.partition(0).publish_transactional([batch], 92)  # T2
    end_after_t2 = topic.partition(1).end_offset
    synced.clear()
    topic.partition(0).sync()  # T2's checkpoint, before it deletes T2's commit record
    assert (1, end_after_t2) in synced


def test_a_redirected_publish_cut_short_then_retried_lands_once(open_topic: OpenTopic) -> None:
    from storage import failpoints
    from storage.errors import StorageIOError

    topic = open_topic(1, strategy="paused")
    topic.split(0)
    keys = [f"k{i}" for i in range(20)]
    # message groups, no producer ids: no seq_no dedup, only the transaction check
    batch = build_wire_batch([k.encode() for k in keys], message_group_id=keys)
    failpoints.activate("split.mid_redirect=error@1")
    try:
        with pytest.raises(StorageIOError):
            topic.partition(0).publish_transactional([batch], 55)
    finally:
        failpoints.deactivate()
    first = [topic.partition(c).end_offset for c in (1, 2)]
    assert sorted(first)[0] == 0 and sum(first) > 0  # one child has its share, one not
    topic.partition(0).publish_transactional([batch], 55)  # recovery publishes again
    assert sum(topic.partition(c).end_offset for c in (1, 2)) == 20
