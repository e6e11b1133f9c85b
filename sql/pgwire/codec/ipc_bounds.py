"""A client's Arrow IPC stream checked message by message BEFORE pyarrow decodes it.

Used by both COPY (FORMAT arrow) paths and by the Flight door's ``stage`` action
(``sql.flight.server``), whose bodies reach Python as raw bytes.

Why: a record batch may use IPC body compression (``BodyCompression``: LZ4_FRAME or ZSTD,
each buffer prefixed by its uncompressed length as a little-endian int64, -1 meaning "not
compressed"). pyarrow's stream reader allocates and fills every buffer's declared length
unchecked, so 16 KiB of zstd declaring 512 MiB of zeros raised the server's maxrss by 1.5 GiB
before any limit was looked at (review R1, round 22). Here the message's flatbuffer header is
read by hand (no flatbuffers dependency; every offset bounds-checked) and:

- a message that is not well formed for the reader (a buffer outside the body, a compressed
  buffer shorter than its 8-byte prefix, a prefix below -1, an unknown codec or method, a
  header that points outside its metadata) is ``BadCopyFormatError`` (22P04);
- a compressed record or dictionary batch whose declared decoded body exceeds
  ``message_bytes_max`` (``limits.BATCH_BYTES_MAX`` by default: the largest batch the store
  appends at once), or a stream whose decoded bodies (compressed ones as declared,
  others as sent) add up past ``total_bytes_max``, is ``LimitExceededError`` (54000).

Then, after decoding, before a dictionary-encoded column is cast to its value type (both
COPY paths send and stage plain columns): ``check_plain`` bounds what the cast would make
(``plain_bytes``), 54000 past the caller's limit; 1 MiB sent as a dictionary of one 1 MiB
value and 1,000 indices peaked the server at +3 GiB before.

Invariants: nothing pyarrow reads has not passed the check (``CheckedStream`` hands it
whole checked messages only; ``check_stream`` is run before ``open_stream`` on bytes held
whole); the check allocates nothing proportional to a declared size. An uncompressed
message costs what the client really sent, so only the stream total bounds it here.
Pure code, no I/O of its own.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from sql.pgwire.codec.copy_format import BadCopyFormatError
from storage import limits
from storage.errors import LimitExceededError

CONTINUATION = 0xFFFFFFFF
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_PAIR = struct.Struct("<qq")  # FieldNode and Buffer: two int64
# Message.header_type values (Message.fbs ``union MessageHeader``).
_DICTIONARY_BATCH = 2
_RECORD_BATCH = 3
_CODECS = {0: "LZ4_FRAME", 1: "ZSTD"}  # CompressionType; BodyCompressionMethod 0 = BUFFER


@dataclass(frozen=True)
class Bounds:
    """What one stream may decode to. ``total_bytes_max`` None: no stream total here.
    ``metadata_bytes_max`` None: a message's flatbuffer header is bounded by the data
    alone (else 54000 past it: a schema of 250,000 columns is 27 MB of header).
    ``subject`` names the stream in a malformed message's error."""

    message_bytes_max: int = limits.BATCH_BYTES_MAX
    total_bytes_max: int | None = None
    where: str | None = None
    subject: str = "COPY data"
    metadata_bytes_max: int | None = None


class _Table:
    """A flatbuffer table in ``data`` at ``position`` (every read bounds-checked)."""

    def __init__(self, data: memoryview, position: int, bad: Callable[[str], Exception]) -> None:
        self.data, self.position, self.bad = data, position, bad
        vtable = position - self._unpack(_I32, position)
        self.vtable = vtable
        self.vtable_size = self._unpack(_U16, vtable)

    def _unpack(self, kind: struct.Struct, at: int) -> int:
        if at < 0 or at + kind.size > len(self.data):
            raise self.bad("its header points outside the message metadata")
        return int(kind.unpack_from(self.data, at)[0])

    def _field(self, index: int) -> int | None:
        slot = 4 + 2 * index
        if slot + 2 > self.vtable_size:
            return None
        offset = self._unpack(_U16, self.vtable + slot)
        return self.position + offset if offset else None

    def scalar(self, index: int, kind: struct.Struct, default: int) -> int:
        at = self._field(index)
        return default if at is None else self._unpack(kind, at)

    def _target(self, index: int) -> int | None:
        at = self._field(index)
        return None if at is None else at + self._unpack(_U32, at)

    def table(self, index: int) -> _Table | None:
        at = self._target(index)
        return None if at is None else _Table(self.data, at, self.bad)

    def pairs(self, index: int) -> list[tuple[int, int]]:
        """A vector of 16-byte structs of two int64 (``Buffer``, ``FieldNode``)."""
        at = self._target(index)
        if at is None:
            return []
        count = self._unpack(_U32, at)
        if at + 4 + count * _PAIR.size > len(self.data):
            raise self.bad("its header points outside the message metadata")
        return [_PAIR.unpack_from(self.data, at + 4 + i * _PAIR.size) for i in range(count)]


class StreamCheck:
    """The running check of one stream: ``body_length`` of each message's metadata, then
    ``check_body`` with its body. Counts the decoded total over the stream."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.decoded_total = 0
        self._compression: tuple[str, list[tuple[int, int]]] | None = None
        self._kind = 0

    def _bad(self, why: str) -> BadCopyFormatError:
        return BadCopyFormatError(f"{self.bounds.subject} is not one Arrow IPC stream: a "
                                  f"message: {why}",
                                  where=self.bounds.where)  # fmt: skip

    def body_length(self, metadata: memoryview) -> int:
        """The body length ``metadata`` (one Message flatbuffer) declares; remembers its
        compressed buffers for ``check_body``."""
        if len(metadata) < 4:
            raise self._bad("its metadata is shorter than a flatbuffer")
        most = self.bounds.metadata_bytes_max
        if most is not None and len(metadata) > most:
            raise LimitExceededError(f"an Arrow IPC message's header has {len(metadata)} "
                                     f"bytes, over the limit of {most}",
                                     where=self.bounds.where)  # fmt: skip
        message = _Table(metadata, int(_U32.unpack_from(metadata, 0)[0]), self._bad)
        self._kind = message.scalar(1, _U8, 0)
        body_length = message.scalar(3, _I64, 0)
        if body_length < 0:
            raise self._bad(f"a negative body length ({body_length})")
        self._compression = None
        batch = message.table(2) if self._kind in (_DICTIONARY_BATCH, _RECORD_BATCH) else None
        if batch is not None and self._kind == _DICTIONARY_BATCH:
            batch = batch.table(1)  # DictionaryBatch.data
        if batch is not None:
            compression = batch.table(3)
            if compression is not None:
                codec = compression.scalar(0, _U8, 0)
                method = compression.scalar(1, _U8, 0)
                if codec not in _CODECS or method != 0:
                    raise self._bad(f"an unknown body compression (codec {codec}, "
                                    f"method {method})")  # fmt: skip
                self._compression = (_CODECS[codec], batch.pairs(2))
        return body_length

    def check_body(self, body: memoryview) -> None:
        """Refuse the message whose body is ``body`` before anything decodes it."""
        if self._compression is None:
            self._count(len(body))
            return
        codec, buffers = self._compression
        decoded = 0
        for offset, length in buffers:
            if offset < 0 or length < 0 or offset + length > len(body):
                raise self._bad(f"a buffer ({offset}, {length}) outside its body of "
                                f"{len(body)} bytes")  # fmt: skip
            if length == 0:
                continue
            if length < _I64.size:
                raise self._bad(f"a {codec} buffer of {length} bytes has no 8-byte length prefix")
            declared = int(_I64.unpack_from(body, offset)[0])
            if declared < -1:
                raise self._bad(f"a {codec} buffer declares {declared} bytes")
            decoded += length - _I64.size if declared == -1 else declared
        if decoded > self.bounds.message_bytes_max:
            raise LimitExceededError(
                f"an Arrow IPC message compressed with {codec} declares {decoded} bytes "
                f"decoded, over the limit of {self.bounds.message_bytes_max} bytes "
                f"(send larger batches uncompressed, or split them)",
                where=self.bounds.where)  # fmt: skip
        self._count(decoded)

    def _count(self, decoded: int) -> None:
        self.decoded_total += decoded
        most = self.bounds.total_bytes_max
        if most is not None and self.decoded_total > most:
            raise LimitExceededError(f"the Arrow IPC stream decodes to more than {most} bytes "
                                     f"(at least {self.decoded_total})",
                                     where=self.bounds.where)  # fmt: skip


def _prefix(data: memoryview, at: int) -> tuple[int, int] | None:
    """(metadata length, prefix bytes) of the message at ``at``; None when it is cut short."""
    if at + 4 > len(data):
        return None
    first = int(_U32.unpack_from(data, at)[0])
    if first != CONTINUATION:
        return int(_I32.unpack_from(data, at)[0]), 4  # the legacy prefix: the length alone
    if at + 8 > len(data):
        return None
    return int(_I32.unpack_from(data, at + 4)[0]), 8


def check_stream(data: bytes | memoryview, bounds: Bounds) -> None:
    """Check every message of the stream held whole in ``data`` (stops at the end marker or
    where the data is cut short: pyarrow then says what is wrong with it)."""
    view = memoryview(data)
    check = StreamCheck(bounds)
    at = 0
    while True:
        prefix = _prefix(view, at)
        if prefix is None:
            return
        length, size = prefix
        if length == 0:
            return
        if length < 0 or at + size + length > len(view):
            return  # pyarrow refuses it as it stands, without allocating anything
        body_length = check.body_length(view[at + size : at + size + length])
        start = at + size + length
        if start + body_length > len(view):
            return
        check.check_body(view[start : start + body_length])
        at = start + body_length


class CheckedStream:
    """A file-like reader (what ``pa.ipc.open_stream`` reads) over ``source`` (whose
    ``read(n)`` returns ``n`` bytes, fewer only at its end) that hands on whole messages
    only once ``StreamCheck`` passed them. Holds one message (what pyarrow holds too)."""

    def __init__(self, source: object, bounds: Bounds) -> None:
        self._read: Callable[[int], bytes | bytearray | memoryview] = source.read  # type: ignore[attr-defined]
        self._check = StreamCheck(bounds)
        self._pieces: list[memoryview] = []
        self._ended = False

    @property
    def closed(self) -> bool:  # pyarrow's file wrapper asks
        return False

    def read(self, size: int = -1) -> bytes | memoryview:
        while (size < 0 or sum(map(len, self._pieces)) < size) and not self._ended:
            self._next_message()
        held = sum(map(len, self._pieces))
        take = held if size < 0 else min(size, held)
        if self._pieces and len(self._pieces[0]) >= take:  # the usual case: no copy
            out = self._pieces[0][:take]
            self._pieces[0] = self._pieces[0][take:]
            if not self._pieces[0]:
                self._pieces.pop(0)
            return out
        parts = bytearray()
        while len(parts) < take:
            piece = self._pieces[0]
            need = take - len(parts)
            parts += piece[:need]
            if len(piece) <= need:
                self._pieces.pop(0)
            else:
                self._pieces[0] = piece[need:]
        return bytes(parts)

    def _next_message(self) -> None:
        head = memoryview(bytes(self._read(4)))
        if len(head) == 4 and int(_U32.unpack_from(head, 0)[0]) == CONTINUATION:
            head = memoryview(bytes(head) + bytes(self._read(4)))
        prefix = _prefix(head, 0)
        self._pieces.append(head)
        if prefix is None or prefix[0] <= 0:  # the end marker, or cut short / negative
            self._ended = True
            return
        metadata = memoryview(self._read(prefix[0]))
        self._pieces.append(metadata)
        if len(metadata) < prefix[0]:
            self._ended = True
            return
        body_length = self._check.body_length(metadata)
        body = memoryview(self._read(body_length))
        if len(body) < body_length:  # cut short: pyarrow says so, having allocated nothing
            self._pieces.append(body)
            self._ended = True
            return
        self._check.check_body(body)
        self._pieces.append(body)


# -- dictionary columns, cast to their value type after decoding --------------------------------
def plain_bytes(array: pa.Array | pa.ChunkedArray) -> int:
    """An upper bound of the bytes ``array`` takes once its dictionaries are cast to their
    value types (``copy_arrow.plain_type``), computed without the cast: a dictionary of one
    1 MiB value and a million 4-byte indices is a 1 TiB column once plain (review round 22).
    Exact for binary, string and fixed-width dictionary values; other value types count the
    whole dictionary per index."""
    if isinstance(array, pa.ChunkedArray):
        return sum(plain_bytes(chunk) for chunk in array.chunks)
    kind = array.type
    if pa.types.is_dictionary(kind):
        indices, dictionary = array.indices, array.dictionary
        rows = len(indices) - indices.null_count
        value = dictionary.type
        if pa.types.is_binary(value) or pa.types.is_string(value) or \
                pa.types.is_large_binary(value) or pa.types.is_large_string(value):  # fmt: skip
            lengths = pc.binary_length(dictionary).cast(pa.int64())
            taken = pc.sum(pc.take(lengths, indices)).as_py() or 0
            return int(taken) + 8 * (len(indices) + 1)
        if not _has_dictionary(value) and pa.types.is_primitive(value) and value.bit_width >= 8:
            return len(indices) * value.bit_width // 8
        return rows * max(1, plain_bytes(dictionary)) + 8 * len(indices)
    if not _has_dictionary(kind):
        return int(array.nbytes)
    if pa.types.is_struct(kind):
        return sum(plain_bytes(array.field(i)) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return plain_bytes(array.keys) + plain_bytes(array.items) + 8 * (len(array) + 1)
    # lists of any kind: their values (all of them: a bound) and offsets
    return plain_bytes(array.values) + 8 * (len(array) + 1)


def _has_dictionary(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        return True
    return any(_has_dictionary(kind.field(i).type) for i in range(kind.num_fields))


def check_plain(columns: list[pa.Array] | list[pa.ChunkedArray], most: int,
                where: str | None) -> None:  # fmt: skip
    """54000 when the dictionary columns among ``columns`` would take more than ``most``
    bytes once cast plain (other columns count what they hold); nothing cast here."""
    if not any(_has_dictionary(column.type) for column in columns):
        return
    size = sum(plain_bytes(column) for column in columns)
    if size > most:
        raise LimitExceededError(f"dictionary-encoded Arrow columns decode to {size} bytes, "
                                 f"over the limit of {most} bytes", where=where)  # fmt: skip
