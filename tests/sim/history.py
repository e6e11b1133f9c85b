"""The history of a crash-consistency run: format, recording and loading.

A history is a file of JSON lines, one *event* per line, shared by every process of
a run (workers, the controller that kills and restarts them, observers).
``checker.check`` reads it (during a run too: a torn or unfinished last line is
ignored); the chaos runner also follows it as it grows (``HistoryTail``).

Recording is crash-safe without fsync: each process opens the file with
``O_WRONLY | O_APPEND`` and writes every event as one ``os.write`` of one complete
line, so lines of concurrent writers never interleave and a SIGKILLed process leaves
at worst one torn line, without its newline. The page cache survives SIGKILL; the
history is not meant to survive a machine crash. ``parse`` drops a torn line, and
when a later writer's line was glued to a torn one it recovers the later line.

Every event has ``type`` (what it is; ``kind`` is accepted as a synonym when
loading), ``process`` (who recorded it) and ``time`` (``time.monotonic_ns()``,
informational), plus the fields of its type:

``invoke``  a producer write is about to be sent:
            ``{"topic", "producer", "seq_no", "value"?, "partition"?}``. It makes the
            value known (a write that may or may not have happened); nothing is
            required of it. A txn may also log ``{"type": "invoke", "id": ...}``.
``ack``     the write was acknowledged: ``{"topic", "producer", "seq_no",
            "partition", "offset", "value"?, "status"?}``. ``producer`` null = the
            no-deduplication mode. ``status`` is the server's answer (``"written"``,
            or ``"duplicate"`` when the seq_no was skipped; both require the value to
            be present exactly once).
``read``    a committed consumer read outside a transaction (an autocommit
            statement): ``{"topic", "consumer", "partition", "offsets": [...],
            "values": [...], "committed"?: true}``.
``txn``     a finished transaction in the list-append style of Elle/Jepsen:
            ``{"id", "status": "ok"|"fail"|"info", "ops": [...]}``; ``info`` = the
            outcome is unknown (the process was killed during COMMIT). Ops:
            ``["append", key, value]``;
            ``["read", key, values]`` - the whole list of ``key`` as the txn saw it;
            ``["read", key, values, start]`` - a consumer read of a topic key from
            offset ``start``; ``["read", key, values, start, false]`` - a read that
            stopped at a message limit, so it says nothing about what came after.
            ``values`` null = not known. ``values`` may be a *summary*
            ``{"count": n, "digest": d, "tail": [...]}`` (``summary_read_op``): the read
            returned ``n`` values whose ``list_digest`` is ``d``, the last of them
            ``tail``; as strong as the list for a read that agrees with the final
            state (the digest is 128 bits), while a history of long table-row reads
            stays small.
``final``   the full contents of one key, observed after recovery:
            ``{"key", "values": [...], "offsets"?: [...], "start"?: n}``. For a topic
            key ``offsets`` (parallel to ``values``) lets the checker verify
            density; without it ``values[i]`` is at offset ``start + i``. ``start`` >
            0 says retention removed the offsets below it. A key may be observed
            several times (after each recovery); the last observation is the final
            state and each earlier one must agree with it.
            *Incremental* form: ``"base": n, "base_digest": d`` say the observed list
            is the previous observation's first ``n`` values (whose ``list_digest``
            the observer found to be ``d`` in what it read) followed by ``values``
            (and ``offsets``); the checker rebuilds the whole list and reports a
            ``state-regression`` if ``d`` is not the digest of those ``n`` values.
            ``"base": n`` without ``base_digest`` is a *tail* observation: the
            observer read only from position ``n`` on (a topic partition from offset
            ``n``), so it says nothing about the first ``n`` values; a later
            observation with a digest covers them.
            ``"count", "digest"`` (optional, any form) are the length and
            ``list_digest`` of the whole observed list; the checker verifies them
            against the list it rebuilt.
``offsets`` an observed committed offset: ``{"topic", "consumer", "partition",
            "committed", "important"?: true}``, taken by one observer (say the
            controller after each recovery), so that history order is observation
            order. ``important``: the consumer is important, so retention must not
            delete what it has not committed (a later ``final`` ``start`` above the
            first committed offset observed after it is a violation).
``split``   an autopartitioning split of a topic partition: ``{"topic", "partition",
            "children": [...], "status": "invoke"|"ok"}``: about to mark the
            partition inactive with these children (which exist already), then done.
``lineage`` the partition metadata of a topic as observed after recovery (or after
            a split): ``{"topic", "partitions": [[id, active, [children...]], ...]}``.
            After a split's ``invoke`` its partition must be entirely before it
            (active, no children) or entirely after (inactive with exactly those
            children, all of them present); after its ``ok``, entirely after.

API: ``HistoryWriter(path, process)`` with ``record(type_, **fields)`` and one method
per type (``invoke``, ``ack``, ``read``, ``txn``, ``final``, ``offsets``, ``split``,
``lineage``), ``close()``
(a context manager); op builders ``append_op(key, value)``, ``read_op(key,
values, start=None, complete=True)`` and ``summary_read_op(key, values)``;
``topic_key``, ``row_key``, ``producer_value``; digests ``list_digest(values)``,
``ListDigest`` (streaming) and ``joined_list(text, sep)``; ``encode(event) -> bytes``;
``parse(data) -> (events, torn)``, ``load(path)`` and ``HistoryTail(path)`` (the
events appended since its last ``read_new()``).

Digest of a list: blake2b-128 (hex) of the *canonical text* of its values, each
value's ``json.dumps`` (ASCII) followed by a newline. A JSON encoding holds no raw
newline, so the text determines the list, and the digest of a prefix is the state of
a streaming hash part way through (``ListDigest``): the checker gets the digests of
all prefixes of a final list in one pass.

Keys: ``"t:<topic>/<partition>"`` for a topic partition (``topic_key``),
``"t:<topic>"`` for a txn append whose partition is not known (the checker finds
it), ``"r:<row>"`` for a table row holding a list (``row_key``).

Values are the identity of writes: each value must be written by one write only in
the whole history (a producer write's retries share it). A producer write's value
defaults to ``"<producer>:<seq_no>"`` (``producer_value``). Values must be JSON
scalars (or lists, compared structurally); bytes are recorded decoded (UTF-8,
backslash escapes).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

EVENT_TYPES = ("invoke", "ack", "read", "txn", "final", "offsets", "split", "lineage")
TXN_STATUSES = ("ok", "fail", "info")


# -- keys, values, ops ---------------------------------------------------------------------
def topic_key(topic: str, partition: int | None = None) -> str:
    """``t:<topic>/<partition>``, or ``t:<topic>`` when the partition is not known."""
    return f"t:{topic}" if partition is None else f"t:{topic}/{partition}"


def row_key(row: object) -> str:
    return f"r:{row}"


def producer_value(producer: str | None, seq_no: int | None) -> str:
    """The default value (payload identity) of a producer write."""
    return f"{producer}:{seq_no}"


def append_op(key: str, value: Any) -> list:
    return ["append", key, value]


def read_op(
    key: str, values: Sequence | None, start: int | None = None, complete: bool = True
) -> list:
    """A read op: the whole list (``start`` None), or a slice from offset ``start``."""
    if start is None and complete:
        return ["read", key, None if values is None else list(values)]
    return ["read", key, None if values is None else list(values), start or 0, complete]


SUMMARY_TAIL = 8  # values of a summarised read kept verbatim (the last ones)


def summary_read_op(key: str, values: Sequence, tail: int = SUMMARY_TAIL) -> list:
    """A whole-list read recorded as ``{"count", "digest", "tail"}`` (see the format)."""
    values = list(values)
    return [
        "read",
        key,
        {"count": len(values), "digest": list_digest(values), "tail": values[-tail:]},
    ]


# -- digests of lists ----------------------------------------------------------------------
def _plain(text: str) -> bool:
    """Only characters that ``json.dumps`` writes as themselves (printable ASCII but
    ``"`` and ``\\``): a str of them is encoded as itself between double quotes."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


def canonical_text(values: Sequence) -> str:
    """Each value's JSON encoding followed by a newline (the text a digest hashes)."""
    if not values:
        return ""
    if all(type(v) is str for v in values) and _plain("".join(values)):
        return '"' + '"\n"'.join(values) + '"\n'  # fast path: plain ASCII strings
    return "".join(json.dumps(v, default=_default) + "\n" for v in values)


class ListDigest:
    """Streaming ``list_digest``: ``update`` with more values; ``copy`` to branch off."""

    __slots__ = ("_hash", "count")

    def __init__(self, values: Sequence = ()) -> None:
        self._hash = hashlib.blake2b(digest_size=16)
        self.count = 0
        if values:
            self.update(values)

    def update(self, values: Sequence) -> ListDigest:
        self._hash.update(canonical_text(values).encode())
        self.count += len(values)
        return self

    def copy(self) -> ListDigest:
        twin = ListDigest.__new__(ListDigest)
        twin._hash = self._hash.copy()
        twin.count = self.count
        return twin

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def list_digest(values: Sequence) -> str:
    """Digest of a whole list (hex); equal digests mean equal lists."""
    return ListDigest(values).hexdigest()


def joined_list(text: str | None, sep: str = ",") -> list[str]:
    """A list stored as one ``sep``-joined string (None or "" = empty)."""
    return text.split(sep) if text else []


def _default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    raise TypeError(f"not JSON serialisable in a history: {type(value).__name__}")


def encode(event: dict) -> bytes:
    """One event as one line (with its newline)."""
    line = json.dumps(event, separators=(",", ":"), default=_default)
    return line.encode() + b"\n"


# -- recording ------------------------------------------------------------------------------
class HistoryWriter:
    """Appends events of one process to a history file; one ``os.write`` per event.

    Safe to share the file between processes (each opens its own writer); not
    thread-safe within a process only in that events of two threads may be in any
    order - each line stays whole.
    """

    def __init__(self, path: str | os.PathLike, process: str | int) -> None:
        self.path = Path(path)
        self.process = process
        self._fd: int | None = os.open(
            self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644
        )

    def record(self, type_: str, **fields: Any) -> dict:
        """Write one event and return it."""
        if self._fd is None:
            raise ValueError("history writer is closed")
        event = {"type": type_, "process": self.process, "time": time.monotonic_ns(), **fields}
        data = encode(event)
        written = os.write(self._fd, data)
        if written != len(data):  # only on ENOSPC and the like; the line is torn
            raise OSError(f"short write to the history ({written} of {len(data)} bytes)")
        return event

    def invoke(
        self,
        topic: str,
        producer: str | None,
        seq_no: int | None,
        value: Any = None,
        partition: int | None = None,
    ) -> dict:
        if value is None:
            value = producer_value(producer, seq_no)
        return self.record(
            "invoke",
            topic=topic,
            producer=producer,
            seq_no=seq_no,
            value=value,
            partition=partition,
        )

    def ack(
        self,
        topic: str,
        producer: str | None,
        seq_no: int | None,
        partition: int,
        offset: int | None,
        value: Any = None,
        status: str = "written",
    ) -> dict:
        if value is None:
            value = producer_value(producer, seq_no)
        return self.record(
            "ack",
            topic=topic,
            producer=producer,
            seq_no=seq_no,
            partition=partition,
            offset=offset,
            value=value,
            status=status,
        )

    def read(
        self,
        topic: str,
        consumer: str | None,
        partition: int,
        offsets: Sequence[int],
        values: Sequence,
        committed: bool = True,
    ) -> dict:
        return self.record(
            "read",
            topic=topic,
            consumer=consumer,
            partition=partition,
            offsets=list(offsets),
            values=list(values),
            committed=committed,
        )

    def txn(self, id: Any, status: str, ops: Iterable[Sequence]) -> dict:
        if status not in TXN_STATUSES:
            raise ValueError(f"txn status must be one of {TXN_STATUSES}, not {status!r}")
        return self.record("txn", id=id, status=status, ops=[list(op) for op in ops])

    def final(
        self,
        key: str,
        values: Sequence,
        offsets: Sequence[int] | None = None,
        start: int | None = None,
        *,
        base: int | None = None,
        base_digest: str | None = None,
        count: int | None = None,
        digest: str | None = None,
    ) -> dict:
        """An observation; with ``base`` an incremental one (``values`` come after the
        previous observation's first ``base`` values, whose digest was ``base_digest``,
        or which were not read when ``base_digest`` is None)."""
        fields: dict[str, Any] = {"key": key, "values": list(values)}
        if offsets is not None:
            fields["offsets"] = list(offsets)
        if start is not None:
            fields["start"] = start
        if base is not None:
            fields["base"] = base
            if base_digest is not None:
                fields["base_digest"] = base_digest
        elif base_digest is not None:
            raise ValueError("base_digest without base")
        if count is not None:
            fields["count"] = count
        if digest is not None:
            fields["digest"] = digest
        return self.record("final", **fields)

    def offsets(
        self, topic: str, consumer: str, partition: int, committed: int, important: bool = False
    ) -> dict:
        fields: dict[str, Any] = {"important": True} if important else {}
        return self.record(
            "offsets",
            topic=topic,
            consumer=consumer,
            partition=partition,
            committed=committed,
            **fields,
        )

    def split(self, topic: str, partition: int, children: Sequence[int], status: str) -> dict:
        if status not in ("invoke", "ok"):
            raise ValueError(f"split status must be invoke or ok, not {status!r}")
        return self.record(
            "split", topic=topic, partition=partition, children=list(children), status=status
        )

    def lineage(
        self, topic: str, partitions: Iterable[tuple[int, bool, Sequence[int], int | None]]
    ) -> dict:
        """The partition metadata of ``topic``: (id, active, children, parent) per partition."""
        return self.record(
            "lineage",
            topic=topic,
            partitions=[
                [p, bool(active), list(children), parent]
                for p, active, children, parent in partitions
            ],
        )

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- loading --------------------------------------------------------------------------------
_START = b'{"type"'


def _decode(line: bytes) -> dict | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def parse(data: bytes) -> tuple[list[dict], int]:
    """Events of a history file's bytes, and the number of torn fragments dropped.

    A line that does not decode is a torn write (its process died in the middle); if
    another writer's line was appended right after it, that line is recovered.
    """
    events: list[dict] = []
    torn = 0
    lines = data.split(b"\n")
    last = lines.pop()  # after the final newline: b"" unless the last line is torn
    if last.strip():
        lines.append(last)
    for line in lines:
        if not line.strip():
            continue
        event = _decode(line)
        if event is not None:
            events.append(event)
            continue
        torn += 1
        # Recover a whole line glued after the torn one (the torn one has no newline).
        at = line.find(_START, 1)
        while at != -1:
            event = _decode(line[at:])
            if event is not None:
                events.append(event)
                break
            at = line.find(_START, at + 1)
    return events, torn


def load(path: str | os.PathLike) -> list[dict]:
    """The events of a history file, torn lines dropped."""
    return parse(Path(path).read_bytes())[0]


class HistoryTail:
    """Reads a growing history file incrementally: ``read_new`` returns the events of the
    complete lines appended since the previous call.

    A line without its newline yet (being written, or torn by a killed process) is left
    for a later call; once a newline follows it, ``parse`` drops it or recovers a whole
    line glued to it, exactly as a full ``load`` would. ``torn`` counts dropped lines.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.offset = 0
        self.torn = 0

    def read_new(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        if end == 0:
            return []
        events, torn = parse(data[:end])
        self.offset += end
        self.torn += torn
        return events
