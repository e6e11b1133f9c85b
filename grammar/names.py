"""Topic and consumer names: what a name may be, and the 42602 errors when it is not.

Used where a name is read (the tree builder, ``TOPIC name`` in SQL); the planner resolves
an absolute topic path against the database path afterwards (``planner.paths``).
"""

from __future__ import annotations

from grammar.ast import (
    SourcePosition,
)
from storage.errors import (
    InvalidNameError,
)
from storage.limits import NAME_COMPONENT_BYTES_MAX


def check_topic_name(name: str, position: SourcePosition | None = None) -> None:
    """A topic name is a path: components separated by "/", none of them empty, "." or
    "..". 42602 otherwise. A path relative to the database (``dir/events``), or, as YQL
    writes it, absolute (``/Root/dir/events``): the planner makes an absolute path
    relative to the database's path, refusing one outside it (``planner.paths``)."""
    _check_common_name("topic", name, position)
    relative = name[1:] if name.startswith("/") else name
    for component in relative.split("/"):
        if component in ("", ".", ".."):
            shown = "an empty component" if not component else f'a "{component}" component'
            raise _name_error(f'topic name "{name}" has {shown}', position)
        if len(component.encode()) > NAME_COMPONENT_BYTES_MAX:
            raise _name_error(
                f'topic name "{name}" has a component longer than {NAME_COMPONENT_BYTES_MAX} bytes',
                position,
            )


def check_consumer_name(name: str, position: SourcePosition | None = None) -> None:
    """A consumer name is one non-empty component without "/" or "|"."""
    _check_common_name("consumer", name, position)
    if "/" in name or "|" in name:
        raise _name_error(f'consumer name "{name}" must not contain "/" or "|"', position)
    if len(name.encode()) > NAME_COMPONENT_BYTES_MAX:
        raise _name_error(
            f'consumer name "{name}" is longer than {NAME_COMPONENT_BYTES_MAX} bytes', position
        )


def check_member_name(name: str) -> None:
    """A consumer member's name (read option ``member``): as long as a consumer name may be.

    Members' names are kept in memory (their leases; where each member's last poll
    stopped, up to ``ROUND_ROBIN_POSITIONS_MAX`` of them, long after the member left), so an
    unbounded name let one user hold any amount of memory with one read a name."""
    _check_common_name("member", name, None)
    if len(name.encode()) > NAME_COMPONENT_BYTES_MAX:
        raise InvalidNameError(
            f'member name "{name[:64]}..." is longer than {NAME_COMPONENT_BYTES_MAX} bytes'
        )


def _check_common_name(what: str, name: str, position: SourcePosition | None) -> None:
    if not name:
        raise _name_error(f"{what} name is empty", position)
    if any(ord(character) < 32 or ord(character) == 127 for character in name):
        raise _name_error(f"{what} name {name!r} contains a control character", position)


def _name_error(message: str, position: SourcePosition | None) -> InvalidNameError:
    if position is None:
        return InvalidNameError(message)
    return InvalidNameError(message, line=position.line, column=position.column)
