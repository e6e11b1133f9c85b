"""Autopartitioning: the key hash space, a topic's scaling rules, and write speed.

Hash space: every key (a producer id, else a message group id) maps to an
integer in ``[0, 2**64)``: the first 8 bytes, big-endian, of the BLAKE2b
digest (``digest_size=8``) of the key's UTF-8 bytes. Stable across processes,
platforms and Python versions (unlike ``hash``). On a topic with
autopartitioning each active partition owns a half-open range ``[low, high)``
of that space; the active ranges never overlap and together cover it all, and a
key is written to the active partition whose range holds its hash. A split
cuts a range at its middle, ``(low + high) // 2``: the lower child owns
``[low, middle)``, the upper ``[middle, high)``.

Scaling rule (``AutoPartitioning``): a partition splits when, in every one of
the last ``ceil(window)`` whole seconds, it was written at least
``up_percent``% of its write speed (its meter running in all of them), the strategy is
``scale_up`` (or ``scale_up_and_down``, which acts like it: merging is not
built), and the topic has fewer than ``max_active`` active partitions.

Write speed (``WriteSpeed``): a token bucket per partition, refilled at the
write speed up to the burst (0: one second's worth). A write takes its bytes'
tokens, going into debt if need be, and waits until the debt is paid: it is
delayed, never dropped. Thread-safe.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import deque
from dataclasses import dataclass

from storage.errors import InsufficientResourcesError, InvalidParameterValueError
from storage.limits import THROTTLE_DELAY_S_MAX as THROTTLE_DELAY_S_MAX  # storage.topic_log's

HASH_BITS = 64
HASH_SPACE = 1 << HASH_BITS
# YDB's default partition write speed (``ydb topic create --partition-write-speed-kbps``
# defaults to 1024 KB/s): what a speed of 0 means.
WRITE_SPEED_DEFAULT = 1024 * 1024
# The YQL default of partition_write_speed_bytes_per_second: a topic at this speed with
# autopartitioning disabled is not throttled (Topicbase's choice, docs/autopartitioning.md).
UNTHROTTLED_DEFAULT_SPEED = 2 * 1024 * 1024
STRATEGIES = ("disabled", "scale_up", "scale_up_and_down", "paused")
SECOND_US = 1_000_000


class WriteThrottledError(InsufficientResourcesError):
    """A write would wait longer than allowed for its partition's write speed."""


def key_hash(key: str) -> int:
    """The key's place in the hash space (see the module docstring)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass(frozen=True, slots=True)
class KeyRange:
    """A half-open range ``[low, high)`` of the hash space."""

    low: int
    high: int

    def __post_init__(self) -> None:
        assert 0 <= self.low < self.high <= HASH_SPACE, (self.low, self.high)

    def contains(self, value: int) -> bool:
        return self.low <= value < self.high

    @property
    def middle(self) -> int:
        return (self.low + self.high) // 2

    def halves(self) -> tuple[KeyRange, KeyRange]:
        assert self.high - self.low >= 2, "a range of one hash cannot split"
        return KeyRange(self.low, self.middle), KeyRange(self.middle, self.high)

    def to_json(self) -> list[int]:
        return [self.low, self.high]

    @staticmethod
    def from_json(value: list[int] | None) -> KeyRange | None:
        return None if value is None else KeyRange(int(value[0]), int(value[1]))

    def __str__(self) -> str:
        return (
            f"[{self.low:016x}, {self.high:x})"
            if self.high < HASH_SPACE
            else (f"[{self.low:016x}, max]")
        )


def even_ranges(count: int) -> list[KeyRange]:
    """``count`` ranges of (nearly) equal width covering the hash space, in order."""
    assert count >= 1
    bounds = [HASH_SPACE * i // count for i in range(count + 1)]
    return [KeyRange(bounds[i], bounds[i + 1]) for i in range(count)]


@dataclass(frozen=True, slots=True)
class AutoPartitioning:
    """A topic's autopartitioning and write-speed settings, as storage acts on them.

    ``max_active`` 0 means no limit but the storage limit on partitions.
    ``write_speed`` 0 means ``WRITE_SPEED_DEFAULT``; ``burst`` 0 means one second.
    """

    strategy: str = "disabled"
    up_percent: int = 80
    down_percent: int = 30
    window_us: int = 300 * SECOND_US
    max_active: int = 0
    write_speed: int = UNTHROTTLED_DEFAULT_SPEED
    burst: int = 0

    def validate(self) -> AutoPartitioning:
        if self.strategy not in STRATEGIES:
            raise InvalidParameterValueError(
                f"unknown auto-partitioning strategy {self.strategy!r}"
            )
        if not (0 < self.up_percent <= 100 and 0 < self.down_percent <= 100):
            raise InvalidParameterValueError("utilization percents lie in 1..100")
        if self.window_us < SECOND_US:
            raise InvalidParameterValueError("the stabilization window is at least 1 second")
        if self.max_active < 0 or self.write_speed < 0 or self.burst < 0:
            raise InvalidParameterValueError("partition limits and speeds cannot be negative")
        return self

    @property
    def ranged(self) -> bool:
        """True once autopartitioning is on: writes are routed by key range."""
        return self.strategy != "disabled"

    @property
    def splits(self) -> bool:
        """True while partitions split (``paused`` and ``disabled`` do not)."""
        return self.strategy in ("scale_up", "scale_up_and_down")

    @property
    def speed(self) -> int:
        return self.write_speed or WRITE_SPEED_DEFAULT

    @property
    def throttled(self) -> bool:
        """Writes are held to the speed on ranged topics and where a speed was chosen."""
        return self.ranged or self.write_speed not in (0, UNTHROTTLED_DEFAULT_SPEED)

    @property
    def window_seconds(self) -> int:
        return math.ceil(self.window_us / SECOND_US)

    def to_json(self) -> dict[str, object]:
        return {
            "strategy": self.strategy,
            "up_percent": self.up_percent,
            "down_percent": self.down_percent,
            "window_us": self.window_us,
            "max_active": self.max_active,
            "write_speed": self.write_speed,
            "burst": self.burst,
        }

    @staticmethod
    def from_json(payload: dict[str, object] | None) -> AutoPartitioning:
        if payload is None:
            return AutoPartitioning()
        return AutoPartitioning(**payload).validate()  # type: ignore[arg-type]


class WriteSpeed:
    """One partition's token bucket and write meter (see the module docstring).

    The meter keeps the bytes written per whole second (``now_us // 10**6``) for
    the last ``SECONDS_KEPT`` seconds; ``throttled_us`` sums the delays handed out.
    Invariant: ``_tokens <= capacity``; negative tokens are debt that the writes
    already admitted wait for.
    """

    SECONDS_KEPT = 3600

    def __init__(self, speed: int, burst: int, now_us: int) -> None:
        assert speed > 0
        self._lock = threading.Lock()
        self.speed = speed
        self.capacity = burst or speed
        self._tokens = float(self.capacity)
        self._refilled_us = now_us
        self.started_us = now_us
        self._seconds: deque[list[int]] = deque()  # [second, bytes], oldest first
        self.throttled_us = 0
        self.written_bytes = 0
        # The last ``above_for`` answer: ((current second, threshold, seconds), verdict).
        self._verdict: tuple[tuple[int, float, int] | None, bool] = (None, False)

    def configure(self, speed: int, burst: int) -> None:
        with self._lock:
            self.speed, self.capacity = speed, burst or speed
            self._tokens = min(self._tokens, float(self.capacity))

    def reserve(self, size_bytes: int, now_us: int, max_delay_s: float) -> float:
        """Take ``size_bytes`` of tokens; the delay (seconds) the write must wait.

        A delay above ``max_delay_s`` takes nothing and raises 53000.
        """
        assert size_bytes >= 0
        with self._lock:
            elapsed_us = max(0, now_us - self._refilled_us)
            tokens = min(self.capacity, self._tokens + elapsed_us * self.speed / SECOND_US)
            self._refilled_us = max(self._refilled_us, now_us)
            left = tokens - size_bytes
            delay_s = 0.0 if left >= 0 else -left / self.speed
            if delay_s > max_delay_s:
                self._tokens = tokens
                raise WriteThrottledError(
                    f"writing {size_bytes} bytes would wait {delay_s:.1f} s for the "
                    f"partition's write speed ({self.speed} bytes/s), longer than "
                    f"{max_delay_s:g} s; write less at a time or raise "
                    "partition_write_speed_bytes_per_second"
                )
            self._tokens = left
            self.throttled_us += round(delay_s * SECOND_US)
            return delay_s

    def refund(self, size_bytes: int, delay_s: float) -> None:
        """Give back a reservation whose write did not happen (cancelled while waiting)."""
        with self._lock:
            self._tokens = min(float(self.capacity), self._tokens + size_bytes)
            self.throttled_us = max(0, self.throttled_us - round(delay_s * SECOND_US))

    def record(self, size_bytes: int, now_us: int) -> None:
        """Count bytes written at ``now_us`` in the meter."""
        second = now_us // SECOND_US
        with self._lock:
            self.written_bytes += size_bytes
            if self._seconds and self._seconds[-1][0] == second:
                self._seconds[-1][1] += size_bytes
            elif not self._seconds or self._seconds[-1][0] < second:
                self._seconds.append([second, size_bytes])
                while len(self._seconds) > self.SECONDS_KEPT:
                    self._seconds.popleft()
            else:  # a clock that stepped back: count it in the newest second
                self._seconds[-1][1] += size_bytes

    def bytes_in_second(self, second: int) -> int:
        with self._lock:
            for start, size in reversed(self._seconds):
                if start == second:
                    return size
                if start < second:
                    break
        return 0

    def speed_now(self, now_us: int) -> int:
        """Bytes written in the last whole second before ``now_us``."""
        return self.bytes_in_second(now_us // SECOND_US - 1)

    def above_for(self, threshold_bytes: float, seconds: int, now_us: int) -> bool:
        """True if each of the ``seconds`` whole seconds before ``now_us`` saw at least
        ``threshold_bytes`` written, and the meter ran in all of them (it may have started
        inside the first: what it did not see only makes that second look slower)."""
        assert seconds >= 1
        current = now_us // SECOND_US
        question = (current, threshold_bytes, seconds)
        if self._verdict[0] == question:  # whole seconds before ``current`` no longer change
            return self._verdict[1]
        first = current - seconds
        verdict = self.started_us < (first + 1) * SECOND_US
        if verdict:
            with self._lock:
                sizes = {}
                for start, size in reversed(self._seconds):
                    if start < first:
                        break
                    sizes[start] = size
            verdict = all(sizes.get(s, 0) >= threshold_bytes for s in range(first, current))
        self._verdict = (question, verdict)
        return verdict
