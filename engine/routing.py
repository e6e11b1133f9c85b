"""How writes to a topic find their partition, in words (DESCRIBE TOPIC, EXPLAIN).

Storage does the routing (``storage.topic_log``, docs/autopartitioning.md); this
only describes it. Imports storage only, so the views and the write path may both
use it without an import circle.
"""

from __future__ import annotations

from storage.topic_log import TopicLog


def routing_text(topic: TopicLog) -> str:
    """One line: key-hash ranges on autopartitioning topics, else the round-robin binding."""
    auto = topic.autopartitioning
    if not auto.ranged:
        return (
            "a producer id (else message group id) is bound round-robin to an active "
            "partition on first use; partition = n writes there"
        )
    ranges = " ".join(f"p{p}=[{r.low:016x}..{r.high - 1:016x}]" for p, r in topic.routing())
    return (
        f"key hash (BLAKE2b-64 of the producer id, else message group id; "
        f"strategy {auto.strategy}): {ranges}; messages without a key round-robin"
    )
