"""Fuzz the HA frame codec: the C decoder (``common/ha/_ha_codec.c``) against the Python
reference (``common/ha/protocol.py``) on the same frames. A frame the C codec decodes must be
the reference's, field for field, its payload the frame received; one it leaves (None) must
get the reference's answer. Only HAProtocolError may escape the decoder, and what decodes
encodes back to a frame that decodes to the same.

Input: a flags byte (which limits), then length-prefixed frames.
Run: ``python fuzz/ha_codec.py -max_total_time=600``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgpack

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from fuzz._harness import Reader, instrumented, pack_frames, run

with instrumented(__name__):
    from common.core.errors import ResponseCode
    from common.ha import protocol
    from common.ha.epochs import EpochEntry
    from common.ha.protocol import (
        Ack,
        Data,
        Error,
        FrameType,
        HAProtocolError,
        Heartbeat,
        Hello,
        HelloReply,
        Limits,
        encode_header,
    )

NAME = "ha_codec"
LIMITS = (Limits(), Limits(max_data_bytes=256), Limits(max_data_bytes=4, max_epochs=2,
                                                        max_text_bytes=8, max_reason_bytes=16))
native: Any = protocol._native


def _reference(frames: list[Any], limits: Limits) -> Any:
    try:
        return protocol._decode_py(frames, limits)
    except HAProtocolError as e:
        return ("refused", str(e))


def one_input(data: bytes) -> None:
    r = Reader(data)
    limits = LIMITS[r.byte() % len(LIMITS)]
    frames: list[Any] = r.frames(most=4)
    ref = _reference(frames, limits)
    try:
        got = protocol.decode(frames, limits)
    except HAProtocolError as e:
        got = ("refused", str(e))
    assert got == ref, (frames, got, ref)
    if native is not None:
        ours = native.decode(frames, limits)
        if ours is not None:
            assert type(ours) is type(ref) and ours == ref, (frames, ours, ref)
            if isinstance(ours, Data):
                assert ours.data is frames[1]  # the frame received, not a copy
    if isinstance(ref, tuple):
        return
    encoded = (protocol.encode(ref) if isinstance(ref, Data) else [encode_header(ref)])
    again = protocol._decode_py([bytes(f) for f in encoded], limits)
    assert again == ref, (ref, again)


def seeds() -> list[bytes]:
    epochs = (EpochEntry(1, 0), EpochEntry(3, 4096))
    frames: list[list[Any]] = [
        [encode_header(Hello(1, "broker-a", 1, 100, "127.0.0.1:10912", epochs))],
        [encode_header(HelloReply(1, 3, 0, 8192, 4096, epochs, "127.0.0.1:10911"))],
        [encode_header(HelloReply(1, 3, 0, 8192, 4096, epochs))],
        [bytes(f) for f in protocol._encode_data_py(1, 3, 4096, 5000, b"records", 4999)],
        [bytes(f) for f in protocol._encode_data_py(2, 3, 0, 0, b"r")],
        [encode_header(Ack(1, 5007, 3))],
        [msgpack.packb([int(FrameType.ACK), 1, 5])],
        [encode_header(Heartbeat(1, 3, 9000, 8000, 7000))],
        [encode_header(Error(1, ResponseCode.OFFSET_OUT_OF_RANGE, 42, "too far behind"))],
        [msgpack.packb([int(FrameType.DATA), 1, 1, 0, 0, 3]), b"abc"],
        [msgpack.packb([int(FrameType.DATA), 1, 1, 0, 0, 4]), b"abc"],
        [msgpack.packb([99, 1, 5])],
        [msgpack.packb([True, 1, 5])],
        [b"\xc1"],
        [],
    ]
    return [bytes([i % len(LIMITS)]) + pack_frames(f) for i, f in enumerate(frames)]


if __name__ == "__main__":
    run(NAME, one_input)
