"""A transaction that writes to a thousand partitions commits (both kinds of commit).

Its staged batches, one per partition, go to the staging log in one ``pwritev`` of well
over the kernel's IOV_MAX (1024) buffers: before ``storage.fs`` wrote them in runs, the
COMMIT failed with EINVAL ("could not write … .stage: Invalid argument").
"""

from __future__ import annotations

import pytest

from engine.database import Database
from engine.session import Session
from tests.engine.conftest import rows

MESSAGES = 5000
PRODUCERS = 2000


@pytest.mark.parametrize("with_table", [False, True], ids=["topic_only", "with_table"])
def test_a_transaction_over_1000_partitions_commits(
    database: Database, session: Session, with_table: bool
) -> None:
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 1000)")
    session.execute("CREATE TABLE notes (n INTEGER)")
    data = [f"m{i}" for i in range(MESSAGES)]
    producers = [f"p{i % PRODUCERS}" for i in range(MESSAGES)]
    session.execute("BEGIN")
    session.execute(
        "INSERT INTO TOPIC t (data, producer_id) SELECT unnest(?), unnest(?)", [data, producers]
    )
    if with_table:
        session.execute("INSERT INTO notes VALUES (1)")
    session.execute("COMMIT")
    counted = rows(session, "SELECT count(*) AS n, count(DISTINCT partition) AS p FROM t")
    assert counted == [{"n": MESSAGES, "p": 1000}]
    counts = database.commit_counters()
    assert counts["log_commits" if not with_table else "table_commits"] >= 1
