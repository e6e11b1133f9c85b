"""The PostgreSQL surface of one wire connection: catalog queries and session commands.

``ConnectionCatalog.execute`` stands between the server and ``Session.execute_statement``:

- ``SET`` / ``RESET`` / ``SHOW`` of PostgreSQL settings run here against the
  connection's ``PgSettings`` (``pg_settings``); other names (DuckDB's ``SET threads``)
  go to the engine. ``SET search_path`` is also applied to DuckDB, so it takes effect.
  Unlike PostgreSQL, ``SET LOCAL`` lasts for the session, and ``ROLLBACK`` does not undo
  a ``SET`` made in the transaction.
- ``SAVEPOINT`` and ``RELEASE [SAVEPOINT]`` are accepted inside a transaction block and
  remembered by name; they mark nothing (DuckDB has no savepoints). ``ROLLBACK TO
  [SAVEPOINT]`` answers as PostgreSQL does where it can: 25P01 outside a block, 3B001 for
  a name not remembered (in a failed block too); to a remembered name it is refused
  (0A000), which fails the transaction, so work since the savepoint is never silently
  kept or lost. SQLAlchemy's connect sequence (SAVEPOINT, a ``pg_type`` look-up, RELEASE)
  needs only the first two.
- ``DEALLOCATE name|ALL`` drops the connection's prepared statements (psycopg sends
  ``DEALLOCATE ALL``); ``DISCARD ALL`` also resets the settings.
- ``CREATE TABLE`` with ``SERIAL``/``BIGSERIAL`` columns (SQLAlchemy's integer primary
  keys) creates a sequence ``<table>_<column>_seq`` and uses ``nextval`` as the default.
- ``statement_timeout`` is enforced: a statement running longer is cancelled (57014).
- Queries that read ``pg_catalog``/``information_schema`` or call PostgreSQL's catalog
  functions are rewritten into DuckDB SQL (``pg_rewrite``) and run as ordinary SQL by
  the engine, in the session's transaction.
- Everything else goes to the engine untouched; the check costs a few anchored regexes,
  once per text (``_goes_unchanged`` keeps the answer by text).

``plain_begin`` (called before parsing) turns ``BEGIN ISOLATION LEVEL …`` into ``BEGIN``
for the levels every transaction already provides.

Inside a failed transaction every statement goes to the engine, which refuses it
(25P02) as PostgreSQL does. Thread-safety: one instance per connection, called on the
connection's worker thread only.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import sqlglot
from sqlglot import expressions as exp

from engine.api import Result, Session, SessionState, ast
from sql.pgwire.emulation import pg_rewrite
from sql.pgwire.emulation.pg_settings import PgSettings
from sql.pgwire.emulation.setting_changes import SettingChanges
from storage.errors import (
    ActiveSqlTransactionError,
    FeatureNotSupportedError,
    NoActiveSqlTransactionError,
    QueryCanceledError,
    SqlSyntaxError,
    TopicbaseError,
    UndefinedPreparedStatementError,
)
from storage.limits import CACHED_TEXT_CHARS_MAX


class InvalidSavepointError(TopicbaseError):
    sqlstate = "3B001"


_SESSION_COMMAND = re.compile(
    r"^\s*(SET|RESET|SHOW|SAVEPOINT|RELEASE|DEALLOCATE|DISCARD"
    r"|ROLLBACK\s+(?:(?:WORK|TRANSACTION)\s+)?TO)\b",
    re.IGNORECASE,
)
_NAME = r"(\"(?:[^\"]|\"\")+\"|\w+)"  # an identifier, maybe "quoted"
_DEALLOCATE = re.compile(r"^\s*DEALLOCATE\s+(?:PREPARE\s+)?" + _NAME + r"\s*;?\s*$", re.IGNORECASE)
_DISCARD_ALL = re.compile(r"^\s*DISCARD\s+ALL\s*;?\s*$", re.IGNORECASE)
_SHOW = re.compile(r"^\s*SHOW\s+(.+?)\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_RESET = re.compile(r"^\s*RESET\s+(.+?)\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_SET = re.compile(
    r"^\s*SET\s+(?:(SESSION|LOCAL)\s+(?!CHARACTERISTICS|AUTHORIZATION))?(.+?)\s*;?\s*$",
    re.IGNORECASE | re.DOTALL,
)
_PARAMETER = re.compile(r"\$\d+")
_SET_NAMED = re.compile(
    r"^([A-Za-z_][\w.]*)\s*(?:=|\s+TO\s+|\s+)\s*(.+)$", re.IGNORECASE | re.DOTALL
)
_SET_SPECIAL = re.compile(
    r"^(TIME\s+ZONE|NAMES|SCHEMA|SESSION\s+CHARACTERISTICS\s+AS\s+TRANSACTION\s+ISOLATION\s+LEVEL"
    r"|TRANSACTION\s+ISOLATION\s+LEVEL|SESSION\s+AUTHORIZATION)\s+(.+)$",
    re.IGNORECASE | re.DOTALL,
)
_SAVEPOINT = re.compile(r"^\s*SAVEPOINT\s+" + _NAME + r"\s*;?\s*$", re.IGNORECASE)
_RELEASE = re.compile(r"^\s*RELEASE\s+(?:SAVEPOINT\s+)?" + _NAME + r"\s*;?\s*$", re.IGNORECASE)
_ROLLBACK_TO = re.compile(
    r"^\s*ROLLBACK\s+(?:(?:WORK|TRANSACTION)\s+)?TO\s+(?:SAVEPOINT\s+)?" + _NAME + r"\s*;?\s*$",
    re.IGNORECASE,
)
_ROLLBACK_TO_HEAD = re.compile(r"^\s*ROLLBACK\s+(?:(?:WORK|TRANSACTION)\s+)?TO\b", re.IGNORECASE)


def _sql_prepared(session: Session) -> list[str]:
    """The names of the session's SQL-level prepared statements (``PREPARE name AS``),
    which the engine keeps as text (``engine.prepared_room``)."""
    return session.sql_statements.names()


def is_rollback_to(sql: str) -> bool:
    """Whether ``sql`` is a ROLLBACK TO [SAVEPOINT] (a statement a failed transaction takes)."""
    return _ROLLBACK_TO_HEAD.match(sql) is not None


# the command's name in PostgreSQL's messages, by its first word
_SAVEPOINT_COMMANDS = {
    "SAVEPOINT": "SAVEPOINT", "RELEASE": "RELEASE SAVEPOINT", "ROLLBACK": "ROLLBACK TO SAVEPOINT"
}  # fmt: skip
_SERIAL = re.compile(r"\b(SMALL|BIG)?SERIAL\b", re.IGNORECASE)
_CREATE_TABLE = re.compile(r"^\s*CREATE\s+(?:TEMP\w*\s+)?TABLE\b", re.IGNORECASE)
_SERIAL_TYPES = {"SMALLSERIAL": "SMALLINT", "SERIAL": "INTEGER", "BIGSERIAL": "BIGINT"}
_VALUE = re.compile(r"\s*('(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|[^,\s]+)\s*(?:,|$)")


_UNCHANGED_KEPT = 1024
# SQL text -> whether ``ConnectionCatalog`` hands it to the engine as it is, whatever the
# connection's settings: no session command, no CREATE TABLE (SERIAL columns), no SHOW,
# nothing ``pg_rewrite`` may rewrite. Depends on the text alone; cleared when full.
_unchanged: dict[str, bool] = {}


def _goes_unchanged(sql: str) -> bool:
    """Whether ``sql`` certainly goes to the engine untouched (``_unchanged``): a repeated
    statement pays for the regexes once."""
    unchanged = _unchanged.get(sql)
    if unchanged is None:
        unchanged = (
            _SESSION_COMMAND.match(sql) is None
            and _CREATE_TABLE.match(sql) is None
            and _SHOW.match(sql) is None
            and not pg_rewrite.might_need_rewrite(sql)
        )
        if len(sql) <= CACHED_TEXT_CHARS_MAX:
            if len(_unchanged) >= _UNCHANGED_KEPT:
                _unchanged.clear()
            _unchanged[sql] = unchanged
    return unchanged


_BEGIN_WITH_MODES = re.compile(
    r"^\s*(?:BEGIN(?:\s+(?:WORK|TRANSACTION))?|START\s+TRANSACTION)\s+"
    r"((?:ISOLATION\s+LEVEL\s+(?:READ\s+UNCOMMITTED|READ\s+COMMITTED|REPEATABLE\s+READ)"
    r"|READ\s+WRITE|NOT\s+DEFERRABLE)(?:\s*,?\s*(?:ISOLATION\s+LEVEL\s+(?:READ\s+UNCOMMITTED"
    r"|READ\s+COMMITTED|REPEATABLE\s+READ)|READ\s+WRITE|NOT\s+DEFERRABLE))*)\s*;?\s*$",
    re.IGNORECASE,
)


def plain_begin(query: str) -> str:
    """``BEGIN ISOLATION LEVEL REPEATABLE READ`` (what psycopg sends once SQLAlchemy set a
    level) -> ``BEGIN``, for the modes every transaction already has: snapshot isolation
    is at least as strong as READ COMMITTED and is REPEATABLE READ. SERIALIZABLE, READ
    ONLY and DEFERRABLE are left as they are, and the grammar refuses them (42601)."""
    if not _BEGIN_WITH_MODES.match(query):
        return query
    return "BEGIN"


_LOCAL_OUTSIDE_BLOCK = "SET LOCAL can only be used in transaction blocks"


class ConnectionCatalog:
    """Session settings, savepoint names and catalog rewriting of one connection."""

    def __init__(self, server_version: str, prepared: dict[str, Any],
                 defaults: Mapping[str, str] | None = None) -> None:  # fmt: skip
        """``prepared``: the connection's prepared statements by name (DEALLOCATE);
        ``defaults``: the server's defaults of settings (``PgSettings``)."""
        self.server_version = server_version
        self.prepared = prepared
        self.defaults = dict(defaults or {})
        self.user = "topicbase"
        self.database = "topicbase"
        self.settings = PgSettings(server_version, self.user, "", self.defaults)
        self.savepoints: list[str] = []
        self.changes = SettingChanges(lambda: self.settings)  # rollback and ParameterStatus

    def start(self, parameters: dict[str, str], *, superuser: bool = True) -> None:
        """Take the StartupMessage's user, database and application_name, and whether the
        authenticated user is a superuser."""
        self.user = parameters.get("user") or "topicbase"
        self.database = parameters.get("database") or self.user
        self.settings = PgSettings(
            self.server_version, self.user, parameters.get("application_name", ""), self.defaults,
            superuser=superuser,
        )

    def superuser_changed(self, flag: str) -> bool:
        """``is_superuser`` is now ``flag`` ("on"/"off"): the users file changed under the
        session (``Connection.check_users_file``); True if that is news (a ParameterStatus
        goes out, as PostgreSQL reports ``is_superuser``)."""
        return self.settings.superuser_changed(flag)

    def _show_superuser(self, session: Session) -> None:
        """``is_superuser`` follows the current role, as in PostgreSQL: after a SET ROLE,
        RESET ROLE or SET SESSION AUTHORIZATION (or their undoing by a ROLLBACK) it is
        set again and reported when it changed, also after a ROLLBACK's put-back of the
        settings (``SettingChanges.settle``) restored an older value. The role is the
        settled one: a ROLLBACK that undid a SET ROLE reports the role it returned to."""
        flag = "on" if session.settled_identity().superuser else "off"
        if self.settings.superuser_changed(flag):
            self.changes.reports.append(("is_superuser", flag))

    def execute(self, session: Session, statement: ast.Statement, parameters: Any) -> Result:
        """Run ``statement``: here (session commands), rewritten, or as it is. Settings
        changed by a transaction that ended without committing are put back after it."""
        self._settle(session)
        try:
            return self._execute(session, statement, parameters)
        finally:
            self._settle(session)
            self._show_superuser(session)

    def answer_lookup(self, session: Session, statement: ast.Statement, parameters: Any
                      ) -> Result | None:  # fmt: skip
        """``execute`` of a statement the engine answers as a primary-key lookup from an
        index (``Session.answer_lookup``), or None: nothing ran (the caller then runs it
        through ``execute``). Only where ``_ready_to_answer`` says so."""
        if not self._ready_to_answer(session, statement):
            return None
        return session.answer_lookup(statement, parameters)

    def answer_literal(self, session: Session, statement: ast.Statement) -> Result | None:
        """``execute`` of a parameterless SELECT of literals whose row the engine keeps
        (``Session.answer_literal``), or None: nothing ran (the caller then runs it through
        ``execute``). Only where ``_ready_to_answer`` says so."""
        if not self._ready_to_answer(session, statement):
            return None
        return session.answer_literal(statement)

    def append_prepared(self, session: Session, statement: ast.Statement, parameters: Any
                        ) -> Result | None:  # fmt: skip
        """``execute`` of a prepared autocommit ``INSERT INTO TOPIC ... VALUES`` of plain
        rows by the engine's kept way (``Session.append_prepared``), or None: nothing ran
        (the caller then runs it through ``execute``). Only outside a transaction and
        without a ``statement_timeout`` (``execute`` arms its timer); then ``execute``
        would do nothing else around it but settle the settings of a transaction that
        ended and forget its savepoints (done here), as for ``_ready_to_answer``: a topic
        statement goes to the engine unchanged, and an append changes no setting or role."""
        if not self._idle_untimed(session):
            return None
        return session.append_prepared(statement, parameters)

    def _ready_to_answer(self, session: Session, statement: ast.Statement) -> bool:
        """Whether the engine may answer ``statement`` by one of its kept answers in place
        of ``execute``: a statement ``execute`` hands to the engine as it is, without a
        ``statement_timeout`` (``execute`` arms its timer), outside a transaction. Then
        ``execute`` would do nothing else around it but settle the settings of a
        transaction that ended and forget its savepoints: done here when True."""
        if (not isinstance(statement, ast.SqlStatement) or statement.topic_scans
                or not _goes_unchanged(statement.sql)):  # fmt: skip
            return False
        return self._idle_untimed(session)

    def _idle_untimed(self, session: Session) -> bool:
        """Whether ``session`` is outside a transaction and no ``statement_timeout`` is set
        (``execute`` arms its timer): then what ``execute`` does around a statement the
        engine runs as it is comes down to settling the settings of a transaction that
        ended and forgetting its savepoints, done here when True."""
        if (session.state is not SessionState.IDLE
                or _milliseconds(self.settings.values["statement_timeout"]) != 0):  # fmt: skip
            return False
        self._settle(session)
        self.savepoints.clear()  # as ``_execute`` does outside a transaction
        return True

    def _settle(self, session: Session) -> None:
        def restored(names: set[str]) -> None:
            if "search_path" in names:
                _apply_search_path(session, self.settings.show("search_path"))

        self.changes.settle(session, restored)

    def _execute(self, session: Session, statement: ast.Statement, parameters: Any) -> Result:
        if session.state is SessionState.IDLE:
            self.savepoints.clear()
        if (not isinstance(statement, ast.SqlStatement) or statement.topic_scans
                or _goes_unchanged(statement.sql)):  # fmt: skip
            return self._run_with_timeout(session, statement, parameters)
        sql = statement.sql
        command = _SESSION_COMMAND.match(sql)
        if command is not None and (session.state is not SessionState.FAILED
                                    or command.group(1)[:8].upper() == "ROLLBACK"):  # fmt: skip
            result = self._session_command(session, sql)
            if result is not None:
                return result
        if _CREATE_TABLE.match(sql) and _SERIAL.search(sql):
            sql = _serial_columns(session, sql)
            statement = ast.SqlStatement(sql, (), statement.position, statement.text)
        return self._run_with_timeout(session, self.engine_statement(statement), parameters)

    def _run_with_timeout(
        self, session: Session, statement: ast.Statement, parameters: Any
    ) -> Result:
        """Run ``statement``; past ``statement_timeout`` it is cancelled as by CancelRequest.
        The time counts from the message's arrival for its first statement (the wire's own
        work on the text included: ``Session.statement_time_left``); a statement whose time
        is up before it starts is cancelled at once (57014, failing an open transaction)."""
        timeout_ms = _milliseconds(self.settings.values["statement_timeout"])
        if timeout_ms == 0:
            return session.execute_statement(statement, parameters)
        left_s = session.statement_time_left(timeout_ms / 1000)
        if left_s <= 0:  # the message's cancel: the statement's start ends it (not a ROLLBACK)
            session.cancel()
        timer = threading.Timer(max(0.0, left_s), session.cancel)
        timer.daemon = True
        if left_s > 0:
            timer.start()
        try:
            return session.execute_statement(statement, parameters)
        except QueryCanceledError as error:
            if left_s <= 0 or not timer.is_alive():  # fired: say why, as PostgreSQL does
                raise QueryCanceledError("canceling statement due to statement timeout") from error
            raise
        finally:
            timer.cancel()

    def is_session_command(self, statement: ast.Statement) -> bool:
        """SET, RESET, SHOW, SAVEPOINT …: statements this layer may answer itself."""
        return isinstance(statement, ast.SqlStatement) and bool(
            _SESSION_COMMAND.match(statement.sql)
        )

    def engine_statement(self, statement: ast.Statement) -> ast.Statement:
        """What the engine should describe for ``statement`` (Describe before Execute):
        the rewritten catalog query, or for ``SHOW`` a one-column SELECT of the same shape.
        Changes nothing."""
        if not isinstance(statement, ast.SqlStatement) or statement.topic_scans:
            return statement
        sql = statement.sql
        show = _SHOW.match(sql)
        if show is not None and self.settings.knows(show.group(1)):
            column = self.settings.canonical(show.group(1)).replace('"', "")
            return ast.SqlStatement(f'SELECT \'\' AS "{column}"', (), statement.position,
                                    statement.text)  # fmt: skip
        if pg_rewrite.might_need_rewrite(sql):
            rewritten = pg_rewrite.rewrite(sql, self._context())
            if rewritten is not None:
                return ast.SqlStatement(rewritten, (), statement.position, statement.text)
        return statement

    def _context(self) -> pg_rewrite.RewriteContext:
        path = tuple(
            part.strip().strip('"')
            for part in self.settings.show("search_path").split(",")
            if part.strip() and part.strip() != '"$user"'
        )
        return pg_rewrite.RewriteContext(
            self.user,
            self.database,
            self.server_version,
            tuple(sorted(self.settings.values.items())),
            path,
        )

    # -- SET, RESET, SHOW, SAVEPOINT, RELEASE, DEALLOCATE, DISCARD ------------------------------
    def _session_command(self, session: Session, sql: str) -> Result | None:
        """The result of a session command run here; None to let the engine run it."""
        word = sql.split(None, 1)[0].upper()
        try:
            if word == "SHOW":
                return self._show(sql)
            if word == "RESET":
                return self._reset(session, sql)
            if word == "SET":
                return self._set(session, sql)
            if word in ("DEALLOCATE", "DISCARD"):
                return self._deallocate(session, sql)
            return self._savepoint(session, sql, word)
        except TopicbaseError:
            session.fail_transaction()  # as in PostgreSQL: 25P02 until ROLLBACK
            raise

    def _show(self, sql: str) -> Result | None:
        match = _SHOW.match(sql)
        if match is None:
            return None
        name = match.group(1)
        if name.lower() == "all":
            return Result("SHOW", self.settings.show_all())
        if not self.settings.knows(name):
            return None
        column = self.settings.canonical(name)
        return Result("SHOW", pa.table({column: [self.settings.show(name)]}))

    def _reset(self, session: Session, sql: str) -> Result | None:
        match = _RESET.match(sql)
        if match is None:
            return None
        name = match.group(1)
        if name.lower() == "all":
            self.changes.change(session, self.settings.reset_all, local=False)
            _apply_search_path(session, self.settings.show("search_path"))
        elif not self.settings.knows(name):
            return None
        else:
            superuser = session.identity.superuser
            self.changes.change(session, lambda: self.settings.set(name, None, superuser=superuser),
                                local=False)  # fmt: skip
            if self.settings.canonical(name) == "search_path":
                _apply_search_path(session, self.settings.show("search_path"))
        return Result("RESET")

    def _set(self, session: Session, sql: str) -> Result | None:
        match = _SET.match(sql)
        if match is None:
            return None
        body = match.group(2)
        special = _SET_SPECIAL.match(body)
        if special is not None:
            name, raw = " ".join(special.group(1).lower().split()), special.group(2)
            if name.startswith("session characteristics"):
                name = "default_transaction_isolation"
            elif name == "transaction isolation level":
                name = "transaction_isolation"
            if name.endswith("isolation"):  # a level is words (READ COMMITTED), not a list
                raw = "'" + " ".join(raw.rstrip(";").split()) + "'"
        else:
            named = _SET_NAMED.match(body)
            if named is None:
                return None
            name, raw = named.group(1), named.group(2)
        if not self.settings.knows(name):
            return None
        value = None if raw.strip().upper() in ("DEFAULT", "LOCAL") else _value_text(raw)
        local = (match.group(1) or "").upper() == "LOCAL"
        superuser = session.identity.superuser
        if not self.changes.change(
            session, lambda: self.settings.set(name, value, superuser=superuser), local=local
        ):
            return Result("SET", notices=(_LOCAL_OUTSIDE_BLOCK,))
        if self.settings.canonical(name) == "search_path":
            _apply_search_path(session, self.settings.show("search_path"))
        return Result("SET")

    def _deallocate(self, session: Session, sql: str) -> Result | None:
        """``DEALLOCATE name|ALL`` (prepared statements are the server's) and ``DISCARD ALL``."""
        if _DISCARD_ALL.match(sql):
            if session.state is not SessionState.IDLE:
                raise ActiveSqlTransactionError("DISCARD ALL cannot run inside a transaction block")
            # PostgreSQL's DISCARD ALL: SET SESSION AUTHORIZATION DEFAULT, RESET ALL,
            # DEALLOCATE ALL, DISCARD TEMP (a pooler's next client starts clean).
            session.execute("SET SESSION AUTHORIZATION DEFAULT")
            self._forget_prepared(session)
            self.settings.reset_all()
            _apply_search_path(session, self.settings.show("search_path"))
            session.discard_temporary()
            return Result("DISCARD ALL")
        match = _DEALLOCATE.match(sql)
        if match is None:
            return None
        name = match.group(1)
        if name.upper() == "ALL":
            self._forget_prepared(session)
            return Result("DEALLOCATE ALL")
        name = name[1:-1].replace('""', '"') if name.startswith('"') else name.lower()
        if name in self.prepared:
            del self.prepared[name]
            return Result("DEALLOCATE")
        if session.sql_statements.statement_of("DEALLOCATE " + match.group(1)) is not None:
            return None  # an SQL-level PREPARE's, which the engine keeps: it runs it
        raise UndefinedPreparedStatementError(f'prepared statement "{name}" does not exist')

    def _forget_prepared(self, session: Session) -> None:
        """DEALLOCATE ALL: the protocol's named statements and the SQL-level PREPAREs that
        the engine keeps for the session (they count in the session's bound on prepared
        statements, ``engine.prepared_room``; a pooler's DISCARD ALL must free them)."""
        for name in [name for name in self.prepared if name]:  # the unnamed one stays
            del self.prepared[name]
        if _sql_prepared(session):
            session.execute("DEALLOCATE ALL")  # the engine's: DuckDB holds none of them

    def _savepoint(self, session: Session, sql: str, word: str) -> Result | None:
        """SAVEPOINT, RELEASE and ROLLBACK TO; the only one of them run in a failed
        transaction is ROLLBACK TO (``_execute``)."""
        pattern = {"SAVEPOINT": _SAVEPOINT, "RELEASE": _RELEASE, "ROLLBACK": _ROLLBACK_TO}[word]
        command = _SAVEPOINT_COMMANDS[word]
        match = pattern.match(sql)
        if match is None:
            raise SqlSyntaxError(f"syntax error in {command}: expected a savepoint name")
        name = match.group(1)
        name = name[1:-1].replace('""', '"') if name.startswith('"') else name.lower()
        if session.state is SessionState.IDLE:
            raise NoActiveSqlTransactionError(f"{command} can only be used in transaction blocks")
        if word == "SAVEPOINT":
            self.savepoints.append(name)
            return Result("SAVEPOINT")
        if name not in self.savepoints:
            raise InvalidSavepointError(f'savepoint "{name}" does not exist')
        if word == "ROLLBACK":  # DuckDB cannot go back to it: the block fails (_session_command)
            raise FeatureNotSupportedError(
                "ROLLBACK TO SAVEPOINT is not supported (savepoints mark nothing): "
                "the transaction has failed; ROLLBACK it"
            )
        del self.savepoints[self.savepoints.index(name):]  # fmt: skip
        return Result("RELEASE")


def _milliseconds(shown: str) -> int:
    """``5000ms`` or ``0`` (as ``PgSettings`` stores durations) -> milliseconds."""
    return int(shown[:-2]) if shown.endswith("ms") else int(shown)


def _value_text(raw: str) -> str:
    """``'a', b , "c"`` -> ``a, b, c``: the shown value of a SET list."""
    values = []
    position = 0
    text = raw.strip()
    while position < len(text):
        match = _VALUE.match(text, position)
        if match is None or match.end() == position:
            raise SqlSyntaxError(f'syntax error in SET value "{raw.strip()}"')
        token = match.group(1)
        if _PARAMETER.fullmatch(token):
            # PostgreSQL's SET takes no bound parameter (42601): storing the text "$1"
            # would make the client believe its value was set.
            raise SqlSyntaxError(f'syntax error at or near "{token}"')
        if token.startswith("'"):
            token = token[1:-1].replace("''", "'")
        elif token.startswith('"'):
            token = token[1:-1].replace('""', '"')
        values.append(token)
        position = match.end()
    return ", ".join(values)


def _serial_columns(session: Session, sql: str) -> str:
    """``CREATE TABLE t (id SERIAL ...)`` (SQLAlchemy's integer primary keys): DuckDB has no
    SERIAL, so each such column becomes ``INTEGER DEFAULT nextval('t_id_seq')`` after
    creating that sequence, as PostgreSQL does. The sequence is created first; if the
    table then fails, the sequence stays (``CREATE SEQUENCE IF NOT EXISTS`` reuses it)."""
    try:
        tree = sqlglot.parse_one(sql, read="postgres")
    except sqlglot.errors.SqlglotError:
        return sql
    table = tree.find(exp.Table)
    if not isinstance(tree, exp.Create) or table is None:
        return sql
    serial = [column.name for column in tree.find_all(exp.ColumnDef)
              if (kind := column.args.get("kind")) is not None
              and kind.this.name in _SERIAL_TYPES]  # fmt: skip
    matches = list(_SERIAL.finditer(sql))
    if len(serial) != len(matches):
        return sql  # SERIAL also elsewhere (a default, a name): leave it to DuckDB
    pieces, position = [], 0
    for column, match in zip(serial, matches, strict=True):
        name = f"{table.name}_{column}_seq".replace('"', "")
        sequence = f"{table.db}.{name}" if table.db else name
        quoted = f'"{table.db}"."{name}"' if table.db else f'"{name}"'
        session.execute(f"CREATE SEQUENCE IF NOT EXISTS {quoted}")
        kind = _SERIAL_TYPES[match.group(0).upper()]
        pieces += [sql[position : match.start()], f"{kind} DEFAULT nextval('{sequence}')"]
        position = match.end()
    return "".join([*pieces, sql[position:]])


def _apply_search_path(session: Session, path: str) -> None:
    """Give DuckDB the schemas of ``search_path`` (without PostgreSQL's ``$user``)."""
    schemas = [p.strip().strip('"') for p in path.split(",") if p.strip() not in ('"$user"', "")]
    if "pg_catalog" in schemas:
        schemas.remove("pg_catalog")
    value = ",".join(schemas) or "main"
    quoted = "'" + value.replace("'", "''") + "'"
    session.execute(f"SET search_path = {quoted}")
