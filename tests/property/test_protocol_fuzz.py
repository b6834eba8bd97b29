"""Malformed client frames (docs/drills.md row 9), against the pure decoder.

Every frame list either decodes to a valid Request or raises ProtocolError naming a field; no
other exception escapes and nothing is allocated from a claimed length. Hypothesis generates
well over 2 000 bad frames (four strategies x 600 examples); ``fixed_corpus()`` holds the nasty
cases the plan lists by name. ``tests/integration/test_broker_fuzz.py`` replays both against a
live broker.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.core.errors import ResponseCode
from common.format.protocol import (
    PROTOCOL_VERSION,
    SCHEMAS,
    Limits,
    ProtocolError,
    Request,
    RequestCode,
    decode_request,
    encode_request,
)

pytestmark = pytest.mark.property

LIMITS = Limits(max_frame_bytes=256 * 1024, max_body_bytes=64 * 1024, max_batch_count=64)
EXAMPLES = 600
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

VALID_SEND = encode_request(RequestCode.SEND, 5, {"topic": "fuzz", "queueId": 0}, [b"body"])


def _header(code: int, fields: object, opaque: object = 1) -> bytes:
    return msgpack.packb([PROTOCOL_VERSION, code, opaque, fields])


_VALID_VALUES = {
    "topic": "t",
    "queueId": 0,
    "queueOffset": 0,
    "group": "g",
    "key": "k",
    "msgId": "0" * 32,
    "phyOffset": 0,
    "queueNums": 4,
    "timestamp": 0,
    "clientId": "c",
    "offset": 0,
    "originTopic": "t",
    "fromOffset": 0,
    "toOffset": 0,
    "recallHandle": "djEgdCBiIDEgaw",
    "producerGroup": "pg",
    "commitLogOffset": 0,
    "commitOrRollback": 8,
    "invisibleTime": 30_000,
    "receiptHandle": "rp1 b t 0 0 0 0 30000",
    "groupName": "g",
}


def _valid_fields(code: RequestCode) -> dict[str, object]:
    """The required fields of ``code`` with valid values."""
    return {n: _VALID_VALUES[n] for n, spec in SCHEMAS[code].items() if spec.required}


def _bodies(code: RequestCode) -> list[bytes]:
    return [b"b"] if code in (RequestCode.SEND, RequestCode.SEND_BATCH,
                              RequestCode.CHECK_TRANSACTION_STATE,
                              RequestCode.BATCH_ACK_MESSAGE) else []


def test_valid_base_requests_are_accepted() -> None:
    """The corpus's wrong-field cases differ from a valid request in one field only."""
    for code in SCHEMAS:
        decode_request([_header(code, _valid_fields(code)), *_bodies(code)], LIMITS)


# the request fields whose strings go into a stored record (a batch's meta aside)
RECORD_STRINGS = {(RequestCode.SEND, "tags"), (RequestCode.SEND, "keys"),
                  (RequestCode.CONSUMER_SEND_MSG_BACK, "originMsgId")}


def test_the_strings_bound_for_a_record_are_the_text_fields() -> None:
    assert RECORD_STRINGS == {(code, name) for code, schema in SCHEMAS.items()
                              for name, spec in schema.items() if spec.kind in ("text", "keys")}


def fixed_corpus(limits: Limits = LIMITS) -> list[tuple[str, list[bytes]]]:
    """The named nasty frames of docs/drills.md row 9, as (label, frames)."""
    corpus: list[tuple[str, list[bytes]]] = [("empty message", []), ("empty header", [b""])]
    header = VALID_SEND[0]
    corpus += [(f"truncated at {i}", [header[:i], b"body"]) for i in range(1, len(header))]
    corpus.append(("trailing bytes", [header + b"\x00\x01", b"body"]))
    corpus.append(("nesting 10000 deep", [b"\x91" * 10_000 + b"\xc0"]))
    corpus.append(("map nesting 10000 deep", [b"\x81\xa1a" * 10_000 + b"\xc0"]))
    corpus.append(("body over the limit", [header, b"x" * (limits.max_body_bytes + 1)]))
    for prefix, what in (
        (b"\xdb", "str32"),
        (b"\xc6", "bin32"),
        (b"\xdd", "array32"),
        (b"\xdf", "map32"),
        (b"\xc9", "ext32"),
    ):
        corpus.append((f"{what} claims 2^32-1 bytes", [prefix + b"\xff\xff\xff\xff"]))
    corpus.append(("unknown command", [_header(4242, {})]))
    corpus.append(("negative code", [_header(-1, {})]))
    corpus.append(("negative opaque", [_header(RequestCode.STATUS, {}, opaque=-5)]))
    corpus.append(("huge opaque", [_header(RequestCode.STATUS, {}, opaque=(1 << 64) - 1)]))
    for qid in (-1, -(1 << 63), 1 << 31, (1 << 64) - 1):
        corpus.append(
            (f"queue id {qid}", [_header(RequestCode.SEND, {"topic": "t", "queueId": qid}), b"b"])
        )
    bad_topic = _header(RequestCode.SEND, {"topic": "T", "queueId": 0}).replace(
        b"\xa1T", b"\xa1\xff"
    )
    corpus.append(("non-UTF-8 topic", [bad_topic, b"b"]))
    corpus.append(
        ("topic as bytes", [_header(RequestCode.SEND, {"topic": b"t", "queueId": 0}), b"b"])
    )
    for code, schema in SCHEMAS.items():
        for name, spec in schema.items():
            for wrong in (1.5, [], {}, "x" * 5000, -(1 << 63), True):
                if spec.kind == "props" and wrong == {}:
                    continue  # an empty properties map is valid
                fields = {**_valid_fields(code), name: wrong}
                corpus.append(
                    (f"{code.name}.{name}={wrong!r:.12}", [_header(code, fields), *_bodies(code)])
                )
    # a property separator in a string bound for a record: it would add properties of its own
    for code, name in sorted(RECORD_STRINGS):
        for text in ("t\x02REAL_TOPIC\x01victim", "\x01", "a\x02"):
            fields = {**_valid_fields(code), name: text}
            corpus.append((f"{code.name}.{name}={text!r}",
                           [_header(code, fields), *_bodies(code)]))
    for item in ("tags", "keys"):
        entry = ["t\x02REAL_TOPIC\x01v", None, None, 0] if item == "tags" else \
            [None, "k\x01", None, 0]
        fields = {**_valid_fields(RequestCode.SEND_BATCH), "meta": [None, entry]}
        corpus.append((f"SEND_BATCH.meta[1].{item} with a separator",
                       [_header(RequestCode.SEND_BATCH, fields), b"a", b"b"]))
    # an index key of the broker's own (a broker-only property's name and a value): it would
    # stand among the hits of the broker's look-ups (was this delivered, committed)
    for keys in ("__TIMER_SRC4096", "a __TRAN_HALF0", "TIMER_OUT_MS"):
        fields = {**_valid_fields(RequestCode.SEND), "keys": keys}
        corpus.append((f"SEND.keys={keys!r}", [_header(RequestCode.SEND, fields), b"b"]))
    fields = {**_valid_fields(RequestCode.SEND),
              "properties": {"UNIQ_CLIENT_MESSAGE_ID_KEYIDX": "__SCHED_SRC7"}}
    corpus.append(("SEND.properties UNIQ_KEY a broker-only name",
                   [_header(RequestCode.SEND, fields), b"b"]))
    fields = {**_valid_fields(RequestCode.SEND_BATCH), "meta": [None, [None, "__POP1", None, 0]]}
    corpus.append(("SEND_BATCH.meta[1].keys a broker-only name",
                   [_header(RequestCode.SEND_BATCH, fields), b"a", b"b"]))
    corpus.append(("header not an array", [msgpack.packb({"a": 1})]))
    corpus.append(("header too short", [msgpack.packb([PROTOCOL_VERSION, 10])]))
    corpus.append(("fields not a map", [_header(RequestCode.STATUS, [1, 2])]))
    corpus.append(("int map key", [_header(RequestCode.STATUS, {1: 2})]))
    corpus.append(
        (
            "ext timestamp",
            [msgpack.packb([PROTOCOL_VERSION, 28, 1, {}])[:-1] + b"\xd6\xff\x00\x00\x00\x01"],
        )
    )
    corpus.append(("too many frames", [VALID_SEND[0]] + [b"b"] * (limits.max_batch_count + 2)))
    return corpus


def check_outcome(frames: list[bytes]) -> Request | ProtocolError:
    try:
        return decode_request(frames, LIMITS)
    except ProtocolError as e:
        assert e.field and e.reason
        assert isinstance(e.code, ResponseCode)
        return e


@pytest.mark.parametrize(
    ("label", "frames"), fixed_corpus(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_fixed_corpus_is_refused(label: str, frames: list[bytes]) -> None:
    outcome = check_outcome(frames)
    assert isinstance(outcome, ProtocolError), f"{label} was accepted: {outcome}"


def test_truncated_header_named() -> None:
    header = VALID_SEND[0]
    for i in range(1, len(header)):
        with pytest.raises(ProtocolError) as e:
            decode_request([header[:i], b"body"], LIMITS)
        assert e.value.field == "header"


@FUZZ
@given(st.lists(st.binary(max_size=300), min_size=0, max_size=6))
def test_random_bytes(frames: list[bytes]) -> None:
    check_outcome(frames)


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=40)
    | st.binary(max_size=40)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)


@FUZZ
@given(
    st.sampled_from([int(c) for c in RequestCode] + [0, 999, -3]),
    st.dictionaries(
        st.sampled_from(sorted({n for s in SCHEMAS.values() for n in s}) + ["x"]),
        _VALUES,
        max_size=8,
    ),
    st.lists(st.binary(max_size=100), max_size=4),
)
def test_wrong_typed_fields(code: int, fields: dict[str, object], bodies: list[bytes]) -> None:
    outcome = check_outcome([_header(code, fields), *bodies])
    if isinstance(outcome, Request):  # only a schema-conforming request may pass
        schema = SCHEMAS[outcome.code]
        assert set(outcome.fields) <= set(schema)


@FUZZ
@given(_VALUES, st.lists(st.binary(max_size=50), max_size=3))
def test_arbitrary_msgpack_headers(header: object, bodies: list[bytes]) -> None:
    check_outcome([msgpack.packb(header), *bodies])


@FUZZ
@given(st.data())
def test_mutated_valid_frames(data: st.DataObject) -> None:
    header = bytearray(VALID_SEND[0])
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        pos = data.draw(st.integers(0, max(len(header) - 1, 0)))
        if op == "flip" and header:
            header[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "cut":
            del header[pos:]
        else:
            header[pos:pos] = data.draw(st.binary(min_size=1, max_size=5))
    check_outcome([bytes(header), b"body"])


def test_generated_case_count_meets_the_plan() -> None:
    assert 4 * EXAMPLES >= 2000
