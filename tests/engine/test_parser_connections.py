"""Each thread classifies statements on a parser connection of its own; a thread that
ended does not keep its connection (and DuckDB's native threads behind it) for the life
of the process: a server gives every client a thread, so they would pile up."""

from __future__ import annotations

import threading

from engine import tables


def test_parser_connections_of_ended_threads_are_closed() -> None:
    def classify() -> None:
        assert tables.statement_types("SELECT 1") == [("SELECT", "SELECT 1")]

    for _ in range(20):
        thread = threading.Thread(target=classify)
        thread.start()
        thread.join()
    # Each new thread's parser closed the ended threads' before it: only the last is left.
    ended = [t for t, _ in tables._parser_connections if not t.is_alive()]
    assert len(ended) <= 1, len(ended)
