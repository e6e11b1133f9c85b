"""``topicbase check`` over a topic's ledger (``storage.check``, ``<topic>/ledger/``): a
store written with the ledger switched on checks clean, rows settled into some logs and
not released too; a torn tail is reported as the crash's state the open recovers from
(repair cuts it), damage inside a file and an unknown file are reported; shares that do
not continue their partitions' logs (a gap, a share across a log's end) are reported as
the open refuses them (round 32). The store is opened with the ledger on explicitly,
whatever the lane."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from storage import check_report as check
from storage import file_names, ledger_format, ledger_route, limits
from storage.check import check_store
from storage.codecs import Codec
from storage.config import TopicConfig
from storage.errors import CorruptSegmentError
from storage.fs import FileSystem
from storage.ledger import SUFFIX
from storage.record_batch import build_wire_batch
from storage.store import Store

PARTITIONS = 6
STATEMENTS = 3


def _statement(k: int) -> list[tuple[int, np.ndarray, pa.RecordBatch]]:
    return [(p, np.arange(2), build_wire_batch([f"{k}.{p}.{i}".encode() for i in range(2)],
                                               producer_id=f"q{p}", seq_no=[2 * k, 2 * k + 1]))
            for p in range(PARTITIONS)]  # fmt: skip


def _write_store(root: Path, *, copy: bool) -> Path:
    """A store at ``root`` whose one topic's ledger got ``STATEMENTS`` frames (copied into
    the partitions by one copier pass if ``copy``); the ledger's directory."""
    with Store.open(str(root), fs=FileSystem(), ledger=True) as store:
        config = TopicConfig(partition_count=PARTITIONS, supported_codecs=frozenset({Codec.RAW}))
        topic = store.create_topic(config)
        for k in range(STATEMENTS):
            assert topic.append_ledger(_statement(k)) is not None
        if copy:
            assert topic.ledger is not None
            assert topic.ledger.copy_all() == STATEMENTS * PARTITIONS * 2
        return Path(topic.directory) / ledger_route.DIRECTORY


@pytest.fixture
def written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A store whose one topic's ledger holds ``STATEMENTS`` frames nothing copied (the
    copier held off: the reopen copies them); its root and its ledger's one file."""
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 3600.0)
    root = tmp_path / "store"
    directory = _write_store(root, copy=False)
    files = sorted(directory.glob("*" + SUFFIX))
    assert len(files) == 1 and files[0].stat().st_size > 0
    return root, files[0]


def _kinds(report: check.CheckReport) -> list[str]:
    return [problem.kind for problem in report.problems]


def _rows(root: Path) -> dict[int, list[bytes]]:
    with Store.open(str(root), fs=FileSystem(), ledger=False) as store:
        topic = store.topic(store.topic_ids()[0])
        return {p: [v for b in topic.partition(p).read(0).batches
                    for v in b.column("data").to_pylist()] for p in range(PARTITIONS)}  # fmt: skip


def test_a_store_with_a_ledger_checks_clean(written: tuple[Path, Path]) -> None:
    root, _ = written
    report = check_store(str(root), fs=FileSystem())
    assert report.ok, report.problems
    assert report.problems == []


def test_copied_ledger_files_the_copier_keeps_check_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files the copier keeps after copying them (``LEDGER_KEEP_COPIED_BYTES``, round 33)
    hold shares wholly below their partitions' ends: copied, as the open counts them, not
    damage; the reopen then drops them."""
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 3600.0)
    monkeypatch.setattr(limits, "LEDGER_FILE_BYTES_MAX", 1024)  # a file a statement
    root = tmp_path / "store"
    directory = _write_store(root, copy=True)
    kept = sorted(directory.glob("*" + SUFFIX))
    assert len(kept) == STATEMENTS  # all copied, all kept (well within the budget)
    report = check_store(str(root), fs=FileSystem())
    assert report.ok and report.problems == [], report.problems
    assert _rows(root) == {p: [f"{k}.{p}.{i}".encode() for k in range(STATEMENTS)
                               for i in range(2)] for p in range(PARTITIONS)}  # fmt: skip
    assert sorted(directory.glob("*" + SUFFIX)) == []  # the reopen (switch off) dropped them


def test_a_torn_ledger_tail_is_recovered_at_open_and_cut_by_repair(
    written: tuple[Path, Path],
) -> None:
    root, ledger_file = written
    size = ledger_file.stat().st_size
    with open(ledger_file, "ab") as file:  # a round written, not synced, then a crash
        file.write(ledger_format.MAGIC + b"\x01" * 60)
    report = check_store(str(root), fs=FileSystem())
    assert _kinds(report) == [check.TORN_TAIL]
    assert report.problems[0].recovered_at_open and report.ok
    assert ledger_file.stat().st_size == size + 64  # a check changes nothing
    repaired = check_store(str(root), repair=True, fs=FileSystem())
    assert repaired.problems[0].repaired and ledger_file.stat().st_size == size
    assert check_store(str(root), fs=FileSystem()).problems == []
    assert _rows(root) == {p: [f"{k}.{p}.{i}".encode() for k in range(STATEMENTS)
                               for i in range(2)] for p in range(PARTITIONS)}  # fmt: skip


def test_damage_inside_a_ledger_file_is_reported_not_repaired(
    written: tuple[Path, Path],
) -> None:
    root, ledger_file = written
    raw = bytearray(ledger_file.read_bytes())
    raw[ledger_format.HEADER_BYTES + 3] ^= 0xFF  # the first frame's share table
    ledger_file.write_bytes(bytes(raw))
    report = check_store(str(root), repair=True, fs=FileSystem())
    assert _kinds(report) == [check.CORRUPT_FRAME]
    assert not report.ok and not report.problems[0].repaired
    assert ledger_file.read_bytes() == bytes(raw)


def test_an_unknown_file_in_the_ledger_directory_is_reported(written: tuple[Path, Path]) -> None:
    root, ledger_file = written
    stray = ledger_file.parent / "notes.txt"
    stray.write_bytes(b"x")
    report = check_store(str(root), fs=FileSystem())
    assert _kinds(report) == [check.UNKNOWN_FILE]
    assert report.problems[0].path == os.fspath(stray)


def _frame_ends(ledger_file: Path) -> list[int]:
    frames, _ = ledger_format.scan(ledger_file.read_bytes(), str(ledger_file))
    return [frame.end for frame in frames]


def test_shares_copied_in_part_check_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:  # fmt: skip
    """Rows settled into some partitions (their logs past the ledger's first shares), not
    released: the shares below a log's end are copied, the rest continue it."""
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 3600.0)
    root = tmp_path / "store"
    with Store.open(str(root), fs=FileSystem(), ledger=True) as store:
        config = TopicConfig(partition_count=PARTITIONS, supported_codecs=frozenset({Codec.RAW}))
        topic = store.create_topic(config)
        for k in range(2):
            assert topic.append_ledger(_statement(k)) is not None
        assert topic.ledger is not None
        topic.ledger.settle_all()  # written into the logs, not synced, not released
        assert topic.append_ledger(_statement(2)) is not None
        assert topic.partition(0).own_end == 4  # the third statement in the ledger only
    report = check_store(str(root), fs=FileSystem())
    assert report.problems == [], report.problems


def test_a_gap_between_a_partitions_log_and_the_ledger_is_reported(
    written: tuple[Path, Path],
) -> None:
    root, ledger_file = written
    raw = ledger_file.read_bytes()
    ledger_file.write_bytes(raw[_frame_ends(ledger_file)[0]:])  # the first frame lost
    report = check_store(str(root), repair=True, fs=FileSystem())
    assert _kinds(report) == [check.OFFSET_GAP] * PARTITIONS
    assert not report.ok and not any(problem.repaired for problem in report.problems)
    assert "starts at 2, where 0 was next" in report.problems[0].message
    with pytest.raises(CorruptSegmentError, match="gap"):  # the open refuses it too
        Store.open(str(root), fs=FileSystem(), ledger=True).close()


def test_a_share_across_a_partitions_log_end_is_reported(written: tuple[Path, Path]) -> None:
    root, _ = written
    # Opened with the ledger off: the open copies the ledger's rows into the logs.
    Store.open(str(root), fs=FileSystem(), ledger=False).close()
    root2 = root.parent / "copy"
    shutil.copytree(root, root2)  # every row copied: checks clean
    assert check_store(str(root2), fs=FileSystem()).problems == []
    # A ledger whose share of partition 0 straddles its log's end: the log holds 6 rows
    # after the copy; a ledger frame numbered on from the last one, at base 5, of 2 rows.
    topic_directory = next((root2 / "topics").iterdir())
    ledger_directory = topic_directory / ledger_route.DIRECTORY
    ledger_directory.mkdir(exist_ok=True)
    batch = build_wire_batch([b"x", b"y"], producer_id="q0", seq_no=[100, 101])
    encoded = ledger_format.encode_body([(0, batch)])
    parts = ledger_format.frame_parts(encoded, np.array([5], np.int64), sequence=0,
                                      written_at_us=1, transaction_id=0)  # fmt: skip
    frame = b"".join(bytes(part) for part in parts)
    (ledger_directory / (file_names.offset_name(0) + SUFFIX)).write_bytes(frame)
    report = check_store(str(root2), fs=FileSystem())
    assert _kinds(report) == [check.OFFSET_GAP]
    assert "straddles the log's end 6" in report.problems[0].message
    with pytest.raises(CorruptSegmentError, match="straddles"):
        Store.open(str(root2), fs=FileSystem(), ledger=True).close()


@pytest.mark.parametrize("file_bytes", [4096, 1 << 20],
                         ids=["sealed-kept-file", "file-being-written"])  # fmt: skip
def test_a_store_whose_removed_partition_left_shares_in_the_ledger_opens_and_checks_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file_bytes: int
) -> None:
    """Round 34 (a review of round 33): a split partition whose every row expired is
    removed (``TopicLog.remove_partition``) while its copied shares stay in the ledger: in
    a file the copier keeps for whole-frame reads, or in the file still being written.
    The open and ``check`` count them as copied: before, the open refused the store
    (``KeyError``: no log to copy into, or ``CorruptSegmentError``: a gap) and check
    called it not repairable."""
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 3600.0)
    monkeypatch.setattr(limits, "LEDGER_COPY_FRAMES_MIN", 10**9)
    monkeypatch.setattr(limits, "LEDGER_FILE_BYTES_MAX", file_bytes)
    root = tmp_path / "store"
    last = PARTITIONS - 1
    with Store.open(str(root), fs=FileSystem(), ledger=True) as store:
        config = TopicConfig(partition_count=PARTITIONS, supported_codecs=frozenset({Codec.RAW}))
        topic = store.create_topic(config)
        topic_id = topic.topic_id
        for k in range(STATEMENTS):
            assert topic.append_ledger(_statement(k)) is not None
        topic.mark_inactive(last, (last - 1,))  # split (autopartitioning's bookkeeping)
        for k in range(STATEMENTS, STATEMENTS + 8):  # frames without it, in the files
            later = [share for share in _statement(k) if share[0] != last]  # holding its last
            assert topic.append_ledger(later) is not None
        assert topic.ledger is not None
        topic.ledger.copy_all()
        topic.remove_partition(last)
        assert last not in topic.partition_ids()
        assert len(list((Path(topic.directory) / ledger_route.DIRECTORY).glob("*" + SUFFIX)))
    report = check_store(str(root), fs=FileSystem())
    assert report.ok, report.problems
    with Store.open(str(root), fs=FileSystem(), ledger=True) as store:
        reopened = store.topic(topic_id)
        assert reopened.partition_ids() == list(range(last))
        assert reopened.partition(0).end_offset == STATEMENTS * 2 + 8 * 2
