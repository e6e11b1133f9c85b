"""Tests of storage/producer_state.py: dedup decisions, expiry, snapshots, replay."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import file_names, producer_state
from storage.clock import ManualClock
from storage.errors import InvalidParameterValueError
from storage.producer_state import ProducerStateManager
from storage.record_batch import (
    HEADER_BYTES,
    build_wire_batch,
    decode_body,
    decode_header,
    encode_frame,
    serialize_body,
)
from tests.storage.producer_helpers import EXPIRY_US, id_batch, new_manager

_manager = new_manager
_batch = id_batch


def _write(
    manager: ProducerStateManager, batch: pa.RecordBatch, base_offset: int, now_us: int
) -> np.ndarray:
    """Decide and record like the partition writer; returns the duplicate mask."""
    decision = manager.decide(batch)
    written = decision.batch.filter(pa.array(~decision.duplicate))
    if written.num_rows:
        manager.record(written, base_offset, now_us)
    return decision.duplicate


def test_first_batch_of_a_producer_has_no_duplicates(tmp_path: Any, clock: ManualClock) -> None:
    manager = _manager(tmp_path, clock)
    decision = manager.decide(_batch(["p"] * 3, [1, 2, 3]))
    assert decision.duplicate.tolist() == [False] * 3
    assert decision.earlier_offsets.tolist() == [-1] * 3
    assert decision.written_count == 3


def test_resend_is_duplicate_with_earlier_offsets(tmp_path: Any, clock: ManualClock) -> None:
    manager = _manager(tmp_path, clock)
    _write(manager, _batch(["p"] * 3, [1, 2, 3]), 10, clock.now_us())
    decision = manager.decide(_batch(["p"] * 4, [1, 2, 3, 4]))
    assert decision.duplicate.tolist() == [True, True, True, False]
    assert decision.earlier_offsets.tolist() == [10, 11, 12, -1]
    assert manager.last_seq_no("p") == 3


def test_producers_are_judged_separately(tmp_path: Any, clock: ManualClock) -> None:
    manager = _manager(tmp_path, clock)
    _write(manager, _batch(["a"], [5]), 0, clock.now_us())
    decision = manager.decide(_batch(["a", "b", None], [5, 5, 5]))
    assert decision.duplicate.tolist() == [True, False, False]


def test_duplicates_within_a_batch_count_earlier_rows(tmp_path: Any, clock: ManualClock) -> None:
    manager = _manager(tmp_path, clock)
    decision = manager.decide(_batch(["p"] * 5, [3, 1, 4, 4, 5]))
    assert decision.duplicate.tolist() == [False, True, False, True, False]


def test_missing_seq_nos_are_numbered_after_the_largest(tmp_path: Any, clock: ManualClock) -> None:
    manager = _manager(tmp_path, clock)
    _write(manager, _batch(["p"], [7]), 0, clock.now_us())
    decision = manager.decide(_batch(["p", "p", "q", None], [None, None, None, None]))
    assert decision.batch.column("seq_no").to_pylist() == [8, 9, 0, None]
    assert not decision.duplicate.any()


def test_negative_seq_no_is_refused(tmp_path: Any, clock: ManualClock) -> None:
    with pytest.raises(InvalidParameterValueError, match="negative"):
        _manager(tmp_path, clock).decide(_batch(["p"], [-5]))


def test_batch_without_producers_is_never_duplicate(tmp_path: Any, clock: ManualClock) -> None:
    manager = _manager(tmp_path, clock)
    decision = manager.decide(_batch([None, None], [1, 1]))
    assert decision.duplicate.tolist() == [False, False]
    assert decision.batch.column("seq_no").to_pylist() == [1, 1]


def test_producer_expires_after_the_expiry(tmp_path: Any, clock: ManualClock) -> None:
    manager = _manager(tmp_path, clock)
    _write(manager, _batch(["p"], [1]), 0, clock.now_us())
    clock.advance(microseconds=EXPIRY_US - 1)
    assert manager.last_seq_no("p") == 1 and "p" in manager.live_keys()
    clock.advance(microseconds=1)
    assert manager.last_seq_no("p") is None and manager.live_keys() == {}
    assert manager.decide(_batch(["p"], [1])).duplicate.tolist() == [False]
    assert manager.expire() == 1 and manager.expire() == 0


def test_snapshot_round_trip(tmp_path: Any, clock: ManualClock) -> None:
    manager = _manager(tmp_path, clock)
    _write(manager, _batch(["a", "b"], [3, 9]), 0, clock.now_us())
    manager.write_snapshot(2, durable=False)
    assert os.listdir(tmp_path) == [file_names.snapshot_file(2)]
    loaded = _manager(tmp_path, clock)
    assert loaded.load_snapshot(log_end_offset=2) == 2
    assert (loaded.last_seq_no("a"), loaded.last_seq_no("b")) == (3, 9)
    assert loaded.decide(_batch(["b"], [9])).earlier_offsets.tolist() == [1]


def test_snapshot_leaves_out_expired_producers(tmp_path: Any, clock: ManualClock) -> None:
    manager = _manager(tmp_path, clock)
    _write(manager, _batch(["old"], [1]), 0, clock.now_us())
    clock.advance(microseconds=EXPIRY_US)
    _write(manager, _batch(["new"], [1]), 1, clock.now_us())
    manager.write_snapshot(2, durable=False)
    payload = json.loads((tmp_path / file_names.snapshot_file(2)).read_bytes())
    assert list(payload["producers"]) == ["new"]


def test_only_the_two_newest_snapshots_are_kept(tmp_path: Any, clock: ManualClock) -> None:
    manager = _manager(tmp_path, clock)
    for offset in (5, 10, 15, 20):
        manager.write_snapshot(offset, durable=False)
    assert manager.snapshot_offsets() == [15, 20]


def test_snapshot_past_the_log_end_is_deleted(tmp_path: Any, clock: ManualClock) -> None:
    manager = _manager(tmp_path, clock)
    _write(manager, _batch(["p"], [1]), 0, clock.now_us())
    manager.write_snapshot(1, durable=False)
    _write(manager, _batch(["p"], [2]), 1, clock.now_us())
    manager.write_snapshot(2, durable=False)
    loaded = _manager(tmp_path, clock)
    assert loaded.load_snapshot(log_end_offset=1) == 1
    assert loaded.last_seq_no("p") == 1
    assert loaded.snapshot_offsets() == [1]


def test_unreadable_snapshot_falls_back_to_an_older_one(tmp_path: Any, clock: ManualClock) -> None:
    manager = _manager(tmp_path, clock)
    _write(manager, _batch(["p"], [1]), 0, clock.now_us())
    manager.write_snapshot(1, durable=False)
    (tmp_path / file_names.snapshot_file(2)).write_bytes(b"{not json")
    loaded = _manager(tmp_path, clock)
    assert loaded.load_snapshot(log_end_offset=5) == 1
    assert loaded.last_seq_no("p") == 1
    assert loaded.snapshot_offsets() == [1]


def test_no_snapshot_means_replay_from_zero(tmp_path: Any, clock: ManualClock) -> None:
    assert _manager(tmp_path, clock).load_snapshot(log_end_offset=100) == 0


def test_replay_of_read_batches_restores_the_largest_seq_nos(
    tmp_path: Any, clock: ManualClock
) -> None:
    batch = build_wire_batch(
        [b"x"] * 4,
        seq_no=[4, 2, 9, 1],
        producer_id=["a", "a", None, None],
        message_group_id=[None, None, "g", None],
    )
    body = serialize_body(batch)
    frame = encode_frame(body, base_offset=20, written_at_us=clock.now_us(), record_count=4)
    header = decode_header(frame)
    assert header is not None
    manager = _manager(tmp_path, clock)
    manager.apply_read_batch(decode_body(header, pa.py_buffer(frame[HEADER_BYTES:])))
    assert manager.last_seq_no("a") == 4
    assert manager.entry("a") is not None and manager.entry("a").last_offset == 21  # type: ignore[union-attr]
    assert manager.last_seq_no("g") == 9, "message groups are routing keys too"
    assert set(manager.live_keys()) == {"a", "g"}


def test_truncate_after_forgets_producers_past_the_cut(tmp_path: Any, clock: ManualClock) -> None:
    manager = _manager(tmp_path, clock)
    _write(manager, _batch(["a"], [1]), 0, clock.now_us())
    _write(manager, _batch(["b"], [1]), 5, clock.now_us())
    manager.truncate_after(5)
    assert set(manager.live_keys()) == {"a"}
    manager.clear()
    assert manager.live_keys() == {}


# -- the small-batch path agrees with the vectorised one ------------------------------------------

_KEYS = st.sampled_from(["a", "b", "c", None])
_SEQ_NOS = st.one_of(st.none(), st.integers(min_value=0, max_value=12))
_BATCHES = st.lists(
    st.lists(st.tuples(_KEYS, _SEQ_NOS, st.sampled_from(["g", None])), min_size=1, max_size=8),
    min_size=1,
    max_size=8,
)


def _writer_step(
    manager: ProducerStateManager, batch: pa.RecordBatch, base_offset: int, now_us: int
) -> tuple[list[bool], list[int], list[int | None]]:
    """Decide and record as ``PartitionLog._write_decision`` does; the decision's outcome."""
    decision = manager.decide(batch)
    if decision.duplicate_count == 0:
        manager.record_decision(decision, base_offset, now_us)
    elif decision.written_count:
        manager.record(decision.batch.filter(pa.array(~decision.duplicate)), base_offset, now_us)
    return (
        decision.duplicate.tolist(),
        decision.earlier_offsets.tolist(),
        decision.batch.column("seq_no").to_pylist(),
    )


@settings(max_examples=150, deadline=None)
@given(batches=_BATCHES)
def test_small_batch_path_matches_the_vectorised_path(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[tuple[Any, Any, Any]]]
) -> None:
    """Same decisions and producer entries whether a batch takes the plain-Python path
    (``SMALL_BATCH_ROWS``) or the numpy one."""
    clock = ManualClock()
    directory = tmp_path_factory.mktemp("producers")
    small, vectorised = _manager(directory, clock), _manager(directory, clock)
    offset = 0
    for rows in batches:
        batch = build_wire_batch(
            [b"x"] * len(rows),
            seq_no=[seq_no for _, seq_no, _ in rows],
            producer_id=[key for key, _, _ in rows],
            message_group_id=[group for _, _, group in rows],
        )
        expected = _writer_step(small, batch, offset, clock.now_us())
        saved = producer_state.SMALL_BATCH_ROWS
        producer_state.SMALL_BATCH_ROWS = 0  # every batch takes the vectorised path
        try:
            assert _writer_step(vectorised, batch, offset, clock.now_us()) == expected
        finally:
            producer_state.SMALL_BATCH_ROWS = saved
        offset += expected[0].count(False)
        clock.advance(microseconds=1)
        for key in ("a", "b", "c", "g"):
            one, other = small.entry(key), vectorised.entry(key)
            assert (one is None) == (other is None), key
            if one is not None and other is not None:
                assert (one.last_seq_no, one.last_offset) == (other.last_seq_no, other.last_offset)
    for key in ("a", "b", "c"):  # a resend of every seq_no finds the same earlier offsets
        resend = build_wire_batch([b"x"] * 13, seq_no=list(range(13)), producer_id=key)
        assert (
            small.decide(resend).earlier_offsets.tolist()
            == vectorised.decide(resend).earlier_offsets.tolist()
        )


# -- the one-producer fast path of large batches --------------------------------------------------


def test_large_batch_of_one_producer_then_its_resend(tmp_path: Any, clock: ManualClock) -> None:
    """A large batch of one producer with rising seq_nos skips grouping; a resend of it
    (and of part of it) still finds every earlier offset."""
    manager = _manager(tmp_path, clock)
    rows = producer_state.SMALL_BATCH_ROWS + 36
    first = manager.decide(_batch(["p"] * rows, list(range(100, 100 + rows))))
    assert first.one_producer is not None and first.written_count == rows
    manager.record_decision(first, 1000, clock.now_us())
    assert manager.last_seq_no("p") == 100 + rows - 1
    resend = manager.decide(_batch(["p"] * rows, list(range(100, 100 + rows))))
    assert resend.one_producer is None and resend.duplicate.all()
    assert resend.earlier_offsets.tolist() == list(range(1000, 1000 + rows))
    tail = list(range(100 + rows - 3, 100 + rows + rows - 3))
    overlap = manager.decide(_batch(["p"] * rows, tail))
    assert overlap.duplicate.tolist() == [True] * 3 + [False] * (rows - 3)
    assert overlap.earlier_offsets[:3].tolist() == [1000 + rows - i for i in (3, 2, 1)]


@pytest.mark.parametrize(
    "values",
    [
        ["p", "pp", ""],  # same total length as "p" * 3, rows split otherwise
        ["ab", "ba", "ab"],
        ["p", None, "p"],
        ["", "", "x"],
    ],
)
def test_single_value_needs_every_row_equal(values: list[str | None]) -> None:
    assert producer_state._single_value(pa.array(values, pa.string())) is None


def test_single_value_of_equal_rows_and_of_a_slice() -> None:
    assert producer_state._single_value(pa.array(["prod"] * 5)) == "prod"
    assert producer_state._single_value(pa.array(["", ""])) == ""
    sliced = pa.array(["x", "ab", "ab", "ab", "y"]).slice(1, 3)
    assert producer_state._single_value(sliced) == "ab"
    assert producer_state._single_value(pa.array(["x", "ab", "ab"]).slice(0, 2)) is None
