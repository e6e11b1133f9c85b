"""A statement's outcome (``Result``): a value type with no behaviour of the engine's.

It lives in a leaf module so that what runs statements through a session (``engine.bulk``)
and what the session returns share it without importing ``engine.session``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa


@dataclass
class Result:
    """One statement's outcome: a command tag and, for row-returning statements, a table."""

    tag: str
    table: pa.Table | None = None
    notices: tuple[str, ...] = field(default=())

    @property
    def columns(self) -> list[str]:
        return [] if self.table is None else self.table.column_names

    @property
    def rowcount(self) -> int:
        if self.table is not None:
            return self.table.num_rows
        last = self.tag.rsplit(" ", 1)[-1]
        return int(last) if last.isdigit() else -1
