"""Transaction worker: moves or counts topic messages in transactions until killed.

Run as a subprocess by ``test_txn_crash.py`` (and importable for its helpers)::

    python txn_worker.py --data DIR --mode move|count|mix|open
        [--seed N] [--min-messages N] [--max-messages N] [--checkpoint-every N]
    python txn_worker.py --serve    # fork server: starts such workers fast (``serve``)

Modes (each transaction is retried on 40001):

- ``move`` (the resharding loop): ``BEGIN; INSERT INTO TOPIC b (data,
  message_group_id) SELECT data, message_group_id FROM TOPIC a WITH (consumer =
  'mover', max_messages = k); COMMIT`` until a read finds nothing left;
- ``count`` (topic to table): ``BEGIN; INSERT INTO counts SELECT
  message_group_id, count(*) FROM TOPIC a WITH (consumer = 'counter', ...)
  GROUP BY 1 ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n; COMMIT`` until a
  read finds nothing left;
- ``mix`` (both kinds of commit on one consumer): each transaction is, at random,
  the ``move`` transaction (topic-only: committed in the staging log) or moves the
  messages read with the same consumer ``mover`` into table ``moved`` instead
  (touches a table: committed through DuckDB), so the two commit paths interleave
  on the same consumer partitions and ``b`` plus ``moved`` must hold each consumed
  message exactly once (``check_moved(session, table=True)``);
- ``delta`` (counter deltas, ``engine.deltas``): the ``move`` transaction followed by
  ``INSERT INTO totals VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n``
  adding the number moved to one of ``TOTAL_KEYS`` keys (kept as a delta, committed in the
  log record, applied by the background applier); in about one transaction in five a
  ``SELECT`` of ``totals`` follows in the same transaction (its deltas then run the DuckDB
  way and it commits through DuckDB). ``check_totals``: the totals add up to ``b``'s
  messages, exactly;
- ``open``: open the database (recovery runs) and close it.

``k`` is drawn from ``min-messages..max-messages`` per transaction (seeded). Crash points
come from outside: SIGKILL from the test, or ``TOPICBASE_FAILPOINTS`` in the
environment (``name=crash@n`` exits with 137 at the n-th hit).
``--checkpoint-every`` lowers ``engine.commit.CHECKPOINT_TRANSACTIONS`` (256)
so that checkpoints, and kills inside them, happen in a short run.

Stdout gets ``opening`` before the database is opened, ``ready`` once it is
open (recovery done) with a session, and after a clean close ``done`` with what the
run did: ``done commits=<n> failpoints=<json: name -> hits>`` (the hits of the armed
failpoints), so that a test whose worker ended without reaching its failpoint can tell
a plan that gave it too little to do from a failpoint that was passed and did not fire.
An unexpected error exits with code 3 and a traceback on stderr.

The data set (``create``, ``produce``): topic ``a`` has ``A_PARTITIONS``
partitions and is written by ``SOURCES`` producers: producer ``s<src>`` writes
messages with seq_no 1, 2, ... whose payload is ``s<src>:<seq>:<user>`` and
whose message_group_id is ``<user>`` (``user_of``). A producer id binds a
source to one partition of ``a``; topic ``b`` (``B_PARTITIONS`` partitions)
routes the moved messages by message_group_id, so one move transaction
usually writes several partitions of ``b``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import signal
import sys
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine import commit as commit_module  # noqa: E402
from engine.database import Database  # noqa: E402
from engine.session import Session  # noqa: E402  (imported now, not at the first connect)
from storage import failpoints  # noqa: E402
from storage.errors import SerializationFailure  # noqa: E402

SOURCES = 5
USERS = 12
A_PARTITIONS = 3
B_PARTITIONS = 3

SETUP = (
    f"CREATE TOPIC a (CONSUMER mover, CONSUMER counter) "
    f"WITH (min_active_partitions = {A_PARTITIONS}); "
    f"CREATE TOPIC b WITH (min_active_partitions = {B_PARTITIONS}); "
    "CREATE TABLE counts (k VARCHAR PRIMARY KEY, n BIGINT NOT NULL); "
    "CREATE TABLE moved (data BLOB NOT NULL, message_group_id VARCHAR); "
    "CREATE TABLE totals (k VARCHAR PRIMARY KEY, n BIGINT NOT NULL)"
)
TOTAL_KEYS = 3
ADD_TOTAL = "INSERT INTO totals VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n"
MOVE = (
    "INSERT INTO TOPIC b (data, message_group_id) SELECT data, message_group_id "
    "FROM TOPIC a WITH (consumer = 'mover', max_messages = {k})"
)
COUNT = (
    "INSERT INTO counts SELECT message_group_id, count(*) FROM TOPIC a "
    "WITH (consumer = 'counter', max_messages = {k}) GROUP BY 1 "
    "ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n"
)
MOVE_TO_TABLE = (
    "INSERT INTO moved SELECT data, message_group_id "
    "FROM TOPIC a WITH (consumer = 'mover', max_messages = {k})"
)
ALL = 1_000_000  # max_messages that reads a whole (test-sized) topic


# -- the data set -------------------------------------------------------------------------
def user_of(source: int, seq: int) -> str:
    return f"u{(source * 7 + seq * 5) % USERS}"


def create(session) -> None:
    session.execute(SETUP)


def produce(session, start_seq: int, count: int) -> None:
    """Each source writes seq_nos ``start_seq .. start_seq + count - 1`` (interleaved by source)."""
    end = start_seq + count
    for source in range(SOURCES):
        session.execute(
            "INSERT INTO TOPIC a (data, producer_id, seq_no, message_group_id) "
            f"SELECT 's{source}:' || i || ':' || g, 's{source}', i, g FROM ("
            f"SELECT i, 'u' || (({source} * 7 + i * 5) % {USERS}) AS g "
            f"FROM range({start_seq}, {end}) t(i))"
        )


def parse(data: bytes) -> tuple[int, int, str]:
    """(source, seq, user) of a payload."""
    source, seq, user = data.decode().split(":")
    return int(source[1:]), int(seq), user


def topic_rows(session, topic: str) -> list[dict]:
    """Every message of ``topic`` (peek), ordered by partition and offset."""
    result = session.execute(
        f'SELECT partition, "offset", data, message_group_id FROM TOPIC {topic} '
        f'WITH (max_messages = {ALL}) ORDER BY partition, "offset"'
    )[-1]
    assert result.table is not None
    return result.table.to_pylist()


def committed_offsets(session, consumer: str) -> dict[int, int]:
    result = session.execute(
        "SELECT partition, committed_offset FROM sys.consumers "
        f"WHERE topic = 'a' AND consumer = '{consumer}'"
    )[-1]
    assert result.table is not None
    return {r["partition"]: r["committed_offset"] or 0 for r in result.table.to_pylist()}


def end_offsets(session, topic: str) -> dict[int, int]:
    result = session.execute(
        f"SELECT partition, end_offset FROM sys.partitions WHERE topic = '{topic}'"
    )[-1]
    assert result.table is not None
    return {r["partition"]: r["end_offset"] for r in result.table.to_pylist()}


# -- the checks (run by the tests in their own process) ---------------------------------------
@dataclass
class MoveCheck:
    a_messages: int
    consumed: int
    b_messages: int
    b_partitions_used: int


def check_moved(session, table: bool = False) -> MoveCheck:
    """Assert the resharding invariants on an open (recovered) database.

    - ``a`` is as produced: each source in one partition, seq_nos increasing;
    - exactly once: the messages of ``b`` are exactly the messages of ``a``
      below consumer ``mover``'s committed offsets, each once (nothing lost,
      nothing duplicated, nothing published without its offset move);
    - every message kept its message_group_id, and each group lies in one
      partition of ``b``;
    - order: within each partition of ``b``, the messages of one source are in
      increasing seq_no order. (A source's messages are read in offset order,
      moved by one worker transaction after another, and published in commit
      order, re-published at recovery before any new transaction; so the order
      of a source's messages inside one ``b`` partition, and hence within each
      message group, is the source's order.)
    """
    a = topic_rows(session, "a")
    source_partition: dict[int, int] = {}
    last_seq: dict[int, int] = {}
    position: dict[tuple[int, int], tuple[int, int]] = {}
    for row in a:
        source, seq, user = parse(row["data"])
        assert row["message_group_id"] == user, row
        assert source_partition.setdefault(source, row["partition"]) == row["partition"], row
        assert seq > last_seq.get(source, 0), f"a: s{source}:{seq} out of order"
        last_seq[source] = seq
        position[(source, seq)] = (row["partition"], row["offset"])
    committed = committed_offsets(session, "mover")
    expected = {m for m, (p, offset) in position.items() if offset < committed.get(p, 0)}
    b = topic_rows(session, "b")
    seen: dict[tuple[int, int], tuple[int, int]] = {}
    group_partition: dict[str, int] = {}
    last_in_partition: dict[tuple[int, int], int] = {}
    for row in b:
        source, seq, user = parse(row["data"])
        here = (row["partition"], row["offset"])
        earlier = seen.get((source, seq))
        assert earlier is None, f"s{source}:{seq} in b twice: at {earlier} and {here}"
        seen[(source, seq)] = here
        assert row["message_group_id"] == user, row
        assert group_partition.setdefault(user, row["partition"]) == row["partition"], (
            f"group {user} in b partitions {group_partition[user]} and {row['partition']}"
        )
        key = (row["partition"], source)
        assert seq > last_in_partition.get(key, 0), (
            f"b partition {row['partition']}: s{source}:{seq} at offset {row['offset']} after "
            f"s{source}:{last_in_partition[key]}"
        )
        last_in_partition[key] = seq
    if table:  # mode mix: the messages moved into table ``moved`` count as moved too
        rows = session.execute("SELECT data, message_group_id FROM moved")[-1].table
        assert rows is not None
        for row in rows.to_pylist():
            source, seq, user = parse(row["data"])
            earlier = seen.get((source, seq))
            assert earlier is None, f"s{source}:{seq} moved twice: at {earlier} and in moved"
            seen[(source, seq)] = (-1, -1)
            assert row["message_group_id"] == user, row
    missing = sorted(expected - seen.keys())
    extra = sorted(seen.keys() - expected)
    assert not missing, f"{len(missing)} consumed messages missing from b, e.g. {missing[:5]}"
    assert not extra, f"{len(extra)} messages in b beyond the committed offsets, e.g. {extra[:5]}"
    return MoveCheck(len(a), len(expected), len(b), len(set(group_partition.values())))


def check_counted(session) -> int:
    """Assert ``counts`` equals, per key, the messages of ``a`` below ``counter``'s offsets."""
    a = topic_rows(session, "a")
    committed = committed_offsets(session, "counter")
    expected = Counter(
        r["message_group_id"] for r in a if r["offset"] < committed.get(r["partition"], 0)
    )
    result = session.execute("SELECT k, n FROM counts")[-1]
    assert result.table is not None
    counted = {r["k"]: r["n"] for r in result.table.to_pylist()}
    assert counted == dict(expected), (
        f"counts {sorted(counted.items())} != consumed {sorted(expected.items())}"
    )
    return sum(expected.values())


def check_totals(session) -> MoveCheck:
    """``check_moved``, and the totals (mode ``delta``) add up to ``b``'s messages: every
    committed move's count was added once, none of an uncommitted one."""
    found = check_moved(session)
    result = session.execute("SELECT coalesce(sum(n), 0) AS n FROM totals")[-1]
    assert result.table is not None
    total = result.table.to_pylist()[0]["n"]
    assert total == found.b_messages, f"totals add up to {total}, b holds {found.b_messages}"
    return found


def run_delta_loop(session, rng: random.Random, low: int, high: int) -> int:
    """Mode ``delta``: move, add the count to ``totals`` (sometimes read it back in the
    same transaction), commit; until a read finds nothing. Returns commits."""
    commits = 0
    while True:
        k = rng.randint(low, high)
        try:
            session.execute("BEGIN")
            result = session.execute(MOVE.format(k=k))[-1]
            if result.tag == "INSERT 0 0":
                session.execute("ROLLBACK")
                return commits
            moved = int(result.tag.rsplit(" ", 1)[1])
            session.execute(ADD_TOTAL, [f"w{rng.randrange(TOTAL_KEYS)}", moved])
            if rng.random() < 0.2:
                session.execute("SELECT sum(n) FROM totals")
            session.execute("COMMIT")
            commits += 1
        except SerializationFailure:
            session.execute("ROLLBACK")


def a_totals(session) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for row in topic_rows(session, "a"):
        totals[row["message_group_id"]] += 1
    return dict(totals)


# -- the worker ---------------------------------------------------------------------------
def run_loop(
    session, statement: str | tuple[str, ...], rng: random.Random, low: int, high: int
) -> int:
    """Run transactions of ``statement`` (of one of them, at random) until one finds
    nothing to read; returns commits."""
    commits = 0
    choices = (statement,) if isinstance(statement, str) else statement
    while True:
        k = rng.randint(low, high)
        chosen = rng.choice(choices)
        try:
            session.execute("BEGIN")
            result = session.execute(chosen.format(k=k))[-1]
            if result.tag == "INSERT 0 0":  # nothing left to read
                session.execute("ROLLBACK")
                return commits
            session.execute("COMMIT")
            commits += 1
        except SerializationFailure:
            session.execute("ROLLBACK")  # no-op when COMMIT already ended it


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--mode", choices=("move", "count", "mix", "delta", "open"), required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-messages", type=int, default=1)
    parser.add_argument("--max-messages", type=int, default=20)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    args = parser.parse_args(argv)
    if args.checkpoint_every:
        commit_module.CHECKPOINT_TRANSACTIONS = args.checkpoint_every
    commits = 0
    try:
        os.write(1, b"opening\n")
        database = Database.open(args.data)
        session: Session = database.connect()
        os.write(1, b"ready\n")
        rng = random.Random(args.seed)
        bounds = (args.min_messages, args.max_messages)
        if args.mode == "move":
            commits = run_loop(session, MOVE, rng, *bounds)
        elif args.mode == "count":
            commits = run_loop(session, COUNT, rng, *bounds)
        elif args.mode == "mix":
            commits = run_loop(session, (MOVE, MOVE_TO_TABLE), rng, *bounds)
        elif args.mode == "delta":
            commits = run_delta_loop(session, rng, *bounds)
        session.close()
        database.close()
    except BaseException:
        sys.stderr.write(traceback.format_exc())
        sys.stderr.flush()
        os._exit(3)
    # The failpoint module counts the hits of armed failpoints only; a test reads them here.
    hits = json.dumps(dict(failpoints._hits), separators=(",", ":"))
    os.write(1, f"done commits={commits} failpoints={hits}\n".encode())
    return 0


# -- the fork server ------------------------------------------------------------------------
def serve() -> int:
    """Start workers by ``fork`` from this process, which has imported everything.

    A cold start costs about a second of imports (DuckDB, Arrow, the grammar); a
    forked worker starts in milliseconds, so a crash loop spends its time
    crashing. Single-threaded, so forking is safe. Commands, one JSON object a
    line on stdin:

    - ``{"run": [args...], "failpoints": "...", "stderr": "path"}``: fork a worker
      running ``main(args)`` with those failpoints armed (what the environment
      variable would do at import) and its stderr in that file; prints
      ``started <pid>``;
    - ``{"kill": true}``: SIGKILL the running worker (only while it is not reaped,
      so its pid cannot belong to another process yet).

    The worker's own lines (``opening``, ``ready``, ``done``) share stdout; when
    it ends this prints ``exit <code>`` (``-9`` for SIGKILL, 137 for a failpoint
    crash). End of stdin kills a running worker and ends the server.
    """
    child: int | None = None
    pending = b""
    while True:
        if child is not None:
            pid, status = os.waitpid(child, os.WNOHANG)
            if pid:
                os.write(1, f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                child = None
        ready, _, _ = select.select([0], [], [], 0.005)
        if not ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            if child is not None:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
            return 0
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            command = json.loads(line)
            if "kill" in command:
                if child is not None:
                    os.kill(child, signal.SIGKILL)
                continue
            assert child is None, "one worker at a time"
            child = os.fork()
            if child == 0:
                _forked_worker(command)
            os.write(1, f"started {child}\n".encode())


def _forked_worker(command: dict) -> None:
    """In the forked child: set up stderr and failpoints, run ``main``, never return."""
    code = 3
    try:
        fd = os.open(command["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        failpoints.activate(command.get("failpoints", ""))
        code = main(command["run"])
    except BaseException:
        sys.stderr.write(traceback.format_exc())
        sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        sys.exit(serve())
    sys.exit(main())
