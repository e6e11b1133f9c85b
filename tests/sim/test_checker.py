"""Tests of the history checker: each hand-made history holds exactly one anomaly.

Plus clean seeded serial histories (nothing reported, even with every anomaly class
flagged; with summarised reads and incremental observations checked like full ones),
a long cycle (no recursion limit), a ~50k event history, the recording helpers (one
line per event, torn lines dropped, the incremental tail reader) and the digests.
The anomalies are also shown through summarised reads and incremental observations.
"""

from __future__ import annotations

import gc
import json
import os
import random

import pytest

from tests.sim import history as h
from tests.sim.checker import DEFAULT_ALLOWED, KINDS, check, check_file


# -- event builders -------------------------------------------------------------------------
def invoke(topic: str, producer: str | None, seq: int, value=None) -> dict:
    return {
        "type": "invoke",
        "process": "prod",
        "topic": topic,
        "producer": producer,
        "seq_no": seq,
        "value": value or h.producer_value(producer, seq),
    }


def ack(
    topic: str, producer: str | None, seq: int, partition: int, offset: int, value=None
) -> dict:
    return {
        "type": "ack",
        "process": "prod",
        "topic": topic,
        "producer": producer,
        "seq_no": seq,
        "partition": partition,
        "offset": offset,
        "value": value or h.producer_value(producer, seq),
    }


def write(topic: str, producer: str | None, seq: int, partition: int, offset: int) -> list:
    return [invoke(topic, producer, seq), ack(topic, producer, seq, partition, offset)]


def txn(txn_id, status: str, *ops) -> dict:
    return {
        "type": "txn",
        "process": "worker",
        "id": txn_id,
        "status": status,
        "ops": [list(op) for op in ops],
    }


def app(key: str, value) -> list:
    return h.append_op(key, value)


def rd(key: str, values, start=None, complete=True) -> list:
    return h.read_op(key, values, start, complete)


def final(key: str, values, offsets=None, start=None) -> dict:
    event = {"type": "final", "process": "observer", "key": key, "values": list(values)}
    if offsets is not None:
        event["offsets"] = list(offsets)
    if start is not None:
        event["start"] = start
    return event


def observation(key: str, values: list, base: int | None, start: int = 0) -> dict:
    """A ``final`` event as the chaos observer writes it: incremental after ``base``
    values when ``base`` is given, with count and digest; topic keys with offsets
    (``start`` + position)."""
    offsets = list(range(start, start + len(values))) if key.startswith("t:") else None
    fields = {
        "type": "final",
        "process": "observer",
        "key": key,
        "values": list(values[base or 0 :]),
        "count": len(values),
        "digest": h.list_digest(values),
    }
    if offsets is not None:
        fields["offsets"] = offsets[base or 0 :]
    if base is not None:
        fields["base"] = base
        fields["base_digest"] = h.list_digest(values[:base])
    return fields


def committed(topic: str, consumer: str, partition: int, offset: int) -> dict:
    return {
        "type": "offsets",
        "process": "observer",
        "topic": topic,
        "consumer": consumer,
        "partition": partition,
        "committed": offset,
    }


def read_event(topic: str, consumer: str, partition: int, offsets, values) -> dict:
    return {
        "type": "read",
        "process": "reader",
        "topic": topic,
        "consumer": consumer,
        "partition": partition,
        "offsets": list(offsets),
        "values": list(values),
    }


def only(report, kind: str):
    """The report's violations are all of ``kind`` (at least one); the first is returned."""
    assert {v.kind for v in report.violations} == {kind}, report.summary()
    return report.violations[0]


# -- a clean serial history -----------------------------------------------------------------
ROWS = [h.row_key(f"k{i}") for i in range(5)]
PARTS = [h.topic_key("A", p) for p in range(3)]


def serial_history(
    seed: int, steps: int, rotate: int = 0, summaries: bool = False, observe_every: int = 0
) -> list[dict]:
    """Producer writes, consumer reads and transactions, one at a time (no anomalies).

    ``rotate`` > 0 moves the txns to fresh row keys every ``rotate`` steps and keeps
    topic reads near the end of the partitions, so that a long history stays cheap.
    ``summaries``: table-row reads are recorded as summaries (count, digest, tail).
    ``observe_every`` > 0: every that many steps all keys are observed, incrementally
    (as the chaos runner does), and the last observation is incremental too.
    """
    rng = random.Random(seed)
    observed: dict[str, int] = {}
    state: dict[str, list] = {k: [] for k in ROWS + PARTS}
    rows = ROWS
    events: list[dict] = []
    seqs = {f"p{i}": 0 for i in range(3)}
    consumed = {p: 0 for p in range(3)}
    counter = 0
    for step in range(steps):
        if rotate and step % rotate == 0:
            rows = [h.row_key(f"k{step}-{i}") for i in range(5)]
            for key in rows:
                state[key] = []
        roll = rng.random()
        if roll < 0.2:  # a producer write; producer pN is bound to partition N
            producer = rng.choice(sorted(seqs))
            seqs[producer] += rng.randint(1, 2)  # gaps are allowed
            part = int(producer[1:])
            key = PARTS[part]
            events += write("A", producer, seqs[producer], part, len(state[key]))
            state[key].append(h.producer_value(producer, seqs[producer]))
        elif roll < 0.3:  # an autocommit consumer read
            part = rng.randrange(3)
            key = PARTS[part]
            start = consumed[part]
            values = state[key][start : start + rng.randint(1, 4)]
            events.append(read_event("A", "c", part, range(start, start + len(values)), values))
            consumed[part] += len(values)
            events.append(committed("A", "c", part, consumed[part]))
        else:
            status = rng.choices(["ok", "fail", "info"], [8, 1, 1])[0]
            lands = status == "ok" or (status == "info" and rng.random() < 0.5)
            own: dict[str, list] = {}
            ops = []
            for _ in range(rng.randint(1, 5)):
                key = rng.choice(rows + PARTS)
                if rng.random() < 0.5:
                    counter += 1
                    value = f"v{counter}"
                    ops.append(app(key, value))
                    own.setdefault(key, []).append(value)
                elif key in rows:  # a table read sees the txn's own appends
                    seen = state[key] + own.get(key, [])
                    ops.append(h.summary_read_op(key, seen) if summaries else rd(key, seen))
                elif not rotate and rng.random() < 0.5:  # a whole-partition peek
                    ops.append(rd(key, state[key]))
                else:  # a consumer-style slice, maybe cut by a message limit
                    end = len(state[key])
                    start = rng.randint(max(0, end - 10) if rotate else 0, end)
                    limit = rng.randint(1, 4)
                    values = state[key][start : start + limit]
                    ops.append(rd(key, values, start, start + limit >= end))
            events.append(txn(f"T{step}", status, *ops))
            if lands:
                for key, values in own.items():
                    state[key] += values
        if observe_every and step % observe_every == observe_every - 1:
            for key, values in state.items():
                events.append(observation(key, values, observed.get(key)))
                observed[key] = len(values)
    for key, values in state.items():
        if observe_every:
            events.append(observation(key, values, observed.get(key)))
        elif key.startswith("t:"):
            events.append(final(key, values, range(len(values))))
        else:
            events.append(final(key, values))
    for part in range(3):
        events.append(committed("A", "c", part, consumed[part]))
    return events


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_clean_serial_history_reports_nothing(seed):
    report = check(serial_history(seed, 400), allowed=())
    assert report.ok, report.summary()
    assert report.allowed == []
    assert report.stats["nodes"] > 200
    assert report.stats["edges_ww"] and report.stats["edges_wr"] and report.stats["edges_rw"]


@pytest.mark.parametrize("seed", [4, 5])
def test_summaries_and_incremental_observations_check_like_full_ones(seed):
    plain = check(serial_history(seed, 400), allowed=())
    compact = check(serial_history(seed, 400, summaries=True, observe_every=37), allowed=())
    assert plain.ok and compact.ok, compact.summary()
    assert compact.allowed == []
    assert compact.final == plain.final and compact.final_offsets == plain.final_offsets
    assert compact.committed == plain.committed
    for name in ("nodes", "edges_ww", "edges_wr", "edges_rw"):
        assert compact.stats[name] == plain.stats[name], name


# -- one anomaly each -----------------------------------------------------------------------
def test_lost_acknowledged_write():
    events = [*write("A", "p1", 1, 0, 0), *write("A", "p1", 2, 0, 1), final("t:A/0", ["p1:1"], [0])]
    v = only(check(events), "lost-write")
    assert "p1:2" in v.message and v.events[0]["type"] == "ack"


def test_unacknowledged_write_may_be_missing():
    events = [*write("A", "p1", 1, 0, 0), invoke("A", "p1", 2), final("t:A/0", ["p1:1"], [0])]
    assert check(events).ok


def test_duplicate_of_a_dedup_producer():
    events = [
        *write("A", "p1", 1, 0, 0),
        *write("A", "p1", 2, 0, 1),
        final("t:A/0", ["p1:1", "p1:2", "p1:2"], [0, 1, 2]),
    ]
    v = only(check(events), "duplicate")
    assert "p1:2" in v.message


def test_no_dedup_producer_may_duplicate():
    events = [*write("A", None, None, 0, 0)]
    events = [
        invoke("A", None, 0, "x"),
        ack("A", None, 0, 0, 0, "x"),
        final("t:A/0", ["x", "x"], [0, 1]),
    ]
    assert check(events).ok


def test_torn_transaction():
    events = [
        txn("T1", "ok", app("r:x", 1), app("t:B/0", 2)),
        final("r:x", [1]),
        final("t:B/0", [], []),
    ]
    v = only(check(events), "torn-txn")
    assert "'T1'" in v.message and "1 of 2" in v.message


def test_unknown_outcome_is_all_or_nothing():
    none = [txn("T1", "info", app("r:x", 1), app("r:y", 2)), final("r:x", []), final("r:y", [])]
    both = [txn("T1", "info", app("r:x", 1), app("r:y", 2)), final("r:x", [1]), final("r:y", [2])]
    torn = [txn("T1", "info", app("r:x", 1), app("r:y", 2)), final("r:x", []), final("r:y", [2])]
    assert check(none).ok and check(both).ok
    only(check(torn), "torn-txn")


def test_committed_transaction_lost_and_aborted_one_visible():
    lost = [txn("T1", "ok", app("r:x", 1)), final("r:x", [])]
    assert "none of its 1" in only(check(lost), "lost-write").message
    visible = [txn("T1", "fail", app("r:x", 1)), final("r:x", [1])]
    only(check(visible), "aborted-visible")


def test_aborted_read_g1a():
    events = [txn("T1", "fail", app("r:x", 1)), txn("T2", "ok", rd("r:x", [1])), final("r:x", [])]
    v = only(check(events), "G1a")
    assert "'T2'" in v.message and "'T1'" in v.message


def test_aborted_read_by_a_consumer_read_g1a():
    events = [
        txn("T1", "fail", app("t:A/0", "m")),
        read_event("A", "c", 0, [0], ["m"]),
        final("t:A/0", [], []),
    ]
    only(check(events), "G1a")


def test_intermediate_read_g1b():
    events = [
        txn("T1", "ok", app("r:x", 1), app("r:x", 2)),
        txn("T2", "ok", rd("r:x", [1])),
        final("r:x", [1, 2]),
    ]
    v = only(check(events), "G1b")
    assert "inside the appends of txn 'T1'" in v.message


def test_read_cut_by_a_message_limit_is_not_g1b():
    events = [
        txn("T1", "ok", app("t:A/0", 1), app("t:A/0", 2)),
        txn("T2", "ok", rd("t:A/0", [1], 0, False)),
        final("t:A/0", [1, 2], [0, 1]),
    ]
    assert check(events, allowed=()).ok


def test_circular_information_flow_g1c():
    events = [
        txn("T1", "ok", app("r:x", 1), rd("r:y", [2])),
        txn("T2", "ok", app("r:y", 2), rd("r:x", [1])),
        final("r:x", [1]),
        final("r:y", [2]),
    ]
    v = only(check(events), "G1c")
    assert set(v.cycle) == {"T1", "T2"} and "-wr(" in v.message


def test_write_cycle_g0():
    events = [
        txn("T1", "ok", app("r:x", "x1"), app("r:y", "y1")),
        txn("T2", "ok", app("r:x", "x2"), app("r:y", "y2")),
        final("r:x", ["x1", "x2"]),
        final("r:y", ["y2", "y1"]),
    ]
    v = only(check(events), "G0")
    assert set(v.cycle) == {"T1", "T2"} and "'T1' -ww(r:" in v.message


def test_anti_dependency_cycle_g2_item():
    events = [
        txn("T1", "ok", rd("r:x", []), app("r:y", 1)),
        txn("T2", "ok", rd("r:y", []), app("r:x", 2)),
        final("r:x", [2]),
        final("r:y", [1]),
    ]
    default = check(events)  # write skew: allowed under snapshot isolation
    assert default.ok and [v.kind for v in default.allowed] == ["G2-item"]
    v = only(check(events, allowed=()), "G2-item")
    assert set(v.cycle) == {"T1", "T2"} and "-rw(" in v.message


# -- the same anomalies through summarised reads -----------------------------------------------
def summary(key: str, values) -> list:
    return h.summary_read_op(key, values)


def test_aborted_read_through_a_summary_g1a():
    events = [
        txn("T1", "ok", app("r:x", 1)),
        txn("T2", "fail", app("r:x", 2)),
        txn("T3", "ok", summary("r:x", [1, 2])),
        final("r:x", [1]),
    ]
    v = only(check(events), "G1a")
    assert "'T3'" in v.message and "'T2'" in v.message


def test_intermediate_read_through_a_summary_g1b():
    events = [
        txn("T1", "ok", app("r:x", 1), app("r:x", 2)),
        txn("T2", "ok", summary("r:x", [1])),
        final("r:x", [1, 2]),
    ]
    v = only(check(events), "G1b")
    assert "inside the appends of txn 'T1'" in v.message


def test_circular_information_flow_through_summaries_g1c():
    events = [
        txn("T1", "ok", app("r:x", 1), summary("r:y", [2])),
        txn("T2", "ok", app("r:y", 2), summary("r:x", [1])),
        final("r:x", [1]),
        final("r:y", [2]),
    ]
    v = only(check(events), "G1c")
    assert set(v.cycle) == {"T1", "T2"} and "-wr(" in v.message


def test_anti_dependency_cycle_through_summaries_g2_item():
    events = [
        txn("T1", "ok", summary("r:x", []), app("r:y", 1)),
        txn("T2", "ok", summary("r:y", []), app("r:x", 2)),
        final("r:x", [2]),
        final("r:y", [1]),
    ]
    v = only(check(events, allowed=()), "G2-item")
    assert set(v.cycle) == {"T1", "T2"} and "-rw(" in v.message


def test_summary_unlike_the_final_state_is_a_read_mismatch():
    base = [txn("T1", "ok", app("r:x", "a"), app("r:x", "b")), final("r:x", ["a", "b"])]
    other = only(check([*base, txn("T2", "ok", summary("r:x", ["a", "c"]))]), "read-mismatch")
    assert "element 1 is 'c', the final state has 'b'" in other.message
    longer = only(check([*base, txn("T2", "ok", summary("r:x", ["a", "b", "a"]))]), "read-mismatch")
    assert "3 values, the final state has 2" in longer.message
    # a difference before the tail is found by the digest alone
    early = [f"v{i}" for i in range(20)]
    events = [
        txn("T1", "ok", *(app("r:y", v) for v in early)),
        final("r:y", early),
        txn("T2", "ok", summary("r:y", ["w0", *early[1:]])),
    ]
    assert "unlike the first 20" in only(check(events), "read-mismatch").message
    assert check([*base, txn("T2", "ok", summary("r:x", ["a", "b"]))], allowed=()).ok


def test_a_summary_must_be_of_a_whole_list():
    bad = txn("T1", "ok", [*summary("r:x", [1]), 0])
    only(check([bad, final("r:x", [])]), "malformed")


# -- incremental observations ---------------------------------------------------------------------
def test_incremental_observations_rebuild_the_final_state():
    events = [
        *write("A", "p", 1, 0, 0),
        observation("t:A/0", ["p:1"], None),
        *write("A", "p", 2, 0, 1),
        observation("t:A/0", ["p:1", "p:2"], 1),
        *write("A", "p", 3, 0, 2),
        observation("t:A/0", ["p:1", "p:2", "p:3"], 2),
    ]
    report = check(events)
    assert report.ok and report.final["t:A/0"] == ["p:1", "p:2", "p:3"]
    assert report.final_offsets["t:A/0"] == [0, 1, 2]
    # the rebuilt state is what is checked: a write missing from it is lost
    lost = [*events, *write("A", "p", 4, 0, 3), observation("t:A/0", ["p:1", "p:2", "p:3"], 3)]
    assert "p:4" in only(check(lost), "lost-write").message
    gap = [*events[:-1], {**events[-1], "offsets": [3]}]
    only(check(gap, allowed={"lost-write", "misplaced-write"}), "offset-gap")


def test_incremental_observation_of_another_prefix_is_a_state_regression():
    events = [
        *write("A", "p", 1, 0, 0),
        *write("A", "p", 2, 0, 1),
        observation("t:A/0", ["p:1", "p:2"], None),
        invoke("A", "p", 3),
        {**observation("t:A/0", ["p:1", "p:3"], 2), "values": [], "offsets": []},
    ]
    v = only(check(events, allowed={"lost-write", "misplaced-write"}), "state-regression")
    assert "digests differ" in v.message


def test_full_observation_after_increments_is_compared_with_them():
    events = [
        *write("A", "p", 1, 0, 0),
        observation("t:A/0", ["p:1"], None),
        *write("A", "p", 2, 0, 1),
        observation("t:A/0", ["p:1", "p:2"], 1),
        observation("t:A/0", ["p:1"], None),  # p:2 gone: lost and regressed
    ]
    report = check(events, allowed={"lost-write"})
    v = only(report, "state-regression")
    assert "t:A/0@1 was 'p:2'" in v.message


def test_shorter_incremental_observation_is_compared_with_the_previous_one():
    events = [
        txn("T1", "ok", app("r:x", 1), app("r:x", 2)),
        observation("r:x", [1, 2], None),
        observation("r:x", [1], 1),  # the first value is the same, the second is gone
    ]
    only(check(events, allowed={"lost-write", "torn-txn"}), "state-regression")


def tail(key: str, values: list, base: int) -> dict:
    """A tail observation: the values from position ``base`` on, the prefix not read."""
    event = observation(key, values, base)
    del event["base_digest"], event["digest"]
    return event


def test_tail_observations_are_verified_by_the_next_full_one():
    events = [
        *write("A", "p", 1, 0, 0),
        observation("t:A/0", ["p:1"], None),
        *write("A", "p", 2, 0, 1),
        tail("t:A/0", ["p:1", "p:2"], 1),
        *write("A", "p", 3, 0, 2),
        tail("t:A/0", ["p:1", "p:2", "p:3"], 2),
    ]
    report = check([*events, observation("t:A/0", ["p:1", "p:2", "p:3"], 3)])
    assert report.ok and report.final["t:A/0"] == ["p:1", "p:2", "p:3"]
    # the full observation finds p:2 replaced: its prefix digest differs from the tails'
    invoke_x = invoke("A", "q", 1)
    changed = [*events, invoke_x, observation("t:A/0", ["p:1", "q:1", "p:3"], 3)]
    v = only(check(changed, allowed={"lost-write", "misplaced-write"}), "state-regression")
    assert "digests differ" in v.message
    # recorded whole, as the observer does when the digest differs: the value is named
    whole = [*events, invoke_x, observation("t:A/0", ["p:1", "q:1", "p:3"], None)]
    v = only(check(whole, allowed={"lost-write", "misplaced-write"}), "state-regression")
    assert "t:A/0@1 was 'p:2'" in v.message


def test_malformed_incremental_observations():
    never = observation("r:x", [1], 0)
    assert "never observed before" in only(check([never]), "malformed").message
    first = observation("r:x", [1], None)
    bad_count = {**observation("r:x", [1, 2], 1), "count": 3}
    bad_digest = {**observation("r:x", [1, 2], 1), "digest": h.list_digest([1, 3])}
    bad_base = observation("r:x", [1, 2, 3], 1) | {"base": 5}
    for bad in (bad_count, bad_digest, bad_base):
        assert check([first, bad], allowed={"unknown-value"}).kinds == {"malformed"}, bad


def test_committed_offset_backwards():
    events = [
        *write("A", "p", 1, 0, 0),
        *write("A", "p", 2, 0, 1),
        *write("A", "p", 3, 0, 2),
        final("t:A/0", ["p:1", "p:2", "p:3"], [0, 1, 2]),
        committed("A", "c", 0, 3),
        committed("A", "c", 0, 2),
    ]
    v = only(check(events), "committed-offset-backwards")
    assert "committed 3" in v.message and len(v.events) == 2


def test_committed_offset_past_the_end():
    events = [
        *write("A", "p", 1, 0, 0),
        *write("A", "p", 2, 0, 1),
        final("t:A/0", ["p:1", "p:2"], [0, 1]),
        committed("A", "c", 0, 3),
    ]
    only(check(events), "committed-offset-past-end")


def test_offsets_not_dense():
    events = [
        *write("A", "p", 1, 0, 0),
        *write("A", "p", 2, 0, 1),
        *write("A", "p", 3, 0, 3),
        final("t:A/0", ["p:1", "p:2", "p:3"], [0, 1, 3]),
    ]
    v = only(check(events), "offset-gap")
    assert "offset 3 at position 2, expected 2" in v.message


def test_read_mismatch_and_double_consume():
    events = [
        *write("A", "p", 1, 0, 0),
        *write("A", "p", 2, 0, 1),
        read_event("A", "c", 0, [0, 1], ["p:2", "p:1"]),
        final("t:A/0", ["p:1", "p:2"]),
    ]
    only(check(events), "read-mismatch")
    events = [
        *write("A", "p", 1, 0, 0),
        *write("A", "p", 2, 0, 1),
        read_event("A", "c", 0, [0, 1], ["p:1", "p:2"]),
        read_event("A", "c", 0, [1], ["p:2"]),
        final("t:A/0", ["p:1", "p:2"]),
    ]
    only(check(events), "double-consume")


def test_producer_order_unknown_value_misplaced_regression_malformed():
    order = [
        *write("A", "p", 1, 0, 1),
        *write("A", "p", 2, 0, 0),
        final("t:A/0", ["p:2", "p:1"], [0, 1]),
    ]
    only(check(order), "producer-order")
    garbage = [*write("A", "p", 1, 0, 0), final("t:A/0", ["p:1", "junk"], [0, 1])]
    only(check(garbage), "unknown-value")
    misplaced = [*write("A", "p", 1, 0, 0), final("t:A/1", ["p:1"]), final("t:A/0", [])]
    only(check(misplaced), "misplaced-write")
    regressed = [
        *write("A", "p", 1, 0, 0),
        final("t:A/0", ["p:1", "p:2"]),
        invoke("A", "p", 2),
        final("t:A/0", ["p:1"]),
    ]
    only(check(regressed), "state-regression")
    reused = [
        txn("T1", "ok", app("r:x", 1)),
        txn("T2", "ok", app("r:y", 1)),
        final("r:x", [1]),
        final("r:y", []),
    ]
    only(check(reused, allowed={"lost-write"}), "malformed")


def test_topic_level_append_is_found_in_its_partition():
    events = [
        txn("T1", "ok", app("t:B", "m1"), app("t:B", "m2")),
        txn("T2", "ok", rd("t:B/1", ["m1"])),
        final("t:B/0", ["m2"], [0]),
        final("t:B/1", ["m1"], [0]),
    ]
    assert check(events, allowed=()).ok


def test_long_cycle_needs_no_recursion():
    n = 5_000  # far past the interpreter's recursion limit
    events = []
    for i in range(n):  # T_i appends to k_i and k_{i-1}: ww T_{i-1} -> T_i, closed by k_{n-1}
        events.append(
            txn(f"T{i}", "ok", app(f"r:k{i}", f"a{i}"), app(f"r:k{(i - 1) % n}", f"b{i}"))
        )
    for i in range(n):
        events.append(final(f"r:k{i}", [f"a{i}", f"b{(i + 1) % n}"]))
    report = check(events)
    v = only(report, "G0")
    assert len(v.cycle) == n and f"({n} edges)" in v.message


def test_fifty_thousand_events_with_incremental_observations():
    """A long history observed every 2000 steps, with summarised row reads: clean.
    (The checker's speed on it shows in ``make chaos``; tests assert no timings.)"""
    gc.disable()  # the generator's many lists would make the collector run often
    try:
        events = serial_history(7, 38_000, rotate=100, summaries=True, observe_every=2000)
    finally:
        gc.enable()
    assert len(events) > 50_000
    report = check(events, allowed=())
    assert report.ok, report.summary()
    assert report.stats["nodes"] > 20_000


# -- retention and splits ------------------------------------------------------------------
def important(topic: str, consumer: str, partition: int, offset: int) -> dict:
    return {**committed(topic, consumer, partition, offset), "important": True}


def aged_history(last_values, last_offsets, start: int, reaper_after: int = 3) -> list:
    """Five writes to A/0, a consumer read of the first two, a whole observation, a
    retention pass up to ``start`` observed as ``last_values``/``last_offsets``, and the
    important consumer's committed offset observed after it."""
    return [
        *[e for seq in range(1, 6) for e in write("A", "p", seq, 0, seq - 1)],
        read_event("A", "reaper", 0, [0, 1], ["p:1", "p:2"]),
        important("A", "reaper", 0, 2),
        final("t:A/0", [f"p:{n}" for n in range(1, 6)], range(5), start=0),
        final("t:A/0", last_values, last_offsets, start=start),
        important("A", "reaper", 0, reaper_after),
    ]


def test_legitimately_expired_prefix_is_not_reported():
    events = aged_history(["p:4", "p:5"], [3, 4], start=3)
    report = check(events, allowed=())
    assert report.ok, report.summary()
    assert report.final["t:A/0"] == ["p:4", "p:5"]
    # The same prefix missing from a topic without a recorded log start is lost.
    events = [
        *write("B", "p", 1, 0, 0),
        *write("B", "p", 2, 0, 1),
        final("t:B/0", ["p:2"], [1]),
    ]
    assert check(events).kinds == {"lost-write", "offset-gap"}


def test_lost_message_above_the_log_start():
    events = aged_history(["p:4"], [3], start=3)
    report = check(events)
    assert report.kinds == {"lost-write", "state-regression"}, report.summary()
    lost = next(v for v in report.violations if v.kind == "lost-write")
    assert "'p:5'" in lost.message and "A/0@4" in lost.message
    # Without the earlier whole observation only the acknowledgement shows the loss.
    only(check([e for e in events if e.get("start") != 0]), "lost-write")


def test_duplicate_and_gap_above_the_log_start():
    events = aged_history(["p:4", "p:4", "p:5"], [3, 4, 5], start=3)
    assert "duplicate" in check(events).kinds
    events = [e for e in aged_history(["p:5"], [4], start=3) if e.get("start") != 0]
    assert "offset-gap" in check(events).kinds


def test_log_start_moving_backwards():
    events = aged_history(["p:4", "p:5"], [3, 4], start=3)
    events.append(final("t:A/0", ["p:2", "p:3", "p:4", "p:5"], [1, 2, 3, 4], start=1))
    v = only(check(events), "log-start-backwards")
    assert "log start 3" in v.message and "then 1" in v.message


def test_retention_past_what_an_important_consumer_committed():
    v = only(
        check(aged_history(["p:4", "p:5"], [3, 4], start=3, reaper_after=2)),
        "retention-past-committed",
    )
    assert "log start 3" in v.message and "'reaper'" in v.message
    # A consumer that is not important does not hold retention back.
    events = aged_history(["p:4", "p:5"], [3, 4], start=3)
    events.append(committed("A", "other", 0, 0))
    assert check(events, allowed=()).ok


def split(topic: str, partition: int, children, status: str) -> dict:
    return {
        "type": "split",
        "process": "worker",
        "topic": topic,
        "partition": partition,
        "children": list(children),
        "status": status,
    }


def lineage(topic: str, *partitions) -> dict:
    return {
        "type": "lineage",
        "process": "observer",
        "topic": topic,
        "partitions": [list(p) for p in partitions],
    }


BEFORE = lineage("F", (0, True, []), (1, True, []), (2, True, []))
AFTER = lineage("F", (0, False, [1, 2]), (1, True, []), (2, True, []))


def test_split_entirely_before_or_after_is_clean():
    invoked = split("F", 0, [1, 2], "invoke")
    for events in (
        [BEFORE, invoked, BEFORE],  # crashed before the metadata was saved
        [BEFORE, invoked, AFTER, AFTER],  # saved, not acknowledged
        [invoked, split("F", 0, [1, 2], "ok"), AFTER, BEFORE | {"topic": "G"}],
    ):
        report = check(events, allowed=())
        assert report.ok, report.summary()


def test_torn_split():
    invoked = split("F", 0, [1, 2], "invoke")
    torn = [
        lineage("F", (0, False, []), (1, True, []), (2, True, [])),  # inactive, no children
        lineage("F", (0, False, [1, 2]), (1, True, [])),  # a child missing
        lineage("F", (0, True, [1, 2]), (1, True, []), (2, True, [])),  # active with children
        lineage("F", (0, False, [1]), (1, True, []), (2, True, [])),  # other children
        lineage("F", (0, False, [1, 2], None), (1, True, [], 0), (2, True, [], 1)),  # 2's parent
    ]
    for observed in torn:
        v = only(check([invoked, observed]), "torn-split")
        assert "F/0" in v.message


def test_split_children_naming_their_parent_are_clean():
    invoked = split("F", 0, [1, 2], "invoke")
    after = lineage("F", (0, False, [1, 2], None), (1, True, [], 0), (2, True, [], 0))
    report = check([BEFORE, invoked, after], allowed=())
    assert report.ok, report.summary()


def test_lost_split():
    invoked = split("F", 0, [1, 2], "invoke")
    v = only(check([invoked, split("F", 0, [1, 2], "ok"), BEFORE]), "lost-split")
    assert "active again" in v.message
    only(check([invoked, AFTER, BEFORE]), "lost-split")  # observed done, then undone


def test_malformed_split_events():
    bad = [
        split("F", 0, [1, 2], "maybe"),
        {**split("F", 0, [1, 2], "ok"), "children": 1},
        {"type": "lineage", "process": "o", "topic": "F", "partitions": [[0, True]]},
    ]
    report = check(bad)
    assert report.kinds == {"malformed"} and report.counts["malformed"] == 3


# -- configuration, recording and loading ---------------------------------------------------
def test_allowed_kinds_are_checked():
    assert {"G2-item"} == DEFAULT_ALLOWED and KINDS.keys() >= DEFAULT_ALLOWED
    with pytest.raises(ValueError, match="unknown anomaly kinds"):
        check([], allowed={"G3"})


def test_writer_one_line_per_event_and_torn_lines(tmp_path):
    path = tmp_path / "history.jsonl"
    with h.HistoryWriter(path, "w1") as w1, h.HistoryWriter(path, "w2") as w2:
        w1.invoke("A", "p1", 1)
        w1.ack("A", "p1", 1, 0, 0)
        w2.txn("T1", "ok", [h.append_op("r:x", b"\xffbytes"), h.read_op("t:A/0", ["p1:1"], 0)])
        w2.final("t:A/0", ["p1:1"], [0])
        w2.final("r:x", [b"\xffbytes"])
        w1.offsets("A", "c", 0, 1)
    with open(path, "ab") as f:  # a process killed inside its write, then another line
        f.write(b'{"type":"ack","process":"w3","topic":"A","pro')
        f.write(
            h.encode(
                {
                    "type": "offsets",
                    "process": "w4",
                    "topic": "A",
                    "consumer": "c",
                    "partition": 0,
                    "committed": 1,
                }
            )
        )
        f.write(b'{"type":"final","key":"r:')  # and a torn last line
    events, torn = h.parse(path.read_bytes())
    assert torn == 2
    assert [e["type"] for e in events] == [
        "invoke",
        "ack",
        "txn",
        "final",
        "final",
        "offsets",
        "offsets",
    ]
    assert events[-1]["process"] == "w4" and events[2]["ops"][0][2] == "\\xffbytes"
    report = check_file(path, allowed=())
    assert report.ok, report.summary()
    assert report.stats["nodes"] == 1


def test_tail_reads_what_was_appended_like_a_full_load(tmp_path):
    path = tmp_path / "history.jsonl"
    tail = h.HistoryTail(path)
    assert tail.read_new() == []  # no file yet
    with h.HistoryWriter(path, "w1") as w1:
        w1.invoke("A", "p1", 1)
        assert [e["type"] for e in tail.read_new()] == ["invoke"]
        assert tail.read_new() == []
        with open(path, "ab") as f:  # a line being written, not complete yet
            f.write(b'{"type":"ack","process":"w3","topic":"A","pro')
        assert tail.read_new() == []
        w1.ack("A", "p1", 1, 0, 0)  # glued to the torn line: recovered
        w1.final("t:A/0", ["p1:1"], [0], count=1, digest=h.list_digest(["p1:1"]))
    got = tail.read_new()
    assert [e["type"] for e in got] == ["ack", "final"] and tail.torn == 1
    everything, torn = h.parse(path.read_bytes())
    assert torn == 1 and [e["type"] for e in everything] == ["invoke", "ack", "final"]
    assert check(everything, allowed=()).ok


def test_canonical_text_and_digests():
    values = ["a", 'q"uote', "back\\slash", "new\nline", "é", 1, 2.5, None, True, ["l"]]
    text = h.canonical_text(values)
    assert text == "".join(json.dumps(v) + "\n" for v in values)
    assert h.canonical_text(["plain", "x:y@T1.2"]) == '"plain"\n"x:y@T1.2"\n'
    streamed = h.ListDigest(values[:3])
    assert streamed.count == 3 and streamed.hexdigest() == h.list_digest(values[:3])
    branch = streamed.copy().update(values[3:])
    assert branch.hexdigest() == h.list_digest(values) != streamed.hexdigest()
    assert h.list_digest(["1"]) != h.list_digest([1]) and h.list_digest(["a,b"]) != h.list_digest(
        ["a", "b"]
    )
    assert h.joined_list(None) == [] and h.joined_list("a,b") == ["a", "b"]


def test_writer_lines_stay_whole_across_processes(tmp_path):
    path = tmp_path / "history.jsonl"
    children = []
    for n in range(4):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                with h.HistoryWriter(path, f"w{n}") as w:
                    for i in range(200):
                        w.final(f"r:{n}-{i}", ["x" * (i * 7)])
            finally:
                os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    events, torn = h.parse(path.read_bytes())
    assert torn == 0 and len(events) == 800
