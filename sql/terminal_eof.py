"""Ctrl-D typed while the REPL runs a statement reaches the next prompt as Ctrl-D.

prompt_toolkit puts the terminal in raw mode only while it reads a line; while a statement
runs (and results are drawn) the terminal is back in canonical mode, where the line
discipline acts on the keys typed ahead. There Ctrl-D is VEOF: the kernel keeps it as an
end-of-file mark that only a canonical read would see, and the next prompt, reading raw,
gets a NUL byte (Ctrl-@, which sets a selection mark) instead. So a Ctrl-D typed during a
long statement was lost, where psql quits once the statement ends. ``eof_key_kept``
switches VEOF off while the REPL runs: the key stays the byte 0x04 in the input queue and
the prompt reads it as Ctrl-D (quit on an empty line, delete a character otherwise).
Ctrl-C, Ctrl-Z and Ctrl-\\ keep their signals (ISIG is left alone).

Invariant: VEOF is the only attribute changed; when the block ends, the terminal's VEOF is
the one it had on entry and every other attribute is left as the block left it. While the
block runs, raw-mode readers (prompt_toolkit saves and restores the attributes around each
prompt) see no difference: VEOF means nothing in raw mode. A file descriptor that is not a
terminal, or a terminal whose attributes cannot be set, is left as it is.
"""

from __future__ import annotations

import contextlib
import os
import termios
from collections.abc import Iterator

_VEOF = termios.VEOF
_CONTROL_CHARACTERS = 6  # the index of the cc list in a tcgetattr result


def _disabled_character(fd: int) -> bytes:
    """The value that switches a control character off on this terminal (POSIX
    ``_POSIX_VDISABLE``: a NUL byte on Linux)."""
    try:
        value = os.fpathconf(fd, "PC_VDISABLE")
    except (OSError, ValueError):
        value = 0
    return bytes([value if 0 <= value <= 255 else 0])


def _set_eof_character(fd: int, character: bytes) -> None:
    """Set VEOF alone: the other attributes are read now, so a change made since is kept."""
    attributes = termios.tcgetattr(fd)
    attributes[_CONTROL_CHARACTERS][_VEOF] = character
    termios.tcsetattr(fd, termios.TCSANOW, attributes)  # TCSANOW: typed-ahead input is kept


def _switch_off(fd: int) -> bytes | None:
    """Switch VEOF off on the terminal ``fd``; its previous value, or None if nothing was
    changed (not a terminal, already off, attributes that cannot be set)."""
    try:
        original = termios.tcgetattr(fd)[_CONTROL_CHARACTERS][_VEOF]
    except (termios.error, OSError):  # not a terminal
        return None
    disabled = _disabled_character(fd)
    if original == disabled:  # already off: nothing to do or undo
        return None
    try:
        _set_eof_character(fd, disabled)
    except (termios.error, OSError):
        return None
    return original


@contextlib.contextmanager
def eof_key_kept(fd: int) -> Iterator[None]:
    """Run the block with the terminal ``fd``'s VEOF switched off; restore it after."""
    original = _switch_off(fd)
    try:
        yield
    finally:
        if original is not None:
            # A terminal that went away (hang-up) has nothing to restore.
            with contextlib.suppress(termios.error, OSError):
                _set_eof_character(fd, original)
