"""Many wire clients' one-message ``INSERT INTO TOPIC`` statements combined into one
append while the topic is busy (``engine.spread_append.PlainCombiner``), from real
clients: psycopg (Bind/Execute of a prepared statement) and psql (literal text through
the simple query protocol), at once. Each statement is acknowledged ``INSERT 0 1`` and
every message is stored exactly once; combined rounds happened."""

from __future__ import annotations

import collections
import subprocess
import threading

import psycopg

from engine import spread_append
from sql.pgwire.server import ServerThread

CLIENTS = 12
STATEMENTS = 25
ROUNDS_MAX = 40  # attempts until combined rounds were seen (a bound, not a timing)


def _stored(server: ServerThread) -> collections.Counter[bytes]:
    database = server.database
    topic = database.topic_log(database.catalog.entry("t").topic_id)
    counts: collections.Counter[bytes] = collections.Counter()
    for partition in topic.partition_ids():
        offset = 0
        while True:
            read = topic.read(partition, offset, max_messages=5000)
            if not read.batches:
                break
            for batch in read.batches:
                counts.update(batch.column("data").to_pylist())
            offset = read.next_offset
    return counts


def _rounds(server: ServerThread) -> int:
    database = server.database
    combiner = spread_append._COMBINERS.get(
        database.topic_log(database.catalog.entry("t").topic_id))  # fmt: skip
    return 0 if combiner is None else combiner.rounds


def test_psycopg_and_psql_clients_at_once(server: ServerThread) -> None:
    def connect() -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                               autocommit=True, connect_timeout=10)  # fmt: skip

    with connect() as admin:
        admin.execute("CREATE TOPIC t WITH (min_active_partitions = 4)")
    clients = [connect() for _ in range(CLIENTS)]
    sent: list[bytes] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def produce(index: int, attempt: int) -> None:
        try:
            for j in range(STATEMENTS):
                value = b"%d.%d.%d" % (attempt, index, j)
                cursor = clients[index].execute("INSERT INTO TOPIC t (data) VALUES (%s)",
                                                [value])  # fmt: skip
                assert cursor.statusmessage == "INSERT 0 1"
                with lock:
                    sent.append(value)
        except BaseException as error:  # reported below
            errors.append(error)

    def psql(attempt: int) -> subprocess.CompletedProcess[str]:
        script = "".join(f"INSERT INTO TOPIC t (data) VALUES ('psql.{attempt}.{j}');\n"
                         for j in range(STATEMENTS))  # fmt: skip
        return subprocess.run(
            ["psql", "-X", "-h", "127.0.0.1", "-p", str(server.port), "-U", "tester", "-d",
             "topicbase", "-v", "ON_ERROR_STOP=1", "-c", script],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    try:
        for attempt in range(ROUNDS_MAX):
            threads = [threading.Thread(target=produce, args=(i, attempt)) for i in range(CLIENTS)]
            for thread in threads:
                thread.start()
            done = psql(attempt)
            for thread in threads:
                thread.join(120)
                assert not thread.is_alive()
            assert errors == []
            assert done.returncode == 0, done.stderr
            assert done.stdout.split() == ["INSERT", "0", "1"] * STATEMENTS, done.stdout
            sent += [f"psql.{attempt}.{j}".encode() for j in range(STATEMENTS)]
            if _rounds(server) > 0 and attempt >= 1:
                break
    finally:
        for client in clients:
            client.close()
    assert _rounds(server) > 0
    stored = _stored(server)
    assert sorted(stored) == sorted(sent)
    assert set(stored.values()) == {1}
