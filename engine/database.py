"""``Database.open(path)``: the single door from the fronts into Topicbase.

A data directory holds the topic store (``<data>/store``, see ``storage``) and
the DuckDB file with the user's tables and the catalog
(``<data>/tables.duckdb``). One process owns a data directory at a time (the
store's lock file says which); inside it, every ``open`` of the same path
returns the same ``Database`` and each ``connect()`` is a new session.

Open reconciles the two halves: a storage topic the catalog does not list is a
leftover of a ``CREATE TOPIC`` interrupted before its catalog commit, and is
dropped; a catalog topic whose storage is missing is reported, never invented.

Open also starts the retention service (``engine.retention``): every minute by
default, old segments go, never past what an important consumer has not committed.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import ClassVar

from engine import commit_cpu, gc_tuning, malloc_tuning, tables
from engine.catalog import CatalogStore, TopicEntry
from engine.clock import SYSTEM_CLOCK, Clock
from engine.commit import Committer
from engine.identity import LOCAL_SUPERUSER, Identity
from engine.leases import DEFAULT_LEASE_TIMEOUT_S, LeaseRegistry
from engine.reads import RoundRobin
from engine.retention import DEFAULT_RETENTION_INTERVAL_S, RetentionService, run_retention_pass
from engine.session import Session
from engine.staged_writes import SPILL_DIRECTORY, StagedWrites
from planner.catalog import TopicInfo
from planner.paths import DEFAULT_DATABASE_PATH, check_database_path
from storage.cleaner import RetentionReport
from storage.config import FsyncPolicy
from storage.errors import StorageIOError
from storage.fs import DEFAULT_FILE_SYSTEM, FileSystem
from storage.staging import StagingLog
from storage.store import Store
from storage.topic_log import TopicLog

log = logging.getLogger(__name__)

# The two halves of a data directory besides the DuckDB file (tables.TABLES_FILE).
STORE_DIRECTORY = "store"
STAGING_DIRECTORY = "staging"
# Where DuckDB spills beyond its memory limit (the sandbox: never outside the data directory).
TEMP_DIRECTORY = "tmp"


class Database:
    _open: ClassVar[dict[str, Database]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()
    database_path: str = DEFAULT_DATABASE_PATH  # absolute topic paths start with it

    def __init__(
        self,
        path: str,
        clock: Clock,
        fsync_policy: FsyncPolicy,
        lease_timeout_s: float,
        fs: FileSystem,
        retention_interval_s: float | None = None,
        memory_limit_bytes: int | None = None,
    ) -> None:
        self.path = path
        self.clock = clock
        self.fsync_policy = fsync_policy
        tables.set_switch_interval()  # every front opens a database: see engine.tables
        # Where committing sessions' threads run (engine.commit_cpu): one per process.
        self.commit_cpu = commit_cpu.process_commit_cpu()
        self.store = Store.open(os.path.join(path, STORE_DIRECTORY), fs=fs, clock=clock)
        try:
            temp_directory = os.path.join(path, TEMP_DIRECTORY)
            os.makedirs(temp_directory, exist_ok=True)
            tables_path = os.path.join(path, tables.TABLES_FILE)
            tables.create_whole(tables_path, fs)  # a new directory's file: whole or none
            self.root = tables.connect(
                tables_path,
                memory_limit_bytes=memory_limit_bytes,
                temp_directory=temp_directory,
            )
        except BaseException:
            self.store.close()
            raise
        try:
            self._open_rest(clock, lease_timeout_s, retention_interval_s)
        except BaseException:  # a failed open (recovery, say) leaves nothing open
            committer = getattr(self, "committer", None)
            if committer is not None:
                committer.close_unrecovered()
            self.root.close()
            self.store.close()
            raise

    def _open_rest(
        self, clock: Clock, lease_timeout_s: float, retention_interval_s: float | None
    ) -> None:
        """The database's parts past its files, then recovery (``__init__``)."""
        path = self.path
        self.catalog = CatalogStore(self.root.cursor(), clock)
        # the topics' ledgers keep the files a consumer has not read (``storage.ledger``)
        self.store.readers = self.catalog.consumers_offsets
        # Serialises the validate-then-commit step of transactions and DDL.
        self.commit_lock = threading.RLock()
        # Held while a transaction publishes to all its partitions; readers take
        # their cut of end offsets under it, so they see a publish whole or not at all.
        self.publish_lock = threading.Lock()
        # Where each consumer's last poll stopped: the next starts after it (engine.reads).
        self.read_round_robin = RoundRobin()
        self._references = 0
        self.open_transactions = 0
        self.leases = LeaseRegistry(clock, lease_timeout_s)
        self._reconcile()
        staging = StagingLog(self.store.fs, os.path.join(path, STAGING_DIRECTORY))
        self.committer = Committer(self, staging)
        # Open transactions' topic writes beyond memory; a dead process's files go now.
        self.staged_writes = StagedWrites(self.store.fs, os.path.join(path, SPILL_DIRECTORY))
        republished = self.committer.recover()
        if republished:
            log.warning("recovery re-published %d staged batches", republished)
        self._retention = (
            None if retention_interval_s is None else RetentionService(self, retention_interval_s)
        )
        # Once per process, now that the long-lived objects exist (engine.gc_tuning).
        gc_tuning.configure()
        malloc_tuning.configure()  # (glibc's thresholds fixed: engine.malloc_tuning)

    @classmethod
    def open(
        cls,
        path: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
        fsync_policy: FsyncPolicy = FsyncPolicy.GROUP,
        lease_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S,
        fs: FileSystem = DEFAULT_FILE_SYSTEM,
        retention_interval_s: float | None = DEFAULT_RETENTION_INTERVAL_S,
        database_path: str = DEFAULT_DATABASE_PATH,
        memory_limit_bytes: int | None = None,
    ) -> Database:
        """Open (creating if needed) the data directory; shared within a process.

        Retention runs every ``retention_interval_s`` seconds in the background
        (None: only when ``run_retention`` is called). The first open of a
        directory in a process decides the settings; later opens share it.
        ``database_path`` is the database's path in YDB's sense: a topic may be named
        ``<database_path>/dir/events`` as well as ``dir/events`` (``planner.paths``).
        ``memory_limit_bytes`` caps DuckDB's memory (default: 40 % of physical memory,
        ``limits.DUCKDB_MEMORY_FRACTION``); beyond it DuckDB spills to ``<path>/tmp``.
        """
        path = os.path.abspath(path)
        database_path = check_database_path(database_path)
        with cls._registry_lock:
            database = cls._open.get(path)
            if database is None:
                os.makedirs(path, exist_ok=True)
                database = cls(
                    path, clock, fsync_policy, lease_timeout_s, fs, retention_interval_s,
                    memory_limit_bytes,
                )
                database.database_path = database_path
                cls._open[path] = database
            database._references += 1
            return database

    def connect(self, identity: Identity = LOCAL_SUPERUSER) -> Session:
        """A new session acting as ``identity`` (the local superuser by default: the
        console and DB-API; the servers pass the authenticated user)."""
        return Session(self, identity)

    def close(self) -> None:
        """Drop one reference; the last one closes files and releases the lock."""
        with self._registry_lock:
            self._references -= 1
            if self._references > 0:
                return
            self._open.pop(self.path, None)
        if self._retention is not None:
            self._retention.stop()
        try:
            self.committer.close()
        finally:
            self.root.close()
            self.store.close()

    def commit_counters(self) -> dict[str, int]:
        """Counters of the commit paths so far (cheap: a few attribute reads), for
        benchmarks: ``log_commits`` (topic-only transactions, committed in the staging
        log), ``table_commits`` (committed through DuckDB: each also costs DuckDB's WAL
        fsync, which ``storage.fs`` does not see), ``staging_syncs`` (fdatasyncs of the
        staging log: group commit shares one among concurrent commits of either kind),
        ``checkpoint_syncs`` (partition syncs by checkpoints, off the commit path) and
        ``fs_fsyncs`` (``storage.fs``'s ``fsync_count`` of this database's file system,
        shared by every database opened on it). Fsyncs per commit on the commit path:
        ``(staging_syncs + table_commits) / (log_commits + table_commits)``."""
        committer = self.committer
        return {
            "log_commits": committer.log_commits,
            "table_commits": committer.table_commits,
            "staging_syncs": committer.staging.syncs,
            "checkpoint_syncs": committer.checkpoint_syncs,
            "fs_fsyncs": self.store.fs.fsync_count,
        }

    def run_retention(self) -> RetentionReport:
        """Run one retention pass now (the background service runs them periodically)."""
        return run_retention_pass(self)

    def wake_readers(self) -> None:
        """Wake every long-polling topic read (a cancel wants to be noticed)."""
        for topic_id in self.store.topic_ids():
            topic = self.store.topic(topic_id)
            with topic.data_ready:
                topic.data_ready.notify_all()

    # -- catalog helpers ----------------------------------------------------------------
    def topic_log(self, topic_id: str) -> TopicLog:
        return self.store.topic(topic_id)

    def topic_info(self, name: str) -> TopicInfo | None:
        entry = self.catalog.entry(name)
        return None if entry is None else self.info_of(entry)

    def info_of(self, entry: TopicEntry) -> TopicInfo:
        topic = self.store.topic(entry.topic_id)
        return self.catalog.info(
            entry, tuple(topic.partition_ids()), tuple(topic.active_partition_ids())
        )

    def topic_names(self) -> list[str]:
        return [e.name for e in self.catalog.entries()]

    # The planner's Catalog protocol.
    def topic(self, name: str) -> TopicInfo | None:
        return self.topic_info(name)

    def _reconcile(self) -> None:
        known = self.catalog.topic_ids()
        for topic_id in self.store.topic_ids():
            if topic_id not in known:
                log.warning(
                    "dropping storage topic %s: no catalog entry (interrupted DDL)", topic_id
                )
                self.store.drop_topic(topic_id)
        missing = known - set(self.store.topic_ids())
        if missing:
            self.root.close()
            self.store.close()
            raise StorageIOError(
                f"catalog lists topics whose data is missing from {self.path}: "
                + ", ".join(sorted(missing))
            )
