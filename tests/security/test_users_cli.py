"""``topicbase user add NAME [--superuser] | list | remove NAME`` and the users file's flag.

Run in-process through ``sql.console.main`` (the CLI never opens the data directory), so
each case costs a SCRAM verifier, not an interpreter start.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from sql import console
from sql.pgwire import users


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            *argv: str, stdin: str = "") -> tuple[int, str, str]:  # fmt: skip
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = console.main(["user", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_add_superuser_flag_list_and_remove(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "users.json")
    code, out, _ = run_cli(monkeypatch, capsys, "add", "root", "--superuser",
                           "--users-file", path, "--password-stdin", stdin="s3cret\n")  # fmt: skip
    assert code == 0 and "added superuser root" in out
    code, out, _ = run_cli(monkeypatch, capsys, "add", "alice", "--users-file", path,
                           "--password-stdin", stdin="alice pw\n")  # fmt: skip
    assert code == 0 and "added user alice" in out
    document = json.loads(Path(path).read_text())
    assert document["users"]["root"]["superuser"] is True
    assert "superuser" not in document["users"]["alice"]  # written only when true

    code, out, _ = run_cli(monkeypatch, capsys, "list", "--users-file", path)
    assert code == 0
    assert out.splitlines() == ["alice", "root\tsuperuser"]
    assert "SCRAM" not in out and "md5" not in out  # never a verifier

    users_file = users.UsersFile(path)
    assert users_file.reload() is None
    assert users_file.is_superuser("root") and not users_file.is_superuser("alice")
    assert not users_file.is_superuser("nobody")

    code, out, _ = run_cli(monkeypatch, capsys, "remove", "alice", "--users-file", path)
    assert code == 0 and "removed user alice" in out
    assert set(users.read_users(path)) == {"root"}
    code, _, err = run_cli(monkeypatch, capsys, "remove", "alice", "--users-file", path)
    assert code == 1 and "42704" in err and '"alice" does not exist' in err


def test_re_adding_without_the_flag_demotes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "users.json")
    assert users.add_user(path, "bob", "pw one", superuser=True)
    assert users.read_users(path)["bob"].superuser
    code, out, _ = run_cli(monkeypatch, capsys, "add", "bob", "--users-file", path,
                           "--password-stdin", stdin="pw two\n")  # fmt: skip
    assert code == 0 and "updated user bob" in out
    assert users.read_users(path)["bob"].superuser is False


def test_old_files_without_the_flag_are_read_as_ordinary_users(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    users.add_user(str(path), "carol", "pw")
    scram = users.read_users(str(path))["carol"].scram
    path.write_text(json.dumps({"format": users.FORMAT, "users": {"carol": {"scram": scram}}}))
    assert users.read_users(str(path))["carol"].superuser is False


def test_a_non_boolean_flag_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    users.add_user(str(path), "dave", "pw")
    document = json.loads(path.read_text())
    document["users"]["dave"]["superuser"] = "yes"
    path.write_text(json.dumps(document))
    with pytest.raises(users.ConfigFileError, match="superuser is not a boolean"):
        users.read_users(str(path))
    # The server keeps the last good contents of a file that turns bad.
    users_file = users.UsersFile(str(path))
    assert users_file.reload() is not None and users_file.count() == 0
