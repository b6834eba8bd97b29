"""Wire protocol codecs, tested on bytes (common/format/protocol.py)."""

from __future__ import annotations

import msgpack
import pytest

from common.core.errors import ResponseCode
from common.core.message import encode_msg_id, encode_properties, host_bytes
from common.format import record
from common.format.protocol import (
    PROTOCOL_VERSION,
    Limits,
    ProtocolError,
    RequestCode,
    decode_record,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)

pytestmark = pytest.mark.unit

LIMITS = Limits(max_frame_bytes=64 * 1024, max_body_bytes=4096, max_batch_count=16)


def raw_request(fields: object, code: int = RequestCode.SEND, opaque: int = 7) -> bytes:
    return msgpack.packb([PROTOCOL_VERSION, code, opaque, fields])


def send_fields(**extra: object) -> dict[str, object]:
    return {"topic": "orders", "queueId": 1, **extra}


def test_send_round_trip_keeps_body_bytes() -> None:
    body = bytes(range(256))
    frames = encode_request(RequestCode.SEND, 42, send_fields(tags="A", keys="k1 k2"), [body])
    req = decode_request(frames, LIMITS)
    assert req.code == RequestCode.SEND
    assert req.opaque == 42
    assert req.fields["topic"] == "orders" and req.fields["tags"] == "A"
    assert req.fields["flag"] == 0 and req.fields["delayLevel"] == 0  # defaults filled in
    assert req.bodies == [body]


def test_batch_with_meta_round_trip() -> None:
    meta = [["t", "k", {"a": "b"}, 3], None]
    frames = encode_request(RequestCode.SEND_BATCH, 1, send_fields(meta=meta), [b"x", b"y"])
    req = decode_request(frames, LIMITS)
    assert req.fields["meta"] == [("t", "k", {"a": "b"}, 3, 0), (None, None, {}, 0, 0)]
    assert req.bodies == [b"x", b"y"]


def test_batch_meta_count_must_match_bodies() -> None:
    frames = encode_request(RequestCode.SEND_BATCH, 1, send_fields(meta=[None]), [b"x", b"y"])
    with pytest.raises(ProtocolError) as e:
        decode_request(frames, LIMITS)
    assert e.value.field == "meta" and e.value.opaque == 1


def test_response_round_trip() -> None:
    frames = encode_response(ResponseCode.FLUSH_SLAVE_TIMEOUT, 9, "slow slave", {"a": 1}, [b"r"])
    resp = decode_response(frames, LIMITS)
    assert resp.code == ResponseCode.FLUSH_SLAVE_TIMEOUT
    assert (resp.opaque, resp.remark, resp.fields, resp.bodies) == (
        9,
        "slow slave",
        {"a": 1},
        [b"r"],
    )
    assert not resp.ok


@pytest.mark.parametrize(
    ("fields", "field", "reason"),
    [
        ({"queueId": 1}, "topic", "required"),
        (send_fields(queueId="1"), "queueId", "expected int"),
        (send_fields(queueId=-1), "queueId", "outside"),
        (send_fields(queueId=1 << 40), "queueId", "outside"),
        (send_fields(queueId=True), "queueId", "expected int"),
        ({"topic": "../etc", "queueId": 0}, "topic", "may only hold"),
        ({"topic": "x" * 200, "queueId": 0}, "topic", "bytes"),
        (send_fields(tags=5), "tags", "expected str"),
        (send_fields(properties={"a": "b\x01c"}), "properties", "may not hold"),
        (send_fields(tags="t\x02REAL_TOPIC\x01victim"), "tags", "may not hold"),
        (send_fields(keys="k\x01"), "keys", "may not hold"),
        (send_fields(bogus=1), "bogus", "unknown field"),
    ],
)
def test_bad_fields_name_the_field(fields: dict[str, object], field: str, reason: str) -> None:
    with pytest.raises(ProtocolError) as e:
        decode_request([raw_request(fields), b"body"], LIMITS)
    assert e.value.field == field
    assert reason in e.value.reason
    assert e.value.code == ResponseCode.BAD_REQUEST
    assert e.value.opaque == 7  # the opaque was readable, so the answer can be matched


@pytest.mark.parametrize(("meta", "field"), [
    ([["t\x02__POP\x01ck", None, None, 0], None], "meta[0].tags"),
    ([None, [None, "k\x02REAL_QID\x01-1", {}, 0]], "meta[1].keys"),
])
def test_a_batch_entry_with_a_separator_is_refused(meta: list[object], field: str) -> None:
    frames = [raw_request(send_fields(meta=meta), code=RequestCode.SEND_BATCH), b"a", b"b"]
    with pytest.raises(ProtocolError) as e:
        decode_request(frames, LIMITS)
    assert (e.value.field, e.value.code) == (field, ResponseCode.BAD_REQUEST)
    assert "may not hold \\x01 or \\x02" in e.value.reason


def test_a_send_back_origin_id_is_bound_for_a_record() -> None:
    fields = {"group": "g", "offset": 0, "originTopic": "t", "originMsgId": "m\x02REAL_QID\x01-1"}
    with pytest.raises(ProtocolError) as e:
        decode_request([raw_request(fields, code=RequestCode.CONSUMER_SEND_MSG_BACK)], LIMITS)
    assert e.value.field == "originMsgId" and "may not hold" in e.value.reason


def test_encode_properties_refuses_a_separator_as_the_last_line() -> None:
    assert encode_properties({"TAGS": "a", "KEYS": "k"}) == b"TAGS\x01a\x02KEYS\x01k\x02"
    for props in ({"TAGS": "t\x02REAL_TOPIC\x01victim"}, {"a\x01b": "c"}, {"KEYS": "\x01"}):
        with pytest.raises(ValueError, match="\\\\x01 or \\\\x02"):
            encode_properties(props)


def test_non_utf8_topic_names_the_field() -> None:
    header = msgpack.packb([PROTOCOL_VERSION, RequestCode.SEND, 1, {"topic": "T", "queueId": 0}])
    bad = header.replace(b"\xa1T", b"\xa1\xff")
    with pytest.raises(ProtocolError) as e:
        decode_request([bad, b"b"], LIMITS)
    assert e.value.field == "topic" and "UTF-8" in e.value.reason


def test_unknown_code_and_version() -> None:
    with pytest.raises(ProtocolError) as e:
        decode_request([raw_request({}, code=9999)], LIMITS)
    assert e.value.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and e.value.opaque == 7
    header = msgpack.packb([99, RequestCode.STATUS, 3, {}])
    with pytest.raises(ProtocolError) as e:
        decode_request([header], LIMITS)
    assert e.value.code == ResponseCode.VERSION_NOT_SUPPORTED


def test_body_over_limit_is_message_illegal() -> None:
    frames = encode_request(RequestCode.SEND, 1, send_fields(), [b"x" * 4097])
    with pytest.raises(ProtocolError) as e:
        decode_request(frames, LIMITS)
    assert e.value.code == ResponseCode.MESSAGE_ILLEGAL and e.value.field == "bodies[0]"


def test_too_many_frames_and_bytes() -> None:
    frames = encode_request(RequestCode.SEND_BATCH, 1, send_fields(), [b"x"] * 17)
    with pytest.raises(ProtocolError) as e:
        decode_request(frames, LIMITS)
    assert e.value.field == "frames"
    frames = encode_request(RequestCode.SEND_BATCH, 1, send_fields(), [b"x" * 4095] * 16)
    with pytest.raises(ProtocolError, match="bytes, at most"):
        decode_request(frames, LIMITS)


def test_wrong_body_count_for_code() -> None:
    with pytest.raises(ProtocolError) as e:
        decode_request(encode_request(RequestCode.SEND, 1, send_fields(), []), LIMITS)
    assert e.value.field == "bodies"
    with pytest.raises(ProtocolError):
        decode_request(encode_request(RequestCode.STATUS, 1, {}, [b"extra"]), LIMITS)


def test_deep_nesting_and_trailing_bytes() -> None:
    with pytest.raises(ProtocolError, match="nest"):
        decode_request([b"\x91" * 10_000 + b"\x00"], LIMITS)
    with pytest.raises(ProtocolError, match="nest"):
        decode_request([raw_request(send_fields(tags=[[[["x"]]]]))], LIMITS)
    with pytest.raises(ProtocolError, match="trailing"):
        decode_request([raw_request({}) + b"\x00"], LIMITS)


def test_claimed_huge_length_without_data() -> None:
    for prefix in (b"\xdb", b"\xdd", b"\xdf", b"\xc6"):
        with pytest.raises(ProtocolError) as e:
            decode_request([prefix + b"\xff\xff\xff\xff"], LIMITS)
        assert e.value.field == "header"


def test_empty_message_and_empty_header() -> None:
    with pytest.raises(ProtocolError):
        decode_request([], LIMITS)
    with pytest.raises(ProtocolError):
        decode_request([b""], LIMITS)


def test_pull_and_query_schemas() -> None:
    fields = {"topic": "t", "queueId": 0, "queueOffset": 5, "suspendMs": 100}
    req = decode_request(encode_request(RequestCode.PULL, 3, fields), LIMITS)
    assert req.fields["maxNums"] == 32 and req.fields["suspendMs"] == 100
    with pytest.raises(ProtocolError) as e:
        decode_request(encode_request(RequestCode.PULL, 3, {**fields, "maxNums": 0}), LIMITS)
    assert e.value.field == "maxNums"
    with pytest.raises(ProtocolError) as e:
        decode_request(encode_request(RequestCode.QUERY_BY_MSG_ID, 3, {"msgId": "ab"}), LIMITS)
    assert e.value.field == "msgId"


def test_record_decode_and_crc_checks() -> None:
    props = encode_properties({"TAGS": "A", "KEYS": "k"}) + record.PROP_CRC_PLACEHOLDER
    raw = record.encode(b"orders", b"hello", props, 2, 9, 1234, born_timestamp=1,
                        born_ip=host_bytes("10.0.0.1"), born_port=5, store_timestamp=2,
                        store_ip=host_bytes("127.0.0.1"), store_port=10911)
    record.seal(raw, 0, len(raw))  # as the store writes it
    got = decode_record(bytes(raw))
    assert (got.topic, got.body, got.tags, got.keys) == ("orders", b"hello", "A", "k")
    assert got.properties == {"TAGS": "A", "KEYS": "k"}  # the record CRC is not a property
    assert got.commit_log_offset == 1234 and got.store_size == len(raw)
    assert got.msg_id == encode_msg_id(host_bytes("127.0.0.1"), 10911, 1234)
    corrupt = bytearray(raw)
    corrupt[90] ^= 0xFF  # inside the body: the body CRC catches it
    with pytest.raises(ProtocolError, match="CRC"):
        decode_record(bytes(corrupt))
    corrupt = bytearray(raw)
    corrupt[21] ^= 0x01  # the queue offset: only the whole-record CRC covers it
    with pytest.raises(ProtocolError, match="CRC"):
        decode_record(bytes(corrupt))


def test_packed_batch_is_cut_at_sizes() -> None:
    meta = [["t", None, None, 0], None, None]
    fields = send_fields(meta=meta, sizes=[1, 0, 3])
    req = decode_request(encode_request(RequestCode.SEND_BATCH, 5, fields, [b"xabc"]), LIMITS)
    assert req.bodies == [b"x", b"", b"abc"]
    assert "sizes" not in req.fields and len(req.fields["meta"]) == 3


@pytest.mark.parametrize(
    ("sizes", "bodies", "field", "code"),
    [
        ([1, 2], [b"xab", b"c"], "bodies", ResponseCode.BAD_REQUEST),  # two frames with sizes
        ([1, 2], [b"xa"], "sizes", ResponseCode.BAD_REQUEST),  # sizes add up to more
        ([1, 1], [b"xab"], "sizes", ResponseCode.BAD_REQUEST),  # ...or to less
        ([1, -1], [b"x"], "sizes", ResponseCode.BAD_REQUEST),
        ([1, "2"], [b"xab"], "sizes", ResponseCode.BAD_REQUEST),
        ([], [b""], "sizes", ResponseCode.BAD_REQUEST),
        ([0] * 17, [b""], "sizes", ResponseCode.BAD_REQUEST),  # over max_batch_count
        ([1, 4097], [b"x" * 4098], "bodies[1]", ResponseCode.MESSAGE_ILLEGAL),
    ],
)
def test_packed_batch_bad_sizes(
    sizes: list[object], bodies: list[bytes], field: str, code: ResponseCode
) -> None:
    frames = encode_request(RequestCode.SEND_BATCH, 6, send_fields(sizes=sizes), bodies)
    with pytest.raises(ProtocolError) as e:
        decode_request(frames, LIMITS)
    assert (e.value.field, e.value.code, e.value.opaque) == (field, code, 6)


def test_packed_batch_meta_count_must_match_sizes() -> None:
    frames = encode_request(
        RequestCode.SEND_BATCH, 1, send_fields(meta=[None], sizes=[1, 1]), [b"xy"]
    )
    with pytest.raises(ProtocolError) as e:
        decode_request(frames, LIMITS)
    assert e.value.field == "meta"
