"""Fuzz the plain ports' ZMTP stream reader (``common/format/zmtp.py``): a peer's bytes, cut
into chunks anywhere, read by ``Connection.feed`` with the C frame scan (``_codec.c``'s
``zmtp_scan``) and without it. Both must read the same messages, drops, replies and end
state, or fail with the same ZmtpError; nothing else may escape, and no message handed on
is past the connection's bounds.

Input: max frames, max bytes, up to 8 cut points, then the stream.
Run: ``python fuzz/zmtp_stream.py -max_total_time=600``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from fuzz._harness import Reader, instrumented, run

with instrumented(__name__):
    from common.format import zmtp
    from common.format.zmtp import Connection, ZmtpError

NAME = "zmtp_stream"
MAX_BYTES = (16, 300, 1000, 5000, 1 << 16, 1 << 20)
HELLO = (b"\xff" + bytes(8) + b"\x7f" + bytes((3, 1)) + b"NULL".ljust(20, b"\x00") + b"\x00"
         + bytes(31) + zmtp.ready(b"DEALER"))


def _read(max_frames: int, max_bytes: int, data: bytes, cuts: list[int]) -> tuple[Any, ...]:
    """What a connection makes of ``data`` fed in pieces at ``cuts``."""
    conn = Connection(max_frames, max_bytes)
    out: list[list[bytes]] = []
    error = None
    last = 0
    try:
        for cut in [*sorted(cuts), len(data)]:
            got = conn.feed(memoryview(data)[last:cut] if cut % 2 else data[last:cut])
            for message in got:
                assert len(message) <= max_frames, (len(message), max_frames)
                assert sum(map(len, message)) <= max_bytes
            out.extend(got)
            last = cut
    except ZmtpError as e:
        error = (type(e).__name__, str(e))
    return (out, conn.oversized, conn.replies, error, conn.state, conn.peer_type, conn._size,
            conn._frames, conn._need, conn._dropping, bytes(conn._buf))


def one_input(data: bytes) -> None:
    r = Reader(data)
    max_frames = 1 + r.byte() % 8
    max_bytes = MAX_BYTES[r.byte() % len(MAX_BYTES)]
    ncuts = r.byte() % 9
    cuts = [r.int(2) for _ in range(ncuts)]
    stream = r.rest()
    cuts = [c % (len(stream) + 1) for c in cuts]
    with_c = _read(max_frames, max_bytes, stream, cuts)
    if zmtp._scan is not None:
        scan, zmtp._scan = zmtp._scan, None
        try:
            python = _read(max_frames, max_bytes, stream, cuts)
        finally:
            zmtp._scan = scan
        assert with_c == python, (with_c, python)


def _message(frames: list[bytes]) -> bytes:
    """One message on the wire (MORE on all frames but the last)."""
    out = b""
    for i, frame in enumerate(frames):
        piece = zmtp._encode([frame])
        if i < len(frames) - 1:
            piece = bytes((piece[0] | zmtp.MORE,)) + piece[1:]
        out += piece
    return out


def seeds() -> list[bytes]:
    ping = zmtp.command(b"PING", b"\x00\x00ctx")
    streams = [
        HELLO,
        HELLO + _message([b"header", b"body"]),
        HELLO + _message([b"a" * 300, b"b"]) + ping + _message([b"c"]),
        HELLO + _message([b"x"] * 9),
        HELLO + _message([b"h"]) + zmtp.command(b"PONG") + _message([b"y" * 256]),
        HELLO + zmtp.command(b"ERROR", b"\x03bad"),
        HELLO + bytes((0x08, 3)) + b"bad",
        HELLO[:40],
        b"\xff" + bytes(8) + b"\x7f" + bytes((3, 1)) + b"CURVE".ljust(20, b"\x00") + bytes(32),
        HELLO[:64] + zmtp.ready(b"PUB"),
        HELLO + bytes((zmtp.LONG,)) + (5000).to_bytes(8, "big") + b"z" * 600,
        HELLO + bytes((zmtp.LONG | zmtp.MORE,)) + (70000).to_bytes(8, "big") + b"q" * 100,
    ]
    out = []
    for i, s in enumerate(streams):
        cuts = [7, 64, 70, 80 + i][: i % 5]
        out.append(bytes((i % 8, i % len(MAX_BYTES), len(cuts)))
                   + b"".join(c.to_bytes(2, "big") for c in cuts) + s)
    return out


if __name__ == "__main__":
    run(NAME, one_input)
