"""The ``topicbase`` console: scripts from the command line and an interactive REPL.

Usage: ``topicbase [--data-dir DIR] [-c SQL]... [-f FILE] [--format table|csv|json] [-q]``,
or ``topicbase check [--data-dir DIR] [--repair] [--format table|json]`` to check the data
directory's files (``engine.check``; exit 0 when no problem is left; read-only and live while a
server owns the directory, where ``--repair`` is refused), or
``topicbase serve [--data-dir DIR] [--host 127.0.0.1] [--port 5433] [--auth
scram|md5|password|trust] [--users-file FILE] [--tls-cert F --tls-key F]`` to serve it
over the PostgreSQL protocol (``sql.pgwire``) until Ctrl-C, or ``topicbase user add NAME
[--data-dir DIR | --users-file FILE] [--password-stdin] [--md5] [--superuser]``, ``topicbase
user list`` and ``topicbase user remove NAME`` to manage the server's users file
(``sql.pgwire.users``).

- The data directory is ``--data-dir``, else ``$TOPICBASE_DATA_DIR``, else
  ``./topicbase-data``; it is created on first use. One process owns a data directory
  at a time: a second one gets 55006 naming the owner's pid.
- ``-c`` (may repeat) and ``-f`` run in the order given; ``-f -`` and a stdin that is not
  a terminal read a script from stdin. Each script (a ``-c`` string, a file) is parsed
  whole before any of it runs, as PostgreSQL does with one query string: a syntax error
  anywhere runs nothing of that script, and error positions are lines of the script.
- Rows print in the chosen format (see ``sql.formatting``); statements without rows
  print their command tag (``CREATE TOPIC``, ``INSERT 0 2``); ``-q`` leaves tags out.
  Notices go to stderr as ``NOTICE: ...``.
- The first error prints ``ERROR: <SQLSTATE>: <message>`` to stderr and exits 1;
  success exits 0. Ctrl-C during a statement cancels it (57014): a script stops with
  exit 1, the REPL goes back to its prompt.

With no ``-c``/``-f`` on a terminal it is a REPL (prompt_toolkit and rich, imported only
then): input runs once a ``;`` outside strings and comments ends it, history is kept in
``~/.topicbase_history`` (``$TOPICBASE_HISTFILE``), Tab completes keywords, settings,
topic and table names, backslash commands (``\\?``) list and describe objects, and each
statement shows its time and, after half a second, a spinner. Ctrl-D on an empty line quits,
also when typed while a statement runs (``sql.terminal_eof``: it is kept for the next prompt).

Single-threaded except the spinner's helper thread, which only draws.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sql import formatting
from sql.internal_error import internal_error
from sql.user_sessions import UserSessions
from storage.errors import StorageIOError, TopicbaseError

if TYPE_CHECKING:  # the engine is imported where it runs: `serve`, `user` and --help need none
    from engine.api import Database, Result, Session, ast

DEFAULT_DATA_DIR = "topicbase-data"
DEFAULT_HISTORY_FILE = "~/.topicbase_history"
PROGRESS_DELAY_S = 0.5
PROGRESS_REFRESH_S = 0.25


def progress_text(progress: Any) -> str:
    """"running..." and, once a topic read has begun, how much it has read."""
    if not progress.messages:
        return "running... (Ctrl-C cancels)"
    megabytes = progress.bytes / 1e6
    return f"running... {progress.messages:,} messages, {megabytes:,.1f} MB read (Ctrl-C cancels)"
# The REPL draws at most this many rows of one result (rich tables are slow to lay out).
REPL_ROWS_SHOWN_MAX = 1000
EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 130

HELP_TEXT = r"""General
  \q              quit (Ctrl-D too)
  \?              this help
  \timing [on|off] show the time of each statement (on at start)
Informational
  \d              list topics and tables
  \d NAME         describe a topic (settings, consumers, partitions) or a table
  \dt             list tables
Input
  A statement runs once a ';' outside strings and comments ends it; Enter before that
  starts a new line. Up/Down walk the history, Tab completes, Ctrl-C clears the input
  or cancels a running statement."""

_KEYWORD_TEXT = (
    "SELECT FROM WHERE GROUP BY ORDER HAVING LIMIT OFFSET JOIN LEFT RIGHT FULL INNER OUTER"
    " CROSS ON USING AS AND OR NOT NULL IS IN LIKE BETWEEN CASE WHEN THEN ELSE END DISTINCT"
    " UNION ALL INSERT INTO VALUES UPDATE SET DELETE RETURNING CONFLICT DO NOTHING EXCLUDED"
    " CREATE ALTER DROP TABLE VIEW IF EXISTS PRIMARY KEY DEFAULT CAST BEGIN COMMIT ROLLBACK"
    " EXPLAIN SHOW DESCRIBE TOPIC TOPICS CONSUMER OFFSETS FOR PARTITION UPTO ADD RESET WITH"
    " Interval Timestamp Datetime VARCHAR BIGINT INTEGER BOOLEAN DOUBLE BLOB TIMESTAMP"
    " count sum min max avg json_extract_string sys.topics sys.partitions sys.consumers"
)
KEYWORDS = tuple(_KEYWORD_TEXT.split())


# -- arguments ----------------------------------------------------------------------------
class _InOrder(argparse.Action):
    """Keeps -c and -f in the order given, in one list of (kind, value)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        actions = getattr(namespace, "actions", None) or []
        actions.append((self.const, values))
        namespace.actions = actions


SUBCOMMANDS_HELP = """commands (each has its own --help):
  topicbase serve [--data-dir DIR] [--port N] ...   the PostgreSQL-wire server
  topicbase user add NAME [--superuser] [--connection-limit N] | list | remove NAME
                                                    users of the server (users file)
  topicbase check [--data-dir DIR] [--repair]       verify a data directory
  topicbase [--data-dir DIR] [-c SQL | -f FILE]     this console (a REPL without -c/-f)
"""


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="topicbase",
        description="Topicbase SQL console: run SQL scripts or a REPL.",
        epilog=SUBCOMMANDS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--data-dir",
        help=f"data directory (default: $TOPICBASE_DATA_DIR, else ./{DEFAULT_DATA_DIR})",
    )
    parser.add_argument(
        "-c", "--command", action=_InOrder, const="command", dest="actions", metavar="SQL",
        help="run SQL (one or more statements); may repeat",
    )  # fmt: skip
    parser.add_argument(
        "-f", "--file", action=_InOrder, const="file", dest="actions", metavar="FILE",
        help="run the script in FILE ('-' for stdin)",
    )  # fmt: skip
    parser.add_argument("--format", choices=formatting.FORMATS, default="table")
    parser.add_argument("-q", "--quiet", action="store_true", help="print no command tags")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    check_argv = check_command_arguments(sys.argv[1:] if argv is None else argv)
    if check_argv is not None:
        return run_check(check_argv)
    serve_argv = check_command_arguments(sys.argv[1:] if argv is None else argv, "serve")
    if serve_argv is not None:
        return run_serve(serve_argv)
    user_argv = check_command_arguments(sys.argv[1:] if argv is None else argv, "user")
    if user_argv is not None:
        return run_user(user_argv)
    pipeline_argv = check_command_arguments(sys.argv[1:] if argv is None else argv, "pipeline")
    if pipeline_argv is not None:
        return run_pipeline(pipeline_argv)
    arguments = parse_arguments(argv)
    data_dir = arguments.data_dir or os.environ.get("TOPICBASE_DATA_DIR") or DEFAULT_DATA_DIR
    actions: list[tuple[str, str]] = arguments.actions or []
    interactive = not actions and sys.stdin.isatty()
    if not actions and not interactive:
        actions = [("file", "-")]
    from engine.api import Database

    try:
        database = Database.open(data_dir)
    except TopicbaseError as error:
        print(formatting.error_text(error), file=sys.stderr)
        return EXIT_ERROR
    except OSError as error:  # the directory cannot be made or read: one line, as serve says
        cannot = StorageIOError(f"could not open data directory {data_dir}: "
                                f"{error.strerror or error}")  # fmt: skip
        print(formatting.error_text(cannot), file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_ERROR
    try:
        session = database.connect()
        try:
            if interactive:
                return run_repl(database, session)
            printer = ScriptPrinter(arguments.format, arguments.quiet)
            return run_actions(session, actions, printer)
        finally:
            session.close()
    except BrokenPipeError:
        # The reader went away (`topicbase ... | head`): stop quietly, and point stdout
        # at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    except KeyboardInterrupt:  # Ctrl-C outside a statement (reading stdin, closing)
        return EXIT_INTERRUPTED
    finally:
        database.close()


# -- topicbase check ---------------------------------------------------------------------------
def check_command_arguments(argv: list[str], command: str = "check") -> list[str] | None:
    """The arguments of ``command`` (``check``, ``serve``) without the word, if ``argv`` asks
    for it; else None.

    The command is the first argument, or follows ``--data-dir DIR`` (or ``--data-dir=DIR``);
    anywhere else it is not a command (``-c check`` is SQL text).
    """
    if argv[:1] == [command]:
        return argv[1:]
    if len(argv) >= 2 and argv[0].startswith("--data-dir=") and argv[1] == command:
        return [argv[0], *argv[2:]]
    if len(argv) >= 3 and argv[0] == "--data-dir" and argv[2] == command:
        return [*argv[:2], *argv[3:]]
    return None


def _positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _count_mib(text: str) -> int:
    """An argparse type: a number of MiB, at least 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {value}")
    return value


def _early_memory_cap(argv: list[str]) -> int | None:
    """``--memory-cap MIB`` from ``argv`` before argparse reads it (argparse's checks and
    errors come later; a value it would refuse counts as not given here)."""
    for at, argument in enumerate(argv):
        text = None
        if argument == "--memory-cap" and at + 1 < len(argv):
            text = argv[at + 1]
        elif argument.startswith("--memory-cap="):
            text = argument.partition("=")[2]
        if text is not None:
            try:
                return _count_mib(text)
            except (ValueError, argparse.ArgumentTypeError):
                return None
    return None


def run_serve(argv: list[str]) -> int:
    """``topicbase serve``: the PostgreSQL-wire server (``sql.pgwire``) until Ctrl-C."""
    from sql.pgwire import memory_cap

    # before anything imports pyarrow: its pool by the cap the server will run under
    memory_cap.arrow_pool_reserves_lazily(memory_cap.planned_cap(_early_memory_cap(argv)))
    from sql.pgwire import server
    from sql.pgwire.limits import add_serve_arguments, serve_configuration

    parser = argparse.ArgumentParser(
        prog="topicbase serve", description="Serve the data directory over the PostgreSQL protocol."
    )
    parser.add_argument("--data-dir", help="data directory (default as for topicbase)")
    parser.add_argument("--host", default=server.DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=server.DEFAULT_PORT)
    parser.add_argument(  # sql.pgwire.auth; trust must be asked for
        "--auth", choices=("scram", "md5", "password", "trust"), default="scram",
        help="client authentication (default scram: SCRAM-SHA-256 against the users file)",
    )  # fmt: skip
    parser.add_argument("--users-file", metavar="FILE",
                        help="users file (default <data-dir>/users.json; see `topicbase user add`)")
    parser.add_argument("--tls-cert", metavar="FILE", help="PEM certificate: offer TLS")
    parser.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert")
    add_serve_arguments(parser)  # the limits of sql.pgwire.limits, setting defaults
    parser.add_argument("--flight-port", type=int, default=5434,  # sql.flight
                        help="Arrow Flight door for Spark and Arrow clients (default 5434, 0: off)")
    parser.add_argument("--flight-client-ca", metavar="FILE",
                        help="PEM CA: Flight clients must present a certificate it signed "
                             "(mutual TLS; needs --tls-cert)")  # fmt: skip
    parser.add_argument("--flight-staging-mb", type=_positive_int, default=16384,
                        help="disk cap of staged Flight writes in MiB (default 16384)")
    parser.add_argument("--memory-cap", type=_count_mib, metavar="MIB", default=None,
                        help="the process's private memory at most (RLIMIT_DATA), in MiB "
                             "(default 75%% of physical memory, at least 40%% + 768 MiB "
                             "+ 6 MiB per --max-connections, at most 90%%; 0: none)")  # fmt: skip
    arguments = parser.parse_args(argv)
    limits, settings = serve_configuration(arguments)
    data_dir = arguments.data_dir or os.environ.get("TOPICBASE_DATA_DIR") or DEFAULT_DATA_DIR

    flight_door = None

    def ready(port: int) -> None:
        # "serving" comes first: scripts and tests wait for that line.
        print(f"topicbase: serving {data_dir} on {arguments.host}:{port}", flush=True)
        if flight_door is not None:
            scheme = "topicbase+tls" if arguments.tls_cert else "topicbase"
            print(f"topicbase: Arrow Flight at {scheme}://{arguments.host}:{flight_door.port}",
                  flush=True)  # fmt: skip

    cap = None if arguments.memory_cap is None else arguments.memory_cap << 20
    try:
        # before the Flight door: one process, one cap
        memory_cap.cap_process_data(cap, limits.connections_max)
        # one count of each user's sessions and Flight calls for both doors
        user_sessions = UserSessions()
        flight_door = _start_flight_door(arguments, data_dir, user_sessions)
        server.serve(data_dir, arguments.host, arguments.port, arguments.auth, ready,
                     limits=limits, users_file=arguments.users_file,
                     tls_cert=arguments.tls_cert, tls_key=arguments.tls_key,
                     settings=settings, memory_cap_bytes=cap,
                     user_sessions=user_sessions)  # fmt: skip
    except TopicbaseError as error:
        print(formatting.error_text(error), file=sys.stderr)
        return EXIT_ERROR
    except OSError as error:
        print(f"ERROR: 08006: could not listen: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        if flight_door is not None:
            flight_door.stop()
            flight_door.database.close()
    return EXIT_OK


def _start_flight_door(
    arguments: argparse.Namespace, data_dir: str, user_sessions: UserSessions
) -> Any:
    """The Flight door of ``serve`` (``sql.flight``) on the same database, or None when
    ``--flight-port 0``; it holds its own reference to the database until stopped."""
    if arguments.flight_port == 0:
        return None
    from engine.api import Database
    from sql.flight.server import start_flight

    database = Database.open(data_dir)
    try:
        door = start_flight(database, arguments.host, arguments.flight_port, arguments.auth,
                            users_file=arguments.users_file, tls_cert=arguments.tls_cert,
                            tls_key=arguments.tls_key, tls_client_ca=arguments.flight_client_ca,
                            staging_bytes_max=arguments.flight_staging_mb << 20,
                            connections_per_user_max=arguments.max_connections_per_user,
                            user_sessions=user_sessions)  # fmt: skip
    except OSError:
        database.close()
        raise
    except Exception as error:  # pyarrow reports a port in use as a generic ArrowException
        database.close()
        raise OSError(f"Arrow Flight on port {arguments.flight_port}: {error}") from error
    except BaseException:
        database.close()
        raise
    return door


def run_pipeline(argv: list[str]) -> int:
    """``topicbase pipeline reshard|to-table ...``: the Spark pipelines of ``spark_sql_ext``,
    run as ``python -m spark_sql_ext.pipeline_cli`` in a process of their own (the SQL
    fronts do not import the Spark layer, and Spark wants its own process anyway)."""
    import subprocess

    arguments = [a for a in argv if not a.startswith("--data-dir")]
    return subprocess.call([sys.executable, "-m", "spark_sql_ext.pipeline_cli", *arguments])


def run_user(argv: list[str]) -> int:
    """``topicbase user add NAME [--superuser] [--connection-limit N] | list | remove NAME``.

    ``add`` stores a SCRAM-SHA-256 verifier; the password is prompted for twice (getpass)
    or read from stdin (``--password-stdin``, one line; the trailing newline is dropped).
    ``list`` shows names, the superuser flag and connection limits, never a verifier. The
    data directory is not opened, so this works while a server runs on it (the server
    re-reads the file).
    """
    from sql.pgwire import users

    parser = argparse.ArgumentParser(
        prog="topicbase user", description="Manage the users of `topicbase serve`."
    )
    parser.add_argument("--data-dir", help="data directory (default as for topicbase)")
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser("add", help="add a user, or set a user's password and flag")
    add.add_argument("name")
    add.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    add.add_argument("--md5", action="store_true",
                     help="also store PostgreSQL's md5 hash (needed by --auth md5 clients)")
    add.add_argument("--superuser", action="store_true",
                     help="a superuser: bypasses privilege checks, may GRANT anything")
    add.add_argument("--connection-limit", type=int, default=-1, metavar="N",
                     help="sessions the user may hold at once over the wire (default -1: no "
                          "limit of their own; a superuser is not bound)")
    listing = commands.add_parser("list", help="list users, superuser flags, connection limits")
    remove = commands.add_parser("remove", help="remove a user")
    remove.add_argument("name")
    for command in (add, listing, remove):
        # SUPPRESS: when absent here, a --data-dir given before `user` is kept.
        command.add_argument("--data-dir", default=argparse.SUPPRESS, help="data directory")
        command.add_argument("--users-file", metavar="FILE", help="default <data-dir>/users.json")
    arguments = parser.parse_args(argv)
    data_dir = arguments.data_dir or os.environ.get("TOPICBASE_DATA_DIR") or DEFAULT_DATA_DIR
    path = arguments.users_file or users.default_users_path(data_dir)
    try:
        if arguments.command == "list":
            for entry in users.read_users(path).values():
                flags = ["superuser"] if entry.superuser else []
                if entry.connection_limit is not None:
                    flags.append(f"connection limit {entry.connection_limit}")
                print("\t".join([entry.name, *flags]))
            return EXIT_OK
        if arguments.command == "remove":
            if not users.remove_user(path, arguments.name):
                print(f'ERROR: 42704: role "{arguments.name}" does not exist', file=sys.stderr)
                return EXIT_ERROR
            print(f"topicbase: removed user {arguments.name} from {path}")
            return EXIT_OK
        return _run_user_add(arguments, path)
    except TopicbaseError as error:
        print(formatting.error_text(error), file=sys.stderr)
        return EXIT_ERROR
    except OSError as error:
        print(f"ERROR: 58030: cannot write users file {path}: {error}", file=sys.stderr)
        return EXIT_ERROR
    except (KeyboardInterrupt, EOFError):
        return EXIT_INTERRUPTED


def _run_user_add(arguments: argparse.Namespace, path: str) -> int:
    import getpass

    from sql.pgwire import users

    limit = None if arguments.connection_limit == -1 else arguments.connection_limit
    users.check_connection_limit(limit)  # 22023 before the password is asked for
    if arguments.password_stdin:
        password = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    else:
        password = getpass.getpass(f"Password for {arguments.name}: ")
        if getpass.getpass("Enter it again: ") != password:
            print("ERROR: 22023: passwords do not match", file=sys.stderr)
            return EXIT_ERROR
    is_new = users.add_user(path, arguments.name, password, with_md5=arguments.md5,
                            superuser=arguments.superuser, connection_limit=limit)  # fmt: skip
    kind = "superuser" if arguments.superuser else "user"
    print(f"topicbase: {'added' if is_new else 'updated'} {kind} {arguments.name} in {path}")
    return EXIT_OK


def run_check(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="topicbase check",
        description="Check the data directory's files (read-only while a server runs on it); "
        "--repair fixes what loses nothing and needs the directory free.",
    )
    parser.add_argument("--data-dir", help="data directory (default as for topicbase)")
    parser.add_argument("--repair", action="store_true",
                        help="cut torn tails, rebuild indexes (not while a server runs)")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    arguments = parser.parse_args(argv)
    data_dir = arguments.data_dir or os.environ.get("TOPICBASE_DATA_DIR") or DEFAULT_DATA_DIR
    from engine.api import check_database

    try:
        report = check_database(data_dir, repair=arguments.repair)
    except TopicbaseError as error:
        print(formatting.error_text(error), file=sys.stderr)
        return EXIT_ERROR
    if arguments.format == "json":
        print(json.dumps(report.to_json(), indent=1))
    else:
        print("\n".join(report.lines()))
    return EXIT_OK if report.ok else EXIT_ERROR


# -- scripts ----------------------------------------------------------------------------------
def run_actions(session: Session, actions: list[tuple[str, str]], printer: ScriptPrinter) -> int:
    for kind, value in actions:
        if kind == "command":
            script = value
        else:
            try:
                script = sys.stdin.read() if value == "-" else Path(value).read_text("utf-8")
            except (OSError, UnicodeDecodeError) as error:
                reason = getattr(error, "strerror", None) or str(error)
                print(f'ERROR: 58P01: could not read file "{value}": {reason}', file=sys.stderr)
                return EXIT_ERROR
        if not run_script(session, script, printer.result, printer.error):
            return EXIT_ERROR
    return EXIT_OK


def run_script(
    session: Session,
    script: str,
    show: Callable[[Result, float], None],
    show_error: Callable[[str], None],
    execute: Callable[[ast.Statement], Result] | None = None,
) -> bool:
    """Run the statements of ``script`` until the first error; False if there was one.

    The whole script is parsed before anything runs: a syntax error anywhere runs
    nothing, and every statement knows its line in the script for error positions.
    """
    from engine.api import SYSTEM_CLOCK, parse

    run = execute or (lambda statement: run_cancellable(session, statement))
    try:
        for statement in parse(script):
            started_s = SYSTEM_CLOCK.monotonic_s()
            result = run(statement)
            show(result, SYSTEM_CLOCK.monotonic_s() - started_s)
    except (TopicbaseError, KeyboardInterrupt) as error:
        show_error(formatting.error_text(error, script))
        return False
    except BrokenPipeError:
        raise
    except Exception as error:  # a bug: logged with an id, XX000 without its text
        show_error(formatting.error_text(internal_error(error, "a console statement"), script))
        return False
    return True


def run_cancellable(session: Session, statement: ast.Statement) -> Result:
    """Run one statement on a worker thread; Ctrl-C cancels it through ``Session.cancel``.

    The interrupt never lands inside the engine's own code (a commit half
    done): the main thread only waits, and asks the session to stop. Once asked, it asks
    again at every tick until the statement ends: a statement clears an earlier request
    when it begins (``Session.execute_statement``), so a Ctrl-C that came while the worker
    was still starting would otherwise be lost and a waiting read served to its end.
    """
    outcome: dict[str, Any] = {}
    # An Event, not Thread.join: a join interrupted by Ctrl-C can wrongly
    # report the thread as finished on Python 3.11.
    done = threading.Event()

    def target() -> None:
        try:
            outcome["result"] = session.execute_statement(statement)
        except BaseException as error:  # handed to the waiting thread below
            outcome["error"] = error
        finally:
            done.set()

    worker = threading.Thread(target=target, name="topicbase-statement", daemon=True)
    worker.start()
    interrupted = False
    while not done.is_set():
        try:
            done.wait(0.1)
        except KeyboardInterrupt:
            interrupted = True
        if interrupted and not done.is_set():
            session.cancel()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


class ScriptPrinter:
    """Prints results of scripts in one of the formats of ``sql.formatting``."""

    def __init__(self, output_format: str, quiet: bool) -> None:
        self.output_format = output_format
        self.quiet = quiet

    def result(self, result: Result, _elapsed_s: float) -> None:
        out = sys.stdout
        for notice in result.notices:
            print(f"NOTICE: {notice}", file=sys.stderr)
        if result.table is not None:
            formatting.WRITERS[self.output_format](result.table, out)
            if self.output_format == "table":
                out.write("\n")
            if formatting.shows_tag_after_rows(result.tag) and not self.quiet:
                out.write(result.tag + "\n")
        elif not self.quiet:
            out.write(result.tag + "\n")
        out.flush()

    def error(self, text: str) -> None:
        sys.stdout.flush()
        print(text, file=sys.stderr, flush=True)


def run_repl(database: Database, session: Session) -> int:
    names_session = database.connect()
    try:
        return Repl(session, names_session, database.path).run()
    finally:
        names_session.close()


# -- REPL -----------------------------------------------------------------------------------
def statement_complete(text: str) -> bool:
    """True when the input should run: a ``;`` outside strings and comments ends it.

    Blank input and backslash commands are complete as they are. Appending a word
    tells whether the text ended at a statement boundary: if it did, the word starts
    a new statement.
    """
    stripped = text.strip()
    if not stripped or stripped.startswith("\\"):
        return True
    from engine.api import split_statements

    try:
        count = len(split_statements(text))
        return len(split_statements(text + "\nx")) == count + 1
    except TopicbaseError:  # an unterminated string or comment: keep reading
        return False


class Names:
    """Topic and table names for completion, re-read after each statement.

    They are read on a session of their own, so completion never touches the user's
    transaction (it would fail in a failed one, and a read could fail it).
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self.stale = True
        self.topics: list[str] = []
        self.tables: list[str] = []

    def words(self) -> list[str]:
        from engine.api import setting_rules

        if self.stale:
            self.refresh()
        topics = [name if name.isidentifier() else quote_name(name) for name in self.topics]
        settings = [
            *setting_rules.TOPIC_SETTINGS,
            *setting_rules.CONSUMER_SETTINGS,
            *setting_rules.READ_OPTIONS,
            *setting_rules.WRITE_OPTIONS,
        ]
        return sorted({*KEYWORDS, *settings, *topics, *self.tables})

    def refresh(self) -> None:
        try:
            self.topics = list_topic_names(self.session)
            tables = self.session.execute(TABLES_QUERY)[0].table
        except TopicbaseError:
            return
        assert tables is not None
        self.tables = [
            name if schema == "main" else f"{schema}.{name}"
            for schema, name, _kind in formatting.iter_rows(tables)
        ]
        self.stale = False


TABLES_QUERY = (
    "SELECT table_schema AS schema, table_name AS name, lower(table_type) AS type "
    "FROM information_schema.tables WHERE NOT starts_with(table_schema, '__') "
    "AND NOT starts_with(table_name, '__') ORDER BY 1, 2"
)
COLUMNS_QUERY = (
    "SELECT column_name AS column, data_type AS type, is_nullable AS nullable, "
    "column_default AS default FROM information_schema.columns "
    "WHERE table_name = $1 AND table_schema = $2 ORDER BY ordinal_position"
)


def quote_name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def unquote_name(text: str) -> str:
    text = text.strip().rstrip(";").strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in '`"':
        return text[1:-1].replace(text[0] * 2, text[0])
    return text


def list_topic_names(session: Session) -> list[str]:
    table = session.execute("SHOW TOPICS")[0].table
    assert table is not None
    return [str(name) for name in table.column("name").to_pylist()]


class Repl:
    """The interactive loop: read complete input, run it, show results, repeat."""

    def __init__(self, session: Session, names_session: Session, data_dir: str) -> None:
        from rich.console import Console

        self.session = session
        self.data_dir = data_dir
        self.console = Console(highlight=False)
        self.error_console = Console(stderr=True, highlight=False)
        self.names = Names(names_session)
        self.timing = True

    def run(self) -> int:
        from sql.terminal_eof import eof_key_kept

        prompt = self._prompt_session()
        self.console.print(
            f"topicbase: data directory {self.data_dir}. Type \\? for help, \\q to quit.",
            markup=False,
        )
        # Ctrl-D typed while a statement runs is kept for the next prompt (it quits there).
        with eof_key_kept(sys.stdin.fileno()):
            return self._loop(prompt)

    def _loop(self, prompt: Any) -> int:
        """Read input at the prompt and run it until \\q or Ctrl-D on an empty line."""
        while True:
            try:
                text = prompt.prompt(self._prompt_text())
            except KeyboardInterrupt:
                continue
            except EOFError:
                return EXIT_OK
            stripped = text.strip()
            if not stripped:
                continue
            if stripped.startswith("\\"):
                try:
                    if self.backslash(stripped):
                        return EXIT_OK
                except KeyboardInterrupt:
                    self.show_error(formatting.error_text(KeyboardInterrupt()))
                continue
            run_script(self.session, text, self.show, self.show_error, self.execute)
            self.names.stale = True

    def _prompt_session(self) -> Any:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.completion import WordCompleter
        from prompt_toolkit.history import FileHistory
        from prompt_toolkit.key_binding import KeyBindings

        history_path = os.path.expanduser(
            os.environ.get("TOPICBASE_HISTFILE") or DEFAULT_HISTORY_FILE
        )
        bindings = KeyBindings()

        @bindings.add("enter")
        def _enter(event: Any) -> None:
            buffer = event.current_buffer
            if statement_complete(buffer.text):
                buffer.validate_and_handle()
            else:
                buffer.insert_text("\n")

        return PromptSession(
            history=FileHistory(history_path),
            completer=WordCompleter(self.names.words, ignore_case=True, WORD=True),
            complete_while_typing=False,
            multiline=True,
            key_bindings=bindings,
            prompt_continuation=lambda width, _line, _soft: "-> ".rjust(width),
        )

    def _prompt_text(self) -> str:
        from engine.api import SessionState

        marks = {SessionState.IDLE: "=", SessionState.IN_TRANSACTION: "*"}
        return f"topicbase{marks.get(self.session.state, '!')}> "

    # -- statements --------------------------------------------------------------------
    def execute(self, statement: ast.Statement) -> Result:
        with self.progress():
            return run_cancellable(self.session, statement)

    @contextmanager
    def progress(self) -> Iterator[None]:
        """A spinner once the statement has run for ``PROGRESS_DELAY_S``, with the topic
        messages and bytes it has read so far."""
        done = threading.Event()

        def spin() -> None:
            if done.wait(PROGRESS_DELAY_S):
                return
            with self.console.status(progress_text(self.session.read_progress)) as status:
                while not done.wait(PROGRESS_REFRESH_S):
                    status.update(progress_text(self.session.read_progress))

        spinner = threading.Thread(target=spin, name="topicbase-spinner", daemon=True)
        spinner.start()
        try:
            yield
        finally:
            done.set()
            spinner.join()

    def show(self, result: Result, elapsed_s: float) -> None:
        for notice in result.notices:
            self.error_console.print(f"NOTICE: {notice}", markup=False, style="yellow")
        if result.table is not None:
            self.print_table(result.table)
            if formatting.shows_tag_after_rows(result.tag):
                self.console.print(result.tag, markup=False)
        else:
            self.console.print(result.tag, markup=False)
        if self.timing:
            self.console.print(f"Time: {elapsed_s * 1000:.1f} ms", markup=False, style="dim")

    def show_error(self, text: str) -> None:
        self.error_console.print(text, markup=False, style="bold red")

    def print_table(self, table: Any) -> None:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        view = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for field in table.schema:
            numeric = formatting.is_numeric(field.type)
            view.add_column(Text(field.name), justify="right" if numeric else "left")
        shown = table.slice(0, REPL_ROWS_SHOWN_MAX)
        for row in formatting.iter_rows(shown):
            view.add_row(
                *(
                    Text("NULL", style="dim") if v is None else Text(formatting.text_value(v))
                    for v in row
                )
            )
        if table.num_columns:
            self.console.print(view)
        footer = formatting.rows_footer(table.num_rows)
        if table.num_rows > shown.num_rows:
            footer += f", the first {shown.num_rows} shown"
        self.console.print(footer, markup=False)

    # -- backslash commands ----------------------------------------------------------------
    def backslash(self, command: str) -> bool:
        """Run a backslash command; True means quit."""
        name, _, argument = command.partition(" ")
        argument = argument.strip()
        if name == "\\q":
            return True
        if name == "\\?":
            self.console.print(HELP_TEXT, markup=False)
        elif name == "\\timing":
            self.timing = {"on": True, "off": False}.get(argument.lower(), not self.timing)
            self.console.print(f"Timing is {'on' if self.timing else 'off'}.", markup=False)
        elif name == "\\d" and argument:
            self.describe(unquote_name(argument))
        elif name in ("\\d", "\\dt"):
            self.list_objects(topics=name == "\\d")
        else:
            self.show_error(f"invalid command {name}; try \\? for help")
        return False

    def list_objects(self, *, topics: bool) -> None:
        try:
            if topics:
                self.console.print("Topics", markup=False, style="bold")
                self.print_table(self.session.execute("SHOW TOPICS")[0].table)
                self.console.print("Tables", markup=False, style="bold")
            self.print_table(self.session.execute(TABLES_QUERY)[0].table)
        except TopicbaseError as error:
            self.show_error(formatting.error_text(error))

    def describe(self, name: str) -> None:
        try:
            if name in list_topic_names(self.session):
                described = self.session.execute(f"DESCRIBE TOPIC {quote_name(name)}")
                self.print_table(described[0].table)
                return
            schema, _, table_name = name.rpartition(".")
            columns = self.session.execute(COLUMNS_QUERY, [table_name, schema or "main"])[0].table
            assert columns is not None
            if columns.num_rows == 0:
                self.show_error(f'ERROR: 42P01: no topic or table named "{name}"')
                return
            self.print_table(columns)
        except TopicbaseError as error:
            self.show_error(formatting.error_text(error))
