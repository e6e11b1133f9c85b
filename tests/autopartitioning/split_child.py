"""Child of the split crash tests: writes, then splits until a failpoint kills it.

Usage: ``split_child.py <store root> <failpoint spec> <rounds>``. Creates (or
opens) the store's one topic with autopartitioning, and in each round writes one
message per producer (seq_nos continue from ``last_seq_no``), prints
``ACK <producer> <seq_no>`` once the write returned, then splits the widest active
partition and prints ``SPLIT <parent> <child> <child>``. The failpoint
(``TOPICBASE_FAILPOINTS`` syntax) is armed after the first round. With action
``nomem`` (a ``MemoryError``, not a kill) the child goes on: a split that raised prints
``NOMEM <parent>``, a write refused after it (a fenced partition) ``REFUSED <producer>``
and ends the writing; the store is closed either way (an error at close: ``CLOSE <error>``).
"""

from __future__ import annotations

import sys

from storage import failpoints
from storage.autopartition import AutoPartitioning
from storage.config import FsyncPolicy, TopicConfig
from storage.record_batch import build_wire_batch
from storage.store import Store

PRODUCERS = [f"producer-{i}" for i in range(8)]


def main() -> None:
    root, spec, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = Store.open(root)
    if not store.topic_ids():
        store.create_topic(TopicConfig(partition_count=1, fsync_policy=FsyncPolicy.ALWAYS))
    topic = store.topic(store.topic_ids()[0])
    if not topic.autopartitioning.ranged:  # a kill may fall between the create and this
        topic.alter(topic.config, AutoPartitioning(strategy="paused", write_speed=10**9))
    refused = False
    for round_number in range(rounds):
        for producer in PRODUCERS:
            seq_no = (topic.last_seq_no(producer) or 0) + 1
            batch = build_wire_batch([f"{producer}:{seq_no}".encode()], producer_id=producer,
                                     seq_no=[seq_no])  # fmt: skip
            try:
                topic.append(batch)
            except Exception as error:  # after a MemoryError: fenced, say
                if "nomem" not in spec:
                    raise
                print(f"REFUSED {producer} {type(error).__name__}: {error}", flush=True)
                refused = True
                break
            print(f"ACK {producer} {seq_no}", flush=True)
        if refused:
            break
        if round_number == 0:
            failpoints.activate(spec)
        widest = max(
            topic.active_partition_ids(),
            key=lambda p: (
                topic.partition_info(p).key_range.high  # type: ignore[union-attr]
                - topic.partition_info(p).key_range.low
            ),  # type: ignore[union-attr]
        )
        try:
            children = topic.split(widest, force=True)
        except MemoryError as error:
            if "nomem" not in spec:
                raise
            print(f"NOMEM {widest} {error}", flush=True)
            continue
        except Exception as error:  # refused after a MemoryError (fenced)
            if "nomem" not in spec:
                raise
            print(f"REFUSED split {type(error).__name__}: {error}", flush=True)
            break
        print(f"SPLIT {widest} {children}", flush=True)
    try:
        store.close()
    except Exception as error:
        if "nomem" not in spec:
            raise
        print(f"CLOSE {type(error).__name__}: {error}", flush=True)


if __name__ == "__main__":
    main()
