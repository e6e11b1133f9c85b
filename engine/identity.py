"""Who a session acts as: a user name and whether it is a superuser.

Over the wire and Flight the authenticated user is the session's identity; the console
and the DB-API on a local data directory act as ``LOCAL_SUPERUSER`` (whoever can open
the data directory can already read every file in it). Privileges (``engine.privileges``)
and the sandbox (``engine.sandbox``) are checked against it for every statement.

Invariant: an ``Identity`` is immutable; a session's identity is replaced only by SET ROLE
and SET SESSION AUTHORIZATION (``engine.grants``, PostgreSQL's rules: a superuser may
become anyone, others only themselves; undone by a ROLLBACK of their transaction).
"""

from __future__ import annotations

from dataclasses import dataclass

LOCAL_SUPERUSER_NAME = "topicbase"


@dataclass(frozen=True)
class Identity:
    name: str
    superuser: bool


LOCAL_SUPERUSER = Identity(LOCAL_SUPERUSER_NAME, superuser=True)


class RoleRemovedError(Exception):
    """The user a session logged in as is no longer known (``engine.grants.refresh_roles``);
    its argument is the user's name. The front ends the session."""
