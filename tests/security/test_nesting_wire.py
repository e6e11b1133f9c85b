"""Deep nesting in a catalog query over the wire is 54001, never a Python error (XX000)."""

from __future__ import annotations

import psycopg
import pytest


@pytest.mark.parametrize("chain", ["NOT " * 5000, "- " * 5000])
def test_deep_chain_in_a_catalog_query_is_too_complex(wire_server, chain: str) -> None:
    alice = wire_server.login("alice")
    with pytest.raises(psycopg.errors.StatementTooComplex):
        alice.execute(f"SELECT relname FROM pg_catalog.pg_class WHERE {chain} true")
    assert alice.execute("SELECT 1").fetchone() == (1,)
