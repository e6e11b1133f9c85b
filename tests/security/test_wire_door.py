"""What an ordinary user meets at the wire door: SQL PREPARE/EXECUTE cannot reach what the
door refuses (42501 when preparing or, at the latest, executing a statement over a table
not granted; never its rows), and ``SHOW is_superuser`` tells the truth."""

from __future__ import annotations

import psycopg
import pytest


def test_prepare_execute_reads_nothing_ungranted(wire_server) -> None:
    admin = wire_server.login("admin")
    admin.execute("CREATE TABLE secret (v INTEGER)")
    admin.execute("INSERT INTO secret VALUES (42)")
    alice = wire_server.login("alice")
    for sql in ("PREPARE p AS SELECT * FROM secret", "PREPARE q AS SELECT v FROM main.secret"):
        try:
            alice.execute(sql)
        except psycopg.errors.InsufficientPrivilege:
            continue
        name = sql.split()[1]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            alice.execute(f"EXECUTE {name}")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        alice.execute("SELECT * FROM secret")
    assert admin.execute("SELECT v FROM secret").fetchall() == [(42,)]


def test_show_is_superuser_tells_the_truth(wire_server) -> None:
    assert wire_server.login("alice").execute("SHOW is_superuser").fetchone() == ("off",)
    assert wire_server.login("admin").execute("SHOW is_superuser").fetchone() == ("on",)
