"""A consumer read in autocommit runs in a transaction held until its rows were sent
(``copy_commit.hold``). Anything that fails after the read ran but before the held
transaction reaches the connection (the text description of its result,
``text_description``, in ``Connection._start_or_run`` and
``ExtendedProtocol._execute_prepared``) must roll that transaction back: nobody else
holds it, and the session would be left inside it (ReadyForQuery ``T``/``E``, the next
statements in the read's transaction).

``text_description`` itself does not raise an ``Exception`` (unknown Arrow types are
described as text, a failed description is caught and logged): the failure is injected
here, a guard on the code's shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest

from sql.pgwire.connection.extended import ExtendedProtocol
from sql.pgwire.server import ServerThread
from tests.pgwire.rawclient import RawClient, error_fields
from tests.pgwire.test_consumer_rows_commit import _fill, binary_read, committed, read_flight

Connect = Callable[..., psycopg.Connection]


class InjectedError(RuntimeError):
    pass


@pytest.fixture
def raw(server: ServerThread) -> Iterator[RawClient]:
    client = RawClient(server.port)
    client.start()
    yield client
    client.close()


@pytest.mark.parametrize("simple", [False, True], ids=["extended", "simple"])
def test_a_failure_after_the_read_ran_rolls_its_transaction_back(
    connect: Connect, raw: RawClient, monkeypatch: pytest.MonkeyPatch, simple: bool
) -> None:
    admin = connect(autocommit=True)
    written = _fill(admin, "small", rows=50, size=100)

    def failing(*args: object, **kwargs: object) -> None:
        raise InjectedError("describing the result failed")

    monkeypatch.setattr(ExtendedProtocol, "text_description", failing)
    raw.send(read_flight("small", 10, simple=simple))
    got = raw.until_ready()
    errors = [body for kind, body in got if kind == b"E"]
    assert errors and error_fields(errors[0])["C"] == "XX000"  # an internal error
    assert got[-1] == (b"Z", b"I"), "the held transaction ended: idle, not inside it"
    monkeypatch.undo()
    assert committed(admin, "small") is None
    assert binary_read(admin, "small", 10) == written[:10]
