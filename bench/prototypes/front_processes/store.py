"""The store process of the front-process prototype (docs/durable_produce.md, round 28).

``python bench/prototypes/front_processes/store.py DATA_DIR SOCKET PARTITIONS [PORT]``
(with ``PORT``: also one front, ``front.py``'s loop, on a thread of this process: the
same work under one GIL, to tell the processes' share of a gain from the lean path's)

Opens the database in ``DATA_DIR``, creates topic ``t`` (``PARTITIONS`` active
partitions, as the bench's), listens on the Unix socket ``SOCKET`` (mode 0600, in a 0700
directory: only this user's processes may hand it messages) and serves the front
processes that connect on one thread (``Loop``). A front sends batches and waits for
each batch's ack; the loop takes every batch that arrived, from all the fronts, and
appends their values together through the server's own path for plain autocommit
INSERTs (``engine.spread_append.append_plain``: the ``PlainCombiner``, then
``TopicLog.append_keyless`` with the partition's group commit and ``fdatasync``), and
acked only after that append returned, i.e. after the sync.

Wire between a front and the store (little-endian):

- batch: ``u32 length`` (of what follows), ``u32 batch id``, ``u32 count``, then
  ``count`` times ``u32 size`` + the message's bytes;
- ack: ``u32 batch id``, ``u32 written``, ``u8 status`` (0 ok; 1 error, then ``5 bytes
  SQLSTATE``, ``u16 size`` + the UTF-8 message).

stdin: ``stats`` prints one JSON line (``fsyncs``, ``messages``, ``appends``), ``count``
the messages read back from the topic (``stored``); ``stop``
or end of input stops. The first line printed is ``ready``.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import struct
import sys
import threading
import time

from engine import spread_append
from engine.database import Database
from storage import limits
from storage.errors import TopicbaseError

HEADER = struct.Struct("<II")  # length, batch id
SIZE = struct.Struct("<I")
ACK = struct.Struct("<IIB")


class Store:
    """The database and the counters of the batches appended."""

    def __init__(self, directory: str, partitions: int) -> None:
        self.database = Database.open(directory)
        session = self.database.connect()
        session.execute(f"CREATE TOPIC t WITH (min_active_partitions = {partitions})")
        session.close()
        self.topic_id = self.database.catalog.entry("t").topic_id
        self.messages = 0
        self._lock = threading.Lock()

    def append(self, values: list[bytes]) -> int:
        """Append the batch's values (chunks of ``COMBINE_MESSAGES_MAX``, each one
        ``append_plain`` call) and return how many were written."""
        written = 0
        step = limits.COMBINE_MESSAGES_MAX
        for start in range(0, len(values), step):
            rows = [(value,) for value in values[start : start + step]]
            done = spread_append.append_plain(self.database, self.topic_id, ("data",), rows)
            assert done is not None, "plain bytes into a synced topic: the plain way takes them"
            written += done
        with self._lock:
            self.messages += len(values)
        return written


def read_exactly(connection: socket.socket, size: int) -> bytes | None:
    """``size`` bytes, or None at the end of the stream."""
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        n = connection.recv_into(view[got:])
        if n == 0:
            return None
        got += n
    return bytes(buffer)


class Loop:
    """One thread, one ``selectors`` loop over the fronts' connections: each turn reads
    what every readable front sent, takes every whole batch in, appends all their values
    together (``Store.append``: one frame, one sync) and acks each batch. While it
    appends, the fronts' next batches wait in their sockets, so the batches of N fronts
    share the next append's sync, as one server's sessions share a combined round, with
    no hand-off between threads. Invariant: a batch is acked after the append that
    carried its values returned; an error fails exactly the batches of that append."""

    def __init__(self, store: Store, listener: socket.socket) -> None:
        self.store = store
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, None)
        self.appends = 0

    def forever(self) -> None:
        while True:
            taken: list[tuple[socket.socket, int, list[bytes]]] = []
            for key, _ in self.selector.select():
                if key.data is None:
                    try:
                        connection, _ = self.listener.accept()
                    except OSError:
                        return
                    self.selector.register(connection, selectors.EVENT_READ, bytearray())
                    continue
                connection, buffer = key.fileobj, key.data
                assert isinstance(connection, socket.socket)
                data = connection.recv(1 << 20)
                if not data:
                    self.selector.unregister(connection)
                    connection.close()
                    continue
                buffer += data
                take_batches(connection, buffer, taken)
            if taken:
                self.append(taken)

    def append(self, taken: list[tuple[socket.socket, int, list[bytes]]]) -> None:
        values = [value for _, _, batch in taken for value in batch]
        try:
            self.store.append(values)
            self.appends += 1
            answers = [ACK.pack(batch_id, len(batch), 0) for _, batch_id, batch in taken]
        except TopicbaseError as error:
            text = str(error).encode()[:60000]
            tail = error.sqlstate.encode() + struct.pack("<H", len(text)) + text
            answers = [ACK.pack(batch_id, 0, 1) + tail for _, batch_id, _ in taken]
        for (connection, _, _), answer in zip(taken, answers, strict=True):
            with contextlib.suppress(OSError):  # a front gone: its clients' connections too
                connection.sendall(answer)


def take_batches(connection: socket.socket, buffer: bytearray,
                 taken: list[tuple[socket.socket, int, list[bytes]]]) -> None:  # fmt: skip
    """Move every whole batch at the head of ``buffer`` into ``taken``."""
    while len(buffer) >= HEADER.size:
        length, batch_id = HEADER.unpack_from(buffer, 0)
        if len(buffer) < HEADER.size + length:
            return
        body = bytes(buffer[HEADER.size : HEADER.size + length])
        del buffer[: HEADER.size + length]
        (count,) = SIZE.unpack_from(body, 0)
        values, at = [], 4
        for _ in range(count):
            (size,) = SIZE.unpack_from(body, at)
            values.append(body[at + 4 : at + 4 + size])
            at += 4 + size
        taken.append((connection, batch_id, values))


def main(argv: list[str]) -> int:
    directory, path, partitions = argv[0], argv[1], int(argv[2])
    store = Store(directory, partitions)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(16)

    loop = Loop(store, listener)
    threading.Thread(target=loop.forever, daemon=True).start()
    if len(argv) > 3:  # a front on a thread of this process (one GIL), for the A/B
        import front

        arguments = [path, "reuseport", argv[3]]
        threading.Thread(target=front.main, args=(arguments, False), daemon=True).start()
        time.sleep(0.5)  # its listener bound
    print("ready", flush=True)
    try:
        for line in sys.stdin:
            command = line.strip()
            if command == "stats":
                fs = store.database.store.fs
                counters = {"fsyncs": fs.fsync_count, "messages": store.messages,
                            "appends": loop.appends}  # fmt: skip
                print(json.dumps(counters), flush=True)
            elif command == "count":  # the messages the topic holds, read back
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
