"""A ledger closed while an append is in flight (a DROP TOPIC or a store closing beside a
statement spread over many partitions): the close waits for that append's round, which
is written, synced and acknowledged whole; an append after the close is refused with
``StorageIOError`` and writes nothing; a reopen finds every acknowledged frame."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from storage.errors import StorageIOError
from storage.fs import FileSystem
from storage.ledger import Ledger
from storage.record_batch import build_wire_batch


def _shares(tag: str) -> list[tuple[int, Any]]:
    return [(p, build_wire_batch([f"{tag}/{p}".encode()], producer_id=f"w{p}", seq_no=[0]))
            for p in (0, 3, 7)]  # fmt: skip


class _SlowSync(FileSystem):
    """Syncs that announce themselves and then take a while."""

    def __init__(self) -> None:
        super().__init__()
        self.syncing = threading.Event()

    def sync(self, fd: int) -> None:
        self.syncing.set()
        time.sleep(0.2)
        super().sync(fd)


def test_a_close_waits_for_the_append_in_flight_and_refuses_the_next(tmp_path: Path) -> None:
    fs = _SlowSync()
    ledger = Ledger(fs, str(tmp_path / "ledger"))
    got: list[Any] = []
    writer = threading.Thread(target=lambda: got.append(ledger.append(_shares("a"))))
    writer.start()
    assert fs.syncing.wait(5)  # the round is between its write and its sync's end
    ledger.close()  # waits for it
    writer.join(5)
    assert got == [[0, 0, 0]]  # acknowledged whole, not cut by the close
    with pytest.raises(StorageIOError, match="closed"):
        ledger.append(_shares("b"))
    reopened = Ledger(FileSystem(), str(tmp_path / "ledger"))
    try:
        for partition in (0, 3, 7):
            assert reopened.end_offset(partition) == 1
            assert reopened.read(partition, 0).column("data").to_pylist() == [
                f"a/{partition}".encode()
            ]
    finally:
        reopened.close()
