"""``topicbase check``, run for real as a subprocess on data directories the engine wrote.

One module-scoped run of ``topicbase`` creates topics, a table and messages (plain
and transactional) and exits; each test damages its own copy of that directory
and runs ``topicbase check`` on it: exit codes, what the output names, ``--repair``,
the refusal to repair a directory another process holds, and the live, read-only check
of a directory a running ``topicbase serve`` owns.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from engine import tables

BIN_DIR = Path(sys.executable).parent
TOPICBASE = shutil.which("topicbase", path=str(BIN_DIR))
RUN_TIMEOUT_S = 60
COUNT_QUERY = "SELECT count(*) AS n FROM TOPIC events"


def run(*arguments: str) -> subprocess.CompletedProcess[str]:
    assert TOPICBASE is not None, f"no topicbase command in {BIN_DIR}"
    return subprocess.run(
        [TOPICBASE, *arguments], capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


def check(data_dir: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return run("check", "--data-dir", str(data_dir), *options)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("written") / "data"
    inserts = [
        f"INSERT INTO TOPIC events (data, producer_id, seq_no) VALUES ('m{n}', 'p', {n})"
        for n in range(1, 6)
    ]
    result = run(
        "--data-dir", str(data_dir), "-q",
        "-c", "CREATE TOPIC events WITH (min_active_partitions = 1)",
        "-c", "CREATE TOPIC logs WITH (min_active_partitions = 2)",
        "-c", "CREATE TABLE users (name VARCHAR PRIMARY KEY)",
        *[argument for insert in inserts for argument in ("-c", insert)],
        "-c", "BEGIN; INSERT INTO TOPIC logs (data) VALUES ('a'), ('b'); "
              "INSERT INTO users VALUES ('ann'); COMMIT",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return data_dir


@pytest.fixture
def data_dir(written: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(written, copy)
    return copy


def events_log(data_dir: Path) -> Path:
    """The one log file of topic ``events`` (created first: id t0000000001, one partition)."""
    (log,) = (data_dir / "store" / "topics" / "t0000000001" / "p0").glob("*.log")
    return log


def file_hashes(data_dir: Path) -> dict[str, str]:
    return {
        str(path.relative_to(data_dir)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(data_dir.rglob("*"))
        if path.is_file() and path.name != "LOCK"
    }


def test_a_clean_data_directory_checks_clean_and_unchanged(data_dir: Path) -> None:
    before = file_hashes(data_dir)
    result = check(data_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = result.stdout.splitlines()
    assert line.startswith("ok: no problems in 2 topics, 3 partitions, ")
    assert line.endswith(" segments, 6 frames, 1 staging file")
    as_json = run("--data-dir", str(data_dir), "check", "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert (report["ok"], report["problems"], report["checked"]["frames"]) == (True, [], 6)
    assert file_hashes(data_dir) == before


def test_a_flipped_byte_exits_1_naming_file_and_position_and_repair_keeps_the_frame(
    data_dir: Path,
) -> None:
    log = events_log(data_dir)
    raw = bytearray(log.read_bytes())
    raw[60] ^= 0xFF  # inside the body of the first frame; four valid frames follow
    log.write_bytes(bytes(raw))
    for options in ((), ("--repair",)):
        result = check(data_dir, *options)
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"error: corrupt_frame: {log} at byte 0: checksum mismatch" in result.stdout
        assert result.stdout.splitlines()[-1].startswith("damaged: 1 problem (0 repaired")
        assert log.read_bytes() == bytes(raw)


def test_repair_cuts_a_torn_tail_and_the_data_reads_back_whole(data_dir: Path) -> None:
    log = events_log(data_dir)
    size = log.stat().st_size
    with open(log, "ab") as file:
        file.write(log.read_bytes()[:100])  # a torn copy of the first frame
    result = check(data_dir)
    assert result.returncode == 1
    assert f"repairable: torn_tail: {log} at byte {size}: " in result.stdout
    repaired = check(data_dir, "--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert f"repaired: torn_tail: {log} at byte {size}: " in repaired.stdout
    assert log.stat().st_size == size
    assert check(data_dir).returncode == 0
    count = run("--data-dir", str(data_dir), "--format", "csv", "-c", COUNT_QUERY)
    assert count.stdout.splitlines() == ["n", "5"], count.stderr


def test_catalog_mismatch_and_a_record_without_its_staged_batch_are_reported(
    data_dir: Path,
) -> None:
    connection = tables.connect(str(data_dir / tables.TABLES_FILE))
    try:
        connection.execute("DELETE FROM __topicbase.topics WHERE name = 'logs'")
        connection.execute(
            "INSERT INTO __topicbase.transactions VALUES (42, 0, ?, '[]')",
            [json.dumps([["t0000000001", 0, 99, 0, 64]])],
        )
    finally:
        connection.close()
    before = file_hashes(data_dir)
    result = check(data_dir, "--repair")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    topic_dir = data_dir / "store" / "topics" / "t0000000002"
    assert f"error: catalog_mismatch: {topic_dir}: storage topic without a catalog entry" in (
        "\n".join(lines)
    )
    stage = data_dir / "staging" / "00000000000000000099.stage"
    assert any(line.startswith(f"error: bad_record: {stage} at byte 0: ") for line in lines)
    assert file_hashes(data_dir) == before  # DuckDB was opened read-only


def test_a_data_directory_another_process_holds_is_not_checked(data_dir: Path) -> None:
    assert TOPICBASE is not None
    owner = subprocess.Popen(
        [TOPICBASE, "--data-dir", str(data_dir), "-f", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lock_file = data_dir / "store" / "LOCK"
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while lock_file.read_text().strip() != str(owner.pid):
            assert owner.poll() is None and time.monotonic() < deadline, owner.communicate()
            time.sleep(0.05)
        result = check(data_dir, "--repair")
    finally:
        _, stderr = owner.communicate("SELECT 1 AS one;", timeout=RUN_TIMEOUT_S)
    assert result.returncode == 1
    assert "error: in_use: " in result.stdout
    assert f"is in use by another process (pid {owner.pid})" in result.stdout
    assert result.stdout.splitlines()[-1].startswith("check not run on ")
    assert owner.returncode == 0, stderr


def test_a_missing_data_directory_exits_1_and_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nothing"
    result = check(missing)
    assert result.returncode == 1
    assert f"error: missing: {missing}: not a Topicbase data directory" in result.stdout
    assert not missing.exists()
    assert os.listdir(tmp_path) == []


# -- the live check: a real ``topicbase serve`` owns the directory -----------------------------
@pytest.fixture
def served(data_dir: Path) -> Iterator[tuple[Path, int]]:
    """``topicbase serve`` on a copy of the written directory: (directory, port)."""
    assert TOPICBASE is not None
    process = subprocess.Popen(
        [TOPICBASE, "--data-dir", str(data_dir), "serve", "--port", "0", "--flight-port", "0",
         "--auth", "trust"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "serving" in line, line + process.stderr.read() if process.stderr else line
        yield data_dir, int(line.rsplit(":", 1)[1])
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=RUN_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_a_running_server_s_directory_is_checked_live_and_read_only(
    served: tuple[Path, int],
) -> None:
    data_dir, port = served
    with psycopg.connect(host="127.0.0.1", port=port, autocommit=True) as conn:
        conn.execute("CREATE TOPIC served WITH (min_active_partitions = 2)")
        conn.execute("INSERT INTO TOPIC served (data) VALUES ('a'), ('b'), ('c')")
    before = file_hashes(data_dir)
    result = check(data_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    (line,) = result.stdout.splitlines()
    # The topic the server created is in the store and in the catalog (the copy of it).
    assert line.startswith("ok: no problems in 3 topics, 5 partitions, "), line
    assert "(live, read-only: data directory " in line and "in use by another process" in line
    assert file_hashes(data_dir) == before
    as_json = json.loads(check(data_dir, "--format", "json").stdout)
    assert as_json["ok"] and "in use by another process" in as_json["live"]
    refused = check(data_dir, "--repair")  # only the owner may change the files
    assert refused.returncode == 1 and "error: in_use: " in refused.stdout


def test_a_live_check_under_concurrent_writes_stays_clean(served: tuple[Path, int]) -> None:
    data_dir, port = served
    stop = threading.Event()
    written: list[int] = []

    def write() -> None:
        with psycopg.connect(host="127.0.0.1", port=port, autocommit=True) as conn:
            while not stop.is_set():
                conn.execute("INSERT INTO TOPIC logs (data) VALUES ('x'), ('y')")
                conn.execute("INSERT INTO users VALUES (%s)", [f"u{len(written)}"])
                written.append(1)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        while not written:
            assert writer.is_alive()
            time.sleep(0.01)
        results = [check(data_dir) for _ in range(3)]
    finally:
        stop.set()
        writer.join(timeout=RUN_TIMEOUT_S)
    assert len(written) > 1
    for result in results:
        assert result.returncode == 0, result.stdout + result.stderr


def test_damage_under_a_running_server_is_reported_live(served: tuple[Path, int]) -> None:
    data_dir, _ = served
    log = events_log(data_dir)
    raw = bytearray(log.read_bytes())
    raw[60] ^= 0xFF  # inside the body of the first frame, as in the offline test
    log.write_bytes(bytes(raw))
    result = check(data_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"error: corrupt_frame: {log} at byte 0: checksum mismatch" in result.stdout
    assert "(live, read-only: " in result.stdout.splitlines()[-1]


def test_a_live_check_reports_only_what_every_run_finds(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finding of one moment (an append in flight) is dropped; damage that stays is kept."""
    from engine import check as engine_check
    from storage.check_report import BROKEN_FRAME, TORN_TAIL, CheckReport, Problem

    runs: list[int] = []

    def fake_run(report: CheckReport, path: str, fs: object, *, repair: bool) -> None:
        assert not repair and report.live == "held by pid 7"
        runs.append(1)
        report.add(Problem(BROKEN_FRAME, "a.log", "damage", 0))
        report.add(Problem(TORN_TAIL, "b.log", "append in flight", 100 * len(runs)))

    monkeypatch.setattr(engine_check, "_check_run", fake_run)
    monkeypatch.setattr(engine_check, "LIVE_PAUSE_S", 0)
    report = engine_check.check_live(str(data_dir), "held by pid 7")
    assert len(runs) == engine_check.LIVE_RUNS_MAX
    assert [(p.kind, p.path) for p in report.problems] == [(BROKEN_FRAME, "a.log")]
    assert not report.ok
