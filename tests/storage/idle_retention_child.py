"""A process that keeps emptying an idle partition by retention, to be killed.

Run by ``test_crash_idle_retention.py`` as ``python -m tests.storage.idle_retention_child
ROOT POLICY`` (its failpoint rounds fork it from ``tests.fork_server`` instead). It
opens (recovering) the store at ROOT, creating one topic of one partition with a 1 s
retention the first time, prints ``open <start> <end>``, then
loops: append a small batch (``ack <first offset> <value>...`` once acknowledged),
run a retention pass with a clock far in the future, so that the whole partition has
expired and the pass rolls the active segment and deletes it (``start <log start>``
once it returned). Every line is flushed before the next step, so the test knows
what was acknowledged before a SIGKILL or a crash failpoint
(``TOPICBASE_FAILPOINTS``) ended the process.
"""

from __future__ import annotations

import sys

from storage.cleaner import NoGuard, apply_retention
from storage.clock import SYSTEM_CLOCK
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.record_batch import build_wire_batch
from storage.store import Store

FUTURE_US = 10**9  # 1000 s ahead: everything written so far is past a 1 s retention
ROUNDS_MAX = 10_000


def main(argv: list[str]) -> None:
    """``argv``: ROOT POLICY (a cold start's ``sys.argv[1:]``, or ``tests.fork_server``'s)."""
    root, policy = argv
    store = Store.open(root, fs=FileSystem(), clock=SYSTEM_CLOCK)
    ids = store.topic_ids()
    if ids:
        topic = store.topic(ids[0])
    else:
        config = TopicConfig(retention_ms=1000, fsync_policy=FsyncPolicy(policy))
        topic = store.create_topic(config)
    partition = topic.partition(0)
    _say(f"open {partition.start_offset} {partition.end_offset}")
    for n in range(ROUNDS_MAX):
        values = [f"{partition.end_offset}.{n}.{k}" for k in range(1 + n % 3)]
        result = partition.append(build_wire_batch([v.encode() for v in values]))
        _say(f"ack {int(result.offsets[0])} " + " ".join(values))
        apply_retention(topic, NoGuard(), SYSTEM_CLOCK.now_us() + FUTURE_US)
        _say(f"start {partition.start_offset}")
    store.close()


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
