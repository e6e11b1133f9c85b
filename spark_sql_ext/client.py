"""A small client of Topicbase's Arrow Flight door (``sql.flight.server``).

Used by the Spark data source on the driver and in every task, and usable on its own.
``url`` is ``topicbase://host:port`` (plain) or ``topicbase+tls://host:port`` (TLS; the
server's certificate is checked against ``tls_root_certs``, a PEM file, or the system's
roots; ``tls_client_cert``/``tls_client_key``, PEM files, for a door that asks clients
for a certificate: ``serve --flight-client-ca``). The client logs in once (Basic
handshake) and sends the bearer token with every call. Rows are uploaded as ``stage``
actions (``put``). Server errors come back as ``TopicbaseFlightError`` carrying the SQLSTATE.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.flight as flight

from storage import limits

DEFAULT_PORT = 5434
_SQLSTATE = re.compile(r"\b([0-9A-Z]{5}): ")


# About this many bytes of Arrow IPC per ``stage`` call (the server takes at most
# storage.limits.FLIGHT_STAGE_BODY_BYTES_MAX, 32 MiB): large enough that a call's
# overhead (a round trip, a staged file) is small beside its rows.
PART_BYTES = 6 << 20
# A part is sent again after the connection dropped or timed out, or while the server
# still stages its earlier attempt (55006) or has no turn free (53300), after these waits.
STAGE_RETRY_WAITS_S = (0.2, 1.0, 3.0)
_RETRIED_SQLSTATES = ("55006", "53300")


class TopicbaseFlightError(Exception):
    """A refused Flight call: ``sqlstate`` and the server's message."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(f"{sqlstate}: {message}")
        self.sqlstate = sqlstate
        self.message = message


def _translate(error: flight.FlightError) -> TopicbaseFlightError:
    text = str(error)
    match = _SQLSTATE.search(text)
    if match is None:
        return TopicbaseFlightError("08006", text)
    message = text[match.end():].split(". Detail:")[0].strip()
    return TopicbaseFlightError(match.group(1), message)


def _parts(header: dict[str, Any], batches: Iterable[pa.RecordBatch],
           schema: pa.Schema) -> Iterator[tuple[int, pa.Buffer]]:  # fmt: skip
    """``(part, body)`` of the ``stage`` calls that carry the batches: a body is the JSON
    header line with its part number, then an Arrow IPC stream, written in one buffer (no
    copy to join them). Part 0 has no rows (sent before any batch is read, it starts the
    write); parts 1, 2, ... hold about ``PART_BYTES`` each (measured as written, so at
    most ``PART_BYTES`` and one batch more) and at most
    ``limits.FLIGHT_STAGE_BATCHES_MAX`` batches: small batches gathered, a batch larger than
    that sliced by rows. Every body carries ``schema``."""
    part = 0

    def opened() -> tuple[pa.BufferOutputStream, pa.ipc.RecordBatchStreamWriter]:
        sink = pa.BufferOutputStream()
        line = json.dumps({**header, "part": part}).encode()
        # spaces to 8 bytes: the stream's buffers keep their alignment in the body
        sink.write(line + b" " * (-(len(line) + 1) % 8) + b"\n")
        return sink, pa.ipc.new_stream(sink, schema)

    sink, writer = opened()
    writer.close()
    yield part, sink.getvalue()
    part += 1
    sink, writer = opened()
    held = 0  # batches in the part being built
    for batch in batches:
        size = batch.nbytes
        if size > PART_BYTES and batch.num_rows > 1:
            step = max(1, batch.num_rows * PART_BYTES // size)
            pieces = [batch.slice(at, step) for at in range(0, batch.num_rows, step)]
        else:
            pieces = [batch]
        for piece in pieces:
            writer.write_batch(piece)
            held += 1
            # the body's real size (a batch's IPC metadata is not in its nbytes: 300
            # one-row columns cost ~40 KB each), and the batches the door takes per body
            if sink.tell() >= PART_BYTES or held == limits.FLIGHT_STAGE_BATCHES_MAX:
                writer.close()
                yield part, sink.getvalue()
                part += 1
                sink, writer = opened()
                held = 0
    writer.close()
    if held:
        yield part, sink.getvalue()


def location_of(url: str) -> str:
    """``topicbase://h:p`` → ``grpc+tcp://h:p``; ``topicbase+tls://`` → ``grpc+tls://``."""
    parsed = urlparse(url)
    schemes = {"topicbase": "grpc+tcp", "topicbase+tls": "grpc+tls",
               "grpc": "grpc+tcp", "grpc+tcp": "grpc+tcp", "grpc+tls": "grpc+tls"}  # fmt: skip
    if parsed.scheme not in schemes or not parsed.hostname:
        raise ValueError(f"url {url!r} must look like topicbase://host:port")
    return f"{schemes[parsed.scheme]}://{parsed.hostname}:{parsed.port or DEFAULT_PORT}"


class TopicbaseClient:
    """One logged-in connection to the Flight door."""

    def __init__(self, url: str, user: str, password: str = "", *,
                 tls_root_certs: str | None = None, tls_client_cert: str | None = None,
                 tls_client_key: str | None = None) -> None:  # fmt: skip
        kwargs: dict[str, Any] = {}
        files = {"tls_root_certs": tls_root_certs, "cert_chain": tls_client_cert,
                 "private_key": tls_client_key}  # fmt: skip
        for argument, path in files.items():
            if path:
                with open(path, "rb") as handle:
                    kwargs[argument] = handle.read()
        self._client = flight.FlightClient(location_of(url), **kwargs)
        try:
            header = self._client.authenticate_basic_token(user, password)
        except flight.FlightError as error:
            self._client.close()
            raise _translate(error) from None
        self._options = flight.FlightCallOptions(headers=[header])

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> TopicbaseClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reads ------------------------------------------------------------------------
    def flight_info(self, command: dict[str, Any]) -> flight.FlightInfo:
        descriptor = flight.FlightDescriptor.for_command(json.dumps(command).encode())
        try:
            return self._client.get_flight_info(descriptor, self._options)
        except flight.FlightError as error:
            raise _translate(error) from None

    def tickets(self, command: dict[str, Any]) -> tuple[pa.Schema, list[dict[str, Any]]]:
        """The schema and the endpoint tickets (as dicts) of a topic or table read."""
        info = self.flight_info(command)
        return info.schema, [json.loads(e.ticket.ticket) for e in info.endpoints]

    def read_ticket(self, ticket: dict[str, Any]) -> Iterator[pa.RecordBatch]:
        """The batches of one endpoint, as the server streams them."""
        try:
            reader = self._client.do_get(flight.Ticket(json.dumps(ticket).encode()),
                                         self._options)  # fmt: skip
            for chunk in reader:
                yield chunk.data
        except flight.FlightError as error:
            raise _translate(error) from None

    def read_all(self, command: dict[str, Any]) -> pa.Table:
        """Every endpoint of a read, one after the other, as one table."""
        schema, tickets = self.tickets(command)
        batches = [b for t in tickets for b in self.read_ticket(t)]
        return pa.Table.from_batches(batches, schema=schema)

    # -- writes -----------------------------------------------------------------------
    def put(self, target: dict[str, Any], batches: Iterable[pa.RecordBatch],
            schema: pa.Schema, write_id: str | None = None) -> str:  # fmt: skip
        """Stage ``batches`` under ``write_id`` (a new one if None); returns the id.

        The rows go as ``stage`` actions (``_parts``: part 0 starts the write before any
        batch is read, then about ``PART_BYTES`` of Arrow IPC each, small batches
        gathered, a big one sliced), under a stream token of this put (several puts may
        add to one write id); a call that fails as the connection drops is sent again
        under its number (the server stages a part of a stream once).
        """
        write_id = write_id or uuid.uuid4().hex
        header = {**target, "write_id": write_id, "stream": uuid.uuid4().hex}
        for _, body in _parts(header, batches, schema):
            self._stage(body)
        return write_id

    def _stage(self, body: pa.Buffer) -> dict[str, Any]:
        for wait_s in (*STAGE_RETRY_WAITS_S, None):
            try:
                results = list(self._client.do_action(flight.Action("stage", body),
                                                      self._options))  # fmt: skip
                return json.loads(results[0].body.to_pybytes())
            except (flight.FlightUnavailableError, flight.FlightTimedOutError) as error:
                failure = _translate(error)
            except flight.FlightError as error:
                failure = _translate(error)
                if failure.sqlstate not in _RETRIED_SQLSTATES:
                    raise failure from None
            if wait_s is None:
                raise failure from None
            time.sleep(wait_s)
        raise AssertionError("unreachable")

    def action(self, kind: str, body: dict[str, Any] | None = None) -> Any:
        try:
            results = list(self._client.do_action(
                flight.Action(kind, json.dumps(body or {}).encode()), self._options))
        except flight.FlightError as error:
            raise _translate(error) from None
        return json.loads(results[0].body.to_pybytes()) if results else None

    def commit(self, sink_id: str, batch_id: int, write_ids: list[str]) -> dict[str, Any]:
        return self.action("commit", {"sink_id": sink_id, "batch_id": batch_id,
                                      "write_ids": write_ids})  # fmt: skip

    def abort(self, write_ids: list[str]) -> int:
        return self.action("abort", {"write_ids": write_ids})["aborted"]

    def staged(self) -> list[dict[str, Any]]:
        return self.action("list")

    def partitions(self, topic: str) -> list[dict[str, Any]]:
        return self.action("partitions", {"topic": topic})

    def commit_offsets(self, topic: str, consumer: str, offsets: dict[int, int]) -> None:
        self.action("commit_offsets", {"topic": topic, "consumer": consumer,
                                       "offsets": {str(p): o for p, o in offsets.items()}})
