"""The ledger's copier thread (``TopicLedger``) and its directory come with the first
frame appended, not with the topic's open (a topic that never spreads a statement has
neither); the thread sleeps without waking while nothing is pending, copies what comes,
stops with the topic; the reopen finds the ledger's files."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from storage import limits
from storage.errors import StorageIOError

from .test_ledger_route import PARTITIONS, _expected, _open, _rows, _statement


def _copiers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ledger-copier" and t.is_alive()]


def test_the_copier_starts_at_the_first_frame_sleeps_when_idle_and_stops_with_the_topic(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "LEDGER_COPY_FRAMES_MIN", 1)  # a pass per frame
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 0.05)
    before = len(_copiers())
    topic = _open(str(tmp_path), create=True)
    try:
        assert topic.ledger is not None
        assert len(_copiers()) == before  # opened, nothing appended: no thread
        assert "ledger" not in os.listdir(os.path.join(str(tmp_path), "t"))  # nor directory
        assert topic.ledger._syncs is None  # nor a descriptor to sync its logs with
        woken = []
        real_wait = threading.Condition.wait

        def counted(self: threading.Condition, timeout: float | None = None) -> bool:
            if threading.current_thread().name == "ledger-copier":
                woken.append(timeout)
            return real_wait(self, timeout)

        monkeypatch.setattr(threading.Condition, "wait", counted)
        topic.append_ledger(_statement(0))
        assert "ledger" in os.listdir(os.path.join(str(tmp_path), "t"))
        assert topic.ledger._syncs is not None  # opened before the frame's rows are copied
        deadline = time.monotonic() + 10
        while topic.ledger.ledger.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not topic.ledger.ledger.pending()  # the thread copied and released it
        assert len(_copiers()) == before + 1
        time.sleep(0.3)  # idle: one wait with no timeout, not one every WAIT_S / 4
        waits = len(woken)
        time.sleep(0.3)
        assert len(woken) == waits and woken[-1] is None
        for p in range(PARTITIONS):
            assert _rows(topic, p) == _expected(range(1), p), p
    finally:
        topic.close()
    assert len(_copiers()) == before
    topic = _open(str(tmp_path))
    try:
        for p in range(PARTITIONS):
            assert _rows(topic, p) == _expected(range(1), p), p
        assert topic.ledger is not None and len(_copiers()) == before
    finally:
        topic.close()


def test_a_fenced_partitions_rows_do_not_bring_a_pass_a_second(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows pending only for a fenced partition wait for the reopen: the copier sleeps
    (its earlier retry made a pass every ``LEDGER_COPY_WAIT_S``, reading them each time);
    a new frame wakes it for the others."""
    monkeypatch.setattr(limits, "LEDGER_COPY_FRAMES_MIN", 10**9)  # held while set up
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 3600.0)
    topic = _open(str(tmp_path), create=True)
    try:
        assert topic.ledger is not None
        topic.append_ledger(_statement(0))
        log = topic.partition(0)
        with log.write_lock:  # its rows acknowledged in the ledger, then a write fails
            log.fence_for(StorageIOError("injected: a failed write"))
        monkeypatch.setattr(limits, "LEDGER_COPY_FRAMES_MIN", 1)
        monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 0.05)
        topic.ledger._note_pending(0)  # wake it: a pass now
        deadline = time.monotonic() + 10
        while set(topic.ledger.ledger.pending()) != {0} and time.monotonic() < deadline:
            time.sleep(0.01)
        assert set(topic.ledger.ledger.pending()) == {0}  # the others copied and released
        time.sleep(0.2)
        passes = topic.ledger.copier_passes
        time.sleep(0.5)  # ten WAIT_S: no pass for the fenced partition alone
        assert topic.ledger.copier_passes == passes
        topic.append_ledger(_statement(1, range(1, PARTITIONS)))
        deadline = time.monotonic() + 10
        while set(topic.ledger.ledger.pending()) != {0} and time.monotonic() < deadline:
            time.sleep(0.01)
        assert set(topic.ledger.ledger.pending()) == {0} and topic.ledger.copier_passes > passes
    finally:
        topic.close()
