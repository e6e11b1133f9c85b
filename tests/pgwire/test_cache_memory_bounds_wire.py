"""R2-N1 through the wire: distinct wide ``SELECT 1,1,...`` texts sent by psycopg, by the
simple and the extended protocol, leave at most the lowered process-wide cache cap and a
fixed slack behind in the server's process (here the test's own).
tests/engine/test_cache_memory_bounds.py has the engine's tests and the measure."""

from __future__ import annotations

import pytest

from tests.engine.test_cache_memory_bounds import (
    _LIBC,
    CAP_BYTES,
    SLACK_BYTES,
    held_after,
    small_cap,  # noqa: F401 - the fixture
)


@pytest.mark.skipif(_LIBC is None, reason="needs Linux's /proc and glibc")
def test_distinct_wide_texts_over_the_wire_hold_no_more_than_the_cap(
    connect, small_cap: None  # noqa: F811
) -> None:
    connection = connect(autocommit=True)

    def run(number: int) -> None:
        text = (f"SELECT {number}," + ",".join(["1"] * 2040))[:4090]
        # unnamed Parse/Bind/Execute (a parameter; psycopg names a statement, kept by the
        # connection and bounded by limits.PREPARED_*, only on a text's 5th run), then a
        # simple Query
        assert len(connection.execute(text + ",%s", [number]).fetchone()) > 2000
        assert len(connection.execute(text).fetchone()) > 2000

    traced, resident = held_after(run, 30)
    print(f"held: traced {traced >> 20} MiB, resident {resident >> 20} MiB")
    # measured: 3 MiB traced and 33 MiB resident here, 19 and 94 MiB without the bounds;
    # the client (psycopg, in this process) and the connection hold their own share
    assert traced <= CAP_BYTES + 4 * 1024 * 1024, traced
    assert resident <= CAP_BYTES + 2 * SLACK_BYTES, resident
