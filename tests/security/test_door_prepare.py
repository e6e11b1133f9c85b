"""SQL-level PREPARE/EXECUTE cannot reach what the door refuses: an ordinary user gets 42501
when preparing (or, at the latest, executing) a statement over a table not granted to it,
and never its rows."""

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
