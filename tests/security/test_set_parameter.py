"""``SET name = $1`` is a syntax error (42601), as in PostgreSQL (round 25, H5).

Before, a SET prepared with a bound parameter stored the text ``$1`` (``SET
application_name = $1`` answered SET and the client believed its value was set) or
answered 22023 about the value "$1". A quoted '$1' is an ordinary string and stays one.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.security.conftest import WireServer


@pytest.mark.parametrize(
    "statement",
    ["SET application_name = %s", "SET statement_timeout TO %s", "SET TIME ZONE %s",
     "SET search_path = main, %s"],
)  # fmt: skip
def test_set_with_a_bound_parameter_is_42601(wire_server: WireServer, statement: str) -> None:
    alice = wire_server.login("alice")
    before = alice.execute("SHOW application_name").fetchone()
    with pytest.raises(psycopg.errors.SyntaxError, match=r'at or near "\$1"'):
        alice.execute(statement, ("main",))
    assert alice.execute("SHOW application_name").fetchone() == before


def test_a_quoted_dollar_one_is_a_value(wire_server: WireServer) -> None:
    alice = wire_server.login("alice")
    alice.execute("SET application_name = '$1'")
    assert alice.execute("SHOW application_name").fetchone() == ("$1",)
