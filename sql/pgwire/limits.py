"""Limits of the PostgreSQL-wire server, each with its reason.

``PgServer`` takes each as a constructor parameter (``topicbase serve
--max-connections N`` sets the first); these are the defaults. Going over one is
an error with a SQLSTATE, never a hang or a dead server:

- connections: the N+1th socket gets ``FATAL 53300 sorry, too many clients
  already`` once it has sent its startup packet, and is closed. Every accepted
  socket counts from accept to close (also one still negotiating), so a flood of
  idle sockets cannot pile up unbounded. A CancelRequest is still served when
  the server is full.
- message size: a frontend message whose length word is over the limit gets
  ``FATAL 54000`` and the connection is closed *before its body is read*, so a
  hostile length word costs no memory. (PostgreSQL's own ceiling is 1 GiB.)
- statement size: a Query or Parse whose text is over the limit gets ``ERROR
  54000``; the connection stays usable and an open transaction is failed, as any
  failed statement fails it. The grammar parses about 5 MB/s here, so the limit
  also bounds the time one statement can spend in the parser.
- result size: the engine materialises a statement's whole result as one Arrow
  table (``engine.session.Result.table``) before the wire layer sees it, so this
  limit cannot bound the engine's peak memory; what it bounds is what the
  server then encodes and sends (text encoding grows it: ``bytea`` doubles as
  hex), and what a client must take. A result whose Arrow size is over the
  limit gets ``ERROR 54000`` instead of rows; inside a transaction block the
  transaction is failed, so a consumer read whose rows were refused never
  commits its offsets. A topic read alone is already capped by the storage
  limits (``storage.limits.READ_BYTES_MAX`` and ``READ_MESSAGES_MAX``) well
  below the default, so an autocommit consumer read is not refused after its
  offsets moved; a bigger result (a table scan, a join) is refused whole: read
  it in parts with ``LIMIT ... OFFSET``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from sql.pgwire.messages import ProtocolError, message_length
from storage.errors import LimitExceededError

MIB = 1024 * 1024

# Open client sockets at once (PostgreSQL's max_connections default).
CONNECTIONS_MAX_DEFAULT = 100
# One frontend message (Query, Parse, Bind, CopyData ...). 64 MiB = the largest
# batch one append may carry (storage.limits.BATCH_BYTES_MAX): a bigger message
# could not be written anyway, and 100 connections each holding one stay in memory.
MESSAGE_BYTES_MAX_DEFAULT = 64 * MIB
# The text of one Query or Parse message (~3 s of parsing at ~5 MB/s).
STATEMENT_BYTES_MAX_DEFAULT = 16 * MIB
# Arrow bytes of one statement's result (Result.table.nbytes).
RESULT_BYTES_MAX_DEFAULT = 1024 * MIB
# How long a refused client may take to send its startup packet before it is dropped.
REFUSAL_TIMEOUT_S = 10.0
# Startup negotiation packets (SSLRequest, GSSENCRequest) a refused client may send.
REFUSAL_PACKETS_MAX = 4


@dataclass(frozen=True)
class ServerLimits:
    """The limits one server enforces; every value is positive."""

    connections_max: int = CONNECTIONS_MAX_DEFAULT
    message_bytes_max: int = MESSAGE_BYTES_MAX_DEFAULT
    statement_bytes_max: int = STATEMENT_BYTES_MAX_DEFAULT
    result_bytes_max: int = RESULT_BYTES_MAX_DEFAULT

    def __post_init__(self) -> None:
        for name in ("connections_max", "message_bytes_max", "statement_bytes_max",
                     "result_bytes_max"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")


class MessageTooLargeError(ProtocolError):
    """A frontend message over ``message_bytes_max``: fatal, the body is never read."""

    sqlstate = "54000"


def message_body_length(header: bytes, limits: ServerLimits) -> int:
    """The body length of a message from its 5-byte header, within ``limits``.

    A length word under 4 (negative included) or over PostgreSQL's 1 GiB is a
    ProtocolError (08P01); one over ``message_bytes_max`` is MessageTooLargeError
    (54000). Both are fatal: after a bad length the stream cannot be resynchronised.
    """
    length = message_length(header)
    if length > limits.message_bytes_max:
        raise MessageTooLargeError(
            f"message of type {header[:1]!r} is {length} bytes, over the limit of "
            f"{limits.message_bytes_max} bytes"
        )
    return length


def statement_error(body: bytes, limits: ServerLimits) -> LimitExceededError | None:
    """The error for a Query/Parse message body longer than ``statement_bytes_max``."""
    if len(body) <= limits.statement_bytes_max:
        return None
    return LimitExceededError(
        f"statement is {len(body)} bytes, over the limit of {limits.statement_bytes_max} bytes"
    )


def result_error(table: pa.Table | None, limits: ServerLimits) -> LimitExceededError | None:
    """The error for a result whose Arrow size is over ``result_bytes_max``."""
    if table is None or table.nbytes <= limits.result_bytes_max:
        return None
    return LimitExceededError(
        f"result of {table.num_rows} rows is {table.nbytes} bytes, over the limit of "
        f"{limits.result_bytes_max} bytes; read it in parts (LIMIT ... OFFSET)"
    )
