"""What a front tells a client about a bug: an id, never the exception's text.

An exception that is not a ``TopicbaseError`` is a bug (or a library failing in a way we
did not foresee). Its text may hold file paths, SQL of other statements, values or
library internals, so no client ever sees it: ``internal_error`` logs the traceback under
a short random id (logger ``topicbase.internal``, level ERROR) and returns
``InternalError`` (XX000) "internal error (id …)", which fronts report like any other
error. An operator finds the traceback by grepping the log for the id.

Every front (the wire server, the DB-API, the console) goes through here, so the rule
holds in one place. Thread-safe: it only logs.
"""

from __future__ import annotations

import logging
import secrets

from storage.errors import InternalError, OutOfMemoryError, TopicbaseError

log = logging.getLogger("topicbase.internal")

ERROR_ID_BYTES = 6  # 12 hex digits: unique enough to grep a log for


def internal_error(error: BaseException, where: str) -> InternalError:
    """Log ``error`` with its traceback under a new id; the client-facing XX000 error."""
    assert not isinstance(error, TopicbaseError), "TopicbaseErrors go to clients as they are"
    error_id = secrets.token_hex(ERROR_ID_BYTES)
    log.error("internal error (id %s) in %s", error_id, where, exc_info=error)
    return InternalError(f"internal error (id {error_id})", error_id=error_id)


def out_of_memory(error: MemoryError, where: str) -> OutOfMemoryError:
    """A ``MemoryError`` (an allocation refused, as under ``topicbase serve``'s process memory
    cap, ``sql.pgwire.memory_cap``) as the client's 53200: not a bug, and the session goes on
    (the engine rolled back or stopped whatever it was committing: ``engine.commit``). Logged
    at WARNING with its traceback under an id, as an internal error is."""
    error_id = secrets.token_hex(ERROR_ID_BYTES)
    log.warning("out of memory (id %s) in %s", error_id, where, exc_info=error)
    return OutOfMemoryError(f"out of memory (id {error_id}): an allocation failed")


def client_error(error: BaseException, where: str) -> TopicbaseError:
    """``error`` as a client may see it: a TopicbaseError unchanged, a ``MemoryError`` as
    53200 (``out_of_memory``), anything else as an ``internal_error`` (logged)."""
    if isinstance(error, TopicbaseError):
        return error
    if isinstance(error, MemoryError):
        return out_of_memory(error, where)
    return internal_error(error, where)
