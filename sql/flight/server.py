"""The Arrow Flight door of ``topicbase serve`` (``--flight-port``, default 5434).

Bulk Arrow in and out for Spark executors and any Arrow client, behind the wire server's
users file, TLS and privileges. Every call runs in an engine session acting as the
authenticated user (``sql.flight.auth``); this module speaks Flight and holds no database
logic (reads are ``engine.bulk_read``, staged writes ``engine.bulk_write``, table reads
are SQL statements of the session).

Requests (descriptor commands, tickets and action bodies are JSON objects):

- ``GetFlightInfo`` / ``GetSchema``: ``{"topic": t, "columns": [...], "starts": {p: o},
  "ends": {p: o}, "start_time_us": us, "split_rows": n}`` cuts topic ``t`` into endpoints
  of one partition range each (tickets ``{"topic", "partition", "start", "end",
  "columns"}``); ``{"table": name, "columns": [...]}`` gives one endpoint for a table.
- ``DoGet``: a ticket above; a topic range streams its stored frames, projected.
- ``DoAction`` ``stage``: the body is one JSON line ``{"write_id": id, "stream": s,
  "part": n, "topic": t}`` or ``{"write_id": id, "stream": s, "part": n, "table": name,
  "mode": "append"|"upsert"|"add", "key": [...]}`` (``s``: 32 hex digits naming one
  client stream of the write, e.g. one ``put``), a newline, then an Arrow IPC *stream*
  (schema and batches) held whole, at most ``limits.FLIGHT_STAGE_BODY_BYTES_MAX`` bytes;
  its rows are staged on disk as part ``n`` of stream ``s`` of the write; answers
  ``{"rows": r, "part": n}`` (``"duplicate": true`` and no row for a part of the stream
  staged already: a retried call).
  Part 0 starts the write (``TopicbaseClient.put`` sends it, without rows, before it
  reads any batch, so an abort sweeping a job's writes finds it, as it found a DoPut's);
  a later part of a write that is gone (aborted, committed) is 42704, never a new write.
  Parts are published in the order they were staged, not by number: send a stream's
  parts one at a time, each after the previous one's answer (as ``put`` does).
- ``DoPut`` is refused (0A000) before any of its stream is read: pyarrow's Flight
  server decodes a put's record batches (their IPC body compression, dictionaries) in
  C++ before Python could look at them, so 16 KiB of zstd made the server allocate
  512 MiB. An action's body reaches Python as the bytes that were sent; ``_stage``
  bounds its messages (``ipc_bounds``: 54000, malformed 22P03) before pyarrow decodes
  any.
- ``DoAction``: ``commit`` ``{"sink_id", "batch_id", "write_ids"}`` (exactly once),
  ``abort`` ``{"write_ids"}``, ``list``, ``partitions`` ``{"topic"}``,
  ``commit_offsets`` ``{"topic", "consumer", "offsets": {p: end}}`` (a consumer's
  advisory commit), ``last_batch`` ``{"sink_id"}``, ``relations`` (topics and tables,
  for the Spark catalog), ``execute`` ``{"sql"}`` (one statement of the session: DDL of
  the Spark catalog; privileges and the sandbox apply as on the wire).

Errors travel as Flight errors whose message starts with the SQLSTATE (``42501: …``):
42501 as FlightUnauthorizedError, 28xxx as FlightUnauthenticatedError, others as
FlightServerError; an ordinary user's call past their connection limit (the users file's
``connection_limit``, else ``connections_per_user_max``: ``sql.flight.admission``) is
refused before it runs as FlightUnavailableError ``53300``. Abandoned staged writes are
collected every ``collect_interval_s``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from engine.api import (
    ABANDON_AFTER_S_DEFAULT,
    Database,
    OffsetRange,
    project_schema,
)
from sql.flight.admission import CallAdmission
from sql.flight.auth import AuthMiddlewareFactory, FlightAuthenticator, NoHandshakeCheck
from sql.pgwire.codec import ipc_bounds
from sql.pgwire.codec.copy_format import BadCopyFormatError
from sql.pgwire.users import UsersFile, default_users_path
from sql.user_sessions import UserSessions
from storage import limits
from storage.errors import (
    FeatureNotSupportedError,
    InvalidBinaryDataError,
    InvalidParameterValueError,
    LimitExceededError,
    TooManyConnectionsError,
    TopicbaseError,
    UndefinedColumnError,
)

log = logging.getLogger(__name__)

DEFAULT_FLIGHT_PORT = 5434
COLLECT_INTERVAL_S = 60.0


def _flight_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """Report a TopicbaseError as the Flight error of its class, SQLSTATE first."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except TopicbaseError as error:
            raise _as_flight_error(error) from None

    return wrapper


def _as_flight_error(error: TopicbaseError) -> Exception:
    text = f"{error.sqlstate}: {error}"
    if error.sqlstate == "42501":
        return flight.FlightUnauthorizedError(text)
    if error.sqlstate.startswith("28"):
        return flight.FlightUnauthenticatedError(text)
    return flight.FlightServerError(text)


def _command(data: bytes) -> dict[str, Any]:
    if len(data) > limits.FLIGHT_COMMAND_BYTES_MAX:
        raise InvalidParameterValueError(
            f"a Flight command is limited to {limits.FLIGHT_COMMAND_BYTES_MAX} bytes")
    try:
        value = json.loads(data or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise InvalidParameterValueError("a Flight command must be a JSON object") from None
    if not isinstance(value, dict):
        raise InvalidParameterValueError("a Flight command must be a JSON object")
    return value


def _offsets(value: Any, what: str) -> dict[int, int] | None:
    if value is None:
        return None
    try:
        return {int(p): int(o) for p, o in dict(value).items()}
    except (TypeError, ValueError):
        raise InvalidParameterValueError(f"{what} must map partitions to offsets") from None


def _columns(command: dict[str, Any]) -> list[str] | None:
    columns = command.get("columns")
    if columns is not None and (
        not isinstance(columns, list) or not all(isinstance(c, str) for c in columns)
    ):
        raise InvalidParameterValueError("columns must be a list of names")
    return columns or None


def _target(command: dict[str, Any]) -> tuple[str, str]:
    for kind in ("topic", "table"):
        name = command.get(kind)
        if isinstance(name, str) and name:
            return kind, name
    raise InvalidParameterValueError('the command names no "topic" or "table"')


def _key(command: dict[str, Any]) -> tuple[str, ...]:
    key = command.get("key") or []
    if not isinstance(key, list) or not all(isinstance(k, str) for k in key):
        raise InvalidParameterValueError("key must be a list of column names")
    return tuple(key)


# Buffers that are not at their type's alignment are copied (a client that does not pad
# its header line to 8 bytes); decompression stays on the call's own thread (the turns
# bound the calls, not the global CPU pool).
_READ_OPTIONS = pa.ipc.IpcReadOptions(ensure_alignment=pa.ipc.Alignment.DataTypeSpecific,
                                      use_threads=False)  # fmt: skip


def _open(data: pa.Buffer) -> pa.ipc.RecordBatchStreamReader:
    """A reader of a stage body's IPC stream (checked by ``ipc_bounds`` already)."""
    try:
        return pa.ipc.open_stream(data, options=_READ_OPTIONS)
    except (pa.ArrowException, OSError) as error:
        raise InvalidBinaryDataError(f"a stage body is not an Arrow IPC stream: {error}") from None


def _check_columns(schema: pa.Schema) -> None:
    """54000 past ``limits.FLIGHT_STAGE_COLUMNS_MAX`` fields at every nesting level."""
    count = 0
    pending = list(schema)
    while pending:
        field = pending.pop()
        count += 1
        if count > limits.FLIGHT_STAGE_COLUMNS_MAX:
            raise LimitExceededError(f"a stage body's schema has more than "
                                     f"{limits.FLIGHT_STAGE_COLUMNS_MAX} columns")  # fmt: skip
        pending.extend(field.type.field(i) for i in range(field.type.num_fields))


def _checked_batches(reader: pa.ipc.RecordBatchStreamReader, where: str
                     ) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """The reader's batches, a malformed or invalid one (``validate(full=True)``) as
    22P03, at most
    ``limits.FLIGHT_STAGE_BATCHES_MAX`` of them, and dictionary columns bounded
    (``ipc_bounds.check_plain``, 54000) over the whole body before the engine sees them."""
    plain = 0
    count = 0
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as error:
            raise InvalidBinaryDataError(
                f"a stage body is not an Arrow IPC stream: {error}") from None  # fmt: skip
        try:  # offsets, lengths, UTF-8: a batch the IPC reader took but readers would trip on
            batch.validate(full=True)
        except pa.ArrowException as error:
            raise InvalidBinaryDataError(f"a stage body holds an invalid record batch: {error}",
                                         where=where) from None  # fmt: skip
        count += 1
        if count > limits.FLIGHT_STAGE_BATCHES_MAX:
            raise LimitExceededError(f"a stage body holds more than "
                                     f"{limits.FLIGHT_STAGE_BATCHES_MAX} record batches: "
                                     "gather small batches", where=where)  # fmt: skip
        plain += sum(ipc_bounds.plain_bytes(column) for column in batch.columns)
        if plain > limits.FLIGHT_STAGE_DECODED_BYTES_MAX:
            raise LimitExceededError(
                f"a stage body's rows decode to more than "
                f"{limits.FLIGHT_STAGE_DECODED_BYTES_MAX} bytes (at least {plain})",
                where=where)  # fmt: skip
        yield batch


def _quote(name: str) -> str:
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


class TopicbaseFlightServer(flight.FlightServerBase):
    """The door itself; ``start_flight`` builds it from ``serve``'s options."""

    def __init__(self, database: Database, location: str, authenticator: FlightAuthenticator,
                 *, tls_certificates: list[tuple[bytes, bytes]] | None = None,
                 client_roots: bytes | None = None,
                 staging_bytes_max: int = limits.BULK_STAGING_BYTES_MAX_DEFAULT,
                 abandon_after_s: float = ABANDON_AFTER_S_DEFAULT,
                 collect_interval_s: float = COLLECT_INTERVAL_S,
                 connections_per_user_max: int | None = None,
                 user_sessions: UserSessions | None = None) -> None:  # fmt: skip
        # an ordinary user's calls in progress: their connection limit, as on the wire (with
        # the wire's sessions when ``serve`` shares ``user_sessions``)
        self.admission = CallAdmission(authenticator.connection_limit, connections_per_user_max,
                                       user_sessions)  # fmt: skip
        super().__init__(
            location,
            auth_handler=NoHandshakeCheck(),
            tls_certificates=tls_certificates or [],
            verify_client=client_roots is not None,
            root_certificates=client_roots,
            middleware={"auth": AuthMiddlewareFactory(authenticator, self.admission)},
        )
        self.database = database
        self._write_settings = {
            "staging_bytes_max": staging_bytes_max, "abandon_after_s": abandon_after_s}
        with self._session_of(None) as session:
            self.writes = session.bulk_writes(**self._write_settings)
        self.writes.collect()
        # ``stage`` calls decoding at once (limits.FLIGHT_STAGES_MAX; others wait)
        self._stage_turns = threading.BoundedSemaphore(limits.FLIGHT_STAGES_MAX)
        self.stage_wait_s = limits.FLIGHT_STAGE_WAIT_S
        self._stopping = threading.Event()
        self._collector = threading.Thread(
            target=self._collect_loop, args=(collect_interval_s,), name="flight-collector",
            daemon=True)  # fmt: skip
        self._collector.start()

    def stop(self) -> None:
        self._stopping.set()
        self.shutdown()
        self._collector.join()

    def _collect_loop(self, interval_s: float) -> None:
        while not self._stopping.wait(interval_s):
            try:
                collected = self.writes.collect()
                if collected:
                    log.warning("collected %d abandoned staged writes", len(collected))
            except OSError as error:
                log.warning("collecting abandoned writes failed: %s", error)

    @contextlib.contextmanager
    def _session_of(self, context: Any) -> Iterator[Any]:
        """A session acting as the call's user (the local superuser for the server's own
        housekeeping, when there is no call)."""
        if context is None:
            session = self.database.connect()
        else:
            session = self.database.connect(context.get_middleware("auth").identity)
        try:
            yield session
        finally:
            session.close()

    # -- reads ------------------------------------------------------------------------
    @_flight_errors
    def get_flight_info(self, context: Any, descriptor: flight.FlightDescriptor
                        ) -> flight.FlightInfo:  # fmt: skip
        command = _command(descriptor.command)
        kind, name = _target(command)
        columns = _columns(command)
        with self._session_of(context) as session:
            if kind == "table":
                schema = self._table_schema(session, name, columns)
                ticket = json.dumps({"table": name, "columns": columns}).encode()
                return flight.FlightInfo(schema, descriptor, [flight.FlightEndpoint(ticket, [])],
                                         -1, -1)  # fmt: skip
            schema = project_schema(columns)
            starts = _offsets(command.get("starts"), "starts")
            if command.get("start_time_us") is not None:
                starts = {b.partition: session.bulk_offset_for_time(
                    name, b.partition, int(command["start_time_us"]))
                    for b in session.bulk_partitions(name)}  # fmt: skip
            split_rows = command.get("split_rows")
            ranges = session.bulk_cut(name, starts, _offsets(command.get("ends"), "ends"),
                                      None if split_rows is None else int(split_rows))
        endpoints = [
            flight.FlightEndpoint(
                json.dumps({"topic": name, **r.to_json(), "columns": columns}).encode(), [])
            for r in ranges
        ]  # fmt: skip
        return flight.FlightInfo(schema, descriptor, endpoints, sum(r.count for r in ranges), -1)

    @_flight_errors
    def get_schema(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.SchemaResult:
        command = _command(descriptor.command)
        kind, name = _target(command)
        with self._session_of(context) as session:
            if kind == "table":
                return flight.SchemaResult(self._table_schema(session, name, _columns(command)))
            session.bulk_partitions(name)  # checks the topic and the privilege
            return flight.SchemaResult(project_schema(_columns(command)))

    def _table_schema(self, session: Any, name: str, columns: list[str] | None) -> pa.Schema:
        result = session.execute(self._table_sql(name, columns) + " LIMIT 0")[-1]
        assert result.table is not None
        return result.table.schema

    @staticmethod
    def _table_sql(name: str, columns: list[str] | None) -> str:
        selected = ", ".join(_quote(c) for c in columns) if columns else "*"
        return f"SELECT {selected} FROM {_quote(name)}"

    @_flight_errors
    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        command = _command(ticket.ticket)
        kind, name = _target(command)
        columns = _columns(command)
        if kind == "table":
            with self._session_of(context) as session:
                result = session.execute(self._table_sql(name, columns))[-1]
            assert result.table is not None
            return flight.RecordBatchStream(result.table)
        try:
            offsets = OffsetRange(int(command["partition"]), int(command["start"]),
                                  int(command["end"]))  # fmt: skip
        except (KeyError, TypeError, ValueError):
            raise InvalidParameterValueError("a topic ticket needs partition, start, end") from None
        session = self.database.connect(context.get_middleware("auth").identity)
        try:
            batches = session.bulk_read(name, offsets, columns)
            first = next(batches, None)  # errors (privileges, retention) surface here
        except BaseException:
            session.close()
            raise
        return flight.GeneratorStream(project_schema(columns),
                                      self._stream(session, first, batches))  # fmt: skip

    @staticmethod
    def _stream(session: Any, first: pa.RecordBatch | None, rest: Iterator[pa.RecordBatch]
                ) -> Iterator[pa.RecordBatch]:  # fmt: skip
        try:
            if first is not None:
                yield first
            yield from rest
        finally:
            session.close()

    # -- writes -----------------------------------------------------------------------
    @_flight_errors
    def do_put(self, context: Any, descriptor: flight.FlightDescriptor,
               reader: flight.MetadataRecordBatchReader, writer: Any) -> None:  # fmt: skip
        """Refused before a batch is read (see the module's docstring): uploads go as
        ``stage`` actions."""
        raise FeatureNotSupportedError(
            'DoPut is not supported: upload Arrow IPC stream bytes with the DoAction "stage" '
            "(pyarrow would decode a put's compressed batches before any check)")  # fmt: skip

    def _stage(self, context: Any, body: pa.Buffer | None) -> dict[str, Any]:
        """Stage one ``stage`` body as a numbered part of its write (module docstring).

        Order: size cap, header, the user's INSERT privilege on the target (42501, nothing
        decoded), every IPC message bounded by ``ipc_bounds`` (54000; malformed 22P03)
        and only then decoded by pyarrow; each decoded batch's dictionary columns bounded
        before the engine sees them. A refusal stages nothing of the part (a write this
        call started is removed again while it holds no file). At most
        ``limits.FLIGHT_STAGES_MAX`` calls decode at once: past a wait of
        ``stage_wait_s`` for a turn, 53300."""
        body = body if body is not None else pa.py_buffer(b"")
        if body.size > limits.FLIGHT_STAGE_BODY_BYTES_MAX:
            raise LimitExceededError(
                f"a stage body is limited to {limits.FLIGHT_STAGE_BODY_BYTES_MAX} bytes, this "
                f"one has {body.size}: send its rows in more parts")  # fmt: skip
        head = body.slice(0, min(body.size, limits.FLIGHT_COMMAND_BYTES_MAX + 1)).to_pybytes()
        end = head.find(b"\n")
        if end < 0:
            raise InvalidParameterValueError(
                f"a stage body is a JSON header of at most {limits.FLIGHT_COMMAND_BYTES_MAX} "
                "bytes, a newline, then an Arrow IPC stream")  # fmt: skip
        header = _command(head[:end])
        _target(header)
        _key(header)
        part = header.get("part")
        last = limits.STAGED_PARTS_MAX - 1
        if not isinstance(part, int) or isinstance(part, bool) or not 0 <= part <= last:
            raise InvalidParameterValueError(
                f'a stage header needs the part number (0 to {last}) as "part"')
        data = body.slice(end + 1)
        where = f"stage {header.get('write_id')} part {part}"
        if not self._stage_turns.acquire(timeout=self.stage_wait_s):
            raise TooManyConnectionsError(
                f"{limits.FLIGHT_STAGES_MAX} stage calls are being staged and this one waited "
                f"{self.stage_wait_s:g} s for a turn: retry later")  # fmt: skip
        try:
            return self._stage_part(context, header, data, where)
        finally:
            self._stage_turns.release()

    def _stage_part(self, context: Any, header: dict[str, Any], data: pa.Buffer,
                    where: str) -> dict[str, Any]:  # fmt: skip
        """``_stage`` once the call has its turn."""
        kind, name = _target(header)
        write_id, part, stream = header.get("write_id"), header.get("part"), header.get("stream")
        mode, key = str(header.get("mode", "append")), _key(header)
        with self._session_of(context) as session:
            started = self.writes.start(session, write_id, kind, name, mode, key,
                                        create=part == 0)  # 42501 first  # fmt: skip
            try:
                try:
                    ipc_bounds.check_stream(memoryview(data), ipc_bounds.Bounds(
                        total_bytes_max=limits.FLIGHT_STAGE_DECODED_BYTES_MAX, where=where,
                        subject="a stage body",
                        metadata_bytes_max=limits.FLIGHT_COMMAND_BYTES_MAX))  # fmt: skip
                except BadCopyFormatError as error:  # malformed: 22P03, as pyarrow's refusals
                    raise InvalidBinaryDataError(str(error), where=where) from None
                reader = _open(data)
                _check_columns(reader.schema)
                missing = [k for k in key if k not in reader.schema.names]
                if missing:  # refused now, not at the commit after every part was sent
                    raise UndefinedColumnError(f"the key column {missing[0]!r} is not among "
                                               "the rows' columns")  # fmt: skip
                self.writes.start(session, write_id, kind, name, mode, key, reader.schema,
                                  create=part == 0)  # fmt: skip
                batches = _checked_batches(reader, where)
                first = next((b for b in batches if b.num_rows), None)
            except BaseException:
                if started:
                    self.writes.drop_if_empty(write_id)
                raise
            if first is None:  # a part without rows stages no file (the write is started)
                return {"rows": 0, "part": part}
            rows = self.writes.append(session, write_id, itertools.chain([first], batches),
                                      reader.schema, part, stream)  # fmt: skip
        if rows is None:
            return {"rows": 0, "part": part, "duplicate": True}
        return {"rows": rows, "part": part}

    @_flight_errors
    def do_action(self, context: Any, action: flight.Action) -> Iterator[flight.Result]:
        if action.type == "stage":
            answer = self._stage(context, action.body)
            return iter([flight.Result(pa.py_buffer(json.dumps(answer).encode()))])
        body = _command(action.body.to_pybytes() if action.body is not None else b"")
        with self._session_of(context) as session:
            answer = self._action(session, action.type, body)
        return iter([flight.Result(pa.py_buffer(json.dumps(answer).encode()))])

    def _action(self, session: Any, kind: str, body: dict[str, Any]) -> Any:
        if kind == "commit":
            write_ids = body.get("write_ids") or []
            if not isinstance(write_ids, list):
                raise InvalidParameterValueError("write_ids must be a list")
            batch_id = body.get("batch_id")
            if not isinstance(batch_id, int):
                raise InvalidParameterValueError("batch_id must be an integer")
            return self.writes.commit(session, str(body.get("sink_id") or ""), batch_id,
                                      write_ids)  # fmt: skip
        if kind == "abort":
            return {"aborted": self.writes.abort(session, body.get("write_ids") or [])}
        if kind == "list":
            return [w.__dict__ for w in self.writes.list(session)]
        if kind == "last_batch":
            return {"batch_id": self.writes.last_batch(session, str(body.get("sink_id") or ""))}
        if kind == "partitions":
            _, name = _target(body)
            return [b.__dict__ for b in session.bulk_partitions(name)]
        if kind == "commit_offsets":
            return self._commit_offsets(session, body)
        if kind == "relations":
            return self._relations(session)
        if kind == "execute":
            sql = body.get("sql")
            if not isinstance(sql, str) or not sql.strip():
                raise InvalidParameterValueError('execute needs the statement as "sql"')
            return {"tag": session.execute(sql)[-1].tag}
        raise InvalidParameterValueError(f"unknown Flight action {kind!r}")

    @staticmethod
    def _relations(session: Any) -> list[dict[str, str]]:
        """Topics and the main schema's tables and views, by name (for catalogs)."""
        topics = session.execute("SHOW TOPICS")[-1].table
        assert topics is not None
        found = [{"kind": "topic", "name": n} for n in topics.column(0).to_pylist()]
        tables = session.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
            "ORDER BY 1")[-1].table  # fmt: skip
        assert tables is not None
        return found + [{"kind": "table", "name": n} for n in tables.column(0).to_pylist()]

    @staticmethod
    def _commit_offsets(session: Any, body: dict[str, Any]) -> dict[str, Any]:
        """A consumer's offsets moved to where a pipeline's batch ended (advisory: a
        reader that does not read through the consumer only reports its progress)."""
        _, name = _target(body)
        consumer = body.get("consumer")
        offsets = _offsets(body.get("offsets"), "offsets") or {}
        if not isinstance(consumer, str) or not consumer or not offsets:
            raise InvalidParameterValueError("commit_offsets needs a consumer and offsets")
        for text in (name, consumer):
            if "`" in text:
                raise InvalidParameterValueError(f"name {text!r} may not contain a backquote")
        ranges = ", ".join(f"PARTITION {p} UPTO {o}" for p, o in sorted(offsets.items()))
        session.execute(f"COMMIT OFFSETS ON TOPIC `{name}` FOR CONSUMER `{consumer}` ({ranges})")
        return {"committed": len(offsets)}

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [("stage", "stage one part of a write: a JSON line, then Arrow IPC stream bytes"),
                ("commit", "publish staged writes exactly once"),
                ("abort", "discard staged writes"), ("list", "staged writes"),
                ("partitions", "a topic's partitions and offsets"),
                ("commit_offsets", "move a consumer's committed offsets"),
                ("last_batch", "the last batch id committed by a sink"),
                ("relations", "topics and tables"),
                ("execute", "run one SQL statement")]  # fmt: skip


def start_flight(database: Database, host: str, port: int, auth: str, *,
                 users_file: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, tls_client_ca: str | None = None,
                 **settings: Any) -> TopicbaseFlightServer:  # fmt: skip
    """Start the door (listening on return); ``server.port`` is the bound port.

    ``tls_client_ca`` (a PEM file, with TLS only): mutual TLS, a client must present a
    certificate signed by it before its TLS session opens, so before it can send any
    request (gRPC holds a request's whole message, uncapped, before Flight authenticates
    the call: the only bound on what a stranger makes the door hold)."""
    users = None
    if auth != "trust":
        users = UsersFile(users_file or default_users_path(database.path))
        error = users.reload()
        if error is not None:
            raise error
    certificates = None
    scheme = "grpc+tcp"
    if tls_cert and tls_key:
        with open(tls_cert, "rb") as cert, open(tls_key, "rb") as key:
            certificates = [(cert.read(), key.read())]
        scheme = "grpc+tls"
    client_roots = None
    if tls_client_ca:
        if certificates is None:
            raise InvalidParameterValueError("a Flight client CA needs the door's TLS "
                                             "certificate and key")  # fmt: skip
        with open(tls_client_ca, "rb") as roots:
            client_roots = roots.read()
    return TopicbaseFlightServer(database, f"{scheme}://{host}:{port}", FlightAuthenticator(users),
                                 tls_certificates=certificates, client_roots=client_roots,
                                 **settings)  # fmt: skip
