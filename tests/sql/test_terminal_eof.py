"""sql.terminal_eof: a Ctrl-D typed in canonical mode reaches a later raw read as Ctrl-D."""

from __future__ import annotations

import contextlib
import os
import select
import termios
import time
from collections.abc import Iterator

import pytest

from sql.terminal_eof import eof_key_kept

CTRL_D = b"\x04"


@pytest.fixture
def terminal() -> Iterator[tuple[int, int]]:
    """A pseudo-terminal: (master, slave), the slave in its default canonical mode."""
    master, slave = os.openpty()
    yield master, slave
    os.close(master)
    os.close(slave)


def _eof_character(fd: int) -> bytes:
    return termios.tcgetattr(fd)[6][termios.VEOF]


def _typed_then_read_raw(master: int, slave: int, *, eof_mark: bool) -> bytes:
    """Type Ctrl-D while the slave is canonical, then read it raw, as the next prompt does.

    The line discipline takes typed bytes asynchronously: with ``eof_mark`` the function waits
    until the canonical slave reports the end-of-file mark readable before switching to raw, so
    the switch cannot overtake the key (it would then be read raw as 0x04 whatever the setting).
    Without it (VEOF switched off) the key completes no line, and it is 0x04 either way.
    """
    os.write(master, CTRL_D)
    if eof_mark:
        readable, _, _ = select.select([slave], [], [], 5.0)
        assert readable, "the end-of-file mark never reached the canonical reader"
    else:
        time.sleep(0.1)  # the line discipline takes the key before the switch, as in a pause
    attributes = termios.tcgetattr(slave)
    attributes[3] &= ~(termios.ICANON | termios.ECHO)
    attributes[6][termios.VMIN] = 1
    attributes[6][termios.VTIME] = 0
    termios.tcsetattr(slave, termios.TCSANOW, attributes)
    readable, _, _ = select.select([slave], [], [], 5.0)
    assert readable, "the typed key never reached the reader"
    return os.read(slave, 16)


@pytest.mark.parametrize("kept", [True, False])
def test_ctrl_d_typed_in_canonical_mode_is_read_raw_as_ctrl_d_only_when_kept(
    terminal: tuple[int, int], kept: bool
) -> None:
    master, slave = terminal
    block = eof_key_kept(slave) if kept else contextlib.nullcontext()
    with block:
        read = _typed_then_read_raw(master, slave, eof_mark=not kept)
    # Without the block the line discipline keeps an end-of-file mark, which a raw read
    # gets as a NUL byte (Ctrl-@): the key is lost. This arm shows why the module exists.
    assert read == (CTRL_D if kept else b"\x00")


def test_the_eof_key_is_off_inside_and_restored_after_even_on_an_error(
    terminal: tuple[int, int],
) -> None:
    _, slave = terminal
    original = _eof_character(slave)
    assert original == CTRL_D
    with pytest.raises(KeyboardInterrupt), eof_key_kept(slave):
        assert _eof_character(slave) == bytes([os.fpathconf(slave, "PC_VDISABLE")])
        raise KeyboardInterrupt
    assert _eof_character(slave) == original


def test_other_attributes_changed_inside_the_block_are_kept(terminal: tuple[int, int]) -> None:
    _, slave = terminal
    with eof_key_kept(slave):
        attributes = termios.tcgetattr(slave)
        attributes[3] &= ~termios.ECHO
        attributes[6][termios.VINTR] = b"\x07"
        termios.tcsetattr(slave, termios.TCSANOW, attributes)
    after = termios.tcgetattr(slave)
    assert not after[3] & termios.ECHO
    assert after[6][termios.VINTR] == b"\x07"
    assert after[6][termios.VEOF] == CTRL_D


def test_an_eof_key_already_off_is_left_off(terminal: tuple[int, int]) -> None:
    _, slave = terminal
    attributes = termios.tcgetattr(slave)
    attributes[6][termios.VEOF] = b"\x00"
    termios.tcsetattr(slave, termios.TCSANOW, attributes)
    with eof_key_kept(slave):
        assert _eof_character(slave) == b"\x00"
    assert _eof_character(slave) == b"\x00"


def test_a_descriptor_that_is_not_a_terminal_is_left_alone() -> None:
    reader, writer = os.pipe()
    try:
        with eof_key_kept(reader):
            os.write(writer, CTRL_D)
        assert os.read(reader, 16) == CTRL_D
    finally:
        os.close(reader)
        os.close(writer)
