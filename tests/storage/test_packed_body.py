"""``storage.packed_body``: a column-compressed frame's body taken apart undecoded, for a
reader that decompresses it itself; anything else is left to the decoding path (None)."""

from __future__ import annotations

import struct

import pyarrow as pa
import zstandard

from storage.codecs import Codec
from storage.column_codec import DATA_VALUES, compress_body
from storage.packed_body import packed_body
from storage.record_batch import serialize_body_buffer
from storage.wire_columns import DATA, WIRE_BUFFERS, WIRE_NODES
from tests.pgwire.test_copy_frames import wire

MESSAGES = [b"message %d " % i + b"z" * 300 for i in range(50)]


def test_a_compressed_body_gives_its_stored_pieces() -> None:
    batch = wire(MESSAGES)
    body = compress_body(batch)
    packed = packed_body(body)
    assert packed is not None
    assert packed.rows == 50 and len(packed.nodes) == WIRE_NODES
    assert len(packed.buffers) == WIRE_BUFFERS
    assert packed.nodes[DATA] == (50, 0)
    values = bytes(packed.buffers[DATA_VALUES])
    (declared,) = struct.unpack_from("<q", values)
    assert declared == sum(len(m) for m in MESSAGES)
    assert zstandard.ZstdDecompressor().decompress(values[8:]) == b"".join(MESSAGES)
    for index, piece in enumerate(packed.buffers):  # views of the body, as stored
        assert len(piece) == 0 or len(piece) >= 8
        if index != DATA_VALUES and len(piece):
            assert struct.unpack_from("<q", piece)[0] == -1
            assert bytes(piece) in body.to_pybytes()


def test_plain_bodies_other_codecs_and_damage_are_left_to_the_decoder() -> None:
    batch = wire(MESSAGES)
    assert packed_body(serialize_body_buffer(batch)) is None  # not compressed
    codecs = [Codec.RAW] * 49 + [Codec.GZIP]
    mixed = batch.set_column(batch.schema.get_field_index("codec"), batch.schema.field("codec"),
                             pa.array(codecs, pa.uint8()))  # fmt: skip
    assert packed_body(compress_body(mixed)) is None  # a message to decode one by one
    body = compress_body(batch).to_pybytes()
    assert packed_body(pa.py_buffer(body[: len(body) // 2])) is None  # buffers past its end
    assert packed_body(pa.py_buffer(b"\xff\xff\xff\xff")) is None
