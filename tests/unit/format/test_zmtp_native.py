"""The C codec's ZMTP frame scan and encode (``zmtp_scan``, ``zmtp_encode`` in
common/format/_codec.c) against zmtp.py's Python loop, the reference: random streams of
messages near and past the bounds, PINGs between frames, a broken frame now and then, cut at
random, read the same way by both."""

from __future__ import annotations

import random
from typing import Any

import pytest

from common.format import zmtp
from common.format.zmtp import Connection, ZmtpError

if zmtp._native is None:
    pytest.skip("the C codec is not built (or PURE_PYTHON_REPLOG is set)",
                allow_module_level=True)

HELLO = (b"\xff" + bytes(8) + b"\x7f" + bytes((3, 1)) + b"NULL".ljust(20, b"\x00") + b"\x00"
         + bytes(31) + zmtp.ready(b"DEALER"))


def _pieces(frames: list[bytes]) -> list[bytes]:
    """The message's frames on the wire, one piece each (MORE on all but the last)."""
    out = []
    for i, frame in enumerate(frames):
        piece = zmtp._encode([frame])
        if i < len(frames) - 1:
            piece = bytes((piece[0] | zmtp.MORE,)) + piece[1:]
        out.append(piece)
    return out


def _read(conn: Connection, data: bytes, cuts: list[int]) -> tuple[Any, ...]:
    """What a connection makes of ``data`` fed at ``cuts``: messages, drops, replies, error,
    and the state it ends in."""
    out: list[list[bytes]] = []
    error = None
    last = 0
    try:
        for cut in sorted(cuts) + [len(data)]:
            out.extend(conn.feed(data[last:cut]))
            last = cut
    except ZmtpError as e:
        error = str(e)
    return (out, conn.oversized, conn.replies, error, conn._size, conn._frames, conn._need,
            conn._dropping, conn._buf)


@pytest.mark.parametrize("seed", range(80))
def test_the_c_scan_reads_every_stream_as_the_python_loop_does(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    max_frames, max_bytes = rng.randint(1, 6), rng.choice((300, 1000, 5000))
    wire = [HELLO]
    for _ in range(rng.randint(1, 12)):
        frames = [rng.randbytes(rng.choice((0, 1, 100, 255, 256, 900)))
                  for _ in range(rng.randint(1, 8))]
        assert zmtp.encode(frames) == zmtp._encode(frames)
        pieces = _pieces(frames)
        if rng.random() < 0.3:  # libzmq may slip a PING in between two frames of a message
            pieces.insert(rng.randint(0, len(pieces)), zmtp.command(b"PING", b"\x00\x00ctx"))
        wire.extend(pieces)
    if rng.random() < 0.2:  # reserved flag bits: the peer broke the protocol
        wire.append(bytes((rng.choice((0x08, 0x10, 0x80)), 3)) + b"bad")
    data = b"".join(wire)
    cuts = [rng.randint(0, len(data)) for _ in range(rng.randint(0, 10))]
    with_c = _read(Connection(max_frames, max_bytes), data, cuts)
    monkeypatch.setattr(zmtp, "_scan", None)
    python = _read(Connection(max_frames, max_bytes), data, cuts)
    assert with_c == python


def test_the_c_encode_takes_what_the_python_one_takes() -> None:
    frames: list[Any] = [b"a", bytearray(b"b" * 300), memoryview(b"c" * 256)[1:], b""]
    assert zmtp.encode(frames) == zmtp._encode(frames)
    assert zmtp.encode(tuple(frames)) == zmtp._encode(frames)
    with pytest.raises(ValueError, match="at least one frame"):
        zmtp.encode([])
    with pytest.raises(TypeError):
        zmtp.encode([b"a", 7])


def test_the_c_scan_refuses_what_is_not_its_input() -> None:
    with pytest.raises(TypeError):
        zmtp._native.zmtp_scan(bytearray(b"\x00\x00"), 0, [], 0, 1, 1, [])
    with pytest.raises(ValueError):
        zmtp._native.zmtp_scan(b"\x00\x00", -1, [], 0, 1, 1, [])
    # a LONG size of 2**64 - 1 is past any bound: left to the Python loop, nothing kept
    huge = b"\x02" + b"\xff" * 8 + b"x"
    frames: list[bytes] = []
    assert zmtp._native.zmtp_scan(huge, 0, frames, 0, 8, 1 << 20, []) == (0, frames, 0)
