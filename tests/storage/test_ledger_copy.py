"""The copy of the ledger into the partitions' own logs (``storage.ledger_copy``): rows at
their ledger offsets, one append a partition for many frames, whole shares only, producer
state, retention behind it, and resumption after a failure between a partition's append
and the ledger's release (in the same process and after a reopen)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from storage import failpoints, ledger_copy, limits
from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.errors import CorruptSegmentError, StorageIOError
from storage.fs import FileSystem
from storage.ledger import Ledger
from storage.ledger_copy import copy_ledger
from storage.partition_log import DUPLICATE, WRITTEN, PartitionLog
from storage.record_batch import build_wire_batch
from tests.storage.ledger_writer import log_rows

PARTITIONS = 12


def _batch(tag: str, count: int, producer: str | None = None, first_seq: int = 0
           ) -> pa.RecordBatch:  # fmt: skip
    return build_wire_batch([f"{tag}/{i}".encode() for i in range(count)],
                            producer_id=producer or f"p-{tag}",
                            seq_no=list(range(first_seq, first_seq + count)))  # fmt: skip


def _statements(rng: random.Random, count: int) -> list[list[tuple[int, pa.RecordBatch]]]:
    out = []
    for k in range(count):
        chosen = sorted(rng.sample(range(PARTITIONS), rng.randint(1, PARTITIONS)))
        out.append([(p, _batch(f"{k}.{p}", rng.randint(1, 4))) for p in chosen])
    return out


class _Topic:
    """A ledger and the partitions' logs under one directory, reopened as a store would:
    the logs first, then the ledger with their ends."""

    def __init__(self, root: Path, file_bytes: int = 4096) -> None:
        self.root = root
        self.file_bytes = file_bytes
        self.clock = ManualClock()
        self.logs: dict[int, PartitionLog] = {}
        self.ledger: Ledger | None = None
        self.open()

    def open(self) -> None:
        config = TopicConfig(fsync_policy=FsyncPolicy.NEVER).validate()
        fs = FileSystem()
        self.logs = {p: PartitionLog(fs, str(self.root / f"p{p}"), p, config, self.clock)
                     for p in range(PARTITIONS)}  # fmt: skip
        self.ledger = Ledger(
            fs,
            str(self.root / "ledger"),
            file_bytes_max=self.file_bytes,
            partition_ends={p: log.end_offset for p, log in self.logs.items()},
        )

    def close(self) -> None:
        assert self.ledger is not None
        self.ledger.close()
        for log in self.logs.values():
            log.close()

    def data(self, partition: int) -> list[bytes]:
        """The partition's messages, from its log then the ledger, checked dense."""
        offsets, out = log_rows(self.logs[partition])
        assert self.ledger is not None
        batch = self.ledger.read(partition, self.ledger.start_offset(partition))
        out.extend(batch.column("data").to_pylist())
        offsets.extend(batch.column("offset").to_pylist())
        assert offsets == list(range(len(offsets))), partition
        return out


@pytest.fixture
def topic(tmp_path: Path) -> Iterator[_Topic]:
    opened = _Topic(tmp_path)
    yield opened
    opened.close()


def _expected(statements) -> dict[int, list[bytes]]:
    expected: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for shares in statements:
        for partition, batch in shares:
            expected[partition].extend(batch.column("data").to_pylist())
    return expected


def test_the_copy_moves_every_share_to_its_log_at_its_offsets(topic: _Topic) -> None:
    statements = _statements(random.Random(3), 60)
    assert topic.ledger is not None
    for shares in statements:
        topic.ledger.append(shares)
    files_before = len(topic.ledger.file_numbers)
    assert files_before > 2
    total = 0
    while True:
        report = copy_ledger(topic.ledger, topic.logs, max_messages=50)
        if not report.messages:
            break
        total += report.messages
    expected = _expected(statements)
    assert total == sum(len(v) for v in expected.values())
    assert topic.ledger.pending() == {}
    for partition in range(PARTITIONS):
        log = topic.logs[partition]
        assert log.end_offset == len(expected[partition])
        assert topic.ledger.start_offset(partition) == log.end_offset
        assert topic.data(partition) == expected[partition]
    assert topic.ledger.file_numbers == [max(topic.ledger.file_numbers)]  # only the one written
    # a reopen agrees (logs first, then the ledger with their ends), and appends continue
    topic.close()
    topic.open()
    assert topic.ledger.pending() == {}
    bases = topic.ledger.append([(0, _batch("late", 2))])
    assert bases == [len(expected[0])]
    assert copy_ledger(topic.ledger, topic.logs).messages == 2
    assert topic.data(0) == [*expected[0], b"late/0", b"late/1"]


def test_many_frames_go_to_a_partition_as_one_append_of_whole_shares(topic: _Topic) -> None:
    statements = _statements(random.Random(5), 30)
    assert topic.ledger is not None
    for shares in statements:
        topic.ledger.append(shares, written_at_us=1_000 + len(shares))
    # a limit of one message still copies one whole frame: every share of the first statement
    first = copy_ledger(topic.ledger, topic.logs, max_messages=1)
    assert first.messages == sum(b.num_rows for _, b in statements[0])
    assert first.appends == len(statements[0])
    for partition, batch in statements[0]:
        assert topic.logs[partition].end_offset == batch.num_rows
    # the rest: one append (one frame, one sync) a partition for all its shares
    rest = copy_ledger(topic.ledger, topic.logs)
    touched = {p for shares in statements[1:] for p, _ in shares}
    assert rest.appends == len(touched)
    for partition in touched:
        log = topic.logs[partition]
        result = log.read(0, max_messages=10_000)
        times = {int(t) for b in result.batches
                 for t in b.column("written_at").cast(pa.int64()).to_pylist()}  # fmt: skip
        later = [len(s) for s in statements[1:] if any(p == partition for p, _ in s)]
        assert max(times) == 1_000 + max(later)  # the latest ledger time of its rows
    assert topic.ledger.pending() == {}
    assert all(topic.data(p) == v for p, v in _expected(statements).items())


def test_the_copy_records_the_producer_state(topic: _Topic) -> None:
    assert topic.ledger is not None
    topic.ledger.append([(1, _batch("a", 3, producer="prod")), (2, _batch("b", 2))])
    topic.ledger.append([(1, _batch("c", 2, producer="prod", first_seq=3))])
    copy_ledger(topic.ledger, topic.logs)
    log = topic.logs[1]
    assert log.last_seq_no("prod") == 4
    again = log.append(_batch("c", 2, producer="prod", first_seq=3))  # a retry: duplicates
    assert again.status.tolist() == [DUPLICATE, DUPLICATE]
    assert again.offsets.tolist() == [3, 4]
    fresh = log.append(_batch("d", 1, producer="prod", first_seq=5))
    assert fresh.status.tolist() == [WRITTEN] and fresh.offsets.tolist() == [5]


@pytest.mark.parametrize("resume", ["same-process", "reopen"])
def test_a_failure_between_append_and_release_copies_nothing_twice(
    topic: _Topic, resume: str
) -> None:
    statements = _statements(random.Random(7), 20)
    assert topic.ledger is not None
    for shares in statements:
        topic.ledger.append(shares)
    failpoints.activate("ledger.copy_after_append=error@3")
    try:
        with pytest.raises(StorageIOError):
            copy_ledger(topic.ledger, topic.logs)
    finally:
        failpoints.deactivate()
    behind = {p: (topic.ledger.start_offset(p), log.end_offset)
              for p, log in topic.logs.items()}  # fmt: skip
    stuck = [p for p, (start, own) in behind.items() if own > start]
    assert len(stuck) == 1, behind  # the third partition: appended, not released
    if resume == "reopen":
        topic.close()
        topic.open()
        skipped_expected = 0  # the open does not index shares below the logs' ends
    else:
        start, own = behind[stuck[0]]
        skipped_expected = own - start
    report = copy_ledger(topic.ledger, topic.logs)
    assert report.skipped == skipped_expected
    assert topic.ledger.pending() == {}
    for partition, data in _expected(statements).items():
        assert topic.data(partition) == data  # dense, each message once


def test_a_log_ending_inside_a_share_is_refused(topic: _Topic) -> None:
    assert topic.ledger is not None
    topic.ledger.append([(0, _batch("a", 3))])
    topic.logs[0].append(_batch("x", 1))  # not the copy: ends inside the share
    with pytest.raises(CorruptSegmentError, match="not at the end of a share"):
        copy_ledger(topic.ledger, topic.logs)
    assert topic.logs[0].end_offset == 1 and topic.ledger.start_offset(0) == 0
    # a log past the ledger's end too
    topic.logs[0].append(_batch("y", 3))
    with pytest.raises(CorruptSegmentError):
        copy_ledger(topic.ledger, topic.logs)


def test_a_log_ending_below_the_ledgers_start_is_refused(tmp_path: Path) -> None:
    fs = FileSystem()
    ledger = Ledger(fs, str(tmp_path / "ledger"), partition_ends={0: 5})
    config = TopicConfig(fsync_policy=FsyncPolicy.NEVER).validate()
    log = PartitionLog(fs, str(tmp_path / "p0"), 0, config, ManualClock())
    try:
        ledger.append([(0, _batch("a", 2))])
        with pytest.raises(CorruptSegmentError, match="below the ledger's copied start"):
            copy_ledger(ledger, {0: log})
        assert log.end_offset == 0
        with pytest.raises(KeyError):
            copy_ledger(ledger, {})
    finally:
        ledger.close()
        log.close()


def test_append_copied_refuses_another_offset_and_syncs(tmp_path: Path) -> None:
    class Counting(FileSystem):
        syncs = 0

        def sync(self, fd: int) -> None:
            Counting.syncs += 1
            super().sync(fd)

    config = TopicConfig(fsync_policy=FsyncPolicy.NEVER).validate()
    log = PartitionLog(Counting(), str(tmp_path / "p0"), 0, config, ManualClock())
    try:
        with pytest.raises(CorruptSegmentError, match="the log ends at 0"):
            log.append_copied(_batch("a", 2), 1, 5)
        assert log.end_offset == 0
        before = Counting.syncs
        log.append_copied(_batch("a", 2), 0, 5)
        assert Counting.syncs > before, "a copy is synced whatever the fsync policy"
        assert log.end_offset == 2 and log.durable_end == 2
    finally:
        log.close()


def test_a_large_copy_goes_in_pieces_cut_between_shares(
    topic: _Topic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows over the piece size go to a log in several appends, each of whole shares and
    each under the batch limits (a slice of one gathered table would carry all of its
    buffers); a failure between two pieces leaves the log at a share's edge (the reopen
    accepts it, the copy resumes)."""
    from storage import limits

    monkeypatch.setattr(limits, "BATCH_BYTES_MAX", 64 * 1024)
    monkeypatch.setattr(limits, "LEDGER_COPY_PIECE_BYTES", 8 * 1024)
    assert topic.ledger is not None
    statements = [[(p, _batch(f"{k}.{p}" + "x" * 200, 3)) for p in range(4)] for k in range(40)]
    for shares in statements:
        topic.ledger.append(shares)
    failpoints.activate("ledger.copy_after_append=error@6")
    try:
        with pytest.raises(StorageIOError):
            copy_ledger(topic.ledger, topic.logs)
    finally:
        failpoints.deactivate()
    assert 0 < topic.logs[0].end_offset < 120 and topic.logs[0].end_offset % 3 == 0
    topic.close()
    topic.open()  # a log ending inside a share would be refused here
    report = copy_ledger(topic.ledger, topic.logs)
    assert report.appends > 4  # more than one append a partition
    assert topic.ledger.pending() == {}
    for partition, data in _expected(statements).items():
        assert topic.data(partition) == data


def test_row_sizes_of_a_sliced_frame_are_its_own_rows() -> None:
    from storage.ledger_copy import _row_bytes

    batch = build_wire_batch([b"a" * n for n in (1, 10, 100, 1000, 5)])
    sizes = _row_bytes(batch.slice(2, 2))
    assert (sizes - sizes.min()).tolist() == [0, 900]  # 100 and 1000 bytes, same share


def _frames(rng: random.Random) -> list[pa.RecordBatch]:
    """Frames as ``Ledger.read_many`` gives them: some sliced, some with empty messages."""
    frames = []
    for k in range(6):
        count = rng.randint(1, 9)
        frame = build_wire_batch(
            [bytes([k]) * rng.randint(0, 40) for _ in range(count + 2)],
            producer_id=f"p{k}", seq_no=list(range(count + 2)),
        )  # fmt: skip
        frames.append(frame.slice(1, count) if k % 2 else frame.slice(0, count))
    return frames


def test_rows_gathered_from_spans_are_the_whole_reads_rows_in_order() -> None:
    """``_gathered`` gives what one ``take`` over the whole read gives, for any rows in any
    order (runs of shares, single rows, rows of one frame, every row reversed)."""
    import numpy as np

    from storage.ledger_copy import _gathered

    rng = random.Random(36)
    for _ in range(200):
        frames = _frames(rng)
        lengths = np.array([f.num_rows for f in frames])
        frame_of_row = np.repeat(np.arange(len(frames)), lengths)
        firsts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        whole = pa.Table.from_batches(frames)
        total = int(lengths.sum())
        rows = np.array(rng.sample(range(total), rng.randint(1, total)), np.int64)
        if rng.random() < 0.3:
            rows = np.arange(total - 1, -1, -1)
        got = _gathered(frames, frame_of_row, firsts, rows)
        expected = whole.take(pa.array(rows)).combine_chunks().to_batches()[0]
        assert got.equals(expected)


def test_a_group_is_gathered_from_its_own_rows_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows of consecutive partitions (as the copy groups them) are taken from a
    table of their own spans, never from the whole read (a ``take`` over all chunks
    joins them first: a copy of the whole read for every group)."""
    import numpy as np

    from storage import ledger_copy

    frames = [build_wire_batch([f"{f}.{p}".encode() * 50 for p in range(10) for _ in range(3)])
              for f in range(4)]  # fmt: skip
    lengths = np.array([f.num_rows for f in frames])
    frame_of_row = np.repeat(np.arange(len(frames)), lengths)
    firsts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    partition = np.tile(np.repeat(np.arange(10), 3), 4)
    order = np.argsort(partition, kind="stable")
    group = order[(partition[order] >= 4) & (partition[order] < 6)]  # partitions 4 and 5
    joined: list[int] = []
    concat = pa.concat_batches
    monkeypatch.setattr(ledger_copy.pa, "concat_batches",
                        lambda spans: joined.append(sum(s.num_rows for s in spans))
                        or concat(spans))  # fmt: skip
    got = ledger_copy._gathered(frames, frame_of_row, firsts, group)
    assert joined == [len(group)] == [24]  # 2 partitions x 3 rows x 4 frames, no more
    assert got.column("data").to_pylist() == [
        f"{f}.{p}".encode() * 50 for p in (4, 5) for f in range(4) for _ in range(3)
    ]


def test_grouped_pieces_never_take_from_the_whole_read(
    topic: _Topic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy of many frames takes each group of pieces from its own spans: no ``take``
    is made over a table of more than one chunk (one over the read's frames joined them
    all first), and the logs get every row."""
    from storage import limits
    from tests.take_spy import spy_takes

    monkeypatch.setattr(limits, "LEDGER_COPY_PIECE_BYTES", 2 * 1024)  # several groups
    assert topic.ledger is not None
    statements = [[(p, _batch(f"{k}.{p}" + "x" * 100, 2)) for p in range(PARTITIONS)]
                  for k in range(12)]  # fmt: skip
    for shares in statements:
        topic.ledger.append(shares)
    chunks = spy_takes(monkeypatch)
    report = copy_ledger(topic.ledger, topic.logs)
    assert report.messages == 12 * 2 * PARTITIONS and report.appends > PARTITIONS
    assert chunks and max(chunks) == 1
    for partition, data in _expected(statements).items():
        assert topic.data(partition) == data


def _reference_pieces(ordered: list[int], frame_of_row: list[int], row_bytes: list[int],
                      cap: int, most: int) -> list[tuple[int, int, int]]:  # fmt: skip
    """The pieces by their rule, one share at a time: shares (runs of one partition and
    one frame) join the piece before them while it is the same partition's and stays
    within ``cap`` bytes and ``most`` rows."""
    pieces: list[tuple[int, int, int]] = []
    first = 0
    for row in range(1, len(ordered) + 1):
        if row < len(ordered) and (ordered[row], frame_of_row[row]) == (
                ordered[first], frame_of_row[first]):  # fmt: skip
            continue
        size = sum(row_bytes[first:row])
        if pieces:
            low, high, held = pieces[-1]
            if (high == first and ordered[low] == ordered[first] and held + size <= cap
                    and row - low <= most):  # fmt: skip
                pieces[-1] = (low, row, held + size)
                first = row
                continue
        pieces.append((first, row, size))
        first = row
    return pieces


@pytest.mark.parametrize("seed", range(40))
def test_pieces_follow_the_rule_share_by_share(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_pieces`` finds a partition that fits the limits as one piece with array
    operations and cuts the others share by share: the same pieces as the rule applied
    one share at a time, for limits that cut nothing, some partitions or every share."""
    rng = random.Random(seed)
    rows: list[tuple[int, int]] = []
    partitions = rng.randrange(1, 12)
    for frame in range(rng.randrange(1, 10)):
        for partition in sorted(rng.sample(range(partitions), rng.randrange(1, partitions + 1))):
            rows += [(partition, frame)] * rng.randrange(1, 6)
    rows.sort(key=lambda row: row[0])  # stable: each partition's rows in frame order
    ordered = [partition for partition, _ in rows]
    frames = [frame for _, frame in rows]
    sizes = [rng.choice([1, 10, 100, 1000, 5000]) for _ in rows]
    for cap, most in [(10**9, 10**9), (3000, 10**9), (10**9, 7), (2000, 5), (1, 1)]:
        monkeypatch.setattr(limits, "LEDGER_COPY_PIECE_BYTES", cap)
        monkeypatch.setattr(limits, "BATCH_MESSAGES_MAX", most)
        found = ledger_copy._pieces(np.array(ordered), np.array(frames), np.array(sizes))
        assert found == _reference_pieces(ordered, frames, sizes, cap, most), (cap, most)
