"""Kill-test worker for the staging log's pre-written files (``test_staging_prewrite.py``).

``python staging_prewrite_worker.py DIRECTORY ACKS``: appends commit records (each after
one small batch frame) to a staging log with a 8 KiB pre-written window and 32 KiB
files, transaction ids 1, 2, ... in order, one at a time; after each record's sync it
appends the id to ACKS (one ``os.write`` on an ``O_APPEND`` descriptor) and prints it
with the zero writes made so far (``StagingLog.prewrites``).
Runs until killed, crashed by a failpoint (``TOPICBASE_FAILPOINTS``) or 20,000 records.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from storage import commit_log
from storage.fs import FileSystem
from storage.record_batch import build_wire_batch
from storage.staging import StagingLog, encode_batches

RECORDS_MAX = 20_000


def main() -> int:
    directory, acks_path = sys.argv[1], sys.argv[2]
    acks = os.open(acks_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    staging = StagingLog(FileSystem(), directory, file_bytes_max=32 * 1024)
    staging._prewrite_bytes = 8 * 1024
    for transaction_id in range(1, RECORDS_MAX + 1):
        size = 50 + (transaction_id * 7919) % 1500
        parts, lengths = encode_batches(transaction_id, [build_wire_batch([b"m" * size])])
        record = commit_log.encode_record(transaction_id, 1, str(transaction_id).encode() * 9)
        staging.wait_durable(staging.append(transaction_id, parts, lengths, record))
        os.write(acks, f"{transaction_id}\n".encode())
        print(transaction_id, staging.prewrites, flush=True)
    staging.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
