"""Round 35: the copier asks the catalog for the consumers' offsets (the files it keeps
for a consumer that has not read them) from its own thread while sessions produce, poll,
commit and change the topic's consumers: nothing raises, nothing is logged, every message
is read once; files kept so check clean and the reopen reads every message once. (Both
tests written by a review of the round.)"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from engine.check import check_database
from engine.database import Database
from storage import limits
from storage.ledger_route import TopicLedger
from tests.engine.test_ledger_read_across import (
    INSERT,
    POLL,
    _check_dense,
    _open,
    _polls,
    _rows,
    _topic,
    _written,
)

STATEMENT = 400  # ``_written``'s statements: one ledger frame each


def test_the_copier_asks_for_readers_while_consumers_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(limits, "LEDGER_FILE_BYTES_MAX", 4096)
    monkeypatch.setattr(limits, "LEDGER_KEEP_COPIED_BYTES", 0)  # every pass past the budget
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 0.01)
    monkeypatch.setattr(limits, "LEDGER_COPY_FRAMES_MIN", 1)
    asked = []
    real = TopicLedger._unread_now

    def counted(self: TopicLedger):
        found = real(self)
        asked.append(threading.current_thread().name)
        return found

    monkeypatch.setattr(TopicLedger, "_unread_now", counted)
    caplog.set_level(logging.ERROR)
    database = _open(tmp_path, monkeypatch, True)
    stop = threading.Event()
    errors: list[BaseException] = []

    def ddl() -> None:
        try:
            session = database.connect()
            k = 0
            while not stop.is_set():
                session.execute(f"ALTER TOPIC t ADD CONSUMER x{k}")
                session.execute(
                    f"SELECT * FROM TOPIC t WITH (consumer = 'x{k}', max_messages = 50)"
                )
                session.execute(f"ALTER TOPIC t DROP CONSUMER x{k}")
                session.execute(f"CREATE TOPIC other{k} (CONSUMER c)")
                session.execute(f"DROP TOPIC other{k}")
                k += 1
        except BaseException as error:  # pragma: no cover
            errors.append(error)

    thread = threading.Thread(target=ddl)
    thread.start()
    try:
        session = database.connect()
        polls = []
        for first in range(0, 40 * 400, 400):
            session.execute(INSERT, _rows(first, 400))
            polls += _polls(database, 300)
        stop.set()
        thread.join()
        topic = _topic(database)
        deadline = time.monotonic() + 10
        while topic.ledger.ledger.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not errors
        assert topic.ledger.copier_error is None
        assert not [r for r in caplog.records if "readers" in r.getMessage()]
        assert any(name != threading.main_thread().name for name in asked)  # the copier asked
        _check_dense(polls, 40 * 400)
    finally:
        stop.set()
        thread.join()
        database.close()


def test_unread_kept_files_check_clean_and_reopen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "LEDGER_COPY_FRAMES_MIN", 10**9)  # passes only the test's
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 3600.0)
    monkeypatch.setattr(limits, "LEDGER_FILE_BYTES_MAX", 4096)
    monkeypatch.setattr(limits, "LEDGER_KEEP_COPIED_BYTES", 0)
    database = _open(tmp_path, monkeypatch, True)
    try:
        _, topic = _written(database, 6 * STATEMENT)
        ledger = topic.ledger.ledger
        files = ledger.file_numbers
        assert topic.ledger.copy_all() == 6 * STATEMENT
        assert ledger.file_numbers == files  # all kept: c has read nothing
        session = database.connect()  # c reads some (whole frames), then stops
        half = [[tuple(r.values()) for r in
                 session.execute(POLL.format(1000))[0].table.to_pylist()]]  # fmt: skip
        assert len(half[0]) == 800
    finally:
        database.close()
    report = check_database(str(tmp_path / "on"))
    assert report.ok, report.problems
    database = Database.open(str(tmp_path / "on"))
    try:
        rest = _polls(database, 1000)
        _check_dense(half + rest, 6 * STATEMENT)
    finally:
        database.close()
