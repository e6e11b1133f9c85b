"""The ledger (``storage.ledger``): appends, the per-partition index, reads, recovery from
torn tails and damage, retention behind the copy, and a failed sync."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from storage import failpoints, limits
from storage import ledger_format as fmt
from storage.errors import CorruptSegmentError, LimitExceededError, StorageIOError
from storage.fs import FileSystem
from storage.ledger import Ledger, is_small_share
from storage.ledger_route import lowest_offsets
from storage.record_batch import READ_SCHEMA, build_wire_batch


def _batch(tag: str, count: int) -> pa.RecordBatch:
    return build_wire_batch([f"{tag}/{i}".encode() for i in range(count)],
                            producer_id=f"p-{tag}", seq_no=list(range(count)))  # fmt: skip


def _statements(rng: random.Random, count: int, partitions: int = 30):
    """``count`` statements: each a list of (partition, batch), partitions increasing."""
    out = []
    for k in range(count):
        chosen = sorted(rng.sample(range(partitions), rng.randint(1, partitions)))
        out.append([(p, _batch(f"{k}.{p}", rng.randint(1, 4))) for p in chosen])
    return out


def _expected(statements) -> dict[int, list[bytes]]:
    expected: dict[int, list[bytes]] = {}
    for shares in statements:
        for partition, batch in shares:
            expected.setdefault(partition, []).extend(batch.column("data").to_pylist())
    return expected


def _files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.ledger"))


@pytest.fixture
def ledger_dir(tmp_path: Path) -> Path:
    return tmp_path / "ledger"


def test_appends_give_dense_offsets_and_reads_return_each_partitions_messages(
    ledger_dir: Path,
) -> None:
    statements = _statements(random.Random(1), 40)
    ledger = Ledger(FileSystem(), str(ledger_dir))
    ends: dict[int, int] = {}
    for shares in statements:
        bases = ledger.append(shares, written_at_us=1_000)
        for (partition, batch), base in zip(shares, bases, strict=True):
            assert base == ends.get(partition, 0)
            ends[partition] = base + batch.num_rows
    for partition, data in _expected(statements).items():
        batch = ledger.read(partition, 0)
        assert batch.schema.equals(READ_SCHEMA)
        assert batch.column("data").to_pylist() == data
        assert batch.column("offset").to_pylist() == list(range(len(data)))
        assert set(batch.column("written_at").cast(pa.int64()).to_pylist()) == {1_000}
        assert ledger.end_offset(partition) == len(data)
        middle = len(data) // 2
        part = ledger.read(partition, middle, max_messages=3)
        assert part.column("data").to_pylist() == data[middle : middle + 3]
        assert part.column("offset").to_pylist()[0] == middle
    assert ledger.read(0, ledger.end_offset(0)).num_rows == 0
    with pytest.raises(ValueError):
        ledger.read(0, ledger.end_offset(0) + 1)
    ledger.close()


def test_reopen_rebuilds_every_index_and_continues(ledger_dir: Path) -> None:
    rng = random.Random(2)
    first, second = _statements(rng, 25), _statements(rng, 10)
    ledger = Ledger(FileSystem(), str(ledger_dir), file_bytes_max=8 * 1024)
    for shares in first:
        ledger.append(shares)
    ledger.close()
    assert len(_files(ledger_dir)) > 2  # frames in several files
    ledger = Ledger(FileSystem(), str(ledger_dir), file_bytes_max=8 * 1024)
    for shares in second:
        ledger.append(shares)
    ledger.close()
    ledger = Ledger(FileSystem(), str(ledger_dir))
    for partition, data in _expected(first + second).items():
        assert ledger.read(partition, 0).column("data").to_pylist() == data
    ledger.close()


@pytest.mark.parametrize("file_bytes", [limits.LEDGER_FILE_BYTES_MAX, 4096])
def test_group_commit_shares_syncs_between_threads(ledger_dir: Path, file_bytes: int) -> None:
    """Six appenders and a reader: rounds share syncs (and, with small files, a round's
    frames may start a new file midway); the reader only ever sees dense prefixes."""
    fs = FileSystem()
    # a leader waits for company
    ledger = Ledger(fs, str(ledger_dir), window_us=2000, file_bytes_max=file_bytes)
    syncs = fs.fsync_count
    per_thread = [_statements(random.Random(10 + t), 30, partitions=8) for t in range(6)]
    barrier = threading.Barrier(6)
    results: dict[int, list[list[int]]] = {}
    done = threading.Event()
    seen: list[int] = []

    def run(thread: int) -> None:
        barrier.wait()
        results[thread] = [ledger.append(shares) for shares in per_thread[thread]]

    def read() -> None:
        while not done.is_set():
            for partition in range(8):
                batch = ledger.read(partition, 0)
                dense = batch.column("offset").to_pylist() == list(range(batch.num_rows))
                seen.append(batch.num_rows if dense else -1)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(6)]
    reader = threading.Thread(target=read)
    reader.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    reader.join()
    assert seen and min(seen) >= 0 and len(results) == 6
    assert fs.fsync_count - syncs < 180  # fewer syncs than appends: rounds were shared
    for thread, statements in enumerate(per_thread):
        for shares, bases in zip(statements, results[thread], strict=True):
            for (partition, batch), base in zip(shares, bases, strict=True):
                held = ledger.read(partition, base, max_messages=batch.num_rows)
                assert held.column("data").to_pylist() == batch.column("data").to_pylist()
    for partition in range(8):
        assert ledger.read(partition, 0).num_rows == ledger.end_offset(partition)
    ledger.close()
    if file_bytes < limits.LEDGER_FILE_BYTES_MAX:
        assert len(_files(ledger_dir)) > 3
    reopened = Ledger(FileSystem(), str(ledger_dir))
    for thread, statements in enumerate(per_thread):
        for shares, bases in zip(statements, results[thread], strict=True):
            for (partition, batch), base in zip(shares, bases, strict=True):
                held = reopened.read(partition, base, max_messages=batch.num_rows)
                assert held.column("data").to_pylist() == batch.column("data").to_pylist()
    reopened.close()


def test_torn_tail_drops_the_unfinished_frame_only(ledger_dir: Path) -> None:
    statements = _statements(random.Random(3), 6)
    ledger = Ledger(FileSystem(), str(ledger_dir))
    for shares in statements:
        ledger.append(shares)
    ledger.close()
    (path,) = _files(ledger_dir)
    frames, _ = fmt.scan(path.read_bytes(), str(path))
    cut = frames[-1].position + (frames[-1].end - frames[-1].position) // 2
    os.truncate(path, cut)
    ledger = Ledger(FileSystem(), str(ledger_dir))
    for partition, data in _expected(statements[:-1]).items():
        assert ledger.read(partition, 0).column("data").to_pylist() == data
    # the next frame takes the lost one's offsets and sequence, in a new file
    bases = ledger.append(statements[-1])
    expected = _expected(statements[:-1])
    assert bases == [len(expected.get(p, [])) for p, _ in statements[-1]]
    ledger.close()
    assert len(_files(ledger_dir)) == 2
    ledger = Ledger(FileSystem(), str(ledger_dir))
    for partition, data in _expected(statements).items():
        assert ledger.read(partition, 0).column("data").to_pylist() == data
    ledger.close()


@pytest.mark.parametrize("where", ["header", "table", "body"])
def test_a_bad_checksum_in_the_last_frame_is_a_torn_tail(ledger_dir: Path, where: str) -> None:
    statements = _statements(random.Random(4), 5)
    ledger = Ledger(FileSystem(), str(ledger_dir))
    for shares in statements:
        ledger.append(shares)
    ledger.close()
    (path,) = _files(ledger_dir)
    frames, _ = fmt.scan(path.read_bytes(), str(path))
    last = frames[-1]
    at = {"header": last.position + 20, "table": last.position + fmt.HEADER_BYTES + 1,
          "body": last.body_position + 40}[where]  # fmt: skip
    _flip(path, at)
    ledger = Ledger(FileSystem(), str(ledger_dir))
    for partition, data in _expected(statements[:-1]).items():
        assert ledger.read(partition, 0).column("data").to_pylist() == data
    ledger.close()


def test_a_bad_checksum_before_valid_frames_is_refused(ledger_dir: Path) -> None:
    statements = _statements(random.Random(5), 5)
    ledger = Ledger(FileSystem(), str(ledger_dir))
    for shares in statements:
        ledger.append(shares)
    ledger.close()
    (path,) = _files(ledger_dir)
    frames, _ = fmt.scan(path.read_bytes(), str(path))
    _flip(path, frames[2].body_position + 8)
    with pytest.raises(CorruptSegmentError) as raised:
        Ledger(FileSystem(), str(ledger_dir))
    assert raised.value.position == frames[2].position


def test_a_damaged_frame_is_refused_on_its_first_read(ledger_dir: Path) -> None:
    ledger = Ledger(FileSystem(), str(ledger_dir))
    ledger.append([(0, _batch("a", 3)), (1, _batch("b", 2))])
    ledger.append([(1, _batch("c", 2))])
    ledger.close()
    ledger = Ledger(FileSystem(), str(ledger_dir))  # recovered: no frame read yet
    (path,) = _files(ledger_dir)
    frames, _ = fmt.scan(path.read_bytes(), str(path))
    _flip(path, frames[0].body_position + 16)
    with pytest.raises(CorruptSegmentError):
        ledger.read(0, 0)
    assert ledger.read(1, 2).column("data").to_pylist() == [b"c/0", b"c/1"]
    ledger.close()


def test_a_missing_file_in_the_middle_is_refused(ledger_dir: Path) -> None:
    ledger = Ledger(FileSystem(), str(ledger_dir), file_bytes_max=1024)
    for shares in _statements(random.Random(6), 8, partitions=4):
        ledger.append(shares)
    ledger.close()
    files = _files(ledger_dir)
    assert len(files) >= 3
    files[1].unlink()
    with pytest.raises(CorruptSegmentError):
        Ledger(FileSystem(), str(ledger_dir))


def test_shares_copied_into_the_partitions_are_not_indexed(ledger_dir: Path) -> None:
    ledger = Ledger(FileSystem(), str(ledger_dir), partition_ends={0: 10, 1: 4})
    assert ledger.append([(0, _batch("a", 3)), (1, _batch("b", 2)), (2, _batch("c", 1))]) == [
        10, 4, 0]  # fmt: skip
    assert ledger.append([(0, _batch("d", 2))]) == [13]
    ledger.close()
    # partition 0 copied up to 13 (its first share), partition 1 not at all
    ledger = Ledger(FileSystem(), str(ledger_dir), partition_ends={0: 13, 1: 4})
    assert ledger.start_offset(0) == 13 and ledger.end_offset(0) == 15
    assert ledger.read(0, 13).column("data").to_pylist() == [b"d/0", b"d/1"]
    with pytest.raises(ValueError):
        ledger.read(0, 10)
    assert ledger.read(1, 4).column("data").to_pylist() == [b"b/0", b"b/1"]
    assert ledger.append([(0, _batch("e", 1))]) == [15]
    ledger.close()


def test_a_share_that_straddles_its_partitions_own_end_is_refused(ledger_dir: Path) -> None:
    ledger = Ledger(FileSystem(), str(ledger_dir), partition_ends={0: 10})
    ledger.append([(0, _batch("a", 3))])  # [10, 13)
    ledger.close()
    with pytest.raises(CorruptSegmentError):
        Ledger(FileSystem(), str(ledger_dir), partition_ends={0: 11})
    ledger = Ledger(FileSystem(), str(ledger_dir), partition_ends={0: 20})  # copied, and more
    assert ledger.start_offset(0) == ledger.end_offset(0) == 20
    ledger.close()


def test_the_newest_copied_files_are_kept_within_a_budget_and_read_whole(
    ledger_dir: Path,
) -> None:
    """``drop_copied_files(keep_bytes)`` deletes the copied files from the front but keeps
    the newest of them up to the budget (round 33); their frames stay indexed and a
    consumer at their edges takes them whole; files older than ``keep_since_us`` go
    whatever the budget."""
    ledger = Ledger(FileSystem(), str(ledger_dir), file_bytes_max=1024)
    for k in range(12):
        ledger.append([(0, _batch(f"x{k}", 2)), (1, _batch(f"y{k}", 1))])
    ledger.close()  # reopened: the last file is not being written any more
    ledger = Ledger(FileSystem(), str(ledger_dir), partition_ends={0: 0, 1: 0})
    files = ledger.file_numbers
    assert len(files) >= 4
    paths = _files(ledger_dir)
    assert len(paths) == len(files)
    ledger.release(0, 24)
    ledger.release(1, 12)  # everything copied
    budget = paths[-1].stat().st_size + paths[-2].stat().st_size  # two fit, a third not
    assert ledger.drop_copied_files(budget) == len(files) - 2
    assert ledger.file_numbers == files[-2:]
    kept = ledger.whole_frames({0: 0, 1: 0}, 10_000, 1 << 30)
    assert kept is None  # the consumer stands below the kept frames: not at their edges
    first = min(ledger._index.live_chunks(), key=lambda chunk: chunk.frame)
    starts = dict(zip(first.partitions.tolist(), first.bases.tolist(), strict=True))
    whole = ledger.whole_frames(starts, 10_000, 1 << 30)
    assert whole is not None and whole.next_offsets == {0: 24, 1: 12}
    assert ledger.drop_copied_files(budget) == 0  # within the budget still
    assert ledger.drop_copied_files(budget, keep_since_us=0) == 0  # none too old
    future = time.time_ns() // 1000 + 1  # every frame older than this: none kept
    assert ledger.drop_copied_files(budget, keep_since_us=future) == 2
    assert _files(ledger_dir) == []
    ledger.close()


def _twelve_copied(ledger_dir: Path) -> tuple[Ledger, list[int]]:
    """Twelve frames of two shares (partition 0: 2 rows, 1: 1 row) in 1 KiB files, all
    copied; the last file is still being written. The ledger and its file numbers."""
    ledger = Ledger(FileSystem(), str(ledger_dir), file_bytes_max=1024)
    for k in range(12):
        ledger.append([(0, _batch(f"x{k}", 2)), (1, _batch(f"y{k}", 1))])
    ledger.release(0, 24)
    ledger.release(1, 12)
    return ledger, ledger.file_numbers


def test_copied_files_are_kept_within_a_budget_of_indexed_shares(ledger_dir: Path) -> None:
    """The kept files' shares stay indexed (~200 bytes of memory each): ``keep_shares``
    bounds them whatever the byte budget (round 34), newest files kept first."""
    ledger, files = _twelve_copied(ledger_dir)
    assert len(files) >= 4
    copied = [ledger._files[n] for n in files[:-1]]
    assert all(entry.shares == 2 * (entry.last - entry.first + 1) for entry in copied)
    room = copied[-1].shares + copied[-2].shares  # two files' shares fit, a third's not
    assert ledger.drop_copied_files(1 << 30, keep_shares=room) == len(copied) - 2
    assert ledger.file_numbers == files[-3:]
    assert ledger.drop_copied_files(1 << 30, keep_shares=room) == 0
    assert ledger.drop_copied_files(1 << 30, keep_shares=room - 1) == 1  # one fits now
    assert ledger.drop_copied_files(1 << 30) == 0  # the default: LEDGER_KEEP_COPIED_SHARES
    ledger.close()


def test_copied_files_a_reader_has_not_read_are_kept_past_the_budget(ledger_dir: Path) -> None:
    """Past ``keep_bytes``, files holding a frame some reader has not read stay, within
    ``keep_unread_bytes`` (round 35): from the oldest file with an unread frame on, and
    never a hole (a file not kept takes every older one with it)."""
    ledger, files = _twelve_copied(ledger_dir)
    assert len(files) >= 5
    copied = [ledger._files[n] for n in files[:-1]]
    one = copied[-1].size  # the budget keeps the newest copied file only
    everything = sum(entry.size for entry in copied)
    assert ledger.copied_file_bytes() == everything
    # a reader at the third copied file's first frame: that file and the newer ones stay
    third = copied[2]
    at = {0: 2 * third.first, 1: third.first}
    assert ledger._index.first_unread_frame(at) == third.first
    assert ledger.drop_copied_files(one, unread=at, keep_unread_bytes=everything) == 2
    assert ledger.file_numbers == files[2:]
    # a second reader further on changes nothing (the lowest offset counts) ...
    lowest = lowest_offsets([{0: 24, 1: 12}, at])
    assert lowest == at
    assert ledger.drop_copied_files(one, unread=lowest, keep_unread_bytes=everything) == 0
    # ... nor does a reader past one partition only: the other is still unread there
    assert ledger.drop_copied_files(one, unread={0: 24, 1: third.first},
                                    keep_unread_bytes=everything) == 0  # fmt: skip
    # the larger budget bounds them still: the oldest unread go first
    kept = [ledger._files[n] for n in ledger.file_numbers[:-1]]
    two = kept[-1].size + kept[-2].size
    assert ledger.drop_copied_files(one, unread=at, keep_unread_bytes=two) == len(kept) - 2
    # without a reader (or with every reader past them) the budget alone is kept
    assert ledger._index.first_unread_frame({0: 24, 1: 12}) is None
    assert ledger.drop_copied_files(one, unread={0: 24, 1: 12},
                                    keep_unread_bytes=everything) == 1  # fmt: skip
    assert ledger.file_numbers == files[-2:]
    # the age bound holds for unread files too
    future = time.time_ns() // 1000 + 1
    assert ledger.drop_copied_files(one, future, unread={}, keep_unread_bytes=everything) == 1
    assert ledger.file_numbers == files[-1:]
    ledger.close()


def test_the_first_unread_frame_is_the_oldest_over_partitions_and_readers(
    ledger_dir: Path,
) -> None:
    """``first_unread_frame``: per partition the first share ending past the readers'
    lowest offset (``lowest_offsets``: a partition absent from a reader counts from 0),
    the oldest frame over all partitions."""
    ledger = Ledger(FileSystem(), str(ledger_dir))
    ledger.append([(0, _batch("a", 3)), (1, _batch("b", 2))])  # frame 0: 0 [0,3) 1 [0,2)
    ledger.append([(0, _batch("c", 2))])  # frame 1: 0 [3,5)
    ledger.append([(1, _batch("d", 2))])  # frame 2: 1 [2,4)
    index = ledger._index
    frames = [chunk.frame for chunk in index.live_chunks()]
    assert index.first_unread_frame({0: 0, 1: 0}) == frames[0]
    assert index.first_unread_frame({0: 2}) == frames[0]  # partition 1 unread from 0
    assert index.first_unread_frame({0: 3, 1: 2}) == frames[1]
    assert index.first_unread_frame({0: 5, 1: 2}) == frames[2]
    assert index.first_unread_frame({0: 5, 1: 3}) == frames[2]  # mid-share: unread
    assert index.first_unread_frame({0: 5, 1: 4}) is None
    assert lowest_offsets([{0: 5, 1: 4}, {0: 4, 1: 4}]) == {0: 4, 1: 4}
    assert lowest_offsets([{0: 5, 1: 4}, {1: 4}]) == {0: 0, 1: 4}  # absent: 0
    assert index.first_unread_frame(lowest_offsets([{0: 5, 1: 4}, {0: 4, 1: 4}])) == frames[1]
    ledger.close()


def test_a_share_past_its_partitions_own_end_is_refused(ledger_dir: Path) -> None:
    ledger = Ledger(FileSystem(), str(ledger_dir), partition_ends={0: 10})
    ledger.append([(0, _batch("a", 3))])  # [10, 13)
    ledger.close()
    with pytest.raises(CorruptSegmentError):
        Ledger(FileSystem(), str(ledger_dir), partition_ends={0: 7})  # [7, 10) nowhere


def test_retention_deletes_front_files_once_their_shares_are_copied(ledger_dir: Path) -> None:
    ledger = Ledger(FileSystem(), str(ledger_dir), file_bytes_max=1024)
    statements = [[(0, _batch(f"x{k}", 2)), (1, _batch(f"y{k}", 1))] for k in range(12)]
    for shares in statements:
        ledger.append(shares)
    files = ledger.file_numbers
    assert len(files) >= 3
    ledger.release(0, 24)  # partition 0 copied whole, partition 1 not at all
    assert ledger.drop_copied_files() == 0
    ledger.release(1, 4)  # the first 4 statements of partition 1
    dropped = ledger.drop_copied_files()
    assert 1 <= dropped < len(files)
    assert ledger.file_numbers == files[dropped:]
    assert ledger.read(1, 4).column("data").to_pylist() == [
        f"y{k}/0".encode() for k in range(4, 12)]  # fmt: skip
    ledger.close()
    ledger = Ledger(FileSystem(), str(ledger_dir), partition_ends={0: 24, 1: 4})
    assert ledger.read(1, 4).num_rows == 8 and ledger.end_offset(0) == 24
    ledger.release(1, 12)
    left = len(ledger.file_numbers)
    assert ledger.drop_copied_files() == left and _files(ledger_dir) == []
    ledger.close()
    ledger = Ledger(FileSystem(), str(ledger_dir))
    with pytest.raises(ValueError):
        ledger.release(0, 1)  # nothing left, no own end given: partition 0 ends at 0
    ledger.close()


def test_a_failed_sync_refuses_appends_until_reopened(ledger_dir: Path) -> None:
    ledger = Ledger(FileSystem(), str(ledger_dir))
    ledger.append([(0, _batch("a", 1))])
    failpoints.activate("ledger.after_write=error")
    try:
        with pytest.raises(StorageIOError):
            ledger.append([(0, _batch("b", 1))])
    finally:
        failpoints.deactivate()
    with pytest.raises(StorageIOError):
        ledger.append([(0, _batch("c", 1))])
    assert ledger.read(0, 0).column("data").to_pylist() == [b"a/0"]
    ledger.close()
    ledger = Ledger(FileSystem(), str(ledger_dir))
    # the failed frame reached the file (the error came after the write): present, not acked
    assert ledger.read(0, 0).column("data").to_pylist() == [b"a/0", b"b/0"]
    assert ledger.append([(0, _batch("c", 1))]) == [2]
    ledger.close()


def test_bad_shares_are_refused_before_anything_is_written(ledger_dir: Path) -> None:
    ledger = Ledger(FileSystem(), str(ledger_dir))
    with pytest.raises(ValueError):
        ledger.append([(1, _batch("a", 1)), (1, _batch("b", 1))])
    with pytest.raises(ValueError):
        ledger.append([(2, _batch("a", 1)), (1, _batch("b", 1))])
    with pytest.raises(ValueError):
        ledger.append([(0, _batch("a", 0))])
    with pytest.raises(ValueError):
        ledger.append([(0, pa.record_batch({"x": [1]}))])
    with pytest.raises(ValueError):
        ledger.append([])
    big = build_wire_batch([b"z" * (1 << 20)] * (limits.LEDGER_FRAME_BYTES_MAX >> 20))
    with pytest.raises(LimitExceededError):
        ledger.append([(0, big)])
    assert _files(ledger_dir) == [] and ledger.end_offset(0) == 0
    ledger.close()


def test_small_share_threshold() -> None:
    assert is_small_share(build_wire_batch([b"m" * 1000] * 5))
    assert not is_small_share(build_wire_batch([b"m" * (limits.LEDGER_SHARE_BYTES_MAX + 1)]))


def _flip(path: Path, position: int) -> None:
    with open(path, "r+b") as file:
        file.seek(position)
        byte = file.read(1)
        file.seek(position)
        file.write(bytes([byte[0] ^ 0x5A]))


def test_frames_missing_between_files_are_refused_even_if_copied(ledger_dir: Path) -> None:
    """Files go from the front only: a hole in the frames' sequence is damage even when the
    partitions' own ends cover the missing shares."""
    ledger = Ledger(FileSystem(), str(ledger_dir), file_bytes_max=600)
    for k in range(8):
        ledger.append([(0, _batch(f"s{k}", 2))])
    ledger.close()
    files = _files(ledger_dir)
    assert len(files) >= 3
    kept_first = fmt.scan(files[2].read_bytes(), str(files[2]))[0][0]
    own_end = int(kept_first.shares["base"][0])  # everything before file 2 copied
    files[1].unlink()
    with pytest.raises(CorruptSegmentError):
        Ledger(FileSystem(), str(ledger_dir), partition_ends={0: own_end})
    files[0].unlink()  # from the front: fine
    ledger = Ledger(FileSystem(), str(ledger_dir), partition_ends={0: own_end})
    assert ledger.read(0, own_end).num_rows == 16 - own_end
    ledger.close()


@pytest.mark.parametrize("max_messages", [1, 7, 50, 10_000])
def test_read_many_gives_each_partition_a_prefix_from_its_start(
    ledger_dir: Path, max_messages: int
) -> None:
    statements = _statements(random.Random(7), 20, partitions=12)
    ledger = Ledger(FileSystem(), str(ledger_dir), file_bytes_max=4096)
    for shares in statements:
        ledger.append(shares)
    expected = _expected(statements)
    starts = {p: len(data) // 3 for p, data in expected.items() if p % 4}  # 0, 4, 8 not read
    table, partitions = ledger.read_many(starts, max_messages)
    assert table.schema.equals(READ_SCHEMA)
    assert table.num_rows == len(partitions) == min(
        max_messages, sum(len(expected[p]) - s for p, s in starts.items()))  # fmt: skip
    offsets = table.column("offset").to_pylist()
    data = table.column("data").to_pylist()
    for partition, start in starts.items():
        mine = [i for i, p in enumerate(partitions.tolist()) if p == partition]
        assert [offsets[i] for i in mine] == list(range(start, start + len(mine)))
        assert [data[i] for i in mine] == expected[partition][start : start + len(mine)]
    with pytest.raises(ValueError):
        ledger.read_many({0: len(expected[0]) + 1}, 10)
    ledger.close()


def test_read_many_of_whole_frames_is_zero_copy(ledger_dir: Path) -> None:
    ledger = Ledger(FileSystem(), str(ledger_dir))
    for k in range(3):
        ledger.append([(p, _batch(f"{k}.{p}", 2)) for p in range(5)])
    table, partitions = ledger.read_many({p: 0 for p in range(5)}, 30)
    assert table.num_rows == 30
    assert partitions.tolist() == [p for _ in range(3) for p in range(5) for _ in range(2)]
    (number,) = ledger.file_numbers
    mapped = ledger._files[number].mapped  # the file's read map
    if mapped is None:
        pytest.skip("read maps are off (TOPICBASE_READ_MAPS=0)")
    data = table.column("data")
    assert data.num_chunks == 3
    for chunk in data.chunks:  # the messages' bytes are in the map: no copy was made
        address = chunk.buffers()[2].address
        assert mapped.address <= address < mapped.address + mapped.size
    part, _ = ledger.read_many({0: 1, 1: 0}, 30)  # a frame in part: one take, a copy
    assert part.column("data").to_pylist()[:3] == [b"0.0/1", b"0.1/0", b"0.1/1"]
    ledger.close()


class _Journal(FileSystem):
    """Records removals and directory syncs, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    def remove(self, path: str) -> None:
        self.events.append("remove")
        super().remove(path)

    def sync_directory(self, path: str) -> None:
        self.events.append("sync")
        super().sync_directory(path)


def test_each_removal_is_durable_before_the_next(ledger_dir: Path) -> None:
    """A crash between two removals must not bring back the earlier file alone: the open
    would find a hole in the sequence numbers."""
    fs = _Journal()
    ledger = Ledger(fs, str(ledger_dir), file_bytes_max=600)
    for k in range(8):
        ledger.append([(0, _batch(f"s{k}", 2))])
    ledger.release(0, 16)
    fs.events.clear()
    assert ledger.drop_copied_files() >= 3
    removals = [i for i, event in enumerate(fs.events) if event == "remove"]
    assert all(fs.events[i + 1] == "sync" for i in removals)
    ledger.close()


def test_large_partition_numbers_and_reads_after_close(ledger_dir: Path) -> None:
    top = 0xFFFFFFFF
    ledger = Ledger(FileSystem(), str(ledger_dir))
    assert ledger.append([(3, _batch("a", 1)), (top, _batch("b", 2))]) == [0, 0]
    table, partitions = ledger.read_many({top: 1}, 10)
    assert table.column("data").to_pylist() == [b"b/1"] and partitions.tolist() == [top]
    ledger.close()
    with pytest.raises(StorageIOError):
        ledger.read(top, 0)


def test_a_refused_open_leaves_no_descriptor_open(ledger_dir: Path) -> None:
    ledger = Ledger(FileSystem(), str(ledger_dir), file_bytes_max=600)
    for k in range(6):
        ledger.append([(0, _batch(f"s{k}", 2))])
    ledger.close()
    files = _files(ledger_dir)
    files[-1].write_bytes(files[0].read_bytes())  # its frames' numbers start over: refused
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(CorruptSegmentError):
        Ledger(FileSystem(), str(ledger_dir))
    assert len(os.listdir("/proc/self/fd")) == before


class _NoSync(FileSystem):
    def sync(self, fd: int) -> None:
        pass


def test_many_frames_dropped_and_read_past(ledger_dir: Path) -> None:
    """Over a thousand frames, most released and their files dropped (the index compacts
    its chunk list): reads of many partitions start at the earliest frame any of them
    needs, and single reads still find every offset."""
    ledger = Ledger(_NoSync(), str(ledger_dir), file_bytes_max=4096)
    for k in range(2400):
        ledger.append([(k % 3, _batch(f"f{k}", 1)), (3 + k % 2, _batch(f"g{k}", 1))])
    for partition in range(3):
        ledger.release(partition, 600)  # the first 1800 statements' shares of 0-2
    for partition in (3, 4):
        ledger.release(partition, 900)
    assert ledger.drop_copied_files() > 200
    assert ledger.append([(5, _batch("early", 1))]) == [0]  # before any lookup
    for partition in range(3):
        data = ledger.read(partition, 600).column("data").to_pylist()
        assert data == [f"f{k}/0".encode() for k in range(1800 + partition, 2400, 3)]
    walked = ledger._index.chunks_walked
    table, partitions = ledger.read_many({0: 795, 3: 1190}, 100)
    assert ledger._index.chunks_walked - walked <= 25  # from the earliest frame needed (of ~600)
    by_partition = {p: [] for p in (0, 3)}
    for p, message in zip(partitions.tolist(), table.column("data").to_pylist(), strict=True):
        by_partition[p].append(message)
    assert by_partition[0] == [f"f{k}/0".encode() for k in range(2385, 2400, 3)]
    assert by_partition[3] == [f"g{k}/0".encode() for k in range(2380, 2400, 2)]
    assert ledger.read(5, 0).column("data").to_pylist() == [b"early/0"]
    assert ledger.append([(0, _batch("late", 2))]) == [800]  # indexed after the compaction
    assert ledger.read(0, 799).column("data").to_pylist() == [b"f2397/0", b"late/0", b"late/1"]
    ledger.close()
    ledger = Ledger(FileSystem(), str(ledger_dir), partition_ends={0: 600, 1: 600, 2: 600,
                                                                   3: 900, 4: 900})  # fmt: skip
    assert ledger.read(4, 900).num_rows == 300 and ledger.read(0, 600).num_rows == 202
    ledger.close()
