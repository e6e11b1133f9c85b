"""The rows an SQL cursor keeps in memory count in the server's held-bytes budget (round 25, H5).

``DECLARE c CURSOR WITH HOLD FOR <query>`` keeps a result of up to ``spill.SPILL_BYTES``
(8 MiB) in the heap until CLOSE or the connection ends, and a connection may keep 1,000
cursors: on main one ordinary user's connection could hold 8 GiB (60 cursors of 7 MB: +435
MiB RSS), uncounted. Now each cursor's heap bytes are taken from the connection's share of
``ServerLimits.held_bytes_max`` (53200 past it, nothing kept) and given back when the
cursor is closed, pruned with its transaction, or its connection ends.
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from sql.pgwire.limits import ServerLimits
from tests.security.resource_servers import ALICE, ALICE_PASSWORD, login, running_server

_DECLARE = "DECLARE c{} CURSOR WITH HOLD FOR SELECT repeat('x', 1000) AS pad FROM range(1000)"


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
