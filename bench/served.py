"""``python -m bench.served DATA_DIR``: a Topicbase wire server in its own process, for benchmarks.

Like ``topicbase serve --auth trust`` on a free loopback port (``ServerThread``), but
it answers on stdin: a line ``stats`` prints one JSON line of the database's
counters (``fsyncs``: ``store.fs.fsync_count``, ``directory_fsyncs``), a line
``stop`` (or end of input) stops it. The first line it prints is ``port N``.
Benchmarks use it to count the server's fsyncs around a timed phase while the
clients run in another process (no shared GIL).
"""

from __future__ import annotations

import json
import sys

from sql.pgwire.server import ServerThread


def main(argv: list[str]) -> int:
    assert len(argv) == 1, "usage: python -m bench.served DATA_DIR"
    server = ServerThread(argv[0], "127.0.0.1", 0)
    try:
        print(f"port {server.port}", flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "stats":
                fs = server.database.store.fs
                counters = {"fsyncs": fs.fsync_count, "directory_fsyncs": fs.directory_fsync_count}
                print(json.dumps(counters), flush=True)
            elif command == "stop":
                break
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
