"""A workload of concurrent commits with one ``MemoryError`` injected (``test_nomem_matrix``).

Run in a forked child (``tests/fork_server.py``)::

    nomem_worker.py DATA FAILPOINT_SPEC close|abandon

creates the data set (``txn_worker``'s topics and tables, topic ``c`` of 6 partitions
and consumer ``adder`` on ``a``), arms ``FAILPOINT_SPEC`` (``name=nomem@n``), then runs
five sessions side by side, each on a thread of its own, for ``ROUNDS`` transactions:

- ``mix``: ``txn_worker``'s mode mix (topic-only moves ``a -> b`` committed in the log,
  moves ``a -> moved`` committed through DuckDB), consumer ``mover``;
- ``count``: ``a -> counts`` through DuckDB, consumer ``counter``;
- ``delta``: reads ``a`` with consumer ``adder`` and adds the count to ``totals`` (a
  counter delta kept in the commit record, applied in the background: ``engine.deltas``);
- ``produce``: autocommit inserts into ``a`` by producer ``s<n>`` (``txn_worker.produce``'s
  payloads), through the group commit of ``a``'s partitions; one that fails is sent once
  more with the same seq_nos (an idempotent producer's retry: deduplicated, never twice);
- ``spread``: autocommit inserts into ``c``, each statement spread over its 6 partitions
  (``engine.spread_append``): payload ``c:<statement>:<row>``.

A statement that fails is rolled back (if it can be) and the thread goes on with the
next one; an error is kept by type and message. After ``JOIN_S`` a thread still running is
a hang: the child prints ``hang`` with every thread's stack and exits 4. Two more
phases follow: ``delta`` beside ``spread`` (no DuckDB-way writer), then ``delta`` alone,
each transaction followed by a read of ``totals`` (``_delta_applied``). Then with
``close`` the database is closed (an error of the close is reported, not raised); with
``abandon`` the process ends at once (``os._exit``: no close, no checkpoint, as a
crash with the page cache intact). The last stdout line is JSON: the failpoints' hits,
the errors, the statements of ``produce`` and ``spread`` acknowledged and failed, and the
close's outcome; ``test_nomem_matrix`` then reopens the directory and checks it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import threading
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import txn_worker as tw  # noqa: E402

from engine import commit as commit_module  # noqa: E402
from engine.database import Database  # noqa: E402
from storage import failpoints, limits  # noqa: E402

ROUNDS = 14
JOIN_S = float(os.environ.get("NOMEM_JOIN_S", "240"))  # a hang bound only (loaded cores)
SPREAD_PARTITIONS = 6
SPREAD_ROWS = 12
PRODUCE_ROWS = 6
SETUP = tw.SETUP.replace("CONSUMER counter)", "CONSUMER counter, CONSUMER adder)") + (
    f"; CREATE TOPIC c WITH (min_active_partitions = {SPREAD_PARTITIONS})"
    "; CREATE TOPIC d; CREATE TOPIC e"
)
# moves a -> d by consumer ``adder``; the count moved is added to ``totals`` (a delta)
ADD = (
    "INSERT INTO TOPIC d (data, message_group_id) SELECT data, message_group_id "
    "FROM TOPIC a WITH (consumer = 'adder', max_messages = {k})"
)
FRAME_MESSAGES = 64  # ``limits.FRAME_TARGET_MESSAGES`` here: a share of ``e`` is cut
BIG_ROWS = 150  # each ``big`` transaction's messages to ``e``: 3 frames


class Outcomes:
    """What the threads saw (appended under the GIL: lists only)."""

    def __init__(self) -> None:
        self.errors: list[list[str]] = []
        self.produced: list[list[int]] = []  # [source, first seq, count] acknowledged
        self.produce_failed: list[list[int]] = []
        self.spread: list[int] = []  # statements acknowledged
        self.spread_failed: list[int] = []
        self.big: list[int] = []
        self.big_failed: list[int] = []

    def error(self, thread: str, error: BaseException) -> None:
        self.errors.append([thread, type(error).__name__, str(error)[:300]])


def _rollback(session) -> None:
    with contextlib.suppress(Exception):  # nothing open, or the session is unusable
        session.execute("ROLLBACK")


def _transactions(name: str, statements, session, outcomes: Outcomes, rng,
                  rounds: int = ROUNDS) -> None:  # fmt: skip
    """``rounds`` transactions, each ``BEGIN; <statements(k)>; COMMIT``."""
    for _ in range(rounds):
        k = rng.randint(1, 15)
        try:
            session.execute("BEGIN")
            for sql, parameters in statements(k, session):
                session.execute(sql, parameters) if parameters else session.execute(sql)
            session.execute("COMMIT")
        except Exception as error:
            outcomes.error(name, error)
            _rollback(session)


def _mix(rng):
    def statements(k, session):
        chosen = rng.choice(((tw.MOVE,), (tw.MOVE_TO_TABLE,), (tw.MOVE, tw.MOVE_TO_TABLE)))
        for sql in chosen:  # the third: staged topic writes and table rows, one commit
            yield sql.format(k=k), None

    return statements


def _count(k, session):
    yield tw.COUNT.format(k=k), None


def _delta(k, session):
    moved = int(session.execute(ADD.format(k=k))[-1].tag.rsplit(" ", 1)[1])
    yield tw.ADD_TOTAL, [f"w{k % tw.TOTAL_KEYS}", moved]


def _delta_applied(session, outcomes: Outcomes) -> None:
    """``ROUNDS`` delta transactions alone, each followed by a read of ``totals``, which
    waits until the applier applied it (``DeltaApplier.wait_visible``): a group each, so
    the applier's failpoints (``deltas.*``) pass at least about ``ROUNDS`` times after the
    arming, however the phases before went (round 26: in those, a delta is kept only while
    no DuckDB-way writer is open, and the applier gathers records for ``GATHER_S``, so
    their passes ranged from 2 to 18, and an ``@3`` case could end, abandoned, before it
    fired)."""
    rng = random.Random(4)
    for _ in range(ROUNDS):
        _transactions("delta", _delta, session, outcomes, rng, rounds=1)
        try:
            session.execute("SELECT sum(n) FROM totals")
        except Exception as error:
            outcomes.error("delta", error)


def _big(session, outcomes: Outcomes) -> None:
    """Transactions of ``BIG_ROWS`` messages to ``e``: one share cut into frames."""
    for number in range(ROUNDS):
        try:
            session.execute("BEGIN")
            session.execute(f"INSERT INTO TOPIC e (data) SELECT 'e:{number}:' || i "
                            f"FROM range({BIG_ROWS}) t(i)")  # fmt: skip
            session.execute("COMMIT")
        except Exception as error:
            outcomes.error("big", error)
            outcomes.big_failed.append(number)
            _rollback(session)
        else:
            outcomes.big.append(number)


def _produce(session, outcomes: Outcomes) -> None:
    seq = {source: 10_000 for source in range(tw.SOURCES)}
    for round_ in range(ROUNDS):
        source = round_ % tw.SOURCES
        first = seq[source]
        seq[source] += PRODUCE_ROWS
        sql = (
            "INSERT INTO TOPIC a (data, producer_id, seq_no, message_group_id) "
            f"SELECT 's{source}:' || i || ':' || g, 's{source}', i, g FROM ("
            f"SELECT i, 'u' || (({source} * 7 + i * 5) % {tw.USERS}) AS g "
            f"FROM range({first}, {first + PRODUCE_ROWS}) t(i))"
        )
        for attempt in range(2):  # a failed produce is sent once more, as a producer does
            try:
                session.execute(sql)
            except Exception as error:
                outcomes.error("produce", error)
                if attempt:
                    outcomes.produce_failed.append([source, first, PRODUCE_ROWS])
            else:
                outcomes.produced.append([source, first, PRODUCE_ROWS])
                break


def _spread(session, outcomes: Outcomes, first: int = 0) -> None:
    for statement in range(first, first + ROUNDS):
        try:
            session.execute(
                "INSERT INTO TOPIC c (data, producer_id) "
                f"SELECT 'c:{statement}:' || i, 'p' || i FROM range({SPREAD_ROWS}) t(i)"
            )
        except Exception as error:
            outcomes.error("spread", error)
            outcomes.spread_failed.append(statement)
        else:
            outcomes.spread.append(statement)


def _phase(bodies: dict, sessions: dict) -> None:
    """Run each body on its session, a thread each; a thread left after ``JOIN_S`` is a
    hang: print every such thread's stack and exit 4."""
    threads = [threading.Thread(target=bodies[name], args=(sessions[name],), name=name,
                                daemon=True) for name in bodies]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    if any(thread.is_alive() for thread in threads):
        frames = sys._current_frames()
        stacks = {t.name: traceback.format_stack(frames[t.ident])
                  for t in threads if t.is_alive() and t.ident in frames}  # fmt: skip
        print("hang", json.dumps(stacks))
        sys.stdout.flush()
        os._exit(4)


def main(argv: list[str]) -> int:
    data, spec, end = argv
    commit_module.CHECKPOINT_TRANSACTIONS = 3  # checkpoints among the commits
    limits.FRAME_TARGET_MESSAGES = FRAME_MESSAGES
    database = Database.open(data, retention_interval_s=None)
    setup = database.connect()
    setup.execute(SETUP)
    tw.produce(setup, 1, 60)
    setup.close()
    outcomes = Outcomes()
    failpoints.activate(spec)
    rng = random.Random(7)
    names = ("mix", "count", "delta", "produce", "spread", "big")
    sessions = {name: database.connect() for name in names}
    bodies = {
        "mix": lambda s: _transactions("mix", _mix(random.Random(1)), s, outcomes, rng),
        "count": lambda s: _transactions("count", _count, s, outcomes, random.Random(2)),
        "delta": lambda s: _transactions("delta", _delta, s, outcomes, random.Random(3)),
        "produce": lambda s: _produce(s, outcomes),
        "spread": lambda s: _spread(s, outcomes),
        "big": lambda s: _big(s, outcomes),
    }
    _phase(bodies, sessions)
    # Then the counter deltas with no DuckDB-way writer beside them (one keeps deltas
    # from being kept: ``engine.deltas`` rule 4), beside more spread statements.
    bodies = {"delta": bodies["delta"], "spread": lambda s: _spread(s, outcomes, ROUNDS)}
    _phase(bodies, {name: sessions[name] for name in bodies})
    _phase({"delta": lambda s: _delta_applied(s, outcomes)}, {"delta": sessions["delta"]})
    closed = "abandoned"
    if end == "close":
        for session in sessions.values():
            try:
                session.close()
            except Exception as error:
                outcomes.error("close", error)
        try:
            database.close()
            closed = "closed"
        except Exception as error:
            closed = f"{type(error).__name__}: {error}"[:300]
    hits = dict(failpoints._hits)  # the close's passes too
    failpoints.deactivate()
    print(json.dumps({"hits": hits, "errors": outcomes.errors, "produced": outcomes.produced,
                      "produce_failed": outcomes.produce_failed, "spread": outcomes.spread,
                      "spread_failed": outcomes.spread_failed, "big": outcomes.big,
                      "big_failed": outcomes.big_failed, "closed": closed}))  # fmt: skip
    sys.stdout.flush()
    os._exit(0)  # abandon (or after the close): nothing else runs
