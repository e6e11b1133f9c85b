"""An ordinary user's Flight calls in progress are bounded by their connection limit, as
their wire sessions are (round 26 left the Flight door without a per-user bound: one user
could hold as many engine sessions there as gRPC had threads): one call more is refused
before it runs, FlightUnavailableError ``53300``; superusers are not bound; a place comes
back when its call completes."""

from __future__ import annotations

import threading

import pyarrow.flight as flight
import pytest

from spark_sql_ext.client import TopicbaseClient, TopicbaseFlightError
from sql.flight.server import TopicbaseFlightServer, start_flight
from sql.pgwire.users import add_user, default_users_path
from tests.flight.conftest import PASSWORDS, wait_until


def _hold(clients: list[TopicbaseClient]) -> list[threading.Thread]:
    threads = [threading.Thread(target=c.action, args=("relations",)) for c in clients]
    for thread in threads:
        thread.start()
    return threads


def _refused_raw(client: TopicbaseClient) -> flight.FlightError:
    """The raw Flight error of a ``list`` call (the client library turns any into its own)."""
    with pytest.raises(flight.FlightUnavailableError) as caught:
        list(client._client.do_action(flight.Action("list", b"{}"), client._options))
    assert str(caught.value).startswith('53300: too many connections for role "bob"')
    return caught.value


def _connect(door: TopicbaseFlightServer, user: str) -> TopicbaseClient:
    return TopicbaseClient(f"topicbase://127.0.0.1:{door.port}", user, PASSWORDS[user])


def test_a_users_own_limit_bounds_their_flight_calls(database, blocked) -> None:
    add_user(default_users_path(database.path), "bob", PASSWORDS["bob"], connection_limit=2)
    door = start_flight(database, "127.0.0.1", 0, "scram")
    try:
        bobs = [_connect(door, "bob") for _ in range(3)]
        alices = [_connect(door, "alice") for _ in range(3)]  # a superuser: not bound
        held = _hold(bobs[:2])
        wait_until(lambda: door.admission.calls["bob"] == 2)
        _refused_raw(bobs[2])
        with pytest.raises(TopicbaseFlightError) as caught:  # as the client library says
            bobs[2].action("list")
        assert caught.value.sqlstate == "53300"
        with pytest.raises(TopicbaseFlightError) as login:  # a login is a call too
            _connect(door, "bob")
        assert login.value.sqlstate == "53300"
        alice_threads = _hold(alices)
        wait_until(lambda: door.admission.calls == {"bob": 2})
        blocked.set()  # the held calls complete and give their places back
        for thread in held + alice_threads:
            thread.join(20)
        wait_until(lambda: not door.admission.calls)
        assert bobs[2].action("list") == []
        for connection in bobs + alices:
            connection.close()
    finally:
        door.stop()


def test_the_servers_per_user_default_binds_users_without_their_own(database, blocked) -> None:
    door = start_flight(database, "127.0.0.1", 0, "scram", connections_per_user_max=1)
    try:
        first, second = _connect(door, "bob"), _connect(door, "bob")
        held = _hold([first])
        wait_until(lambda: door.admission.calls["bob"] == 1)
        _refused_raw(second)
        blocked.set()
        held[0].join(20)
        wait_until(lambda: not door.admission.calls)
        assert second.action("list") == []
        first.close()
        second.close()
    finally:
        door.stop()


def test_a_limit_of_zero_refuses_every_call_of_the_user(database) -> None:
    add_user(default_users_path(database.path), "bob", PASSWORDS["bob"], connection_limit=0)
    door = start_flight(database, "127.0.0.1", 0, "scram")
    try:
        with pytest.raises(TopicbaseFlightError) as caught:
            _connect(door, "bob")
        assert caught.value.sqlstate == "53300"
        assert not door.admission.calls
    finally:
        door.stop()
