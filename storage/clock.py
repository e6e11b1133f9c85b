"""Injected time for storage: wall-clock microseconds and a monotonic clock.

Storage never calls ``time`` directly; it asks a ``Clock``. Tests pass a
``ManualClock`` to expire producers or age segments without sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_us(self) -> int:
        """Wall-clock time in microseconds since the Unix epoch (UTC)."""
        ...

    def monotonic_s(self) -> float:
        """A monotonic clock in seconds, for timeouts."""
        ...


class SystemClock:
    def now_us(self) -> int:
        return time.time_ns() // 1000

    def monotonic_s(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to. Thread-safe."""

    def __init__(self, now_us: int = 1_700_000_000_000_000) -> None:
        self._now_us = now_us
        self._lock = threading.Lock()

    def now_us(self) -> int:
        with self._lock:
            return self._now_us

    def monotonic_s(self) -> float:
        return time.monotonic()

    def advance(self, *, seconds: float = 0.0, microseconds: int = 0) -> None:
        assert seconds >= 0 and microseconds >= 0, "time never runs backwards"
        with self._lock:
            self._now_us += int(seconds * 1_000_000) + microseconds


SYSTEM_CLOCK = SystemClock()
