"""SET and RESET as PostgreSQL has them: undone by a rollback, reported when they change.

- A ``SET``/``RESET`` inside a transaction block is undone when the block ends without
  committing (ROLLBACK, the COMMIT of a failed transaction, a COMMIT refused at
  validation); outside a block it holds at once and for good.
- ``SET LOCAL`` holds until the end of its transaction, however it ends; outside a
  block it changes nothing and says so (a warning, as PostgreSQL gives).
- A change of a setting PostgreSQL reports (``GUC_REPORT``: ``application_name``,
  ``TimeZone``, ``DateStyle`` …) is queued as a ParameterStatus for the server to send.

Invariant: ``_before`` holds the values the settings had when the transaction it names
made its first change, and is cleared (applied or dropped) once that transaction is over.
The owner calls ``settle`` before and after every statement.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.api import Session, SessionState
from sql.pgwire.emulation.pg_settings import PgSettings

# Settings whose changes PostgreSQL reports with ParameterStatus (its GUC_REPORT flag).
REPORTED = frozenset({
    "application_name", "client_encoding", "datestyle", "default_transaction_read_only",
    "in_hot_standby", "integer_datetimes", "intervalstyle", "is_superuser",
    "server_encoding", "server_version", "session_authorization",
    "standard_conforming_strings", "timezone",
})  # fmt: skip


class SettingChanges:
    """Transaction scope and reporting of one connection's settings."""

    def __init__(self, settings: Callable[[], PgSettings]) -> None:
        self._settings = settings  # the connection's current PgSettings (replaced at start)
        self._transaction: Any = None  # the engine Transaction that changed settings
        self._before: dict[str, str] = {}
        self._local: set[str] = set()  # names set with SET LOCAL in that transaction
        self.reports: list[tuple[str, str]] = []  # (shown name, value) to send

    def change(self, session: Session, apply: Callable[[], None], *, local: bool) -> bool:
        """Run ``apply`` (which changes settings) in the scope of the session's transaction.

        False, and nothing changed, for ``SET LOCAL`` outside a transaction block."""
        in_block = session.state is SessionState.IN_TRANSACTION
        if local and not in_block:
            return False
        if in_block and self._transaction is not session.transaction:
            self.settle(session)
            self._transaction = session.transaction
            self._before = dict(self._settings().values)
            self._local = set()
        before = dict(self._settings().values)
        apply()
        changed = _changed(before, self._settings().values)
        if in_block:
            self._local = (self._local | changed) if local else (self._local - changed)
        self._report(changed)
        return True

    def settle(
        self, session: Session, on_restore: Callable[[set[str]], None] | None = None
    ) -> None:
        """Once the transaction that changed settings is over: undo its changes if it did
        not commit, else only its ``SET LOCAL`` ones. ``on_restore`` gets the names put back."""
        transaction = self._transaction
        if transaction is None:
            return
        if session.transaction is transaction and session.state is not SessionState.IDLE:
            return
        settings = self._settings()
        if transaction.committed:
            restored = set(self._local)
        else:
            restored = set(self._before) | set(settings.values)
        values = dict(settings.values)
        for name in restored:
            if name in self._before:
                values[name] = self._before[name]
            else:
                values.pop(name, None)
        changed = _changed(settings.values, values)
        settings.values = values
        self._transaction, self._before, self._local = None, {}, set()
        self._report(changed)
        if changed and on_restore is not None:
            on_restore(changed)

    def _report(self, names: set[str]) -> None:
        settings = self._settings()
        for name in sorted(names & REPORTED):
            self.reports.append((settings.shown_name(name), settings.values.get(name, "")))

    def take_reports(self) -> list[tuple[str, str]]:
        reports, self.reports = self.reports, []
        return reports


def _changed(before: dict[str, str], after: dict[str, str]) -> set[str]:
    return {name for name in set(before) | set(after) if before.get(name) != after.get(name)}
