"""The rows an SQL cursor keeps in memory count in the server's held-bytes budget (round 25, H5).

``DECLARE c CURSOR WITH HOLD FOR <query>`` keeps a result of up to ``spill.SPILL_BYTES``
(8 MiB) in the heap until CLOSE or the connection ends, and a connection may keep 1,000
cursors: on main one ordinary user's connection could hold 8 GiB (60 cursors of 7 MB: +435
MiB RSS), uncounted. Now each cursor's heap bytes are taken from the connection's share of
``ServerLimits.held_bytes_max`` (53200 past it, nothing kept) and given back when the
cursor is closed, pruned with its transaction, or its connection ends.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import psycopg
import pytest

from sql.pgwire.codec import messages as m
from sql.pgwire.limits import ServerLimits
from tests.pgwire.rawclient import RawClient, error_fields, parse, query, sync
from tests.security.resource_servers import ALICE, ALICE_PASSWORD, login, running_server

_ROWS = "SELECT repeat('x', 1000) AS pad FROM range(1000)"
_DECLARE = "DECLARE c{} CURSOR WITH HOLD FOR " + _ROWS


def test_held_cursors_are_charged_refused_past_the_share_and_given_back(tmp_path: Path) -> None:
    limits = ServerLimits(held_bytes_max=16 << 20, held_bytes_floor=1 << 20)  # share: 4 MiB
    with running_server(tmp_path, limits=limits) as server:
        budget = server.server.memory_budget
        alice = login(server, ALICE, ALICE_PASSWORD)
        with pytest.raises(psycopg.errors.OutOfMemory, match="cursors"):
            for number in range(20):  # ~1 MB each
                alice.execute(_DECLARE.format(number))
        assert 0 < budget.held_bytes <= limits.held_bytes_max // 4
        alice.execute("CLOSE ALL")
        assert budget.held_bytes == 0
        for number in range(3):  # room again after CLOSE
            alice.execute(_DECLARE.format(f"kept{number}"))
        assert budget.held_bytes > 0
        alice.close()
        deadline_s = time.monotonic() + 10
        while budget.held_bytes and time.monotonic() < deadline_s:
            time.sleep(0.02)
        assert budget.held_bytes == 0  # the connection's end gave its cursors' bytes back


def test_a_cursor_of_an_ended_transaction_gives_its_bytes_back(tmp_path: Path) -> None:
    limits = ServerLimits(held_bytes_max=16 << 20, held_bytes_floor=1 << 20)
    with running_server(tmp_path, limits=limits) as server:
        budget = server.server.memory_budget
        alice = login(server, ALICE, ALICE_PASSWORD)
        alice.execute("BEGIN")
        for number in range(3):
            alice.execute(_DECLARE.format(number).replace(" WITH HOLD", ""))
        assert budget.held_bytes > 0
        alice.execute("COMMIT")
        alice.execute(_DECLARE.format("held"))  # the next cursor command prunes the ended ones
        assert budget.held_bytes == 0  # one ~1 MB cursor stays within the floor
        # one Query of several statements: pruned at its end, on the connection's loop
        alice.execute("CLOSE ALL")
        declares = "; ".join(_DECLARE.format(n).replace(" WITH HOLD", "") for n in range(3))
        alice.execute(f"BEGIN; {declares}; COMMIT")
        assert budget.held_bytes == 0
        alice.close()


def _bind_named(portal: str) -> bytes:
    body = m.cstr(portal) + m.cstr("") + struct.pack("!HHH", 0, 0, 0)
    return m.message(b"B", body)


def _execute(portal: str, max_rows: int) -> bytes:
    return m.message(b"E", m.cstr(portal) + struct.pack("!i", max_rows))


@pytest.mark.parametrize("max_rows", [1, 0])
def test_named_portals_rows_are_charged_like_cursors(tmp_path: Path, max_rows: int) -> None:
    """Round 26 (H3): a named portal keeps its whole result until it is closed or its
    transaction ends (Sync does not drop it inside a transaction block), suspended
    (``max_rows``) or not; 1,000 of them a connection, each up to ``result_bytes_max``,
    were held uncounted (60 portals of 7 MB: +415 MiB of the server, budget 0). Now a
    named portal's rows are charged as a cursor's before any is sent (53200 past the
    connection's share, the portal dropped) and given back when the portal goes."""
    limits = ServerLimits(held_bytes_max=16 << 20, held_bytes_floor=1 << 20)  # share: 4 MiB
    with running_server(tmp_path, auth="trust", limits=limits) as server:
        budget = server.server.memory_budget
        client = RawClient(server.port)
        client.start()
        client.send(query("BEGIN"))
        client.until_ready()
        refused = None
        for number in range(20):  # ~1 MB each
            client.send(parse("", _ROWS) + _bind_named(f"p{number}")
                        + _execute(f"p{number}", max_rows) + sync())  # fmt: skip
            errors = [body for kind, body in client.until_ready() if kind == b"E"]
            if errors:
                refused = error_fields(errors[0])
                break
        assert refused is not None and refused["C"] == "53200", refused
        assert "portal's rows" in refused["M"]
        assert 0 < budget.held_bytes <= limits.held_bytes_max // 4
        client.send(query("ROLLBACK"))
        client.until_ready()
        assert budget.held_bytes == 0  # the transaction's end dropped the portals
        client.send(parse("", _ROWS) + _bind_named("again") + _execute("again", 1) + sync())
        assert b"E" not in {kind for kind, _ in client.until_ready()}  # room again
        client.close()
