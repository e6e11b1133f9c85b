"""``COMMIT WRITES`` and ``ABORT WRITES``: staged bulk writes published or discarded by a
statement, for every front (the wire server, the console, the Flight door's ``execute``).

The rows were staged before, each write under its client-chosen id (the wire server's
``COPY ... FROM STDIN (FORMAT arrow, WRITE_ID 'id')``, or the Flight door's ``stage``);
these statements call the same ``engine.bulk_write.BulkWrites`` functions as the Flight
door's ``commit`` and ``abort`` actions, with the same semantics:

- ``COMMIT WRITES ('a', 'b') SINK 's' BATCH n`` publishes every listed write in one
  transaction with the idempotency record ``(s, n)`` and answers one row ``(status,
  rows)``: ``committed`` and the rows published, or ``duplicate`` and 0 when ``(s, n)``
  was committed before (a replay publishes nothing and discards the listed writes). It
  runs its own transaction. Unknown ids are 42704, a malformed id or an empty sink 22023,
  another user's write 42501, a target without INSERT 42501 (nothing is published).
- ``ABORT WRITES ('a', ...)`` discards the writes and answers ``(aborted)``, the number
  of writes that existed; unknown ids are ignored (an abort may be replayed). An id
  ending in ``*`` (``'job-7-*'``) discards every staged write of the user whose id starts
  with the rest (a superuser's: every user's); ``'*'`` alone is 22023.

Neither is transactional, so both are refused inside a transaction block (25001).

Privileges are those of the writes themselves (their owner, INSERT on their targets),
checked by ``engine.bulk_write`` when the statement runs.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from engine.result import Result
from engine.transaction import SessionState
from planner.operations import Plan
from planner.write_statements import AbortStagedWrites, CommitStagedWrites
from storage.errors import ActiveSqlTransactionError, InFailedTransactionError

COMMIT_SCHEMA = pa.schema([("status", pa.string()), ("rows", pa.int64())])
ABORT_SCHEMA = pa.schema([("aborted", pa.int64())])


def result_schema(operation: CommitStagedWrites | AbortStagedWrites) -> pa.Schema:
    """The columns of the statement's one result row (for ``engine.describe``)."""
    return COMMIT_SCHEMA if isinstance(operation, CommitStagedWrites) else ABORT_SCHEMA


def run(session: Any, plan: Plan) -> Result:
    """Run the plan of a ``COMMIT WRITES`` or ``ABORT WRITES`` on ``session``.

    Called by ``Session.execute_statement`` without the session's lock: the commit runs
    its BEGIN and COMMIT through that method. Neither statement is transactional (a
    publish commits at once, a discard cannot be rolled back), so both are refused in a
    transaction block (25001), and in a failed one (25P02) as every statement is."""
    (operation,) = plan.operations
    if session.state is SessionState.FAILED:
        raise InFailedTransactionError(
            "current transaction is aborted, commands ignored until end of transaction block")
    if session.state is not SessionState.IDLE:
        raise ActiveSqlTransactionError(
            f"{plan.tag} cannot run inside a transaction block")  # fmt: skip
    writes = session.bulk_writes()
    if isinstance(operation, CommitStagedWrites):
        outcome = writes.commit(session, operation.sink_id, operation.batch_id,
                                list(operation.write_ids))  # fmt: skip
        table = pa.Table.from_pylist([{"status": outcome["status"], "rows": outcome["rows"]}],
                                     schema=COMMIT_SCHEMA)  # fmt: skip
        return Result(plan.tag, table)
    assert isinstance(operation, AbortStagedWrites), operation
    aborted = writes.abort(session, list(operation.write_ids))
    return Result(plan.tag, pa.Table.from_pylist([{"aborted": aborted}], schema=ABORT_SCHEMA))
