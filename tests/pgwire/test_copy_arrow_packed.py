"""``COPY ... TO STDOUT (FORMAT arrow, COMPRESSION zstd)``: a range read sends each whole
frame stored column-compressed (``storage.column_codec``) as it is stored, its record batch
declaring Arrow IPC body compression ZSTD (``engine.packed_read``); the reader decodes it.
Only a client that asks gets such batches: without the option, and on the general query
path, every batch is plain. What a reader decodes is, column for column, what the plain
COPY gives (pyarrow's own decompression and full validation)."""

from __future__ import annotations

import struct
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from sql.pgwire.server import ServerThread
from storage.column_codec import DATA_VALUES
from storage.wire_columns import read_u32, table_fields
from tests.pgwire.test_copy import copy_out
from tests.pgwire.test_copy_frames import frame, send, wire
from tests.pgwire.test_copy_frames_column import column_frame, json_lines

COLUMNS = ("partition", "offset", "seq_no", "producer_id", "message_group_id", "created_at",
           "written_at", "codec", "data", "metadata")  # fmt: skip


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A server whose topic ``events`` holds, in partition 0, a column-compressed frame
    of 6 JSON lines, a plain frame of one message, a column-compressed frame of 5; in
    partition 1 one compressed frame of 40 messages. Yields (server, the staged frames'
    compressed data payloads, the messages by partition)."""
    server = ServerThread(str(Path(tmp_path_factory.mktemp("packed")) / "data"), "127.0.0.1", 0)
    with _connect(server) as db:
        db.execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
        first, plain, last = json_lines(6, 1), [b"plain"], json_lines(5, 2)
        many = json_lines(40, 3)
        pieces = [column_frame(0, first), frame(0, wire(plain)), column_frame(0, last),
                  column_frame(1, many)]  # fmt: skip
        assert send(db, "w-1", b"".join(pieces)) == 52
        assert db.execute("COMMIT WRITES ('w-1') SINK 's' BATCH 0").fetchone() == ("committed", 52)
    payloads = [_data_payload(pieces[i][24:]) for i in (0, 2, 3)]
    yield server, payloads, {0: first + plain + last, 1: many}
    server.stop()


def _connect(server: ServerThread) -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                           dbname="topicbase", autocommit=True)  # fmt: skip


def _data_payload(body: bytes) -> bytes:
    """A compressed body's data values as stored (length prefix and zstd frame)."""
    message = pa.ipc.read_message(pa.py_buffer(body))
    raw = message.metadata.to_pybytes()
    batch = _batch_table(raw)
    spans_at = batch[2] + read_u32(raw, batch[2]) + 4
    offset, size = struct.unpack_from("<qq", raw, spans_at + 16 * DATA_VALUES)
    return message.body.to_pybytes()[offset : offset + size]


def _batch_table(raw: bytes) -> list[int]:
    """The RecordBatch table's field positions of a message's metadata (no prefix)."""
    fields = table_fields(raw, read_u32(raw, 0)) + [0] * 5
    return table_fields(raw, fields[2] + read_u32(raw, fields[2])) + [0] * 5


def _compressed_batches(stream: bytes) -> list[bool]:
    """Per record batch of an Arrow IPC stream: whether it declares body compression."""
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(stream))
    found = []
    for message in reader:
        if message.type == "record batch":
            found.append(bool(_batch_table(message.metadata.to_pybytes())[3]))
    return found


def _copy(db: psycopg.Connection, columns: str, partition: int, start: int, end: int,
          options: str = "") -> bytes:  # fmt: skip
    return copy_out(db, f"COPY (SELECT {columns} FROM TOPIC events WHERE partition = "
                        f'{partition} AND "offset" >= {start} AND "offset" < {end}) TO STDOUT '
                        f"(FORMAT arrow{options})")  # fmt: skip


@pytest.mark.parametrize("columns", ["*", "data", "partition, data", '"offset", codec, data',
                                     "metadata, producer_id, seq_no, written_at, created_at, "
                                     "message_group_id, data"])  # fmt: skip
def test_whole_compressed_frames_go_out_as_stored_and_read_back_as_the_plain_copy(
        served, columns: str) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    server, payloads, messages = served
    with _connect(server) as db:
        for partition, end in ((0, 12), (1, 40)):
            plain = _copy(db, columns, partition, 0, end)
            packed = _copy(db, columns, partition, 0, end, ", COMPRESSION zstd")
            expected = pa.ipc.open_stream(plain).read_all()
            got = pa.ipc.open_stream(packed).read_all()
            got.validate(full=True)
            assert got.equals(expected)  # schema and every value
            if partition == 0:
                assert _compressed_batches(packed) == [True, False, True]
            else:
                assert _compressed_batches(packed) == [True]
            assert _compressed_batches(plain) == [False] * len(_compressed_batches(plain))
            if "data" in columns or columns == "*":
                assert [bytes(d) for d in got.column("data").to_pylist()] == messages[partition]
                for payload in payloads[:2] if partition == 0 else payloads[2:]:
                    assert payload in packed  # the stored zstd frame, not re-encoded
                    assert payload not in plain


def test_a_frame_cut_by_the_range_and_the_general_query_path_go_out_plain(served) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    server, _, messages = served
    with _connect(server) as db:
        packed = _copy(db, "data", 0, 2, 9, ", COMPRESSION zstd")  # both compressed frames cut
        assert not any(_compressed_batches(packed))
        got = pa.ipc.open_stream(packed).read_all()
        assert [bytes(d) for d in got.column("data").to_pylist()] == messages[0][2:9]
        general = copy_out(db, 'COPY (SELECT data FROM TOPIC events WHERE partition = 1 ORDER BY '
                               '"offset") TO STDOUT (FORMAT arrow, COMPRESSION zstd)')  # fmt: skip
        assert not any(_compressed_batches(general))
        got = pa.ipc.open_stream(general).read_all()
        assert [bytes(d) for d in got.column("data").to_pylist()] == messages[1]


def test_the_server_announces_the_option_and_refuses_other_uses(served) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    server, _, _ = served
    with _connect(server) as db:
        assert db.info.parameter_status("topicbase_copy_compression") == "zstd"
        for options, sqlstate in ((", COMPRESSION lz4", "22023"), (", COMPRESSION ''", "22023"),
                                  (", COMPRESSION zstd, COMPRESSION zstd", "42601")):  # fmt: skip
            with pytest.raises(psycopg.Error) as error:
                _copy(db, "data", 0, 0, 12, options)
            assert error.value.sqlstate == sqlstate, (options, error.value)
        with pytest.raises(psycopg.Error) as error:
            copy_out(db, "COPY (SELECT 1) TO STDOUT (FORMAT csv, COMPRESSION zstd)")
        assert error.value.sqlstate == "42601"
        statement = "COPY TOPIC events FROM STDIN (FORMAT arrow, COMPRESSION zstd)"
        with pytest.raises(psycopg.Error) as error, db.cursor().copy(statement):
            pass
        assert error.value.sqlstate == "22023"
