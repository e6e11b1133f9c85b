"""COMMIT WRITES over the wire: a sink belongs to the user whose commit first recorded it
(``engine.bulk_publish``); another user cannot pre-record its batches (R1's forgery:
empty COMMIT WRITES of a victim's future batches made its real commit a silent
duplicate), nor probe them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from sql.pgwire.server import ServerThread
from tests.pgwire.scram_users import login, scram_server
from tests.pgwire.test_copy_staged import arrow_stream, messages, stage


@pytest.fixture
def users_server(tmp_path: Path) -> Iterator[ServerThread]:
    with scram_server(tmp_path, "mallory") as running:
        yield running


_login = login


def test_an_unprivileged_user_cannot_pre_record_another_users_sink(users_server) -> None:
    with _login(users_server, "alice") as alice:
        alice.execute("CREATE TOPIC events")
        alice.execute("GRANT INSERT ON TOPIC events TO bob")
    with _login(users_server, "bob") as bob:
        stage(bob, "TOPIC events", "w-0", arrow_stream(messages(10)))
        assert bob.execute("COMMIT WRITES ('w-0') SINK 'orders-stream' BATCH 0").fetchone() == (
            "committed", 10)
    with _login(users_server, "mallory") as mallory:  # no privilege on anything
        for batch in range(1, 4):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="another user"):
                mallory.execute(f"COMMIT WRITES () SINK 'orders-stream' BATCH {batch}")
        assert mallory.execute("SELECT 1").fetchone() == (1,)
    with _login(users_server, "bob") as bob:
        stage(bob, "TOPIC events", "w-1", arrow_stream(messages(100)))
        assert bob.execute("COMMIT WRITES ('w-1') SINK 'orders-stream' BATCH 1").fetchone() == (
            "committed", 100)
        assert bob.execute("COMMIT WRITES () SINK 'orders-stream' BATCH 1").fetchone() == (
            "duplicate", 0)  # the owner's replay
    with _login(users_server, "alice") as alice:  # a superuser, but not bob's sink
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="another user"):
            alice.execute("COMMIT WRITES () SINK 'orders-stream' BATCH 1")
        assert alice.execute("SELECT count(*) FROM TOPIC events").fetchone() == (110,)


def test_r1_repro_a_superusers_squatted_sink_is_refused_not_a_silent_duplicate(
    users_server,
) -> None:
    with _login(users_server, "alice") as alice:
        alice.execute("CREATE TOPIC events")
    with _login(users_server, "mallory") as mallory:  # no privilege on anything
        for batch in range(3):
            assert mallory.execute(
                f"COMMIT WRITES () SINK 'orders-stream' BATCH {batch}").fetchone() == (
                "committed", 0)  # fmt: skip
    with _login(users_server, "alice") as alice:
        stage(alice, "TOPIC events", "w-1", arrow_stream(messages(100)))
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="another user"):
            alice.execute("COMMIT WRITES ('w-1') SINK 'orders-stream' BATCH 1")
        assert alice.execute("COMMIT WRITES ('w-1') SINK 'alices-stream' BATCH 1").fetchone() == (
            "committed", 100)  # the writes stayed staged
        assert alice.execute("SELECT count(*) FROM TOPIC events").fetchone() == (100,)


def test_a_squatted_sink_is_refused_loudly_and_the_writes_stay(users_server) -> None:
    with _login(users_server, "alice") as alice:
        alice.execute("CREATE TOPIC events")
        alice.execute("GRANT INSERT ON TOPIC events TO bob")
    with _login(users_server, "mallory") as mallory:
        assert mallory.execute("COMMIT WRITES () SINK 'orders-stream' BATCH 1").fetchone() == (
            "committed", 0)
    with _login(users_server, "bob") as bob:
        stage(bob, "TOPIC events", "w-1", arrow_stream(messages(100)))
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="another user"):
            bob.execute("COMMIT WRITES ('w-1') SINK 'orders-stream' BATCH 1")
        assert bob.execute("COMMIT WRITES ('w-1') SINK 'bobs-stream' BATCH 1").fetchone() == (
            "committed", 100)
