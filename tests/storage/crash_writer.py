"""Crash writer: appends to a Store until it is killed, logging what was acknowledged.

Run as a subprocess by ``test_crash_kill.py`` (and importable for its helpers)::

    python crash_writer.py --root DIR --acks FILE --fsync never|group|always
        [--segment-bytes N] [--threads N] [--seed N] [--max-seconds S] [--inject MODE:N]
        [--keyless-share F] [--append-delay S]

``--keyless-share``: the share of batches made of keyless messages alone (1 to 3 of
them, through ``append_keyless``), so that many threads' keyless batches are
combined and join running group-commit rounds.

``--append-delay``: seconds each thread sleeps before each batch, a writer as slow
as one starved of CPU on a loaded machine (the test of the kill loop's own timing).

Every message carries a *message id* ``mid`` = ``<key>|<seq>`` at the start of
its payload (see ``payload``), so a checker can tell what every stored message
is and verify its content:

- producer messages: key = producer id (``p<thread>-<j>``), seq = its seq_no;
- keyless messages: key = ``K<batch>.<i>``, seq 0, no producer or group id;
- group messages: key = ``G<group>.<batch>.<i>``, seq 0, message_group_id ``<group>``.

The ack file is the writer's crash-safe journal, written with one ``os.write``
per line on an ``O_APPEND`` descriptor (a SIGKILL cannot tear such a small
write; a torn last line would be ignored anyway):

- ``I <batch> <mid> <mid>...``: intent, written *before* appending a batch (producer
  messages only: those are the ones a producer must resend after a crash);
- ``A <batch> <mid>=<partition>:<offset> ... E``: the batch was acknowledged; an
  offset of -1 means "duplicate, earlier offset unknown".

On start the writer resends every intent without an ack (as a producer that did
not learn the outcome would) and checks the duplicates are detected; then each
producer continues from ``topic.last_seq_no``. While running it sometimes
resends a producer's previous batch and checks all of it comes back DUPLICATE
at the offsets first acknowledged. A failed check exits with code 3 and a
``FAIL`` line on stderr.

Stdout gets ``opening``, ``ready`` and ``rolled`` lines so the test can time
its kills. ``--inject`` makes the writer SIGKILL itself at a chosen point:
``torn-write:N`` (writes half of the N-th log write of this run, then dies),
``roll-before-snapshot:N``, ``roll-before-rename:N`` (snapshot temp file
written, not renamed), ``roll-before-frame:N`` (sealed and snapshotted, first
frame of the new segment not written) and ``roll-after:N`` (the append that
rolled returned, ack not written).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import random
import signal
import sys
import threading
import time
import traceback
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from storage.config import FsyncPolicy, TopicConfig  # noqa: E402
from storage.fs import FileSystem  # noqa: E402
from storage.partition_log import DUPLICATE, WRITTEN, PartitionLog  # noqa: E402
from storage.producer_state import ProducerStateManager  # noqa: E402
from storage.record_batch import READ_SCHEMA, build_wire_batch  # noqa: E402
from storage.store import Store  # noqa: E402

PARTITIONS = 3
PRODUCERS_PER_THREAD = 2
GROUPS = ("ga", "gb")


# -- message ids and payloads (shared with the tests) ----------------------------------
def payload(mid: str) -> bytes:
    """The deterministic payload of message ``mid``: the id, then filler of a length fixed by it."""
    head = mid.encode() + b"|"
    crc = zlib.crc32(head)
    length = 16 + crc % 200 + (6000 if crc % 97 == 0 else 0)
    return head + (head * (length // len(head) + 1))[:length]


def mid_of(data: bytes) -> str:
    """The message id at the start of a payload."""
    key, seq, _ = data.split(b"|", 2)
    return f"{key.decode()}|{seq.decode()}"


def split_mid(mid: str) -> tuple[str, int]:
    key, seq = mid.split("|")
    return key, int(seq)


@dataclasses.dataclass
class AckLog:
    """What an ack file says: acknowledged locations and unacknowledged intents."""

    acked: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    intents: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    acked_batches: set[int] = dataclasses.field(default_factory=set)
    max_batch: int = 0
    lines: int = 0

    def pending(self) -> list[tuple[int, list[str]]]:
        return sorted((b, m) for b, m in self.intents.items() if b not in self.acked_batches)

    def acked_max_seq(self) -> dict[str, int]:
        result: dict[str, int] = {}
        for mid in self.acked:
            key, seq = split_mid(mid)
            if key.startswith("p"):
                result[key] = max(result.get(key, -1), seq)
        return result


def parse_acks(path: str) -> AckLog:
    """Read an ack file, ignoring a torn last line."""
    log = AckLog()
    try:
        text = Path(path).read_bytes().decode()
    except FileNotFoundError:
        return log
    for line in text.split("\n")[:-1]:  # the part after the last newline is torn
        parts = line.split(" ")
        batch = int(parts[1])
        log.max_batch = max(log.max_batch, batch)
        log.lines += 1
        if parts[0] == "I":
            log.intents[batch] = parts[2:]
        elif parts[0] == "A":
            assert parts[-1] == "E", line
            log.acked_batches.add(batch)
            for item in parts[2:-1]:
                mid, where = item.split("=")
                partition, offset = where.split(":")
                known = log.acked.get(mid)
                if known is None or known[1] == -1:
                    log.acked[mid] = (int(partition), int(offset))
        else:
            raise AssertionError(f"bad ack line {line!r}")
    return log


# -- the checker (used by the tests, in their own process) -------------------------------
@dataclasses.dataclass
class CheckStats:
    messages: int = 0
    acked_checked: int = 0
    producers: int = 0
    segments: int = 0
    truncated_bytes: int = 0


def read_partition(partition) -> pa.Table:
    """Every message of a partition, in offset order."""
    batches = []
    offset = partition.start_offset
    while offset < partition.end_offset:
        result = partition.read(offset, max_messages=100_000, max_bytes=64 * 1024 * 1024)
        assert result.next_offset > offset, (partition.partition_id, offset, result)
        batches.extend(result.batches)
        offset = result.next_offset
    return pa.Table.from_batches(batches, schema=READ_SCHEMA)


def check_topic(topic, acks: AckLog | None = None) -> CheckStats:
    """Assert the crash invariants on an open topic; return counts.

    Offsets dense from 0 in every partition, segments contiguous, every payload
    intact, every message id stored at most once, each producer in one
    partition with seq_nos increasing with offsets and contiguous from 0,
    ``last_seq_no`` equal to the largest stored seq_no, each message group in
    one partition, and every acknowledged message stored where it was acked.
    """
    stats = CheckStats()
    where: dict[str, tuple[int, int]] = {}
    producer_parts: dict[str, set[int]] = {}
    producer_count: dict[str, int] = {}
    producer_max: dict[str, int] = {}
    group_parts: dict[str, set[int]] = {}
    for p in topic.partition_ids():
        partition = topic.partition(p)
        assert partition.start_offset == 0, (p, partition.start_offset)
        segments = partition.segments
        stats.segments += len(segments)
        stats.truncated_bytes += partition.recovery.truncated_bytes
        assert segments[0].base_offset == 0
        for a, b in itertools.pairwise(segments):
            assert a.next_offset == b.base_offset, (p, a.log_path, a.next_offset, b.base_offset)
        assert segments[-1].next_offset == partition.end_offset
        leftovers = [n for n in os.listdir(partition.directory) if n.endswith(".tmp")]
        assert not leftovers, (p, leftovers)
        table = read_partition(partition)
        offsets = table.column("offset").to_numpy()
        assert np.array_equal(offsets, np.arange(partition.end_offset)), f"p{p} offsets not dense"
        columns = (
            table.column(name).to_pylist()
            for name in ("producer_id", "seq_no", "message_group_id", "data")
        )
        last_seq: dict[str, int] = {}
        for offset, (producer, seq_no, group, data) in enumerate(zip(*columns, strict=True)):
            mid = mid_of(data)
            assert data == payload(mid), f"p{p} offset {offset}: payload of {mid} damaged"
            assert mid not in where, f"{mid} stored twice: at {where[mid]} and {(p, offset)}"
            where[mid] = (p, offset)
            key, seq = split_mid(mid)
            if key.startswith("p"):
                assert (producer, seq_no, group) == (key, seq, None), (p, offset, mid)
                assert seq > last_seq.get(key, -1), f"{mid} at p{p}:{offset} out of order"
                last_seq[key] = seq
                producer_parts.setdefault(key, set()).add(p)
                producer_count[key] = producer_count.get(key, 0) + 1
                producer_max[key] = max(producer_max.get(key, -1), seq)
            elif key.startswith("G"):
                name = key.split(".")[0][1:]
                assert (producer, seq_no, group) == (None, None, name), (p, offset, mid)
                group_parts.setdefault(name, set()).add(p)
            else:
                assert key.startswith("K"), mid
                assert (producer, seq_no, group) == (None, None, None), (p, offset, mid)
        stats.messages += len(offsets)
    for key, parts in producer_parts.items():
        assert len(parts) == 1, f"producer {key} spread over partitions {sorted(parts)}"
        assert producer_count[key] == producer_max[key] + 1, (
            f"producer {key}: {producer_count[key]} messages, seq_nos up to {producer_max[key]}"
        )
        assert topic.last_seq_no(key) == producer_max[key], (
            f"producer {key}: last_seq_no {topic.last_seq_no(key)}, stored {producer_max[key]}"
        )
    stats.producers = len(producer_parts)
    for name, parts in group_parts.items():
        assert len(parts) == 1, f"message group {name} spread over partitions {sorted(parts)}"
    if acks is not None:
        for mid, (p, offset) in acks.acked.items():
            assert mid in where, f"acknowledged {mid} (p{p}:{offset}) is missing"
            if offset == -1:
                assert where[mid][0] == p, (mid, where[mid], p)
            else:
                found = where[mid]
                assert found == (p, offset), f"acked {mid} at {(p, offset)}, found {found}"
        stats.acked_checked = len(acks.acked)
    return stats


# -- the writer --------------------------------------------------------------------------
class Failure(Exception):
    """The writer saw the store break a promise (reported to the test, then exit)."""


def fail(message: str) -> None:
    raise Failure(message)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class AckFile:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def line(self, text: str) -> None:
        data = (text + "\n").encode()
        if os.write(self.fd, data) != len(data):
            fail("short write to the ack file")


def wire_batch(mids: list[str]):
    seq_no: list[int | None] = []
    producer: list[str | None] = []
    group: list[str | None] = []
    for mid in mids:
        key, seq = split_mid(mid)
        if key.startswith("p"):
            seq_no.append(seq)
            producer.append(key)
            group.append(None)
        else:
            seq_no.append(None)
            producer.append(None)
            group.append(key.split(".")[0][1:] if key.startswith("G") else None)
    return build_wire_batch(
        [payload(m) for m in mids], seq_no=seq_no, producer_id=producer, message_group_id=group
    )


def ack_items(mids: list[str], result) -> str:
    return " ".join(
        f"{mid}={int(p)}:{int(o)}"
        for mid, p, o in zip(mids, result.partitions, result.offsets, strict=True)
    )


class Writer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.acks = AckFile(args.acks)
        self.batch_lock = threading.Lock()
        self.next_batch = 0
        self.roll_count = 0
        self.joined = False
        self.exercised = False
        self.stop = threading.Event()

    def take_batch_id(self) -> int:
        with self.batch_lock:
            self.next_batch += 1
            return self.next_batch

    def open(self) -> None:
        args = self.args
        os.write(1, b"opening\n")
        self.store = Store.open(args.root)
        policy = FsyncPolicy(args.fsync)
        ids = self.store.topic_ids()
        if ids:
            self.topic = self.store.topic(ids[0])
            if self.topic.config.fsync_policy is not policy:
                self.topic.alter(dataclasses.replace(self.topic.config, fsync_policy=policy))
        else:
            config = TopicConfig(
                partition_count=PARTITIONS,
                fsync_policy=policy,
                segment_bytes=args.segment_bytes,
                retention_ms=None,
            )
            self.topic = self.store.create_topic(config)
        if self.topic.partition_ids() != list(range(PARTITIONS)):
            fail(f"partitions {self.topic.partition_ids()}")

    def recover_producers(self) -> None:
        """Resend unacknowledged intents, then check no acknowledged seq_no was forgotten."""
        log = parse_acks(self.args.acks)
        self.next_batch = log.max_batch
        for batch, mids in log.pending():
            before = {}
            for mid in mids:
                key, _ = split_mid(mid)
                if key not in before:
                    last = self.topic.last_seq_no(key)
                    before[key] = -1 if last is None else last
            result = self.topic.append(wire_batch(mids))
            for i, mid in enumerate(mids):
                key, seq = split_mid(mid)
                expected = DUPLICATE if seq <= before[key] else WRITTEN
                if result.status[i] != expected:
                    fail(f"resent {mid} (last seq_no {before[key]}): status {result.status[i]}")
            self.acks.line(f"A {batch} {ack_items(mids, result)} E")
        for key, seq in log.acked_max_seq().items():
            last = self.topic.last_seq_no(key)
            if last is None or last < seq:
                fail(f"producer {key}: last_seq_no {last} below acknowledged seq_no {seq}")

    def run_thread(self, thread: int, seed: int) -> None:
        rng = random.Random(seed)
        producers = [f"p{thread}-{j}" for j in range(PRODUCERS_PER_THREAD)]
        next_seq = {}
        for pid in producers:
            last = self.topic.last_seq_no(pid)
            next_seq[pid] = 0 if last is None else last + 1
        previous: dict[str, tuple[list[str], list[tuple[int, int]]]] = {}
        while not self.stop.is_set():
            if self.args.append_delay:
                time.sleep(self.args.append_delay)
            if previous and rng.random() < 0.08:
                self.resend_previous(previous[rng.choice(sorted(previous))])
                continue
            batch = self.take_batch_id()
            if rng.random() < self.args.keyless_share:
                self.append_keyless(batch, rng)
                continue
            big = rng.random() < 0.03
            streams = []
            for pid in rng.sample(producers, rng.choice((1, 1, 2))):
                count = rng.randint(40, 150) if big else rng.randint(1, 12)
                streams.append([f"{pid}|{next_seq[pid] + i}" for i in range(count)])
                next_seq[pid] += count
            if rng.random() < 0.3:
                streams.append([f"K{batch}.{i}|0" for i in range(rng.randint(1, 4))])
            if rng.random() < 0.15:
                group = rng.choice(GROUPS)
                streams.append([f"G{group}.{batch}.{i}|0" for i in range(rng.randint(1, 3))])
            mids = interleave(streams, rng)
            producer_mids = [m for m in mids if m.startswith("p")]
            if producer_mids:
                self.acks.line(f"I {batch} {' '.join(producer_mids)}")
            segments_before = self.segment_count()
            result = self.topic.append(wire_batch(mids))
            if not (result.status == WRITTEN).all():
                fail(f"batch {batch}: fresh messages reported duplicate: {result.status}")
            rolled = self.segment_count() > segments_before
            if rolled and self.args.inject_mode == "roll-after":
                self.roll_count += 1
                if self.roll_count == self.args.inject_n:
                    die()
            self.acks.line(f"A {batch} {ack_items(mids, result)} E")
            if rolled:
                os.write(1, b"rolled\n")
            for pid in {m.split("|")[0] for m in producer_mids}:
                own = [i for i, m in enumerate(mids) if m.startswith(pid + "|")]
                previous[pid] = (
                    [mids[i] for i in own],
                    [(int(result.partitions[i]), int(result.offsets[i])) for i in own],
                )

    def append_keyless(self, batch: int, rng: random.Random) -> None:
        """A batch of keyless messages alone, through ``TopicLog.append_keyless`` (combined
        with other threads' while the topic is busy; routed by ``_keyless_partition``,
        which may join a running group-commit round); prints ``exercised`` once, when
        combined appends happened and a batch went to a partition keyless batches had
        joined already."""
        # No intent line is logged for them, so a batch id may come again after a kill
        # (``max_batch`` is read from the log): the run's seed keeps the ids unique.
        mids = [f"K{self.args.seed}x{batch}.{i}|0" for i in range(rng.randint(1, 3))]
        result = self.topic.append_keyless(wire_batch(mids))
        if not (result.status == WRITTEN).all():
            fail(f"batch {batch}: keyless messages reported duplicate: {result.status}")
        self.acks.line(f"A {batch} {ack_items(mids, result)} E")
        self.joined = self.joined or self.topic._keyless_joined > len(mids)
        if self.joined and not self.exercised and self.topic._combiner.rounds:
            self.exercised = True
            os.write(1, b"exercised\n")

    def resend_previous(self, previous: tuple[list[str], list[tuple[int, int]]]) -> None:
        mids, where = previous
        result = self.topic.append(wire_batch(mids))
        for i, mid in enumerate(mids):
            got = (int(result.partitions[i]), int(result.offsets[i]))
            if result.status[i] != DUPLICATE:
                fail(f"resend of {mid} was written again at {got}, first at {where[i]}")
            if got != where[i] and got != (where[i][0], -1):
                fail(f"resend of {mid} reports {got}, first written at {where[i]}")

    def segment_count(self) -> int:
        return sum(len(self.topic.partition(p).segments) for p in range(PARTITIONS))


def interleave(streams: list[list[str]], rng: random.Random) -> list[str]:
    """Merge streams in random order, keeping each stream's own order."""
    streams = [list(s) for s in streams if s]
    merged = []
    while streams:
        stream = rng.choice(streams)
        merged.append(stream.pop(0))
        if not stream:
            streams.remove(stream)
    return merged


def install_injection(writer: Writer) -> None:
    """Patch storage classes (in this process only) to SIGKILL ourselves at a chosen point."""
    mode, n = writer.args.inject_mode, writer.args.inject_n
    if mode == "torn-write":
        original_pwrite = FileSystem.pwrite
        count = [0]

        def pwrite(self, fd, data, position):
            if self._paths.get(fd, "").endswith(".log"):
                count[0] += 1
                if count[0] == n and len(data) > 8:
                    cut = random.Random(n).randrange(1, len(data))
                    original_pwrite(self, fd, bytes(memoryview(data)[:cut]), position)
                    die()
            return original_pwrite(self, fd, data, position)

        def pwritev(self, fd, parts, position):
            # segment appends go through pwritev (storage/segment.py): tear those too
            # (review R3-F1 of round 13: only pwrite was torn, so no write ever was)
            return pwrite(self, fd, b"".join(bytes(part) for part in parts), position)

        FileSystem.pwrite = pwrite
        FileSystem.pwritev = pwritev
    elif mode in ("roll-before-snapshot", "roll-before-rename", "roll-before-frame"):
        original_roll = PartitionLog._roll_locked
        original_snapshot = ProducerStateManager.write_snapshot
        original_rename = FileSystem.rename
        rolls = [0]
        in_roll = threading.local()

        def roll(self):
            rolls[0] += 1
            in_roll.armed = rolls[0] == n
            try:
                segment = original_roll(self)
            finally:
                armed, in_roll.armed = in_roll.armed, False
            if armed and mode == "roll-before-frame":
                die()
            return segment

        def write_snapshot(self, offset, *, durable):
            if getattr(in_roll, "armed", False) and mode == "roll-before-snapshot":
                die()
            return original_snapshot(self, offset, durable=durable)

        def rename(self, source, target):
            armed = getattr(in_roll, "armed", False)
            if armed and mode == "roll-before-rename" and target.endswith(".snapshot"):
                die()
            return original_rename(self, source, target)

        PartitionLog._roll_locked = roll
        ProducerStateManager.write_snapshot = write_snapshot
        FileSystem.rename = rename


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--acks", required=True)
    parser.add_argument("--fsync", choices=[p.value for p in FsyncPolicy], default="group")
    parser.add_argument("--segment-bytes", type=int, default=64 * 1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=20.0)
    parser.add_argument("--inject", default="none")
    parser.add_argument("--keyless-share", type=float, default=0.0)
    parser.add_argument("--append-delay", type=float, default=0.0)
    args = parser.parse_args(argv)
    mode, _, n = args.inject.partition(":")
    args.inject_mode, args.inject_n = mode, int(n or 0)
    writer = Writer(args)
    errors: list[str] = []

    def guarded(target, *a) -> None:
        try:
            target(*a)
        except Failure as error:
            errors.append(f"FAIL {error}")
        except BaseException:
            errors.append(f"FAIL unexpected error\n{traceback.format_exc()}")
        if errors:
            sys.stderr.write("\n".join(errors) + "\n")
            sys.stderr.flush()
            os._exit(3)

    guarded(writer.open)
    guarded(writer.recover_producers)
    install_injection(writer)
    os.write(1, b"ready\n")
    threads = [
        threading.Thread(target=guarded, args=(writer.run_thread, t, args.seed * 100 + t))
        for t in range(args.threads)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + args.max_seconds
    while time.monotonic() < deadline and any(t.is_alive() for t in threads):
        time.sleep(0.05)
    writer.stop.set()
    for thread in threads:
        thread.join()
    writer.store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
