"""The C request and answer checks (``common/format/_codec.c``) against the Python ones.

``protocol.decode_request`` and ``decode_response`` take a plain request or answer from the C
codec where it is built, and anything else from the Python path, the reference. What the C
codec answers must be exactly what the Python path answers (the same fields, in the same order,
with the same defaults); where the Python path refuses, the C codec must answer None, so the
refusal (and its field and reason) still comes from the reference. These tests hold the two to
that on headers made from every request code's schema, on near misses of each check, and on
arbitrary msgpack; and check that the usual requests and answers do take the C path.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.core.errors import ResponseCode
from common.format import boundary, protocol
from common.format.protocol import (
    MAX_GROUP_LENGTH,
    PROTOCOL_VERSION,
    SPECS,
    Limits,
    ProtocolError,
    RequestCode,
    encode_request,
    encode_response,
)

pytestmark = pytest.mark.unit

native: Any = protocol._native  # the codec protocol.py loaded (None: not built, or PURE_PYTHON_REPLOG)
if native is None:
    pytest.skip("the C codec is not in use here", allow_module_level=True)

LIMITS = Limits(max_frame_bytes=64 * 1024, max_body_bytes=4096, max_batch_count=16,
                max_topic_length=40)
CLIENT_LIMITS = LIMITS.for_responses()


def _python_request(frames: list[Any], limits: Limits = LIMITS) -> Any:
    try:
        return protocol._decode_request_py(frames, limits)
    except ProtocolError as e:
        return e


def _python_response(frames: list[Any], limits: Limits = CLIENT_LIMITS) -> Any:
    try:
        return protocol._decode_response_py(frames, limits)
    except ProtocolError as e:
        return e


def _outcome(decode: Any, frames: list[Any], limits: Limits) -> Any:
    """What a decode gives, comparable with ==: a refusal's parts, or the Request or Response
    with its fields packed (a NaN in them is not equal to itself)."""
    try:
        got = decode(frames, limits)
    except ProtocolError as e:
        return ("refused", e.field, str(e), e.code, e.opaque)
    return (type(got), *got[:-2], msgpack.packb(got.fields), *got[-1:]) \
        if type(got) is protocol.Response else got


def _check_left(out: Any, frames: list[Any], limits: Limits, decode: Any, reference: Any) -> None:
    """The codec left ``frames`` to the Python checks: the header it hands them (if it got that
    far) is the one msgpack makes, and the whole decode gives the reference's answer."""
    if out is not None:  # compared packed: a NaN in it is not equal to itself
        expected = msgpack.unpackb(frames[0], raw=False,
                                   **protocol._unpack_kwargs(limits.max_batch_count))
        assert msgpack.packb(out) == msgpack.packb(expected)
    assert _outcome(decode, frames, limits) == _outcome(reference, frames, limits)


def _same_request(frames: list[Any], limits: Limits = LIMITS) -> Any:
    """The C answer, checked against the reference; returns the Request it made, or None when
    it left the frames to the Python checks."""
    out = native.decode_request(frames, limits)
    ref = _python_request(frames, limits)
    if type(out) is protocol.Request:
        assert not isinstance(ref, ProtocolError), (frames, ref)
        assert out == ref
        assert list(out.fields) == list(ref.fields)  # the same order, defaults last
        assert type(out.bodies) is list
        return out
    _check_left(out, frames, limits, protocol.decode_request, protocol._decode_request_py)
    return None


def _same_response(frames: list[Any], limits: Limits = CLIENT_LIMITS) -> Any:
    out = native.decode_response(frames, limits)
    ref = _python_response(frames, limits)
    if type(out) is protocol.Response:
        assert not isinstance(ref, ProtocolError), (frames, ref)
        assert _outcome(lambda *_: out, frames, limits) == \
            _outcome(protocol._decode_response_py, frames, limits)
        return out
    _check_left(out, frames, limits, protocol.decode_response, protocol._decode_response_py)
    return None


def _plain(out: Any) -> bool:
    """Whether the codec decoded it itself (a Request or Response, not a header or None)."""
    return type(out) in (protocol.Request, protocol.Response)


# ---- values that pass each field kind's check --------------------------------------------------

_NAME_CHARS = st.sampled_from("abcXYZ019%|_-")


def _good_value(kind: str, lo: int, hi: int) -> st.SearchStrategy[Any]:
    if kind == "int":
        return st.integers(lo, hi)
    if kind == "str":
        return st.text(max_size=min(hi, 30)).filter(
            lambda s: lo <= len(s.encode("utf-8")) <= hi)
    if kind == "text":  # bound for a record: no property separator
        return st.text(st.characters(blacklist_characters="\x01\x02",
                                     blacklist_categories=("Cs",)), max_size=min(hi, 30)).filter(
            lambda s: lo <= len(s.encode("utf-8")) <= hi)
    if kind == "keys":  # index keys: none the start of a broker-only property's name
        return _good_value("text", lo, hi).filter(lambda s: boundary.keys_refusal(s) is None)
    if kind == "topic":
        return st.text(_NAME_CHARS, min_size=1, max_size=LIMITS.max_topic_length)
    if kind == "group":
        return st.text(_NAME_CHARS, min_size=1, max_size=MAX_GROUP_LENGTH)
    if kind == "props":
        text = st.text(st.characters(blacklist_characters="\x01\x02",
                                     blacklist_categories=("Cs",)), max_size=12)
        return st.dictionaries(text.filter(bool), text, max_size=4).filter(
            lambda d: boundary.uniq_key_refusal(d) is None)
    if kind == "sysflag":
        return st.sampled_from([0, 1, 4, 5])
    if kind == "role":
        return st.sampled_from(["SYNC_MASTER", "ASYNC_MASTER"])
    raise AssertionError(kind)


_PLAIN = {code: spec for code, spec in SPECS.items()
          if all(f.kind not in ("meta", "sizes") for f in spec.fields.values())}


@st.composite
def _plain_request(draw: st.DrawFn) -> list[bytes]:
    code = draw(st.sampled_from(sorted(_PLAIN)))
    spec = SPECS[code]
    fields: dict[str, Any] = {}
    names = list(spec.fields)
    for name in draw(st.permutations(names)):
        field = spec.fields[name]
        if field.required or draw(st.booleans()):
            fields[name] = draw(_good_value(field.kind, field.lo, field.hi))
        elif draw(st.integers(0, 5)) == 0:
            fields[name] = None  # an explicit nil: as if left out
    lo, hi = spec.bodies
    hi = LIMITS.max_batch_count if hi is None else hi
    bodies = draw(st.lists(st.binary(max_size=64), min_size=lo, max_size=min(hi, 3)))
    opaque = draw(st.integers(0, (1 << 63) - 1))
    return encode_request(code, opaque, fields, bodies)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_plain_request())
def test_every_plain_request_is_decoded_in_c_as_the_reference_does(frames: list[bytes]) -> None:
    assert _same_request(frames) is not None


_TEXT_FIELDS = sorted((int(code), name) for code, spec in _PLAIN.items()
                      for name, f in spec.fields.items() if f.kind in ("text", "keys"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(_TEXT_FIELDS), st.text(max_size=8), st.sampled_from("\x01\x02"),
       st.text(max_size=8))
def test_a_separator_in_a_string_bound_for_a_record_is_refused_by_both(
        data: st.DataObject, where: tuple[int, str], before: str, sep: str, after: str) -> None:
    """Tags, keys, a send-back's origin id: the C codec leaves them to the Python checks,
    which refuse them naming the field (the same answer either way)."""
    code, name = RequestCode(where[0]), where[1]
    spec = SPECS[code]
    fields = {n: data.draw(_good_value(f.kind, f.lo, f.hi))
              for n, f in spec.fields.items() if f.required}
    fields[name] = before + sep + after
    lo, _hi = spec.bodies
    frames = encode_request(code, 5, fields, [b"x"] * lo)
    if len(fields[name].encode()) > spec.fields[name].hi:
        return  # refused for its length first
    assert _same_request(frames) is None
    with pytest.raises(ProtocolError) as e:
        protocol.decode_request(frames, LIMITS)
    assert e.value.field == name and "\\x01 or \\x02" in e.value.reason


_KEYS_FIELDS = sorted((int(code), name) for code, spec in _PLAIN.items()
                      for name, f in spec.fields.items() if f.kind == "keys")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(_KEYS_FIELDS), st.sampled_from(
    sorted(boundary.BROKER_ONLY_PROPERTIES)), st.sampled_from(["", "a ", "a b "]),
    st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
            max_size=8))
def test_a_key_that_starts_with_a_broker_only_name_is_refused_by_both(
        data: st.DataObject, where: tuple[int, str], reserved: str, before: str,
        after: str) -> None:
    """A KEYS entry (any of the space-separated) starting with a broker-only property's name
    would be one of the broker's own index keys: the C codec leaves it to the Python checks,
    which refuse it naming the field."""
    code, name = RequestCode(where[0]), where[1]
    spec = SPECS[code]
    fields = {n: data.draw(_good_value(f.kind, f.lo, f.hi))
              for n, f in spec.fields.items() if f.required}
    fields[name] = before + reserved + after
    frames = encode_request(code, 5, fields, [b"x"] * spec.bodies[0])
    assert _same_request(frames) is None
    with pytest.raises(ProtocolError) as e:
        protocol.decode_request(frames, LIMITS)
    assert e.value.field == name and "broker-only" in e.value.reason


def _send(fields: dict[str, Any], bodies: list[Any] | None = None, version: Any = PROTOCOL_VERSION,
          opaque: Any = 9, code: Any = int(RequestCode.SEND)) -> list[Any]:
    base = {"topic": "orders", "queueId": 1}
    base.update(fields)
    return [msgpack.packb([version, code, opaque, base]), *(bodies if bodies is not None else [b"x"])]


NEAR_MISSES = {
    "topic with a final newline": _send({"topic": "orders\n"}),
    "topic with a dot": _send({"topic": "a.b"}),
    "topic too long": _send({"topic": "t" * 41}),
    "topic empty": _send({"topic": ""}),
    "topic not ASCII": _send({"topic": "ordér"}),
    "topic an int": _send({"topic": 5}),
    "topic nil (required)": _send({"topic": None}),
    "queueId a bool": _send({"queueId": True}),
    "queueId a float": _send({"queueId": 1.0}),
    "queueId negative": _send({"queueId": -1}),
    "queueId over the bound": _send({"queueId": 1 << 31}),
    "queueId a huge int": _send({"queueId": (1 << 64) - 1}),
    "flag at int32's low end": _send({"flag": -(1 << 31)}),
    "flag below int32": _send({"flag": -(1 << 31) - 1}),
    "tags over 255 bytes of UTF-8": _send({"tags": "é" * 128}),
    "tags at 255 bytes": _send({"tags": "é" * 127 + "a"}),
    "keys bytes": _send({"keys": b"k"}),
    "tags with \\x02": _send({"tags": "t\x02REAL_TOPIC\x01victim"}),
    "tags with \\x01 only": _send({"tags": "t\x01"}),
    "keys with \\x01": _send({"keys": "k\x01v"}),
    "keys with \\x02 past ASCII": _send({"keys": "é\x02"}),
    "keys the timer's delivery mark": _send({"keys": "__TIMER_SRC4096"}),
    "keys a transaction's origin, second": _send({"keys": "a __TRAN_HALF0"}),
    "keys a broker-only name past a key's start": _send({"keys": "a_TRAN_HALF0 x__SCHED_SRC1"}),
    "keys of the same hash as a mark": _send({"keys": "`@TIMER_SRC4096"}),
    "keys TIMER_OUT_MS": _send({"keys": "TIMER_OUT_MS5"}),
    "properties a UNIQ_KEY a broker-only name": _send({"properties": {
        "UNIQ_CLIENT_MESSAGE_ID_KEYIDX": "__SCHED_SRC77"}}),
    "properties a plain UNIQ_KEY": _send({"properties": {"UNIQ_CLIENT_MESSAGE_ID_KEYIDX": "U1"}}),
    "unknown field": _send({"nope": 1}),
    "properties with \\x01": _send({"properties": {"a\x01": "b"}}),
    "properties with \\x02 in a value": _send({"properties": {"a": "b\x02"}}),
    "properties empty name": _send({"properties": {"": "b"}}),
    "properties an int value": _send({"properties": {"a": 1}}),
    "properties nested": _send({"properties": {"a": {"b": "c"}}}),
    "properties at the size bound": _send({"properties": {"k": "v" * 32764}}),
    "properties over the size bound": _send({"properties": {"k": "v" * 32765}}),
    "sysFlag a broker bit": _send({"sysFlag": 8}),
    "sysFlag negative": _send({"sysFlag": -1}),
    "sysFlag a bool": _send({"sysFlag": True}),
    "delayLevel over 64": _send({"delayLevel": 65}),
    "version True": _send({}, version=True),
    "version 1.0": _send({}, version=1.0),
    "version 2": _send({}, version=2),
    "opaque negative": _send({}, opaque=-1),
    "opaque 2^63": _send({}, opaque=1 << 63),
    "opaque a bool": _send({}, opaque=False),
    "code unknown": _send({}, code=999),
    "code a string": _send({}, code="10"),
    "no body": _send({}, bodies=[]),
    "two bodies": _send({}, bodies=[b"a", b"b"]),
    "body at the bound": _send({}, bodies=[b"b" * 4096]),
    "body over the bound": _send({}, bodies=[b"b" * 4097]),
    "body a memoryview": _send({}, bodies=[memoryview(b"x")]),
    "header a map": [msgpack.packb({"a": 1}), b"x"],
    "header 5 long": [msgpack.packb([1, 10, 1, {}, 5]), b"x"],
    "fields a list": [msgpack.packb([1, 10, 1, []]), b"x"],
    "trailing bytes": [msgpack.packb([1, 10, 1, {"topic": "t", "queueId": 0}]) + b"\x00", b"x"],
    "not msgpack": [b"\xc1\xc1", b"x"],
    "empty header": [b"", b"x"],
    "bin key": [msgpack.packb([1, 10, 1, {b"topic": "t", "queueId": 0}]), b"x"],
    "frames over the total": _send({}, bodies=[b"b" * 4000] * 17),
    "a batch with sizes": [msgpack.packb([1, int(RequestCode.SEND_BATCH), 1,
                                          {"topic": "t", "queueId": 0, "sizes": [1, 1]}]), b"ab"],
    "role neither": [msgpack.packb([1, int(RequestCode.PROMOTE), 1, {"role": "SLAVE"}])],
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_a_near_miss_gets_the_reference_answer(case: str) -> None:
    frames = NEAR_MISSES[case]
    ours = _same_request(frames)
    ref = _python_request(frames)
    if isinstance(ref, ProtocolError):
        assert ours is None  # left to the Python checks (_same_request: their answer)
        with pytest.raises(ProtocolError) as info:  # the caller's path: the reference's error
            protocol.decode_request(frames, LIMITS)
        assert (info.value.field, str(info.value)) == (ref.field, str(ref))


def test_the_near_misses_the_reference_accepts_are_taken_in_c_where_plain() -> None:
    for case in ("tags at 255 bytes", "properties at the size bound", "body at the bound",
                 "flag at int32's low end", "keys a broker-only name past a key's start",
                 "keys of the same hash as a mark", "properties a plain UNIQ_KEY"):
        assert _plain(native.decode_request(NEAR_MISSES[case], LIMITS)), case
    for case in ("version True", "version 1.0"):  # equal to 1 for Python: the reference's
        assert not _plain(native.decode_request(NEAR_MISSES[case], LIMITS))
        assert not isinstance(_python_request(NEAR_MISSES[case]), ProtocolError)


def test_an_index_key_of_the_brokers_is_refused_on_either_path() -> None:
    """KEYS entries and a UNIQ_KEY that start with a broker-only property's name: left to the
    Python checks by the C codec, refused there naming the field."""
    for case, field in (("keys the timer's delivery mark", "keys"),
                        ("keys a transaction's origin, second", "keys"),
                        ("keys TIMER_OUT_MS", "keys"),
                        ("properties a UNIQ_KEY a broker-only name", "properties")):
        assert not _plain(native.decode_request(NEAR_MISSES[case], LIMITS)), case
        with pytest.raises(ProtocolError) as info:
            protocol.decode_request(NEAR_MISSES[case], LIMITS)
        assert info.value.field == field and "broker-only" in info.value.reason, case


_ANY = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.floats()
    | st.text(max_size=12) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                               max_size=4),
    max_leaves=12,
)


@settings(max_examples=800, deadline=None)
@given(st.sampled_from([1, 1.0, True, 0, 2]),
       st.sampled_from([int(c) for c in RequestCode] + [0, 999]),
       st.integers(-2, (1 << 64) - 1),
       st.dictionaries(st.sampled_from(sorted({n for s in SPECS.values() for n in s.fields})
                                       + ["x"]), _ANY, max_size=6),
       st.lists(st.binary(max_size=40), max_size=3))
def test_arbitrary_headers_get_the_reference_answer(version: Any, code: int, opaque: int,
                                                    fields: dict[str, Any],
                                                    bodies: list[bytes]) -> None:
    _same_request([msgpack.packb([version, code, opaque, fields]), *bodies])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60), st.lists(st.binary(max_size=20), max_size=2))
def test_arbitrary_bytes_get_the_reference_answer(header: bytes, bodies: list[bytes]) -> None:
    _same_request([header, *bodies])
    _same_response([header, *bodies])


# ---- answers ------------------------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(list(ResponseCode)), st.integers(-1, (1 << 63) - 1),
       st.text(max_size=20),
       st.dictionaries(st.text(max_size=8),
                       st.none() | st.integers(-(1 << 63), (1 << 63) - 1) | st.text(max_size=8)
                       | st.lists(st.integers(0, 99) | st.text(max_size=4), max_size=4),
                       max_size=6),
       st.lists(st.binary(max_size=50), max_size=3))
def test_every_plain_answer_is_decoded_in_c_as_the_reference_does(
        code: ResponseCode, opaque: int, remark: str, fields: dict[str, Any],
        bodies: list[bytes]) -> None:
    assert _same_response(encode_response(code, opaque, remark, fields, bodies)) is not None


@settings(max_examples=800, deadline=None)
@given(st.sampled_from([1, 1.0, True, 2]), st.sampled_from([int(c) for c in ResponseCode] + [999]),
       st.integers(-3, (1 << 64) - 1), _ANY, _ANY, st.lists(st.binary(max_size=20), max_size=2))
def test_arbitrary_answers_get_the_reference_answer(version: Any, code: int, opaque: int,
                                                    remark: Any, fields: Any,
                                                    bodies: list[bytes]) -> None:
    _same_response([msgpack.packb([version, code, opaque, remark, fields]), *bodies])


def test_a_deep_answer_goes_to_the_reference_and_is_refused_there() -> None:
    deep: Any = "x"
    for _ in range(8):
        deep = [deep]
    frames = encode_response(ResponseCode.SUCCESS, 1, "", {"a": deep})
    assert not _plain(native.decode_response(frames, CLIENT_LIMITS))
    with pytest.raises(ProtocolError, match="nesting"):
        protocol.decode_response(frames, CLIENT_LIMITS)


def test_limits_are_read_per_limits_object() -> None:
    frames = encode_request(RequestCode.SEND, 1, {"topic": "t" * 30, "queueId": 0}, [b"x"])
    assert _plain(native.decode_request(frames, LIMITS))
    tight = Limits(max_frame_bytes=64 * 1024, max_body_bytes=4096, max_batch_count=16,
                   max_topic_length=20)
    assert not _plain(native.decode_request(frames, tight))
    with pytest.raises(ProtocolError, match="topic"):
        protocol.decode_request(frames, tight)
    for i in range(10):  # more Limits than the codec keeps: each still read right
        limits = Limits(max_topic_length=25 + i)
        assert _plain(native.decode_request(frames, limits)) == (30 <= 25 + i)


# ---- encoding -----------------------------------------------------------------------------------

_FIELD_VALUES = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1)
                 | st.floats(allow_nan=False) | st.text(max_size=10) | st.binary(max_size=10)
                 | st.lists(st.integers(0, 9) | st.text(max_size=3), max_size=3))


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(list(RequestCode)), st.integers(0, (1 << 63) - 1),
       st.none() | st.dictionaries(st.text(max_size=8), _FIELD_VALUES, max_size=5),
       st.lists(st.binary(max_size=30), max_size=3), st.booleans())
def test_requests_are_encoded_in_c_as_the_reference_does(
        code: RequestCode, opaque: int, fields: dict[str, Any] | None, bodies: list[bytes],
        as_tuple: bool) -> None:
    given_bodies: Any = tuple(bodies) if as_tuple else bodies
    ours = native.encode_request(code, opaque, fields, given_bodies)
    assert ours == protocol._encode_request_py(code, opaque, fields, given_bodies)
    assert type(ours) is list


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(list(ResponseCode)), st.integers(-1, (1 << 63) - 1), st.text(max_size=20),
       st.none() | st.dictionaries(st.text(max_size=8), _FIELD_VALUES, max_size=5),
       st.lists(st.binary(max_size=30), max_size=3))
def test_answers_are_encoded_in_c_as_the_reference_does(
        code: ResponseCode, opaque: int, remark: str, fields: dict[str, Any] | None,
        bodies: list[bytes]) -> None:
    ours = native.encode_response(code, opaque, remark, fields, bodies)
    assert ours == protocol._encode_response_py(code, opaque, remark, fields, bodies)
    _same_response(ours)


def test_encoding_takes_what_the_reference_takes_and_refuses_what_it_refuses() -> None:
    from types import MappingProxyType
    for fields in (MappingProxyType({"a": 1}), {}, None, [("a", 1)]):
        assert native.encode_response(0, 1, "", fields, iter([b"x"])) == \
            protocol._encode_response_py(0, 1, "", fields, iter([b"x"]))
    for bad in ({"a": object()}, 5):
        with pytest.raises(TypeError):
            protocol._encode_request_py(10, 1, bad, [])  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            native.encode_request(10, 1, bad, [])
    assert native.encode_request("10", 1, {}, []) == protocol._encode_request_py("10", 1, {}, [])


def test_the_protocol_encodes_through_the_c_codec_with_the_same_defaults() -> None:
    assert protocol.encode_request is native.encode_request
    assert protocol.encode_response is native.encode_response
    assert native.encode_request(RequestCode.SEND, 3) == \
        protocol._encode_request_py(RequestCode.SEND, 3)
    assert native.encode_request(RequestCode.SEND, 3, {"a": 1}) == \
        protocol._encode_request_py(RequestCode.SEND, 3, {"a": 1})
    for args in ((), ("r",), ("r", {"x": [1]}), ("r", {"x": 1}, [b"b"])):
        assert native.encode_response(ResponseCode.SUCCESS, 4, *args) == \
            protocol._encode_response_py(ResponseCode.SUCCESS, 4, *args)
    with pytest.raises(TypeError):
        native.encode_response(ResponseCode.SUCCESS)
    with pytest.raises(TypeError):
        native.encode_response(0, 1, "", None, (), "sixth")


def test_threads_with_more_limits_than_the_codec_keeps_decode_right() -> None:
    """The codec keeps 4 Limits objects; threads rotating through 8 take slots from each other
    while they decode (a slot's references are dropped only once the new one is whole)."""
    import sys
    import threading

    frames = encode_request(RequestCode.SEND, 1, {"topic": "t" * 30, "queueId": 0}, [b"x"])
    limits = [Limits(max_topic_length=26 + i) for i in range(8)]
    wrong: list[str] = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        def work(k: int) -> None:
            for i in range(3000):
                lim = limits[(k + i) % len(limits)]
                got = native.decode_request(frames, lim)
                if _plain(got) != (30 <= lim.max_topic_length):
                    wrong.append(f"{lim.max_topic_length}: {got}")

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(old)
    assert not wrong, wrong[:3]


def test_an_answer_with_a_nan_is_compared_packed() -> None:
    """A NaN is not equal to itself: the helpers compare fields packed, so a decode that is
    right is not called wrong for it (hypothesis draws NaNs into the arbitrary answers)."""
    frames = encode_response(ResponseCode.SUCCESS, 1, "", {"x": float("nan")})
    assert _same_response(frames) is not None
    assert _same_response([msgpack.packb([1, 0, 0, None, float("nan")])]) is None
