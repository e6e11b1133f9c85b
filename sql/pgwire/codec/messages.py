"""Codecs of the PostgreSQL v3 protocol: frontend messages from bytes, backend ones to bytes.

Pure functions and small dataclasses; nothing here knows about sessions or sockets.
Malformed input raises ``ProtocolError`` (SQLSTATE 08P01).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from storage.errors import TooManyColumnsError, TopicbaseError
from storage.limits import (
    WIRE_MESSAGE_LENGTH_MAX,
    WIRE_PASSWORD_MESSAGE_LENGTH_MAX,
    WIRE_RESULT_COLUMNS_MAX,
    WIRE_STARTUP_LENGTH_MAX,
)

PROTOCOL_V3 = 196608  # 3 << 16
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102

_INT32 = struct.Struct("!i")
_INT16 = struct.Struct("!h")
_UINT16 = struct.Struct("!H")


class ProtocolError(TopicbaseError):
    sqlstate = "08P01"


# -- reading fields -----------------------------------------------------------------------
class Reader:
    """Reads the fields of one message body; any overrun is a ProtocolError."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.at = 0

    def int32(self) -> int:
        return self._unpack(_INT32)

    def int16(self) -> int:
        return self._unpack(_INT16)

    def uint16(self) -> int:
        """A count of the following fields (PostgreSQL reads counts as unsigned)."""
        return self._unpack(_UINT16)

    def byte(self) -> bytes:
        return self.take(1)

    def int16_array(self, count: int) -> list[int]:
        """``count`` (>= 0) Int16 fields at once."""
        return list(struct.unpack(f"!{count}h", self.take(2 * count)))

    def int32_array(self, count: int) -> list[int]:
        """``count`` (>= 0) Int32 fields at once."""
        return list(struct.unpack(f"!{count}i", self.take(4 * count)))

    def take(self, count: int) -> bytes:
        if count < 0 or self.at + count > len(self.body):
            raise ProtocolError("message is shorter than its fields")
        chunk = self.body[self.at : self.at + count]
        self.at += count
        return chunk

    def cstring(self) -> str:
        end = self.body.find(b"\0", self.at)
        if end < 0:
            raise ProtocolError("unterminated string in message")
        raw = self.body[self.at : end]
        self.at = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("invalid UTF-8 in message") from None

    def _unpack(self, shape: struct.Struct) -> int:
        return shape.unpack(self.take(shape.size))[0]


# -- frontend messages ----------------------------------------------------------------------
@dataclass
class Startup:
    code: int  # PROTOCOL_V3, SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST or another version
    parameters: dict[str, str] = field(default_factory=dict)
    process_id: int = 0
    secret_key: int = 0


def startup_length(header: bytes) -> int:
    """The length of a startup packet from its first 4 bytes (the length counts itself)."""
    (length,) = _INT32.unpack(header)
    if length < 8 or length > WIRE_STARTUP_LENGTH_MAX:
        raise ProtocolError("invalid length of startup packet")
    return length


def parse_startup(body: bytes) -> Startup:
    """A startup packet after its length word: the code and what follows it."""
    reader = Reader(body)
    code = reader.int32()
    if code == CANCEL_REQUEST:
        return Startup(code, process_id=reader.int32(), secret_key=reader.int32())
    if code != PROTOCOL_V3:
        return Startup(code)
    parameters: dict[str, str] = {}
    while True:
        name = reader.cstring()
        if not name:
            break
        parameters[name] = reader.cstring()
    return Startup(code, parameters)


def message_length(header: bytes) -> int:
    """The body length of a message from its 5-byte header (type byte + length)."""
    (length,) = _INT32.unpack(header[1:5])
    if length < 4 or length > WIRE_MESSAGE_LENGTH_MAX:
        raise ProtocolError(f"invalid message length {length}")
    return length - 4


@dataclass
class Parse:
    name: str
    query: str
    parameter_oids: list[int]


@dataclass
class Bind:
    portal: str
    statement: str
    parameter_formats: list[int]
    parameters: list[bytes | None]
    result_formats: list[int]


@dataclass
class Describe:
    kind: str  # "S" statement or "P" portal
    name: str


@dataclass
class Execute:
    portal: str
    max_rows: int


@dataclass
class Close:
    kind: str
    name: str


def parse_query(body: bytes) -> str:
    return Reader(body).cstring()


def parse_parse(body: bytes) -> Parse:
    reader = Reader(body)
    name, query = reader.cstring(), reader.cstring()
    oids = reader.int32_array(reader.uint16())
    return Parse(name, query, oids)


def _cstring_at(body: bytes, at: int) -> tuple[str, int]:
    """The C string at ``at`` of ``body`` and the offset after its NUL (``Reader.cstring``
    without a reader: the same errors)."""
    end = body.find(b"\0", at)
    if end < 0:
        raise ProtocolError("unterminated string in message")
    try:
        return body[at:end].decode("utf-8"), end + 1
    except UnicodeDecodeError:
        raise ProtocolError("invalid UTF-8 in message") from None


def _int16s_at(body: bytes, at: int) -> tuple[list[int], int]:
    """A count (unsigned Int16) and that many Int16 fields at ``at``; the offset after."""
    if at + 2 > len(body):
        raise ProtocolError("message is shorter than its fields")
    (count,) = _UINT16.unpack_from(body, at)
    at += 2
    if not count:
        return [], at
    end = at + 2 * count
    if end > len(body):
        raise ProtocolError("message is shorter than its fields")
    if count == 1:  # one format for all (what most clients send)
        return [_INT16.unpack_from(body, at)[0]], end
    return list(struct.unpack_from(f"!{count}h", body, at)), end


def parse_bind(body: bytes) -> Bind:
    """A Bind message. Its parameter values are read in one tight loop (a statement of
    1000 rows binds 1000 values), with the same checks as field by field: a length
    below -1 or past the end of the body is a ProtocolError. Counts are unsigned, as
    PostgreSQL reads them (up to WIRE_PARAMETERS_MAX parameters). Read with offsets, no
    ``Reader``: a flight's Bind is parsed on every statement."""
    portal, at = _cstring_at(body, 0)
    statement, at = _cstring_at(body, at)
    formats, at = _int16s_at(body, at)
    end = len(body)
    if at + 2 > end:
        raise ProtocolError("message is shorter than its fields")
    (count,) = _UINT16.unpack_from(body, at)
    at += 2
    values: list[bytes | None] = []
    append = values.append
    unpack_length = _INT32.unpack_from
    for _ in range(count):
        if at + 4 > end:
            raise ProtocolError("message is shorter than its fields")
        (length,) = unpack_length(body, at)
        at += 4
        if length == -1:
            append(None)
            continue
        if length < 0 or at + length > end:
            raise ProtocolError("message is shorter than its fields")
        append(body[at : at + length])
        at += length
    result_formats, _ = _int16s_at(body, at)
    return Bind(portal, statement, formats, values, result_formats)


def _kind_and_name(body: bytes, message: str) -> tuple[str, str]:
    """A Describe's or Close's subtype (S or P) and name."""
    if not body:
        raise ProtocolError("message is shorter than its fields")
    kind = _SUBTYPES.get(body[0])
    if kind is None:
        raise ProtocolError(f"invalid {message} message subtype {chr(body[0])!r}")
    return kind, _cstring_at(body, 1)[0]


_SUBTYPES = {ord("S"): "S", ord("P"): "P"}


def parse_describe(body: bytes) -> Describe:
    return Describe(*_kind_and_name(body, "DESCRIBE"))


def parse_close(body: bytes) -> Close:
    return Close(*_kind_and_name(body, "CLOSE"))


def parse_execute(body: bytes) -> Execute:
    portal, at = _cstring_at(body, 0)
    if at + 4 > len(body):
        raise ProtocolError("message is shorter than its fields")
    return Execute(portal, _INT32.unpack_from(body, at)[0])


# -- backend messages -------------------------------------------------------------------------
def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + _INT32.pack(len(body) + 4) + body


# Messages without fields, made once.
_EMPTY_QUERY_RESPONSE = message(b"I")
_PARSE_COMPLETE = message(b"1")
_BIND_COMPLETE = message(b"2")
_CLOSE_COMPLETE = message(b"3")
_NO_DATA = message(b"n")
_PORTAL_SUSPENDED = message(b"s")
_READY = {status: message(b"Z", status.encode("ascii")) for status in "ITE"}


def cstr(text: str) -> bytes:
    return text.encode("utf-8") + b"\0"


def authentication_ok() -> bytes:
    return message(b"R", _INT32.pack(0))


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", cstr(name) + cstr(value))


def backend_key_data(process_id: int, secret_key: int) -> bytes:
    return message(b"K", _INT32.pack(process_id) + _INT32.pack(secret_key))


def ready_for_query(status: str) -> bytes:
    ready = _READY.get(status)
    return message(b"Z", status.encode("ascii")) if ready is None else ready


@dataclass
class Column:
    name: str
    type_oid: int
    type_size: int = -1
    type_modifier: int = -1
    format_code: int = 0


def column_count_field(count: int) -> bytes:
    """The Int16 column count of RowDescription and the COPY responses; 54011 past what it
    holds (they go before any row or COPY data, so nothing of the result is sent)."""
    if count > WIRE_RESULT_COLUMNS_MAX:
        raise TooManyColumnsError(
            f"a result of {count} columns cannot be sent: the PostgreSQL protocol counts at "
            f"most {WIRE_RESULT_COLUMNS_MAX} (PostgreSQL refuses a SELECT list of more than "
            "1664); select fewer columns"
        )
    return _INT16.pack(count)


def row_description(columns: list[Column]) -> bytes:
    parts = [column_count_field(len(columns))]
    for c in columns:
        parts.append(cstr(c.name))
        parts.append(struct.pack("!ihihih", 0, 0, c.type_oid, c.type_size, c.type_modifier,
                                 c.format_code))  # fmt: skip
    return message(b"T", b"".join(parts))


def data_row(fields: list[bytes | None]) -> bytes:
    parts = [_INT16.pack(len(fields))]
    for value in fields:
        if value is None:
            parts.append(_INT32.pack(-1))
        else:
            parts.append(_INT32.pack(len(value)))
            parts.append(value)
    return message(b"D", b"".join(parts))


def command_complete(tag: str) -> bytes:
    return message(b"C", cstr(tag))


def empty_query_response() -> bytes:
    return _EMPTY_QUERY_RESPONSE


def parse_complete() -> bytes:
    return _PARSE_COMPLETE


def bind_complete() -> bytes:
    return _BIND_COMPLETE


def close_complete() -> bytes:
    return _CLOSE_COMPLETE


def no_data() -> bytes:
    return _NO_DATA


def portal_suspended() -> bytes:
    return _PORTAL_SUSPENDED


def parameter_description(oids: list[int]) -> bytes:
    """ParameterDescription; ``oids`` holds at most WIRE_PARAMETERS_MAX OIDs."""
    return message(b"t", struct.pack(f"!H{len(oids)}i", len(oids), *oids))


def _fields(
    severity: str, sqlstate: str, text: str, position: int | None, hint: str | None = None
) -> bytes:
    parts = [b"S" + cstr(severity), b"V" + cstr(severity), b"C" + cstr(sqlstate)]
    parts.append(b"M" + cstr(text))
    if hint is not None:
        parts.append(b"H" + cstr(hint))
    if position is not None:
        parts.append(b"P" + cstr(str(position)))
    return b"".join(parts) + b"\0"


def error_response(
    sqlstate: str,
    text: str,
    position: int | None = None,
    severity: str = "ERROR",
    hint: str | None = None,
) -> bytes:
    """An ErrorResponse; ``hint`` (PostgreSQL's HINT field, H) when the error gives one."""
    return message(b"E", _fields(severity, sqlstate, text, position, hint))


def notice_response(text: str, sqlstate: str = "00000") -> bytes:
    return message(b"N", _fields("NOTICE", sqlstate, text, None))


# -- authentication (sql.pgwire.auth drives the exchange) ---------------------------------------
AUTH_OK, AUTH_CLEARTEXT, AUTH_MD5 = 0, 3, 5
AUTH_SASL, AUTH_SASL_CONTINUE, AUTH_SASL_FINAL = 10, 11, 12


@dataclass
class SaslInitialResponse:
    mechanism: str
    data: bytes | None  # None when the client sent length -1 (no initial response)


def password_message_length(header: bytes) -> int:
    """The body length of a PasswordMessage (``p``) from its 5-byte header.

    Any other message type, or a body over WIRE_PASSWORD_MESSAGE_LENGTH_MAX, is a ProtocolError:
    during authentication nothing else may arrive.
    """
    if header[:1] != b"p":
        raise ProtocolError(f"expected password response, got message type {header[:1]!r}")
    length = message_length(header)
    if length > WIRE_PASSWORD_MESSAGE_LENGTH_MAX:
        raise ProtocolError(f"invalid password message length {length}")
    return length


def parse_password(body: bytes) -> str:
    """A cleartext PasswordMessage, or an md5 one (``md5`` + 32 hex digits): one C string."""
    reader = Reader(body)
    password = reader.cstring()
    if reader.at != len(body):
        raise ProtocolError("invalid password packet size")
    return password


def parse_sasl_initial_response(body: bytes) -> SaslInitialResponse:
    """SASLInitialResponse: mechanism name, then Int32 length (-1: none) and the data."""
    reader = Reader(body)
    mechanism = reader.cstring()
    length = reader.int32()
    data = None if length == -1 else reader.take(length)
    if reader.at != len(body):
        raise ProtocolError("invalid SASL initial response packet size")
    return SaslInitialResponse(mechanism, data)


def parse_sasl_response(body: bytes) -> bytes:
    """SASLResponse: the whole body is mechanism data."""
    return body


def authentication_cleartext_password() -> bytes:
    return message(b"R", _INT32.pack(AUTH_CLEARTEXT))


def authentication_md5_password(salt: bytes) -> bytes:
    assert len(salt) == 4, "the md5 salt is 4 bytes"
    return message(b"R", _INT32.pack(AUTH_MD5) + salt)


def authentication_sasl(mechanisms: list[str]) -> bytes:
    assert mechanisms, "at least one SASL mechanism"
    return message(b"R", _INT32.pack(AUTH_SASL) + b"".join(cstr(n) for n in mechanisms) + b"\0")


def authentication_sasl_continue(data: bytes) -> bytes:
    return message(b"R", _INT32.pack(AUTH_SASL_CONTINUE) + data)


def authentication_sasl_final(data: bytes) -> bytes:
    return message(b"R", _INT32.pack(AUTH_SASL_FINAL) + data)


# -- COPY (for sql.pgwire.connection.copy_exchange) ------------------------------------------
def copy_in_response(column_count: int, binary: bool = False) -> bytes:
    """CopyInResponse: text (or binary) format overall and for each of the columns."""
    code = 1 if binary else 0
    return message(b"G", bytes([code]) + column_count_field(column_count)
                   + _INT16.pack(code) * column_count)  # fmt: skip


def copy_out_response(column_count: int) -> bytes:
    """CopyOutResponse: text format overall and for each of ``column_count`` columns."""
    return message(b"H", b"\0" + column_count_field(column_count)
                   + _INT16.pack(0) * column_count)  # fmt: skip


def copy_data(payload: bytes) -> bytes:
    return message(b"d", payload)


def copy_done() -> bytes:
    return message(b"c")


def parse_copy_fail(body: bytes) -> str:
    """The client's reason from a CopyFail message."""
    return Reader(body).cstring()


def error_response_with_context(sqlstate: str, text: str, context: str) -> bytes:
    """An ERROR with a CONTEXT (W) field, e.g. "COPY t, line 3" for bad COPY data."""
    fields = _fields("ERROR", sqlstate, text, None)
    return message(b"E", fields[:-1] + b"W" + cstr(context) + b"\0")
