"""Retention for real, through the ``topicbase`` console: a 1 s retention period, real time.

One console run drives the whole story (an interpreter start is the costly part). The
script pauses with a long-polling peek of an empty topic (``wait = Interval('PT3S')``),
during which the console's own background retention service runs its passes: nothing
but the service deletes anything here.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.test_console import run

PAUSE = "SELECT count(*) AS n FROM TOPIC pause WITH (partition = 0, from_offset = 0, wait = {})"
PARTITIONS = "SELECT topic, start_offset, end_offset FROM sys.partitions ORDER BY topic"
LAGS = (
    "SELECT topic, consumer, committed_offset, lag_messages FROM sys.consumers "
    "ORDER BY topic, consumer"
)


def _blocks(stdout: str) -> list[list[dict]]:
    """The JSON rows of each statement that returned rows, in order. JSON output has no
    separator between two statements' rows: a tag line or a change of columns ends a
    block (the script never puts two reads with the same columns back to back)."""
    blocks: list[list[dict]] = []
    current: list[dict] | None = None
    for line in stdout.splitlines():
        if not line.startswith("{"):
            current = None
            continue
        row = json.loads(line)
        if current is None or current[0].keys() != row.keys():
            current = []
            blocks.append(current)
        current.append(row)
    return blocks


def _starts(rows: list[dict]) -> dict[str, tuple[int, int]]:
    return {r["topic"]: (r["start_offset"], r["end_offset"]) for r in rows}


def test_a_one_second_retention_empties_an_idle_topic_but_not_before_an_important_commit(
    tmp_path: Path,
) -> None:
    read = "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC {} WITH (consumer = '{}')"
    result = run(
        tmp_path / "data", "--format", "json",
        "-c", "CREATE TOPIC idle (CONSUMER casual) WITH (retention_period = Interval('PT1S'))",
        "-c", "CREATE TOPIC kept (CONSUMER keeper WITH (important = true)) "
              "WITH (retention_period = Interval('PT1S'))",
        "-c", "CREATE TOPIC pause",
        "-c", "INSERT INTO TOPIC idle (data) VALUES ('a'), ('b'); "
              "INSERT INTO TOPIC kept (data) VALUES ('a'), ('b')",
        "-c", PARTITIONS,  # right after the writes: nothing expired yet
        "-c", PAUSE.format("Interval('PT3S')"),
        "-c", PARTITIONS,
        "-c", LAGS,
        "-c", read.format("kept", "keeper"),
        "-c", "INSERT INTO TOPIC idle (data) VALUES ('c')",
        "-c", read.format("idle", "casual"),
        "-c", PAUSE.format("Interval('PT3S')"),
        "-c", PARTITIONS,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (
        early, _, expired, lags, kept_read, idle_read, _, committed
    ) = _blocks(result.stdout)  # fmt: skip
    assert _starts(early) == {"idle": (0, 2), "kept": (0, 2), "pause": (0, 0)}
    # Three seconds later the idle topic is empty; the important consumer's is whole.
    assert _starts(expired) == {"idle": (2, 2), "kept": (0, 2), "pause": (0, 0)}
    assert lags == [
        {"topic": "idle", "consumer": "casual", "committed_offset": None, "lag_messages": 0},
        {"topic": "kept", "consumer": "keeper", "committed_offset": None, "lag_messages": 2},
    ]
    assert [r["d"] for r in kept_read] == ["a", "b"]
    # casual had committed nothing, below the log start 2: it reads on from there.
    assert [r["d"] for r in idle_read] == ["c"]
    # keeper committed: its topic empties too; 'c' expired meanwhile as well.
    assert _starts(committed) == {"idle": (3, 3), "kept": (2, 2), "pause": (0, 0)}
