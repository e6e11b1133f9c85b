"""``topicbase --help`` names every command a user can run, and each has its own help."""

from __future__ import annotations

import subprocess
import sys

COMMANDS = ("serve", "user", "check")


def _topicbase(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "import sys; from sql.console import main; sys.exit(main())",
         *arguments],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_help_lists_the_commands_and_the_console_options() -> None:
    done = _topicbase("--help")
    assert done.returncode == 0, done.stderr
    for command in COMMANDS:
        assert f"topicbase {command}" in done.stdout
    for option in ("--data-dir", "--command", "--file", "--format"):
        assert option in done.stdout


def test_each_command_has_its_own_help() -> None:
    for command in COMMANDS:
        done = _topicbase(command, "--help")
        assert done.returncode == 0, (command, done.stderr)
        assert done.stdout.startswith(f"usage: topicbase {command}"), (command, done.stdout)
