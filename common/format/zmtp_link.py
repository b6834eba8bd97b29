"""A DEALER's side of ZMTP 3.1 (NULL) on a plain non-blocking TCP socket owned by one thread,
with no libzmq thread between a message and that thread: the slave's link to its master's HA
port (``slave/ha_client.py``) and the client's I/O thread's connection to each broker
(``common/client/transport.py``), both without CURVE (CURVE stays libzmq's).

Why: through a DEALER each message crosses libzmq's I/O thread twice a round trip (the request
handed to it, the answer handed back through the socket's mailbox), thread wake-ups that cost
as much as the work on these VMs. A SYNC put waits for a slave's ack: with the master's HA port
on the loop's own sockets (``common/broker/tcp_port.py``) and this link on the slave, the gate's
SYNC_MASTER row went from 0.49 to 0.74 of the bare relay (docs/benchmarks.md, issue 43).

What its owner sees is what a DEALER gave it:
- the connection is made in the background and made again after it drops: every
  ``RECONNECT_S`` at first, doubling to ``RECONNECT_MAX_S`` while the peer refuses (libzmq's
  RECONNECT_IVL and RECONNECT_IVL_MAX), back to the first once one succeeds;
- with ``queue_first`` (the slave's), messages sent before the first connection wait for it (a
  DEALER's pipe exists from ``connect``); without it (the client's: ``ZMQ_IMMEDIATE``) nothing
  is queued for a peer not connected. After a connection dropped, a message is dropped until the
  next one is made (``send`` says False); the owner is told ``just_connected`` each time the
  handshake completes and ``lost`` when an established connection ends;
- the greeting goes first and READY only once the peer's greeting is read (libzmq's ROUTER
  refuses a READY before it has sent the rest of its greeting); the peer's PINGs are answered
  PONG; with ``heartbeat_s`` (the client's, as its DEALERs had ZMTP heartbeats) an idle
  connection is pinged that often and one silent for three times as long is dropped (a host
  gone without a FIN, a cut network);
- a message past ``max_frames`` or ``max_bytes`` is read to its end and dropped, and reported
  (``oversized``); a peer that breaks ZMTP is a lost connection, and one that speaks CURVE a
  handshake failure (``failure``), tried again as the peer may change.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Sequence

import zmq

from common.format import zmtp

RECONNECT_S = 0.1  # libzmq's RECONNECT_IVL, as the DEALER had it
RECONNECT_MAX_S = 1.0  # RECONNECT_IVL_MAX
RECV_BYTES = 256 * 1024  # a read: two HA DATA frames of the default haTransferBatchSize
RECV_BURST = 16  # reads a turn before the client looks at its timers and the stop pipe
MAX_QUEUED = 1000  # messages waiting for the first connection (the DEALER's SNDHWM)
MAX_BUFFERED = 16 * 1024 * 1024  # bytes the peer has not read; beyond, a send is refused
DEAD_AFTER_BEATS = 3  # silent this many heartbeats: the connection is dropped
READY = zmtp.ready(b"DEALER")
# the client polls the socket with a zmq.Poller: its bits (a hang-up is POLLERR there)
POLLIN, POLLOUT, POLLERR = zmq.POLLIN, zmq.POLLOUT, zmq.POLLERR


class ZmtpLink:
    """One connection at a time to ``address`` (host:port), owned by one thread."""

    def __init__(self, address: str, max_frames: int, max_bytes: int, queue_first: bool = True,
                 heartbeat_s: float | None = None):
        host, _, port = address.rpartition(":")
        self._target = (host.strip("[]"), int(port))
        self._max_frames = max_frames
        self._max_bytes = max_bytes
        self.sock: socket.socket | None = None
        self._wire: zmtp.Connection | None = None
        self._connecting = False  # a connect in progress (non-blocking)
        self.connected = False  # the handshake completed: messages flow
        self._out = bytearray()  # bytes the socket did not take yet
        self._queued: list[bytes] | None = [] if queue_first else None  # until connected once
        self._heartbeat_s = heartbeat_s
        self._heard = 0.0  # monotonic: the peer's last bytes (heartbeat)
        self._pinged = 0.0  # monotonic: our last PING
        self._retry_s = RECONNECT_S
        self.next_attempt = 0.0  # monotonic: when to connect (no socket now)
        self.connections = 0  # handshakes completed
        # what happened, for the owner to act on and clear
        self.just_connected = False
        self.lost = ""  # why an established connection ended ("" if it did not)
        self.failure = ""  # a handshake this side cannot make (the peer speaks CURVE)
        self.oversized: list[zmtp.Oversized] = []

    # ---- what the client's poll needs ---------------------------------------------------------
    def fileno(self) -> int | None:
        return self.sock.fileno() if self.sock is not None else None

    def events(self) -> int:
        return POLLIN | POLLOUT if self._connecting or self._out else POLLIN

    def timeout_s(self, now: float) -> float | None:
        """How long until ``tick`` has work (a connection attempt, a heartbeat), or None."""
        if self.sock is None:
            return max(0.0, self.next_attempt - now)
        beat = self._heartbeat_s
        if beat is not None and self.connected:  # the next PING, or the drop
            due = min(max(self._heard, self._pinged) + beat, self._heard + beat * DEAD_AFTER_BEATS)
            return max(0.0, due - now)
        return None

    def tick(self, now: float) -> None:
        """Connect when an attempt is due; with ``heartbeat_s``, ping an idle connection and
        drop one silent for ``DEAD_AFTER_BEATS`` beats (``lost`` says so)."""
        if self.sock is None:
            self.connect_if_due(now)
            return
        beat = self._heartbeat_s
        if beat is None or not self.connected:
            return
        if now - self._heard >= beat * DEAD_AFTER_BEATS:
            self._drop(reconnect=True,
                       why=f"the peer was silent for {beat * DEAD_AFTER_BEATS:g} s")
        elif now - self._heard >= beat and now - self._pinged >= beat:
            self._pinged = now
            self._write(zmtp.PING)

    # ---- connecting ---------------------------------------------------------------------------
    def connect_if_due(self, now: float) -> None:
        if self.sock is not None or now < self.next_attempt:
            return
        family = socket.AF_INET6 if ":" in self._target[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        try:
            rc = sock.connect_ex(self._target)
        except OSError:  # not resolvable, ...: tried again later
            rc = errno.EHOSTUNREACH
        if rc not in (0, errno.EINPROGRESS, errno.EAGAIN):
            sock.close()
            self._retry_later()
            return
        self.sock = sock
        self._connecting = True
        self._wire = zmtp.Connection(self._max_frames, self._max_bytes)

    def _retry_later(self) -> None:
        self.next_attempt = time.monotonic() + self._retry_s
        self._retry_s = min(RECONNECT_MAX_S, self._retry_s * 2)

    def _connected_tcp(self) -> bool:
        sock = self.sock
        assert sock is not None
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self._drop(reconnect=True)
            return False
        self._connecting = False
        self._out += zmtp.GREETING  # READY once the peer's greeting is read
        return True

    def _handshake_done(self) -> None:
        self.connected = True
        self.connections += 1
        self.just_connected = True
        self._retry_s = RECONNECT_S
        self.failure = ""
        self._heard = self._pinged = time.monotonic()
        hello = bytearray(READY)
        if self._queued is not None:  # the first connection takes what waited for it
            for data in self._queued:
                hello += data
        self._queued = None
        self._out += hello

    # ---- a turn -------------------------------------------------------------------------------
    def on_ready(self, revents: int) -> list[list[bytes]]:
        """The socket was ready: connect, read, write. The whole messages that arrived;
        ``just_connected``, ``lost``, ``failure`` and ``oversized`` say what else happened
        (here, in ``tick`` or in ``send``), each until its owner clears it."""
        if self.sock is None:
            return []
        if self._connecting:
            if not revents & (POLLOUT | POLLERR):
                return []
            if not self._connected_tcp():
                return []
        messages: list[list[bytes]] = []
        if revents & (POLLIN | POLLERR):
            self._read(messages)
        if self.sock is not None and self._out:
            self._flush()
        return messages

    def _read(self, messages: list[list[bytes]]) -> None:
        sock, wire = self.sock, self._wire
        assert sock is not None and wire is not None
        for _ in range(RECV_BURST):
            try:
                chunk = sock.recv(RECV_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._drop(reconnect=True, why=f"the connection failed: {e}")
                return
            if not chunk:
                self._drop(reconnect=True, why="the peer closed the connection")
                return
            if self._heartbeat_s is not None:
                self._heard = time.monotonic()
            try:
                messages.extend(wire.feed(chunk))
            except zmtp.MechanismError as e:
                self.failure = f"{e}: the peer runs with aclEnable, and this side has no keys"
                self._drop(reconnect=True, why=self.failure)
                return
            except zmtp.ZmtpError as e:
                self._drop(reconnect=True, why=f"the peer broke ZMTP: {e}")
                return
            if not self.connected and wire.greeted:
                self._handshake_done()
            if wire.replies:  # PONGs
                for raw in wire.replies:
                    self._out += raw
                wire.replies.clear()
            if wire.oversized:
                self.oversized.extend(wire.oversized)
                wire.oversized.clear()
            if len(chunk) < RECV_BYTES:
                return

    def _flush(self) -> None:
        sock = self.sock
        assert sock is not None
        try:
            sent = sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._drop(reconnect=True, why=f"the connection failed: {e}")
            return
        del self._out[:sent]

    # ---- sending ------------------------------------------------------------------------------
    def send(self, frames: Sequence[bytes | memoryview]) -> bool:
        """A message to the peer; False when it was not taken (no connection: none yet
        without ``queue_first``, or none since one was lost; or the peer has not read
        ``MAX_BUFFERED`` bytes)."""
        if not self.connected:
            if self._queued is None or len(self._queued) >= MAX_QUEUED:
                return False
            self._queued.append(zmtp.encode(frames))
            return True
        if len(self._out) > MAX_BUFFERED:
            return False
        self._write(zmtp.encode(frames))
        return self.sock is not None

    @property
    def writable(self) -> bool:
        """Connected, with room for more (``send`` would take a message)."""
        return self.connected and len(self._out) <= MAX_BUFFERED

    def _write(self, data: bytes) -> None:
        if self._out:
            self._out += data
            return
        sock = self.sock
        assert sock is not None
        try:
            sent = sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as e:
            self._drop(reconnect=True, why=f"the connection failed: {e}")
            return
        if sent < len(data):
            self._out += memoryview(data)[sent:]

    # ---- ending -------------------------------------------------------------------------------
    def _drop(self, reconnect: bool, why: str = "") -> None:
        if self.connected and why:
            self.lost = why
        self.connected = False
        self._connecting = False
        self._out.clear()
        self._wire = None
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()
        if reconnect:
            self._retry_later()

    def reset(self, why: str) -> None:
        """Drop the connection (``lost`` says ``why``) and make another."""
        self._drop(reconnect=True, why=why)

    def close(self) -> None:
        self._drop(reconnect=False)
