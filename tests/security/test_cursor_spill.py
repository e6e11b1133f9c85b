"""SQL cursors' spill files are bounded in bytes, server-wide and per login (round 26, H2).

Past ``spill.SPILL_BYTES`` (8 MiB) a cursor's rows go to an unlinked, memory-mapped file in
TMPDIR that lives until CLOSE or the connection's end. On main that was bounded per cursor
(the result cap, 1 GiB) and in number (1,000 a connection), not in bytes: one user's
connections could fill the temporary directory's disk. Now every byte written to a spill
file is charged first to the server's ``SpillBudget`` (``ServerLimits.spill_bytes_max``
for all, ``spill_login_bytes_max`` for one login, superusers too): past either the DECLARE
gets 53400 with its file dropped, and the bytes are given back at CLOSE, at the prune of an
ended transaction, at the connection's end and on every failed spill (ENOSPC: 53100). A
spill file is unlinked before anything is written to it: a process killed mid-spill leaves
no file behind (on main it was named until the spill ended).

The limits are set low through ``ServerLimits``; each cursor is ~10 MB, just past the
spill threshold, so the tests stay fast.
"""

from __future__ import annotations

import argparse
import errno
import gc
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from engine.streams import RowStream
from sql.pgwire.connection import spill
from sql.pgwire.connection.result_stream import ResultStream
from sql.pgwire.limits import ServerLimits, add_serve_arguments, serve_configuration
from sql.pgwire.spill_budget import SpillBudget, SpillLimitExceededError
from storage.errors import LimitExceededError
from tests.security.resource_servers import (
    ADMIN,
    ADMIN_PASSWORD,
    ALICE,
    ALICE_PASSWORD,
    BOB,
    BOB_PASSWORD,
    login,
    running_server,
    wait_until,
)

MIB = 1 << 20
_ROOT = Path(__file__).resolve().parents[2]
# ~10.2 MB of rows: past the 8 MiB threshold, so spilled (the whole result is in the file).
_DECLARE = (
    "DECLARE {} CURSOR WITH HOLD FOR SELECT i, repeat('x', 1000) AS pad FROM range(10000) t(i)"
)


def _named_spill_files() -> list[str]:
    """What this process (the server runs in it) has open of spill files: descriptors and
    mappings, each described by the kernel as ``... (deleted)`` once unlinked."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if spill.SPILL_PREFIX in target:
            found.append(target)
    with open("/proc/self/maps") as maps:
        found += [line.split(maxsplit=5)[-1].strip() for line in maps if spill.SPILL_PREFIX in line]
    return found


def _gone(budget: SpillBudget) -> bool:
    return budget.spilled_bytes == 0 and budget.accounts() == {}


def test_spilled_bytes_are_bounded_per_login_and_given_back(tmp_path: Path) -> None:
    limits = ServerLimits(spill_bytes_max=64 * MIB, spill_login_bytes_max=16 * MIB)
    with running_server(tmp_path, limits=limits) as server:
        budget = server.server.spill_budget
        alice = login(server, ALICE, ALICE_PASSWORD)
        alice.execute(_DECLARE.format("c0"))
        one_cursor = budget.accounts()[ALICE]
        assert 10_000_000 < one_cursor <= 16 * MIB and budget.spilled_bytes == one_cursor
        mapped_before = _named_spill_files()
        assert mapped_before and all(name.endswith("(deleted)") for name in mapped_before)
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded,
                           match=f"user 'alice'.*limit of {16 * MIB} bytes"):  # fmt: skip
            alice.execute(_DECLARE.format("c1"))
        # nothing of the refused cursor is left: not its bytes, not its file
        assert budget.accounts() == {ALICE: one_cursor}
        gc.collect()
        assert _named_spill_files() == mapped_before
        assert alice.execute("SELECT 1").fetchone() == (1,)  # the connection goes on
        with pytest.raises(psycopg.errors.InvalidCursorName):
            alice.execute("FETCH 1 FROM c1")
        assert alice.execute("FETCH 2 FROM c0").fetchall()[1][0] == 1
        # the login's bound holds across its connections; another user is not limited by it
        other = login(server, ALICE, ALICE_PASSWORD)
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded):
            other.execute(_DECLARE.format("c2"))
        bob = login(server, BOB, BOB_PASSWORD)
        bob.execute(_DECLARE.format("b0"))
        assert budget.accounts() == {ALICE: one_cursor, BOB: one_cursor}
        # CLOSE gives back; a cursor of an ended transaction is given back at the next prune
        alice.execute("CLOSE c0")
        assert budget.accounts() == {BOB: one_cursor}
        other.execute("BEGIN")
        other.execute(_DECLARE.format("t0").replace(" WITH HOLD", ""))
        assert budget.accounts()[ALICE] == one_cursor
        other.execute("COMMIT")
        other.execute("CLOSE ALL")  # a cursor command prunes first
        assert budget.accounts() == {BOB: one_cursor}
        # the connection's end gives back what it held
        bob.close()
        wait_until(lambda: _gone(budget))
        gc.collect()
        assert _named_spill_files() == []
        alice.close()
        other.close()


def test_the_server_wide_bound_holds_superusers_too(tmp_path: Path) -> None:
    limits = ServerLimits(spill_bytes_max=24 * MIB, spill_login_bytes_max=16 * MIB)
    with running_server(tmp_path, limits=limits) as server:
        budget = server.server.spill_budget
        alice = login(server, ALICE, ALICE_PASSWORD)
        bob = login(server, BOB, BOB_PASSWORD)
        admin = login(server, ADMIN, ADMIN_PASSWORD)
        alice.execute(_DECLARE.format("a"))
        bob.execute(_DECLARE.format("b"))  # each within its login's 16 MiB; 20 MB in all
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded,
                           match=f"server's limit of {24 * MIB} bytes"):  # fmt: skip
            admin.execute(_DECLARE.format("s"))
        assert budget.spilled_bytes <= 24 * MIB and ADMIN not in budget.accounts()
        alice.execute("CLOSE a")
        admin.execute(_DECLARE.format("s"))  # room again
        assert admin.execute("FETCH ABSOLUTE 10000 FROM s").fetchone()[0] == 9999
        for connection in (alice, bob, admin):
            connection.close()
        wait_until(lambda: _gone(budget))


def test_a_full_temporary_disk_mid_spill_is_a_clear_error_and_leaks_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = [0]

    def full_disk(descriptor: int, view: memoryview) -> int:
        if written[0] > 9 * MIB:  # the threshold's bytes went out, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written[0] += len(view)
        return os.write(descriptor, view)

    with running_server(tmp_path) as server:
        budget = server.server.spill_budget
        alice = login(server, ALICE, ALICE_PASSWORD)
        monkeypatch.setattr(spill, "_write", full_disk)
        with pytest.raises(psycopg.errors.DiskFull, match="No space left on device"):
            alice.execute(_DECLARE.format("c"))
        assert written[0] > 8 * MIB  # it failed mid-spill
        assert _gone(budget)
        gc.collect()
        assert _named_spill_files() == []  # the descriptor is closed, the file had no name
        assert alice.execute("SELECT 2").fetchone() == (2,)
        alice.execute("BEGIN")  # inside a transaction: the transaction fails, as any error
        with pytest.raises(psycopg.errors.DiskFull):
            alice.execute(_DECLARE.format("d"))
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            alice.execute("SELECT 1")
        alice.execute("ROLLBACK")
        assert _gone(budget)
        monkeypatch.undo()  # room on the disk again: the same DECLARE works
        alice.execute(_DECLARE.format("c"))
        assert budget.spilled_bytes > 10_000_000
        assert alice.execute("FETCH ALL FROM c").rowcount == 10000
        alice.close()
        wait_until(lambda: _gone(budget))


def test_a_statement_timeout_mid_spill_gives_everything_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes = [0]

    def slow_disk(descriptor: int, view: memoryview) -> int:
        writes[0] += 1
        time.sleep(0.02)
        return os.write(descriptor, view)

    with running_server(tmp_path) as server:
        budget = server.server.spill_budget
        alice = login(server, ALICE, ALICE_PASSWORD)
        monkeypatch.setattr(spill, "_write", slow_disk)
        alice.execute("SET statement_timeout = '300ms'")
        with pytest.raises(psycopg.errors.QueryCanceled):
            alice.execute(_DECLARE.format("c").replace("10000", "40000"))
        assert writes[0] > 0  # canceled while spilling
        assert _gone(budget)
        gc.collect()
        assert _named_spill_files() == []
        alice.execute("SET statement_timeout = 0")
        assert alice.execute("SELECT 3").fetchone() == (3,)
        alice.close()


# -- the spill itself (no server) -------------------------------------------------------------
_TABLE = pa.table({"i": pa.array(range(200_000), pa.int64()),
                   "s": pa.array([f"value {k}" for k in range(200_000)])})  # fmt: skip


def _stream(batches: Iterator[pa.RecordBatch]) -> ResultStream:
    rows = RowStream(_TABLE.schema, (), None, batches, lambda: None)
    return ResultStream(rows, [20, 25], 10**9)


def test_every_failed_spill_gives_its_bytes_back_and_a_lost_table_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    budget = SpillBudget(1 << 30, 1 << 30)
    charged_before_failing: list[int] = []

    def failing() -> Iterator[pa.RecordBatch]:
        batches = _TABLE.to_batches(max_chunksize=8192)
        yield from batches[:10]
        charged_before_failing.append(budget.spilled_bytes)
        raise LimitExceededError("a later batch over the result limit")

    charge = budget.charge_for("alice")
    with pytest.raises(LimitExceededError):
        spill.collect(_stream(failing()), spill_bytes=100_000, charge=charge)
    assert charged_before_failing[0] > 100_000 and _gone(budget)
    # refused by the budget mid-spill: 53400, nothing charged, nothing left
    small = SpillBudget(1 << 30, 300_000)
    with pytest.raises(SpillLimitExceededError, match="limit of 300000 bytes"):
        spill.collect(_stream(iter(_TABLE.to_batches(max_chunksize=8192))), spill_bytes=100_000,
                      charge=small.charge_for("alice"))  # fmt: skip
    assert _gone(small)
    # kept: charged as written (the file's size), given back once the mapping is freed even
    # if no one calls release (a DECLARE whose waiting task was cancelled)
    charge = budget.charge_for("alice")
    table = spill.collect(_stream(iter(_TABLE.to_batches(max_chunksize=8192))),
                          spill_bytes=100_000, charge=charge)  # fmt: skip
    assert table.equals(_TABLE) and charge.charged >= _TABLE.nbytes
    assert budget.accounts() == {"alice": charge.charged}
    assert list(tmp_path.iterdir()) == []
    del table
    gc.collect()
    assert _gone(budget) and charge.charged == 0
    charge.release()  # a second release gives back nothing twice
    assert _gone(budget)


_KILLED_MID_SPILL = textwrap.dedent("""
    import sys, time
    import pyarrow as pa
    from engine.streams import RowStream
    from sql.pgwire.connection import spill
    from sql.pgwire.connection.result_stream import ResultStream

    table = pa.table({"i": pa.array(range(100_000), pa.int64())})

    def batches():
        yield from table.to_batches(max_chunksize=10_000)  # 800 KB: spilled past 100 KB
        print("spilling", flush=True)
        time.sleep(60)  # killed here, its file open and half written

    rows = RowStream(table.schema, (), None, batches(), lambda: None)
    spill.collect(ResultStream(rows, [20], 10**9), spill_bytes=100_000)
""")


def test_a_process_killed_mid_spill_leaves_no_file(tmp_path: Path) -> None:
    spills = tmp_path / "tmp"
    spills.mkdir()
    environment = dict(os.environ, TMPDIR=str(spills), PYTHONPATH=str(_ROOT))
    child = subprocess.Popen([sys.executable, "-c", _KILLED_MID_SPILL], env=environment,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "spilling\n"
        assert list(spills.iterdir()) == []  # nameless while written
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    assert list(spills.iterdir()) == []  # nothing outlived the process


def test_serve_options_set_the_spill_limits() -> None:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    limits, _ = serve_configuration(parser.parse_args([]))
    assert (limits.spill_bytes_max, limits.spill_login_bytes_max) == (8 << 30, 4 << 30)
    limits, _ = serve_configuration(parser.parse_args(
        ["--cursor-spill-limit", "100", "--cursor-spill-login-limit", "30"]))  # fmt: skip
    assert (limits.spill_bytes_max, limits.spill_login_bytes_max) == (100 * MIB, 30 * MIB)
    with pytest.raises(SystemExit):
        parser.parse_args(["--cursor-spill-limit", "0"])
    with pytest.raises(ValueError, match="spill_login_bytes_max"):
        ServerLimits(spill_login_bytes_max=0)
