"""A wire connection holds a bounded number of named prepared statements and portals, and
a bounded number of characters of their texts (``limits.PREPARED_*``, ``PORTALS_*``): a
client Parsing distinct named statements forever gets 54000, not the server's memory."""

from __future__ import annotations

import struct

from sql.pgwire.codec import messages as m
from storage import limits
from tests.pgwire.rawclient import RawClient, errors

SYNC = m.message(b"S")


def parse(name: str, text: str) -> bytes:
    return m.message(b"P", m.cstr(name) + m.cstr(text) + struct.pack("!h", 0))


def bind(portal: str, statement: str) -> bytes:
    return m.message(b"B", m.cstr(portal) + m.cstr(statement) + struct.pack("!hhh", 0, 0, 0))


def sent(client: RawClient, data: bytes) -> list[dict[str, str]]:
    client.send(data + SYNC)
    return errors(client.until_ready())


def test_named_statements_past_the_count_are_refused(server, monkeypatch) -> None:
    monkeypatch.setattr(limits, "PREPARED_STATEMENTS_PER_CONNECTION_MAX", 20)
    client = RawClient(server.port)
    client.start(user="u", database="topicbase")
    assert sent(client, b"".join(parse(f"s{n}", f"SELECT {n}") for n in range(20))) == []
    (refused,) = sent(client, parse("s20", "SELECT 20"))
    assert refused["C"] == "54000" and "prepared statements" in refused["M"]
    assert sent(client, m.message(b"C", b"S" + m.cstr("s0")) + parse("s20", "SELECT 20")) == []
    client.close()


def test_named_statements_past_the_text_bound_are_refused(server, monkeypatch) -> None:
    monkeypatch.setattr(limits, "PREPARED_TEXT_CHARS_PER_CONNECTION_MAX", 64 * 1024)
    client = RawClient(server.port)
    client.start(user="u", database="topicbase")
    wide = "SELECT " + ",".join(["1"] * 4000)  # ~8 kB
    assert sent(client, b"".join(parse(f"w{n}", f"{wide},{n}") for n in range(8))) == []
    (refused,) = sent(client, parse("w8", f"{wide},8"))
    assert refused["C"] == "54000" and "characters" in refused["M"]
    assert sent(client, parse("", f"{wide},9")) == []  # the unnamed one is always room
    client.close()


def test_named_portals_past_the_count_are_refused(server, monkeypatch) -> None:
    monkeypatch.setattr(limits, "PORTALS_PER_CONNECTION_MAX", 5)
    client = RawClient(server.port)
    client.start(user="u", database="topicbase")
    begin = m.message(b"Q", m.cstr("BEGIN"))
    client.send(begin)
    client.until_ready()
    portals = b"".join(bind(f"p{n}", "s") for n in range(5))
    assert sent(client, parse("s", "SELECT 1") + portals) == []
    (refused,) = sent(client, bind("p5", "s"))
    assert refused["C"] == "54000" and "portals" in refused["M"]
    client.close()
