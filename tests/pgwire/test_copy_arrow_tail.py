"""The end of a ``COPY ... (FORMAT arrow)`` (``connection.copy_arrow``): the statement's
effects commit after the data went out and before the end marker, and the end marker is
kept with CopyDone and CommandComplete (one write with ReadyForQuery, one wake-up of the
client) instead of going out in a write of its own."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from sql.pgwire.codec import copy_arrow as codec
from sql.pgwire.codec import messages as m
from sql.pgwire.connection import copy_arrow


class _Source:
    """One batch, then the end; records when it is committed and closed."""

    def __init__(self, events: list[tuple[str, Any]]) -> None:
        self.events = events
        self.schema = pa.schema([("data", pa.binary())])
        self.notices: tuple[str, ...] = ()
        self.row_count = 3
        self.left = 1

    def next_batch(self) -> pa.RecordBatch | None:
        if not self.left:
            return None
        self.left -= 1
        return pa.record_batch([pa.array([b"a", b"b", b"c"])], schema=self.schema)

    def close(self) -> None:
        self.events.append(("close", None))


def test_the_end_marker_is_kept_with_copy_done_after_the_commit(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    events: list[tuple[str, Any]] = []
    source = _Source(events)

    def opened(context: Any, statement: Any, packed: bool) -> tuple[Any, list[Any], bool]:
        schema = codec.plain_schema(source.schema)
        first = source.next_batch()
        assert first is not None
        return source, codec.schema_messages(schema) + codec.batch_messages(first, schema), False

    monkeypatch.setattr(copy_arrow, "_open", opened)
    monkeypatch.setattr(copy_arrow, "_commit", lambda _: events.append(("commit", None)))

    async def call(function: Any, *arguments: Any) -> Any:
        return function(*arguments)

    async def send_views(views: Any) -> None:
        events.append(("send_views", b"".join(bytes(v) for v in views)))

    context = SimpleNamespace(call=call, send=lambda data: events.append(("send", bytes(data))),
                              send_views=send_views)  # fmt: skip
    asyncio.run(copy_arrow.copy_arrow_to_client(context, None))  # type: ignore[arg-type]

    kinds = [kind for kind, _ in events]
    commit = kinds.index("commit")
    assert "send_views" in kinds[:commit], "the data went out before the commit"
    assert "send_views" not in kinds[commit:], "nothing is written on its own after the commit"
    sent_after = [data for kind, data in events[commit:] if kind == "send"]
    end_marker = b"".join(bytes(piece) for piece in codec.end_messages())
    assert sent_after[0] == end_marker
    assert sent_after[1:] == [m.copy_done(), m.command_complete("COPY 3")]
    data = b"".join(d for kind, d in events if kind in ("send_views", "send"))
    assert data.index(end_marker) > data.index(b"abc")  # the marker ends the stream
