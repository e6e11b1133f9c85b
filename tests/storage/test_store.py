"""Tests of storage/store.py: topics in a data directory, its lock, leftovers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.errors import InvalidParameterValueError, ObjectInUseError, UndefinedTopicError
from storage.fs import FileSystem
from storage.record_batch import build_wire_batch
from storage.store import Store

CONFIG = TopicConfig(partition_count=2, fsync_policy=FsyncPolicy.NEVER)


def _open(root: Any) -> Store:
    return Store.open(str(root), fs=FileSystem(), clock=ManualClock())


def test_create_topic_assigns_fresh_ids(tmp_path: Any) -> None:
    with _open(tmp_path) as store:
        first = store.create_topic(CONFIG)
        second = store.create_topic(TopicConfig(partition_count=1))
        assert (first.topic_id, second.topic_id) == ("t0000000001", "t0000000002")
        assert store.topic_ids() == ["t0000000001", "t0000000002"]
        assert store.topic("t0000000002") is second
        assert first.partition_ids() == [0, 1]
        assert os.path.isdir(os.path.join(str(tmp_path), "topics", "t0000000001", "p1"))


def test_topic_ids_are_never_derived_from_names_or_reused(tmp_path: Any) -> None:
    with _open(tmp_path) as store:
        store.create_topic(CONFIG)
        store.drop_topic("t0000000001")
    with _open(tmp_path) as store:
        topic = store.create_topic(CONFIG)
        assert topic.topic_id == "t0000000002"
        assert os.listdir(os.path.join(str(tmp_path), "topics")) == ["t0000000002"]


def test_topics_and_messages_survive_reopen(tmp_path: Any) -> None:
    with _open(tmp_path) as store:
        topic = store.create_topic(CONFIG)
        topic.append(build_wire_batch([b"a", b"b"]), 1)
    with _open(tmp_path) as store:
        topic = store.topic("t0000000001")
        assert topic.config.partition_count == 2
        assert topic.read(1, 0).batches[0].column("data").to_pylist() == [b"a", b"b"]


def test_drop_topic_forgets_and_deletes_it(tmp_path: Any) -> None:
    with _open(tmp_path) as store:
        topic = store.create_topic(CONFIG)
        store.drop_topic(topic.topic_id)
        assert store.topic_ids() == []
        assert not os.path.exists(topic.directory)
        with pytest.raises(UndefinedTopicError) as raised:
            store.topic(topic.topic_id)
        assert raised.value.sqlstate == "42P01"
        with pytest.raises(UndefinedTopicError):
            store.drop_topic(topic.topic_id)
    with _open(tmp_path) as store:
        assert store.topic_ids() == []


def test_unknown_topic_raises_42p01(tmp_path: Any) -> None:
    with _open(tmp_path) as store, pytest.raises(UndefinedTopicError, match="t9"):
        store.topic("t9")


def test_invalid_config_is_refused_before_anything_is_created(tmp_path: Any) -> None:
    with _open(tmp_path) as store:
        for bad in (
            TopicConfig(partition_count=0),
            TopicConfig(segment_bytes=100),
            TopicConfig(retention_ms=0),
            TopicConfig(supported_codecs=frozenset()),
        ):
            with pytest.raises(InvalidParameterValueError):
                store.create_topic(bad)
        assert store.topic_ids() == []
        assert os.listdir(os.path.join(str(tmp_path), "topics")) == []


def test_leftover_directories_not_in_the_manifest_are_removed(tmp_path: Any) -> None:
    with _open(tmp_path) as store:
        store.create_topic(CONFIG)
    leftover = os.path.join(str(tmp_path), "topics", "t0000000099")
    os.makedirs(os.path.join(leftover, "p0"))
    with _open(tmp_path) as store:
        assert store.topic_ids() == ["t0000000001"]
    assert not os.path.exists(leftover)


def test_manifest_lists_topics(tmp_path: Any) -> None:
    with _open(tmp_path) as store:
        store.create_topic(CONFIG)
    manifest = json.loads((tmp_path / "store.json").read_bytes())
    assert manifest == {"next_topic_id": 2, "topics": ["t0000000001"]}


def test_second_open_in_another_process_names_the_owner_pid(tmp_path: Any) -> None:
    script = textwrap.dedent(
        """
        import sys
        from storage.errors import ObjectInUseError
        from storage.store import Store
        try:
            Store.open(sys.argv[1])
        except ObjectInUseError as error:
            print(error.sqlstate, error)
            sys.exit(3)
        sys.exit(0)
        """
    )
    with _open(tmp_path):
        child = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert child.returncode == 3, child.stderr
        assert child.stdout.startswith("55006")
        assert f"pid {os.getpid()}" in child.stdout
    after = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert after.returncode == 0, after.stdout + after.stderr


def test_second_open_in_this_process_is_refused_too(tmp_path: Any) -> None:
    with _open(tmp_path), pytest.raises(ObjectInUseError):
        _open(tmp_path)
    _open(tmp_path).close()


def test_fsync_count_reports_the_file_system_count(tmp_path: Any) -> None:
    with _open(tmp_path) as store:
        before = store.fsync_count
        topic = store.create_topic(TopicConfig(fsync_policy=FsyncPolicy.ALWAYS))
        topic.append(build_wire_batch([b"a"]))
        assert store.fsync_count > before
        assert store.fsync_count == store.fs.fsync_count
