"""One chaos workload process, and the observation of a recovered database.

``tests.sim.chaos`` forks a worker per cycle from its own process, which has imported
Topicbase, DuckDB and pyarrow once (``run_worker``): a cycle pays for opening the
database (recovery), not for an interpreter. The worker opens the database, records
what it observes after recovery (``observe``), tells the runner it is ready, then runs
a random workload until it is killed (SIGKILL at a random moment, or a failpoint
crashing it) or its time is up. Every acknowledged effect is recorded in the shared
history file (see ``tests.sim.history``) before the next one:

- producer writes to ``src`` with producer ids and seq_nos (exactly-once
  publish), and writes without a producer id (no dedup), with RETURNING;
- *wide* statements (``Worker.produce_wide``): one autocommit INSERT with rows of
  several producers (``WIDE_PRODUCERS``) into the topic ``wide`` (``WIDE_PARTITIONS``
  partitions), recorded as producer writes: it spreads over at least 4 partitions, so
  it commits through the staging log (``engine.spread_append``), or, with the store's
  ledger on (``TOPICBASE_LEDGER=1``, the ledger-on lane), through the topic's ledger;
- *mover* transactions: read ``src`` with consumer ``mover`` and write each
  message's value to ``dst`` as ``m:<value>@<txn id>`` (exactly-once resharding:
  the runner checks every consumed value arrives once). Half of them touch no
  table (committed by a commit record in the staging log, ``engine.commit``); the
  other half also insert a row into ``move_notes`` (committed through DuckDB), so
  both kinds of commit interleave on consumer ``mover``. A third of the moves (txn ids
  ``C…``) add their count to ``move_counts`` by a counter upsert (kept as a counter delta,
  ``engine.deltas``: committed in the log record, applied by the background applier;
  one in five of them reads the table back, so its deltas run the DuckDB way); each
  observation records the table's sum (a ``counter`` event), which the runner compares
  with the ``C…`` moves' messages in ``dst``;
- *moves by reference* (``Worker.move_ref``): in an explicit transaction, ``INSERT INTO
  TOPIC dst (data) SELECT data FROM TOPIC <source> WITH (consumer = ..., partition =
  p, ...)``, once or twice, which the topic-only commit commits by reference to the
  ranges read (``engine.moved_refs``: no staged copy; recovery derives the messages from
  the source). The source is ``src`` (consumer ``mover``, beside the copying moves), the
  retention topic (consumer ``reaper``; half of them race a retention pass whose
  checkpoint came before the COMMIT, so only the committer's pin keeps the range), the
  split topic, a topic of its own dropped right after the COMMIT, or ``dst`` itself
  (consumer ``chainer``, into ``chain``: a source published by a transaction, maybe
  unsynced). Such a message's data is its source's, so the history names a ``dst``
  message moved by reference ``<data>@R<created_at>`` (``dst_value``: the statement's
  time, one per move). The worker checks that each one really went by reference (the
  write's ``moved`` ranges, ``Committer.moved_shares`` after COMMIT), that a second
  session sees none of it before COMMIT, and, in a power-cut cycle, may cut the power
  right after one (before any checkpoint: recovery derives it);
- *tabler* transactions: read ``dst`` with consumer ``tabler`` and append
  ``x:<value>#<txn id>`` to rows of the table ``lists`` (list-append keys
  ``r:<row>``), reading two rows too (recorded as summaries: count, digest and
  tail, see ``history.summary_read_op``); the runner checks every consumed message
  lands in the table exactly once. The rows in use change every
  ``ROW_GENERATION_CYCLES`` cycles (``rows_of``), as Elle rotates its keys, so that a
  row's list, and the cost of appending to it, stay bounded in a long run;
- *retention* on the topic ``aged`` (``AGED_SEGMENT_BYTES`` segments, a
  ``AGED_RETENTION_BYTES`` size budget per partition, important consumer ``reaper``):
  writes without a producer id, autocommit reads by ``reaper`` (``read`` events), and
  retention passes on this one topic (``storage.cleaner.apply_retention`` with the
  engine's guards, ``engine.retention.ImportantConsumersGuard``, which protects what
  important consumers have not committed, inside ``CheckpointedGuard``, which keeps
  frames of transactions not yet checkpointed), each followed by an observation of the topic with
  its log starts (``final`` with ``start``) and the consumers' committed offsets;
  the failpoint ``retention.before_delete`` lies in such a pass;
- *idle retention* on the topic ``idle`` (``IDLE_PARTITIONS`` partitions, a 1 s
  ``retention_period``, important consumer ``keeper``): in ordinary cycles, writes
  without a producer id and autocommit reads by ``keeper`` (``idle``); every
  ``IDLE_CYCLE_EVERY``-th cycle (``idle_cycle``) is an *idle cycle*: the worker writes
  nothing at all, ``keeper`` reads (and commits) a random part of the backlog, and
  retention passes run on the idle topic (``run_idle``): once all of a partition has
  expired and ``keeper`` committed it, the pass rolls the active segment and deletes
  it, which is where the runner's kills and the failpoints ``retention.before_roll``,
  ``segment.roll_*``, ``retention.after_roll`` and ``retention.before_delete`` land.
  Each pass checks that nothing it deleted was younger than the retention period, and
  is followed by an observation of the topic with its log starts;
- *automatic splits* on the topic ``fork<g>`` (``fork_of``: a new one every
  ``FORK_GENERATION_CYCLES`` cycles, the previous one dropped, which keeps its
  partition count bounded; autopartitioning ``scale_up`` with a 1 s stabilization
  window and a low write speed, ``FORK_SETTINGS``): writes without a producer id, and
  at most one split per worker driven by load: the worker writes one message group
  above its partition's up threshold (``FORK_GROUP_BYTES`` a write, throttled to the
  write speed) until the partition splits by itself (``TopicLog._after_write``, where
  ``split.after_child``, ``split.before_save`` and ``split.after_save`` lie), recorded
  as ``split`` invoke (parent and the children ids it will get) / ok and followed by a
  ``lineage`` observation. Keyless writes stay far below the threshold, so no other
  split comes first. The src/dst workload stays off split topics.

A transaction logs an ``invoke`` with its planned ops before COMMIT; if the
process dies there, the runner turns it into an ``info`` transaction.

Observations are incremental (``observe``): the runner passes, per key, the length and
digest of the previous observation and the offset after it (``Known.observed``). A
worker, right after recovery, reads each topic partition only from that offset on and
records just the new values (a *tail* observation; a partition that now ends below it
is read and recorded whole), reads the table rows whole and records the values after
the known ones when those still have the known digest (else the whole row), and
records every committed offset. The runner's observer at each check reads everything
and records the same way with digests, which verifies what the tails did not read.
Keys that did not change are not recorded again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from engine.database import Database
from engine.moved_refs import MovedRange
from engine.retention import CheckpointedGuard, ImportantConsumersGuard, checkpointed_ends
from storage.cleaner import apply_retention
from storage.errors import SerializationFailure, TopicbaseError
from storage.fs import DEFAULT_FILE_SYSTEM, FileSystem
from storage.limits import READ_BYTES_MAX, READ_MESSAGES_MAX
from storage.topic_log import TopicLog
from tests.sim.faulty_fs import FaultyFileSystem
from tests.sim.history import (
    HistoryWriter,
    ListDigest,
    append_op,
    joined_list,
    read_op,
    row_key,
    summary_read_op,
    topic_key,
)

PRODUCERS = ("p0", "p1", "p2", "p3")
ROW_NAMES = ("a", "b", "c", "d", "e")
ROW_GENERATION_CYCLES = 50
WIDE = "wide"  # spread statements (``produce_wide``): the ledger's topic when it is on
WIDE_PARTITIONS = 6
WIDE_PRODUCERS = tuple(f"w{n}" for n in range(8))  # bound round robin: all 6 partitions
TOPICS = ("src", "dst", "chain", WIDE)
PARTITIONS = 3  # of each of ``TOPICS`` but ``WIDE``
SEGMENT_BYTES = 64 * 1024
AGED = "aged"  # the retention topic
AGED_PARTITIONS = 2
AGED_SEGMENT_BYTES = 1024  # the minimum: about one insert per segment
AGED_RETENTION_BYTES = 4096
REAPER = "reaper"  # important consumer of AGED
FORK_GENERATION_CYCLES = 5
FORK_PARTITIONS_MAX = 1 + 2 * FORK_GENERATION_CYCLES  # one split per cycle at most
# Autopartitioning of the split topics: 2000 B/s, splits above 50 % for a whole second.
FORK_SETTINGS = (
    "min_active_partitions = 1, auto_partitioning_strategy = 'scale_up', "
    f"max_active_partitions = {1 + FORK_GENERATION_CYCLES}, "
    "auto_partitioning_up_utilization_percent = 50, "
    "auto_partitioning_stabilization_window = Interval('PT1S'), "
    "partition_write_speed_bytes_per_second = 2000"
)
FORK_GROUP_BYTES = 300  # one driving write: above 1000 B/s at a few writes a second
FORK_DRIVE_S = 3.0  # the longest a worker drives one split
IDLE = "idle"  # the idle retention topic
IDLE_PARTITIONS = 2
IDLE_RETENTION_US = 1_000_000  # its retention_period, PT1S
KEEPER = "keeper"  # important consumer of IDLE
IDLE_CYCLE_EVERY = 5
IDLE_PASS_PAUSE_S = 0.05
MOVER = "mover"  # consumer of src (and of the split topics) whose reads are moved to dst
DST = "dst"
MOVED_MAX = 20  # messages a move reads at most
DROPPED = "gone"  # prefix of the topics a move by reference reads once, then drops
CHAIN = "chain"  # where moves by reference from dst (consumer ``chainer``) go
CHAINER = "chainer"


def dst_value(value: str, created_us: int, topic: str = "dst") -> str:
    """How a ``dst`` (or ``CHAIN``) message is recorded in the history: a copying move
    wrote a value of its own (``m:<value>@<txn id>``); a move by reference wrote the
    source message's data unchanged, so it is told apart by its ``created_at`` (the move
    statement's time, ``moved_refs.MovedSource.at_us``, one per statement):
    ``<value>@R<created_at us>``. Only moves by reference write to ``CHAIN``."""
    if topic == DST and value.startswith("m:"):
        return value
    return f"{value}@R{created_us}"


def moved_origin(value: str) -> str:
    """The source message's value of a ``dst`` value (either kind of move)."""
    return value.removeprefix("m:").rsplit("@", 1)[0]


def idle_cycle(cycle: int) -> bool:
    """Whether the workload of ``cycle`` (1-based) is an idle cycle (see the module doc)."""
    return cycle % IDLE_CYCLE_EVERY == 0


def fork_of(cycle: int) -> str:
    """The split topic the workload of ``cycle`` (1-based) uses."""
    return f"fork{(cycle - 1) // FORK_GENERATION_CYCLES}"


def rows_of(cycle: int) -> tuple[str, ...]:
    """The table rows the workload of ``cycle`` (1-based) appends to and reads."""
    generation = (cycle - 1) // ROW_GENERATION_CYCLES
    return tuple(f"{name}{generation}" for name in ROW_NAMES)


@dataclass(frozen=True)
class Observed:
    """A key as last observed: how many values, their digest, and (topic keys) the
    offset after the last one."""

    count: int
    digest: str
    end: int


@dataclass
class Known:
    """What the runner knows from the history so far, handed to a forked process.

    ``seq_nos``: the largest seq_no each producer has used (continue above it);
    ``observed``: per key, its last observation (rebuilt from the increments).
    """

    seq_nos: dict[str, int] = field(default_factory=dict)
    observed: dict[str, Observed] = field(default_factory=dict)


def setup(data_dir: str) -> None:
    """Create the topics and the table (idempotent).

    The topics get ``SEGMENT_BYTES`` segments (through the storage API: SQL has no such
    setting), so that segments roll during a run (the roll failpoints fire) and
    recovery, which verifies the active segment frame by frame, stays cheap however
    long the run."""
    db = Database.open(data_dir)
    session = db.connect()
    try:
        session.execute(
            "CREATE TOPIC IF NOT EXISTS src (CONSUMER mover WITH (important = true)) "
            f"WITH (min_active_partitions = {PARTITIONS});"
            "CREATE TOPIC IF NOT EXISTS dst (CONSUMER tabler WITH (important = true), "
            f"CONSUMER {CHAINER}) WITH (min_active_partitions = {PARTITIONS});"
            f"CREATE TOPIC IF NOT EXISTS {CHAIN} WITH (min_active_partitions = {PARTITIONS});"
            f"CREATE TOPIC IF NOT EXISTS {WIDE} WITH (min_active_partitions = {WIDE_PARTITIONS});"
            "CREATE TABLE IF NOT EXISTS lists (k VARCHAR PRIMARY KEY, v VARCHAR);"
            "CREATE TABLE IF NOT EXISTS move_notes (t VARCHAR);"
            "CREATE TABLE IF NOT EXISTS move_counts (k VARCHAR PRIMARY KEY, n BIGINT NOT NULL);"
            f"CREATE TOPIC IF NOT EXISTS {AGED} (CONSUMER {REAPER} WITH (important = true)) "
            f"WITH (min_active_partitions = {AGED_PARTITIONS});"
            f"CREATE TOPIC IF NOT EXISTS {fork_of(1)} (CONSUMER {MOVER}) WITH ({FORK_SETTINGS});"
            f"CREATE TOPIC IF NOT EXISTS {IDLE} (CONSUMER {KEEPER} WITH (important = true)) "
            f"WITH (min_active_partitions = {IDLE_PARTITIONS}, "
            "retention_period = Interval('PT1S'))"
        )
        for topic in TOPICS:
            log = db.topic_log(db.catalog.entry(topic).topic_id)
            log.alter(dataclasses.replace(log.config, segment_bytes=SEGMENT_BYTES))
        log = _topic_log(db, AGED)
        log.alter(
            dataclasses.replace(
                log.config, segment_bytes=AGED_SEGMENT_BYTES, retention_bytes=AGED_RETENTION_BYTES
            )
        )
    finally:
        session.close()
        db.close()


# -- observation ------------------------------------------------------------------------------
def _topic_log(db: Database, topic: str) -> TopicLog:
    entry = db.catalog.entry(topic)
    if entry is None:
        raise RuntimeError(f"topic {topic} does not exist")
    return db.topic_log(entry.topic_id)


def observe(
    db: Database, session, history: HistoryWriter, known: dict[str, Observed], full: bool
) -> None:
    """Record the state: the topic partitions (values and offsets), every row of
    ``lists`` (and every row observed before, empty if it is gone now), and every
    committed offset; each key only if it changed since ``known``. The retention
    topic is read whole, with its log starts (``observe_aged``); the split topics are
    read whole (as with ``full``: they live ``FORK_GENERATION_CYCLES`` cycles), and
    each one's partition metadata is recorded (``lineage``).

    ``full``: read every partition whole, and record only the values after the known
    ones if the known ones are intact (their digest), else everything. Not ``full``
    (after each recovery): read a partition only from the known end on (a tail
    observation, which says nothing about what came before; cheap), unless it ended
    below it, then whole. Rows are read whole either way (the rows in use are short).
    """
    ends = {
        (r["topic"], r["partition"]): r["end_offset"]
        for r in session.execute("SELECT topic, partition, end_offset FROM sys.partitions")[
            0
        ].table.to_pylist()
    }
    forks = sorted({t for t, _ in ends if t.startswith("fork")})
    for topic in (*TOPICS, *forks):
        expected = (
            () if topic not in TOPICS else range(WIDE_PARTITIONS if topic == WIDE else PARTITIONS)
        )
        partitions = sorted({p for t, p in ends if t == topic} | set(expected))
        whole = full or topic not in TOPICS  # a split topic is small: verified every time
        if whole:
            read = _read_topic(session, topic, None, 0)
        for partition in partitions:
            key = topic_key(topic, partition)
            previous = known.get(key)
            end = ends.get((topic, partition), 0)
            if whole:
                offsets, values = read.get(partition, ([], []))
                _record(history, key, values, offsets, previous)
            elif previous is None or end < previous.end:
                offsets, values = _read_topic(session, topic, partition, 0).get(partition, ([], []))
                _record(history, key, values, offsets, None)
            elif end > previous.end:
                offsets, values = _read_topic(session, topic, partition, previous.end).get(
                    partition, ([], [])
                )
                history.final(
                    key, values, offsets, base=previous.count, count=previous.count + len(values)
                )
    rows = session.execute("SELECT k, v FROM lists")[0].table.to_pylist()
    found = {row_key(r["k"]): joined_list(r["v"]) for r in rows}
    for key in sorted(set(found) | {k for k in known if k.startswith("r:")}):
        _record(history, key, found.get(key, []), None, known.get(key))
    consumers = session.execute(
        "SELECT topic, consumer, partition, important, committed_offset FROM sys.consumers"
    )[0].table.to_pylist()
    for row in consumers:
        history.offsets(
            row["topic"],
            row["consumer"],
            row["partition"],
            row["committed_offset"] or 0,
            important=row["important"],
        )
    counted = session.execute("SELECT coalesce(sum(n), 0) AS n FROM move_counts")[0]
    history.record("counter", key="move_counts", value=int(counted.table.to_pylist()[0]["n"]))
    observe_aged(session, history, known)
    observe_aged(session, history, known, IDLE)
    for topic in forks:
        history.lineage(topic, lineage_of(_topic_log(db, topic)))


def lineage_of(log: TopicLog) -> list[tuple[int, bool, tuple[int, ...], int | None]]:
    """(id, active, children, parent) of each partition of a ``TopicLog``."""
    infos = (log.partition_info(p) for p in log.partition_ids())
    return [(i.partition_id, i.active, i.children, i.parent) for i in infos]


def observe_aged(
    session, history: HistoryWriter, known: dict[str, Observed], topic: str = AGED
) -> None:
    """Record each partition of a retention topic (``AGED`` or ``IDLE``) whole, with its
    log start (``start``), if it changed since ``known`` (which is updated). Whole reads
    stay cheap: retention keeps the topic small."""
    starts = {
        r["partition"]: r["start_offset"]
        for r in session.execute(
            f"SELECT partition, start_offset FROM sys.partitions WHERE topic = '{topic}'"
        )[0].table.to_pylist()
    }
    read = _read_topic(session, topic, None, 0)
    for partition, start in sorted(starts.items()):
        key = topic_key(topic, partition)
        offsets, values = read.get(partition, ([], []))
        digest = ListDigest(values).hexdigest()
        now = Observed(len(values), digest, offsets[-1] + 1 if offsets else start)
        if known.get(key) == now:
            continue
        history.final(key, values, offsets, start, count=len(values), digest=digest)
        known[key] = now


def _read_topic(
    session, topic: str, partition: int | None, start: int
) -> dict[int, tuple[list[int], list]]:
    """partition -> (offsets, values) of ``topic`` (one partition, from ``start``)."""
    options = f"max_messages = {READ_MESSAGES_MAX}, max_bytes = {READ_BYTES_MAX}"
    if partition is not None:
        options += f", partition = {partition}, from_offset = {start}"
    table = session.execute(
        f'SELECT partition, "offset", CAST(data AS VARCHAR) AS v, created_at FROM TOPIC {topic} '
        f'WITH ({options}) ORDER BY partition, "offset"'
    )[0].table
    if table.num_rows >= READ_MESSAGES_MAX:
        raise RuntimeError(f"topic {topic} too large to observe in one read")
    read: dict[int, tuple[list[int], list]] = {}
    columns = zip(
        table.column("partition").to_pylist(),
        table.column("offset").to_pylist(),
        _values_of(table, topic),
        strict=True,
    )
    for p, offset, value in columns:
        offsets, values = read.setdefault(p, ([], []))
        offsets.append(offset)
        values.append(value)
    return read


def _values_of(table, topic: str) -> list:
    """The column ``v`` of a read of ``topic`` (with ``created_at``) as the history
    records it (``dst_value`` for ``dst``)."""
    values = table.column("v").to_pylist()
    if topic not in (DST, CHAIN):
        return values
    created = table.column("created_at").cast(pa.int64()).to_pylist()
    return [dst_value(v, us, topic) for v, us in zip(values, created, strict=True)]


def _record(
    history: HistoryWriter,
    key: str,
    values: list,
    offsets: list[int] | None,
    previous: Observed | None,
) -> None:
    """One ``final`` event (none if nothing changed): only the values after
    ``previous`` if its values are intact (their digest), else all of them."""
    base = previous.count if previous is not None and previous.count <= len(values) else 0
    digest = ListDigest(values[:base])
    base_digest = digest.hexdigest()
    if previous is None or base != previous.count or base_digest != previous.digest:
        digest.update(values[base:])
        history.final(key, values, offsets, count=len(values), digest=digest.hexdigest())
        return
    if base == len(values):
        return  # unchanged
    digest.update(values[base:])
    history.final(
        key,
        values[base:],
        None if offsets is None else offsets[base:],
        base=base,
        base_digest=base_digest,
        count=len(values),
        digest=digest.hexdigest(),
    )


def observe_database(
    data_dir: str, history_path: str, known: dict[str, Observed], full: bool = True
) -> None:
    """Recover (open) the database, record what it holds (see ``observe``), close it."""
    db = Database.open(data_dir)
    session = db.connect()
    try:
        with HistoryWriter(history_path, "observer") as history:
            observe(db, session, history, dict(known), full)
    finally:
        session.close()
        db.close()


def warm_up() -> None:
    """Run setup, an observation and some workload on a throwaway database, so that this
    process has imported and initialised everything (the SQL parser, DuckDB, pyarrow,
    pandas...) before it forks workers; the database is closed again, and DuckDB's
    threads end with it (the runner checks)."""
    with tempfile.TemporaryDirectory(prefix="topicbase-warm-up-") as scratch:
        data_dir, history_path = f"{scratch}/data", f"{scratch}/history.jsonl"
        setup(data_dir)
        known = Known()
        run_worker(data_dir, history_path, 1, 0, 0.3, known, lambda: None)
        observe_database(data_dir, history_path, known.observed)


# -- the workload -----------------------------------------------------------------------------
def run_worker(
    data_dir: str,
    history_path: str,
    cycle: int,
    seed: int,
    seconds: float,
    known: Known,
    ready: Callable[[], None],
    fs: FileSystem = DEFAULT_FILE_SYSTEM,
) -> None:
    """Open (recover), observe, call ``ready``, run the workload for ``seconds``.
    ``fs``: the file layer the database runs on (a power-cut cycle passes a
    ``FaultyFileSystem``)."""
    db = Database.open(data_dir, fs=fs)
    session = db.connect()
    with HistoryWriter(history_path, f"worker-{cycle}") as history:
        observed = dict(known.observed)
        observe(db, session, history, observed, full=False)
        ready()
        worker = Worker(db, session, history, cycle, seed, dict(known.seq_nos), observed)
        worker.power = fs if isinstance(fs, FaultyFileSystem) else None
        worker.run(seconds)
    session.close()
    db.close()


class Worker:
    def __init__(
        self,
        db: Database,
        session,
        history: HistoryWriter,
        cycle: int,
        seed: int,
        seq_nos: dict[str, int],
        observed: dict[str, Observed],
    ) -> None:
        self.db = db
        self.observed = observed  # the aged topic as last recorded (``observe_aged``)
        self.fork = fork_of(cycle)
        self.split_tried = False
        self.rng = random.Random(seed)
        self.cycle = cycle
        self.rows = rows_of(cycle)
        self.history = history
        self.seq_nos = seq_nos
        self.counter = 0
        self.session = session
        self.peer = None  # a second session, opened when needed (``_peer``)
        # A power-cut cycle's file system: ``move_ref`` may cut the power itself.
        self.power: FaultyFileSystem | None = None

    def run(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        self.next_fork()
        actions = (
            self.produce,
            self.produce,
            self.produce_wide,
            self.write_plain,
            self.move,
            self.move_ref,
            self.move_ref,
            self.tabulate,
            self.age,
            self.reap,
            self.expire,
            self.write_fork,
            self.split,
            self.idle,
        )
        try:
            if idle_cycle(self.cycle):
                self.run_idle(deadline)
                return
            while time.monotonic() < deadline:
                self.rng.choice(actions)()
        finally:
            if self.peer is not None:
                self.peer.close()

    def _value(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.cycle}.{self.counter}"

    # -- producers ------------------------------------------------------------------------
    def produce(self) -> None:
        producer = self.rng.choice(PRODUCERS)
        count = self.rng.randint(1, 5)
        rows = []
        for _ in range(count):
            seq_no = self.seq_nos.get(producer, 0) + self.rng.randint(1, 2)  # gaps allowed
            self.seq_nos[producer] = seq_no
            rows.append((producer, seq_no))
            self.history.invoke("src", producer, seq_no)
        self._insert_acked("src", rows)

    def produce_wide(self) -> None:
        """One statement of 1-2 rows from each of 4-8 of ``WIDE_PRODUCERS`` into ``WIDE``
        (a spread statement: see the module doc), acknowledged row by row."""
        producers = self.rng.sample(WIDE_PRODUCERS, self.rng.randint(4, len(WIDE_PRODUCERS)))
        rows = []
        for producer in producers:
            for _ in range(self.rng.randint(1, 2)):
                seq_no = self.seq_nos.get(producer, 0) + self.rng.randint(1, 2)
                self.seq_nos[producer] = seq_no
                rows.append((producer, seq_no))
                self.history.invoke(WIDE, producer, seq_no)
        self._insert_acked(WIDE, rows)

    def _insert_acked(self, topic: str, rows: list[tuple[str, int]]) -> None:
        """One INSERT of ``rows`` (producer, seq_no) into ``topic``, each acknowledged with
        the partition, offset and status its RETURNING row gives."""
        values = ", ".join(f"('{p}:{s}', '{p}', {s})" for p, s in rows)
        result = self.session.execute(
            f"INSERT INTO TOPIC {topic} (data, producer_id, seq_no) VALUES {values} "
            'RETURNING partition, "offset", status'
        )[0]
        for (producer, seq_no), row in zip(rows, result.table.to_pylist(), strict=True):
            offset = row["offset"] if row["offset"] >= 0 else None
            self.history.ack(
                topic, producer, seq_no, row["partition"], offset, status=row["status"]
            )

    def write_plain(self) -> None:
        value = self._value("np")
        self.history.invoke("src", None, None, value=value)
        result = self.session.execute(
            f"INSERT INTO TOPIC src (data) VALUES ('{value}') RETURNING partition, \"offset\""
        )[0]
        row = result.table.to_pylist()[0]
        self.history.ack("src", None, None, row["partition"], row["offset"], value=value)

    def _write_values(self, topic: str, prefix: str) -> None:
        """1-3 writes without a producer id to ``topic``, recorded as producer writes."""
        values = [self._value(prefix) for _ in range(self.rng.randint(1, 3))]
        for value in values:
            self.history.invoke(topic, None, None, value=value)
        rows = ", ".join(f"('{v}')" for v in values)
        result = self.session.execute(
            f'INSERT INTO TOPIC {topic} (data) VALUES {rows} RETURNING partition, "offset"'
        )[0]
        for value, row in zip(values, result.table.to_pylist(), strict=True):
            self.history.ack(topic, None, None, row["partition"], row["offset"], value=value)

    # -- retention -------------------------------------------------------------------------
    def age(self) -> None:
        self._write_values(AGED, "g")

    def reap(self) -> None:
        """An autocommit read by the important consumer (its offsets commit with it)."""
        read = self.session.execute(
            'SELECT partition, "offset", CAST(data AS VARCHAR) AS v FROM TOPIC '
            f"{AGED} WITH (consumer = '{REAPER}', max_messages = {self.rng.randint(1, 12)})"
        )[0].table.to_pylist()
        by_partition: dict[int, list[dict]] = {}
        for row in read:
            by_partition.setdefault(row["partition"], []).append(row)
        for partition, rows in sorted(by_partition.items()):
            offsets, values = [r["offset"] for r in rows], [r["v"] for r in rows]
            self.history.read(AGED, REAPER, partition, offsets, values)

    def idle(self) -> None:
        """Ordinary cycles: a few writes to the idle topic, or a read by ``keeper``."""
        if self.rng.random() < 0.6:
            self._write_values(IDLE, "i")
        else:
            self._consume(IDLE, KEEPER, self.rng.randint(1, 8))

    def _consume(self, topic: str, consumer: str, limit: int) -> None:
        """An autocommit read by ``consumer``, recorded as ``read`` events."""
        read = self.session.execute(
            'SELECT partition, "offset", CAST(data AS VARCHAR) AS v FROM TOPIC '
            f"{topic} WITH (consumer = '{consumer}', max_messages = {limit})"
        )[0].table.to_pylist()
        by_partition: dict[int, list[dict]] = {}
        for row in read:
            by_partition.setdefault(row["partition"], []).append(row)
        for partition, rows in sorted(by_partition.items()):
            offsets, values = [r["offset"] for r in rows], [r["v"] for r in rows]
            self.history.read(topic, consumer, partition, offsets, values)

    def run_idle(self, deadline: float) -> None:
        """An idle cycle: no writes; ``keeper`` takes a random part of its backlog (all
        of it two times in three), then retention passes on the idle topic until the end."""
        self._consume(IDLE, KEEPER, self.rng.choice((2, 100, 100)))
        while time.monotonic() < deadline:
            self.idle_pass()
            time.sleep(IDLE_PASS_PAUSE_S)

    def _guard(self) -> CheckpointedGuard:
        """The engine's retention guard, as its pass builds it: the consumers' floors and
        the checkpoint's (no frame of a transaction not yet checkpointed goes)."""
        return CheckpointedGuard(ImportantConsumersGuard(self.db), checkpointed_ends(self.db))

    def idle_pass(self) -> None:
        """One retention pass over the idle topic (under the commit lock, as the engine
        runs it), checked: a message it deleted must have been written more than the
        retention period before the pass ended. Then an observation of the topic."""
        before = self.session.execute(
            'SELECT partition, "offset", written_at FROM TOPIC '
            f"{IDLE} WITH (max_messages = {READ_MESSAGES_MAX})"
        )[0].table.to_pylist()
        log = _topic_log(self.db, IDLE)
        guard = self._guard()
        with self.db.commit_lock:
            apply_retention(log, guard, self.db.clock.now_us())
        ended_us = self.db.clock.now_us()
        starts = {p: log.partition(p).start_offset for p in log.partition_ids()}
        for row in before:
            written_us = int(row["written_at"].timestamp() * 1_000_000)
            gone = row["offset"] < starts[row["partition"]]
            if gone and written_us >= ended_us - IDLE_RETENTION_US:
                raise AssertionError(f"retention deleted {row} before it expired")
        observe_aged(self.session, self.history, self.observed, IDLE)
        for row in self.session.execute(
            "SELECT consumer, partition, important, committed_offset FROM sys.consumers "
            f"WHERE topic = '{IDLE}'"
        )[0].table.to_pylist():
            committed = row["committed_offset"] or 0
            self.history.offsets(
                IDLE, row["consumer"], row["partition"], committed, important=row["important"]
            )

    def expire(self) -> None:
        """A retention pass over the aged topic, then an observation of it (log starts
        and the committed offsets retention had to respect)."""
        log = _topic_log(self.db, AGED)
        apply_retention(log, self._guard(), self.db.clock.now_us())
        self._observe_aged()

    def _observe_aged(self) -> None:
        """An observation of the aged topic and its consumers' committed offsets."""
        observe_aged(self.session, self.history, self.observed)
        consumers = self.session.execute(
            "SELECT consumer, partition, important, committed_offset FROM sys.consumers "
            f"WHERE topic = '{AGED}'"
        )[0].table.to_pylist()
        for row in consumers:
            committed = row["committed_offset"] or 0
            self.history.offsets(
                AGED, row["consumer"], row["partition"], committed, important=row["important"]
            )

    # -- splits ------------------------------------------------------------------------------
    def next_fork(self) -> None:
        """Create this cycle's split topic, drop the earlier generations' (observed at
        this worker's recovery, so their last observation is their final state)."""
        for entry in self.db.catalog.entries():
            stale_fork = entry.name.startswith("fork") and entry.name != self.fork
            if stale_fork or entry.name.startswith(DROPPED):  # (left by a crash before its DROP)
                self.session.execute(f"DROP TOPIC IF EXISTS {entry.name}")
        self.session.execute(
            f"CREATE TOPIC IF NOT EXISTS {self.fork} (CONSUMER {MOVER}) WITH ({FORK_SETTINGS})"
        )

    def write_fork(self) -> None:
        self._write_values(self.fork, "f")

    def split(self) -> None:
        """Drive one automatic split of the split topic (once per worker): write one
        message group above its partition's up threshold until that partition splits."""
        if self.split_tried:
            return
        self.split_tried = True
        log = _topic_log(self.db, self.fork)
        if not log.autopartitioning.splits or len(log.partition_ids()) + 2 > FORK_PARTITIONS_MAX:
            return
        group = f"g{self.rng.randint(0, 999)}"
        parent = log.partition_for_key(group)
        children = (log.next_partition_id, log.next_partition_id + 1)
        self.history.split(self.fork, parent, children, "invoke")
        deadline = time.monotonic() + FORK_DRIVE_S
        while log.partition_info(parent).active and time.monotonic() < deadline:
            value = self._value("f") + ":" + "x" * FORK_GROUP_BYTES
            self.history.invoke(self.fork, None, None, value=value)
            row = self.session.execute(
                f"INSERT INTO TOPIC {self.fork} (data, message_group_id) VALUES "
                f"('{value}', '{group}') RETURNING partition, \"offset\""
            )[0].table.to_pylist()[0]
            self.history.ack(self.fork, None, None, row["partition"], row["offset"], value=value)
            time.sleep(0.02)
        if not log.partition_info(parent).active:
            assert log.partition_info(parent).children == children
            self.history.split(self.fork, parent, children, "ok")
        self.history.lineage(self.fork, lineage_of(log))

    # -- transactions ----------------------------------------------------------------------
    def move(self) -> None:
        limit = self.rng.randint(1, 20)
        kind = self.rng.random()
        counted = kind < 1 / 3  # adds its count to move_counts (a counter delta)
        txn_id = self._value("C" if counted else "T")
        self.session.execute("BEGIN")
        try:
            read = self.session.execute(
                'SELECT partition, "offset", CAST(data AS VARCHAR) AS v FROM TOPIC src '
                f"WITH (consumer = 'mover', max_messages = {limit})"
            )[0].table.to_pylist()
            ops = _topic_reads("src", read, limit)
            # Unique per transaction: a move retried after an abort is another write.
            moved = [f"m:{row['v']}@{txn_id}" for row in read]
            # Two statements when there are two values or more: keyless rows route one
            # statement to one partition (round-robin), so the commit usually publishes
            # to two partitions and passes commit.mid_publish.
            half = (len(moved) + 1) // 2
            for part in (moved[:half], moved[half:]):
                if part:
                    values = ", ".join(f"('{v}')" for v in part)
                    self.session.execute(f"INSERT INTO TOPIC dst (data) VALUES {values}")
            ops += [append_op(topic_key("dst"), v) for v in moved]
            if counted and moved:
                self.session.execute(
                    "INSERT INTO move_counts VALUES (?, ?) ON CONFLICT (k) DO UPDATE "
                    "SET n = n + EXCLUDED.n",
                    [f"w{self.rng.randrange(3)}", len(moved)],
                )
                if self.rng.random() < 0.2:  # its deltas then run the DuckDB way
                    self.session.execute("SELECT sum(n) FROM move_counts")
            elif kind > 2 / 3:  # a table write: this one commits through DuckDB
                self.session.execute("INSERT INTO move_notes VALUES (?)", [txn_id])
            self._commit(txn_id, ops)
        except TopicbaseError:
            self._abort(txn_id)

    def move_ref(self) -> None:
        """A move that goes by reference (``engine.moved_refs``): in an explicit
        transaction, ``INSERT INTO TOPIC dst (data) SELECT data FROM TOPIC <source> WITH
        (consumer = ..., partition = p, max_messages = n)``, one or two such statements
        (two partitions of the source: two shares of ``dst``, so a crash may land
        between their publishes). Only the data is projected and the read is of one
        partition, so the write is ``moved_batch`` of the ranges read and the topic-only
        commit names them in its record instead of staging a copy. The source is ``src``
        (consumer ``mover``, shared with the copying moves), the retention topic
        ``AGED`` (consumer ``reaper``: retention may delete the moved range right after
        COMMIT, and the committer's pins must keep it until a checkpoint passes the
        record), this cycle's split topic (consumer ``mover``), or a topic of its own
        (``DROPPED``) that it fills, moves and drops right after the COMMIT, while the
        ranges are pinned (DROP checkpoints first, or the record would name a source
        that is gone). A power-cut cycle may cut the power right after such a move,
        before any checkpoint, so that recovery derives the moved messages.

        What was moved is read first without a consumer (the same offsets), and the
        engine's by-reference bookkeeping is checked against it: the statement's write
        must carry its source ranges (``PendingWrite.moved``), and an ``ok`` COMMIT must
        have committed a share by reference (``Committer.moved_shares``), so the move
        cannot silently become a copy. Before COMMIT, a second session checks that none
        of the moved messages is visible in ``dst`` yet."""
        roll = self.rng.random()
        once = f"{DROPPED}{self.cycle}x{self.counter}"
        source, consumer = (
            ("src", MOVER) if roll < 0.35 else (AGED, REAPER) if roll < 0.6
            else (self.fork, MOVER) if roll < 0.75 else (once, MOVER) if roll < 0.85
            else (DST, CHAINER)
        )  # fmt: skip
        target = CHAIN if source == DST else DST
        dropped = source.startswith(DROPPED)
        if dropped:  # a source of its own, dropped right after the COMMIT, while pinned
            self.session.execute(f"CREATE TOPIC {source} (CONSUMER {MOVER})")
            for _ in range(self.rng.randint(1, 4)):
                self._write_values(source, "d")
        if source == AGED:  # a backlog (``reap`` drains the topic): a move of many segments
            for _ in range(self.rng.randint(4, 12)):
                self.age()
        log = _topic_log(self.db, source)
        ids = log.partition_ids()
        chosen = self.rng.sample(ids, min(len(ids), self.rng.choice((1, 1, 2))))
        committed = {
            r["partition"]: r["committed_offset"]
            for r in self.session.execute(
                "SELECT partition, committed_offset FROM sys.consumers "
                f"WHERE topic = '{source}' AND consumer = '{consumer}'"
            )[0].table.to_pylist()
        }
        target_end = self._end(self.session, target)
        txn_id = self._value("R")
        shares = self.db.committer.moved_shares
        # Half the moves from AGED race a retention pass that took its checkpoint and
        # floors before the COMMIT and deletes after it (as the engine's pass may, from
        # another thread): what keeps the moved range then is the committer's pin alone.
        racing = self._guard() if source == AGED and self.rng.random() < 0.5 else None
        ops: list = []
        events: list[tuple[int, list[int], list[str]]] = []  # the AGED reads
        moved = 0
        self.session.execute("BEGIN")
        try:
            for partition in chosen:
                limit = self.rng.randint(1, MOVED_MAX)
                start = max(committed.get(partition) or 0, log.partition(partition).start_offset)
                peek = self.session.execute(
                    f'SELECT "offset", CAST(data AS VARCHAR) AS v, created_at FROM TOPIC '
                    f"{source} WITH (partition = {partition}, from_offset = {start}, "
                    f"max_messages = {limit})"
                )[0].table
                tag = self.session.execute(
                    f"INSERT INTO TOPIC {target} (data) SELECT data FROM TOPIC {source} WITH "
                    f"(consumer = '{consumer}', partition = {partition}, max_messages = {limit})"
                )[0].tag
                count = int(tag.split()[-1])
                if count == 0:
                    continue  # nothing there (or a split child whose parent is unread)
                assert count == peek.num_rows, (source, partition, start, count, peek)
                write = self.session.transaction.writes[-1]
                expected = (MovedRange(log.topic_id, partition, start, start + count),)
                assert write.moved is not None and write.moved.ranges == expected, (
                    f"the move of {source}/{partition}@{start}+{count} does not go by "
                    f"reference: {write.moved}"
                )
                data = peek.column("v").to_pylist()  # what goes to the target
                values = _values_of(peek, source)  # the read, as the history names it
                offsets = peek.column("offset").to_pylist()
                assert offsets == list(range(start, start + count)), offsets
                if source == AGED:  # recorded as consumer reads: retention may expire them
                    events.append((partition, offsets, values))
                else:
                    ops.append(read_op(topic_key(source, partition), values, start, count < limit))
                at_us = write.moved.at_us
                ops += [append_op(topic_key(target), dst_value(v, at_us, target)) for v in data]
                moved += count
            if moved:
                assert self._end(self._peer(), target) == target_end, "visible before COMMIT"
            status = self._commit(txn_id, ops)
        except TopicbaseError:
            self._abort(txn_id)
            return
        for partition, offsets, values in events:
            self.history.read(AGED, REAPER, partition, offsets, values, committed=status == "ok")
        if status == "ok" and moved:
            assert self.db.committer.moved_shares > shares, (
                f"txn {txn_id} moved {moved} messages by copy, not by reference"
            )
        if racing is not None:  # the moved range may expire now: its pin must keep it
            with self.db.commit_lock:
                apply_retention(log, racing, self.db.clock.now_us())
            self._observe_aged()
        if dropped:  # DROP of a pinned source checkpoints first: the record must not need it
            self.session.execute(f"DROP TOPIC {source}")
        if (
            self.power is not None
            and moved
            and self.rng.random() < (0.5 if racing or dropped else 0.05)
        ):
            # Before any checkpoint: the moved frames in dst were never synced, so
            # recovery derives them from the source ranges (which must still be there).
            self.power.cut_power_and_exit(partial_writeback=self.rng.random() < 0.5)

    def _end(self, session, topic: str) -> int:
        """The sum of ``topic``'s partitions' end offsets."""
        rows = session.execute(
            f"SELECT coalesce(sum(end_offset), 0) AS n FROM sys.partitions WHERE topic = '{topic}'"
        )[0].table.to_pylist()
        return int(rows[0]["n"])

    def _peer(self):
        """A second session of the database (for what others see meanwhile)."""
        if self.peer is None:
            self.peer = self.db.connect()
        return self.peer

    def tabulate(self) -> None:
        limit = self.rng.randint(1, 10)
        txn_id = self._value("T")
        self.session.execute("BEGIN")
        try:
            table = self.session.execute(
                'SELECT partition, "offset", CAST(data AS VARCHAR) AS v, created_at FROM TOPIC '
                f"dst WITH (consumer = 'tabler', max_messages = {limit})"
            )[0].table
            read = [
                {"partition": p, "offset": o, "v": v}
                for p, o, v in zip(
                    table.column("partition").to_pylist(),
                    table.column("offset").to_pylist(),
                    _values_of(table, DST),
                    strict=True,
                )
            ]
            ops = _topic_reads("dst", read, limit)
            for row in read:
                key = self.rng.choice(self.rows)
                value = f"x:{row['v']}#{txn_id}"  # unique per transaction
                self.session.execute(
                    "INSERT INTO lists VALUES (?, ?) ON CONFLICT (k) DO UPDATE "
                    "SET v = lists.v || ',' || EXCLUDED.v",
                    [key, value],
                )
                ops.append(append_op(row_key(key), value))
            for key in self.rng.sample(self.rows, 2):
                found = self.session.execute("SELECT v FROM lists WHERE k = ?", [key])[0]
                rows = found.table.to_pylist()
                ops.append(
                    summary_read_op(row_key(key), joined_list(rows[0]["v"] if rows else None))
                )
            self._commit(txn_id, ops)
        except TopicbaseError:
            self._abort(txn_id)

    def _commit(self, txn_id: str, ops: list) -> str:
        """COMMIT and record the outcome, returned: ok, fail (40001) or info (any other
        error: the commit point may have been passed)."""
        self.history.record("invoke", id=txn_id, ops=ops)
        try:
            tag = self.session.execute("COMMIT")[0].tag
        except SerializationFailure:
            self.history.txn(txn_id, "fail", ops)
            return "fail"
        except TopicbaseError:
            self.history.txn(txn_id, "info", ops)
            return "info"
        status = "ok" if tag == "COMMIT" else "fail"
        self.history.txn(txn_id, status, ops)
        return status

    def _abort(self, txn_id: str) -> None:
        """A statement before COMMIT failed: nothing of the transaction happened."""
        with contextlib.suppress(TopicbaseError):
            self.session.execute("ROLLBACK")
        self.history.txn(txn_id, "fail", [])


def _topic_reads(topic: str, rows: list[dict], limit: int) -> list:
    """One consumer-read op per partition read, with its start offset."""
    by_partition: dict[int, list[dict]] = {}
    for row in rows:
        by_partition.setdefault(row["partition"], []).append(row)
    complete = len(rows) < limit
    return [
        read_op(topic_key(topic, p), [r["v"] for r in part], part[0]["offset"], complete)
        for p, part in sorted(by_partition.items())
    ]
