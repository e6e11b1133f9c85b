"""``topicbase check`` over a topic's ledger (``storage.check``, ``<topic>/ledger/``): a
store written with the ledger switched on checks clean; a torn tail is reported as the
crash's state the open recovers from (repair cuts it), damage inside a file and an
unknown file are reported. The store is opened with the ledger on explicitly, whatever
the lane."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from storage import check_report as check
from storage import ledger_format, ledger_route, limits
from storage.check import check_store
from storage.codecs import Codec
from storage.config import TopicConfig
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


@pytest.fixture
def written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A store whose one topic's ledger holds ``STATEMENTS`` frames nothing copied (the
    copier held off: the reopen copies them); its root and its ledger's one file."""
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 3600.0)
    root = tmp_path / "store"
    with Store.open(str(root), fs=FileSystem(), ledger=True) as store:
        config = TopicConfig(partition_count=PARTITIONS, supported_codecs=frozenset({Codec.RAW}))
        topic = store.create_topic(config)
        for k in range(STATEMENTS):
            assert topic.append_ledger(_statement(k)) is not None
        directory = Path(topic.directory) / ledger_route.DIRECTORY
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
