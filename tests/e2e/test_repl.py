"""The ``topicbase`` REPL through a pseudo-terminal: multi-line input, tables, history, \\d."""

from __future__ import annotations

import os
import shutil
import sys
import termios
import time
from pathlib import Path

import pexpect
import pytest

from tests.e2e.test_console import default_ctrl_c

TOPICBASE = shutil.which("topicbase", path=str(Path(sys.executable).parent))
PROMPT = r"topicbase=>"
CONTINUATION = r"->"
UP_ARROW = "\x1b[A"


@pytest.fixture
def history_file(tmp_path: Path) -> Path:
    return tmp_path / "history"


@pytest.fixture
def repl(tmp_path: Path, history_file: Path):  # -> pexpect.spawn
    environment = {
        **os.environ,
        "TOPICBASE_HISTFILE": str(history_file),
        "TERM": "xterm",
        # pexpect's terminal does not answer cursor position requests.
        "PROMPT_TOOLKIT_NO_CPR": "1",
    }
    assert TOPICBASE is not None, "the topicbase console script is not installed in this venv"
    child = pexpect.spawn(
        TOPICBASE,
        ["--data-dir", str(tmp_path / "data")],
        env=environment,
        encoding="utf-8",
        timeout=30,
        dimensions=(40, 120),
        preexec_fn=default_ctrl_c,  # Ctrl-C heard even if the suite runs in the background
    )
    child.expect(PROMPT)
    yield child
    if child.isalive():
        child.terminate(force=True)


def _wait_for_raw_mode(child, timeout_s: float = 10.0, *, raw: bool = True) -> None:
    """Wait until the program behind the pseudo-terminal has switched canonical mode off
    (``raw``), or back on."""
    deadline = time.monotonic() + timeout_s
    while bool(termios.tcgetattr(child.child_fd)[3] & termios.ICANON) == raw:
        assert time.monotonic() < deadline, f"the REPL never set raw mode {raw}"
        time.sleep(0.01)


def _expect_result_and_the_next_prompt(child, result: str) -> None:
    """Wait for a statement's output (``result``), its time line and then the prompt.

    The input line is drawn again when Enter accepts it, prompt included, so a prompt seen
    right after the typed text is that line's, while the terminal may still be in its raw
    mode and the statement has not run yet: a Ctrl-D sent then lands while the statement
    runs. Only the prompt after the "Time:" line is the next one.
    """
    child.expect(result)
    child.expect(r"Time: \d+\.\d ms")
    child.expect(PROMPT)


def test_multi_line_statements_tables_history_describe_and_quit(repl, history_file: Path) -> None:
    # A statement over two lines: Enter before the ';' continues it.
    repl.send("CREATE TOPIC events (CONSUMER reader)\r")
    repl.expect(CONTINUATION)
    repl.send("  WITH (min_active_partitions = 2);\r")
    repl.expect("CREATE TOPIC")
    repl.expect(r"Time: \d+\.\d ms")
    repl.expect(PROMPT)

    repl.send("INSERT INTO TOPIC events (data) VALUES ('hello'), ('world');\r")
    repl.expect("INSERT 0 2")
    repl.expect(PROMPT)
    repl.send('SELECT count(*) AS "messages" FROM TOPIC events;\r')
    repl.expect("messages")
    repl.expect(r"\b2\b")
    repl.expect(r"\(1 row\)")
    repl.expect(PROMPT)

    # Up arrow recalls the previous statement; Enter runs it again.
    repl.send(UP_ARROW)
    repl.expect("messages")
    repl.send("\r")
    repl.expect(r"\(1 row\)")
    repl.expect(PROMPT)

    # Tab completes a topic name.
    repl.send("DESCRIBE TOPIC eve\t")
    repl.expect("nts")  # the rest of "events", drawn after what was typed
    repl.send(";\r")
    repl.expect("reader")
    repl.expect(PROMPT)

    # An error keeps the REPL running.
    repl.send("SELECT * FROM TOPIC nowhere;\r")
    repl.expect("ERROR: 42P01: ")
    repl.expect(PROMPT)

    repl.send("CREATE TABLE visits (user_name VARCHAR, n BIGINT);\r")
    repl.expect("CREATE TABLE")
    repl.expect(PROMPT)
    repl.send("\\d\r")
    repl.expect("Topics")
    repl.expect("events")
    repl.expect("Tables")
    repl.expect("visits")
    repl.expect(PROMPT)
    repl.send("\\d visits\r")
    repl.expect("user_name")
    repl.expect("BIGINT")
    repl.expect(PROMPT)

    repl.send("\\q\r")
    repl.expect(pexpect.EOF)
    repl.close()
    assert repl.exitstatus == 0
    history = history_file.read_text(encoding="utf-8")
    assert "+CREATE TOPIC events (CONSUMER reader)\n+  WITH (min_active_partitions = 2);" in history


def test_ctrl_c_cancels_a_waiting_read_and_keeps_the_repl(repl) -> None:
    repl.send("CREATE TOPIC jobs (CONSUMER worker);\r")
    repl.expect(PROMPT)
    repl.send("SELECT * FROM TOPIC jobs WITH (consumer = 'worker', wait = Interval('PT30S'));\r")
    repl.expect("running")  # the spinner shows after half a second
    repl.sendintr()
    repl.expect("ERROR: 57014: canceling statement due to user request", timeout=10)
    repl.expect(PROMPT)
    repl.send("SELECT 'still here' AS answer;\r")
    _expect_result_and_the_next_prompt(repl, r"still here\s+\(1 row\)")
    _wait_for_raw_mode(repl)
    repl.sendeof()
    repl.expect(pexpect.EOF)
    repl.close()
    assert repl.exitstatus == 0


def test_ctrl_d_typed_while_a_statement_runs_quits_once_it_ends(repl) -> None:
    repl.send("CREATE TOPIC jobs (CONSUMER worker);\r")
    _expect_result_and_the_next_prompt(repl, "CREATE TOPIC")
    sent_s = time.monotonic()
    repl.send("SELECT * FROM TOPIC jobs WITH (consumer = 'worker', wait = Interval('PT3S'));\r")
    # Once the prompt has given the terminal back (canonical mode), the read is running
    # or about to: it cannot end before 3 s after the statement was sent.
    _wait_for_raw_mode(repl, raw=False)
    repl.sendeof()
    assert time.monotonic() - sent_s < 3.0, "Ctrl-D was not sent while the statement ran"
    repl.expect(r"\(0 rows\)")
    repl.expect(pexpect.EOF)  # the next prompt read the Ctrl-D typed ahead and quit
    veof = termios.tcgetattr(repl.child_fd)[6][termios.VEOF]
    repl.close()
    assert repl.exitstatus == 0
    assert veof == b"\x04", "the console left the terminal's end-of-file key switched off"
