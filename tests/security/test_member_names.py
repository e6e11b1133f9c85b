"""A consumer member's name is bounded as a consumer name is (round 25, H5).

The server keeps every member's name in memory: its lease for 30 s, and where its last
poll stopped for up to ROUND_ROBIN_POSITIONS_MAX (65,536) names long after it left. On
main a read ``WITH (consumer = 'c', member = '<16 MiB>')`` was accepted, so an ordinary
user could make the server keep 65,536 names of up to a statement's size (the wire's
16 MiB): 200 reads with 250 KB names grew the server by 83 MiB. Names over
NAME_COMPONENT_BYTES_MAX bytes are now 42602, written or bound.
"""

from __future__ import annotations

import psycopg
import pytest

from storage.limits import NAME_COMPONENT_BYTES_MAX
from tests.security.conftest import WireServer


def _read(connection: psycopg.Connection, member: str) -> list[tuple[int]]:
    return connection.execute(
        "SELECT count(*) FROM TOPIC t WITH (consumer = 'c1', member = %s)", (member,)
    ).fetchall()


def test_a_long_member_name_is_refused_written_or_bound(wire_server: WireServer) -> None:
    admin = wire_server.login("admin")
    admin.execute("CREATE TOPIC t (CONSUMER c1)")
    admin.execute("GRANT SELECT ON TOPIC t TO alice")
    admin.execute("INSERT INTO TOPIC t (data) VALUES ('a')")
    alice = wire_server.login("alice")
    too_long = "m" * (NAME_COMPONENT_BYTES_MAX + 1)
    with pytest.raises(psycopg.errors.InvalidName, match="member name"):
        _read(alice, too_long)  # bound
    with pytest.raises(psycopg.errors.InvalidName, match="member name"):
        alice.execute(f"SELECT count(*) FROM TOPIC t WITH (consumer = 'c1', member = '{too_long}')")
    with pytest.raises(psycopg.errors.InvalidName, match="member name"):
        _read(alice, "w\x01")
    assert _read(alice, "é" * (NAME_COMPONENT_BYTES_MAX // 2)) == [(1,)]
