"""PostgreSQL session settings of one wire connection: ``SET``, ``SHOW``, ``RESET``.

Clients read settings on connect (SQLAlchemy: ``show transaction isolation level``,
``show standard_conforming_strings``) and some set them. This module owns the table of
settings a PostgreSQL 15 server reports, their values for one connection, and the
parsing of the statements that read and change them.

Invariants: a value is only ever stored after its check passed, so ``SHOW`` never
reports a value the server does not honour; settings whose only honest value is fixed
(``client_encoding`` UTF8, ``standard_conforming_strings`` on, ``DateStyle`` ISO,
``IntervalStyle`` postgres, ``TimeZone`` UTC, ``bytea_output`` hex) refuse any other
value with 22023 instead of pretending. Settings that are stored and shown but not
enforced (``lock_timeout``, ``client_min_messages`` …) say so in their description;
``statement_timeout`` is enforced by ``pg_catalog``; ``idle_session_timeout`` and
``idle_in_transaction_session_timeout`` by the server (``sql.pgwire.server``: FATAL 57P05
/ 25P03 and the connection closed); ``log_statement`` (none, ddl, mod, all) by the server
too, and only a superuser may change it (``SUPERUSER_SETTINGS``: 42501 for others).

A server may give settings other defaults (``topicbase serve --idle-session-timeout``…):
``PgSettings(defaults=…)``, checked as a SET would be; RESET returns to them.

Names PostgreSQL does not know are not handled here (``PgSettings.knows`` is False):
the caller passes them to DuckDB, whose own ``SET threads = 2`` and the like keep working.
Thread-safety: one instance per connection, used from that connection's thread only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyarrow as pa

from storage.errors import (
    FeatureNotSupportedError,
    InsufficientPrivilegeError,
    InvalidParameterValueError,
    LimitExceededError,
    TopicbaseError,
    UndefinedObjectError,
)
from storage.limits import (
    NAME_BYTES_MAX,
    SESSION_SETTINGS_CHARS_MAX,
    SESSION_SETTINGS_MAX,
    SETTING_DURATION_MS_MAX,
)


class CantChangeRuntimeParameterError(TopicbaseError):
    """``SET`` of a read-only setting (55P02)."""

    sqlstate = "55P02"


class UndefinedSettingError(UndefinedObjectError):
    """``SHOW``/``current_setting`` of a setting nobody knows (42704)."""


@dataclass(frozen=True)
class Setting:
    """One PostgreSQL setting: its shown name, default, description and value check.

    ``check`` returns the value to store (normalised) or raises 22023; None means
    read-only (55P02).
    """

    name: str
    default: str
    description: str
    check: Callable[[str], str] | None = None


def _name_data(value: str) -> str:
    """``application_name`` cut to 63 bytes (whole characters), silently: a longer one
    went out in a ParameterStatus that libpq refuses (at most 30,000 bytes in such a
    message), losing the client its connection. PostgreSQL keeps the setting whole (it
    escapes non-ASCII) and cuts only ``pg_stat_activity``'s copy to NAMEDATALEN - 1 bytes;
    Topicbase cuts the setting itself, to that length."""
    data = value.encode("utf-8", "surrogatepass")
    if len(data) <= NAME_BYTES_MAX:
        return value
    return data[:NAME_BYTES_MAX].decode("utf-8", "ignore")


def _any(value: str) -> str:
    return value


def _one_of(*allowed: str, shown: str | None = None) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value.lower() not in allowed:
            raise InvalidParameterValueError(
                f'invalid value "{value}": Topicbase supports only {", ".join(allowed)}'
            )
        return shown if shown is not None else value.lower()

    return check


def _date_style(value: str) -> str:
    parts = [part.strip().upper() for part in value.split(",")]
    if "ISO" not in parts and not set(parts) <= {"MDY", "DMY", "YMD"}:
        raise InvalidParameterValueError(
            f'invalid value for DateStyle "{value}": Topicbase writes dates in ISO only'
        )
    order = next((part for part in parts if part in ("MDY", "DMY", "YMD")), "MDY")
    return f"ISO, {order}"


def _duration_ms(value: str) -> str:
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|min|h|d)?\s*", value.lower())
    if match is None:
        raise InvalidParameterValueError(f'invalid value "{value}": expected a duration')
    factor = {None: 1, "ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
    milliseconds = int(match.group(1)) * factor[match.group(2)]
    if milliseconds > SETTING_DURATION_MS_MAX:
        raise InvalidParameterValueError(
            f'invalid value "{value}": at most {SETTING_DURATION_MS_MAX} ms (PostgreSQL\'s INT_MAX)'
        )
    return "0" if milliseconds == 0 else f"{milliseconds}ms"




def milliseconds(shown: str) -> int:
    """A duration as ``PgSettings`` stores it (``5000ms`` or ``0``) in milliseconds."""
    return int(shown.removesuffix("ms"))


def _isolation(value: str) -> str:
    level = " ".join(value.lower().replace("_", " ").split())
    if level == "serializable":
        raise FeatureNotSupportedError(
            "SERIALIZABLE is not supported: tables get snapshot isolation (REPEATABLE READ); "
            "topic reads are checked at COMMIT (40001)"
        )
    if level not in ("read uncommitted", "read committed", "repeatable read"):
        raise InvalidParameterValueError(f'invalid transaction isolation level "{value}"')
    # Every transaction runs under snapshot isolation, at least as strong as asked.
    return "repeatable read"


_NOT_ENFORCED = " (stored and shown; Topicbase does not enforce it)"
_UTC_NAMES = ("utc", "etc/utc", "gmt", "etc/gmt", "z", "zulu", "universal", "+00", "0")

SETTINGS: tuple[Setting, ...] = (
    Setting("server_version", "", "Server version."),
    Setting("server_version_num", "150000", "Server version as an integer."),
    Setting("server_encoding", "UTF8", "Server (database) character set encoding."),
    Setting(
        "client_encoding",
        "UTF8",
        "Client character set encoding.",
        _one_of("utf8", "utf-8", "unicode", shown="UTF8"),
    ),
    Setting(
        "standard_conforming_strings",
        "on",
        "'...' strings treat backslashes literally.",
        _one_of("on", "true", "1", shown="on"),
    ),
    Setting("DateStyle", "ISO, MDY", "Display format for date and time values.", _date_style),
    Setting(
        "IntervalStyle", "postgres", "Display format for interval values.", _one_of("postgres")
    ),
    Setting(
        "TimeZone",
        "UTC",
        "Time zone for timestamps (results are always in UTC).",
        _one_of(*_UTC_NAMES, shown="UTC"),
    ),
    Setting("integer_datetimes", "on", "Datetimes are integer based."),
    Setting("bytea_output", "hex", "Output format for bytea.", _one_of("hex")),
    Setting(
        "transaction_isolation",
        "repeatable read",
        "Isolation level of the current transaction (snapshot isolation).",
        _isolation,
    ),
    Setting(
        "default_transaction_isolation",
        "repeatable read",
        "Isolation level of new transactions (snapshot isolation).",
        _isolation,
    ),
    Setting(
        "transaction_read_only",
        "off",
        "Current transaction is read-only.",
        _one_of("off", "false", "0", shown="off"),
    ),
    Setting(
        "default_transaction_read_only",
        "off",
        "New transactions are read-only.",
        _one_of("off", "false", "0", shown="off"),
    ),
    Setting("search_path", "main", "Schema search order (DuckDB's default schema is main).", _any),
    Setting("application_name", "", "Name of the application.", _name_data),
    Setting("statement_timeout", "0", "Longest statement (cancelled with 57014).", _duration_ms),
    Setting("lock_timeout", "0", "Lock wait timeout" + _NOT_ENFORCED, _duration_ms),
    Setting(
        "idle_in_transaction_session_timeout",
        "0",
        "Longest wait for a statement inside a transaction (then FATAL 25P03, rolled back).",
        _duration_ms,
    ),
    Setting(
        "idle_session_timeout",
        "0",
        "Longest wait for a statement outside a transaction (then FATAL 57P05).",
        _duration_ms,
    ),
    Setting(
        "log_statement",
        "none",
        "Statements whose text the server logs: none, ddl, mod (ddl and writes) or all.",
        _one_of("none", "ddl", "mod", "all"),
    ),
    Setting(
        "client_min_messages",
        "notice",
        "Message levels sent to the client" + _NOT_ENFORCED,
        _one_of(
            "debug5", "debug4", "debug3", "debug2", "debug1", "log", "notice", "warning", "error"
        ),
    ),
    Setting("extra_float_digits", "1", "Digits of floating-point output" + _NOT_ENFORCED, _any),
    Setting("max_identifier_length", "63", "Maximum identifier length."),
    Setting("max_connections", "100", "Maximum number of connections."),
    Setting("is_superuser", "on", "The current user is a superuser."),
    Setting("session_authorization", "", "The session user."),
    Setting("lc_collate", "C", "Collation order."),
    Setting("lc_ctype", "C", "Character classification."),
    Setting("lc_messages", "C", "Language of messages.", _any),
    Setting("lc_monetary", "C", "Monetary formatting.", _any),
    Setting("lc_numeric", "C", "Number formatting.", _any),
    Setting("lc_time", "C", "Date and time formatting.", _any),
    Setting("row_security", "on", "Row security.", _one_of("on", "off")),
    Setting("synchronous_commit", "on", "Commit durability" + _NOT_ENFORCED, _any),
    Setting("default_table_access_method", "heap", "Default table access method."),
    Setting("jit", "off", "JIT compilation.", _one_of("on", "off")),
)
_BY_NAME = {setting.name.lower(): setting for setting in SETTINGS}
# Settings only a superuser may SET or RESET (PostgreSQL's "superuser" context): statement
# text in the server log is for the operator to turn on, not for any user.
SUPERUSER_SETTINGS = frozenset({"log_statement"})
_ALIASES = {"time zone": "timezone", "transaction isolation level": "transaction_isolation",
            "names": "client_encoding", "schema": "search_path",
            "session authorization": "session_authorization"}  # fmt: skip


class PgSettings:
    """The settings of one connection. ``values`` maps lower-case names to shown values."""

    def __init__(self, server_version: str, user: str, application_name: str,
                 defaults: Mapping[str, str] | None = None, *,
                 superuser: bool = True) -> None:  # fmt: skip
        """``defaults``: the server's own defaults for settings (checked here: 22023);
        ``superuser``: whether the session's user is one (``is_superuser``)."""
        self._defaults = {key: setting.default for key, setting in _BY_NAME.items()}
        for name, value in (defaults or {}).items():
            setting = _BY_NAME[self.canonical(name)]
            assert setting.check is not None, f"{name} is read-only"
            self._defaults[self.canonical(name)] = setting.check(value)
        self._defaults["server_version"] = server_version
        self._defaults["session_authorization"] = user
        self._defaults["is_superuser"] = "on" if superuser else "off"
        self._defaults["application_name"] = _name_data(application_name)
        self.values = dict(self._defaults)

    def superuser_changed(self, flag: str) -> bool:
        """Set the read-only ``is_superuser`` to ``flag``; True if it changed."""
        if self.values.get("is_superuser") == flag:
            return False
        self._defaults["is_superuser"] = self.values["is_superuser"] = flag
        return True

    @staticmethod
    def canonical(name: str) -> str:
        key = " ".join(name.lower().split())
        return _ALIASES.get(key, key)

    def knows(self, name: str) -> bool:
        key = self.canonical(name)
        return key in _BY_NAME or "." in key

    def show(self, name: str) -> str:
        key = self.canonical(name)
        if key not in self.values:
            raise UndefinedSettingError(f'unrecognized configuration parameter "{name}"')
        return self.values[key]

    def set(self, name: str, value: str | None, *, superuser: bool = True) -> None:
        """Set (``value`` None: reset) one setting; raises 22023/55P02/0A000 on refusal, and
        42501 for a setting of ``SUPERUSER_SETTINGS`` when not ``superuser``."""
        key = self.canonical(name)
        if key in SUPERUSER_SETTINGS and not superuser:
            raise InsufficientPrivilegeError(f'permission denied to set parameter "{name}"')
        setting = _BY_NAME.get(key)
        if setting is None:
            assert "." in key, "the caller passes only names it knows"
            if value is None:
                self.values.pop(key, None)
            else:
                self._check_room(key, value)
                self.values[key] = value  # a custom "prefix.name" setting, as PostgreSQL
            return
        if setting.check is None:
            raise CantChangeRuntimeParameterError(f'parameter "{setting.name}" cannot be changed')
        checked = self._defaults[key] if value is None else setting.check(value)
        self._check_room(key, checked)
        self.values[key] = checked
        assert key in self.values

    def _check_room(self, key: str, value: str) -> None:
        """54000 if the session's settings would be more than
        ``limits.SESSION_SETTINGS_MAX`` or hold more than
        ``limits.SESSION_SETTINGS_CHARS_MAX`` characters (names and values): custom
        ``prefix.name`` settings have no fixed number, every connection shares this
        process, and PostgreSQL bounds neither (a backend of its own holds them). The
        count also keeps this sum's cost per SET small."""
        if key not in self.values and len(self.values) >= SESSION_SETTINGS_MAX:
            raise LimitExceededError(
                f"this session has {len(self.values)} settings, the most it may hold: RESET "
                "some first"
            )
        chars = len(key) + len(value) + sum(
            len(k) + len(v) for k, v in self.values.items() if k != key
        )
        if chars > SESSION_SETTINGS_CHARS_MAX:
            raise LimitExceededError(
                f"the settings of this session would hold more than "
                f"{SESSION_SETTINGS_CHARS_MAX} characters: RESET some first"
            )

    def reset_all(self) -> None:
        self.values = dict(self._defaults)

    def shown_name(self, name: str) -> str:
        key = self.canonical(name)
        setting = _BY_NAME.get(key)
        return setting.name if setting is not None else key

    def description(self, key: str) -> str:
        setting = _BY_NAME.get(key)
        return setting.description if setting is not None else ""

    def rows(self) -> list[tuple[str, str, str]]:
        """(name, value, description) of every setting, sorted by name (SHOW ALL)."""
        return sorted((self.shown_name(k), v, self.description(k)) for k, v in self.values.items())

    def show_all(self) -> pa.Table:
        rows = self.rows()
        return pa.table(
            {
                "name": [row[0] for row in rows],
                "setting": [row[1] for row in rows],
                "description": [row[2] for row in rows],
            }
        )
