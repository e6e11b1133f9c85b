"""The Spark bench's write records name the codec their tasks used (round 18: the headline
write is the writer's default, ``frameCodec=auto``, whose codec depends on the topic and
the data)."""

from __future__ import annotations

from bench.spark_bench import describe_codec


def test_the_label_names_the_policy_and_what_the_tasks_sent() -> None:
    assert describe_codec("auto", 200_000, 0) == "frameCodec auto: zstd"
    assert describe_codec("raw", 0, 200_000) == "frameCodec raw: raw"
    assert describe_codec("auto", 2_000, 198_000) == "frameCodec auto: zstd 1 %, raw the rest"
    assert describe_codec("", 0, 0) == "frameCodec ?: no frames"


def test_the_label_names_frames_whose_data_column_was_compressed_whole() -> None:
    """Round 22: raw messages in column-compressed frames are named apart from raw ones."""
    assert describe_codec("column-auto", 0, 200_000, 200_000) == (
        "frameCodec column-auto: column zstd")
    assert describe_codec("column-auto", 0, 200_000, 4_096) == (
        "frameCodec column-auto: column zstd 2 %, the rest uncompressed")
    assert describe_codec("column-auto", 0, 200_000, 0) == "frameCodec column-auto: raw"
