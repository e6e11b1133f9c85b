"""``check_database``: the offline check of a data directory behind ``topicbase check``.

Holds the store's lock for the whole check when it can, so no ``Database`` opens
the directory meanwhile (else: the live check below), and never opens one itself
(opening recovers: it would change what is being checked). Steps:

1. the storage check (``storage.check``) of ``<data>/store`` and
   ``<data>/staging``, repairing only with ``repair``;
2. the DuckDB file ``<data>/tables.duckdb``, opened read-only: the catalog
   (``__topicbase.topics``) must list exactly the topics of ``store.json``;
3. every commit record (``__topicbase.transactions``) must name partitions
   that exist and, for each partition that does not hold the transaction's
   frame yet, a staged batch that is a checksummed frame of that transaction
   (recovery will publish it from there);
4. owners and grants (``__topicbase.owners``/``grants``, ``engine.privileges``) must name
   topics, tables and views that exist (the schema ``main`` for CREATE), one owner each:
   a dangling grant would silently apply to a later object of the same name.

Nothing of DuckDB is ever repaired here: catalog and records change only
through the engine. Problems are reported as ``storage.check_report.Problem``.

**Live check.** When another process (a running ``topicbase serve``) owns the
directory, a check without ``repair`` still runs, read-only and without any lock
(``--repair`` is refused with ``in_use``: only the owner may change the files):

- the storage files are read in place. The owner keeps writing while they are read,
  so a run can see an append in flight (a torn tail), a temp file of an atomic
  rename, or a file that vanishes (retention); such findings belong to a moment,
  damage stays. A run that finds nothing ends the check; otherwise it is run again,
  up to ``LIVE_RUNS_MAX`` runs ``LIVE_PAUSE_S`` apart, and only the problems found
  by every run (same kind, file and byte position) are reported.
- DuckDB holds an exclusive lock on ``tables.duckdb`` (a read-only open is refused
  while the server has it), so the file and its WAL are copied to a temporary
  directory and the copy is opened read-only (DuckDB replays the copied WAL in
  memory). A copy is kept only when neither file changed size or mtime while it was
  taken (up to ``COPY_ATTEMPTS_MAX`` attempts): it is then the file as of one moment
  between two commits. The copy costs the file's size in temporary space, once a run.

The report says it was live (``CheckReport.live``): a point-in-time check of a
directory in use, not a proof that no write after it damages anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable

from engine import tables
from engine.catalog import SCHEMA
from engine.database import STAGING_DIRECTORY, STORE_DIRECTORY
from storage.check import check_store_files, locked_store
from storage.check_frames import staged_batch_issue
from storage.check_report import IN_USE, MISSING, UNREADABLE, CheckReport, Problem
from storage.errors import StorageIOError, TopicbaseError
from storage.fs import DEFAULT_FILE_SYSTEM, FileSystem
from storage.limits import CHECK_RECORDS_MAX

CATALOG_MISMATCH = "catalog_mismatch"
BAD_RECORD = "bad_record"
# A live check (another process owns the directory): runs until one is clean, at most this many.
LIVE_RUNS_MAX = 3
LIVE_PAUSE_S = 0.5
# Copies of tables.duckdb taken until one saw the file unchanged from start to end.
COPY_ATTEMPTS_MAX = 5
WAL_SUFFIX = ".wal"


def check_database(
    path: str, repair: bool = False, *, fs: FileSystem = DEFAULT_FILE_SYSTEM
) -> CheckReport:
    """Check (and with ``repair``, carefully repair) the data directory at ``path``."""
    path = os.path.abspath(path)
    report = CheckReport(path, repair)
    store_root = os.path.join(path, STORE_DIRECTORY)
    if not os.path.isdir(store_root):
        text = "not a Topicbase data directory (it has no store/ directory)"
        report.add(Problem(MISSING, path, text))
        report.ran = False
        return report
    with locked_store(store_root, report, fs) as held:
        if held:
            _check_run(report, path, fs, repair=repair)
    in_use = [problem for problem in report.problems if problem.kind == IN_USE]
    if not report.ran and in_use and not repair:
        return check_live(path, in_use[0].message, fs)
    return report


def check_live(path: str, owner: str, fs: FileSystem = DEFAULT_FILE_SYSTEM) -> CheckReport:
    """The read-only check of a directory another process owns (see the module docstring).

    ``owner`` is why the lock was refused (it names the owner's pid); the report carries it.
    """
    runs: list[CheckReport] = []
    for run in range(LIVE_RUNS_MAX):
        if run:
            time.sleep(LIVE_PAUSE_S)
        report = CheckReport(path, repair=False, live=owner)
        try:
            _check_run(report, path, fs, repair=False)
        except (FileNotFoundError, StorageIOError) as error:  # a file went while it was read
            report.add(Problem(UNREADABLE, path, f"changed while read: {error}"))
        runs.append(report)
        if not report.problems and not report.problems_dropped:
            return report
    last = runs[-1]
    last.problems = [problem for problem in last.problems if _in_every(problem, runs[:-1])]
    return last


def _in_every(problem: Problem, runs: Iterable[CheckReport]) -> bool:
    key = (problem.kind, problem.path, problem.position)
    return all(
        any((other.kind, other.path, other.position) == key for other in run.problems)
        for run in runs
    )


def _check_run(report: CheckReport, path: str, fs: FileSystem, *, repair: bool) -> None:
    """Steps 1 to 4 once; the caller holds the lock, or ``report.live`` says who does."""
    store_root = os.path.join(path, STORE_DIRECTORY)
    staging_directory = os.path.join(path, STAGING_DIRECTORY)
    check_store_files(
        report, store_root, repair=repair, staging_directory=staging_directory, fs=fs
    )
    tables_path = os.path.join(path, tables.TABLES_FILE)
    if report.live is None or not fs.exists(tables_path):
        check_tables(report, tables_path, staging_directory, fs)
        return
    with tempfile.TemporaryDirectory(prefix="topicbase-check-") as scratch:
        copy = _stable_copy(tables_path, os.path.join(scratch, tables.TABLES_FILE))
        if copy is None:
            text = (
                f"changed during each of {COPY_ATTEMPTS_MAX} copies (the owner is writing "
                "it): the catalog was not checked; run the check again"
            )
            report.add(Problem(UNREADABLE, tables_path, text))
            return
        check_tables(report, tables_path, staging_directory, fs, open_path=copy)


def _stable_copy(source: str, target: str) -> str | None:
    """Copy ``source`` and its WAL to ``target``; None if every copy saw them change."""
    for attempt in range(COPY_ATTEMPTS_MAX):
        if attempt:
            time.sleep(LIVE_PAUSE_S)
        before = _file_states(source)
        for suffix in ("", WAL_SUFFIX):
            if os.path.exists(target + suffix):
                os.remove(target + suffix)
            # No WAL (just checkpointed), or it went away meanwhile: the states tell.
            with contextlib.suppress(FileNotFoundError):
                shutil.copyfile(source + suffix, target + suffix)
        if _file_states(source) == before:
            return target
    return None


def _file_states(path: str) -> tuple[tuple[int, int] | None, ...]:
    """(size, mtime in ns) of the DuckDB file and of its WAL, None for a missing one."""
    states = []
    for suffix in ("", WAL_SUFFIX):
        try:
            stat = os.stat(path + suffix)
        except FileNotFoundError:
            states.append(None)
            continue
        states.append((stat.st_size, stat.st_mtime_ns))
    return tuple(states)


def check_tables(
    report: CheckReport,
    tables_path: str,
    staging_directory: str,
    fs: FileSystem,
    *,
    open_path: str | None = None,
) -> None:
    """Steps 2 to 4, after the storage check filled ``report`` with what it saw.

    ``open_path`` is the file DuckDB opens (a live check's copy); problems name ``tables_path``.
    """
    if not fs.exists(tables_path):
        report.add(Problem(MISSING, tables_path, "the tables and catalog file is missing"))
        return
    try:
        connection = tables.connect(open_path or tables_path, read_only=True)
    except TopicbaseError as error:
        report.add(Problem(UNREADABLE, tables_path, error.message))
        return
    try:
        present = _catalog_tables(connection)
        if "topics" not in present:
            report.add(
                Problem(MISSING, tables_path, f"the catalog table {SCHEMA}.topics is missing")
            )
            return
        _compare_topics(report, tables_path, _catalog_topics(connection))
        if "transactions" in present:  # created at the first open of a Database
            _check_records(report, connection, staging_directory, fs)
        if {"owners", "grants"} <= present:  # data directories made before privileges lack them
            _check_privileges(report, connection, tables_path)
    except TopicbaseError as error:
        report.add(Problem(UNREADABLE, tables_path, error.message))
    finally:
        connection.close()


def _catalog_tables(connection: tables.Connection) -> set[str]:
    result = tables.query_arrow(
        connection,
        "SELECT table_name FROM information_schema.tables WHERE table_schema = ?",
        [SCHEMA],
    )
    assert result is not None
    return set(result.column("table_name").to_pylist())


def _catalog_topics(connection: tables.Connection) -> dict[str, str]:
    """Topic id -> topic name, as the catalog lists them."""
    result = tables.query_arrow(connection, f"SELECT name, topic_id FROM {SCHEMA}.topics")
    assert result is not None
    return {row["topic_id"]: row["name"] for row in result.to_pylist()}


def _compare_topics(report: CheckReport, tables_path: str, catalog: dict[str, str]) -> None:
    if report.topic_ids is None:
        return  # store.json is unreadable (reported): nothing to compare with
    stored = set(report.topic_ids)
    for topic_id in sorted(set(catalog) - stored):
        text = (
            f'catalog topic "{catalog[topic_id]}" ({topic_id}) has no data in the store; '
            "the database will refuse to open"
        )
        report.add(Problem(CATALOG_MISMATCH, tables_path, text))
    data_directory = os.path.dirname(tables_path)
    for topic_id in sorted(stored - set(catalog)):
        path = os.path.join(data_directory, STORE_DIRECTORY, "topics", topic_id)
        text = (
            "storage topic without a catalog entry (an interrupted CREATE TOPIC); "
            "opening the database drops it"
        )
        report.add(Problem(CATALOG_MISMATCH, path, text))


def _check_privileges(report: CheckReport, connection: tables.Connection, path: str) -> None:
    """Step 4: every owner and grant row names an existing object; one owner per object."""
    existing = {("topic", name) for name in _catalog_topics(connection).values()}
    existing |= {("schema", "main")}
    result = tables.query_arrow(
        connection,
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE NOT temporary AND "
        "NOT internal AND schema_name <> ? UNION ALL SELECT schema_name, view_name "
        "FROM duckdb_views() WHERE NOT temporary AND NOT internal AND schema_name <> ?",
        [SCHEMA, SCHEMA],
    )
    assert result is not None
    for row in result.to_pylist():
        schema, name = row["schema_name"], row["table_name"]
        existing.add(("relation", name.lower() if schema == "main" else f"{schema}.{name}".lower()))
    for table, who in (("owners", "owner"), ("grants", "grantee")):
        rows = tables.query_arrow(connection, f"SELECT namespace, name, {who} AS who, "
                                  f"count(*) AS n FROM {SCHEMA}.{table} GROUP BY ALL "
                                  "ORDER BY ALL")  # fmt: skip
        assert rows is not None
        for row in rows.to_pylist():
            if (row["namespace"], row["name"]) not in existing:
                text = (f"{table[:-1]} row for {row['namespace']} \"{row['name']}\" ({who} "
                        f"\"{row['who'] or 'PUBLIC'}\") names an object that does not exist")
                report.add(Problem(CATALOG_MISMATCH, path, text))
    duplicates = tables.query_arrow(connection, f"SELECT namespace, name FROM {SCHEMA}.owners "
                                    "GROUP BY ALL HAVING count(*) > 1 ORDER BY ALL")  # fmt: skip
    assert duplicates is not None
    for row in duplicates.to_pylist():
        text = f"{row['namespace']} \"{row['name']}\" has more than one owner row"
        report.add(Problem(CATALOG_MISMATCH, path, text))


def _check_records(
    report: CheckReport, connection: tables.Connection, staging_directory: str, fs: FileSystem
) -> None:
    result = tables.query_arrow(
        connection,
        f"SELECT transaction_id, items FROM {SCHEMA}.transactions "
        f"ORDER BY transaction_id LIMIT {CHECK_RECORDS_MAX}",
    )
    assert result is not None
    for row in result.to_pylist():
        transaction_id = row["transaction_id"]
        try:
            items = _record_items(row["items"])
        except ValueError as error:
            text = f"commit record of transaction {transaction_id} is malformed: {error}"
            report.add(Problem(BAD_RECORD, staging_directory, text))
            continue
        for item in items:
            _check_record_item(report, transaction_id, item, staging_directory, fs)


def _record_items(text: str) -> list[tuple[str, int, int, int, int]]:
    """The (topic id, partition, file number, position, frame bytes) items of a record."""
    items = json.loads(text)
    if not isinstance(items, list):
        raise ValueError("items is not a list")
    parsed = []
    for item in items:
        if not (isinstance(item, list) and len(item) == 5 and isinstance(item[0], str)):
            raise ValueError(f"item {item!r}")
        if not all(isinstance(value, int) and value >= 0 for value in item[1:]):
            raise ValueError(f"item {item!r}")
        parsed.append((item[0], item[1], item[2], item[3], item[4]))
    return parsed


def _check_record_item(
    report: CheckReport,
    transaction_id: int,
    item: tuple[str, int, int, int, int],
    staging_directory: str,
    fs: FileSystem,
) -> None:
    topic_id, partition, file_number, position, frame_bytes = item
    if report.topic_ids is None or topic_id not in report.topic_ids:
        return  # the topic was dropped since (recovery skips it), or store.json is unreadable
    where = f"{topic_id} partition {partition}"
    if partition not in report.partition_ids.get(topic_id, []):
        text = f"commit record of transaction {transaction_id} names {where}, which does not exist"
        report.add(Problem(BAD_RECORD, staging_directory, text))
        return
    if transaction_id in report.published.get((topic_id, partition), set()):
        return  # published already: recovery never reads its staged copy
    try:
        issue = staged_batch_issue(
            fs, staging_directory, file_number, position, frame_bytes, transaction_id
        )
    except TopicbaseError as error:
        issue = (staging_directory, error.message)
    if issue is not None:
        text = (
            f"transaction {transaction_id} is committed but not yet published to {where}, "
            f"and its staged batch cannot be read: {issue[1]}"
        )
        report.add(Problem(BAD_RECORD, issue[0], text, position))
