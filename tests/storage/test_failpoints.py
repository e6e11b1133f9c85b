"""Failpoints: armed by name, fire on the n-th hit, crash or raise; free when off."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from storage import failpoints
from storage.config import FsyncPolicy, TopicConfig
from storage.errors import StorageIOError
from storage.record_batch import build_wire_batch
from storage.store import Store


@pytest.fixture(autouse=True)
def _disarm():
    yield
    failpoints.deactivate()


def test_error_failpoint_raises_on_the_nth_hit_only():
    failpoints.activate("demo.point=error@2")
    failpoints.hit("demo.point")
    with pytest.raises(StorageIOError) as caught:
        failpoints.hit("demo.point")
    assert caught.value.sqlstate == "58030"
    failpoints.hit("demo.point")  # past the n-th hit: quiet again


def test_nomem_failpoint_raises_memory_error_on_the_nth_hit_only():
    failpoints.activate("demo.point=nomem@2")
    failpoints.hit("demo.point")
    with pytest.raises(MemoryError, match=r"failpoint demo\.point"):
        failpoints.hit("demo.point")
    failpoints.hit("demo.point")


def test_unarmed_names_and_deactivated_failpoints_do_nothing():
    failpoints.activate("other=error")
    failpoints.hit("demo.point")
    failpoints.deactivate()
    assert not failpoints.ACTIVE
    failpoints.hit("other")


def test_fsync_failpoint_fences_the_partition(tmp_path):
    with Store.open(str(tmp_path)) as store:
        topic = store.create_topic(TopicConfig(fsync_policy=FsyncPolicy.ALWAYS))
        topic.append(build_wire_batch([b"kept"]), partition=0)
        failpoints.activate("fs.before_sync=error")
        with pytest.raises(StorageIOError):
            topic.append(build_wire_batch([b"lost"]), partition=0)
        failpoints.deactivate()
        with pytest.raises(StorageIOError):
            topic.append(build_wire_batch([b"refused"]), partition=0)


def test_crash_failpoint_kills_the_process_with_status_137(tmp_path):
    script = (
        "from storage.store import Store\n"
        "from storage.config import TopicConfig\n"
        "from storage.record_batch import build_wire_batch\n"
        f"store = Store.open({str(tmp_path)!r})\n"
        "topic = store.create_topic(TopicConfig(segment_bytes=1024))\n"
        "for i in range(50):\n"
        "    topic.append(build_wire_batch([b'x' * 200]), partition=0)\n"
        "print('not reached')\n"
    )
    environment = {**os.environ, failpoints.ENVIRONMENT_VARIABLE: "segment.torn_write=crash@7"}
    process = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=60
    )
    assert process.returncode == 137, process.stderr
    assert "not reached" not in process.stdout
    with Store.open(str(tmp_path)) as store:
        partition = store.topic(store.topic_ids()[0]).partition(0)
        assert partition.end_offset == 6  # the torn seventh frame was cut
        assert partition.recovery.truncated_bytes > 0


def test_the_module_docstring_names_every_failpoint_in_use() -> None:
    """The list of names in ``storage.failpoints``' docstring is the reference tests and
    TOPICBASE_FAILPOINTS users read: every ``failpoints.hit("…")`` in the code is in it."""
    import re
    from pathlib import Path

    from storage import failpoints

    root = Path(failpoints.__file__).resolve().parent.parent
    used = {
        name
        for package in ("storage", "engine")
        for path in (root / package).rglob("*.py")
        for name in re.findall(r'failpoints\.hit\(\s*"([a-z_.]+)"', path.read_text())
    }
    assert len(used) >= 20
    documented = set(re.findall(r"``([a-z_]+\.[a-z_]+)``", failpoints.__doc__ or ""))
    assert used - documented == set()
