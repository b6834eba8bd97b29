"""The HA frames' C codec (``common/ha/_ha_codec.c``) against the Python reference.

``protocol.decode`` takes a plain DATA or ACK from the C codec where it is built and every
other frame from the Python path. What the C codec answers must be what the Python path answers
(the same frame, field for field, the payload the very object received); where the Python path
refuses, the C codec must answer None so the refusal comes from the reference. ``encode_data``
must make the same bytes.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.ha import protocol
from common.ha.epochs import EpochEntry
from common.ha.protocol import (
    MAX_OFFSET,
    MAX_SESSION,
    NO_OFFSET,
    Ack,
    Data,
    FrameType,
    HAProtocolError,
    Heartbeat,
    Hello,
    Limits,
    encode_header,
)

pytestmark = pytest.mark.unit

native: Any = protocol._native
if native is None:
    pytest.skip("the HA codec is not in use here", allow_module_level=True)

LIMITS = Limits(max_data_bytes=256)
MAX_EPOCH = (1 << 31) - 1


def _reference(frames: list[Any], limits: Limits = LIMITS) -> Any:
    try:
        return protocol._decode_py(frames, limits)
    except HAProtocolError as e:
        return e


def _same(frames: list[Any], limits: Limits = LIMITS) -> Any:
    ours = native.decode(frames, limits)
    ref = _reference(frames, limits)
    if ours is not None:
        assert not isinstance(ref, HAProtocolError), (frames, ref)
        assert ours == ref
        assert type(ours) is type(ref)
        if isinstance(ours, Data):
            assert ours.data is frames[1]  # the received frame itself, not a copy
    return ours


_SESSION = st.integers(0, MAX_SESSION)
_EPOCH = st.integers(1, MAX_EPOCH)


@st.composite
def _data(draw: st.DrawFn) -> list[Any]:
    payload = draw(st.binary(min_size=1, max_size=256))
    phy = draw(st.integers(0, MAX_OFFSET - len(payload)))
    start = draw(st.integers(0, phy))
    confirm = draw(st.none() | st.integers(NO_OFFSET, MAX_OFFSET))
    args = [draw(_SESSION), draw(_EPOCH), start, phy, payload]
    frames = protocol._encode_data_py(*args) if confirm is None else \
        protocol._encode_data_py(*args, confirm)
    if confirm is None:  # a master before the confirmed offset: 5 fields
        header = msgpack.unpackb(frames[0])[:-1]
        frames = [msgpack.packb(header), payload]
    return [frames[0], memoryview(payload) if draw(st.booleans()) else payload]


@settings(max_examples=500, deadline=None)
@given(_data())
def test_every_plain_data_frame_is_decoded_in_c_as_the_reference_does(frames: list[Any]) -> None:
    assert _same(frames) is not None


@settings(max_examples=300, deadline=None)
@given(_SESSION, st.integers(0, MAX_OFFSET), st.none() | st.integers(0, MAX_EPOCH))
def test_every_plain_ack_is_decoded_in_c_as_the_reference_does(
        session: int, ack: int, epoch: int | None) -> None:
    header = [int(FrameType.ACK), session, ack] + ([] if epoch is None else [epoch])
    assert _same([msgpack.packb(header)]) is not None


def _data_frames(*fields: Any, payload: Any = b"abc") -> list[Any]:
    return [msgpack.packb([int(FrameType.DATA), *fields]), payload]


NEAR_MISSES: dict[str, list[Any]] = {
    "data ok": _data_frames(1, 2, 10, 20, 3),
    "data with confirm": _data_frames(1, 2, 10, 20, 3, 15),
    "data confirm -1": _data_frames(1, 2, 10, 20, 3, -1),
    "data confirm -2": _data_frames(1, 2, 10, 20, 3, -2),
    "data length differs": _data_frames(1, 2, 10, 20, 4),
    "data length 0": _data_frames(1, 2, 10, 20, 0, payload=b""),
    "data over max_data_bytes": _data_frames(1, 2, 10, 20, 257, payload=b"x" * 257),
    "data epoch 0": _data_frames(1, 0, 10, 20, 3),
    "data epoch over int32": _data_frames(1, 1 << 31, 10, 20, 3),
    "data start after offset": _data_frames(1, 2, 21, 20, 3),
    "data offset at the top": _data_frames(1, 2, 0, MAX_OFFSET - 3, 3),
    "data offset past the top": _data_frames(1, 2, 0, MAX_OFFSET - 2, 3),
    "data session max": _data_frames(MAX_SESSION, 2, 10, 20, 3),
    "data session negative": _data_frames(-1, 2, 10, 20, 3),
    "data a bool": _data_frames(True, 2, 10, 20, 3),
    "data a float": _data_frames(1, 2.0, 10, 20, 3),
    "data 4 fields": _data_frames(1, 2, 10, 20),
    "data 7 fields": _data_frames(1, 2, 10, 20, 3, 15, 0),
    "data no payload frame": [msgpack.packb([int(FrameType.DATA), 1, 2, 10, 20, 3])],
    "data three frames": [*_data_frames(1, 2, 10, 20, 3), b"more"],
    "ack ok": [msgpack.packb([int(FrameType.ACK), 1, 5])],
    "ack with epoch": [msgpack.packb([int(FrameType.ACK), 1, 5, 9])],
    "ack epoch negative": [msgpack.packb([int(FrameType.ACK), 1, 5, -1])],
    "ack offset negative": [msgpack.packb([int(FrameType.ACK), 1, -5])],
    "ack 4 fields": [msgpack.packb([int(FrameType.ACK), 1, 5, 9, 9])],
    "ack with a payload": [msgpack.packb([int(FrameType.ACK), 1, 5]), b"x"],
    "ack type a bool": [msgpack.packb([True, 1, 5])],
    "unknown type": [msgpack.packb([99, 1, 5])],
    "heartbeat": [encode_header(Heartbeat(1, 2, 3, 4, 5))],
    "hello": [encode_header(Hello(1, "b", 1, 0, "127.0.0.1:1", (EpochEntry(1, 0),)))],
    "header a map": [msgpack.packb({"a": 1})],
    "header empty list": [msgpack.packb([])],
    "not msgpack": [b"\xc1"],
    "trailing bytes": [msgpack.packb([int(FrameType.ACK), 1, 5]) + b"\x00"],
    "header too long": [msgpack.packb([int(FrameType.ACK), 1, 5, "x" * 5000])],
    "no frames": [],
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_a_near_miss_gets_the_reference_answer(case: str) -> None:
    frames = NEAR_MISSES[case]
    ours = _same(frames)
    ref = _reference(frames)
    if isinstance(ref, HAProtocolError):
        assert ours is None
        with pytest.raises(HAProtocolError) as info:
            protocol.decode(frames, LIMITS)
        assert str(info.value) == str(ref)
    elif case in ("heartbeat", "hello"):
        assert ours is None and protocol.decode(frames, LIMITS) == ref  # the Python path's
    else:
        assert ours is not None, case


_ANY = st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.floats() \
    | st.text(max_size=6) | st.binary(max_size=6) | st.lists(st.integers(0, 9), max_size=3)


@settings(max_examples=800, deadline=None)
@given(st.sampled_from([int(t) for t in FrameType] + [0, 7, True]),
       st.lists(_ANY, max_size=8), st.lists(st.binary(max_size=8), max_size=2))
def test_arbitrary_headers_get_the_reference_answer(kind: Any, fields: list[Any],
                                                    rest: list[bytes]) -> None:
    _same([msgpack.packb([kind, *fields]), *rest])


@settings(max_examples=300, deadline=None)
@given(_SESSION, _EPOCH, st.integers(0, MAX_OFFSET), st.integers(0, MAX_OFFSET),
       st.binary(max_size=40), st.none() | st.integers(NO_OFFSET, MAX_OFFSET), st.booleans())
def test_data_is_encoded_in_c_as_the_reference_does(
        session: int, epoch: int, start: int, phy: int, payload: bytes, confirm: int | None,
        as_view: bool) -> None:
    data: Any = memoryview(payload) if as_view else payload
    args = (session, epoch, start, phy, data) + (() if confirm is None else (confirm,))
    ours = native.encode_data(*args)
    assert ours == protocol._encode_data_py(*args)
    assert ours[1] is data


def test_the_protocol_uses_the_c_codec() -> None:
    assert protocol.encode_data is native.encode_data
    frames = protocol.encode_data(3, 2, 0, 10, b"xyz", 5)
    assert type(protocol.decode(frames, LIMITS)) is Data
    assert protocol.decode([encode_header(Ack(3, 13, 2))], LIMITS) == Ack(3, 13, 2)
    with pytest.raises(TypeError):
        native.encode_data(1, 2, 3, 4)


@settings(max_examples=200, deadline=None)
@given(_SESSION, st.integers(0, MAX_OFFSET), st.integers(0, MAX_EPOCH))
def test_an_ack_is_encoded_as_its_header(session: int, ack: int, epoch: int) -> None:
    ours = native.encode_ack(session, ack, epoch)
    assert ours == encode_header(Ack(session, ack, epoch))
    assert protocol.encode_ack is native.encode_ack
    assert protocol.decode([ours], LIMITS) == Ack(session, ack, epoch)
