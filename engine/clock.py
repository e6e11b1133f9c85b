"""Injected time for the engine: the storage clock, shared so tests can fake both."""

from __future__ import annotations

from datetime import UTC, datetime

from storage.clock import SYSTEM_CLOCK, Clock, ManualClock, SystemClock

__all__ = ["SYSTEM_CLOCK", "Clock", "ManualClock", "SystemClock", "utc_from_us"]


def utc_from_us(microseconds: int) -> datetime:
    return datetime.fromtimestamp(microseconds / 1_000_000, tz=UTC)
