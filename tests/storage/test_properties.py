"""Property test: a real store against a plain in-memory model, over random operations.

The model is a list of messages and segment bases per partition, the last
seq_no per producer, the producer -> partition bindings and the round-robin
counter. Operations: routed appends (1-50 messages, three producers whose
seq_nos sometimes repeat or are left null, some messages without producer),
rolls, retention through ``delete_segments_before`` and close + reopen.
After every step each partition's full read must equal the model, with dense
offsets; every append must report duplicates exactly where the model does.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.partition_log import DUPLICATE, WRITTEN
from storage.record_batch import build_wire_batch
from storage.store import Store
from storage.topic_log import TopicLog

PARTITIONS = 2
PRODUCERS = ("p0", "p1", "p2")
Message = tuple[int, str | None, int | None, bytes]  # offset, producer, seq_no, data

# One message to send: producer index (None: no producer) and a seq_no step
# (None: leave the seq_no null). Steps are relative to the producer's largest
# seq_no so far, so they sometimes repeat (<= 0) and sometimes leave gaps (> 1).
message_specs = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(0, len(PRODUCERS) - 1)),
        st.one_of(st.none(), st.integers(-3, 4)),
    ),
    min_size=1,
    max_size=50,
)


@dataclass
class PartitionModel:
    messages: list[Message] = field(default_factory=list)
    segment_bases: list[int] = field(default_factory=lambda: [0])

    @property
    def end_offset(self) -> int:
        return len(self.messages)

    @property
    def start_offset(self) -> int:
        return self.segment_bases[0]


@dataclass
class Model:
    partitions: list[PartitionModel]
    last_seq_no: dict[str, int] = field(default_factory=dict)
    offset_of: dict[tuple[str, int], int] = field(default_factory=dict)
    bindings: dict[str, int] = field(default_factory=dict)
    round_robin: int = 0

    def next_partition(self) -> int:
        partition = self.round_robin % len(self.partitions)
        self.round_robin += 1
        return partition

    def route(self, producers: list[str | None]) -> list[int]:
        """TopicLog's routing: keyless first, then new keys in order of appearance."""
        keyless = self.next_partition() if None in producers else -1
        for producer in dict.fromkeys(p for p in producers if p is not None):
            if producer not in self.bindings:
                self.bindings[producer] = self.next_partition()
        return [keyless if p is None else self.bindings[p] for p in producers]


class NoSyncFileSystem(FileSystem):
    """Skips fsyncs: this test checks logic, not durability, and syncs dominate its time."""

    def sync(self, fd: int) -> None:
        """No fsync: durability is not what this test checks."""

    def sync_directory(self, path: str) -> None:
        pass


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="topicbase-prop-")
        self.clock = ManualClock()
        self.store = Store.open(self.root, fs=NoSyncFileSystem(), clock=self.clock)
        config = TopicConfig(partition_count=PARTITIONS, fsync_policy=FsyncPolicy.NEVER)
        self.topic: TopicLog = self.store.create_topic(config)
        self.model = Model([PartitionModel() for _ in range(PARTITIONS)])
        self.step = 0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- operations -------------------------------------------------------------------------
    @rule(specs=message_specs)
    def append(self, specs: list[tuple[int | None, int | None]]) -> None:
        self.step += 1
        producers, seq_nos = self._make_messages(specs)
        data = [f"s{self.step}-m{i}".encode() for i in range(len(specs))]
        batch = build_wire_batch(data, seq_no=seq_nos, producer_id=producers)
        result = self.topic.append(batch)
        targets = self.model.route(producers)
        assert result.partitions.tolist() == targets
        for partition_id in sorted(set(targets)):
            rows = [i for i, target in enumerate(targets) if target == partition_id]
            self._apply(partition_id, rows, producers, seq_nos, data, result)

    @rule(partition_id=st.integers(0, PARTITIONS - 1))
    def roll(self, partition_id: int) -> None:
        self.topic.partition(partition_id).roll()
        model = self.model.partitions[partition_id]
        if model.end_offset > model.segment_bases[-1]:
            model.segment_bases.append(model.end_offset)

    @rule(partition_id=st.integers(0, PARTITIONS - 1), offset=st.integers(0, 400))
    def delete_segments_before(self, partition_id: int, offset: int) -> None:
        deleted = self.topic.partition(partition_id).delete_segments_before(offset)
        model = self.model.partitions[partition_id]
        bases = model.segment_bases
        doomed = sum(1 for next_base in bases[1:] if next_base <= offset)
        model.segment_bases = bases[doomed:]
        assert deleted == doomed

    @precondition(lambda self: self.step > 0)
    @rule()
    def close_and_reopen(self) -> None:
        topic_id = self.topic.topic_id
        self.store.close()
        self.store = Store.open(self.root, fs=NoSyncFileSystem(), clock=self.clock)
        self.topic = self.store.topic(topic_id)
        self.model.round_robin = 0  # routing restarts; bindings live in producer state

    # -- the check after every step -------------------------------------------------------------
    @invariant()
    def reads_equal_the_model(self) -> None:
        for partition_id, model in enumerate(self.model.partitions):
            partition = self.topic.partition(partition_id)
            assert [s.base_offset for s in partition.segments] == model.segment_bases
            assert (partition.start_offset, partition.end_offset) == (
                model.start_offset,
                model.end_offset,
            )
            rows = self._read_all(partition_id)
            expected = model.messages[model.start_offset :]
            assert [row[0] for row in rows] == list(range(model.start_offset, model.end_offset))
            assert rows == expected
        for producer, seq_no in self.model.last_seq_no.items():
            bound = self.topic.partition(self.model.bindings[producer])
            assert bound.last_seq_no(producer) == seq_no

    # -- helpers ------------------------------------------------------------------------------
    def _make_messages(
        self, specs: list[tuple[int | None, int | None]]
    ) -> tuple[list[str | None], list[int | None]]:
        running = dict(self.model.last_seq_no)
        producers: list[str | None] = []
        seq_nos: list[int | None] = []
        for producer_index, step in specs:
            producer = None if producer_index is None else PRODUCERS[producer_index]
            if step is None:
                seq_no = None
            elif producer is None:
                seq_no = step + 3  # never deduplicated, repeats or not
            else:
                seq_no = max(running.get(producer, -1) + step, 0)
                running[producer] = max(running.get(producer, -1), seq_no)
            producers.append(producer)
            seq_nos.append(seq_no)
        return producers, seq_nos

    def _apply(
        self,
        partition_id: int,
        rows: list[int],
        producers: list[str | None],
        seq_nos: list[int | None],
        data: list[bytes],
        result: object,
    ) -> None:
        """Run the model's dedup over one partition's rows and compare the outcome."""
        model = self.model.partitions[partition_id]
        known_before = dict(self.model.offset_of)
        for row in rows:
            producer, seq_no = producers[row], seq_nos[row]
            status, offset = int(result.status[row]), int(result.offsets[row])  # type: ignore[attr-defined]
            if producer is not None:
                last = self.model.last_seq_no.get(producer, -1)
                seq_no = last + 1 if seq_no is None else seq_no
                if seq_no <= last:
                    assert status == DUPLICATE, (row, producer, seq_no, last)
                    assert offset in (-1, known_before.get((producer, seq_no), -1)), offset
                    continue
                self.model.last_seq_no[producer] = seq_no
                self.model.offset_of[(producer, seq_no)] = model.end_offset
            assert status == WRITTEN, (row, producer, seq_no)
            assert offset == model.end_offset
            model.messages.append((offset, producer, seq_no, data[row]))

    def _read_all(self, partition_id: int) -> list[Message]:
        rows: list[Message] = []
        offset = 0
        for _ in range(1000):
            result = self.topic.read(partition_id, offset, max_messages=37, max_bytes=4096)
            for batch in result.batches:
                rows.extend(
                    zip(
                        batch.column("offset").to_pylist(),
                        batch.column("producer_id").to_pylist(),
                        batch.column("seq_no").to_pylist(),
                        batch.column("data").to_pylist(),
                        strict=True,
                    )
                )
            if not result.batches:
                return rows
            offset = result.next_offset
        raise AssertionError("reading did not reach the end")


StoreMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_store_matches_the_model = StoreMachine.TestCase
