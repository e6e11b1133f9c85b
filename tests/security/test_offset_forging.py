"""A user with SELECT on a topic cannot commit a consumer's offsets past a partition's end.

Round 25 (H5): ``COMMIT OFFSETS ... (PARTITION 0 UPTO 1000)`` on a partition holding 3
messages set the committed offset to 1000, so the consumer silently skipped the next
997 messages written (``sys.consumers`` showed lag 0, ``topicbase check`` saw nothing)
and an important consumer stopped holding them against retention. Now 22023, as
``ALTER ... SET OFFSETS`` past the end already was; ranges within the end still commit.
"""

from __future__ import annotations

import psycopg
import pytest

from engine.database import Database
from engine.identity import Identity
from storage import limits
from tests.security.conftest import WireServer


def _topic_with_three_messages(wire_server: WireServer) -> psycopg.Connection:
    admin = wire_server.login("admin")
    admin.execute("CREATE TOPIC t (CONSUMER c1 WITH (important = true))")
    admin.execute("GRANT SELECT ON TOPIC t TO alice")
    admin.execute("INSERT INTO TOPIC t (data) VALUES ('a'), ('b'), ('c')")
    return admin


def test_commit_past_the_end_is_refused_and_later_messages_reach_the_consumer(
    wire_server: WireServer,
) -> None:
    admin = _topic_with_three_messages(wire_server)
    alice = wire_server.login("alice")
    for ranges in ("PARTITION 0 UPTO 1000", "PARTITION 0 FROM 500 UPTO 1000",
                   "PARTITION 0 UPTO 4"):  # fmt: skip
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="past the partition"):
            alice.execute(f"COMMIT OFFSETS ON TOPIC t FOR CONSUMER c1 ({ranges})")
    committed = "SELECT committed_offset FROM sys.consumers WHERE topic = 't'"
    assert admin.execute(committed).fetchone() == (None,)  # never committed
    admin.execute("INSERT INTO TOPIC t (data) VALUES ('d'), ('e')")
    read = admin.execute(
        "SELECT CAST(data AS VARCHAR) FROM TOPIC t WITH (consumer = 'c1')"
    ).fetchall()
    assert [row[0] for row in read] == ["a", "b", "c", "d", "e"]


def test_commit_up_to_the_end_still_moves_the_offset(wire_server: WireServer) -> None:
    admin = _topic_with_three_messages(wire_server)
    alice = wire_server.login("alice")
    alice.execute("COMMIT OFFSETS ON TOPIC t FOR CONSUMER c1 (PARTITION 0 FROM 1 UPTO 3)")
    alice.execute("COMMIT OFFSETS ON TOPIC t FOR CONSUMER c1 (PARTITION 0 UPTO 1)")
    committed = "SELECT committed_offset FROM sys.consumers WHERE topic = 't'"
    assert admin.execute(committed).fetchone() == (3,)


def test_a_rolled_back_commit_offsets_range_moves_nothing_later(wire_server: WireServer) -> None:
    """A range ahead of the committed offset, committed in a transaction that rolled back,
    used to stay remembered: the next commit filling the gap before it carried the offset
    over it (c1 went to 4, skipping messages 1-3). Only committed ranges are remembered."""
    admin = _topic_with_three_messages(wire_server)
    admin.execute("INSERT INTO TOPIC t (data) VALUES ('d')")
    alice = wire_server.login("alice")
    alice.execute("BEGIN")
    alice.execute("COMMIT OFFSETS ON TOPIC t FOR CONSUMER c1 (PARTITION 0 FROM 1 UPTO 4)")
    alice.execute("ROLLBACK")
    admin.execute("COMMIT OFFSETS ON TOPIC t FOR CONSUMER c1 (PARTITION 0 UPTO 1)")
    committed = "SELECT committed_offset FROM sys.consumers WHERE topic = 't'"
    assert admin.execute(committed).fetchone() == (1,)
    # committed, the same range is remembered and the gap's commit carries the offset over it
    alice.execute("BEGIN")
    alice.execute("COMMIT OFFSETS ON TOPIC t FOR CONSUMER c1 (PARTITION 0 FROM 2 UPTO 4)")
    alice.execute("COMMIT")
    assert admin.execute(committed).fetchone() == (1,)
    admin.execute("COMMIT OFFSETS ON TOPIC t FOR CONSUMER c1 (PARTITION 0 FROM 1 UPTO 2)")
    assert admin.execute(committed).fetchone() == (4,)


def test_concurrent_transactions_keep_at_most_the_bound_of_pending_ranges(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 26 (H3): each open transaction's COMMIT OFFSETS passed the bound of pending
    ranges against the same committed list, and COMMIT added them all, so N transactions
    held N times ``PENDING_RANGES_MAX`` ranges of one key (in memory, sorted under the
    catalog's lock at every later COMMIT OFFSETS), and the owner's next COMMIT OFFSETS
    filling the gap was refused (54000) for the ranges still ahead. Now the lowest
    ``PENDING_RANGES_MAX`` are kept; the rest are delivered again, never skipped."""
    monkeypatch.setattr(limits, "PENDING_RANGES_MAX", 3)
    admin = database.connect()
    admin.execute("CREATE TOPIC t (CONSUMER c1)")
    admin.execute("INSERT INTO TOPIC t (data) SELECT 'm' FROM range(20)")
    first, second = (database.connect(Identity(n, superuser=True)) for n in ("ann", "bob"))
    for session, starts in ((first, (2, 4, 6)), (second, (8, 10, 12))):
        session.execute("BEGIN")
        for start in starts:
            session.execute(
                f"COMMIT OFFSETS ON TOPIC t FOR CONSUMER c1 (PARTITION 0 FROM {start} "
                f"UPTO {start + 1})"
            )
    first.execute("COMMIT")
    second.execute("COMMIT")
    admin.execute("COMMIT OFFSETS ON TOPIC t FOR CONSUMER c1 (PARTITION 0 UPTO 1)")
    committed = "SELECT committed_offset AS c FROM sys.consumers WHERE topic = 't'"
    assert admin.execute(committed)[-1].table.to_pylist() == [{"c": 1}]
    for start in (1, 3, 5, 7):  # ann's ranges carry the offset; bob's were dropped
        admin.execute(
            f"COMMIT OFFSETS ON TOPIC t FOR CONSUMER c1 (PARTITION 0 FROM {start} UPTO {start + 1})"
        )
    assert admin.execute(committed)[-1].table.to_pylist() == [{"c": 8}]
    for session in (first, second, admin):
        session.close()
