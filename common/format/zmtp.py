"""ZMTP 3.1, the server side of the NULL mechanism, read by replog itself: a whole message is
bounded (frames and bytes) before any of it is kept.

Why: libzmq keeps every frame of a multipart message until its last one has arrived and
bounds only each frame (``ZMQ_MAXMSGSIZE``), so one unauthenticated peer of a ROUTER could make
the broker hold gigabytes (160 frames of 4 MiB took a broker from 40 MiB to 680 MiB). A plain
port is therefore a ZMQ_STREAM socket (libzmq does the TCP, in chunks of at most 8 KiB, with
its own back pressure) whose bytes this module reads: ``Connection.feed`` keeps at most one
message of at most ``max_frames`` frames and ``max_bytes`` bytes; a message past either bound
is read to its end and dropped as it arrives (``Oversized`` tells the caller, with its first
frame if that was whole, so the request can be answered), and the connection serves on.

The wire (https://rfc.zeromq.org/spec/37/): a 64-byte greeting each way (signature ``FF``,
8 bytes of padding, ``7F``; version 3.1; mechanism ``NULL``; as-server 0; filler), then a
READY command each way (the peer's ``Socket-Type`` must be one a ROUTER talks to), then
frames: a flags byte (bit 0 MORE, bit 1 LONG, bit 2 COMMAND), a size (1 byte, or 8 bytes
big-endian when LONG), the body. Commands after READY: PING is answered PONG with its context
(libzmq's ZMTP heartbeat), PONG is traffic, ERROR or anything else ends the connection
(``ZmtpError``). A peer that is not ZMTP 3 or asks another mechanism (CURVE, PLAIN) is cut off
after the greeting.

``encode(frames)`` frames an outgoing message; one ``bytes`` object, as a STREAM socket sends
each message as one chunk of the connection's byte stream.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import NamedTuple

from common.core import accel

SIGNATURE_END = 9  # signature: FF, 8 bytes of padding, 7F
GREETING_BYTES = 64
MECHANISM = slice(12, 32)
MORE, LONG, COMMAND = 0x01, 0x02, 0x04
_LONG_SIZE = struct.Struct(">Q")
_PROPERTY_SIZE = struct.Struct(">I")
MAX_COMMAND_BYTES = 4096  # READY, PING: a few properties; nothing a server needs is longer
PEER_TYPES = (b"DEALER", b"REQ", b"ROUTER")  # what a ROUTER accepts (RFC 28)

GREETING = (b"\xff" + (1).to_bytes(8, "big") + b"\x7f" + b"\x03\x01"
            + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31)
assert len(GREETING) == GREETING_BYTES


def command(name: bytes, data: bytes = b"") -> bytes:
    body = bytes((len(name),)) + name + data
    if len(body) > 255:
        return bytes((COMMAND | LONG,)) + _LONG_SIZE.pack(len(body)) + body
    return bytes((COMMAND, len(body))) + body


def ready(socket_type: bytes) -> bytes:
    name = b"Socket-Type"
    return command(b"READY", bytes((len(name),)) + name
                   + _PROPERTY_SIZE.pack(len(socket_type)) + socket_type)


SERVER_HELLO = GREETING + ready(b"ROUTER")  # what a server sends as soon as a peer connects
PING = command(b"PING", b"\x00\x00")  # TTL 0: the server keeps no timer on the peer's behalf


class ZmtpError(Exception):
    """The peer broke the protocol: close the connection."""


class MechanismError(ZmtpError):
    """The peer's greeting names a security mechanism other than NULL (a CURVE peer)."""


class Oversized(NamedTuple):
    """A message past the bounds, dropped as it arrived: ``head`` is its first frame when that
    was whole (to answer the request it carried), else None."""
    head: bytes | None
    frames: int
    size: int
    reason: str


def _encode(frames: Sequence[bytes | memoryview]) -> bytes:
    """One message (at least one frame) as ZMTP frames. (No frames would be no bytes, which a
    STREAM socket takes as "close the connection": refused.)"""
    if not frames:
        raise ValueError("a message needs at least one frame")
    out = []
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        size = len(frame)
        flags = MORE if i < last else 0
        if size > 255:
            out.append(bytes((flags | LONG,)))
            out.append(_LONG_SIZE.pack(size))
        else:
            out.append(bytes((flags, size)))
        out.append(frame)  # type: ignore[arg-type]  # join takes memoryviews too
    return b"".join(out)  # type: ignore[arg-type]


# Where the C codec is built, its zmtp_encode frames a message (the same bytes, one call) and
# its zmtp_scan reads the run of whole data frames within the bounds that ``feed`` would keep
# at once; it stops before anything else, which the Python loop below reads as ever.
# tests/unit/format/test_zmtp.py runs every case with and without them.
_native = accel.load("common.format._codec")
_scan = _native.zmtp_scan if _native is not None else None
encode: Callable[[Sequence[bytes | memoryview]], bytes] = (
    _native.zmtp_encode if _native is not None else _encode)

_GREETING, _READY, TRAFFIC = 0, 1, 2  # a connection's states


class Connection:
    """One peer's side of the wire: ``feed`` the bytes as they arrive."""

    __slots__ = (
        "_buf",
        "_count",
        "_dropping",
        "_frames",
        "_head",
        "_more",
        "_need",
        "_part",
        "_size",
        "_why",
        "max_bytes",
        "max_frames",
        "oversized",
        "peer_type",
        "replies",
        "state",
    )

    def __init__(self, max_frames: int, max_bytes: int):
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.state = _GREETING
        self._buf = b""  # the greeting or READY so far, or less than one frame's header
        self._frames: list[bytes] = []  # the message being received (or its count, dropping)
        self._size = 0  # its payload bytes so far
        self._part: bytearray | None = None  # a frame body arriving over several chunks
        self._need = 0  # bytes of that body (or of a dropped one) still to come
        self._more = False  # whether frames follow the one whose body is arriving
        self._dropping = False  # the message being received is past the bounds
        self._count = 0  # frames of the message being dropped
        self._head: bytes | None = None  # a dropped message's first frame, if it was whole
        self._why = ""
        self.replies: list[bytes] = []  # bytes to send the peer (PONG), taken by the caller
        self.oversized: list[Oversized] = []  # messages dropped, taken by the caller
        self.peer_type = b""

    @property
    def greeted(self) -> bool:
        """The peer's greeting has been read (and was one this side speaks)."""
        return self.state != _GREETING

    def feed(self, data: bytes | memoryview) -> list[list[bytes]]:
        """The whole messages ``data`` completes, in order (maybe none); ``replies`` and
        ``oversized`` get what else it held. Raises ZmtpError when the peer broke the
        protocol (the connection is then unusable)."""
        out: list[list[bytes]] = []
        if self._need:  # the body of a frame begun in an earlier chunk
            data = self._continue(data, out)
            if not data:
                return out
        if self._buf:
            buf = self._buf + data
            self._buf = b""
        else:
            buf = data if type(data) is bytes else bytes(data)
        if self.state != TRAFFIC:
            buf = self._handshake(buf)
            if self.state != TRAFFIC:
                self._buf = buf
                return out
        pos, end = 0, len(buf)
        frames = self._frames
        while pos < end:
            if _scan is not None and not self._dropping:  # the run of whole frames, in C
                pos, frames, self._size = _scan(buf, pos, frames, self._size, self.max_frames,
                                                self.max_bytes, out)
                self._frames = frames
                if pos >= end:
                    break
            flags = buf[pos]
            if flags & LONG:
                if end - pos < 9:
                    break
                length = _LONG_SIZE.unpack_from(buf, pos + 1)[0]
                start = pos + 9
            else:
                if end - pos < 2:
                    break
                length = buf[pos + 1]
                start = pos + 2
            if flags & COMMAND:
                if length > MAX_COMMAND_BYTES:
                    raise ZmtpError(f"a command of {length} bytes")
                if end - start < length:
                    break
                self._command(buf[start:start + length])
                pos = start + length
                continue
            if flags & ~(MORE | LONG):
                raise ZmtpError(f"reserved flag bits set: {flags:#04x}")
            more = flags & MORE
            if not self._dropping and (len(frames) >= self.max_frames
                                       or self._size + length > self.max_bytes):
                self._begin_drop(length)
                frames = self._frames
            if self._dropping:
                self._size += length
                self._count += 1
                if end - start < length:  # the rest of it arrives later: dropped then
                    self._need, self._more, self._part = length - (end - start), bool(more), None
                    pos = end
                    break
                pos = start + length
                if not more:
                    self._end_drop()
                    frames = self._frames
                continue
            if end - start < length:  # within the bounds: kept as it arrives
                # grown as it arrives: memory follows the bytes received, not the size claimed
                self._part = bytearray(buf[start:end])
                self._need, self._more = length - (end - start), bool(more)
                pos = end
                break
            frames.append(buf[start:start + length])
            self._size += length
            pos = start + length
            if not more:
                out.append(frames)
                frames = self._frames = []
                self._size = 0
        if pos < end:
            self._buf = buf[pos:]
        return out

    def _continue(self, data: bytes | memoryview, out: list[list[bytes]]) -> bytes | memoryview:
        """More of a frame body that began in an earlier chunk; what follows it in ``data``."""
        take = min(self._need, len(data))
        part = self._part
        if part is not None:
            part += data[:take]
        self._need -= take
        if self._need:
            return b""
        if part is not None:  # a frame kept: the message may be whole now
            self._part = None
            self._frames.append(bytes(part))
            self._size += len(part)
            if not self._more:
                out.append(self._frames)
                self._frames, self._size = [], 0
        elif not self._more:
            self._end_drop()
        return data[take:]

    # -- a message past the bounds: read to its end, nothing of it kept -------------------------
    def _begin_drop(self, length: int) -> None:
        frames = self._frames
        self._head = frames[0] if frames else None
        self._why = (f"more than {self.max_frames} frames" if len(frames) >= self.max_frames
                     else f"more than {self.max_bytes} bytes")
        self._dropping = True
        self._count = len(frames)  # counted from here, not kept
        self._frames = []

    def _end_drop(self) -> None:
        self.oversized.append(Oversized(self._head, self._count, self._size, self._why))
        self._dropping = False
        self._head = None
        self._frames, self._size = [], 0

    def _handshake(self, buf: bytes) -> bytes:
        if self.state == _GREETING:
            if len(buf) >= 1 and buf[0] != 0xFF:
                raise ZmtpError("not a ZMTP peer (no greeting signature)")
            if len(buf) < GREETING_BYTES:
                return buf
            if not buf[SIGNATURE_END] & 0x01 or buf[10] < 3:
                raise ZmtpError(f"ZMTP {buf[10]}.x: this server speaks 3.x")
            mechanism = buf[MECHANISM].rstrip(b"\x00")
            if mechanism != b"NULL":
                raise MechanismError(f"mechanism {mechanism!r}: this side speaks NULL")
            buf = buf[GREETING_BYTES:]
            self.state = _READY
        if len(buf) < 2:
            return buf
        flags = buf[0]
        if not flags & COMMAND:
            raise ZmtpError("a message before READY")
        if flags & LONG:
            if len(buf) < 9:
                return buf
            length, start = _LONG_SIZE.unpack_from(buf, 1)[0], 9
        else:
            length, start = buf[1], 2
        if length > MAX_COMMAND_BYTES:
            raise ZmtpError(f"a READY of {length} bytes")
        if len(buf) - start < length:
            return buf
        body = buf[start:start + length]
        name, props = _command_parts(body)
        if name != b"READY":
            raise ZmtpError(f"{name!r} before READY")
        peer_type = _properties(props).get(b"socket-type", b"")
        if peer_type not in PEER_TYPES:
            raise ZmtpError(f"socket type {peer_type!r} cannot talk to a ROUTER")
        self.peer_type = peer_type
        self.state = TRAFFIC
        return buf[start + length:]

    def _command(self, body: bytes) -> None:
        name, data = _command_parts(body)
        if name == b"PING":
            if len(data) < 2 or len(data) > 18:
                raise ZmtpError("a malformed PING")
            self.replies.append(command(b"PONG", data[2:]))
        elif name == b"PONG":
            pass
        elif name == b"ERROR":
            raise ZmtpError(f"the peer sent ERROR {data[1:1 + data[0]]!r}" if data
                            else "the peer sent ERROR")
        else:
            raise ZmtpError(f"unexpected command {name!r}")


def _command_parts(body: bytes) -> tuple[bytes, bytes]:
    if not body or len(body) < 1 + body[0]:
        raise ZmtpError("a malformed command")
    return body[1:1 + body[0]], body[1 + body[0]:]


def _properties(data: bytes) -> dict[bytes, bytes]:
    props: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(data):
        size = data[pos]
        name = data[pos + 1:pos + 1 + size]
        pos += 1 + size
        if len(name) != size or pos + 4 > len(data):
            raise ZmtpError("malformed metadata")
        (value_size,) = _PROPERTY_SIZE.unpack_from(data, pos)
        pos += 4
        if pos + value_size > len(data):
            raise ZmtpError("malformed metadata")
        props[name.lower()] = data[pos:pos + value_size]
        pos += value_size
    return props
