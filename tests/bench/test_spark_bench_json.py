"""The Spark bench's write on JSON log lines (round 21): records beside the issue's target,
each against Spark's Parquet write of the same rows in the same rounds, with no target.
Spark is not started: the rounds run against stand-ins for the session, the writer's
statistics and the CPU clock."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from bench import spark_bench
from bench.results import Recorder
from bench.spark_bench import (
    JSON_BASELINE,
    JSON_WRITE,
    JSON_WRITE_RAW,
    WRITE_ROUNDS,
    record_json_writes,
)

COUNT = 1_000_000


def _recorder(tmp_path: Path) -> Recorder:
    return Recorder("full", json_path=str(tmp_path / "r.json"),
                    md_path=str(tmp_path / "R.md"), stream=io.StringIO())  # fmt: skip


def _measured() -> tuple[dict[str, list[float]], dict[str, list[str]], dict[str, list[float]]]:
    writes = {"parquet": [2.0, 4.0, 3.0], "wire": [1.0, 2.0, 4.0], "raw": [2.0, 8.0, 3.0]}
    used = {"wire": ["frameCodec auto: zstd 2 %, raw the rest"] * 3,
            "raw": ["frameCodec raw: raw"] * 3}  # fmt: skip
    cpu = {"parquet_jvm": [3.0, 2.0, 2.5], "wire_jvm": [2.6, 2.8, 2.7],
           "wire_server": [0.8, 0.7, 0.9], "raw_jvm": [2.4, 2.5, 2.6],
           "raw_server": [0.75, 0.7, 0.8]}  # fmt: skip
    return writes, used, cpu


def test_the_json_writes_are_two_records_beside_parquet_with_no_target(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path)
    record_json_writes(recorder, COUNT, *_measured())
    by_name = {r["name"]: r for r in recorder.records}
    assert list(by_name) == [JSON_WRITE, JSON_WRITE_RAW]
    assert "JSON log lines" in JSON_WRITE and "no target" in JSON_WRITE
    assert "JSON log lines" in JSON_WRITE_RAW and "frameCodec=raw" in JSON_WRITE_RAW
    for record in by_name.values():
        assert record["group"] == "spark" and record["unit"] == "msgs/s"
        assert record["target"] is None and record["target_ratio"] is None
        assert record["met"] is None
        assert record["baseline"] == JSON_BASELINE
        assert record["baseline_value"] == pytest.approx(COUNT / 3.0)  # Parquet's median, 3 s
        assert record["baseline_min"] == pytest.approx(COUNT / 4.0)
        assert record["baseline_max"] == pytest.approx(COUNT / 2.0)
        assert record["reps"] == 3
        assert record["note"].startswith("JSON log lines") and "no target" in record["note"]
    default, raw = by_name[JSON_WRITE], by_name[JSON_WRITE_RAW]
    assert default["value"] == COUNT / 2.0 and default["ratio"] == 1.5  # 3 s / 2 s
    assert (default["ratio_min"], default["ratio_max"]) == (0.75, 2.0)  # per round
    assert raw["value"] == pytest.approx(COUNT / 3.0) and raw["ratio"] == 1.0
    assert (raw["ratio_min"], raw["ratio_max"]) == (0.5, 1.0)
    assert "zstd 2 %" in default["note"] and "frameCodec raw: raw" in raw["note"]
    assert "Spark JVM 2.70, server 0.80, Parquet's JVM 2.50" in default["note"]
    assert "Spark JVM 2.50, server 0.75" in raw["note"]


def test_the_records_refuse_rounds_of_unequal_counts(tmp_path: Path) -> None:
    writes, used, cpu = _measured()
    writes["raw"].pop()
    with pytest.raises(AssertionError):
        record_json_writes(_recorder(tmp_path), COUNT, writes, used, cpu)


class _Writer:
    def __init__(self, log: list[str], topic: str) -> None:
        self.log, self.topic, self.codec = log, topic, "default"

    def option(self, key: str, value: str) -> _Writer:
        assert key == "frameCodec"
        self.codec = value
        return self

    def append(self) -> None:
        self.log.append(f"write {self.topic} {self.codec}")


class _Frame:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.write = self

    def mode(self, mode: str) -> _Frame:
        assert mode == "overwrite"
        return self

    def parquet(self, path: str) -> None:
        self.log.append(f"parquet {path}")

    def writeTo(self, table: str) -> _Writer:
        return _Writer(self.log, table)


class _Stats:
    @staticmethod
    def zstdMessagesSent() -> int:
        return 0

    @staticmethod
    def rawMessagesSent() -> int:
        return 0

    @staticmethod
    def lastFrameCodec() -> str:
        return "auto"

    @staticmethod
    def lastCommitSeconds() -> float:
        return 0.0


def test_the_json_rounds_alternate_into_fresh_topics_with_the_json_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[str] = []
    kinds: list[tuple[int, str]] = []

    def rows(spark: Any, count: int, kind: str = "bench") -> _Frame:
        kinds.append((count, kind))
        return _Frame(log)

    monkeypatch.setattr(spark_bench, "_rows", rows)
    monkeypatch.setattr(spark_bench, "_cpu_s", lambda pid: 0.0)
    recorder = _recorder(tmp_path)
    writes, used, cpu = spark_bench._write_rounds(
        recorder, object(), log.append, _Stats, 1, 2, COUNT, "json", "/p/json", "json_w", "JSON ")
    assert set(kinds) == {(COUNT, "json")}  # every write, Parquet's too, of the JSON rows
    expected: list[str] = []
    for round_ in range(1, WRITE_ROUNDS + 1):
        expected.append("parquet /p/json")
        order = [("wire", "default"), ("raw", "raw")]
        for kind, codec in order if round_ % 2 else order[::-1]:
            topic = f"json_w{round_}_{kind}"
            expected += [f"CREATE TOPIC {topic} WITH (min_active_partitions = 4)",
                         f"write topicbase.main.{topic} {codec}",
                         f"DROP TOPIC {topic}"]  # fmt: skip
    assert log == expected
    assert {len(v) for v in (*writes.values(), *used.values(), *cpu.values())} == {WRITE_ROUNDS}
    assert recorder.stream.getvalue().count("spark: JSON wire write") == 2 * WRITE_ROUNDS
