"""HA frame codec, tested on bytes: round trips, limits, and every malformed shape we know."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.core.config import HA_MAX_TRANSFER_BATCH, BrokerConfig
from common.core.errors import ConfigError, ResponseCode
from common.ha.epochs import EpochEntry
from common.ha.protocol import (
    MAX_REASON_BYTES,
    NO_OFFSET,
    Ack,
    Data,
    Error,
    FrameType,
    HAProtocolError,
    Heartbeat,
    Hello,
    HelloReply,
    Limits,
    decode,
    encode,
    encode_data,
    encode_header,
)

pytestmark = pytest.mark.unit

LIMITS = Limits(max_data_bytes=1024, max_epochs=8, max_text_bytes=64, max_reason_bytes=128)
EPOCHS = (EpochEntry(1, 0), EpochEntry(3, 4096), EpochEntry(4, 9000))

SAMPLES = [
    Hello(7, "broker-a", 1, 12345, "10.0.0.2:10911", EPOCHS),
    Hello(8, "broker-a", 2, 0, "", ()),
    HelloReply(7, 4, 0, 20_000, 9000, EPOCHS),
    HelloReply(7, 4, 0, 20_000, 9000, EPOCHS, "10.0.0.1:10911"),
    Ack(7, 12_345),
    Ack(7, 12_345, 513),
    Heartbeat(7, 4, 20_000, 19_000),
    Error(7, ResponseCode.OFFSET_OUT_OF_RANGE, 4096, "slave needs 0, master starts at 4096"),
    Error(0, ResponseCode.BAD_REQUEST, NO_OFFSET, "no handshake"),
]


def _header(*items: object) -> bytes:
    return msgpack.packb(list(items), use_bin_type=True)


def _valid_hello_items() -> list[object]:
    return [FrameType.HELLO, 1, 7, "broker-a", 1, 100, "h:1", [[1, 0], [2, 50]]]


@pytest.mark.parametrize("frame", SAMPLES, ids=lambda f: type(f).__name__)
def test_round_trip(frame: object) -> None:
    frames = encode(frame)  # type: ignore[arg-type]
    assert len(frames) == 1
    assert decode(frames, LIMITS) == frame


def test_data_bytes_pass_through_untouched() -> None:
    raw = memoryview(b"\x00\x00\x01\x00" + bytes(range(200)))
    frames = encode_data(9, 3, 4096, 5000, raw)
    assert frames[1] is raw  # never re-encoded or copied
    frame = decode(frames, LIMITS)
    assert isinstance(frame, Data)
    assert frame.data is raw
    assert (frame.session, frame.epoch, frame.epoch_start_phy_offset, frame.phy_offset) == (
        9, 3, 4096, 5000)
    assert frame.end_phy_offset == 5000 + len(raw)
    assert encode(frame)[1] is raw


def test_a_slave_accepts_frames_up_to_the_ceiling_whatever_its_own_batch_size() -> None:
    """A master at the 128 KiB default and a slave configured for RocketMQ's 32 KiB (or the
    other way round) still replicate: the bound is the ceiling every config is held to."""
    for own in (777, 32 * 1024, 128 * 1024, HA_MAX_TRANSFER_BATCH):
        limits = Limits.from_config(BrokerConfig(haTransferBatchSize=own,
                                                 maxHaTransferByteInSecond=100 * own))
        assert limits.max_data_bytes == HA_MAX_TRANSFER_BATCH
    with pytest.raises(ConfigError, match="haTransferBatchSize"):
        BrokerConfig(haTransferBatchSize=HA_MAX_TRANSFER_BATCH + 1,
                     maxHaTransferByteInSecond=200 * HA_MAX_TRANSFER_BATCH).validate()


def test_data_at_the_batch_limit_is_accepted_and_one_more_byte_refused() -> None:
    assert isinstance(decode(encode_data(1, 1, 0, 0, b"x" * 1024), LIMITS), Data)
    with pytest.raises(HAProtocolError, match="length"):
        decode(encode_data(1, 1, 0, 0, b"x" * 1025), LIMITS)


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([], "empty message"),
        ([b""], "undecodable"),
        ([_header()], "non-empty list"),
        ([msgpack.packb({"t": 1})], "undecodable"),  # maps are not allowed at all
        ([_header(99, 1)], "unknown frame type 99"),
        ([_header("4", 1, 2)], "frame type must be an int"),
        ([_header(True, 1, 2)], "frame type must be an int"),
        ([_header(FrameType.ACK, 1)], "expected 2 or 3 fields, got 1"),
        ([_header(FrameType.ACK, 1, 2, 3, 4)], "expected 2 or 3 fields, got 4"),
        ([_header(FrameType.ACK, 1, 2, -3)], "ACK.epoch: -3 outside"),
        ([_header(FrameType.ACK, 1, -5)], "ack_offset: -5 outside"),
        ([_header(FrameType.ACK, 1, True)], "ack_offset: expected int"),
        ([_header(FrameType.ACK, 1, 2.0)], "ack_offset: expected int"),
        ([_header(FrameType.ACK, 1, "2")], "ack_offset: expected int"),
        ([_header(FrameType.ACK, -1, 2)], "session"),
        ([_header(FrameType.ACK, 1, 2), b"extra"], "expected 1 frame"),
        ([_header(FrameType.DATA, 1, 1, 0, 0, 3)], "expected 2 frame"),
        ([_header(FrameType.DATA, 1, 1, 0, 0, 3), b"ab"], "header says 3 bytes"),
        ([_header(FrameType.DATA, 1, 1, 0, 0, 0), b""], "length: 0 outside"),
        ([_header(FrameType.DATA, 1, 1, 50, 10, 2), b"ab"], "starts at 50"),
        ([_header(FrameType.DATA, 1, 0, 0, 10, 2), b"ab"], "epoch: 0 outside"),
        ([_header(FrameType.DATA, 1, 1, 0, (1 << 63) - 1, 2), b"ab"], "phy_offset"),
        ([_header(FrameType.HEARTBEAT, 1, 1, 10, 11)], "sent_phy_offset beyond"),
        ([_header(FrameType.ERROR, 1, 9999, -1, "x")], "unknown response code"),
        ([_header(FrameType.ERROR, 1, 40, -2, "x")], "phy_offset: -2 outside"),
        ([_header(FrameType.ERROR, 1, 40, -1, 5)], "reason: expected str"),
        ([_header(FrameType.ERROR, 1, 40, -1, "r" * 129)], "undecodable|longer than 128"),
        ([_header(FrameType.HELLO_REPLY, 1, 2, 10, 20, 5, [[2, 0]])], "start 5 outside"),
        ([_header(FrameType.HELLO_REPLY, 1, 2, 0, 20, 5, [[1, 0]])], "end with the master"),
        ([_header(FrameType.HELLO_REPLY, 1, 2, 0, 20, 5, [])], "end with the master"),
        ([_header(FrameType.HELLO_REPLY, 1, 2, 0, 20, 5, [[2, 0]], 7)], "master_address: expected str"),
        ([_header(FrameType.HELLO_REPLY, 1, 2, 0, 20, 5, [[2, 0]], "x" * 65)], "longer than 64"),
        ([_header(FrameType.HELLO_REPLY, 1, 2, 0, 20, 5)], "expected 6 or 7 fields, got 5"),
    ],
)
def test_malformed_frames_raise_one_error_type(frames: list[bytes], reason: str) -> None:
    with pytest.raises(HAProtocolError, match=reason):
        decode(frames, LIMITS)


@pytest.mark.parametrize(
    ("index", "value", "reason"),
    [
        (1, "1", "version: expected int"),
        (3, b"bytes", "undecodable"),  # bin types are refused by the unpacker (max_bin_len=0)
        (3, 5, "broker_name: expected str"),
        (3, "n" * 65, "undecodable|longer than 64"),
        (4, -1, "broker_id"),
        (5, 1 << 63, "max_phy_offset"),
        (7, "epochs", "epochs: expected list"),
        (7, [[1]], "each entry must be"),
        (7, [[1, 0, 2]], "each entry must be"),
        (7, [[0, 0]], "epoch: 0 outside"),
        (7, [[2, 0], [2, 10]], "not increasing"),
        (7, [[2, 10], [3, 5]], "not increasing"),
        (7, [[e, e] for e in range(1, 10)], "9 entries > 8|undecodable"),
    ],
)
def test_hello_field_checks(index: int, value: object, reason: str) -> None:
    items = _valid_hello_items()
    items[index] = value
    with pytest.raises(HAProtocolError, match=reason):
        decode([_header(*items)], LIMITS)


def test_truncated_header_at_every_byte_is_refused() -> None:
    raw = encode_header(SAMPLES[0])  # type: ignore[arg-type]
    for cut in range(len(raw)):
        with pytest.raises(HAProtocolError):
            decode([raw[:cut]], LIMITS)


def test_trailing_bytes_after_the_header_are_refused() -> None:
    with pytest.raises(HAProtocolError, match="ExtraData"):
        decode([encode_header(Ack(1, 2)) + b"\x00"], LIMITS)


def test_huge_claimed_lengths_are_refused_before_allocating() -> None:
    for raw in (b"\xdd\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff"):
        with pytest.raises(HAProtocolError):
            decode([raw], LIMITS)


def test_oversized_header_is_refused_before_unpacking() -> None:
    with pytest.raises(HAProtocolError, match="exceeds"):
        decode([b"\x90" * (LIMITS.max_header_bytes + 1)], LIMITS)


def test_deep_nesting_is_refused() -> None:
    with pytest.raises(HAProtocolError):
        decode([b"\x91" * 10_000 + b"\x01"], Limits(max_epochs=8))


def test_non_utf8_text_and_ext_types_are_refused() -> None:
    items = _valid_hello_items()
    raw = _header(*items).replace(b"broker-a", b"broker-\xff")
    with pytest.raises(HAProtocolError, match="undecodable"):
        decode([raw], LIMITS)
    ext = msgpack.packb([FrameType.ACK, 1, msgpack.ExtType(1, b"x")])
    with pytest.raises(HAProtocolError):
        decode([ext], LIMITS)


def test_long_error_reasons_are_cut_on_encode_and_still_decode() -> None:
    raw = encode_header(Error(1, ResponseCode.SYSTEM_ERROR, NO_OFFSET, "é" * 2000))
    frame = decode([raw], Limits())
    assert isinstance(frame, Error)
    assert 0 < len(frame.reason.encode()) <= MAX_REASON_BYTES


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=0, max_size=3))
def test_random_bytes_never_raise_anything_but_the_protocol_error(frames: list[bytes]) -> None:
    try:
        decode(frames, LIMITS)
    except HAProtocolError:
        pass


_INT64 = st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_INT64, st.text(max_size=8), st.booleans(), st.none(),
                          st.lists(_INT64, max_size=3)), max_size=9))
def test_random_header_lists_never_raise_anything_but_the_protocol_error(
    items: list[object],
) -> None:
    try:
        decode([msgpack.packb(items)], LIMITS)
    except HAProtocolError:
        pass


def test_a_hello_reply_without_the_master_address_still_decodes() -> None:
    """Six fields, as before master_address was added: the address reads as unknown."""
    reply = decode([_header(FrameType.HELLO_REPLY, 1, 2, 0, 20, 5, [[2, 0]])], LIMITS)
    assert reply == HelloReply(1, 2, 0, 20, 5, (EpochEntry(2, 0),), "")
