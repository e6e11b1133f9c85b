"""Every limit of Topicbase, in one place, each with its reason.

This module imports nothing of the project. Going over a limit raises
``LimitExceededError`` (SQLSTATE 54000) where it is checked; nothing waits or
grows without bound.
"""

from __future__ import annotations

# -- messages and batches -------------------------------------------------------------
# YDB caps a message at 120 MB after compression; a single-node Python store
# keeps it smaller so that one batch stays comfortably in memory.
MESSAGE_BYTES_MAX = 16 * 1024 * 1024
# One appended batch (its encoded body) must fit in memory twice (build + write).
BATCH_BYTES_MAX = 64 * 1024 * 1024
BATCH_MESSAGES_MAX = 100_000
# Producer ids and message group ids: YDB allows up to 2,048 bytes.
PRODUCER_ID_BYTES_MAX = 2048
METADATA_ITEMS_MAX = 64

# -- segments and indexes -------------------------------------------------------------
SEGMENT_BYTES_DEFAULT = 64 * 1024 * 1024
SEGMENT_BYTES_MIN = 1024
SEGMENT_MS_DEFAULT = 7 * 24 * 3600 * 1000
# One offset-index entry per this many log bytes (Kafka's index.interval.bytes).
INDEX_INTERVAL_BYTES = 4096
# The writer asks the kernel to start writing a segment back to disk every this
# many bytes (``FileSystem.start_writeback``), so sealing a full segment finds
# little left to sync.
WRITEBACK_INTERVAL_BYTES = 4 * 1024 * 1024

# -- reads --------------------------------------------------------------------------
READ_BYTES_MAX = 256 * 1024 * 1024
READ_MESSAGES_MAX = 1_000_000
WAIT_MS_MAX = 5 * 60 * 1000

# -- topics, partitions, files --------------------------------------------------------
PARTITIONS_PER_TOPIC_MAX = 1000
TOPICS_MAX = 10_000
OPEN_FILES_MAX = 4096

# -- producers ----------------------------------------------------------------------
PRODUCER_EXPIRY_MS_DEFAULT = 14 * 24 * 3600 * 1000
PRODUCERS_PER_PARTITION_MAX = 1_000_000

# -- durability -----------------------------------------------------------------------
# Group commit: the leader may wait this long for followers before it syncs. The
# default is 0: appends that arrive while a sync runs already share the next one,
# and an idle store then pays no extra latency.
GROUP_COMMIT_WINDOW_US_DEFAULT = 0
GROUP_COMMIT_WINDOW_US_MAX = 10_000

# -- transactions -------------------------------------------------------------------
# Topic writes a transaction may stage before COMMIT (they are held in memory too).
TRANSACTION_STAGED_BYTES_MAX = 256 * 1024 * 1024
# A transaction open longer than this is rolled back at its next statement.
TRANSACTION_DURATION_MS_MAX = 10 * 60 * 1000
# Explicit transactions open at once in one database.
OPEN_TRANSACTIONS_MAX = 1000
