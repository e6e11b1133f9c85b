"""Who a session acts as: a user name and whether it is a superuser.

Over the wire and Flight the authenticated user is the session's identity; the console
and the DB-API on a local data directory act as ``LOCAL_SUPERUSER`` (whoever can open
the data directory can already read every file in it). Privileges (``engine.privileges``)
and the sandbox (``engine.sandbox``) are checked against it for every statement.

Invariant: an identity never changes for the life of a session.
"""

from __future__ import annotations

from dataclasses import dataclass

LOCAL_SUPERUSER_NAME = "topicbase"


@dataclass(frozen=True)
class Identity:
    name: str
    superuser: bool


LOCAL_SUPERUSER = Identity(LOCAL_SUPERUSER_NAME, superuser=True)
