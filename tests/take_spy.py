"""Counts pyarrow's ``take`` calls and the chunks each is made over.

A ``take`` over a table of many chunks joins all of them first (a copy of the whole table
per call, pyarrow 26); tests of code that must not do that spy on ``pyarrow.compute.take``,
through which ``Table.take`` and ``RecordBatch.take`` go."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest


def spy_takes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on (until ``monkeypatch`` undoes it), each ``take`` appends to the list
    returned the number of chunks it was made over: a table's chunks, 1 otherwise."""
    chunks: list[int] = []
    take = pc.take

    def counting(data: Any, *args: Any, **kwargs: Any) -> Any:
        chunks.append(data.column(0).num_chunks if isinstance(data, pa.Table) else 1)
        return take(data, *args, **kwargs)

    monkeypatch.setattr(pc, "take", counting)
    return chunks
