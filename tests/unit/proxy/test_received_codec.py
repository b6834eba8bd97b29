"""A POP answer's records as gRPC messages (``convert.received``): made in C from the records'
bytes (``common/proxy/_received.c``) where built, against the Python path (``decode_record``,
then ``incoming``) as the reference, on random records: the same parsed messages, and a record
either path refuses refused by both."""

from __future__ import annotations

import random
import zlib
from typing import Any

import pytest
from rocketmq.grpc_protocol import service_pb2 as rpc

from common.core.errors import BrokerError, ResponseCode
from common.core.message import (
    PROPERTY_KEYS,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_COMPRESSED,
)
from common.format import record
from common.format.protocol import Response
from common.proxy import convert

pytestmark = pytest.mark.unit

native = pytest.importorskip("common.proxy._received",
                             reason="the C extension is not built (setup.py build_ext)")

WORDS = ["a", "paid", "k1", "é", "日本", "x y", "", "-", "🙂", "\x03"]


def word(rng: random.Random) -> str:
    return "".join(rng.choice(WORDS) for _ in range(rng.randrange(0, 4)))


def props_of(rng: random.Random) -> bytes:
    names = [PROPERTY_UNIQ_KEY, PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_SHARDING_KEY, "color",
             "REAL_TOPIC", "WAIT", "size", "", "k\x01v"]
    items = []
    for _ in range(rng.randrange(0, 8)):
        name = rng.choice(names)
        if name == PROPERTY_KEYS:
            value = " ".join(word(rng) for _ in range(rng.randrange(0, 4)))
        else:
            value = word(rng)
        items.append(f"{name}\x01{value}")
    if rng.random() < 0.1:
        items.append("no separator here")
    text = "\x02".join(items) + ("\x02" if items and rng.random() < 0.8 else "")
    return text.encode()


def random_record(rng: random.Random, crc_entry: bool) -> bytes:
    body = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 16, 128, 300])))
    props = props_of(rng)
    if crc_entry:
        props += record.PROP_CRC_PLACEHOLDER
    raw = record.encode(
        rng.choice(["orders", "t", "%RETRY%g_t", "日本"]).encode(), body, props,
        queue_id=rng.choice([0, 3, 7, -1, 2**31 - 1]),
        queue_offset=rng.choice([0, 1, 41, 2**40, -5]),
        phy_offset=rng.choice([0, 9000, 2**33 + 17]),
        born_timestamp=rng.choice([0, 1, 999, 1_700_000_000_123, -1, -1001]),
        born_ip=bytes(rng.randrange(256) for _ in range(4)), born_port=rng.randrange(65536),
        store_timestamp=rng.choice([0, 1_700_000_001_456, 5]),
        store_ip=bytes(rng.randrange(256) for _ in range(4)),
        store_port=rng.choice([10911, 0, -3]),
        reconsume_times=rng.randrange(5))
    if crc_entry:
        record.seal(raw, 0, len(raw))
    return bytes(raw)


def answer(bodies: list[bytes], handles: list[Any] | None = None,
           times: list[Any] | None = None) -> Response:
    handles = [f"rp1 b t 0 {i} {i} 1 2" for i in range(len(bodies))] if handles is None \
        else handles
    times = [i % 4 for i in range(len(bodies))] if times is None else times
    return Response(ResponseCode.SUCCESS, 1, "", {"handles": handles, "reconsumeTimes": times},
                    bodies)


def python_path(resp: Response, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    with monkeypatch.context() as m:
        m.setattr(convert, "_native", None)
        return convert.received(resp)


@pytest.mark.parametrize("crc_entry", [False, True])
def test_random_records_become_the_messages_the_python_path_makes(
        crc_entry: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(41 + crc_entry)
    bodies = [random_record(rng, crc_entry) for _ in range(400)]
    resp = answer(bodies, times=[rng.randrange(20) for _ in bodies])
    made = native.encode_received(list(bodies), resp.fields["handles"],
                                  resp.fields["reconsumeTimes"])
    assert all(m is not None for m in made)  # none left to Python: the C path is what ran
    fast = convert.received(resp)
    slow = python_path(resp, monkeypatch)
    assert len(fast) == len(slow) == 400
    for i, (a, b) in enumerate(zip(fast, slow, strict=True)):
        assert a == b, (i, a, b)
        assert a.message.system_properties.HasField("queue_offset")  # presence as upb has it


def test_a_message_without_a_producer_id_gets_its_msg_id(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = bytes(record.encode(b"t", b"body", b"TAGS\x01x\x02", 1, 5, 0x1234,
                              store_ip=b"\x0a\x00\x00\x09", store_port=10911))
    [got] = convert.received(answer([raw]))
    sp = got.message.system_properties
    assert sp.message_id == "0A00000900002A9F0000000000001234"
    assert sp.tag == "x" and not sp.HasField("message_group")
    assert sp.body_digest.checksum == format(zlib.crc32(b"body"), "08X")
    assert got == python_path(answer([raw]), monkeypatch)[0]


def test_what_c_leaves_is_made_by_the_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compressed body, properties that are not UTF-8, a handle with a lone surrogate, an
    attempt count past int32: None from C, and the message as the Python path makes it (the
    count refused there)."""
    body = b"x" * 500
    compressed = bytes(record.encode(b"t", zlib.compress(body), b"", 0, 1, 2,
                                     sys_flag=SYSFLAG_COMPRESSED))
    latin = bytes(record.encode(b"t", b"b", b"color\x01caf\xe9\x02", 0, 1, 2))
    plain = bytes(record.encode(b"t", b"b", b"", 0, 1, 2))
    bodies = [compressed, latin, plain, plain]
    handles = ["h0", "h1", "h\udc80", "h3"]
    times = [0, 1, 2, 2**40]
    assert native.encode_received(bodies, handles, times) == [None] * 4
    with pytest.raises(BrokerError, match="count 1099511627776"):
        convert.received(answer(bodies, ["h0", "h1", "h2", "h3"], times))
    times[3] = 2
    got = convert.received(answer(bodies, ["h0", "h1", "h2", "h3"], times))
    assert got[0].message.body == body
    assert got[1].message.user_properties["color"] == "caf\ufffd"
    assert got == python_path(answer(bodies, ["h0", "h1", "h2", "h3"], times), monkeypatch)


@pytest.mark.parametrize("damage", ["magic", "size", "body", "crc_entry", "topic_utf8"])
def test_a_damaged_record_is_refused_as_the_python_path_refuses_it(
        damage: str, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = bytearray(record.encode(b"orders", b"payload", b"a\x01b\x02" +
                                  record.PROP_CRC_PLACEHOLDER, 0, 1, 2))
    record.seal(raw, 0, len(raw))
    if damage == "magic":
        raw[4] ^= 1
    elif damage == "size":
        raw = raw[:-1]
    elif damage == "body":
        raw[88] ^= 1
    elif damage == "crc_entry":
        raw[20] ^= 1  # the queue offset: only the whole-record CRC sees it
    else:
        raw = bytearray(record.encode(b"\xff\xfe", b"payload", b"", 0, 1, 2))
    assert native.encode_received([bytes(raw)], ["h"], [0]) == [None]
    with pytest.raises(BrokerError, match="corrupt record"):
        convert.received(answer([bytes(raw)]))
    with pytest.raises(BrokerError, match="corrupt record"):
        python_path(answer([bytes(raw)]), monkeypatch)


def test_an_answer_whose_parts_do_not_line_up_is_refused() -> None:
    raw = bytes(record.encode(b"t", b"b", b"", 0, 1, 2))
    with pytest.raises(BrokerError, match="do not line up"):
        convert.received(answer([raw, raw], ["h"], [0, 0]))


def test_bad_arguments_raise_and_configure_checks_its_names() -> None:
    with pytest.raises(TypeError):
        native.encode_received((), [], [])
    with pytest.raises(ValueError):
        native.encode_received([b""], [], [])
    with pytest.raises(TypeError):
        native.configure("UNIQ", b"TAGS", b"KEYS", b"G", ())
    with pytest.raises(TypeError):
        native.configure(b"UNIQ", b"TAGS", b"KEYS", b"G", ("x",))


def test_received_parses_as_the_response_the_client_reads() -> None:
    raw = bytes(record.encode(b"orders", b"hello", f"{PROPERTY_SHARDING_KEY}\x01g1\x02"
                              f"{PROPERTY_KEYS}\x01a  b\x02color\x01red\x02".encode(), 2, 7, 99))
    [got] = convert.received(answer([raw], ["rp1 b orders 2 7 99 1 2"], [3]))
    again = rpc.ReceiveMessageResponse.FromString(got.SerializeToString())
    sp = again.message.system_properties
    assert again.message.topic.name == "orders" and again.message.body == b"hello"
    assert dict(again.message.user_properties) == {"color": "red"}
    assert list(sp.keys) == ["a", "b"] and sp.message_group == "g1"
    assert (sp.queue_id, sp.queue_offset, sp.delivery_attempt) == (2, 7, 4)
    assert sp.receipt_handle == "rp1 b orders 2 7 99 1 2"
    assert sp.message_type == 2  # FIFO: it has a message group


def test_a_compressed_body_that_does_not_inflate_is_left_out_not_the_answer() -> None:
    """Its producer flagged it COMPRESSED (anyone may): the record is whole, the other
    messages of the answer are handed on; a damaged record still fails the answer."""
    good = bytearray(record.encode(b"orders", b"payload", record.PROP_CRC_PLACEHOLDER, 0, 1, 2))
    record.seal(good, 0, len(good))
    bad = bytearray(record.encode(b"orders", b"not zlib", record.PROP_CRC_PLACEHOLDER, 0, 1, 2,
                                  sys_flag=SYSFLAG_COMPRESSED))
    record.seal(bad, 0, len(bad))
    out = convert.received(answer([bytes(bad), bytes(good)], ["h1", "h2"]))
    assert [r.message.system_properties.receipt_handle for r in out] == ["h2"]
