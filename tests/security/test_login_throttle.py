"""Failed-login throttling (``sql.pgwire.login_throttle``): floods of wrong passwords from
many connections slow the guesser, not the right user, and never the server.

The throttle's delays are scaled down (base 0.05 s, at most 0.8 s) so the tests run in
seconds; the growth and the bounds are the same as with the defaults.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from sql.pgwire import login_throttle
from sql.pgwire.login_throttle import LoginThrottle
from sql.pgwire.server import ServerThread
from storage.errors import TooManyConnectionsError
from tests.security.resource_servers import (
    ALICE,
    ALICE_PASSWORD,
    BOB,
    BOB_PASSWORD,
    login,
    running_server,
    timed,
)

BASE_DELAY_S = 0.05
DELAY_S_MAX = 0.8


@pytest.fixture
def quick_delays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(login_throttle, "DELAY_S_MAX", DELAY_S_MAX)


def _quick_throttle(server: ServerThread) -> LoginThrottle:
    throttle = LoginThrottle(BASE_DELAY_S)
    server.server.authenticator.throttle = throttle
    return throttle


def _wrong_login(server: ServerThread, user: str) -> tuple[str, float]:
    """A login with a wrong password: the server's refusal and how long it took."""
    started_s = time.monotonic()
    try:
        login(server, user, "wrong guess").close()
    except psycopg.OperationalError as error:
        return str(error), time.monotonic() - started_s
    raise AssertionError("a wrong password logged in")


# -- the throttle alone ---------------------------------------------------------------------------
def test_delays_grow_after_free_failures_and_stay_bounded() -> None:
    now = [0.0]
    throttle = LoginThrottle(0.5, clock=lambda: now[0])
    delays = [throttle.failed("10.0.0.1", "alice") for _ in range(10)]
    free = login_throttle.FREE_FAILURES
    assert delays[:free] == [0.5] * free
    assert delays[free:free + 3] == [1.0, 2.0, 4.0]
    assert max(delays) == login_throttle.DELAY_S_MAX
    # Per user name across addresses, and per address across user names.
    assert throttle.failed("10.0.0.2", "alice") == login_throttle.DELAY_S_MAX
    assert throttle.failed("10.0.0.1", "carol") == login_throttle.DELAY_S_MAX
    assert throttle.failed("10.0.0.3", "dave") == 0.5
    now[0] += 10 * login_throttle.HALF_LIFE_S  # failures fade: a forgotten password heals
    assert throttle.failed("10.0.0.1", "alice") == 0.5
    throttle.succeeded("alice")
    assert throttle.failures(user="alice") == 0


def test_full_penalty_box_refuses_before_any_password_check() -> None:
    throttle = LoginThrottle(0.5)
    boxes = [throttle.penalty_box("10.0.0.1", f"user{n}") for n in range(16)]
    for box in boxes:
        box.__enter__()
    with pytest.raises(TooManyConnectionsError, match=r"attempts from 10\.0\.0\.1") as caught:
        throttle.admit("10.0.0.1", "someone")
    assert caught.value.sqlstate == "53300"
    throttle.admit("10.0.0.2", "someone")  # another address is not affected
    for box in boxes:
        box.__exit__(None, None, None)
    throttle.admit("10.0.0.1", "someone")
    assert throttle.boxed == 0


# -- a real server under a flood ----------------------------------------------------------
def test_flood_of_wrong_passwords_slows_guesses_not_the_right_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    delay_s_max = 2.0  # longer than a login takes even on a busy machine: a delay shows
    monkeypatch.setattr(login_throttle, "DELAY_S_MAX", delay_s_max)
    with running_server(tmp_path) as server:
        throttle = _quick_throttle(server)
        bystander = login(server, BOB, BOB_PASSWORD)
        answers: list[tuple[str, float]] = []
        guessers_count, guesses_each = 6, 4

        def guess() -> None:
            for _ in range(guesses_each):
                answers.append(_wrong_login(server, ALICE))

        guessers = [threading.Thread(target=guess) for _ in range(guessers_count)]
        for thread in guessers:
            thread.start()
        time.sleep(0.3)  # the flood is under way
        right_logins = []
        for _ in range(3):  # the right password goes in at once, for the flooded name too
            connection, elapsed_s = timed(lambda: login(server, ALICE, ALICE_PASSWORD))
            right_logins.append(elapsed_s)
            assert connection.execute("SELECT 'in'").fetchone() == ("in",)
            connection.close()
            assert bystander.execute("SELECT 1").fetchone() == (1,)  # and others carry on
        for thread in guessers:
            thread.join(timeout=60)
        assert len(answers) == guessers_count * guesses_each
        assert all("password authentication failed" in text for text, _ in answers)
        assert max(right_logins) < delay_s_max / 2, right_logins
        # Later guesses waited longer than the first ones: the delay grew across
        # connections, up to its bound (plus the time of a login itself).
        first, last = min(s for _, s in answers), max(s for _, s in answers)
        assert last - first >= delay_s_max - BASE_DELAY_S - 0.5, (first, last)
        assert last < delay_s_max + 2.0
        assert throttle.failures(address="127.0.0.1") > login_throttle.FREE_FAILURES
        # A delayed failure never held a session slot or a login slot.
        assert server.server.admission.sessions == 1
        assert server.server.admission.unauthenticated == 0
        bystander.close()


def test_full_penalty_box_refuses_quickly_and_the_server_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quick_delays: None
) -> None:
    monkeypatch.setattr(login_throttle, "PENALTY_BOX_MAX", 3)
    with running_server(tmp_path) as server:
        _quick_throttle(server)
        bystander = login(server, BOB, BOB_PASSWORD)
        for _ in range(login_throttle.FREE_FAILURES + 3):  # grow the delay to its bound
            _wrong_login(server, ALICE)
        answers: list[tuple[str, float]] = []
        guessers = [threading.Thread(target=lambda: answers.append(_wrong_login(server, ALICE)))
                    for _ in range(8)]  # fmt: skip
        for thread in guessers:  # each arrives while the earlier ones wait out their delay
            thread.start()
            time.sleep(0.05)
        for thread in guessers:
            thread.join(timeout=60)
        refused = [seconds for text, seconds in answers if "too many failed login" in text]
        delayed = [seconds for text, seconds in answers if "authentication failed" in text]
        assert len(refused) + len(delayed) == 8
        assert refused and len(delayed) >= 3, answers
        assert max(refused) < DELAY_S_MAX  # refused before any password check
        assert bystander.execute("SELECT 2").fetchone() == (2,)
        time.sleep(0.2)
        with login(server, ALICE, ALICE_PASSWORD) as alice:  # once the box empties
            assert alice.execute("SELECT 3").fetchone() == (3,)
        bystander.close()
