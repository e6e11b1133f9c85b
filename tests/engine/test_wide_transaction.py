"""A transaction that writes to hundreds of partitions commits (both kinds of commit).

Its staged batches, one per partition, go to the staging log in one ``pwritev`` of more
than the kernel's IOV_MAX (1024) buffers (two a partition): before ``storage.fs`` wrote
them in runs, the COMMIT failed with EINVAL ("could not write … .stage: Invalid
argument"). 600 partitions cross that bound as 1000 did (the test checks that they do),
at ~60 % of the cost of creating, writing and closing 1000.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.database import Database
from engine.session import Session
from storage.fs import FileSystem
from storage.limits import IOV_MAX
from tests.engine.conftest import rows

PARTITIONS = 600
MESSAGES = 3000
PRODUCERS = 1200  # spread over every partition (a producer's messages share one)


@pytest.mark.parametrize("with_table", [False, True], ids=["topic_only", "with_table"])
def test_a_transaction_over_many_partitions_commits(
    database: Database, session: Session, with_table: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    session.execute(f"CREATE TOPIC t WITH (min_active_partitions = {PARTITIONS})")
    session.execute("CREATE TABLE notes (n INTEGER)")
    data = [f"m{i}" for i in range(MESSAGES)]
    producers = [f"p{i % PRODUCERS}" for i in range(MESSAGES)]
    handed: list[int] = []
    pwritev = FileSystem.pwritev

    def counting(self: FileSystem, fd: int, parts: list[Any], position: int) -> None:
        handed.append(len(parts))
        pwritev(self, fd, parts, position)

    monkeypatch.setattr(FileSystem, "pwritev", counting)
    session.execute("BEGIN")
    session.execute(
        "INSERT INTO TOPIC t (data, producer_id) SELECT unnest(?), unnest(?)", [data, producers]
    )
    if with_table:
        session.execute("INSERT INTO notes VALUES (1)")
    session.execute("COMMIT")
    assert max(handed) > IOV_MAX  # one write of more buffers than the kernel takes at once
    counted = rows(session, "SELECT count(*) AS n, count(DISTINCT partition) AS p FROM t")
    assert counted == [{"n": MESSAGES, "p": PARTITIONS}]
    counts = database.commit_counters()
    assert counts["log_commits" if not with_table else "table_commits"] >= 1
