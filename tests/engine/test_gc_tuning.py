"""``engine.gc_tuning``: the collector is tuned once per process when a database opens,
as ``TOPICBASE_GC`` says, and garbage cycles are still freed; only a process Topicbase owns
(the server) freezes its long-lived objects, so an embedded database leaks nothing.

Each case runs in a fresh interpreter (the setting is per process, and the test process
itself may have opened databases already); the child prints what it saw as JSON. The
children are started together and run side by side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import gc_tuning

ROOT = Path(__file__).resolve().parents[2]

# Opens two databases, then makes garbage cycles without calling gc.collect, then forks.
CHILD = textwrap.dedent(
    """
    import gc, json, os, sys, weakref
    from engine import gc_tuning
    from engine.database import Database

    if sys.argv[2] == "own":
        gc.set_threshold(1000, 15, 15)
    seen = {"before": list(gc.get_threshold())}
    first = Database.open(os.path.join(sys.argv[1], "a"), retention_interval_s=None)
    seen["threshold"] = list(gc.get_threshold())
    seen["frozen"] = gc.get_freeze_count()
    seen["mode"] = gc_tuning.configured_mode()
    if sys.argv[2] == "owned":  # what the server does once its database is open
        seen["owned_frozen"] = gc_tuning.freeze_owned_process()
        seen["frozen"] = gc.get_freeze_count()
    second = Database.open(os.path.join(sys.argv[1], "b"), retention_interval_s=None)
    seen["frozen_after_second_open"] = gc.get_freeze_count()
    seen["threshold_after_second_open"] = list(gc.get_threshold())

    class Node:
        freed = 0
        def __init__(self):
            self.me = self  # a cycle: reference counting alone never frees it
        def __del__(self):
            Node.freed += 1

    for _ in range(300_000):
        Node()
    seen["cycles_made"] = 300_000
    seen["cycles_freed"] = Node.freed
    seen["gc_enabled"] = gc.isenabled()

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: inherits the parent's tuning; configure does nothing again
        os.close(read)
        frozen = gc.get_freeze_count()
        mode = gc_tuning.configure()
        child = {"threshold": list(gc.get_threshold()), "mode": mode,
                 "frozen_same": gc.get_freeze_count() == frozen}
        os.write(write, json.dumps(child).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    seen["forked"] = json.loads(os.read(read, 65536))
    second.close()
    first.close()
    first_ref = weakref.ref(first)
    del first
    gc.collect()
    seen["closed_database_freed"] = first_ref() is None
    print(json.dumps(seen))
    """
)


def _start(tmp_path: Path, gc_setting: str | None, start: str = "default") -> subprocess.Popen:
    environment = {k: v for k, v in os.environ.items() if k != gc_tuning.ENVIRONMENT_VARIABLE}
    if gc_setting is not None:
        environment[gc_tuning.ENVIRONMENT_VARIABLE] = gc_setting
    environment["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), start], env=environment,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip


def _seen(child: subprocess.Popen) -> dict:
    """What the child printed (it must exit 0)."""
    stdout, stderr = child.communicate(timeout=300)
    assert child.returncode == 0, stderr
    return json.loads(stdout.strip().splitlines()[-1])


# Each case's child: (TOPICBASE_GC, how the child starts).
CASES = {"default": (None, "default"), "owned": (None, "owned"), "python": ("python", "default"),
         "threshold": ("threshold", "default"), "freeze": ("freeze", "default"),
         "own": (None, "own")}  # fmt: skip


@pytest.fixture(scope="module")
def children(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, subprocess.Popen]]:
    """Every case's child, all started at once: each is a fresh interpreter of its own and
    reports only its own collector, so they run side by side on the cores there are."""
    base = tmp_path_factory.mktemp("gc")
    started = {name: _start(base / name, *case) for name, case in CASES.items()}
    yield started
    for child in started.values():
        if child.poll() is None:
            child.kill()
        child.communicate()


def test_embedded_default_tunes_thresholds_and_freezes_nothing(children) -> None:
    seen = _seen(children["default"])
    assert seen["before"] == list(gc_tuning.PYTHON_THRESHOLDS)
    assert seen["mode"] == "tuned"
    assert seen["threshold"] == list(gc_tuning.GC_THRESHOLDS)
    assert seen["frozen"] == 0 == seen["frozen_after_second_open"]
    # nothing of the host process is kept: a closed database is garbage like any object
    assert seen["closed_database_freed"]
    assert seen["cycles_freed"] >= seen["cycles_made"] - 2 * gc_tuning.GC_THRESHOLDS[0]


def test_owned_process_tunes_once_freezes_and_still_frees_cycles(children) -> None:
    seen = _seen(children["owned"])
    assert seen["mode"] == "tuned"
    assert seen["owned_frozen"]
    assert seen["threshold"] == list(gc_tuning.GC_THRESHOLDS)
    assert seen["frozen"] > 10_000  # the modules and the open database's objects
    # once per process: a second open freezes nothing more
    assert seen["frozen_after_second_open"] == seen["frozen"]
    assert seen["threshold_after_second_open"] == list(gc_tuning.GC_THRESHOLDS)
    # the collector still runs: all but at most the last young generation's cycles are gone
    assert seen["gc_enabled"]
    assert seen["cycles_freed"] >= seen["cycles_made"] - 2 * gc_tuning.GC_THRESHOLDS[0]
    # a forked child keeps the tuning and does not apply it again
    assert seen["forked"] == {
        "threshold": list(gc_tuning.GC_THRESHOLDS), "mode": "tuned", "frozen_same": True,
    }  # fmt: skip


def test_python_setting_leaves_the_collector_alone(children) -> None:
    seen = _seen(children["python"])
    assert seen["mode"] == "python"
    assert seen["threshold"] == list(gc_tuning.PYTHON_THRESHOLDS)
    assert seen["frozen"] == 0
    assert seen["cycles_freed"] >= seen["cycles_made"] - 2 * gc_tuning.PYTHON_THRESHOLDS[0]


def test_threshold_and_freeze_settings_apply_one_half_each(children) -> None:
    only_threshold, only_freeze = _seen(children["threshold"]), _seen(children["freeze"])
    assert only_threshold["threshold"] == list(gc_tuning.GC_THRESHOLDS)
    assert only_threshold["frozen"] == 0
    assert only_freeze["threshold"] == list(gc_tuning.PYTHON_THRESHOLDS)
    assert only_freeze["frozen"] > 10_000


def test_a_process_with_its_own_thresholds_is_left_alone(children) -> None:
    seen = _seen(children["own"])
    assert seen["mode"] == "python"
    assert seen["threshold"] == [1000, 15, 15]
    assert seen["frozen"] == 0


def test_unknown_setting_is_python_with_a_warning(monkeypatch, caplog) -> None:
    monkeypatch.setenv(gc_tuning.ENVIRONMENT_VARIABLE, "fast")
    assert gc_tuning.mode_from_environment() == "python"
    assert "TOPICBASE_GC" in caplog.text
    monkeypatch.setenv(gc_tuning.ENVIRONMENT_VARIABLE, " Tuned ")
    assert gc_tuning.mode_from_environment() == "tuned"
    monkeypatch.delenv(gc_tuning.ENVIRONMENT_VARIABLE)
    assert gc_tuning.mode_from_environment() == gc_tuning.DEFAULT_MODE
