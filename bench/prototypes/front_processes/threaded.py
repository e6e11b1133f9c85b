"""The lean INSERT path on a thread per connection, in the store's process (round 28).

``python threaded.py DATA_DIR PORT PARTITIONS``: the side ``threads:1`` of ``drive.py``.
Not a front process: what round 28's figures point at instead. The same protocol subset
as ``front.py`` (its ``Front.work`` and ``handle``), but each client connection is served
by a thread of its own doing blocking reads, as ``topicbase serve``'s are, and an
Execute's value goes straight to the server's own path for a plain autocommit INSERT
(``engine.spread_append.append_plain``: combined with other connections' values by the
``PlainCombiner`` while the topic is busy, group commit, ``fdatasync``); the answer is
sent after it returned. No session, plan or door per statement: the CPU of the lean path
with as many runnable threads as connections, to tell the CPU share a loaded machine gives
one loop thread from the CPU the path costs.

stdin as ``store.py``'s: ``stats`` (``fsyncs``), ``count`` (``stored``), ``stop``.
"""

from __future__ import annotations

import json
import socket
import sys
import threading

import front
from store import Store

from engine import spread_append
from storage.errors import TopicbaseError


class ThreadFront(front.Front):
    """``front.Front``'s protocol for one connection, its Execute appended at once."""

    def __init__(self, store: Store) -> None:  # no selector, no store connection
        self.store_ = store
        self.pending = []
        self.closed = False

    def ship(self) -> None:
        for client, value in self.pending:
            try:
                done = spread_append.append_plain(
                    self.store_.database, self.store_.topic_id, ("data",), [(value,)]
                )
                assert done is not None, "plain bytes into a synced topic"
                client.out.append(front.INSERTED)
            except TopicbaseError as error:
                client.out.append(front.error_message(error.sqlstate, str(error)))
                client.failed = True
            client.held = False
        self.pending = []

    def close_client(self, client: front.Client) -> None:
        self.closed = True
        client.sock.close()
        client.inbuf.clear()


def serve(store: Store, sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client, loop = front.Client(sock), ThreadFront(store)
    while not loop.closed:
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            loop.close_client(client)
            return
        client.inbuf += data
        loop.work(client)


def main(argv: list[str]) -> int:
    directory, port, partitions = argv[0], int(argv[1]), int(argv[2])
    store = Store(directory, partitions)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)

    def accept_forever() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(store, sock), daemon=True).start()

    threading.Thread(target=accept_forever, daemon=True).start()
    print("ready", flush=True)
    try:
        for line in sys.stdin:
            command = line.strip()
            if command == "stats":
                print(json.dumps({"fsyncs": store.database.store.fs.fsync_count}), flush=True)
            elif command == "count":
                session = store.database.connect()
                table = session.execute("SELECT count(*) AS n FROM TOPIC t")[-1].table
                session.close()
                assert table is not None
                print(json.dumps({"stored": table.column(0)[0].as_py()}), flush=True)
            elif command == "stop":
                break
    finally:
        listener.close()
        store.database.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
