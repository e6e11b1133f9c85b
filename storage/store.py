"""The store: a data directory of topics. The door to storage for the engine.

Layout::

    <root>/LOCK              held (flock) by the one process using the store
    <root>/store.json        {"next_topic_id": n, "topics": [ids]}, replaced atomically
    <root>/topics/<id>/      one ``TopicLog`` each (see topic_log)

Topic ids are assigned here (``t`` + 10 digits) and never reused. A topic is
created in a temporary directory and renamed into place, then listed in
``store.json``; a directory not listed there is a leftover of an interrupted
create or drop and is removed on open.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence

from storage import file_names, limits
from storage.clock import SYSTEM_CLOCK, Clock
from storage.config import TopicConfig, ledger_enabled
from storage.errors import LimitExceededError, UndefinedTopicError
from storage.fs import DEFAULT_FILE_SYSTEM, FileSystem
from storage.topic_log import TopicLog

MANIFEST = "store.json"


class Store:
    def __init__(self, root: str, fs: FileSystem, clock: Clock, lock_fd: int | None,
                 ledger: bool = False) -> None:  # fmt: skip
        self.root = root
        # Each topic's small spread statements go to its ledger (``storage.ledger_route``):
        # the switch, on unless turned off (``config.ledger_enabled``).
        self.ledger = ledger
        self.fs = fs
        self.clock = clock
        self._lock_fd = lock_fd
        self._lock = threading.Lock()
        self._topics: dict[str, TopicLog] = {}
        self._next_topic_id = 1
        # The engine's consumers' committed offsets of a topic (one mapping a consumer), or
        # None: asked by the topics' ledgers for the files they keep (``storage.
        # ledger_route.Readers``); set once the engine's catalog is open.
        self.readers: Callable[[str], Sequence[Mapping[int, int]] | None] | None = None

    @classmethod
    def open(
        cls,
        root: str,
        *,
        fs: FileSystem = DEFAULT_FILE_SYSTEM,
        clock: Clock = SYSTEM_CLOCK,
        lock: bool = True,
        ledger: bool | None = None,
    ) -> Store:
        """Open (creating if needed) the store at ``root`` and recover every topic.
        ``ledger``: the ledger switch (None: on unless ``TOPICBASE_LEDGER=0``);
        off, a ledger an earlier run left is copied into the partitions and closed."""
        root = os.path.abspath(root)
        fs.make_directory(os.path.join(root, "topics"))
        lock_fd = fs.lock_directory(root) if lock else None
        store = cls(root, fs, clock, lock_fd, ledger_enabled() if ledger is None else ledger)
        try:
            store._load()
        except BaseException:
            store.close()
            raise
        return store

    def _load(self) -> None:
        # A replace of store.json cut short (before its rename) leaves the temp file; the
        # old store.json stands. Recovery deletes the leftover.
        self.fs.remove(os.path.join(self.root, MANIFEST + file_names.TEMP_SUFFIX))
        try:
            manifest = json.loads(self.fs.read_file(os.path.join(self.root, MANIFEST)))
        except FileNotFoundError:
            manifest = {"next_topic_id": 1, "topics": []}
        self._next_topic_id = manifest["next_topic_id"]
        listed = set(manifest["topics"])
        topics_dir = os.path.join(self.root, "topics")
        for name in self.fs.list_directory(topics_dir):
            if name not in listed:
                self.fs.remove_tree(os.path.join(topics_dir, name))
        for topic_id in sorted(listed):
            self._topics[topic_id] = TopicLog(
                self.fs,
                os.path.join(topics_dir, topic_id),
                topic_id,
                self.clock,
                create=False,
                ledger=self.ledger,
                readers=self._readers_of(topic_id),
            )

    def _readers_of(self, topic_id: str) -> Callable[[], Sequence[Mapping[int, int]] | None]:
        """``topic_id``'s readers as ``readers`` answers when asked (None until it is set)."""

        def readers() -> Sequence[Mapping[int, int]] | None:
            lookup = self.readers
            return None if lookup is None else lookup(topic_id)

        return readers

    def _save(self) -> None:
        manifest = {"next_topic_id": self._next_topic_id, "topics": sorted(self._topics)}
        self.fs.write_file_atomic(os.path.join(self.root, MANIFEST), json.dumps(manifest).encode())

    # -- topics -----------------------------------------------------------------------
    def create_topic(self, config: TopicConfig) -> TopicLog:
        """Create a topic with a fresh id; it exists once ``store.json`` lists it."""
        config.validate()
        with self._lock:
            if len(self._topics) >= limits.TOPICS_MAX:
                raise LimitExceededError(f"a store holds at most {limits.TOPICS_MAX} topics")
            topic_id = f"t{self._next_topic_id:010d}"
            self._next_topic_id += 1
            directory = os.path.join(self.root, "topics", topic_id)
            topic = TopicLog(self.fs, directory, topic_id, self.clock, create=True,
                             ledger=self.ledger, readers=self._readers_of(topic_id))  # fmt: skip
            topic.create(config)
            self._topics[topic_id] = topic
            self._save()
            return topic

    def topic(self, topic_id: str) -> TopicLog:
        try:
            return self._topics[topic_id]
        except KeyError:
            raise UndefinedTopicError(f"no topic with id {topic_id!r}") from None

    def topic_ids(self) -> list[str]:
        return sorted(self._topics)

    def drop_topic(self, topic_id: str) -> None:
        """Forget the topic first (durably), then delete its files."""
        with self._lock:
            topic = self.topic(topic_id)
            del self._topics[topic_id]
            self._save()
        topic.delete()

    @property
    def fsync_count(self) -> int:
        return self.fs.fsync_count

    def close(self) -> None:
        with self._lock:
            for topic in self._topics.values():
                topic.close()
            self._topics.clear()
            if self._lock_fd is not None:
                self.fs.unlock_directory(self._lock_fd)
                self._lock_fd = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
