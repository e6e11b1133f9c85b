"""A consumer read decodes all its partitions' frames at once (``engine.reads._relation``
over ``storage.frame_read`` slices; issue 14, Scale).

Property: whatever the writes (frames small and large, many partitions, some empty)
and however the polls are bounded, consumer polls return every message exactly once,
with its own partition, offset and data, in offset order within each partition, and
the same rows as a peek of the whole topic; a poll of a topic with nothing new
returns nothing and moves no offset.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.engine.conftest import rows

PARTITIONS = 12
BOUNDS = (
    "max_messages = 1",
    "max_messages = 7",
    "max_messages = 100",
    "max_messages = 1000",
    "max_bytes = 2000",
    "max_bytes = 50000",
)


def _write(session: Any, rng: random.Random, statements: int) -> None:
    for _ in range(statements):
        partition = rng.randrange(PARTITIONS)
        count = rng.choice((1, 2, 5, 30, 70, 130))  # frames below and above 64 messages
        tag = rng.randrange(1 << 30)
        values = ", ".join(f"('{tag}-{i}', {partition})" for i in range(count))
        session.execute(f"INSERT INTO TOPIC t (data, partition) VALUES {values}")


def _poll(session: Any, rng: random.Random) -> list[tuple[int, int, bytes]]:
    bound = rng.choice(BOUNDS)
    read = f"SELECT partition, offset, data FROM TOPIC t WITH (consumer = 'c', {bound})"
    return [(r["partition"], r["offset"], bytes(r["data"])) for r in rows(session, read)]


@pytest.mark.parametrize("seed", range(6))
def test_polls_return_every_message_once(session: Any, seed: int) -> None:
    rng = random.Random(seed)
    session.execute(f"CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = {PARTITIONS})")
    polled: list[tuple[int, int, bytes]] = []
    for _ in range(4):
        _write(session, rng, rng.randint(0, 25))
        for _ in range(rng.randint(1, 6)):
            polled += _poll(session, rng)
    for _ in range(10_000):  # drain
        got = _poll(session, rng)
        if not got:
            break
        polled += got
    everything = [
        (r["partition"], r["offset"], bytes(r["data"]))
        for r in rows(session, "SELECT partition, offset, data FROM TOPIC t")
    ]
    assert len(polled) == len(set(polled)), "a message was read twice"
    assert sorted(polled) == sorted(everything)
    for partition in range(PARTITIONS):
        offsets = [o for p, o, _ in polled if p == partition]
        assert offsets == list(range(len(offsets)))  # in order, none skipped
    lags = rows(session, "SELECT lag_messages FROM sys.consumers WHERE topic = 't'")
    assert len(lags) == PARTITIONS and all(r["lag_messages"] == 0 for r in lags)
    assert _poll(session, rng) == []  # nothing new: nothing read
