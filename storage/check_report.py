"""What ``topicbase check`` finds: problem kinds, one ``Problem``, the ``CheckReport``.

Kinds are plain strings so the engine's check (``engine.check``) can add its own.
A report keeps at most ``storage.limits.CHECK_PROBLEMS_MAX`` problems and counts the ones it drops.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from storage.limits import CHECK_PROBLEMS_MAX

# Problem kinds (strings, so the engine's check can add its own).
IN_USE = "in_use"
MISSING = "missing"
BAD_METADATA = "bad_metadata"
UNREADABLE = "unreadable"
LEFTOVER = "leftover"
UNKNOWN_FILE = "unknown_file"
BROKEN_FRAME = "broken_frame"
CORRUPT_FRAME = "corrupt_frame"
TORN_TAIL = "torn_tail"
OFFSET_GAP = "offset_gap"
TIME_BACKWARDS = "time_backwards"
BAD_INDEX = "bad_index"
BAD_SNAPSHOT = "bad_snapshot"


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding: what, in which file, where (byte position), and whether it was fixed."""

    kind: str
    path: str
    message: str
    position: int | None = None
    repairable: bool = False
    repaired: bool = False
    # A state a crash leaves that opening the store undoes by itself, losing nothing (a
    # segment's index not written yet: the open rebuilds it from the frames). Not damage:
    # the report stays ok; repair undoes it too.
    recovered_at_open: bool = False

    @property
    def status(self) -> str:
        if self.repaired:
            return "repaired"
        if self.recovered_at_open:
            return "recovered at open"
        return "repairable" if self.repairable else "error"

    def line(self) -> str:
        where = self.path if self.position is None else f"{self.path} at byte {self.position}"
        return f"{self.status}: {self.kind}: {where}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "kind": self.kind,
            "path": self.path,
            "position": self.position,
            "message": self.message,
        }


@dataclass(slots=True)
class CheckReport:
    """Everything a check found, plus what it saw (for the engine's cross-checks)."""

    root: str
    repair: bool = False
    ran: bool = True  # False when nothing could be checked (in use, no store)
    # Set by a live check (another process owns the directory): why the lock was refused.
    live: str | None = None
    problems: list[Problem] = field(default_factory=list)
    problems_dropped: int = 0
    topics: int = 0
    partitions: int = 0
    segments: int = 0
    frames: int = 0
    staging_files: int = 0
    # As the metadata lists them; ``topic_ids`` is None when store.json is unreadable.
    topic_ids: list[str] | None = None
    partition_ids: dict[str, list[int]] = field(default_factory=dict)
    # (topic id, partition) -> ids of the transactions whose frames the partition holds.
    published: dict[tuple[str, int], set[int]] = field(default_factory=dict)

    def add(self, problem: Problem) -> None:
        if len(self.problems) >= CHECK_PROBLEMS_MAX:
            self.problems_dropped += 1
            return
        self.problems.append(problem)

    @property
    def remaining(self) -> list[Problem]:
        """The problems neither repaired nor undone by the next open (``ok`` without them)."""
        return [p for p in self.problems if not p.repaired and not p.recovered_at_open]

    @property
    def ok(self) -> bool:
        return self.ran and not self.remaining and not self.problems_dropped

    def summary(self) -> str:
        checked = ", ".join(
            _count(number, noun)
            for number, noun in (
                (self.topics, "topic"),
                (self.partitions, "partition"),
                (self.segments, "segment"),
                (self.frames, "frame"),
                (self.staging_files, "staging file"),
            )
        )
        if not self.ran:
            return f"check not run on {self.root}"
        total = len(self.problems) + self.problems_dropped
        if self.live is not None:
            checked += f" (live, read-only: {self.live})"
        if total == 0:
            return f"ok: no problems in {checked}"
        repaired = sum(1 for p in self.problems if p.repaired)
        at_open = sum(1 for p in self.problems if p.recovered_at_open and not p.repaired)
        remaining = total - repaired - at_open
        repairable = sum(1 for p in self.remaining if p.repairable)
        verdict = "ok" if self.ok else "damaged"
        text = f"{verdict}: {_count(total, 'problem')} ({repaired} repaired, "
        if at_open:
            text += f"{at_open} recovered by the next open, "
        text += f"{remaining} remaining"
        if repairable:
            text += f", {repairable} of them repairable"
        return f"{text}) in {checked}"

    def lines(self) -> list[str]:
        lines = [problem.line() for problem in self.problems]
        if self.problems_dropped:
            lines.append(f"... and {self.problems_dropped} more problems not listed")
        return [*lines, self.summary()]

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "ok": self.ok,
            "live": self.live,
            "problems": [problem.to_json() for problem in self.problems],
            "problems_not_listed": self.problems_dropped,
            "checked": {
                "topics": self.topics,
                "partitions": self.partitions,
                "segments": self.segments,
                "frames": self.frames,
                "staging_files": self.staging_files,
            },
            "summary": self.summary(),
        }


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"
