"""A session: one connection's statements and its transaction state.

States (``SessionState``): IDLE (autocommit: every statement is its own
transaction), IN_TRANSACTION (after BEGIN), FAILED (a statement failed inside
a transaction: everything but ROLLBACK/COMMIT is refused with 25P02; COMMIT
then rolls back, as PostgreSQL does).

Commit of a transaction (``_commit``; the protocol is ``engine.commit``'s):
stage the topic writes, write the commit record into the session's DuckDB
transaction while staging syncs, then validate (every consumer range read must
still start at the committed offset it was read from, and leases must still be
held, else 40001 and nothing changes) and COMMIT in DuckDB: the commit point.
Then the catalog mirror moves and the staged writes are published, in commit
order.

BEGIN opens no DuckDB transaction: the first statement of the transaction that
needs DuckDB does (``Session.cursor``: any table read or write, a catalog or
privilege look-up that misses the cache, a ``sys.`` view, a registered topic
read). DuckDB takes the snapshot at that statement, as it did when BEGIN opened
the DuckDB transaction at once (DuckDB's snapshot starts at a transaction's first
statement, as a PostgreSQL REPEATABLE READ snapshot starts at the first statement
after BEGIN). A transaction that never needs DuckDB (topic->topic moves, consumer
reads, offset commands) commits in the staging log alone, with no DuckDB
statement at all.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter, itemgetter
from typing import Any

import pyarrow as pa

from engine import (
    commit_cpu,
    deltas,
    describe,
    grants,
    introspection,
    key_lookup,
    literal_plans,
    prepared_room,
    privilege_cache,
    privileges,
    sandbox,
    spread_append,
    streams,
    tables,
    write_statements,
)
from engine.commit import PastCommitPoint, PublishItem, route_writes
from engine.ddl import run_alter, run_create, run_drop
from engine.identity import LOCAL_SUPERUSER, Identity
from engine.interrupts import front_checked, sigint_deferred
from engine.kept_plans import KeptPlans
from engine.lookup_plans import KeptLookupPlans
from engine.moved_refs import MovedRange, MovedSource, moved_batch
from engine.offset_reset import check_commit_ranges, set_consumer_offsets
from engine.reads import CURRENT_PROGRESS, ReadProgress, read_records, stream_records
from engine.result import Result, Rows
from engine.staged_writes import TransactionStaging
from engine.transaction import PendingWrite, SessionState, Transaction
from engine.writes import build_batches, explain_lines, plain_batches, table_from_rows
from grammar import ast
from grammar import settings as rules
from grammar.bounded_cache import TEXT_COST_PER_CHAR, BoundedCache
from grammar.parse import parse
from grammar.settings import RETURNING_COLUMNS
from grammar.text_cache import text_cache
from planner import planner
from planner.catalog import SessionCatalog
from planner.duckdb_sql import counter_update
from planner.operations import (
    AlterTopicEntry,
    AppendRecords,
    ChangePrivileges,
    CommitConsumerOffsets,
    CreateTopicEntry,
    DropTopicEntry,
    Introspect,
    Plan,
    ReadRecords,
    RunQuery,
    SetConsumerOffsets,
    SwitchRole,
    TransactionControl,
    UpsertCheck,
)
from storage import limits
from storage.errors import (
    ActiveSqlTransactionError,
    CardinalityViolationError,
    InFailedTransactionError,
    InvalidParameterValueError,
    LimitExceededError,
    ObjectInUseError,
    QueryCanceledError,
    SerializationFailure,
    TopicbaseError,
)

_session_ids = itertools.count(1)
DML_TAGS = ("INSERT", "UPDATE", "DELETE", "MERGE")
# Statements that never change DuckDB's schema; any other may (``_schema_may_change``).
_SCHEMA_KEEPING_TAGS = (*DML_TAGS, "SELECT", "EMPTY", "SHOW", "DESCRIBE", "EXPLAIN")
PARSE_CACHE_ENTRIES = 512
# Statements that cannot change how a table name resolves (kept delta plans stay valid).
_PLAIN_TAGS = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE", "MERGE"})


class Session:
    def __init__(self, database: Any, identity: Identity = LOCAL_SUPERUSER) -> None:
        self.database = database
        self.identity = identity
        self.session_id = next(_session_ids)
        # The DuckDB connection of this session; ``cursor`` hands it out, opening an
        # explicit transaction's DuckDB transaction first (``_open_duckdb_transaction``).
        self._cursor = database.root.cursor()
        self.state = SessionState.IDLE
        self.transaction: Transaction | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._leftover_views: list[str] = []
        self._cancel_requested = False
        # A front's statement-bearing message (``message_arrived``): when it came (monotonic
        # time; None outside one), whether a ``statement_timeout`` counted from it already,
        # and when the last ``cancel`` came. A cancel since the arrival is the message's.
        self._arrived_at: float | None = None
        self._arrival_timed = False
        self._cancelled_at = 0.0
        self._cancel_lock = threading.Lock()
        # The front waits for its client's next bytes (``client_wait``): a cancel now is
        # dropped, as PostgreSQL ignores one while it reads a command.
        self._waiting_on_client = False
        # The thread this session's transaction pinned to the commit CPU (``engine.
        # commit_cpu``: from its first statement that is not a plain query to its end).
        self._commit_cpu_tid: int | None = None
        self._stream_open = False
        # Topic messages and bytes the running statement has read (a console's progress).
        self.read_progress = ReadProgress()
        # The SQL-level PREPAREs, kept as text (``engine.prepared_room``).
        self.sql_statements = prepared_room.SqlStatements()
        # Plans of prepared parameterless SELECTs of literals (``answer_literal``).
        self._literal_plans = literal_plans.KeptLiteralPlans()
        # The counter-upsert shortcut (``_upsert_by_update``): the UPDATE for each upsert
        # text, with the schema generation it was worked out at; the generation this
        # transaction's snapshot was taken at (None: unknown); whether this transaction
        # ran DDL; whether a schema change's commit is under way (``tables.SchemaGenerations``).
        # Bounded in bytes (``BoundedCache``, in the process-wide budget): an upsert text
        # may be megabytes.
        self._upserts = BoundedCache("engine.session.upserts", PARSE_CACHE_ENTRIES)
        self._schema_basis: int | None = None
        self._changed_schema = False
        self._schema_change_open = False
        # Counter deltas (``engine.deltas``): each upsert text's delta plan (None: not one)
        # with the schema generation it was worked out at.
        self._delta_plans = BoundedCache("engine.session.delta_plans", PARSE_CACHE_ENTRIES)
        # Whether this session's unqualified names still resolve as on a fresh connection
        # (no SET, no temporary relation: ``key_lookup.keeps_names``), which the key
        # lookups' indexes assume; None: to be found again (``key_lookup.names_plain``).
        self._names_plain: bool | None = True
        # What the door found of this session's names while they are not plain
        # (``privileges._names_fact``), and the count of statements that may have
        # changed how they resolve since the session began.
        self.names_facts: dict[tuple[Any, ...], Any] = {}
        self.names_epoch = 0
        # Plans of prepared lookups answered from an index (``answer_lookup``).
        self._lookup_plans = KeptLookupPlans()
        # Plans of the statements it repeats, while the topics stay as they are.
        self._kept_plans = KeptPlans()
        # The door's decisions on those plans (``privileges.check_plan``'s memo, asked by
        # ``_guard`` before both checks). Invariant: filled only by ``_guard``, through
        # ``privileges.check_plan``, after ``sandbox.check_plan`` let the same plan through
        # for the same identity object, so a decision kept here is both checks'.
        self.door_memo = BoundedCache("engine.session.door_memo", limits.DOOR_DECISIONS_MAX)

    # -- entry points -------------------------------------------------------------------
    def execute(self, sql: str, parameters: Any = None) -> list[Result]:
        """Run every statement of ``sql``; returns one result per statement.

        A script that does not parse runs not at all; inside a transaction it
        fails the transaction, as any failed statement does.
        """
        try:
            statements = _parse_cached(sql)
        except TopicbaseError:
            with self._lock:
                if self.state is SessionState.IN_TRANSACTION:
                    self.state = SessionState.FAILED
            raise
        return [self.execute_statement(s, parameters) for s in statements]

    def refresh_identity(self, superuser_of: Callable[[str], bool | None]) -> None:
        """Derive the session's identities again after the users file changed
        (``grants.refresh_roles``: a demoted superuser is demoted here, a SET ROLE or SET
        SESSION AUTHORIZATION it made as one is undone); RoleRemovedError if the user it
        logged in as is no longer known."""
        with self._lock:
            grants.refresh_roles(self, superuser_of)

    def settled_identity(self) -> Identity:
        """The session's identity once a SET ROLE of a transaction that ended without
        committing is undone (``privileges.settled_identity``): what its next statement
        is judged as, and what a front reports (``is_superuser``) right after a ROLLBACK."""
        if not privileges.role_undo.data:  # no SET ROLE pending undo anywhere: no lock
            return self.identity
        with self._lock:
            return privileges.settled_identity(self)

    def cancel(self) -> None:
        """Cancel the running statement from another thread (57014): a DuckDB
        query is interrupted, a long-polling topic read stops waiting. Between a front's
        ``message_arrived`` and ``message_done`` it is the message's: a statement of it that
        starts later ends with 57014 before any work (round 28, H5)."""
        with self._cancel_lock:
            if self._waiting_on_client:
                return  # nothing of this session runs: dropped (``client_wait``)
            self._cancelled_at = time.monotonic()
            self._cancel_requested = True
        tables.interrupt(self._cursor)
        self.database.wake_readers()

    def message_arrived(self) -> None:
        """A front holds a whole message that carries statements (the wire's Query, or the
        first of Parse/Bind/Describe/Execute before a Sync) and starts its own work on it
        (decoding, splitting, rewriting: seconds for megabytes). From now until
        ``message_done`` a ``cancel`` is not cleared by a statement's start, and the first
        ``statement_time_left`` counts from now, as PostgreSQL counts ``statement_timeout``
        from a statement's arrival. Invariant: only the session's own thread calls it."""
        self._arrived_at = time.monotonic()
        self._arrival_timed = False

    def message_done(self) -> None:
        """The message of ``message_arrived`` was answered: a later cancel (while the
        session idles) is dropped at the next statement's start, as before."""
        self._arrived_at = None

    def client_wait(self, waiting: bool) -> None:
        """The front starts (True) or ends (False) waiting for its client's next bytes.
        A ``cancel`` while it waits is dropped, even inside a message begun before (an
        extended-protocol flight whose client sent Execute and Flush and now idles before
        its Sync): PostgreSQL ignores a cancel that comes while it reads a command, so a
        later statement of the flight is not ended by it. Invariant: nothing of this
        session runs while the front waits (the front runs its statements itself)."""
        with self._cancel_lock:
            self._waiting_on_client = waiting

    def statement_time_left(self, timeout_s: float, *, consume: bool = True) -> float:
        """Seconds left of ``timeout_s`` for the statement starting now: the first one of
        the current message counts from the message's arrival (the front's own work on it
        included), any later one (a Query's second statement, a second Execute) from now,
        as PostgreSQL 13+ does. <= 0: the statement's time is up before it starts.
        ``consume=False``: the arrival stays for the statement's next try (a stream that
        may hand the statement back to the ordinary path)."""
        arrived = self._arrived_at
        if arrived is None or self._arrival_timed:
            return timeout_s
        self._arrival_timed = consume
        return timeout_s - (time.monotonic() - arrived)

    def _statement_starts(self, *, cancellable: bool = True) -> None:
        """Clear the cancel flag at a statement's start unless the cancel came since the
        current message arrived (``message_arrived``): then the flag stays, and the
        statement's front ends with 57014 before any work (``front_checked``). A statement
        that is not ``cancellable`` (a ROLLBACK: it must undo) always clears it."""
        if not self._cancel_requested:
            return
        with self._cancel_lock:
            arrived = self._arrived_at
            if cancellable and arrived is not None and self._cancelled_at >= arrived:
                return
            self._cancel_requested = False

    def _cancel_kept(self) -> bool:
        """Whether a cancel of the current message is pending (``_statement_starts``
        would keep it): a fast path then leaves the statement to the ordinary one."""
        arrived = self._arrived_at
        return self._cancel_requested and arrived is not None and self._cancelled_at >= arrived

    def begin_front_read(self) -> None:
        """A front starts reading through the engine outside ``execute`` (the wire's COPY
        range reads): a cancel from now on is this read's (``cancel_requested``), and so is
        one that came since the current message arrived (``_statement_starts``)."""
        self._statement_starts()

    @property
    def cancel_requested(self) -> bool:
        """Whether ``cancel`` was called since the running statement (or front read) began."""
        return self._cancel_requested

    def execute_statement(self, statement: ast.Statement, parameters: Any = None) -> Result:
        if isinstance(statement, ast.CommitWrites | ast.AbortWrites):
            # Outside the lock: a publish runs its own BEGIN and COMMIT through here.
            if self._closed:
                raise InvalidParameterValueError("the session is closed")
            plan = planner.plan(statement, self.planning_catalog)
            return write_statements.run(self, plan)
        with self._lock:
            if self._closed:
                raise InvalidParameterValueError("the session is closed")
            self._require_no_stream()
            self._statement_starts(cancellable=not isinstance(statement, ast.Rollback))
            self.read_progress.reset()
            token = CURRENT_PROGRESS.set(self.read_progress)
            try:
                return self._execute(statement, parameters)
            finally:
                CURRENT_PROGRESS.reset(token)
                if self._schema_change_open:  # its commit (or rollback) has ended
                    self._schema_change_open = False
                    tables.SCHEMA_GENERATIONS.changed()

    def answer_literal(self, statement: ast.Statement) -> Result | None:
        """``execute_statement`` of an autocommit parameterless SELECT of literals whose row
        is kept (``tables.literal_result``), or None: nothing ran, and the caller runs the
        statement through ``execute_statement`` as ever (which reports any error, and keeps
        the row of a text it runs for the first times).

        What ``execute_statement`` does for such a statement, less its general steps that
        do nothing for it (no transaction is begun and committed: the statement reads
        nothing of the database or the session, ``Session._run``'s literal way): the
        plan is kept per statement (``engine.literal_plans``: it depends on the text
        alone), and the door judges every call, as there (``_guard``: the sandbox and
        privileges, or its kept decision on the plan); a refusal is left to
        ``execute_statement`` to report. Only outside a transaction,
        with no stream open, on an open session."""
        if type(statement) is not ast.SqlStatement:
            return None
        with self._lock:
            if (self._closed or self._stream_open or self.state is not SessionState.IDLE
                    or self.transaction is not None):  # fmt: skip
                return None
            plan = self._literal_plans.plan(statement, lambda: self.planning_catalog)
            if plan is None:
                return None
            operation = plan.operations[0]  # a literal SELECT's one (``literal_operation``)
            assert isinstance(operation, RunQuery)
            table = tables.kept_literal_result(operation.sql)
            if table is None:
                return None  # the ordinary way runs it (and keeps its row)
            try:
                self._guard(plan, kept=True)  # a kept literal plan: the same object each run
            except TopicbaseError:
                return None  # ``execute_statement`` refuses it, with the same error
            if self._cancel_kept():
                return None  # ``execute_statement`` ends it (57014)
            self._cancel_requested = False
            self.read_progress.reset()
            result = _query_result(operation, table)
            result.kept = True
            return result

    def describe(self, statement: ast.Statement) -> describe.Description:
        """Parameter types and result columns of ``statement``, without running it.

        Nothing changes: no transaction starts or fails, nothing is read or written (see
        ``engine.describe``). A failed transaction refuses it (25P02), as it refuses
        every statement but ROLLBACK and COMMIT.
        """
        with self._lock:
            if self._closed:
                raise InvalidParameterValueError("the session is closed")
            self._require_no_stream()
            if self.state is SessionState.FAILED and not isinstance(
                statement, ast.Rollback | ast.Commit
            ):
                raise InFailedTransactionError(
                    "current transaction is aborted, commands ignored until end of "
                    "transaction block"
                )
            self._statement_starts()
            with front_checked(self._cancelled):  # one parse; a cancel ends it (57014)
                plan = planner.plan(statement, self.planning_catalog)
                self._guard(plan)
            # Queries that only project topic reads bind against their stand-ins alone (no
            # table is read): describing them opens no DuckDB transaction (``cursor``).
            cursor = self._cursor if _reads_no_table(plan) else self.cursor
            last = plan.operations[-1] if plan.operations else None
            executed = isinstance(last, RunQuery) and last.tag == "EXECUTE"
            # An EXECUTE binds against its kept statement, held by DuckDB for the bind alone.
            with (self.sql_statements.executing(cursor, last.sql) if executed
                  else contextlib.nullcontext()):  # fmt: skip
                return describe.describe_plan(plan, statement, cursor, self.database, self)

    def catalog_version(self) -> int | None:
        """DuckDB's catalog version on this session's connection (``tables.catalog_version``;
        None where DuckDB does not tell). ``describe`` keeps a statement's description
        while it stays where it was (``engine.describe``), and so may a front that asks
        again for a statement it already ran."""
        with self._lock:
            return tables.catalog_version(self._cursor)

    def open_stream(
        self,
        statement: ast.Statement,
        parameters: Any = None,
        *,
        no_rows: TopicbaseError | None,
        timeout_s: float | None = None,
    ) -> streams.RowStream | None:
        """Start ``statement`` and return its rows as a stream of bounded batches, or None
        if it is not a plain query (the caller then runs it whole, as any statement).

        A plain query (one DuckDB query, over tables and over peeks of topics: no consumer
        read, no write) is planned and checked (sandbox, privileges) as every statement is,
        then read through DuckDB's batch reader; each topic it peeks at is handed to DuckDB
        as a reader of the statement's whole cut (``reads.stream_records``), so a topic of
        any size streams. ``no_rows`` is raised before anything runs for a write without
        RETURNING (with None, such a write is left to the caller too). Past ``timeout_s``
        the read is cancelled (57014). The stream must be closed before the session runs
        anything else.
        """
        if no_rows is None and not _looks_like_a_query(statement):
            return None  # a write or a command: not planned twice (the caller runs it)
        try:
            return self._open_stream(statement, parameters, no_rows, timeout_s)
        except BaseException:  # any error fails an open transaction (25P02), a
            if self.state is SessionState.IN_TRANSACTION:  # MemoryError too
                self.state = SessionState.FAILED
            raise

    def _open_stream(self, statement: ast.Statement, parameters: Any,
                     no_rows: TopicbaseError | None, timeout_s: float | None
                     ) -> streams.RowStream | None:  # fmt: skip
        """``open_stream`` (see there), its errors not yet failing the transaction.

        ``timeout_s`` covers the planning and the door too (a timer of its own, ended when
        they are): their work ends with 57014 at a cancel or the timeout
        (``engine.interrupts.front_checked``); the read's own timer starts after them."""
        with self._lock:
            if self._closed:
                raise InvalidParameterValueError("the session is closed")
            self._statement_starts()
            started = time.monotonic()
            front_s = self.statement_time_left(timeout_s, consume=False) if timeout_s else None
            if front_s is not None and front_s <= 0:
                raise QueryCanceledError("canceling statement due to statement timeout")
            front = None if front_s is None else streams.Deadline(front_s, self.cancel)
            try:
                with front_checked(self._cancelled):
                    plan = self._plain_query_plan(statement)
                    if plan is None:
                        return None
                    operation = plan.operations[-1]
                    assert isinstance(operation, RunQuery)
                    if operation.tag in DML_TAGS and not operation.returns_rows:
                        if no_rows is None:
                            return None
                        raise no_rows
                    if not _streamable(operation) or self._lists_prepared(operation):
                        return None
                    self._guard(plan)
            except QueryCanceledError as error:
                if front is not None and front.fired.is_set():
                    raise QueryCanceledError(
                        "canceling statement due to statement timeout"
                    ) from error
                raise
            finally:
                if front is not None:
                    front.cancel()
            self._check_duration()
            self._arrival_timed = True  # streamed: the message's timed statement is this one
            self._cancel_requested = False
            # The read gets what is left of the statement's time (the arrival's share and
            # the planning spent), not a whole ``statement_timeout`` of its own.
            read_s = None if front_s is None else front_s - (time.monotonic() - started)
            if read_s is not None and read_s <= 0:
                raise QueryCanceledError("canceling statement due to statement timeout")
            answered = self._key_answer(plan, parameters, read_s)
            if answered is not None:
                return streams.answered(
                    answered.result, answered.duckdb_types, operation.column_names
                )
            if len(plan.operations) == 1 and self._literal(operation):
                return self._literal_stream(plan, operation, parameters)
            peeks = self._register_peeks(plan, parameters)
            self._stream_open = True
        deadline = None if read_s is None else streams.Deadline(read_s, self.cancel)
        self._cancel_requested = False
        return streams.duckdb_stream(
            self.cursor,
            operation.sql,
            parameters if operation.uses_parameters else None,
            statement_line_offset(plan),
            deadline,
            on_error=lambda: self._stream_failed(peeks),
            on_close=lambda: self._stream_closed(peeks),
            names=operation.column_names,
        )

    def _literal_stream(self, plan: Plan, operation: RunQuery, parameters: Any
                        ) -> streams.RowStream:  # fmt: skip
        """A SELECT of literals and parameters alone (``_query_cursor``) streamed: run on
        the thread's empty database and read whole there (a row; the connection is the
        thread's, so nothing of it stays open; kept by text without parameters:
        ``tables.literal_stream_result``), then offered as DuckDB's stream would
        offer it (``streams.answered``: the same names, types and rows). An error fails an
        open transaction, as a stream's does."""
        bound = parameters if operation.uses_parameters else None
        try:
            with tables.translated(statement_line_offset(plan)):
                result, duckdb_types = tables.literal_stream_result(
                    operation.sql, bound, streams.BATCH_ROWS
                )
        except BaseException:
            if self.state is SessionState.IN_TRANSACTION:
                self.state = SessionState.FAILED
            raise
        return streams.answered(result, duckdb_types, operation.column_names)

    def _plain_query_plan(self, statement: ast.Statement) -> Plan | None:
        """The plan of a statement that may be read straight from DuckDB: peeks of topics
        (no consumer: nothing to commit) and then one query."""
        if not isinstance(statement, ast.SqlStatement):
            return None
        if self.state is SessionState.FAILED:
            return None  # the ordinary path reports 25P02
        try:
            plan = planner.plan(statement, self.planning_catalog)
        except QueryCanceledError:
            raise  # a cancel or the timeout ended the planning (``engine.interrupts``)
        except TopicbaseError:
            return None  # the ordinary path reports it as it reports any statement
        *reads, last = plan.operations
        peeks_only = all(isinstance(r, ReadRecords) and r.consumer is None for r in reads)
        if plan.explain_only or not peeks_only or not isinstance(last, RunQuery):
            return None
        return plan

    def _register_peeks(self, plan: Plan, parameters: Any) -> list[str]:
        """Each topic peek of ``plan`` as a reader DuckDB scans batch by batch."""
        names: list[str] = []
        try:
            for read in plan.operations[:-1]:
                assert isinstance(read, ReadRecords)
                read = _bind_read_options(read, parameters, self.database)
                reader = stream_records(
                    read, self.database.topic_log(read.topic_id), self.database.clock,
                    self.database.publish_lock,
                )  # fmt: skip
                tables.register(self.cursor, read.placeholder, reader)
                names.append(read.placeholder)
        except BaseException:
            self._unregister(names)
            raise
        return names

    def _unregister(self, names: list[str]) -> None:
        for name in names:
            try:
                tables.unregister(self._cursor, name)
            except TopicbaseError:
                self._leftover_views.append(name)  # dropped by the rollback

    def _stream_failed(self, peeks: list[str]) -> None:
        with self._lock:
            self._stream_open = False
            self._unregister(peeks)
            if self.state is SessionState.IN_TRANSACTION:
                self.state = SessionState.FAILED

    def _stream_closed(self, peeks: list[str]) -> None:
        self._stream_open = False
        self._unregister(peeks)

    def _require_no_stream(self) -> None:
        if self._stream_open:
            raise ObjectInUseError(
                "a streamed result of this session is still open; close it first"
            )

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self.state is not SessionState.IDLE:
                self._rollback()
            self.database.leases.leave_session(self.session_id)
            self._closed = True
            self._cursor.close()

    # -- the DuckDB connection, and the lazy DuckDB transaction --------------------------
    @property
    def cursor(self) -> Any:
        """This session's DuckDB connection, for a statement that uses DuckDB.

        Inside an explicit transaction the first use opens the DuckDB transaction
        (``_open_duckdb_transaction``): BEGIN itself opens none, so a transaction whose
        statements never reach DuckDB (topic reads and writes, offset commands) commits
        in the staging log alone without a DuckDB BEGIN or COMMIT. Everything that runs
        SQL on the session's connection in a transaction gets it here, so every such
        statement runs in the transaction; only cancel, rollback, close and the removal
        of registered relations use the connection without opening one.
        """
        transaction = self.transaction
        if transaction is not None and transaction.explicit:
            if not transaction.duckdb_open:
                if transaction.deltas:
                    self._flush_deltas(transaction)  # opens the DuckDB transaction
                else:
                    self._applier.wait_visible(self._cancelled)  # before its snapshot
                    self._open_duckdb_transaction(transaction)
        else:
            applier = self._applier
            if applier.pending:
                applier.wait_visible(self._cancelled)  # every delta committed before it
        return self._cursor

    @property
    def _applier(self) -> deltas.DeltaApplier:
        return self.database.committer.deltas

    def _cancelled(self) -> bool:
        """Whether the running statement was cancelled (a wait for the applier ends: 57014)."""
        return self._cancel_requested

    def _open_duckdb_transaction(self, transaction: Transaction) -> None:
        """Open the DuckDB transaction of ``transaction``; for an explicit one, note what
        its snapshot may be compared with.

        DuckDB takes a transaction's snapshot at its first statement that reads the
        database, not at BEGIN (as PostgreSQL's REPEATABLE READ snapshot starts at the
        first statement after BEGIN): opened here, just before the first statement that
        needs it, the snapshot is taken by that statement, as it was when BEGIN opened the
        DuckDB transaction at once. Taken before BEGIN (so before the snapshot): the
        privilege cache's generation (``engine.privilege_cache``: what this transaction
        reads of owners and grants may be cached only while it has not moved) and the
        schema generation (``_schema_basis``, checked again by ``_upsert_by_update``
        around its own statement, which may be the one that takes the snapshot).
        """
        assert not transaction.duckdb_open
        if not transaction.explicit:
            tables.run(self._cursor, "BEGIN TRANSACTION")
            transaction.duckdb_open = True
            return
        generation = privilege_cache.generation_now(self.database)
        schema_basis = tables.SCHEMA_GENERATIONS.stable()
        tables.run(self._cursor, "BEGIN TRANSACTION")
        transaction.duckdb_open = True
        transaction.privilege_generation = generation
        after = tables.SCHEMA_GENERATIONS.stable()
        self._schema_basis = schema_basis if schema_basis == after else None

    # -- planning: topics by name, as the planner sees them from this session ------------
    @property
    def planning_catalog(self) -> SessionCatalog:
        """The database's topics plus this session's DuckDB relations, which win over a
        topic of the same name in a plain ``FROM name`` (``planner.relations``)."""
        return SessionCatalog(self.database, self._has_duckdb_relation)

    def _has_duckdb_relation(self, name: str) -> bool:
        """A table or view ``name`` (case-insensitive; in a ``main`` schema, temporary
        ones included, or DuckDB's ``pg_catalog``) this session's DuckDB connection
        sees, in its transaction."""
        # A constant query, compared here: a bound parameter makes DuckDB's catalog
        # functions several times slower.
        tables.run(self.cursor, _DUCKDB_RELATIONS_SQL)
        wanted = name.lower()
        return any(str(row[0]).lower() == wanted for row in self.cursor.fetchall())

    # -- dispatch -----------------------------------------------------------------------
    def _execute(self, statement: ast.Statement, parameters: Any) -> Result:
        if self.state is SessionState.FAILED and not isinstance(
            statement, ast.Rollback | ast.Commit
        ):
            raise InFailedTransactionError(
                "current transaction is aborted, commands ignored until end of transaction block"
            )
        self._check_duration()
        statement = prepared_room.typed_statement(statement)  # PREPARE p(int): casts
        try:
            with front_checked(self._cancelled):  # one parse; a cancel ends it (57014)
                plan = self._kept_plans.plan(statement, self.database, self._has_duckdb_relation)
                self._guard(plan, kept=self._kept_plans.holds(statement, plan))
        except TopicbaseError:
            if self.state is SessionState.IN_TRANSACTION:
                self.state = SessionState.FAILED
            raise
        if plan.explain_only:
            return Result("EXPLAIN", pa.table({"plan": explain_lines(plan, self.database)}))
        if isinstance(statement, ast.Begin | ast.Commit | ast.Rollback):
            return self._transaction_control(plan)
        autocommit = self.state is SessionState.IDLE
        if not key_lookup.keeps_names(plan):
            self.names_epoch += 1  # the door's facts of names are found again
        if key_lookup.names_may_change(plan, self._names_plain):
            self._names_plain = None  # found again at the next lookup (``_key_answer``)
        if autocommit:
            if _plain_append_plan(plan):
                written = self._append_plain_now(plan.operations[0], parameters)
                if written is not None:
                    return written
            answered = self._key_lookup(plan, parameters)
            if answered is not None:
                return answered
            self.transaction = Transaction(explicit=False)
        assert self.transaction is not None
        if any(isinstance(o, RunQuery) and o.tag not in _PLAIN_TAGS for o in plan.operations):
            self._delta_plans.clear()  # SET search_path, EXECUTE, DDL: names may resolve anew
        try:
            if not autocommit and self._keep_delta(plan, parameters):
                return Result("INSERT 0 1")
        except BaseException:
            self.state = SessionState.FAILED
            raise
        if self._commit_cpu_tid is None and commit_cpu.opens_window(plan):
            self._commit_cpu_tid = self.database.commit_cpu.enter()  # left at its end
        self.transaction.note_plan(plan)
        changes = self.transaction.tables_changed if autocommit else frozenset()
        try:
            if self.transaction.touches_tables and not self.transaction.delta_writer:
                self._begin_writer(self.transaction)
            # An autocommit statement's DuckDB commit is inside it: bracketed for the key
            # lookups' indexes (``key_lookup.changing_tables``), as an explicit COMMIT is.
            with key_lookup.changing_tables(changes):
                if (
                    autocommit
                    and self.transaction.touches_tables
                    and (_moves_topics(plan) or _checks_upserts(plan))
                ):
                    # its table writes must commit with its offset moves / topic writes,
                    # or be undone when its upsert turns out to affect a row twice
                    # (``_row_affected_twice``, raised after DuckDB ran it): one DuckDB
                    # transaction from the start, committed by ``_commit`` (or rolled
                    # back below)
                    self._open_duckdb_transaction(self.transaction)
                result = self._run(plan, parameters)
                if autocommit:
                    self._commit()
            return result
        except BaseException:
            if autocommit:
                self._rollback()
            else:
                self.state = SessionState.FAILED
            raise

    def _append_plain_now(self, operation: AppendRecords, parameters: Any) -> Result | None:
        """An autocommit ``INSERT INTO TOPIC`` of plain rows (``_plain_append_plan``),
        planned and checked, appended straight through ``spread_append.append_plain``
        (combined with other sessions' while the topic is busy); None: not such rows
        (their values not all bytes or text, too many, a topic that is throttled or
        split), nothing written, and the caller runs the statement the usual way.

        The same steps the usual way takes for it (``_run`` -> ``_append``: the rows
        bound, ``append_plain``, ``INSERT 0 n``), less the autocommit transaction around
        them: such a write moves no offset, stages nothing and touches no table, so its
        ``_commit`` had nothing to commit. An error rolls back as there (``_rollback``:
        leftover views are dropped, the session stays idle)."""
        assert operation.rows is not None
        if len(operation.rows) > limits.COMBINE_MESSAGES_MAX:
            return None  # append_plain's refusal, known before the rows are bound
        try:
            rows = _bind_rows(operation.rows, parameters)
            written = spread_append.append_plain(
                self.database, operation.topic_id, operation.columns or ("data",), rows)
        except BaseException:
            self._rollback()
            raise
        return None if written is None else Result(f"INSERT 0 {written}")

    def append_prepared(self, statement: ast.Statement, parameters: Any) -> Result | None:
        """``execute_statement`` of an autocommit ``INSERT INTO TOPIC ... VALUES`` of plain
        rows whose plan this session keeps (``kept_plans``: planned by an earlier run of
        the same statement object, no topic created or dropped since), or None: nothing
        ran, and the caller runs the statement through ``execute_statement`` as ever
        (which reports any error). The wire's prepared INSERT flight asks it first
        (``sql.pgwire.connection.insert_flight``; docs/durable_produce.md round 29).

        What ``execute_statement`` and ``_execute`` do for such a statement, less their
        steps that do nothing for it: the door judges every call as there (``_guard`` on
        the kept plan: the sandbox and privileges, or the decision kept on it while
        nothing it was made of changed: ``privileges.kept_decision``, re-taken after a
        GRANT, REVOKE, DROP or role change), a refusal raised as there; the rows go to
        ``_append_plain_now`` as there. Skipped, being no-ops here: the failed-state and
        duration checks (idle: no transaction), PREPARE's typed parameters (not SQL
        text), the front's cancel scope (nothing is parsed or planned), the names' epoch
        (an append keeps them: asserted). Only outside a transaction, with no stream
        open, on an open session, and without a cancel kept for the message (the
        ordinary path then ends the statement with 57014)."""
        with self._lock:
            if (self._closed or self._stream_open or self.state is not SessionState.IDLE
                    or self._cancel_kept()):  # fmt: skip
                return None
            plan = self._kept_plans.kept(statement, self.database)
            if plan is None or not _plain_append_plan(plan):
                return None
            assert key_lookup.keeps_names(plan) and not key_lookup.names_may_change(
                plan, self._names_plain), "an append changes no name"  # fmt: skip
            self._statement_starts()
            self._guard(plan, kept=True)
            return self._append_plain_now(plan.operations[0], parameters)

    def _key_lookup(self, plan: Plan, parameters: Any, *, build: bool = True) -> Result | None:
        """``_key_answer`` as the statement's ``Result``."""
        answered = self._key_answer(plan, parameters, build=build)
        if answered is None:
            return None
        operation = plan.operations[0]
        assert isinstance(operation, RunQuery)
        return _query_result(operation, answered.result)

    def answer_lookup(self, statement: ast.Statement, parameters: Any = None) -> Result | None:
        """``execute_statement`` of an autocommit primary-key lookup, when its table's index
        answers it (``engine.key_lookup``); None: nothing ran, and the caller runs the
        statement through ``execute_statement`` as ever (which reports any error).

        What ``execute_statement`` does for such a statement, less its general steps that
        do nothing for it: the plan is kept per statement (``engine.lookup_plans``: while
        no topic is created or dropped), and the door judges every call, as there
        (``_guard``: the sandbox and privileges, or its kept decision on the plan:
        ``privileges.kept_decision``); a refusal is left to ``execute_statement`` to report.
        The answer itself comes by the plan's kept way (``key_lookup.KeptWay``) when it
        can, else by ``_key_lookup`` as ``execute_statement`` asks it. Only outside a
        transaction, with no stream open, on an open session."""
        if not isinstance(statement, ast.SqlStatement) or statement.topic_scans:
            return None
        with self._lock:
            if self._closed or self._stream_open or self.state is not SessionState.IDLE:
                return None
            kept = self._lookup_plans.plan(statement, self.database, self)
            if kept is None:
                return None
            plan, way = kept
            try:
                self._guard(plan, kept=way is not None)
            except TopicbaseError:
                return None  # ``execute_statement`` refuses it, with the same error
            if self._cancel_kept():
                return None  # ``execute_statement`` ends it (57014)
            self._cancel_requested = False
            self.read_progress.reset()
            if way is not None and self._may_look_up():
                rows = way.answer(self.database, parameters)
                if rows is not None:  # as ``_query_result`` makes it of the same rows
                    return Result("SELECT 1" if rows.rows else "SELECT 0", rows)
            # Only from an index that stands: the ordinary way, which runs it otherwise,
            # asks again and counts the lookup towards a build (once).
            return self._key_lookup(plan, parameters, build=False)

    def discard_temporary(self) -> None:
        """Drop this session's temporary tables and views (PostgreSQL's ``DISCARD TEMP``,
        part of ``DISCARD ALL``): a pooled connection's next client finds none of them.
        Outside a transaction only; relations registered for topic reads are not these."""
        assert self.state is SessionState.IDLE
        cursor = self.cursor
        rows = tables.fetch_rows(
            cursor,
            "SELECT 'TABLE', table_name FROM duckdb_tables() WHERE temporary UNION ALL "
            "SELECT 'VIEW', view_name FROM duckdb_views() WHERE temporary AND NOT internal",
            None,
        )
        registered = tables.registered_names(cursor)
        for kind, name in rows:
            if name not in registered:
                quoted = '"' + str(name).replace('"', '""') + '"'
                tables.run(cursor, f"DROP {kind} IF EXISTS temp.main.{quoted}")
        self._names_plain = None
        self.names_epoch += 1

    def names_resolve_plainly(self) -> bool:
        """Whether this session's unqualified names resolve as a fresh connection's
        (DuckDB's default ``search_path`` and schema, no temporary table or view):
        then a name means ``main``'s relation and the door checks it alone
        (``engine.privileges``). Found once after any statement that may change it
        (``key_lookup.names_may_change``); while a relation is registered for a
        statement's topic reads the answer is False and not kept."""
        if self._names_plain is None:
            if self._leftover_views or tables.has_registered(self.cursor):
                return False
            self._names_plain = key_lookup.names_plain(self.cursor)
        return bool(self._names_plain)

    def _may_look_up(self) -> bool:
        """``_key_answer``'s conditions on the session (an autocommit statement, planned
        and checked, of the lookup shape): no leftover views, no relation registered on
        its connection, names that resolve as the index's build resolves them. Takes the
        ``cursor`` as every read takes it (where a read waits for writes committed but
        not yet in DuckDB)."""
        if self.state is not SessionState.IDLE or self._leftover_views:
            return False
        if tables.has_registered(self.cursor):
            return False
        return self.names_resolve_plainly()

    def _key_answer(
        self, plan: Plan, parameters: Any, timeout_s: float | None = None, *, build: bool = True
    ) -> key_lookup.Answer | None:
        """An autocommit primary-key lookup answered from the table's index of committed
        rows (``engine.key_lookup``), already planned and checked; None: DuckDB runs it.
        Only outside a transaction, while this session's names resolve as the index's
        build resolves them and no relation is registered on its connection (one could
        shadow the table). A cancel (or ``timeout_s`` passing) ends an index build the
        statement started at its next batch (57014)."""
        if self.state is not SessionState.IDLE or self._leftover_views:
            return None
        if key_lookup.lookup_plan(plan) is None:  # not of the shape: nothing to ask
            return None
        # ``cursor`` as every read takes it: it opens no DuckDB transaction here (there
        # is no transaction), and it is where a read waits for writes committed but not
        # yet in DuckDB.
        if not self._may_look_up():
            return None
        ends = None if not timeout_s else time.monotonic() + timeout_s

        def stop() -> bool:
            return self._cancel_requested or (ends is not None and time.monotonic() > ends)

        try:
            return key_lookup.answer(self.database, plan, parameters, stop, build=build)
        except QueryCanceledError as error:
            if self._cancel_requested or ends is None:
                raise
            raise QueryCanceledError("canceling statement due to statement timeout") from error

    def _guard(self, plan: Plan, *, kept: bool = False) -> None:
        """The door's checks, before anything of ``plan`` runs: the sandbox (what DuckDB
        may be asked to do at all) and then privileges (what this identity may touch).
        ``kept``: ``plan`` is a plan this session keeps and checks again on every run
        (``answer_lookup``, a kept literal SELECT, ``kept_plans``), whose decision may
        be kept (``door_memo``). Both checks judge the same identity, settled first
        (``privileges.settled_identity``)."""
        identity = self.identity
        if privileges.role_undo.data:  # a SET ROLE may be pending undo (no call if not)
            identity = privileges.settled_identity(self)
        if not kept:
            sandbox.check_plan(plan, identity)
            privileges.check_plan(plan, identity, self)
            return
        memo = self.door_memo
        if privileges.kept_decision(plan, identity, self, memo):
            # Both checks let this plan through for this identity (``door_memo``), and
            # nothing either decision was made of has changed since: the sandbox's is
            # a function of the plan's texts and ``identity.superuser`` alone.
            return
        sandbox.check_plan(plan, identity)
        privileges.check_plan(plan, identity, self, memo=memo)

    def check_duration(self) -> None:
        """``_check_duration`` for a front that reads from the session's DuckDB cursor
        itself (the wire server's streamed COPY TO and DECLARE): 54000, and the
        transaction rolled back, once it has been open too long."""
        with self._lock:
            self._check_duration()

    def _check_duration(self) -> None:
        """Roll back a transaction open for longer than the limit (54000)."""
        transaction = self.transaction
        if transaction is None or not transaction.explicit:
            return
        age_s = self.database.clock.monotonic_s() - transaction.started_s
        if age_s * 1000 > limits.TRANSACTION_DURATION_MS_MAX:
            self._rollback()
            raise LimitExceededError(
                f"transaction was open {age_s:.0f} s, over the limit of "
                f"{limits.TRANSACTION_DURATION_MS_MAX // 1000} s; it was rolled back"
            )

    def _transaction_control(self, plan: Plan) -> Result:
        operation = plan.operations[0]
        assert isinstance(operation, TransactionControl)
        if operation.action == "begin":
            if self.state is not SessionState.IDLE:
                return Result("BEGIN", notices=("there is already a transaction in progress",))
            if self.database.open_transactions >= limits.OPEN_TRANSACTIONS_MAX:
                raise LimitExceededError(
                    f"too many open transactions (limit {limits.OPEN_TRANSACTIONS_MAX})"
                )
            # No DuckDB transaction yet: the first statement that needs one opens it
            # (the ``cursor`` property), so a topic-only transaction never has one.
            self._schema_basis = None
            self._changed_schema = False
            self.transaction = Transaction(
                explicit=True, started_s=self.database.clock.monotonic_s(),
                staging=TransactionStaging(self.database.staged_writes),
            )  # fmt: skip
            self.state = SessionState.IN_TRANSACTION
            self.database.open_transactions += 1
            return Result("BEGIN")
        if self.state is SessionState.IDLE:
            return Result(plan.tag, notices=("there is no transaction in progress",))
        if operation.action == "rollback" or self.state is SessionState.FAILED:
            self._rollback()
            return Result("ROLLBACK")
        if self._changed_schema:  # ended in execute_statement, after the commit
            self._open_schema_change()
        assert self.transaction is not None
        with key_lookup.changing_tables(self.transaction.tables_changed):
            self._commit()
        return Result("COMMIT")

    def _run(self, plan: Plan, parameters: Any) -> Result:
        assert self.transaction is not None
        operations = plan.operations
        if (len(operations) == 1 and _plain_select(operations[0])
                and not self._lists_prepared(operations[0])):  # fmt: skip
            # One SELECT over tables (no topic, no system view): what the loop below does
            # for it, without the loop's tests.
            operation = operations[0]
            bound = parameters if operation.uses_parameters else None
            offset = statement_line_offset(plan)
            if self._literal(operation):  # kept by text when it has no parameters
                table = tables.literal_result(operation.sql, bound, line_offset=offset)
            else:
                table = tables.query_rows(self.cursor, operation.sql, bound, line_offset=offset)
            return _query_result(operation, table)
        registered: list[str] = []
        read_tables: dict[str, pa.Table] = {}
        # Each read's topic and the offset ranges its rows are (``engine.moved_refs``).
        read_ranges: dict[str, tuple[str, list[tuple[int, int, int]]]] = {}
        moved_from: tuple[str, list[tuple[int, int, int]]] | None = None  # the query's rows'
        result = Result(plan.tag, notices=plan.notes)
        query_table: pa.Table | None = None
        try:
            for operation in plan.operations:
                if isinstance(operation, ReadRecords):
                    projected = _projected(plan, operation.placeholder)
                    ranges: list[tuple[int, int, int]] = []
                    table = self._read(operation, parameters,
                                       _projected_columns(plan) if projected else None,
                                       ranges)  # fmt: skip
                    read_tables[operation.placeholder] = table
                    if "decode" not in operation.options:  # data decoded as stored
                        read_ranges[operation.placeholder] = (operation.topic_id, ranges)
                    if not projected:
                        tables.register(self.cursor, operation.placeholder, table)
                        registered.append(operation.placeholder)
                elif isinstance(operation, RunQuery) and operation.projection is not None:
                    placeholder, columns = operation.projection
                    source = read_tables[placeholder]
                    query_table = source.select([c for c, _ in columns]).rename_columns(
                        [name for _, name in columns]
                    )
                    result = Result(f"SELECT {query_table.num_rows}", query_table)
                    moved_from = read_ranges.get(placeholder) if len(columns) == 1 and (
                        columns[0][0] == "data") else None
                elif isinstance(operation, RunQuery):
                    moved_from = None
                    registered += self._register_views(operation)
                    bound = parameters if operation.uses_parameters else None
                    offset = statement_line_offset(plan)
                    check = operation.upsert_check
                    proposed = None if check is None else _proposed_rows(self.cursor, check, bound)
                    if operation.tag in DML_TAGS and not operation.returns_rows:
                        count = self._upsert_by_update(operation, bound)
                        if count is None:
                            count = tables.execute_count(
                                self.cursor, operation.sql, bound, line_offset=offset
                            )
                        if proposed is not None and (count or 0) < proposed:
                            raise _row_affected_twice()
                        prefix = "INSERT 0" if operation.tag == "INSERT" else operation.tag
                        result = Result(f"{prefix} {count or 0}")
                        continue
                    if operation.tag == "DEALLOCATE" and self.sql_statements.deallocate(
                        operation.sql
                    ):  # a kept SQL-level statement's: DuckDB holds nothing of it
                        result = Result("DEALLOCATE")
                        continue
                    if operation.tag not in _SCHEMA_KEEPING_TAGS:
                        self._schema_may_change()
                    existed = (privileges.prepare_ddl(self, operation)
                               if privileges.is_relation_ddl(operation) else None)  # fmt: skip
                    # The last query's small result may stay Python values (``Rows``):
                    # its ``Result`` builds the Arrow table only if it is read.
                    query = (tables.query_rows if operation.returns_rows
                             and operation is plan.operations[-1] else tables.query_arrow)
                    with self._sql_statement(operation):  # PREPARE, EXECUTE: kept as text
                        query_table = query(self._query_cursor(operation), operation.sql,
                                            bound, line_offset=offset)  # fmt: skip
                    if proposed is not None and (
                        query_table is None or query_table.num_rows < proposed
                    ):  # RETURNING: a row for each row inserted or updated
                        raise _row_affected_twice()
                    if existed is not None:  # owners of tables and views, in the same transaction
                        privileges.record_ddl(self, operation, existed)
                    result = _query_result(operation, query_table)
                elif isinstance(operation, AppendRecords):
                    result = self._append(operation, query_table, parameters, moved_from)
                else:
                    result = self._run_other(operation, plan)
        finally:
            for name in registered:
                try:
                    tables.unregister(self._cursor, name)
                except TopicbaseError:
                    # DuckDB refuses this inside an aborted transaction; retried at rollback.
                    self._leftover_views.append(name)
        return result

    def _sql_statement(self, operation: RunQuery) -> contextlib.AbstractContextManager[None]:
        """Around ``operation``'s run: a PREPARE is checked by DuckDB and kept as its text,
        an EXECUTE of a kept statement has DuckDB hold it for that run alone, and so does
        a statement listing the prepared statements (``engine.prepared_room``)."""
        if operation.tag == "PREPARE":
            return self.sql_statements.preparing(self.cursor, operation.sql)
        if operation.tag == "EXECUTE":
            return self.sql_statements.executing(self.cursor, operation.sql)
        if self._lists_prepared(operation):
            return self.sql_statements.listed(self.cursor)
        return contextlib.nullcontext()

    def _lists_prepared(self, operation: RunQuery) -> bool:
        """Whether ``operation`` may read DuckDB's list of prepared statements while the
        session keeps some (``pg_prepared_statements``): it runs with them held."""
        return bool(len(self.sql_statements)) and "prepared_statements" in operation.sql.lower()

    def _query_cursor(self, operation: RunQuery) -> Any:
        """The DuckDB connection to run ``operation`` on: this session's (``cursor``), or for
        a SELECT of literals and parameters alone (``RunQuery.literal_only``, confirmed by
        DuckDB's tokens: ``tables.literal_tokens``) the thread's empty one without a worker
        thread (``tables.literal_cursor``), which gives the same result, error and SQLSTATE:
        such a SELECT reads no table and calls no function, operator or type a user could
        define. Not for the first statement of an explicit transaction that has no DuckDB
        transaction yet: that statement opens it (its snapshot), as before."""
        return tables.literal_cursor() if self._literal(operation) else self.cursor

    def _literal(self, operation: RunQuery) -> bool:
        """Whether ``operation`` runs on the thread's empty database (``_query_cursor``)."""
        transaction = self.transaction
        return (
            operation.literal_only
            and (transaction is None or not transaction.explicit or transaction.duckdb_open)
            and tables.literal_tokens(operation.sql)
        )

    def _schema_may_change(self) -> None:
        """A statement that may change DuckDB's schema runs: in autocommit its commit is
        bracketed now; in a transaction, at COMMIT (``_transaction_control``)."""
        self._changed_schema = True
        self._upserts.clear()
        if self.transaction is not None and not self.transaction.explicit:
            self._open_schema_change()

    def _open_schema_change(self) -> None:
        if not self._schema_change_open:
            self._schema_change_open = True
            tables.SCHEMA_GENERATIONS.changing()

    def _upsert_by_update(self, operation: RunQuery, parameters: Any) -> int | None:
        """A counter upsert run as the UPDATE of its row (``planner.duckdb_sql``): the
        rows it changed, or None when the statement itself must run (no such row in this
        snapshot, or the shortcut is not known sound here).

        Only inside an explicit transaction (the UPDATE and the INSERT that may follow
        are one DuckDB transaction), with no DDL of its own, on a snapshot whose schema
        generation is known; the table is checked once per generation
        (``tables.upsert_columns``). No value may be NULL (the statement then runs, so
        NOT NULL is checked as it checks it).

        The snapshot's schema is the basis generation's when the generation has not
        moved from before the DuckDB transaction opened until after the snapshot was
        taken, which is at the latest by this statement's own query: checked before (a
        schema change since: the statement runs itself) and after (a schema change
        committed while this query ran, which may have taken the snapshot: 40001).
        """
        shape = operation.upsert
        transaction = self.transaction
        if (shape is None or transaction is None or not transaction.explicit
                or self._changed_schema):  # fmt: skip
            return None
        cursor = self.cursor  # the DuckDB transaction opens: ``_schema_basis`` is set
        basis = self._schema_basis
        if basis is None:
            return None
        numbers = sorted({int(v[1:]) for v in shape.values if v.startswith("$")})
        given = [] if parameters is None else parameters
        if (isinstance(given, dict) or numbers != list(range(1, len(numbers) + 1))
                or len(given) != len(numbers) or any(v is None for v in given)):  # fmt: skip
            return None
        if tables.SCHEMA_GENERATIONS.stable() != basis:
            self._schema_basis = None  # this snapshot may see that change or not
            return None
        entry = self._upserts.get(operation.sql)
        if entry is None or entry[0] != basis:
            columns = tables.upsert_columns(cursor, shape.table, shape.conflict)
            entry = (basis, None if columns is None else counter_update(shape, columns))
            if len(operation.sql) <= limits.CACHED_TEXT_CHARS_MAX:
                self._upserts.put(operation.sql, entry, _text_cost(operation.sql, entry[1]))
        count = None
        if entry[1] is not None:
            update_sql, order = entry[1]
            count = tables.execute_count(cursor, update_sql, [given[i] for i in order])
            assert count is None or count <= 1, "one unique key matches one row"
        if tables.SCHEMA_GENERATIONS.stable() != basis:
            self._schema_basis = None
            self._upserts.pop(operation.sql, None)  # worked out on a snapshot of unknown schema
            if entry[1] is not None:
                raise SerializationFailure(
                    "a schema change committed while this statement took its snapshot; retry"
                )
            return None
        return count or None

    # -- counter deltas (engine.deltas) ----------------------------------------------------
    def _keep_delta(self, plan: Plan, parameters: Any) -> bool:
        """Keep a counter upsert of an explicit transaction that has not touched DuckDB as
        a delta (``engine.deltas``: rules 1-4 of its module doc); False: run it as before.
        The statement was checked (sandbox, privileges) as every statement is."""
        transaction = self.transaction
        if (len(plan.operations) != 1 or transaction is None or not transaction.explicit
                or transaction.duckdb_open or transaction.touches_tables
                or self._changed_schema or not deltas.enabled()):  # fmt: skip
            return False
        operation = plan.operations[0]
        if (not isinstance(operation, RunQuery) or operation.upsert is None
                or operation.tag != "INSERT" or operation.returns_rows):  # fmt: skip
            return False
        epoch = self._applier.epoch_now()  # before the plan: a writer since makes it stale
        delta_plan = self._delta_plan(operation)
        if delta_plan is None:
            return False
        bound = parameters if operation.uses_parameters else None
        delta = delta_plan.bind(bound)
        if delta is None:
            return False
        size = delta.record_bytes()
        if transaction.delta_bytes + size > deltas.RECORD_BYTES_MAX:
            return False  # runs the DuckDB way, the kept ones before it: a bounded record
        reservation = self._applier.reserve(  # no DuckDB transaction open
            delta, self._cursor, epoch, (len(transaction.deltas), transaction.delta_bytes),
            self._cancelled)
        if reservation is None:
            return False
        if transaction.staging is not None and not transaction.staging.hold(size):
            self._applier.release([reservation])  # over the staged-memory budget
            return False
        transaction.deltas.append(delta)
        transaction.delta_bytes += size
        if transaction.tables_changed is not None:
            # a kept delta may yet run the DuckDB way (``_flush_deltas``, also inside
            # COMMIT): that COMMIT then changes its table (``key_lookup.changing_tables``)
            transaction.tables_changed |= key_lookup.table_names((delta_plan.table[2],))
        transaction.reservations.append(reservation)
        transaction.delta_statements.append((operation.sql, bound))
        return True

    def _delta_plan(self, operation: RunQuery) -> deltas.DeltaPlan | None:
        """The delta plan of an upsert text on the current schema generation, worked out
        through this connection outside any DuckDB transaction (its own temporary tables
        and search path count) and kept while the generation stays."""
        generation = tables.SCHEMA_GENERATIONS.stable()
        if generation is None:
            return None
        found = self._delta_plans.get(operation.sql)
        if found is not None and found[0] == generation:
            return found[1]
        shape = operation.upsert
        assert shape is not None
        columns = tables.upsert_columns(self._cursor, shape.table, shape.conflict)
        plan = None
        if columns is not None and counter_update(shape, columns) is not None:
            relation = deltas.relation_of(self._cursor, shape.table)
            if relation is not None:
                plan = deltas.plan_delta(shape, columns, relation)
        if tables.SCHEMA_GENERATIONS.stable() != generation:
            return None  # the schema changed while it was read: not kept
        if len(operation.sql) <= limits.CACHED_TEXT_CHARS_MAX:
            cost = TEXT_COST_PER_CHAR * len(operation.sql) * (1 if plan is None else 3)
            self._delta_plans.put(operation.sql, (generation, plan), cost)
        return plan

    def _begin_writer(self, transaction: Transaction) -> None:
        """The transaction may write tables the DuckDB way from now on (``engine.deltas``
        rule 4): no delta is kept meanwhile, and the committed ones are applied first."""
        if not transaction.delta_writer:
            self._applier.writer_begins(self._cancelled)
            transaction.delta_writer = True

    def _flush_deltas(self, transaction: Transaction) -> None:
        """Run the transaction's kept counter upserts the DuckDB way, in its DuckDB
        transaction (opened here): a later statement touches DuckDB, or the deltas may not
        commit as such. The transaction then commits the DuckDB way."""
        statements = transaction.delta_statements
        plans = {id(d.plan): d.plan for d in transaction.deltas}
        self._applier.release(transaction.reservations)
        transaction.deltas.clear()
        transaction.delta_statements = []
        transaction.delta_bytes = 0
        transaction.touches_tables = True
        self._begin_writer(transaction)  # every committed delta applied before
        if not transaction.duckdb_open:
            self._open_duckdb_transaction(transaction)
        for delta_plan in plans.values():
            self._check_unmoved(delta_plan)
        for sql, parameters in statements:
            tables.execute_count(self._cursor, sql, parameters)

    def _check_unmoved(self, delta_plan: deltas.DeltaPlan) -> None:
        """Refuse (40001) to run a kept statement whose table is no longer the one it was
        kept for (renamed, dropped and created again, altered, another search path): the
        text would now write another table, perhaps one this identity may not write, where
        the DuckDB way ran it at its statement and its COMMIT would fail with 40001."""
        name = delta_plan.table[2]
        kept_for = (*delta_plan.table[:2], delta_plan.table_oid)
        resolves = deltas.resolves_to(self._cursor, name, kept_for)
        columns = tables.upsert_columns(self._cursor, name, delta_plan.keys, kept_for[:2])
        if not resolves or columns != delta_plan.columns:
            raise SerializationFailure(
                f'table "{name}", which this transaction added to, was changed (renamed, dropped '
                "or altered) by another transaction since; retry"
            )

    def _run_other(self, operation: Any, plan: Plan) -> Result:
        database = self.database
        if isinstance(operation, CommitConsumerOffsets):
            return self._commit_offsets(operation)
        if isinstance(operation, SetConsumerOffsets):
            assert self.transaction is not None
            set_consumer_offsets(database, self.transaction, operation)
            return Result(plan.tag, notices=plan.notes)
        if isinstance(operation, ChangePrivileges | SwitchRole):  # GRANT, REVOKE, SET ROLE
            grants.run(self, operation)
            return Result(plan.tag)
        if isinstance(operation, Introspect):
            if operation.what == "topics":
                return Result("SHOW", introspection.show_topics(database))
            return Result("DESCRIBE", introspection.describe_topic(database, operation.topic))
        if self.transaction is not None and self.transaction.explicit:
            raise ActiveSqlTransactionError("topic DDL cannot run inside a transaction block")
        # The statement began as a DuckDB-way writer (``_begin_writer``): every committed
        # delta was applied then, outside the commit lock, and none registers while it is
        # open, so the checkpoint's drain below waits for nothing under the lock.
        with database.commit_lock:
            # Offset moves still only in commit records reach the offsets table first,
            # so a dropped and re-created consumer never inherits old moves.
            database.committer.quiesce()
            # Transactions set aside behind a partition fenced by an I/O failure (their
            # records replay at reopen) are fine unless this drops a consumer: one
            # re-created under its name would inherit their moves.
            # So is a dropped topic that committed moves name as their source (their
            # records derive the moved data from it: ``engine.moved_refs``).
            if _drops_consumers(database, operation) or (
                isinstance(operation, DropTopicEntry)
                and _drops_move_source(database, operation)
            ):
                database.committer.checkpoint_whole()
            else:
                database.committer.checkpoint()
            if isinstance(operation, CreateTopicEntry):
                run_create(database, operation, self.identity.name)
            elif isinstance(operation, AlterTopicEntry):
                run_alter(database, operation)
            else:
                assert isinstance(operation, DropTopicEntry)
                run_drop(database, operation)
        return Result(plan.tag, notices=plan.notes)

    # -- topic reads and writes ---------------------------------------------------------------
    def _read(
        self,
        operation: ReadRecords,
        parameters: Any,
        columns: tuple[str, ...] | None = None,
        ranges: list[tuple[int, int, int]] | None = None,
    ) -> pa.Table:
        """The read's relation (only ``columns`` if given, the rows' offset ranges into
        ``ranges`` if given: ``read_records``)."""
        operation = _bind_read_options(operation, parameters, self.database)
        topic = self.database.topic_log(operation.topic_id)
        committed: Mapping[int, int | None] = {}
        if operation.consumer is not None:
            catalog = self.database.catalog
            # every partition's (a child's parent too, read or not), one snapshot
            committed = catalog.committed_offsets(operation.topic_id, operation.consumer)
            consumer_settings = self.database.catalog.entry(operation.topic).consumers[
                operation.consumer
            ]
            read_from = consumer_settings.get("read_from")
            if (
                read_from is not None
                and "read_from" not in operation.options
                and (read_from.timestamp() > 0)
            ):
                operation = _with_option(operation, "read_from", read_from)
        assert self.transaction is not None
        member = operation.options.get("member")
        if member is not None:
            # Every partition's committed offset stays: a leased child waits for its
            # parent to be read to its end (engine.reads.readable_partitions).
            operation = self._join_as_member(operation, str(member))
        return read_records(
            operation,
            topic,
            committed,
            self.transaction,
            self.database.clock,
            cancelled=lambda: self._cancel_requested,
            publish_gate=self.database.publish_lock,
            round_robin=self.database.read_round_robin,
            columns=columns,
            ranges=ranges,
        )

    def _join_as_member(self, operation: ReadRecords, member: str) -> ReadRecords:
        """Join the consumer's group; read only the partitions leased to this member."""
        assert self.transaction is not None and operation.consumer is not None
        topic = self.database.topic_log(operation.topic_id)
        key = (operation.topic_id, operation.consumer)
        lease, owned = self.database.leases.join(
            key, member, self.session_id, tuple(topic.partition_ids())
        )
        partitions = tuple(p for p in operation.partitions if p in owned)
        for partition in partitions:
            self.transaction.leases[(operation.topic_id, operation.consumer, partition)] = lease
        return ReadRecords(operation.topic, operation.topic_id, partitions,
                           operation.placeholder, operation.consumer, operation.options)

    def _register_views(self, operation: RunQuery) -> list[str]:
        names = []
        for view in operation.system_views:
            table = introspection.SYSTEM_VIEWS[view](self.database)
            name = f"__sys_{view}"
            tables.register(self.cursor, name, table)
            names.append(name)
        return names

    def _append(
        self,
        operation: AppendRecords,
        query: pa.Table | None,
        parameters: Any,
        moved_from: tuple[str, list[tuple[int, int, int]]] | None = None,
    ) -> Result:
        """Run the write; ``moved_from``: the topic and offset ranges the query's rows are
        (its one column the read's ``data``), for a write by reference (``_moved``)."""
        assert self.transaction is not None
        batches = None
        moved = None
        if operation.rows is not None:
            rows = _bind_rows(operation.rows, parameters)
            columns = operation.columns or ("data",)
            if not operation.options:  # plain messages need no Arrow table (writes.py)
                if not self.transaction.explicit and not operation.returning:
                    # with other sessions' while the topic is busy (spread_append)
                    written = spread_append.append_plain(
                        self.database, operation.topic_id, columns, rows)  # fmt: skip
                    if written is not None:
                        return Result(f"INSERT 0 {written}")
                batches = plain_batches(columns, rows, self.database.clock)
            if batches is None:
                source = table_from_rows(columns, rows)
            count = len(rows)
        else:
            assert query is not None, "INSERT ... SELECT runs its query first"
            source = query
            if operation.columns:
                if len(operation.columns) != source.num_columns:
                    raise InvalidParameterValueError(
                        f"INSERT has {len(operation.columns)} target columns but the query "
                        f"returns {source.num_columns}"
                    )
                source = source.rename_columns(list(operation.columns))
        if batches is None:
            moved = self._moved(operation, source, moved_from)
            if moved is not None:
                batches = [(None, moved_batch(source.column("data"), moved.at_us))]
            else:
                options = {k: _bind(v, parameters) for k, v in operation.options.items()}
                batches = build_batches(source, options, self.database.clock)
            count = source.num_rows
        if not self.transaction.explicit:
            return self._append_now(operation, batches, count)
        for partition, batch in batches:
            if batch.num_rows:
                self.transaction.add_write(
                    PendingWrite(operation.topic_id, batch, partition, moved))
        if self.transaction.staged_bytes > limits.TRANSACTION_STAGED_BYTES_MAX:
            raise LimitExceededError(
                f"transaction staged more than {limits.TRANSACTION_STAGED_BYTES_MAX} bytes of "
                "topic writes; it is rolled back"
            )
        if operation.returning:
            raise InvalidParameterValueError(
                "RETURNING is only available outside a transaction block (offsets are "
                "assigned at COMMIT)"
            )
        return Result(f"INSERT 0 {count}")

    def _moved(
        self,
        operation: AppendRecords,
        source: pa.Table,
        moved_from: tuple[str, list[tuple[int, int, int]]] | None,
    ) -> MovedSource | None:
        """Where the write's messages come from, if it may be committed by reference to
        them (``engine.moved_refs``): an explicit transaction's write whose only column is
        ``data`` read from a topic (as stored, decoded), with no option, of the whole read."""
        if (
            moved_from is None
            or not moved_from[1]
            or self.transaction is None
            or not self.transaction.explicit
            or operation.options
            or operation.rows is not None
            or source.column_names != ["data"]
            or source.schema.field("data").type != pa.binary()
        ):
            return None
        topic_id, ranges = moved_from
        merged: list[MovedRange] = []
        for partition, start, end in ranges:  # a partition's consecutive frames: one range
            last = merged[-1] if merged else None
            if last is not None and last.partition == partition and last.end == start:
                merged[-1] = MovedRange(topic_id, partition, last.start, end)
            else:
                merged.append(MovedRange(topic_id, partition, start, end))
        if (
            len(merged) > limits.MOVED_RANGES_MAX
            or sum(r.end - r.start for r in merged) != source.num_rows
        ):
            return None
        return MovedSource(tuple(merged), self.database.clock.now_us())

    def _append_now(
        self, operation: AppendRecords, batches: list[tuple[int | None, pa.RecordBatch]], rows: int
    ) -> Result:
        pieces = []
        written = 0
        for partition, batch in batches:
            if batch.num_rows == 0:
                continue
            outcome = spread_append.append_now(
                self.database, operation.topic_id, batch, partition,
                lambda: self._cancel_requested,
            )  # a write waiting for its partition's write speed ends at a cancel (57014)
            written += outcome.written_count
            if not operation.returning:
                continue  # no RETURNING table to build (~28 µs a statement, measured)
            pieces.append(
                pa.table(
                    {
                        "partition": pa.array(outcome.partitions, pa.int32()),
                        "offset": pa.array(outcome.offsets, pa.int64()),
                        "status": pa.array(
                            ["written" if s == 0 else "duplicate" for s in outcome.status.tolist()]
                        ),
                        "seq_no": batch.column("seq_no"),
                        "producer_id": batch.column("producer_id"),
                        "message_group_id": batch.column("message_group_id"),
                        "created_at": batch.column("created_at"),
                    }
                )
            )
        if not operation.returning:
            return Result(f"INSERT 0 {written}")
        # The grammar admits only RETURNING_COLUMNS (grammar.settings, the one list).
        assert set(operation.returning) <= {*RETURNING_COLUMNS, "*"}, operation.returning
        table = pa.concat_tables(pieces) if pieces else _empty_returning()
        if "*" not in operation.returning:
            table = table.select(list(operation.returning))
        return Result(f"INSERT 0 {written}", table)

    def _commit_offsets(self, operation: CommitConsumerOffsets) -> Result:
        check_commit_ranges(self.database, operation)
        ranges = {
            (operation.topic_id, operation.consumer, partition): (start, end)
            for partition, start, end in operation.ranges
        }
        assert self.transaction is not None
        moves, ahead = self.database.catalog.plan_ranges(ranges, self.transaction.offset_ranges)
        self.transaction.offset_moves.update(moves)
        self.transaction.offset_ranges.update(ahead)
        return Result(f"COMMIT OFFSETS {len(moves)}")

    # -- commit and rollback -----------------------------------------------------------------
    def _commit(self) -> None:
        """``_commit_held`` with Ctrl-C held off until it ends (``engine.interrupts``)."""
        with sigint_deferred():
            self._commit_held()

    def _commit_held(self) -> None:
        """Commit in the staging log alone if no statement touched a table, else stage,
        validate, commit in DuckDB (the commit point); then publish. See engine.commit.

        A transaction with nothing to move, no lease to check and no DuckDB transaction
        open (an explicit one whose statements never needed DuckDB, see ``cursor``) has
        nothing to commit: it ends at once."""
        transaction = self.transaction
        assert transaction is not None
        database = self.database
        committer = database.committer
        transaction_id = None
        items: list[PublishItem] = []
        committed = False
        try:
            if transaction.deltas and not self._applier.still_valid(transaction.reservations):
                self._flush_deltas(transaction)  # a DuckDB-way writer came in between
            moves = {key: read.end for key, read in transaction.reads.items()}
            moves.update(transaction.offset_moves)
            if transaction.writes or moves or transaction.deltas:
                transaction_id = committer.next_transaction_id()
                # An autocommit statement's DuckDB transaction is open only if it wrote
                # there; an explicit one's is open for any DuckDB statement, reads too.
                if not transaction.touches_tables and (
                    transaction.explicit or not transaction.duckdb_open
                ):
                    try:
                        self._commit_in_log(transaction, transaction_id, moves)
                    except deltas.DeltasOutdated:
                        # a writer began after the check above: nothing committed; the
                        # deltas run the DuckDB way and the transaction commits so
                        self._flush_deltas(transaction)
                    else:
                        self._end_transaction()
                        committer.catch_up()
                        return
            ticket = None
            if transaction.writes:
                items = route_writes(database, transaction.writes_to_commit())
                items, ticket = committer.stage(transaction_id, items)
            if transaction_id is None and not transaction.leases and not transaction.duckdb_open:
                transaction.committed = True
                self._end_transaction()  # moved nothing, and DuckDB saw nothing of it
                return
            if transaction_id is not None:
                if not transaction.duckdb_open:
                    self._open_duckdb_transaction(transaction)
                committer.write_record(self._cursor, transaction_id, items, moves)
            if ticket is not None:
                committer.wait_staged(ticket)  # its sync ran while the record was written
            slot = committer.enter(
                set(moves), lambda: self._validate(transaction), recorded=transaction_id is not None
            )
            try:
                if transaction.duckdb_open:
                    tables.run(self._cursor, "COMMIT")
            except BaseException as error:
                # DuckDB may have committed before the error came back (a MemoryError on
                # the way, R1 F2): its record row says so; unknown: in doubt, never undone
                try:
                    landed = transaction_id is not None and committer.recorded(transaction_id)
                except BaseException as unknown:
                    transaction.committed = True  # its staging is recovery's to judge
                    committer.in_doubt(slot, unknown)
                    raise error from unknown
                if not landed:
                    committer.leave(slot)
                    raise
                committed = transaction.committed = True
                committer.finish(slot, transaction_id, moves, items)
                raise
            committed = transaction.committed = True
            committer.finish(slot, transaction_id, moves, items)
        except BaseException:
            if committed or transaction.committed:
                # Past the commit point nothing is undone: recovery publishes the rest.
                self._end_transaction()
                raise
            if transaction_id is not None:
                committer.abandon(transaction_id)
            self._rollback()
            raise
        self._end_transaction()
        committer.catch_up()

    def _commit_in_log(
        self, transaction: Transaction, transaction_id: int, moves: dict[Any, int]
    ) -> None:
        """A transaction that touched no table: its batches and commit record go to the
        staging log in one group-committed append (``Committer.commit_in_log``), with no
        DuckDB statement before the commit point (``transaction.committed`` is set
        there). An explicit transaction's DuckDB transaction, if a statement opened one
        (it only read), ends after the publish."""
        committer = self.database.committer
        items: list[PublishItem] = []
        if transaction.writes:
            items = route_writes(self.database, transaction.writes_to_commit())
        try:
            slot, items = committer.commit_in_log(
                transaction_id, items, moves, lambda: self._validate(transaction),
                transaction.deltas, transaction.reservations,
            )
        except PastCommitPoint:
            transaction.committed = True  # its record is durable: never abandoned
            raise
        transaction.committed = True
        try:
            committer.finish(slot, transaction_id, moves, items)
        finally:
            if transaction.duckdb_open:
                self._end_read_only_duckdb_transaction()

    def _end_read_only_duckdb_transaction(self) -> None:
        """End the DuckDB transaction of an explicit transaction that wrote no table (a
        COMMIT without changes writes nothing); if that fails, roll it back."""
        try:
            tables.run(self._cursor, "COMMIT")
        except TopicbaseError:
            with contextlib.suppress(TopicbaseError):
                tables.run(self._cursor, "ROLLBACK")

    def _validate(self, transaction: Transaction) -> None:
        """Leases still held and every range read still starts at the committed offset."""
        catalog = self.database.catalog
        for (topic_id, consumer, partition), lease in transaction.leases.items():
            if not self.database.leases.holds((topic_id, consumer), partition, lease):
                raise SerializationFailure(
                    f'member "{lease.member}" of consumer "{consumer}" lost its lease on '
                    f"partition {partition} (generation {lease.generation}); retry"
                )
        for key, read in transaction.reads.items():
            current = catalog.committed(*key)
            if current != read.basis:
                raise SerializationFailure(
                    f'consumer "{key[1]}" offset of partition {key[2]} moved from '
                    f"{_offset_text(read.basis)} to {_offset_text(current)} since this "
                    "transaction read it; retry"
                )

    def _end_transaction(self) -> None:
        if self.state is not SessionState.IDLE:
            self.database.open_transactions -= 1
        if self.transaction is not None:
            if self.transaction.committed and self.transaction.offset_ranges:
                self.database.catalog.remember_ranges(self.transaction.offset_ranges)
            self.transaction.release()  # staged bytes back, spill file deleted
            self._end_deltas(self.transaction)
        self.transaction = None
        self.state = SessionState.IDLE
        if self._commit_cpu_tid is not None:
            tid, self._commit_cpu_tid = self._commit_cpu_tid, None
            self.database.commit_cpu.leave(tid)

    def _end_deltas(self, transaction: Transaction) -> None:
        """Give back reservations of deltas not committed; end the writer's exclusion."""
        if transaction.reservations:
            self._applier.release(transaction.reservations)
        if transaction.delta_writer:
            transaction.delta_writer = False
            self._applier.writer_ends()

    def _rollback(self) -> None:
        if self.transaction is not None and self.transaction.duckdb_open:
            # DuckDB may have aborted the transaction itself already.
            with contextlib.suppress(TopicbaseError):
                tables.run(self._cursor, "ROLLBACK")
        for name in self._leftover_views:
            with contextlib.suppress(TopicbaseError):
                tables.unregister(self._cursor, name)
        self._leftover_views.clear()
        self._end_transaction()

    # -- for fronts that run statements of their own (added for pgwire COPY/cursors) ------
    def fail_transaction(self) -> None:
        """A front's own statement (COPY, FETCH …) failed: an explicit transaction
        becomes FAILED (25P02 until ROLLBACK), as after any failed statement."""
        with self._lock:
            if self.state is SessionState.IN_TRANSACTION:
                self.state = SessionState.FAILED

    def drop_at_rollback(self, view: str) -> None:
        """Leave ``view`` (one DuckDB refused to drop: an aborted transaction) to this
        session's rollback, which drops it (``engine.bulk``)."""
        self._leftover_views.append(view)

    # -- bulk doors (the Arrow Flight door): engine.bulk_read and engine.bulk_write ------
    def bulk_partitions(self, topic: str) -> list[Any]:
        """Partitions of ``topic`` with one consistent cut of their offsets (SELECT)."""
        from engine import bulk_read

        return bulk_read.partition_bounds(self, topic)

    def bulk_cut(self, topic: str, starts: dict[int, int] | None = None,
                 ends: dict[int, int] | None = None, split_rows: int | None = None
                 ) -> list[Any]:  # fmt: skip
        """The topic's current cut as offset ranges (``engine.bulk_read.cut_ranges``)."""
        from engine import bulk_read

        rows = bulk_read.DEFAULT_SPLIT_ROWS if split_rows is None else split_rows
        return bulk_read.cut_ranges(self, topic, starts, ends, rows)

    def bulk_offset_for_time(self, topic: str, partition: int, written_at_us: int) -> int:
        from engine import bulk_read

        return bulk_read.offset_for_time(self, topic, partition, written_at_us)

    def bulk_read(self, topic: str, offsets: Any, columns: Any = None) -> Any:
        """Record batches of one offset range, projected (``engine.bulk_read.read_range``)."""
        from engine import bulk_read

        return bulk_read.read_range(self, topic, offsets, columns)

    def bulk_writes(self, **settings: Any) -> Any:
        """The database's staged bulk writes (``engine.bulk_write.BulkWrites``); calls
        take this session as their first argument."""
        from engine import bulk_write

        return bulk_write.for_database(self.database, **settings)


# What an unqualified name resolves to in DuckDB (search path main, then pg_catalog):
# tables and views of main (temporary ones included) and DuckDB's own views.
_DUCKDB_RELATIONS_SQL = (
    "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' UNION ALL "
    "SELECT view_name FROM duckdb_views() WHERE schema_name IN ('main', 'pg_catalog')"
)


def parse_statements(sql: str) -> list[ast.Statement]:
    """The statements of ``sql`` as the session runs them, parsed once per distinct text
    (a front's loop of the same statement pays for the parse once; errors are not kept)."""
    return list(_parse_cached(sql))


def _text_cost(sql: str, update: tuple[str, tuple[int, ...]] | None) -> int:
    """What an upsert's kept UPDATE costs (``BoundedCache``): its text's and its own."""
    extra = 0 if update is None else len(update[0]) + 8 * len(update[1])
    return TEXT_COST_PER_CHAR * len(sql) + 4 * extra


@text_cache(PARSE_CACHE_ENTRIES)
def _parse_cached(sql: str) -> tuple[ast.Statement, ...]:
    """Parsed scripts by text: statements are immutable, so a repeated script
    (a worker's loop) is parsed once."""
    return tuple(parse(sql))


# Where a statement that may be streamed starts. Only a shortcut: a statement it lets
# through is planned and classified from its tree like any other, and one it stops runs
# on the ordinary path, so it decides no privilege, only where work is saved.
_QUERY_START = re.compile(r"\s*(?:\(\s*)*(?:SELECT|WITH|VALUES|TABLE|FROM)\b", re.IGNORECASE)


def _looks_like_a_query(statement: ast.Statement) -> bool:
    """Whether ``statement`` could be a plain query (a statement that is not, such as a
    1 MB literal INSERT, is then not analysed once here and again when it runs)."""
    return isinstance(statement, ast.SqlStatement) and bool(_QUERY_START.match(statement.sql))


def _drops_consumers(database: Any, operation: Any) -> bool:
    """Whether the topic DDL ``operation`` removes a consumer of an existing topic."""
    if not isinstance(operation, AlterTopicEntry):
        return False
    entry = database.catalog.entry(operation.name)
    return entry is not None and not set(entry.consumers) <= set(operation.consumers)


def _offset_text(offset: int | None) -> str:
    """A committed offset as users read it: none yet is "nothing committed", not None."""
    return "nothing committed" if offset is None else str(offset)


def _streamable(operation: RunQuery) -> bool:
    """A query DuckDB can answer batch by batch: it returns rows, writes nothing and needs
    no relation the engine registers whole first (``sys.`` views)."""
    return (
        operation.returns_rows
        and operation.tag == "SELECT"
        and not operation.tables_written
        and not operation.system_views
    )


def _plain_append_plan(plan: Plan) -> bool:
    """Whether ``plan`` is one ``INSERT INTO TOPIC ... VALUES`` with no option and no
    RETURNING: what ``Session._append`` offers to ``spread_append.append_plain`` outside a
    transaction (``Session._append_plain_now`` does so directly)."""
    operations = plan.operations
    if len(operations) != 1 or plan.explain_only:
        return False
    operation = operations[0]
    return (isinstance(operation, AppendRecords) and operation.rows is not None
            and not operation.options and not operation.returning)  # fmt: skip


def _moves_topics(plan: Plan) -> bool:
    """Whether the plan reads with a consumer, writes a topic or moves offsets."""
    return any(
        (isinstance(op, ReadRecords) and op.consumer is not None)
        or isinstance(op, AppendRecords | CommitConsumerOffsets | SetConsumerOffsets)
        for op in plan.operations
    )


def _checks_upserts(plan: Plan) -> bool:
    """Whether the plan has an upsert the engine checks after DuckDB ran it (``UpsertCheck``)."""
    return any(isinstance(op, RunQuery) and op.upsert_check is not None for op in plan.operations)


def _plain_select(operation: Any) -> bool:
    """A query of rows over DuckDB alone: a SELECT that projects no topic read and reads no
    system view (``Session._run`` registers nothing for it)."""
    return (
        type(operation) is RunQuery
        and operation.tag == "SELECT"
        and operation.returns_rows
        and operation.projection is None
        and not operation.system_views
    )


def _drops_move_source(database: Any, operation: DropTopicEntry) -> bool:
    """Whether a committed move not yet checkpointed names the dropped topic's ranges."""
    entry = database.catalog.entry(operation.name)
    return entry is not None and database.committer.pins_topic(entry.topic_id)


def _reads_no_table(plan: Plan) -> bool:
    """True if every query of the plan is a projection of a topic read (none reads DuckDB)."""
    return all(
        op.projection is not None for op in plan.operations if isinstance(op, RunQuery)
    )


def _projected(plan: Plan, placeholder: str) -> bool:
    """True if every query of the plan takes this relation's columns without DuckDB."""
    queries = [op for op in plan.operations if isinstance(op, RunQuery)]
    return bool(queries) and all(
        q.projection is not None and q.projection[0] == placeholder for q in queries
    )


def _projected_columns(plan: Plan) -> tuple[str, ...]:
    """The relation columns a ``_projected`` plan's queries take, each once."""
    queries = [q for q in plan.operations if isinstance(q, RunQuery) and q.projection]
    return tuple(dict.fromkeys(c for q in queries for c, _ in q.projection[1]))  # type: ignore[index]


def _empty_returning() -> pa.Table:
    return pa.table({
        "partition": pa.array([], pa.int32()), "offset": pa.array([], pa.int64()),
        "status": pa.array([], pa.string()), "seq_no": pa.array([], pa.int64()),
        "producer_id": pa.array([], pa.string()), "message_group_id": pa.array([], pa.string()),
        "created_at": pa.array([], pa.timestamp("us", tz="UTC")),
    })


def statement_line_offset(plan: Plan) -> int:
    """Lines before the statement in its script, to report DuckDB's syntax errors."""
    return plan.line - 1


def _query_result(operation: RunQuery, table: pa.Table | Rows | None) -> Result:
    if type(table) is Rows and operation.returns_rows:  # the rows' way's small result
        names = operation.column_names
        if names is not None and len(names) == table.num_columns != 0:  # as streams.named
            table = table.rename_columns(names)
        return Result(_rows_tag(operation.tag, len(table.rows)), table)
    if isinstance(table, Rows):
        names = operation.column_names
        if not operation.returns_rows:
            table = table.to_arrow()
        elif names is not None and len(names) == table.num_columns != 0:  # as streams.named
            table = table.rename_columns(list(names))
    if isinstance(table, pa.Table) and operation.returns_rows:
        table = streams.named(table, operation.column_names)
    dml_count = table is not None and table.column_names == ["Count"] and not operation.returns_rows
    if table is not None and table.column_names == ["Success"] and not operation.returns_rows:
        # DuckDB's marker of a statement without rows (DROP, ALTER, SET ...): PostgreSQL
        # answers those with a command tag alone, and clients (JDBC) refuse rows for them.
        return Result(operation.tag)
    if table is not None and not dml_count:
        return Result(_rows_tag(operation.tag, table.num_rows), table)
    if operation.returns_rows:
        assert table is not None
        return Result(_rows_tag(operation.tag, table.num_rows), table)
    count = None
    if table is not None and table.column_names == ["Count"] and table.num_rows == 1:
        count = table.column(0)[0].as_py()
    if operation.tag == "INSERT":
        return Result(f"INSERT 0 {count or 0}")
    if operation.tag in ("UPDATE", "DELETE", "MERGE"):
        return Result(f"{operation.tag} {count or 0}")
    return Result(operation.tag)


def _rows_tag(tag: str, rows: int) -> str:
    """The command tag of a statement that returned ``rows`` rows: ``SELECT n``, and for a
    write with RETURNING the count PostgreSQL gives (the rows it wrote, one row each:
    ``INSERT 0 n``, ``UPDATE n``, ``DELETE n``, ``MERGE n``); other tags as they are."""
    if tag in ("SELECT", "EMPTY"):
        return f"SELECT {rows}"
    if tag == "INSERT":
        return f"INSERT 0 {rows}"
    if tag in ("UPDATE", "DELETE", "MERGE"):
        return f"{tag} {rows}"
    return tag


def _bind(value: Any, parameters: Any) -> Any:
    if not isinstance(value, ast.Parameter):
        return value
    if parameters is None:
        raise InvalidParameterValueError(f"no value for parameter ${value.index}")
    try:
        if isinstance(parameters, dict):
            return parameters[str(value.index)]
        return parameters[value.index - 1]
    except (IndexError, KeyError):
        raise InvalidParameterValueError(f"no value for parameter ${value.index}") from None


def _proposed_rows(cursor: Any, check: UpsertCheck, parameters: Any) -> int:
    """How many rows an upsert proposes (``planner.upsert_check``): its VALUES' number, or
    its query's count, run first on the statement's cursor with its parameters."""
    if check.rows is not None:
        return check.rows
    assert check.count_sql is not None
    counted = tables.fetch_rows(cursor, check.count_sql, parameters)
    return int(counted[0][0])


def _row_affected_twice() -> CardinalityViolationError:
    """PostgreSQL's error for an ``ON CONFLICT DO UPDATE`` that proposed one key twice;
    raised after DuckDB ran it, so the statement fails and its transaction with it (an
    autocommit statement rolls back, an explicit transaction is aborted), as any error."""
    return CardinalityViolationError(
        "ON CONFLICT DO UPDATE command cannot affect row a second time",
        hint="Ensure that no rows proposed for insertion within the same command have "
        "duplicate constrained values.",
    )


def _bind_rows(rows: Sequence[Sequence[Any]], parameters: Any) -> list[tuple[Any, ...]]:
    """Every row with its parameters bound, each value as ``_bind`` binds it (the same
    values, the same error for a missing parameter).

    More than ``_BIND_ROWS_LOOP_MAX`` rows of one parameter each with positional
    parameters (psycopg's multi-row INSERT: 1000 rows of one ``$n`` each) are bound by C
    loops (``map``, ``zip``) instead of a ``_bind`` call a value: those calls were ~15 %
    of the server's CPU for such a statement."""
    if (len(rows) > _BIND_ROWS_LOOP_MAX and parameters is not None
            and not isinstance(parameters, dict) and set(map(len, rows)) == {1}):  # fmt: skip
        firsts = list(map(itemgetter(0), rows))
        if set(map(type, firsts)) == {ast.Parameter}:
            indexes = list(map(_INDEX, firsts))
            if max(indexes) <= len(parameters):  # else the loop below raises _bind's error
                return list(zip([parameters[index - 1] for index in indexes]))
    return [tuple(_bind(v, parameters) for v in row) for row in rows]


_INDEX = attrgetter("index")
# Up to this many rows the per-value loop is as fast (the C loops' set-up costs ~2 us; a
# one-row INSERT, the durable produce's, must not pay it).
_BIND_ROWS_LOOP_MAX = 8


def _bind_read_options(operation: ReadRecords, parameters: Any, catalog: Any) -> ReadRecords:
    """The read with its parameters bound and checked, as literals are when planned."""
    if not any(isinstance(v, ast.Parameter) for v in operation.options.values()):
        return operation
    bound = {k: _bind(v, parameters) for k, v in operation.options.items()}
    return planner.bind_read(operation, rules.validate_read_options(bound), catalog)


def _with_option(operation: ReadRecords, name: str, value: Any) -> ReadRecords:
    return ReadRecords(
        operation.topic,
        operation.topic_id,
        operation.partitions,
        operation.placeholder,
        operation.consumer,
        {**operation.options, name: value},
    )
