"""The history checker of the crash-consistency harness: pure Python over a history.

API: ``check(events, *, allowed=DEFAULT_ALLOWED, limit=100) -> Report`` takes the
events of a history (``history.load(path)``; the format is described in
``tests/sim/history.py``); ``check_file(path, **options)`` loads and checks. A
``Report`` has ``violations`` and ``allowed`` (anomalies found of an allowed kind),
lists of ``Violation(kind, message, events, indices, cycle)`` (the message names the
events as ``#index (process)``), ``counts`` (every anomaly found per kind, also past
``limit`` kept per kind), ``stats``, ``ok``, ``kinds`` and ``summary()``, and the
final state it rebuilt: ``final`` (key -> values), ``final_offsets`` and
``committed`` (the last observed committed offset per (topic, consumer,
partition)). It imports nothing from Topicbase. The collector is paused while it
runs (the history's read lists would be rescanned over and over); ~50k events take
about a second.

Observations (``final`` events) may be incremental (``base``/``base_digest``, see
``history``): each is rebuilt from the previous observation of its key. An increment
whose ``base`` values are all of the previous observation extends it in place (the
previous one is then a prefix of it, so comparing it with the last observation is
implied), so per-cycle observations cost the checker O(new values), not O(state).
An increment whose ``base_digest`` is not the digest of the previous observation's
first ``base`` values is a **state-regression**; ``count``/``digest`` that disagree
with the rebuilt list are **malformed**. A *tail* increment (no ``base_digest``: the
observer did not read the first ``base`` values) is appended as it is; the next
observation with a digest, or a full one, covers what it did not read.

Whole-list reads may be *summaries* (count, digest, tail): the digests of all the
prefixes the summaries need are computed in one streaming pass per key, and a summary
whose digest is that of the version order's prefix of its length is then checked
exactly like the list it stands for (G1a, G1b, wr and rw edges); one that is not is a
**read-mismatch** (or **G1a** if its tail holds a failed txn's append; an aborted
value earlier in the list shows as a read-mismatch, which is a violation too).

What it verifies (``KINDS`` lists the kinds):

- **lost-write**: every acknowledged producer write is in the final state (its value
  in some final key), and every ``ok`` transaction has its appends there. Only keys
  with a ``final`` event are checked; a key whose final ``start`` > 0 (retention)
  excuses values that may have expired.
- **duplicate**: no value appears twice in the final state (in one key or across
  keys), except a no-deduplication (producer null) write, which has no such promise.
  **misplaced-write**: a value found away from its acknowledged partition/offset,
  or a txn append found in another key than the one it named.
  **producer-order**: in each topic partition a dedup producer's seq_nos increase.
  **unknown-value**: a final value nobody in the history wrote (garbage).
  **state-regression**: an earlier ``final`` observation of a key disagrees with the
  last one (a topic or row lost or changed data between recoveries).
- **offset-gap**: the offsets of each final topic partition are dense, from ``start``
  (0 by default), when the final event lists them.
- **torn-txn** / **aborted-visible**: all-or-nothing per transaction, over the
  appends whose key has a final state: ``ok`` = all present (none present is
  reported as ``lost-write``), ``fail`` = none present, ``info`` = all or none.
- **read-mismatch**: a read disagrees with the final state: a txn read must equal the
  final list at its offsets (a prefix for a whole-list read), a consumer ``read``
  event must find its (offset, value) pairs in the final partition.
  **double-consume**: two committed ``read`` events of one consumer returned the same
  offset of a partition. (Reads inside transactions carry no consumer; double
  consumption by them shows as duplicates downstream.)
- **committed-offset-backwards** / **-past-end**: per (topic, consumer, partition)
  the observed committed offsets, in history order, never decrease, and never
  exceed the end of the final partition.
- Retention (a ``final`` with ``start``: the partition's log start then; below it
  messages may be gone, at and above it nothing may be lost, duplicated or out of
  place, and offsets are dense from it): **log-start-backwards**: the ``start`` of
  the full observations of a key, in history order, never decreases (an expired
  prefix never comes back); **retention-past-committed**: no ``start`` lies above the
  committed offset of an important consumer (``offsets`` with ``important``) of that
  partition, as first observed after it (offsets never move backwards, so that bounds
  what the consumer had committed when retention ran). A read event's pairs below the
  final ``start`` are not compared (they may have expired).
- Splits (``split`` and ``lineage`` events): **torn-split**: in an observed lineage a
  split partition is neither entirely before its latest split (active, no children)
  nor entirely after it (inactive with exactly its children, all present), or an
  inactive partition has no children or names a child that is not there, or a child
  whose recorded parent is another partition; **lost-split**: a split
  acknowledged (``ok``) or once observed done is seen undone later.
- **G1a** (aborted read): no read (by a committed txn or a ``read`` event) returns a
  value appended by a ``fail`` transaction.
  **G1b** (intermediate read): a complete read (not stopped by a message limit) never
  ends inside another txn T's appends to the key, i.e. returns some of T's appends
  but not the last of them in the final list. Its head may start inside T's appends
  (a consumer's committed offset may lie there). Checked for reads that agree with
  the final state (the others are ``read-mismatch``); reads of committed txns only.
- **G0 / G1c / G2-item**: an Elle-style dependency graph over the committed
  transactions (``ok``, and ``info`` ones with an append in the final state):
  *ww* between consecutive transaction appends of each final list (appends by
  producers, which are not nodes, are skipped over), *wr* from the writer of the
  last element a read returned to the reader, *rw* from a complete read to the
  writer of the first element after what it returned. Cycles are found by an
  iterative Tarjan SCC pass plus a BFS inside the component (no recursion, linear
  apart from the per-component BFS): **G0** = a cycle of ww edges, **G1c** = a
  cycle of ww/wr edges through a wr-only edge, **G2-item** = a cycle through an
  rw-only edge. One cycle is reported per component and class, with the txn ids and
  edges (``T1 -wr(r:x)-> T2 ...``) in the message. G-single (exactly one rw) is not
  told apart from G2-item.

Which kinds count as violations is configurable (``allowed``); the default follows
README's isolation statement: dirty writes (G0), aborted reads (G1a), intermediate
reads (G1b) and G1c are excluded, so they are violations; G2-item is reported in
``Report.allowed`` but not a violation, since tables give snapshot isolation (write
skew allowed), two statements of a transaction may see different cuts of the topics,
and appends to a topic partition never conflict (a txn that read a partition and
then appended to it commits after a concurrent append: a ww+rw cycle by design).
Double consumption of topic keys is excluded by the engine's offset validation, not
by anything the graph checks; it shows as ``duplicate`` in the output topics.

Version order: per key, the last ``final`` list; a key without one takes the longest
whole-list read of a committed txn (then only reads are checked against it).

Not covered: real-time order (no ``time`` is used, so stale reads are not found),
predicates (G-single/G2 over ranges), reads of failed/unknown-outcome txns, what was
read from a partition before a retention ``start``, keys that no ``final`` event
shows (no lost-write/atomicity check on them), an observation order of ``offsets``
events taken by concurrent observers, a torn txn's missing last append (torn-txn
is reported, not G1b), a change below a tail observation that is undone before the
next observation with a digest, and summarised reads of keys without a ``final``
(nothing to compare their digest with). Written values must be JSON scalars, unique across the
history (a reused one is ``malformed``); read values are compared as given.
"""

from __future__ import annotations

import gc
import json
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from .history import TXN_STATUSES, ListDigest, load, producer_value

WW, WR, RW = 1, 2, 4
_EDGE_NAME = {WW: "ww", WR: "wr", RW: "rw"}
_SCALARS = frozenset({str, int, float, bool, type(None)})
_CYCLE_SHOWN = 40  # edges of a cycle spelled out in a message

KINDS: dict[str, str] = {
    "malformed": "the history breaks its format (a missing field, a value written twice)",
    "lost-write": "an acknowledged write or a committed txn's appends missing from the final state",
    "duplicate": "a value present more than once in the final state",
    "misplaced-write": "a value found away from the partition/offset it was acknowledged at",
    "producer-order": "a dedup producer's seq_nos not increasing along a partition",
    "unknown-value": "a final value nobody in the history wrote",
    "state-regression": "an earlier final observation of a key disagrees with the last one",
    "offset-gap": "offsets of a final topic partition not dense",
    "torn-txn": "some but not all of a transaction's appends in the final state",
    "aborted-visible": "a failed transaction's append in the final state",
    "read-mismatch": "a read disagrees with the final state",
    "double-consume": "two committed reads of one consumer returned the same offset",
    "committed-offset-backwards": "an observed committed offset smaller than an earlier one",
    "committed-offset-past-end": "a committed offset past the end of the final partition",
    "log-start-backwards": "a partition's observed log start smaller than an earlier one",
    "retention-past-committed": "a log start above an important consumer's committed offset",
    "torn-split": "partition metadata neither entirely before nor entirely after a split",
    "lost-split": "a split acknowledged or observed done, then observed undone",
    "G0": "write cycle (dirty write): a cycle of ww dependencies",
    "G1a": "aborted read: a read returned a failed transaction's append",
    "G1b": "intermediate read: a read returned some but not the last of a txn's appends",
    "G1c": "circular information flow: a cycle of ww/wr dependencies with a wr edge",
    "G2-item": "anti-dependency cycle: a dependency cycle with an rw edge",
}
DEFAULT_ALLOWED = frozenset({"G2-item"})


# -- results --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Violation:
    kind: str
    message: str
    events: tuple[Mapping[str, Any], ...] = ()
    indices: tuple[int, ...] = ()  # positions of ``events`` in the history
    cycle: tuple[Any, ...] = ()  # txn ids of a G0/G1c/G2-item cycle

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    allowed: list[Violation] = field(default_factory=list)  # found, but not violations
    counts: Counter[str] = field(default_factory=Counter)  # all found per kind (past limit too)
    stats: dict[str, int] = field(default_factory=dict)
    # The final state the checker rebuilt (incremental observations merged): per key its
    # values and (topic keys) offsets; the last observed committed offset per
    # (topic, consumer, partition).
    final: dict[str, list] = field(default_factory=dict)
    final_offsets: dict[str, list[int] | None] = field(default_factory=dict)
    committed: dict[tuple[str, str, int], int] = field(default_factory=dict)
    # The last observed value of each counter (``counter`` events: a table's sum).
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def kinds(self) -> set[str]:
        """Kinds of the violations (not of the allowed anomalies)."""
        return {v.kind for v in self.violations}

    def summary(self, limit: int = 20) -> str:
        lines = [
            "history: " + ", ".join(f"{name} {count}" for name, count in sorted(self.stats.items()))
        ]
        if self.ok:
            lines.append("no violations")
        for v in self.violations[:limit]:
            lines.append(f"VIOLATION {v}")
        if len(self.violations) > limit:
            lines.append(f"... {len(self.violations) - limit} more violations")
        for v in self.allowed[:limit]:
            lines.append(f"allowed {v}")
        lines.append("counts: " + json.dumps(dict(sorted(self.counts.items()))))
        return "\n".join(lines)


def check(
    history: Iterable[Mapping[str, Any]],
    *,
    allowed: Iterable[str] = DEFAULT_ALLOWED,
    limit: int = 100,
) -> Report:
    """Check a history; ``allowed`` kinds are reported in ``Report.allowed`` only.

    At most ``limit`` violations of each kind are kept (``Report.counts`` has them all).
    """
    events = list(history)
    # The checker makes no reference cycles; the collector would only rescan the history's
    # (possibly huge) read lists again and again.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _Checker(events, frozenset(allowed), limit).run()
    finally:
        if collecting:
            gc.enable()


def check_file(path: str | Path, **options: Any) -> Report:
    return check(load(path), **options)


# -- internal records -----------------------------------------------------------------------
@dataclass(slots=True, eq=False)
class _Prod:
    topic: str
    producer: str | None
    seq_no: int | None
    first: int  # event index of the first invoke/ack
    acks: list[tuple[int, int | None, int | None]] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class _Read:
    key: str
    values: list | None
    start: int
    complete: bool
    index: int
    summary: tuple[int, str, list] | None = None  # (count, digest, tail) of a summarised read


@dataclass(slots=True, eq=False)
class _Txn:
    index: int
    id: Any
    status: str
    appends: list[list] = field(default_factory=list)  # [key, value]
    reads: list[_Read] = field(default_factory=list)
    committed: bool = False
    node: int = -1


@dataclass(slots=True, eq=False)
class _KeyIndex:
    """Per key of the version order: who wrote each position, and derived lookups."""

    at: list[int]  # node of the committed txn that wrote each position, -1 for none
    aborted: list[int]  # positions holding a failed txn's append (sorted)
    cover: dict[int, _Txn]  # boundary p -> a txn with appends both before p and at/after p
    nxt: list[int] | None = None  # nxt[p]: first position >= p with at[] >= 0, else len
    prv: list[int] | None = None  # prv[p]: last position <= p with at[] >= 0, else -1


@dataclass(slots=True, eq=False)
class _Final:
    """One observation of a key (incremental ones are merged into it: it owns its lists)."""

    key: str
    values: list
    offsets: list[int] | None
    start: int
    index: int
    positions: dict[int, int] | None = None
    digest: ListDigest | None = None  # streaming digest of values[:digest.count]

    def prefix_digest(self, n: int) -> str:
        """``list_digest(values[:n])``; streams forward, so increasing ``n`` costs O(new)."""
        digest = self.digest
        if digest is None or digest.count > n:
            fresh = ListDigest(self.values[:n])
            if digest is None:
                self.digest = fresh
            return fresh.hexdigest()
        digest.update(self.values[digest.count : n])
        return digest.hexdigest()

    @property
    def end(self) -> int:
        if self.offsets:
            return self.offsets[-1] + 1
        return self.start + len(self.values)

    def offset_at(self, pos: int) -> int:
        return self.offsets[pos] if self.offsets is not None else self.start + pos

    def position(self, offset: int) -> int | None:
        """Index in ``values`` of ``offset`` (``len(values)`` for the end), or None."""
        if self.offsets is not None:
            if self.positions is None:
                self.positions = {o: i for i, o in enumerate(self.offsets)}
            pos = self.positions.get(offset)
            if pos is None and offset == self.end:
                return len(self.values)
            return pos
        pos = offset - self.start
        return pos if 0 <= pos <= len(self.values) else None


def _values(values: Any, scalars: bool = False) -> list:
    """A list of values; ``scalars``: check that each is a JSON scalar (values keyed on)."""
    if not isinstance(values, list):
        raise TypeError(f"values must be a list, not {type(values).__name__}")
    if scalars and not _SCALARS.issuperset(map(type, values)):
        bad = next(v for v in values if type(v) not in _SCALARS)
        raise TypeError(f"a written value must be a JSON scalar, not {_short(bad)}")
    return values


def _summary(summary: Mapping) -> tuple[int, str, list]:
    """(count, digest, tail) of a summarised read op."""
    count, digest = summary["count"], summary["digest"]
    tail = _values(summary.get("tail") or [])
    if type(count) is not int or count < len(tail) or not isinstance(digest, str):
        raise ValueError(f"bad read summary {_short(dict(summary))}")
    return count, digest, tail


def split_topic_key(key: str) -> tuple[str, int | None] | None:
    """(topic, partition or None) of a ``t:`` key; None for another key."""
    if not key.startswith("t:"):
        return None
    rest = key[2:]
    head, _, tail = rest.rpartition("/")
    if head and tail.isdigit():
        return head, int(tail)
    return rest, None


def _topic_key(topic: str, partition: int | None) -> str:
    return f"t:{topic}" if partition is None else f"t:{topic}/{partition}"


def _short(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


# -- Tarjan + BFS ---------------------------------------------------------------------------
def strongly_connected(succ: list[list[int]]) -> list[list[int]]:
    """Components with more than one node of the graph ``succ`` (iterative Tarjan)."""
    n = len(succ)
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    stack: list[int] = []
    components: list[list[int]] = []
    counter = 0
    for root in range(n):
        if index[root] != -1 or not succ[root]:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        work = [(root, 0)]
        while work:
            v, i = work[-1]
            edges = succ[v]
            if i < len(edges):
                work[-1] = (v, i + 1)
                w = edges[i]
                if index[w] == -1:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = True
                    work.append((w, 0))
                elif on_stack[w] and index[w] < low[v]:
                    low[v] = index[w]
                continue
            work.pop()
            if work:
                u = work[-1][0]
                if low[v] < low[u]:
                    low[u] = low[v]
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    components.append(component)
    return components


def shortest_path(
    succ: list[list[int]], source: int, target: int, inside: list[int], component: int
) -> list[int] | None:
    """Nodes of a shortest path source .. target through nodes with ``inside[n] == component``."""
    parent = {source: source}
    queue = deque([source])
    while queue:
        v = queue.popleft()
        if v == target:
            path = [v]
            while v != source:
                v = parent[v]
                path.append(v)
            path.reverse()
            return path
        for w in succ[v]:
            if w not in parent and inside[w] == component:
                parent[w] = v
                queue.append(w)
    return None


# -- the checker ----------------------------------------------------------------------------
class _Checker:
    def __init__(self, events: list, allowed: frozenset[str], limit: int) -> None:
        unknown = allowed - KINDS.keys()
        if unknown:
            raise ValueError(f"unknown anomaly kinds: {sorted(unknown)}")
        self.events = events
        self.allowed_kinds = allowed
        self.limit = limit
        self.report_ = Report()
        self.writers: dict[Any, _Prod | _Txn] = {}
        self.prods: list[_Prod] = []
        self.txns: list[_Txn] = []
        self.txn_ids: dict[Any, int] = {}
        self.reads: list[tuple[int, str, str | None, list[int], list, bool]] = []
        self.finals: dict[str, list[_Final]] = {}
        self.final: dict[str, _Final] = {}
        self.observed: dict[tuple, list[tuple[int, Any]]] = {}
        self.where: dict[Any, tuple[str, int]] = {}
        self.refs: dict[str, list] = {}
        self.topics_with_final: set[str] = set()
        self.nodes: list[_Txn] = []
        self.adj: list[dict[int, int]] = []
        self.labels: dict[tuple[int, int, int], str] = {}
        self._index: dict[str, _KeyIndex] = {}
        self.starts: dict[str, list[tuple[int, int]]] = {}  # key -> (event, log start)
        self.important: set[tuple] = set()  # (topic, consumer, partition)
        self.splits: list[tuple[int, Mapping]] = []
        self.lineages: list[tuple[int, Mapping]] = []

    # -- reporting ------------------------------------------------------------------------
    def at(self, i: int) -> str:
        event = self.events[i]
        process = event.get("process") if isinstance(event, Mapping) else None
        return f"#{i}" if process is None else f"#{i} ({process})"

    def found(
        self, kind: str, message: str, indices: Iterable[int] = (), cycle: tuple = ()
    ) -> None:
        report = self.report_
        report.counts[kind] += 1
        target = report.allowed if kind in self.allowed_kinds else report.violations
        if report.counts[kind] > self.limit:
            return
        idx = tuple(dict.fromkeys(indices))
        target.append(Violation(kind, message, tuple(self.events[i] for i in idx), idx, cycle))

    # -- the passes -----------------------------------------------------------------------
    def run(self) -> Report:
        self.ingest()
        self.check_finals()
        self.check_acks()
        self.check_txns()
        self.build_nodes()
        self.check_reads()
        self.check_committed_offsets()
        self.check_log_starts()
        self.check_splits()
        self.check_cycles()
        stats = self.report_.stats
        stats["events"] = len(self.events)
        for key, final in self.final.items():
            self.report_.final[key] = final.values
            self.report_.final_offsets[key] = final.offsets
        for triple, observations in self.observed.items():
            last = [committed for _, committed in observations if committed is not None]
            if last:
                self.report_.committed[triple] = last[-1]
        for status in TXN_STATUSES:
            stats[f"txns_{status}"] = sum(1 for t in self.txns if t.status == status)
        stats["producer_writes"] = len(self.prods)
        stats["splits_driven"] = sum(1 for _, e in self.splits if e["status"] == "invoke")
        stats["splits_done"] = sum(1 for _, e in self.splits if e["status"] == "ok")
        stats["nodes"] = len(self.nodes)
        for bit, name in _EDGE_NAME.items():
            stats[f"edges_{name}"] = sum(1 for d in self.adj for m in d.values() if m & bit)
        return self.report_

    def ingest(self) -> None:
        handlers = {
            "invoke": self.on_invoke,
            "ack": self.on_ack,
            "read": self.on_read,
            "txn": self.on_txn,
            "final": self.on_final,
            "offsets": self.on_offsets,
            "split": self.on_split,
            "lineage": self.on_lineage,
            "counter": self.on_counter,
        }
        prods: dict[Any, _Prod] = {}
        self._prod_by_value = prods
        for i, event in enumerate(self.events):
            if not isinstance(event, Mapping):
                self.found("malformed", f"#{i} is not an object: {_short(event)}", ())
                continue
            kind = event.get("type", event.get("kind"))
            handler = handlers.get(kind)
            if handler is None:
                self.found("malformed", f"{self.at(i)}: unknown event type {kind!r}", [i])
                continue
            try:
                handler(i, event)
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                self.found("malformed", f"{self.at(i)} {kind}: {type(exc).__name__} {exc}", [i])

    def writer_of(self, i: int, value: Any, writer: _Prod | _Txn) -> None:
        old = self.writers.setdefault(value, writer)
        if old is not writer:
            first = old.first if isinstance(old, _Prod) else old.index
            self.found(
                "malformed",
                f"value {_short(value)} written by two writes: {self.at(first)} and {self.at(i)}",
                [first, i],
            )

    def producer_write(self, i: int, event: Mapping) -> _Prod:
        topic = event["topic"]
        producer = event.get("producer")
        seq_no = event.get("seq_no")
        value = event.get("value")
        if value is None:
            if producer is None:
                raise ValueError("a no-deduplication write needs a value")
            value = producer_value(producer, seq_no)
        value = _values([value], True)[0]
        prod = self._prod_by_value.get(value)
        if prod is None or (prod.topic, prod.producer, prod.seq_no) != (topic, producer, seq_no):
            if prod is None:
                prod = _Prod(topic, producer, seq_no, i)
                self._prod_by_value[value] = prod
                self.prods.append(prod)
            else:
                prod = _Prod(topic, producer, seq_no, i)  # a clash: reported just below
            self.writer_of(i, value, prod)
        return prod

    def on_invoke(self, i: int, event: Mapping) -> None:
        if "topic" in event:  # a txn's invoke ({"id": ...}) is informational
            self.producer_write(i, event)

    def on_ack(self, i: int, event: Mapping) -> None:
        prod = self.producer_write(i, event)
        partition = event.get("partition")
        offset = event.get("offset")
        prod.acks.append((i, partition, offset))

    def on_read(self, i: int, event: Mapping) -> None:
        offsets = event["offsets"]
        values = _values(event["values"])
        if not isinstance(offsets, list) or len(offsets) != len(values):
            raise ValueError("offsets and values of a read differ in length")
        key = _topic_key(event["topic"], event["partition"])
        self.reads.append(
            (
                i,
                key,
                event.get("consumer"),
                offsets,
                values,
                event.get("committed", True) is not False,
            )
        )

    def on_txn(self, i: int, event: Mapping) -> None:
        txn_id = event["id"]
        status = event["status"]
        if status not in TXN_STATUSES:
            raise ValueError(f"status {status!r} is not one of {TXN_STATUSES}")
        ops = event["ops"]
        if not isinstance(ops, list):
            raise TypeError("ops must be a list")
        try:
            hash(txn_id)
        except TypeError:
            txn_id = json.dumps(txn_id)
        if txn_id in self.txn_ids:
            first = self.txns[self.txn_ids[txn_id]].index
            self.found(
                "malformed",
                f"txn id {txn_id!r} used twice: {self.at(first)} and {self.at(i)}",
                [first, i],
            )
            return
        txn = _Txn(i, txn_id, status)
        mine: set = set()
        for op in ops:  # validate every op before any value is registered
            name = op[0]
            key = op[1]
            if not isinstance(key, str):
                raise TypeError(f"key must be a string: {key!r}")
            if name in ("append", "a", ":append"):
                value = _values([op[2]], True)[0]
                if value in mine:
                    raise ValueError(f"txn appends {_short(value)} twice")
                mine.add(value)
                txn.appends.append([key, value])
            elif name in ("read", "r", ":r"):
                if isinstance(op[2], dict):
                    if len(op) > 3:
                        raise ValueError("a summarised read is a read of a whole list")
                    txn.reads.append(_Read(key, None, 0, True, i, _summary(op[2])))
                    continue
                values = None if op[2] is None else _values(op[2])
                start = op[3] if len(op) > 3 and op[3] is not None else 0
                complete = bool(op[4]) if len(op) > 4 else True
                txn.reads.append(_Read(key, values, int(start), complete, i))
            else:
                raise ValueError(f"unknown op {name!r}")
        for _, value in txn.appends:
            self.writer_of(i, value, txn)
        self.txn_ids[txn_id] = len(self.txns)
        self.txns.append(txn)

    def on_final(self, i: int, event: Mapping) -> None:
        key = event["key"]
        values = _values(event.get("values") or [], True)
        offsets = event.get("offsets")
        if offsets is not None and (not isinstance(offsets, list) or len(offsets) != len(values)):
            raise ValueError("offsets and values of a final differ in length")
        start = event.get("start")
        observations = self.finals.get(key, [])
        if event.get("base") is None:
            if start is not None:
                self.starts.setdefault(key, []).append((i, int(start)))
            final = _Final(
                key,
                list(values),
                None if offsets is None else list(offsets),
                0 if start is None else int(start),
                i,
            )
            self.finals.setdefault(key, observations).append(final)
        else:
            final = self.increment(i, event, observations, values, offsets, start)
            if final is None:
                return  # its prefix differs from the previous observation (reported)
        count = event.get("count")
        if count is not None and count != len(final.values):
            raise ValueError(f"count {count!r} but {len(final.values)} values observed")
        digest = event.get("digest")
        if digest is not None and final.prefix_digest(len(final.values)) != digest:
            raise ValueError("digest differs from the digest of the values observed")

    def increment(
        self,
        i: int,
        event: Mapping,
        observations: list[_Final],
        values: list,
        offsets: list | None,
        start: Any,
    ) -> _Final | None:
        """Rebuild an incremental observation: the previous one's first ``base`` values,
        then ``values``. If those ``base`` values were all of the previous observation,
        the previous one is a prefix of this one and is extended in place (comparing it
        with the last observation is implied by comparing this one); otherwise this one
        is kept as an observation of its own and compared like a full one.

        If the observer saw other values below ``base`` (``base_digest`` is not theirs),
        that is a ``state-regression``; the observation cannot be rebuilt then, and is
        kept as its best guess (those ``base`` values and ``values``) so that later
        increments still apply; None is returned."""
        key = event["key"]
        if not observations:
            raise ValueError(f"incremental observation of {key}, never observed before")
        previous = observations[-1]
        base = event["base"]
        if type(base) is not int or not 0 <= base <= len(previous.values):
            raise ValueError(
                f"base {base!r} outside the previous observation ({len(previous.values)} values)"
            )
        if (offsets is None) != (previous.offsets is None):
            raise ValueError("offsets in only one of two observations of a key")
        if start is not None and int(start) != previous.start:
            raise ValueError("an incremental observation cannot move start")
        base_digest = event.get("base_digest")  # None: a tail, the prefix was not read
        if base_digest is not None and previous.prefix_digest(base) != base_digest:
            self.found(
                "state-regression",
                f"{key}: the first {base} values seen by {self.at(i)} are not those of "
                f"{self.at(previous.index)} (their digests differ)",
                [previous.index, i],
            )
            guess = self.rebuilt(previous, base, values, offsets, i)
            observations.append(guess)
            return None
        if base == len(previous.values):
            previous.values.extend(values)
            if previous.offsets is not None:
                previous.offsets.extend(offsets or [])
            previous.index = i
            return previous
        final = self.rebuilt(previous, base, values, offsets, i)
        observations.append(final)
        return final

    @staticmethod
    def rebuilt(previous: _Final, base: int, values: list, offsets: list | None, i: int) -> _Final:
        """``previous``'s first ``base`` values (and offsets), then ``values``."""
        return _Final(
            previous.key,
            previous.values[:base] + values,
            None if previous.offsets is None else previous.offsets[:base] + (offsets or []),
            previous.start,
            i,
        )

    def on_offsets(self, i: int, event: Mapping) -> None:
        triple = (event["topic"], event["consumer"], event["partition"])
        committed = event["committed"]
        if committed is not None and not isinstance(committed, int):
            raise TypeError(f"committed offset must be an integer: {committed!r}")
        self.observed.setdefault(triple, []).append((i, committed))
        if event.get("important"):
            self.important.add(triple)

    def on_split(self, i: int, event: Mapping) -> None:
        if event["status"] not in ("invoke", "ok"):
            raise ValueError(f"split status {event['status']!r} is not invoke or ok")
        if not isinstance(event["partition"], int) or not isinstance(event["children"], list):
            raise TypeError("a split needs a partition and a list of children")
        if not isinstance(event["topic"], str):
            raise TypeError("a split needs a topic")
        self.splits.append((i, event))

    def on_counter(self, i: int, event: Mapping) -> None:
        """``{"key", "value"}``: a counter observed after recovery (the runner checks it)."""
        self.report_.counters[str(event["key"])] = int(event["value"])

    def on_lineage(self, i: int, event: Mapping) -> None:
        partitions = event["partitions"]
        if not isinstance(partitions, list) or not all(
            isinstance(p, list) and len(p) in (3, 4) and isinstance(p[2], list) for p in partitions
        ):
            raise TypeError("lineage partitions must be [id, active, children(, parent)] lists")
        if not isinstance(event["topic"], str):
            raise TypeError("a lineage needs a topic")
        self.lineages.append((i, event))

    # -- final state ----------------------------------------------------------------------
    def check_finals(self) -> None:
        where = self.where
        extra: dict[Any, list[tuple[str, int]]] = {}
        for key, observations in self.finals.items():
            last = observations[-1]
            self.final[key] = last
            self.refs[key] = last.values
            parsed = split_topic_key(key)
            if parsed is not None:
                self.topics_with_final.add(parsed[0])
            for earlier in observations[:-1]:
                self.check_regression(earlier, last)
            if last.offsets is not None:
                self.check_dense(last)
            unknown = []
            for pos, value in enumerate(last.values):
                if value in where:
                    extra.setdefault(value, []).append((key, pos))
                else:
                    where[value] = (key, pos)
                if value not in self.writers:
                    unknown.append(pos)
            if unknown:
                shown = ", ".join(
                    f"@{last.offset_at(p)} {_short(last.values[p], 30)}" for p in unknown[:5]
                )
                self.found(
                    "unknown-value",
                    f"{key}: {len(unknown)} value(s) nobody wrote "
                    f"({shown}) in {self.at(last.index)}",
                    [last.index],
                )
        for value, more in extra.items():
            writer = self.writers.get(value)
            if isinstance(writer, _Prod) and writer.producer is None:
                continue  # no-deduplication mode: no promise
            places = [where[value], *more]
            shown = ", ".join(f"{k}@{self.final[k].offset_at(p)}" for k, p in places[:6])
            indices = [self.final[k].index for k, _ in places]
            if writer is not None:
                indices.insert(0, writer.first if isinstance(writer, _Prod) else writer.index)
            self.found(
                "duplicate",
                f"value {_short(value)} is {len(places)} times in the final state: {shown}",
                indices,
            )

    def check_regression(self, earlier: _Final, last: _Final) -> None:
        for pos, value in enumerate(earlier.values):
            offset = earlier.offset_at(pos)
            now = last.position(offset)
            if offset < last.start:
                continue  # expired since
            if now is None or now >= len(last.values) or last.values[now] != value:
                got = (
                    "nothing"
                    if now is None or now >= len(last.values)
                    else _short(last.values[now])
                )
                self.found(
                    "state-regression",
                    f"{earlier.key}@{offset} was "
                    f"{_short(value)} in {self.at(earlier.index)}, {got} in "
                    f"{self.at(last.index)}",
                    [earlier.index, last.index],
                )
                return

    def check_dense(self, final: _Final) -> None:
        offsets = final.offsets or []
        expected = final.start
        for pos, offset in enumerate(offsets):
            if offset != expected:
                self.found(
                    "offset-gap",
                    f"{final.key}: offset {offset} at position {pos}, "
                    f"expected {expected} ({len(offsets)} messages from {final.start}) "
                    f"in {self.at(final.index)}",
                    [final.index],
                )
                return
            expected += 1

    # -- producer writes ------------------------------------------------------------------
    def check_acks(self) -> None:
        where = self.where
        for value, prod in self._prod_by_value.items():
            if not prod.acks:
                continue
            i, partition, offset = next((a for a in prod.acks if a[2] is not None), prod.acks[0])
            ack_key = _topic_key(prod.topic, partition)
            loc = where.get(value)
            if loc is None:
                final = self.final.get(ack_key)
                if final is None and not (
                    partition is None and prod.topic in self.topics_with_final
                ):
                    continue  # no final state for it
                if (
                    final is not None
                    and final.start > 0
                    and (offset is None or offset < final.start)
                ):
                    continue  # may have expired
                self.found(
                    "lost-write",
                    f"acknowledged write {_short(value)} (producer "
                    f"{prod.producer!r} seq_no {prod.seq_no}, {ack_key}@{offset}, "
                    f"{self.at(i)}) is not in the final state",
                    [i],
                )
                continue
            key, pos = loc
            if partition is None:
                continue
            at = self.final[key].offset_at(pos)
            if key != ack_key or (offset is not None and at != offset):
                self.found(
                    "misplaced-write",
                    f"write {_short(value)} acknowledged at "
                    f"{ack_key}@{offset} ({self.at(i)}) is at {key}@{at}",
                    [i, self.final[key].index],
                )
        for key, final in self.final.items():
            if not key.startswith("t:"):
                continue
            last_seq: dict[str, tuple[int, int]] = {}
            reported: set[str] = set()
            for pos, value in enumerate(final.values):
                prod = self.writers.get(value)
                if not isinstance(prod, _Prod) or prod.producer is None or prod.seq_no is None:
                    continue
                before = last_seq.get(prod.producer)
                if before is not None and prod.seq_no < before[0]:
                    if prod.producer not in reported:
                        reported.add(prod.producer)
                        self.found(
                            "producer-order",
                            f"{key}: producer {prod.producer!r} "
                            f"seq_no {prod.seq_no} at offset {final.offset_at(pos)} "
                            f"after seq_no {before[0]} at offset {before[1]}",
                            [prod.first, final.index],
                        )
                    continue
                last_seq[prod.producer] = (prod.seq_no, final.offset_at(pos))

    # -- transactions: atomicity ----------------------------------------------------------
    def check_txns(self) -> None:
        where = self.where
        for txn in self.txns:
            present = absent = 0
            for pair in txn.appends:
                key, value = pair
                if self.writers.get(value) is not txn:
                    continue  # a reused value, reported as malformed
                parsed = split_topic_key(key)
                topic_level = parsed is not None and parsed[1] is None
                if topic_level:
                    assert parsed is not None
                    checkable = parsed[0] in self.topics_with_final
                else:
                    checkable = key in self.final
                loc = where.get(value)
                if loc is not None:
                    if topic_level and loc[0].startswith(key + "/"):
                        pair[0] = key = loc[0]  # the partition it went to
                    elif loc[0] != key:
                        self.found(
                            "misplaced-write",
                            f"txn {txn.id!r} ({self.at(txn.index)}) "
                            f"appended {_short(value)} to {key}, found in {loc[0]}",
                            [txn.index, self.final[loc[0]].index],
                        )
                    present += 1
                elif checkable:
                    final = self.final.get(key)
                    if final is None or final.start == 0:
                        absent += 1
            total = present + absent
            if txn.status == "ok" and absent:
                if present:
                    self.found(
                        "torn-txn",
                        f"committed txn {txn.id!r} ({self.at(txn.index)}): "
                        f"{present} of {total} appends in the final state",
                        [txn.index],
                    )
                else:
                    self.found(
                        "lost-write",
                        f"committed txn {txn.id!r} ({self.at(txn.index)}):"
                        f" none of its {total} appends in the final state",
                        [txn.index],
                    )
            elif txn.status == "fail" and present:
                self.found(
                    "aborted-visible",
                    f"failed txn {txn.id!r} ({self.at(txn.index)}): "
                    f"{present} of {total} appends in the final state",
                    [txn.index],
                )
            elif txn.status == "info" and present and absent:
                self.found(
                    "torn-txn",
                    f"txn {txn.id!r} of unknown outcome ({self.at(txn.index)})"
                    f": {present} of {total} appends in the final state",
                    [txn.index],
                )
            txn.committed = txn.status == "ok" or (txn.status == "info" and present > 0)

    def build_nodes(self) -> None:
        for txn in self.txns:
            if txn.committed:
                txn.node = len(self.nodes)
                self.nodes.append(txn)
        self.adj = [{} for _ in self.nodes]
        # Keys without a final state: the longest whole-list read stands for the version order.
        for txn in self.nodes:
            for rd in txn.reads:
                if rd.values is None or rd.start or rd.key in self.final:
                    continue
                ref = self.refs.get(rd.key)
                if ref is None or len(rd.values) > len(ref):
                    self.refs[rd.key] = rd.values
        for key in self.refs:
            previous = -1
            for node in self.key_index(key).at:
                if node >= 0:
                    if previous >= 0 and previous != node:
                        self.edge(previous, node, WW, key)
                    previous = node

    def key_index(self, key: str) -> _KeyIndex:
        index = self._index.get(key)
        if index is None:
            writers = self.writers
            at: list[int] = []
            aborted: list[int] = []
            spans: dict[_Txn, list[int]] = {}
            for p, value in enumerate(self.refs[key]):
                writer = writers.get(value)
                if type(writer) is _Txn:
                    at.append(writer.node)
                    if writer.status == "fail":
                        aborted.append(p)
                    span = spans.get(writer)
                    if span is None:
                        spans[writer] = [p, p]
                    else:
                        span[1] = p
                else:
                    at.append(-1)
            cover: dict[int, _Txn] = {}
            for writer, (first, last) in spans.items():
                for p in range(first + 1, last + 1):
                    cover.setdefault(p, writer)
            index = self._index[key] = _KeyIndex(at, aborted, cover)
        return index

    @staticmethod
    def neighbours(index: _KeyIndex) -> tuple[list[int], list[int]]:
        if index.nxt is None or index.prv is None:
            at = index.at
            size = len(at)
            nxt = [size] * (size + 1)
            prv = [-1] * size
            following = size
            for p in range(size - 1, -1, -1):
                if at[p] >= 0:
                    following = p
                nxt[p] = following
            preceding = -1
            for p in range(size):
                if at[p] >= 0:
                    preceding = p
                prv[p] = preceding
            index.nxt, index.prv = nxt, prv
        return index.nxt, index.prv

    def edge(self, u: int, v: int, bit: int, key: str) -> None:
        out = self.adj[u]
        mask = out.get(v, 0)
        if not mask & bit:
            out[v] = mask | bit
            self.labels[(u, v, bit)] = key

    def position(self, key: str, offset: int) -> int | None:
        final = self.final.get(key)
        if final is not None:
            return final.position(offset)
        ref = self.refs.get(key)
        return offset if ref is not None and 0 <= offset <= len(ref) else None

    # -- reads ----------------------------------------------------------------------------
    def check_reads(self) -> None:
        self.digest_prefixes()
        for txn in self.txns:
            if txn.committed:
                for rd in txn.reads:
                    if rd.summary is not None:
                        self.check_summary_read(txn, rd)
                    elif rd.values is not None:
                        self.check_txn_read(txn, rd)
        consumed: dict[tuple[str, str], dict[int, int]] = {}
        for i, key, consumer, offsets, values, committed in self.reads:
            self.check_read_event(i, key, offsets, values)
            if consumer is None or not committed:
                continue
            seen = consumed.setdefault((key, consumer), {})
            clash = None
            for offset in offsets:
                if offset in seen and clash is None:
                    clash = offset
                seen.setdefault(offset, i)
            if clash is not None:
                first = seen[clash]
                self.found(
                    "double-consume",
                    f"consumer {consumer!r} read {key}@{clash} in "
                    f"{self.at(first)} and again in {self.at(i)}",
                    [first, i],
                )

    def aborted_in(self, values: list, reader: _Txn | None) -> tuple[Any, _Txn] | None:
        writers = self.writers
        for value in values:
            try:
                writer = writers.get(value)
            except TypeError:  # an unhashable value nobody can have written
                continue
            if isinstance(writer, _Txn) and writer.status == "fail" and writer is not reader:
                return value, writer
        return None

    def digest_prefixes(self) -> None:
        """Digests of the prefixes of each version order that summarised reads need,
        in one streaming pass per key."""
        wanted: dict[str, set[int]] = {}
        for txn in self.txns:
            if txn.committed:
                for rd in txn.reads:
                    if rd.summary is not None and rd.key in self.refs:
                        wanted.setdefault(rd.key, set()).add(rd.summary[0])
        self.prefix_digests: dict[str, dict[int, str]] = {}
        for key, counts in wanted.items():
            ref = self.refs[key]
            digest = ListDigest()
            found = self.prefix_digests[key] = {}
            for count in sorted(counts):
                if count > len(ref):
                    break
                digest.update(ref[digest.count : count])
                found[count] = digest.hexdigest()

    def check_summary_read(self, txn: _Txn, rd: _Read) -> None:
        """A summarised whole-list read: its digest must be that of the version order's
        prefix of its length; then it is checked like the list it stands for."""
        assert rd.summary is not None
        key = rd.key
        count, digest, tail = rd.summary
        ref = self.refs.get(key)
        if ref is None:
            aborted = self.aborted_in(tail, txn)
            if aborted is not None:
                self.aborted_read(txn, key, *aborted)
            return  # nothing to compare with (a key without a final state)
        if self.prefix_digests.get(key, {}).get(count) != digest:
            aborted = self.aborted_in(tail, txn)
            if aborted is not None:
                self.aborted_read(txn, key, *aborted)
                return
            head = f"txn {txn.id!r} ({self.at(txn.index)}) read {key}"
            if count > len(ref):
                detail = f"{count} values, the final state has {len(ref)}"
            else:
                detail = f"{count} values unlike the first {count} of the final state"
                seen = ref[count - len(tail) : count]
                for n, (got, want) in enumerate(zip(tail, seen, strict=True)):
                    if got != want:
                        detail += (
                            f" (element {count - len(tail) + n} is {_short(got)}, "
                            f"the final state has {_short(want)})"
                        )
                        break
            self.found("read-mismatch", f"{head}: {detail}", [txn.index, *self.final_index(key)])
            return
        self.check_agreeing_read(txn, rd, ref, 0, count)

    def check_txn_read(self, txn: _Txn, rd: _Read) -> None:
        key, values = rd.key, rd.values
        assert values is not None
        ref = self.refs.get(key)
        start = end = 0
        if ref is not None:
            start = self.position(key, rd.start)
            end = -1 if start is None else start + len(values)
        if ref is None or start is None or ref[start:end] != values:
            aborted = self.aborted_in(values, txn)
            if aborted is not None:
                self.aborted_read(txn, key, *aborted)
            elif ref is not None:
                self.found(
                    "read-mismatch",
                    self.mismatch(txn, rd, ref, start),
                    [txn.index, *self.final_index(key)],
                )
            return
        self.check_agreeing_read(txn, rd, ref, start, end)

    def check_agreeing_read(self, txn: _Txn, rd: _Read, ref: list, start: int, end: int) -> None:
        """A read that agrees with the version order: positions start .. end - 1 of ref.
        Checks G1a and G1b and adds its wr and rw edges."""
        key = rd.key
        index = self.key_index(key)
        if index.aborted:
            first = bisect_left(index.aborted, start)
            if first < len(index.aborted) and index.aborted[first] < end:
                value = ref[index.aborted[first]]
                writer = self.writers[value]
                assert isinstance(writer, _Txn)
                self.aborted_read(txn, key, value, writer)
                return
        if rd.complete and end > start:
            writer = index.cover.get(end)
            if writer is not None and writer is not txn and writer.status != "fail":
                self.found(
                    "G1b",
                    f"txn {txn.id!r} ({self.at(txn.index)}) read {key} up to "
                    f"{_short(ref[end - 1])}, inside the appends of txn {writer.id!r} "
                    f"({self.at(writer.index)}): not {_short(ref[end])}",
                    [txn.index, writer.index],
                )
        if txn.node < 0:
            return
        reader = txn.node
        at = index.at
        nxt, prv = self.neighbours(index)
        p = prv[end - 1] if end > 0 else -1
        while p >= start and at[p] == reader:
            p = prv[p - 1] if p > 0 else -1
        if p >= start:
            self.edge(at[p], reader, WR, key)
        if rd.complete:
            p = nxt[end]
            while p < len(at) and at[p] == reader:
                p = nxt[p + 1]
            if p < len(at):
                self.edge(reader, at[p], RW, key)

    def aborted_read(self, txn: _Txn, key: str, value: Any, writer: _Txn) -> None:
        self.found(
            "G1a",
            f"txn {txn.id!r} ({self.at(txn.index)}) read {_short(value)} "
            f"from {key}, appended by failed txn {writer.id!r} ({self.at(writer.index)})",
            [txn.index, writer.index],
        )

    def final_index(self, key: str) -> list[int]:
        final = self.final.get(key)
        return [] if final is None else [final.index]

    def mismatch(self, txn: _Txn, rd: _Read, ref: list, start: int | None) -> str:
        assert rd.values is not None
        head = f"txn {txn.id!r} ({self.at(txn.index)}) read {rd.key}"
        if start is None:
            return f"{head} from offset {rd.start}, which the final state does not have"
        for n, value in enumerate(rd.values):
            p = start + n
            if p >= len(ref):
                return (
                    f"{head}: {len(rd.values)} values from {rd.start}, the final state has "
                    f"{len(ref) - start} (first extra {_short(value)})"
                )
            if ref[p] != value:
                return (
                    f"{head}: element {n} (from {rd.start}) is {_short(value)}, "
                    f"the final state has {_short(ref[p])}"
                )
        return f"{head}: differs from the final state"

    def check_read_event(self, i: int, key: str, offsets: list[int], values: list) -> None:
        final = self.final.get(key)
        if final is not None and final.start > 0 and offsets and offsets[0] < final.start:
            kept = [n for n, offset in enumerate(offsets) if offset >= final.start]
            offsets = [offsets[n] for n in kept]  # below the log start: may have expired
            values = [values[n] for n in kept]
        if final is not None and offsets:
            start = final.position(offsets[0])
            if (
                start is not None
                and offsets == list(range(offsets[0], offsets[0] + len(offsets)))
                and final.values[start : start + len(values)] == values
            ):
                index = self.key_index(key)  # agrees with the final state: only G1a is left
                first = bisect_left(index.aborted, start)
                if first < len(index.aborted) and index.aborted[first] < start + len(values):
                    value = final.values[index.aborted[first]]
                    writer = self.writers[value]
                    assert isinstance(writer, _Txn)
                    self.aborted_read_event(i, key, value, writer)
                return
        aborted = self.aborted_in(values, None)
        if aborted is not None:
            self.aborted_read_event(i, key, *aborted)
            return
        if final is None:
            return
        for offset, value in zip(offsets, values, strict=True):
            pos = final.position(offset)
            if pos is None or pos >= len(final.values) or final.values[pos] != value:
                got = (
                    "nothing"
                    if pos is None or pos >= len(final.values)
                    else _short(final.values[pos])
                )
                self.found(
                    "read-mismatch",
                    f"read {self.at(i)} of {key}@{offset} returned "
                    f"{_short(value)}, the final state has {got}",
                    [i, final.index],
                )
                return

    def aborted_read_event(self, i: int, key: str, value: Any, writer: _Txn) -> None:
        self.found(
            "G1a",
            f"read {self.at(i)} of {key} returned {_short(value)}, appended by "
            f"failed txn {writer.id!r} ({self.at(writer.index)})",
            [i, writer.index],
        )

    # -- committed offsets ----------------------------------------------------------------
    def check_committed_offsets(self) -> None:
        for (topic, consumer, partition), observations in self.observed.items():
            key = _topic_key(topic, partition)
            final = self.final.get(key)
            end = None if final is None else final.end
            previous: tuple[int, int] | None = None
            for i, committed in observations:
                if committed is None:
                    continue
                if previous is not None and committed < previous[1]:
                    self.found(
                        "committed-offset-backwards",
                        f"consumer {consumer!r} on {key}: "
                        f"committed {previous[1]} ({self.at(previous[0])}) then "
                        f"{committed} ({self.at(i)})",
                        [previous[0], i],
                    )
                if end is not None and committed > end:
                    self.found(
                        "committed-offset-past-end",
                        f"consumer {consumer!r} on {key}: "
                        f"committed {committed} ({self.at(i)}) past the end {end} of "
                        f"the final partition",
                        [i, final.index],
                    )
                if previous is None or committed >= previous[1]:
                    previous = (i, committed)

    # -- retention ------------------------------------------------------------------------
    def check_log_starts(self) -> None:
        """Per key the observed log starts never decrease, and none lies above the
        committed offset of an important consumer first observed after it."""
        after: dict[tuple[str, int], list[tuple[str, list[tuple[int, Any]]]]] = {}
        for triple in self.important:
            topic, consumer, partition = triple
            after.setdefault((topic, partition), []).append((consumer, self.observed[triple]))
        for key, starts in self.starts.items():
            for (i, earlier), (j, later) in pairwise(starts):
                if later < earlier:
                    self.found(
                        "log-start-backwards",
                        f"{key}: log start {earlier} in {self.at(i)}, then {later} in {self.at(j)}",
                        [i, j],
                    )
            parsed = split_topic_key(key)
            if parsed is None or parsed[1] is None:
                continue
            for consumer, observations in after.get((parsed[0], parsed[1]), []):
                indices = [n for n, _ in observations]
                for i, start in starts:
                    at = bisect_left(indices, i)
                    committed = next((c for _, c in observations[at:] if c is not None), None)
                    if committed is not None and start > committed:
                        where = observations[at][0]
                        self.found(
                            "retention-past-committed",
                            f"{key}: log start {start} in {self.at(i)} above the offset "
                            f"{committed} important consumer {consumer!r} had committed "
                            f"({self.at(where)})",
                            [i, where],
                        )

    # -- splits ---------------------------------------------------------------------------
    def check_splits(self) -> None:
        """Every observed lineage has each split partition entirely before or after its
        latest split; an acknowledged (or once observed done) split is never undone."""
        events = [(i, "split", e) for i, e in self.splits]
        events += [(i, "lineage", e) for i, e in self.lineages]
        events.sort(key=lambda item: item[0])
        latest: dict[tuple[str, int], tuple[int, list]] = {}  # (topic, partition) -> split
        done: dict[tuple[str, int], int] = {}  # -> event that acknowledged or showed it
        for i, kind, event in events:
            topic = event["topic"]
            if kind == "split":
                parent = (topic, event["partition"])
                if event["status"] == "invoke":
                    latest[parent] = (i, list(event["children"]))
                else:
                    done.setdefault(parent, i)
                continue
            partitions = {p[0]: (bool(p[1]), list(p[2])) for p in event["partitions"]}
            parents = {p[0]: p[3] for p in event["partitions"] if len(p) > 3}
            for pid, (active, children) in partitions.items():
                missing = [c for c in children if c not in partitions]
                orphans = [c for c in children if c in parents and parents[c] != pid]
                if orphans:
                    self.found(
                        "torn-split",
                        f"{topic}/{pid} in {self.at(i)}: children {orphans} name another "
                        f"parent ({[parents[c] for c in orphans]})",
                        [i],
                    )
                if missing or (not active and not children):
                    self.found(
                        "torn-split",
                        f"{topic}/{pid} in {self.at(i)}: inactive={not active}, children "
                        f"{children}, of which {missing} are not there",
                        [i],
                    )
            for (split_topic, pid), (invoked, children) in latest.items():
                if split_topic != topic:
                    continue
                active, now = partitions.get(pid, (None, None))
                before = active is True and now == []
                after = active is False and now == children
                if not (before or after):
                    self.found(
                        "torn-split",
                        f"{topic}/{pid} in {self.at(i)}: active={active} children {now}, "
                        f"neither before nor after the split {self.at(invoked)} into {children}",
                        [invoked, i],
                    )
                elif before and (topic, pid) in done:
                    self.found(
                        "lost-split",
                        f"{topic}/{pid} in {self.at(i)} is active again after the split "
                        f"{self.at(invoked)} into {children} was done "
                        f"({self.at(done[(topic, pid)])})",
                        [done[(topic, pid)], i],
                    )
                elif after:
                    done.setdefault((topic, pid), i)

    # -- dependency cycles ----------------------------------------------------------------
    def check_cycles(self) -> None:
        if not self.nodes:
            return
        self.find_cycles("G0", WW, WW, 0, (WW,))
        self.find_cycles("G1c", WW | WR, WR, WW, (WW, WR))
        self.find_cycles("G2-item", WW | WR | RW, RW, WW | WR, (WW, WR, RW))

    def find_cycles(
        self, kind: str, mask: int, seed: int, exclude: int, preference: tuple[int, ...]
    ) -> None:
        adj = self.adj
        succ = [[v for v, m in out.items() if m & mask] for out in adj]
        inside = [-1] * len(adj)
        components = strongly_connected(succ)
        for c, component in enumerate(components):
            for v in component:
                inside[v] = c
        for c, component in enumerate(components):
            start = None
            for u in component:
                for v, m in adj[u].items():
                    if inside[v] == c and m & seed and not m & exclude:
                        start = (u, v)
                        break
                if start is not None:
                    break
            if start is None:
                continue
            u, v = start
            path = shortest_path(succ, v, u, inside, c)
            if path is None:  # cannot happen inside a component
                continue
            cycle = [u, *path]  # u -> v -> ... -> u
            self.report_cycle(kind, cycle, seed, preference, len(component))

    def report_cycle(
        self, kind: str, cycle: list[int], seed: int, preference: tuple[int, ...], size: int
    ) -> None:
        parts = [repr(self.nodes[cycle[0]].id)]
        for n, (a, b) in enumerate(pairwise(cycle)):
            if n >= _CYCLE_SHOWN:
                parts.append(f" ... ({len(cycle) - 1} edges)")
                break
            mask = self.adj[a][b]
            bit = seed if n == 0 else next(x for x in preference if mask & x)
            parts.append(f" -{_EDGE_NAME[bit]}({self.labels[(a, b, bit)]})-> {self.nodes[b].id!r}")
        ids = tuple(self.nodes[n].id for n in cycle[:-1])
        self.found(
            kind,
            f"cycle of {len(ids)} txns (component of {size}): " + "".join(parts),
            [self.nodes[n].index for n in cycle[:-1]],
            ids,
        )
