"""Staged frames whose messages the client compressed with zstd (codec 4; the Spark
writer's ``frameCodec=zstd``, round 17): accepted only by a topic that accepts zstd, each
message decompressed once by the server before anything is staged
(``storage.zstd_messages``), published as sent and read back decoded. Every byte is
hostile until checked: a refused frame fails the COPY and nothing of it stays staged.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import psycopg
import pyarrow as pa
import pytest
import zstandard

from sql.pgwire.server import ServerThread
from storage import limits
from tests.pgwire.test_copy_frames import HostileCases, frame, send, staged_files, wire
from tests.pgwire.test_copy_staged import Connect, topic_rows

PLAIN = [b"a" * 1000, b"", b"hello", bytes(range(256)) * 3]


def _zstd(payloads: list[bytes], *, content_size: bool = True) -> list[bytes]:
    compressor = zstandard.ZstdCompressor(level=1, write_content_size=content_size)
    return [compressor.compress(p) for p in payloads]


def zstd_wire(messages: list[bytes]) -> pa.RecordBatch:
    """A wire batch of ``messages`` (already compressed) marked zstd (codec 4)."""
    batch = wire(messages)
    return batch.set_column(4, "codec", pa.array([4] * len(messages), pa.uint8()))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileCases]:
    """One server for the hostile zstd frames (``test_copy_frames.HostileCases``)."""
    cases = HostileCases(tmp_path_factory.mktemp("hostile_zstd_frames"))
    yield cases
    cases.close()


@pytest.fixture
def db(connect: Connect) -> psycopg.Connection:
    connection = connect(autocommit=True)
    connection.execute("CREATE TOPIC zevents WITH (min_active_partitions = 2)")  # raw,gzip,zstd
    connection.execute("CREATE TOPIC events WITH (min_active_partitions = 2, "
                       "supported_codecs = 'raw')")  # fmt: skip
    return connection


def test_zstd_frames_are_staged_as_sent_and_read_back_decoded(
        db: psycopg.Connection, server: ServerThread) -> None:  # fmt: skip
    stream = (frame(0, zstd_wire(_zstd(PLAIN[:2]))) + frame(1, zstd_wire(_zstd(PLAIN[2:])))
              + frame(0, wire([b"raw too"])))  # fmt: skip
    assert send(db, "z-1", stream, topic="zevents") == 5
    (path,) = [p for p in staged_files(server, "z-1") if p.endswith(".frames")]
    with open(path, "rb") as handle:
        assert handle.read() == stream  # as received: compressed, not re-encoded
    assert db.execute("COMMIT WRITES ('z-1') SINK 's' BATCH 0").fetchone() == ("committed", 5)
    assert [(p, o, bytes(d)) for p, o, d in topic_rows(db, "zevents")] == [
        (0, 0, PLAIN[0]), (0, 1, PLAIN[1]), (0, 2, b"raw too"), (1, 0, PLAIN[2]),
        (1, 1, PLAIN[3])]  # fmt: skip
    codecs = db.execute('SELECT codec FROM TOPIC zevents ORDER BY partition, "offset"')
    assert [c for (c,) in codecs.fetchall()] == ["zstd", "zstd", "raw", "zstd", "zstd"]


def _lying_size(message: bytes, size: int) -> bytes:
    """``message`` (a single-segment frame with a 4-byte content size field, as zstd
    writes for sizes of 65,792 bytes and more) declaring ``size``."""
    assert message[4] >> 6 == 2 and message[4] & 0x20
    return message[:5] + struct.pack("<I", size) + message[9:]


def _corrupt(message: bytes) -> bytes:
    """``message`` (a single-segment frame with a 2-byte content size) whose first block
    says it is of the reserved block type (3): undecodable. (A flipped byte of a block's
    contents may still decode, to other bytes: content corruption is the frame's CRC-32C's
    to catch, decodability the server's.)"""
    assert message[4] >> 6 == 1 and message[4] & 0x20
    return message[:7] + bytes([message[7] | 0b110]) + message[8:]


BIG_PLAIN = bytes(range(256)) * 300  # 76,800 bytes: a 4-byte content size
BIG = _zstd([BIG_PLAIN])[0]


@pytest.mark.parametrize(("messages", "sqlstate"), [
    ([b"\xff" * 64], "22P03"),  # not a zstd frame
    ([b"(\xb5/"], "22P03"),  # too short to hold a frame header
    (_zstd([b"x" * 500], content_size=False), "22P03"),  # no declared size
    ([_lying_size(BIG, 76_801)], "22P03"),  # decompresses to less than it declares
    ([_corrupt(_zstd([bytes(range(256)) * 40])[0])], "22P03"),
    ([_zstd([b"ok"])[0], BIG[:-7]], "22P03"),  # the second one cut short
    ([_lying_size(BIG, 1 << 30)], "54000"),  # over MESSAGE_BYTES_MAX: nothing allocated
], ids=["not-zstd", "too-short", "no-content-size", "size-lie", "corrupt", "truncated",
        "declared-too-large"])  # fmt: skip
def test_a_hostile_zstd_frame_fails_the_copy_and_stages_nothing(
        hostile: HostileCases, messages: list[bytes], sqlstate: str) -> None:  # fmt: skip
    with hostile.case() as (db, topic):  # raw, gzip and zstd accepted
        assert send(db, topic, frame(0, zstd_wire(_zstd([b"kept"]))), topic) == 1
        with pytest.raises(psycopg.Error) as raised:
            send(db, topic, frame(1, wire([b"before"])) + frame(0, zstd_wire(messages)), topic)
        assert raised.value.sqlstate == sqlstate, raised.value
        hostile.check_refused(db, topic)


def test_the_declared_sizes_of_a_frame_are_bounded_before_any_is_decompressed(
        db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A frame of several messages declares at most the frame target plus one message
    (a raw frame of several holds at most the target: review R1 round 17, F3)."""
    monkeypatch.setattr(limits, "FRAME_TARGET_BYTES", 70_000)  # two BIGs: 153,600 > 146,800
    with pytest.raises(psycopg.errors.ProgramLimitExceeded):
        send(db, "b-1", frame(0, zstd_wire([BIG, BIG])), topic="zevents")
    assert send(db, "b-2", frame(0, zstd_wire([BIG])), topic="zevents") == 1
    assert send(db, "b-3", frame(0, zstd_wire([BIG, *_zstd([b"x" * 60_000])])),
                topic="zevents") == 2  # fmt: skip


def test_a_small_frame_declaring_much_is_refused_before_it_is_decompressed(
        db: psycopg.Connection, server: ServerThread) -> None:  # fmt: skip
    """4 x 16 MiB of zeros compress to a frame of ~2 KB: refused (54000) at the default
    limits, nothing decompressed (review R1 round 17, F3)."""
    bomb = zstandard.ZstdCompressor(level=19).compress(bytes(limits.MESSAGE_BYTES_MAX))
    with pytest.raises(psycopg.errors.ProgramLimitExceeded):
        send(db, "bomb", frame(0, zstd_wire([bomb] * 4)), topic="zevents")
    assert not [p for p in staged_files(server, "bomb") if p.endswith((".frames", ".part"))]


EMPTY = bytes.fromhex("28b52ffd2000010000")  # header (size 0), one empty last raw block
EMPTY_CHECKED = bytes.fromhex("28b52ffd240001000099e9d851")  # and XXH64's low 4 bytes


@pytest.mark.parametrize("message", [EMPTY + b"\xde\xad" * 1000, EMPTY_CHECKED[:-1] + b"\0",
                                     EMPTY[:-3] + b"\x01\x00\x01" + b"z",
                                     bytes.fromhex("28b52ffd2107000100 00".replace(" ", ""))],
                         ids=["junk after", "bad checksum", "a block of 1",
                              "a dictionary id"])  # fmt: skip
def test_a_message_declaring_no_content_must_be_one_empty_frame(
        db: psycopg.Connection, message: bytes) -> None:  # fmt: skip
    """python-zstandard reads nothing past such a message's header, other decoders do: a
    size-0 message with anything else in it is refused (review R1 round 17, F4)."""
    with pytest.raises(psycopg.errors.InvalidBinaryRepresentation):  # 22P03
        send(db, "z-0", frame(0, zstd_wire([message])), topic="zevents")
    assert send(db, "z-1", frame(0, zstd_wire([EMPTY, EMPTY_CHECKED])), topic="zevents") == 2


def test_a_topic_that_takes_only_zstd_commits_zstd_frames_and_refuses_raw_ones(
        connect: Connect) -> None:  # fmt: skip
    """Raw frames into a topic without raw are refused when staged, as the commit would
    refuse them; zstd frames commit (review R2 round 17, R2-17-2: they were staged, then
    refused at COMMIT WRITES as 'codec raw is not supported')."""
    db = connect(autocommit=True)
    db.execute("CREATE TOPIC zonly WITH (supported_codecs = 'zstd')")
    with pytest.raises(psycopg.errors.InvalidParameterValue):  # 22023
        send(db, "r-1", frame(0, wire([b"raw"])), topic="zonly")
    assert send(db, "r-2", frame(0, zstd_wire(_zstd([b"hello", b"world"]))), topic="zonly") == 2
    assert db.execute("COMMIT WRITES ('r-2') SINK 'r' BATCH 0").fetchone() == ("committed", 2)
    assert [bytes(d) for _, _, d in topic_rows(db, "zonly")] == [b"hello", b"world"]


@pytest.mark.parametrize("codecs", [[4, 4], [1, 4], [2, 2]], ids=["zstd", "mixed", "gzip"])
def test_compressed_frames_need_a_topic_that_accepts_zstd_and_one_codec_a_frame(
        db: psycopg.Connection, server: ServerThread, codecs: list[int]) -> None:  # fmt: skip
    batch = wire(_zstd([b"p", b"q"])).set_column(4, "codec", pa.array(codecs, pa.uint8()))
    topic = "events" if codecs == [4, 4] else "zevents"  # raw only / the default codecs
    with pytest.raises(psycopg.Error) as raised:
        send(db, "c-1", frame(0, batch), topic=topic)
    assert raised.value.sqlstate == "22P04", raised.value
    assert not [p for p in staged_files(server, "c-1") if p.endswith((".frames", ".part"))]


def test_empty_zstd_messages_are_checked_and_read_without_the_c_call(
        db: psycopg.Connection) -> None:  # fmt: skip
    """Messages that decompress to nothing stay out of ``multi_decompress_to_buffer``
    (python-zstandard 0.25 corrupts its heap on them: the server process aborted on a
    frame whose first message was empty); the check and the read take them as b""."""
    stream = (frame(0, zstd_wire(_zstd([b""]))) + frame(0, zstd_wire(_zstd([b"", BIG_PLAIN])))
              + frame(1, zstd_wire(_zstd([b"", b""]))))  # fmt: skip
    assert send(db, "e-1", stream, topic="zevents") == 5
    assert db.execute("COMMIT WRITES ('e-1') SINK 'e' BATCH 0").fetchone() == ("committed", 5)
    assert [bytes(d) for _, _, d in topic_rows(db, "zevents")] == [b"", b"", BIG_PLAIN, b"", b""]
