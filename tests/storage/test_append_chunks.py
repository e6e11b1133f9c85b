"""A statement's shares are appended concurrently in runs, a few per thread
(``storage.topic_log._append_in_parallel``; issue 14, Scale): each share's outcome
(its result or its error) comes back in the shares' order, whatever the runs."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from storage import topic_log


class _FakeLog:
    def __init__(self, index: int, fails: bool) -> None:
        self.index, self.fails = index, fails

    def append(self, piece: Any) -> Any:
        if self.fails:
            raise ValueError(f"share {self.index}")
        return (self.index, piece, threading.current_thread().name)


@pytest.mark.parametrize("count", [1, 5, 63, 64, 65, 200, 1001])
def test_outcomes_come_back_in_order(count: int) -> None:
    appends = [(_FakeLog(i, fails=i % 7 == 3), f"piece{i}") for i in range(count)]
    outcomes = topic_log._append_in_parallel(appends)  # type: ignore[arg-type]
    assert len(outcomes) == count
    for index, outcome in enumerate(outcomes):
        if index % 7 == 3:
            assert isinstance(outcome, ValueError) and str(outcome) == f"share {index}"
        else:
            assert outcome[:2] == (index, f"piece{index}")
            assert outcome[2].startswith("topic-append")  # on the pool, not the caller
