"""Storage settings of a topic: durability, segment sizes, codecs, retention.

These are the knobs storage itself acts on. The SQL layer keeps the full set
of YDB settings and hands storage this subset; storage never sees SQL.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field

from storage import limits
from storage.codecs import Codec
from storage.errors import InvalidParameterValueError

LEDGER_ENVIRONMENT_VARIABLE = "TOPICBASE_LEDGER"
# The test lane's override of ``limits.LEDGER_SHARES_MIN`` (``pytest --ledger``,
# tests/conftest.py): the suite's topics have a few partitions, so with the default (16)
# their statements would not reach the ledger. Read when a topic's ledger opens.
LEDGER_SHARES_MIN_ENVIRONMENT_VARIABLE = "TOPICBASE_LEDGER_SHARES_MIN"


def ledger_enabled() -> bool:
    """The store's ledger switch from the environment: on unless ``TOPICBASE_LEDGER=0``
    (on by default since round 31): small statements spread over many partitions go to
    the topic's ledger (``storage.ledger_route``, docs/scale.md rounds 28-31)."""
    return os.environ.get(LEDGER_ENVIRONMENT_VARIABLE, "1") != "0"


def ledger_shares_min() -> int:
    """How many partitions a statement must spread over to go to the ledger:
    ``limits.LEDGER_SHARES_MIN`` unless ``TOPICBASE_LEDGER_SHARES_MIN`` (a whole number,
    at least 2: one share is a plain append) says otherwise (the test lane's knob,
    docs/scale.md round 31)."""
    text = os.environ.get(LEDGER_SHARES_MIN_ENVIRONMENT_VARIABLE)
    if text is None or not text.strip():
        return limits.LEDGER_SHARES_MIN
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 2:
        raise InvalidParameterValueError(
            f"{LEDGER_SHARES_MIN_ENVIRONMENT_VARIABLE} must be a whole number of at least "
            f"2, got {text!r}"
        )
    return value


class FsyncPolicy(enum.Enum):
    ALWAYS = "always"  # every append is synced before it is acknowledged
    GROUP = "group"  # concurrent appends share one sync (group commit); the default
    NEVER = "never"  # the page cache only: survives a process kill, not a power cut

    @classmethod
    def parse(cls, text: str) -> FsyncPolicy:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise InvalidParameterValueError(
                f"unknown fsync policy {text!r}; use always, group or never"
            ) from None


@dataclass(frozen=True, slots=True)
class TopicConfig:
    partition_count: int = 1
    supported_codecs: frozenset[Codec] = field(
        default_factory=lambda: frozenset({Codec.RAW, Codec.GZIP, Codec.ZSTD, Codec.LZOP})
    )
    fsync_policy: FsyncPolicy = FsyncPolicy.GROUP
    segment_bytes: int = limits.SEGMENT_BYTES_DEFAULT
    segment_ms: int = limits.SEGMENT_MS_DEFAULT
    retention_ms: int | None = 18 * 3600 * 1000  # YDB's default retention_period, PT18H
    retention_bytes: int | None = None
    producer_expiry_ms: int = limits.PRODUCER_EXPIRY_MS_DEFAULT
    group_commit_window_us: int = limits.GROUP_COMMIT_WINDOW_US_DEFAULT

    def validate(self) -> TopicConfig:
        if not 1 <= self.partition_count <= limits.PARTITIONS_PER_TOPIC_MAX:
            raise InvalidParameterValueError(
                f"partition count must be between 1 and {limits.PARTITIONS_PER_TOPIC_MAX}"
            )
        if self.segment_bytes < limits.SEGMENT_BYTES_MIN:
            raise InvalidParameterValueError(
                f"segment_bytes must be at least {limits.SEGMENT_BYTES_MIN}"
            )
        if self.segment_bytes > limits.SEGMENT_BYTES_MAX:
            raise InvalidParameterValueError(
                f"segment_bytes must be at most {limits.SEGMENT_BYTES_MAX} (2 GiB), "
                f"got {self.segment_bytes}"
            )
        if self.segment_ms <= 0 or self.producer_expiry_ms <= 0:
            raise InvalidParameterValueError("segment_ms and producer_expiry_ms must be positive")
        if self.retention_ms is not None and self.retention_ms <= 0:
            raise InvalidParameterValueError("retention_ms must be positive")
        if self.retention_bytes is not None and self.retention_bytes <= 0:
            raise InvalidParameterValueError("retention_bytes must be positive")
        if not self.supported_codecs:
            raise InvalidParameterValueError("a topic must accept at least one codec")
        return self
