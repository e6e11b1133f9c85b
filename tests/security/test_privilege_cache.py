"""The privilege cache never hands one transaction's old snapshot of grants to others.

Transactions inside BEGIN … COMMIT fill the cache too (else every topic-moving
transaction would read owners and grants from DuckDB again), but only when no change of
grants committed after their snapshot was taken.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.database import Database
from engine.identity import Identity
from storage.errors import InsufficientPrivilegeError

ALICE = Identity("alice", superuser=False)


def test_a_transaction_older_than_a_revoke_does_not_cache_the_grant(tmp_path: Path) -> None:
    database = Database.open(str(tmp_path / "data"))
    admin = database.connect()
    early, late = database.connect(ALICE), database.connect(ALICE)
    try:
        admin.execute("CREATE TABLE t (v INTEGER); INSERT INTO t VALUES (1)")
        admin.execute("GRANT SELECT ON t TO alice")
        early.execute("BEGIN")
        # DuckDB takes the snapshot at the first read of a table: it still holds the grant
        early.execute("SELECT count(*) FROM duckdb_tables()")
        early.execute("CREATE TEMPORARY TABLE early_mark AS SELECT 1 AS v")
        admin.execute("REVOKE SELECT ON t FROM alice")
        early.execute("SELECT v FROM t")  # judged by its snapshot: allowed
        with pytest.raises(InsufficientPrivilegeError):
            late.execute("SELECT v FROM t")  # the revoke counts for everyone else
        early.execute("COMMIT")
        with pytest.raises(InsufficientPrivilegeError):
            early.execute("SELECT v FROM t")
    finally:
        for session in (early, late, admin):
            session.close()
        database.close()


def test_a_transaction_fills_the_cache_when_nothing_changed(tmp_path: Path) -> None:
    from engine import privilege_cache

    database = Database.open(str(tmp_path / "data"))
    admin = database.connect()
    alice = database.connect(ALICE)
    try:
        admin.execute("CREATE TABLE t (v INTEGER); GRANT SELECT ON t TO alice")
        reads: list[tuple[object, ...]] = []
        original = privilege_cache.cached

        def counting(session, key, read):  # type: ignore[no-untyped-def]
            def counted():  # type: ignore[no-untyped-def]
                reads.append(key)
                return read()

            return original(session, key, counted)

        privilege_cache.cached = counting  # type: ignore[assignment]
        try:
            for _ in range(3):
                alice.execute("BEGIN")
                alice.execute("SELECT v FROM t")
                alice.execute("COMMIT")
        finally:
            privilege_cache.cached = original  # type: ignore[assignment]
        first = len(reads)
        assert first > 0
        assert len(reads) == first and reads.count(reads[0]) == 1  # read once, then cached
    finally:
        alice.close()
        admin.close()
        database.close()
