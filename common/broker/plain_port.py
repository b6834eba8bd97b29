"""The HA port without CURVE (``aclEnable`` off): a ZMQ_STREAM socket whose ZMTP replog reads
itself (``common/format/zmtp.py``), so that a whole message is bounded before any of it is
kept. (The client port does the same on the I/O thread's own sockets: ``tcp_port.py``.)

libzmq keeps every frame of a multipart message until its last has arrived, and bounds only
each frame: through a ROUTER one unauthenticated peer could make the broker hold gigabytes. A
STREAM socket hands over the connection's bytes as they arrive (chunks of at most 8 KiB,
``RCVHWM`` of them per connection at most, after which libzmq stops reading that connection),
and ``zmtp.Connection`` keeps at most one message within the bounds. A message past them is
read to its end and dropped; its request, when its first frame came whole, is answered with
the error a message of that size gets anyway (``ProtocolError("frames")``), and the connection
serves on. A peer that breaks ZMTP is disconnected.

What the ROUTER did and this does: the connection's routing identity (STREAM's 5-byte id, which
libzmq never reuses on a socket); its address, read once from the connect notification's
metadata; answers framed here (one chunk each: ``zmtp.encode``); a peer gone when its answer
leaves (EHOSTUNREACH) drops the answer, as a ROUTER does; a full connection (EAGAIN) too.
``sweep`` runs every second: a PING is answered PONG, a peer silent since the last sweep is
pinged (libzmq answers PONG), and one that has not finished its greeting within
``SILENT_SWEEPS`` sweeps is closed. A silent slave is kept (a paused one goes on where it
stopped, as through its ROUTER, which had no heartbeat; the HA protocol's own timeouts judge
it). TCP keepalive finds connections whose host is gone.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import zmq

from common.core.logs import log_event
from common.format import zmtp
from common.format.zmq_frames import NOBLOCK, SNDMORE_NOBLOCK, peer_address

SWEEP_S = 1.0
SILENT_SWEEPS = 5  # a peer silent this many sweeps in a row (about 5 s) is closed
RCVHWM_CHUNKS = 256  # per connection: at most 2 MiB read ahead of the I/O thread
_SEND = zmq.backend.Socket.send

log = logging.getLogger("replog.server")


class ZmtpPort(Protocol):
    """What ``feed_chunk`` needs of a port: ``PlainPort`` here, ``TcpPort`` (tcp_port.py)."""

    protocol_errors: int
    oversized: int
    dropped: list[tuple[bytes, zmtp.Oversized]]

    def close(self, sock: Any, identity: bytes, reason: str) -> None: ...

    def write(self, sock: Any, identity: bytes, data: bytes) -> Any: ...


def feed_chunk(port: ZmtpPort, sock: Any, identity: bytes, wire: zmtp.Connection,
               chunk: bytes) -> list[list[bytes]]:
    """A connection's chunk through its ZMTP: the whole messages it completes; a protocol
    error closes the peer, a PING is answered PONG, a message dropped past the bounds waits in
    ``port.dropped`` for the port's owner to answer."""
    try:
        messages = wire.feed(chunk)
    except zmtp.ZmtpError as e:
        port.protocol_errors += 1
        port.close(sock, identity, str(e))
        return []
    if wire.replies:
        for raw in wire.replies:
            port.write(sock, identity, raw)
        wire.replies.clear()
    if wire.oversized:
        port.oversized += len(wire.oversized)
        port.dropped.extend((identity, d) for d in wire.oversized)
        wire.oversized.clear()
    return messages


class PlainPeer:
    """One connection: its ZMTP state, address and silence."""

    __slots__ = ("address", "silent", "wire")

    def __init__(self, wire: zmtp.Connection, address: tuple[str, int]):
        self.wire = wire
        self.address = address
        self.silent = 0  # sweeps since its last bytes


class PlainPort:
    """The peers of one STREAM socket, owned by the thread that owns the socket."""

    def __init__(self, max_frames: int, max_bytes: int, peers: dict[bytes, tuple[str, int]]):
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.conns: dict[bytes, PlainPeer] = {}
        self.peers = peers  # identity -> (ip, port): the server's BORNHOST look-up
        self.next_sweep = 0.0
        self.protocol_errors = 0  # connections closed for breaking ZMTP
        self.oversized = 0  # messages dropped past the bounds
        # (identity, what was dropped) since the owner last looked: answer them, then clear
        self.dropped: list[tuple[bytes, zmtp.Oversized]] = []

    @staticmethod
    def configure(sock: zmq.Socket[Any], sndhwm: int) -> None:
        sock.setsockopt(zmq.RCVHWM, RCVHWM_CHUNKS)
        sock.setsockopt(zmq.SNDHWM, sndhwm)
        sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
        sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 60)
        sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, 10)
        sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, 6)

    def event(self, sock: zmq.Socket[Any], identity: bytes, data: zmq.Frame) -> None:
        """An empty chunk: a new connection (greeted at once) or the end of a known one."""
        if identity in self.conns:
            self.forget(identity)
            return
        wire = zmtp.Connection(self.max_frames, self.max_bytes)
        address = peer_address(data)
        self.conns[identity] = PlainPeer(wire, address)
        self.peers[identity] = address
        self.write(sock, identity, zmtp.SERVER_HELLO)

    def receive(self, sock: zmq.Socket[Any], identity: bytes,
                data: zmq.Frame) -> list[list[bytes]]:
        """The whole messages a chunk completes; a connection's start or end, a PING, a
        protocol error (the peer is closed) handled here. Messages dropped past the bounds wait
        in ``dropped`` for the caller."""
        chunk = data.bytes
        peer = self.conns.get(identity)
        if peer is None or not chunk:
            if not chunk:  # a connection begins or ends; else the rest of a closed one's
                self.event(sock, identity, data)
            return []
        peer.silent = 0
        return feed_chunk(self, sock, identity, peer.wire, chunk)

    @staticmethod
    def send(sock: zmq.Socket[Any], identity: bytes, frames: list[Any]) -> None:
        """One message to a peer, framed here; zmq.Again (its connection is full) or
        EHOSTUNREACH (gone) raised before anything is sent, as a ROUTER_MANDATORY's."""
        _SEND(sock, identity, SNDMORE_NOBLOCK)
        _SEND(sock, zmtp.encode(frames), NOBLOCK)

    def forget(self, identity: bytes) -> None:
        self.conns.pop(identity, None)
        self.peers.pop(identity, None)

    def close(self, sock: zmq.Socket[Any], identity: bytes, reason: str) -> None:
        """Disconnect a peer (an empty chunk closes a STREAM connection)."""
        peer = self.conns.get(identity)
        self.forget(identity)
        log_event(log, "peer_closed", logging.INFO, reason=reason,
                  peer=f"{peer.address[0]}:{peer.address[1]}" if peer is not None else "?")
        try:
            _SEND(sock, identity, SNDMORE_NOBLOCK)
            _SEND(sock, b"", NOBLOCK)
        except zmq.ZMQError:
            pass  # gone already

    def write(self, sock: zmq.Socket[Any], identity: bytes, data: bytes) -> None:
        """Raw bytes to a peer, dropped if it is gone or not reading (as a ROUTER drops)."""
        try:
            _SEND(sock, identity, SNDMORE_NOBLOCK)
            _SEND(sock, data, NOBLOCK)
        except zmq.ZMQError:
            pass

    def sweep(self, sock: zmq.Socket[Any], now: float) -> None:
        """Once a second: ping the peers silent since the last sweep, close one stuck in its
        greeting."""
        self.next_sweep = now + SWEEP_S
        for identity, peer in list(self.conns.items()):
            peer.silent += 1
            if peer.silent > SILENT_SWEEPS and peer.wire.state != zmtp.TRAFFIC:
                self.close(sock, identity, f"greeting unfinished for {SILENT_SWEEPS} s")
            elif peer.silent > 1 and peer.wire.state == zmtp.TRAFFIC:
                self.write(sock, identity, zmtp.PING)
