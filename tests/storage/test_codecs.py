"""Tests of storage/codecs.py and of the codec check on the write path."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import codecs
from storage.codecs import Codec, decode, decode_column, encode, parse_codec, parse_codec_list
from storage.errors import InvalidBinaryDataError, UnsupportedCodecError
from storage.partition_log import PartitionLog
from storage.record_batch import build_wire_batch

AVAILABLE = [Codec.RAW, Codec.GZIP, Codec.ZSTD]


@settings(max_examples=30, deadline=None)
@given(codec=st.sampled_from(AVAILABLE), data=st.binary(max_size=2000))
def test_encode_then_decode_returns_the_message(codec: Codec, data: bytes) -> None:
    assert decode(codec, encode(codec, data)) == data


def test_compressing_codecs_shrink_repetitive_data() -> None:
    data = b"abc" * 1000
    assert len(encode(Codec.GZIP, data)) < len(data) // 10
    assert len(encode(Codec.ZSTD, data)) < len(data) // 10
    assert encode(Codec.RAW, data) is data


def test_gzip_output_is_deterministic() -> None:
    assert encode(Codec.GZIP, b"same") == encode(Codec.GZIP, b"same")


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.ZSTD])
def test_broken_body_raises_22p03_naming_the_codec(codec: Codec) -> None:
    with pytest.raises(InvalidBinaryDataError) as raised:
        decode(codec, b"definitely not compressed")
    assert raised.value.sqlstate == "22P03"
    assert codec.label in str(raised.value)


def test_decode_column_on_raw_leaves_the_column_untouched() -> None:
    data = pa.array([b"a", b"b"], pa.binary())
    codec_column = pa.array([Codec.RAW, Codec.RAW], pa.uint8())
    assert decode_column(codec_column, data) is data


def test_decode_column_on_empty_column_returns_it() -> None:
    data = pa.array([], pa.binary())
    assert decode_column(pa.array([], pa.uint8()), data) is data


def test_decode_column_decodes_mixed_codecs() -> None:
    plain = [b"one", b"two" * 50, b"three"]
    used = [Codec.RAW, Codec.GZIP, Codec.ZSTD]
    data = pa.array([encode(c, p) for c, p in zip(used, plain, strict=True)], pa.binary())
    decoded = decode_column(pa.array(used, pa.uint8()), data)
    assert decoded.to_pylist() == plain
    assert decoded.type == pa.binary()


def test_parse_codec_is_case_insensitive_and_refuses_unknown_names() -> None:
    assert parse_codec(" ZStd ") is Codec.ZSTD
    assert parse_codec_list("raw, gzip") == frozenset({Codec.RAW, Codec.GZIP})
    with pytest.raises(UnsupportedCodecError) as raised:
        parse_codec("snappy")
    assert raised.value.sqlstate == "22023"
    assert "raw, gzip, lzop, zstd" in str(raised.value)
    with pytest.raises(UnsupportedCodecError):
        parse_codec_list(" , ")


def test_codec_ids_follow_ydb() -> None:
    assert [(c.label, c.value) for c in Codec] == [
        ("raw", 1),
        ("gzip", 2),
        ("lzop", 3),
        ("zstd", 4),
    ]


def test_lzop_without_python_lzo_is_refused_with_a_clear_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(codecs, "LZOP_AVAILABLE", False)
    for call in (lambda: encode(Codec.LZOP, b"x"), lambda: decode(Codec.LZOP, b"x")):
        with pytest.raises(UnsupportedCodecError) as raised:
            call()
        assert raised.value.sqlstate == "22023"
        assert "lzop" in str(raised.value) and "python-lzo" in str(raised.value)
    with pytest.raises(UnsupportedCodecError):
        decode_column(pa.array([Codec.LZOP], pa.uint8()), pa.array([b"x"], pa.binary()))


@pytest.mark.skipif(not codecs.LZOP_AVAILABLE, reason="python-lzo is not installed here")
def test_lzop_round_trip_where_installed() -> None:  # pragma: no cover - machine dependent
    assert decode(Codec.LZOP, encode(Codec.LZOP, b"lzo" * 100)) == b"lzo" * 100


# -- the write path's codec check -------------------------------------------------------------


def test_topic_refuses_a_codec_it_does_not_support(
    open_partition: Callable[..., PartitionLog],
) -> None:
    partition = open_partition(supported_codecs=frozenset({Codec.RAW}))
    batch = build_wire_batch([b"a", encode(Codec.ZSTD, b"b")], codec=[Codec.RAW, Codec.ZSTD])
    with pytest.raises(UnsupportedCodecError) as raised:
        partition.append(batch)
    assert raised.value.sqlstate == "22023"
    assert "zstd" in str(raised.value) and "accepted: raw" in str(raised.value)
    assert partition.end_offset == 0
    partition.append(build_wire_batch([b"a"], codec=Codec.RAW))
    assert partition.end_offset == 1


def test_topic_refuses_an_unknown_codec_id(open_partition: Callable[..., PartitionLog]) -> None:
    partition = open_partition()
    with pytest.raises(UnsupportedCodecError, match="unknown codec id 9"):
        partition.append(build_wire_batch([b"a"], codec=9))


def test_codec_check_covers_every_row_of_a_large_batch(
    open_partition: Callable[..., PartitionLog],
) -> None:
    partition = open_partition(supported_codecs=frozenset({Codec.RAW, Codec.GZIP}))
    codec_ids = [Codec.RAW] * 499 + [Codec.ZSTD] + [Codec.GZIP] * 500
    with pytest.raises(UnsupportedCodecError, match="codec zstd is not supported"):
        partition.append(build_wire_batch([b"x"] * 1000, codec=codec_ids))
    assert partition.end_offset == 0
    partition.append(build_wire_batch([b"x"] * 1000, codec=[Codec.RAW] * 500 + [Codec.GZIP] * 500))
    assert partition.end_offset == 1000


def test_a_null_codec_is_refused(open_partition: Callable[..., PartitionLog]) -> None:
    batch = build_wire_batch([b"a", b"b"])
    batch = batch.set_column(4, batch.schema.field(4), pa.array([1, None], pa.uint8()))
    with pytest.raises(UnsupportedCodecError, match="needs a codec"):
        open_partition().append(batch)


def test_changed_supported_codecs_apply_to_the_next_append(
    open_partition: Callable[..., PartitionLog],
) -> None:
    partition = open_partition(supported_codecs=frozenset({Codec.RAW}))
    zstd_batch = build_wire_batch([encode(Codec.ZSTD, b"z")], codec=Codec.ZSTD)
    with pytest.raises(UnsupportedCodecError):
        partition.append(zstd_batch)
    partition.config = dataclasses.replace(
        partition.config, supported_codecs=frozenset({Codec.RAW, Codec.ZSTD})
    )
    partition.append(zstd_batch)
    partition.config = dataclasses.replace(
        partition.config, supported_codecs=frozenset({Codec.RAW})
    )
    with pytest.raises(UnsupportedCodecError):
        partition.append(zstd_batch)
    assert partition.end_offset == 1


def test_compressed_messages_are_stored_as_sent_and_decode_on_read(
    open_partition: Callable[..., PartitionLog],
) -> None:
    partition = open_partition()
    plain = [b"alpha" * 20, b"beta" * 20]
    sent = [encode(Codec.GZIP, plain[0]), encode(Codec.ZSTD, plain[1])]
    partition.append(build_wire_batch(sent, codec=[Codec.GZIP, Codec.ZSTD]))
    read = partition.read(0).batches[0]
    assert read.column("data").to_pylist() == sent
    assert decode_column(read.column("codec"), read.column("data")).to_pylist() == plain


def test_a_column_of_zstd_messages_is_decoded_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """All-zstd columns (what ``frameCodec=zstd`` writes, round 17) are decoded by one C
    call, not a ``decode`` per message; a sliced column too; a broken message still
    raises 22P03 (the per-message path names it)."""
    messages = [b"", b"x" * 3000, b"", *(bytes([i]) * i for i in range(1, 60))]
    column = pa.array([encode(Codec.ZSTD, m) for m in messages], pa.binary())
    ids = pa.array([Codec.ZSTD.value] * len(messages), pa.uint8())
    calls: list[bytes] = []
    real = codecs.decode
    monkeypatch.setattr(codecs, "decode",
                        lambda codec, data: calls.append(data) or real(codec, data))
    assert decode_column(ids, column).to_pylist() == messages
    assert decode_column(ids.slice(5, 20), column.slice(5, 20)).to_pylist() == messages[5:25]
    assert calls == []
    broken = pa.array([encode(Codec.ZSTD, b"ok"), b"\x28\xb5\x2f\xfd\x00"], pa.binary())
    with pytest.raises(InvalidBinaryDataError):
        decode_column(ids.slice(0, 2), broken)
