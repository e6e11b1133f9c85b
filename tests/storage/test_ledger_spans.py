"""``Ledger.spans_many``: where the ledger holds ranges of many partitions, for a read
across segments and ledger (``storage.bulk_scan``): the spans name exactly the wanted
rows, in frame order; a range no longer (or not) wholly in the ledger gives None; the
file map that holds every body is named when there is one."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa

from storage.fs import FileSystem
from storage.ledger import Ledger
from storage.record_batch import WIRE_SCHEMA, build_wire_batch


def _batch(tag: str, count: int) -> pa.RecordBatch:
    return build_wire_batch([f"{tag}/{i}".encode() for i in range(count)],
                            producer_id=f"p-{tag}", seq_no=list(range(count)))  # fmt: skip


def _fill(ledger: Ledger, statements: int, seed: int = 3) -> dict[int, list[bytes]]:
    """Append ``statements`` statements over up to 12 partitions; each partition's data."""
    rng = random.Random(seed)
    data: dict[int, list[bytes]] = {}
    for k in range(statements):
        chosen = sorted(rng.sample(range(12), rng.randint(1, 12)))
        shares = [(p, _batch(f"{k}.{p}", rng.randint(1, 5))) for p in chosen]
        ledger.append(shares, written_at_us=1_000 + k)
        for partition, batch in shares:
            data.setdefault(partition, []).extend(batch.column("data").to_pylist())
    return data


def _rows(spans, partition: int) -> list[tuple[int, bytes]]:
    """(offset, data) of ``partition``'s spans, in span order, read from the bodies."""
    found = []
    for k in np.flatnonzero(spans.partitions == partition).tolist():
        wire = pa.ipc.read_record_batch(spans.bodies[int(spans.frames[k])], WIRE_SCHEMA)
        assert wire.num_rows == spans.frame_rows[spans.frames[k]]
        piece = wire.slice(int(spans.rows[k]), int(spans.counts[k])).column("data").to_pylist()
        found += [(int(spans.firsts[k]) + i, d) for i, d in enumerate(piece)]
    return found


def test_spans_name_exactly_the_wanted_rows(tmp_path: Path) -> None:
    ledger = Ledger(FileSystem(), str(tmp_path / "ledger"))
    try:
        data = _fill(ledger, 30)
        rng = random.Random(5)
        wanted = {}
        for partition, messages in data.items():
            low = rng.randint(0, len(messages))
            wanted[partition] = (low, rng.randint(low, len(messages)))
        spans = ledger.spans_many(wanted)
        assert spans is not None
        assert np.all(np.diff(spans.frames) >= 0)  # frame order
        for partition, (low, high) in wanted.items():
            assert _rows(spans, partition) == [(o, data[partition][o]) for o in range(low, high)]
        assert spans.home is not None  # one file holds them all
        assert spans.home_starts is not None
        for body, start in zip(spans.bodies, spans.home_starts.tolist(), strict=True):
            assert spans.home.slice(start, body.size).equals(body)
    finally:
        ledger.close()


def test_a_range_not_wholly_in_the_ledger_gives_none(tmp_path: Path) -> None:
    ledger = Ledger(FileSystem(), str(tmp_path / "ledger"))
    try:
        data = _fill(ledger, 10)
        partition = min(data)
        end = len(data[partition])
        assert ledger.spans_many({partition: (0, end + 1)}) is None  # past its end
        ledger.release(partition, 1)  # copied and released below 1
        assert ledger.spans_many({partition: (0, end)}) is None
        spans = ledger.spans_many({partition: (1, end)})
        assert spans is not None
        assert _rows(spans, partition) == [(o, data[partition][o]) for o in range(1, end)]
        empty = ledger.spans_many({partition: (end, end)})
        assert empty is not None and len(empty.partitions) == 0
    finally:
        ledger.close()


def test_bodies_in_two_files_name_no_home(tmp_path: Path) -> None:
    ledger = Ledger(FileSystem(), str(tmp_path / "ledger"), file_bytes_max=4096)
    try:
        data = _fill(ledger, 30)
        assert len(list((tmp_path / "ledger").glob("*.ledger"))) > 1
        wanted = {p: (0, len(messages)) for p, messages in data.items()}
        spans = ledger.spans_many(wanted)
        assert spans is not None and spans.home is None and spans.home_starts is None
        for partition, messages in data.items():
            assert [d for _, d in _rows(spans, partition)] == messages
    finally:
        ledger.close()
