"""``storage.zstd_messages`` against hostile bytes (review R1 round 17, F2 and F3; R2-17-1):
the read side never hands python-zstandard's one C call a declared size it would abort
the process on, and the checks of all threads hold a bounded amount of decompressed
output at once."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest
import zstandard

from storage import zstd_messages
from storage.errors import InvalidBinaryDataError, LimitExceededError

# A zstd frame header whose 8-byte content size is past 2^63 (Frame_Content_Size_flag 3),
# then a few bytes: python-zstandard 0.25's multi_decompress_to_buffer raised MemoryError
# on it once and aborted the process (heap corrupted) on the next call.
ABSURD = bytes.fromhex("28b52ffdc0b80a4d00c0105b00d7") + b"\0" * 5


def test_a_declared_size_past_any_bound_is_not_decoded_in_the_c_call() -> None:
    """Run in a child: without the bound the child aborts (SIGABRT), it must not."""
    code = ("import pyarrow as pa\n"
            "from storage import zstd_messages\n"
            f"column = pa.array([{ABSURD!r}] * 2, pa.binary())\n"
            "print([zstd_messages.decode_zstd_column(column) for _ in range(3)])\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[None, None, None]"  # the per-message path decides


def test_the_check_refuses_a_size_past_the_message_bound_before_decompressing() -> None:
    with pytest.raises((LimitExceededError, InvalidBinaryDataError)):
        zstd_messages.check_zstd_messages(pa.array([ABSURD], pa.binary()))


def test_checks_in_flight_wait_for_room() -> None:
    """Two holdings that together pass the cap run one after the other; one larger than
    the cap alone still runs once nothing else is held."""
    flight = zstd_messages._InFlight(100)
    order: list[str] = []
    first_in = threading.Event()

    def first() -> None:
        with flight.holding(60):
            first_in.set()
            time.sleep(0.2)
            order.append("first out")

    def second() -> None:
        first_in.wait(10)
        with flight.holding(60):
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert order == ["first out", "second in"]
    assert flight._held == 0  # both gave their bytes back
    with flight.holding(500):  # larger than the cap, alone: let in, never waits forever
        assert flight._held == 500
    assert flight._held == 0


def test_the_per_message_decode_refuses_a_declared_size_past_the_message_bound() -> None:
    """The per-message path (``codecs.decode``, where the one-call decode declines) never
    allocates what a stored message declares past ``MESSAGE_BYTES_MAX``: 22P03."""
    from storage import codecs, limits
    from storage.codecs import Codec

    too_big = zstandard.ZstdCompressor().compress(bytes(limits.MESSAGE_BYTES_MAX + 1))
    for message in (ABSURD, too_big):
        with pytest.raises(InvalidBinaryDataError):
            codecs.decode(Codec.ZSTD, message)
    assert codecs.decode(Codec.ZSTD, zstandard.ZstdCompressor().compress(b"ok")) == b"ok"
