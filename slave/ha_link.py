"""The slave's link to its master's HA port without CURVE: a plain TCP socket of the HA client's
thread, speaking ZMTP 3.1 (NULL) as a DEALER (``common/format/zmtp.py``), with no libzmq thread
between a DATA frame and the append, nor between the ack and the master.

Why: a SYNC put waits for a slave's ack, and through a DEALER each DATA frame crossed libzmq's
I/O thread on its way to the HA client's thread and each ack crossed it back, two thread
wake-ups a round trip on top of the master's (issue 43; the master's HA port is its loop's own
sockets for the same reason, ``common/broker/tcp_port.py``).

What the HA client sees is what the DEALER gave it (``slave/ha_client.py``):
- the connection is made in the background and made again after it drops: every
  ``RECONNECT_S`` at first, doubling to ``RECONNECT_MAX_S`` while the master refuses
  (libzmq's RECONNECT_IVL and RECONNECT_IVL_MAX), back to the first once one succeeds;
- messages sent before the first connection wait for it (a DEALER's pipe exists from
  ``connect``); after a connection dropped, a message is dropped until the next one is made
  (``send`` says False: the client counts it, the core sends again), and the client is told
  ``connected`` each time the handshake completes (it says HELLO again after a reconnect) and
  ``lost`` when an established connection ends;
- the greeting goes first and READY only once the master's greeting is read (libzmq's ROUTER,
  which a master with ``aclEnable`` off may still be on an older version, refuses a READY before
  it has sent the rest of its greeting); the master's PINGs are answered PONG;
- a message past ``max_frames`` or ``max_bytes`` is read to its end and dropped, and reported
  (``oversized``): the core takes it as a bad frame; a master that breaks ZMTP is a lost
  connection, and one that speaks CURVE a handshake failure (``failure``) tried again as the
  master may change.
"""

from __future__ import annotations

import errno
import socket
import time

import zmq

from common.format import zmtp

RECONNECT_S = 0.1  # libzmq's RECONNECT_IVL, as the DEALER had it
RECONNECT_MAX_S = 1.0  # RECONNECT_IVL_MAX
RECV_BYTES = 256 * 1024  # a read: two DATA frames of the default haTransferBatchSize
RECV_BURST = 16  # reads a turn before the client looks at its timers and the stop pipe
MAX_QUEUED = 1000  # messages waiting for the first connection (the DEALER's SNDHWM)
MAX_BUFFERED = 16 * 1024 * 1024  # bytes the master has not read; beyond, a send is dropped
READY = zmtp.ready(b"DEALER")
# the client polls the socket with a zmq.Poller: its bits (a hang-up is POLLERR there)
POLLIN, POLLOUT, POLLERR = zmq.POLLIN, zmq.POLLOUT, zmq.POLLERR


class TcpLink:
    """One connection at a time to ``address`` (host:port), owned by one thread."""

    def __init__(self, address: str, max_frames: int, max_bytes: int):
        host, _, port = address.rpartition(":")
        self._target = (host.strip("[]"), int(port))
        self._max_frames = max_frames
        self._max_bytes = max_bytes
        self.sock: socket.socket | None = None
        self._wire: zmtp.Connection | None = None
        self._connecting = False  # a connect in progress (non-blocking)
        self.connected = False  # the handshake completed: messages flow
        self._out = bytearray()  # bytes the socket did not take yet
        self._queued: list[bytes] | None = []  # before the first connection; None after it
        self._retry_s = RECONNECT_S
        self.next_attempt = 0.0  # monotonic: when to connect (no socket now)
        self.connections = 0  # handshakes completed
        # what the last ``on_ready`` found, for the client to act on
        self.just_connected = False
        self.lost = ""  # why an established connection ended ("" if it did not)
        self.failure = ""  # a handshake the master refused (it speaks CURVE)
        self.oversized: list[zmtp.Oversized] = []

    # ---- what the client's poll needs ---------------------------------------------------------
    def fileno(self) -> int | None:
        return self.sock.fileno() if self.sock is not None else None

    def events(self) -> int:
        return POLLIN | POLLOUT if self._connecting or self._out else POLLIN

    def timeout_s(self, now: float) -> float | None:
        """How long until a connection attempt is due (None while a socket is open)."""
        return None if self.sock is not None else max(0.0, self.next_attempt - now)

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
        self._out += zmtp.GREETING  # READY once the master's greeting is read
        return True

    def _handshake_done(self) -> None:
        self.connected = True
        self.connections += 1
        self.just_connected = True
        self._retry_s = RECONNECT_S
        self.failure = ""
        hello = bytearray(READY)
        if self._queued is not None:  # the first connection takes what waited for it
            for data in self._queued:
                hello += data
        self._queued = None
        self._out += hello

    # ---- a turn -------------------------------------------------------------------------------
    def on_ready(self, revents: int) -> list[list[bytes]]:
        """The socket was ready: connect, read, write. The whole messages that arrived;
        ``just_connected``, ``lost``, ``failure`` and ``oversized`` say what else happened."""
        self.just_connected, self.lost = False, ""
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
                self._drop(reconnect=True, why=f"the master's connection failed: {e}")
                return
            if not chunk:
                self._drop(reconnect=True, why="the master's connection closed")
                return
            try:
                messages.extend(wire.feed(chunk))
            except zmtp.MechanismError as e:
                self.failure = f"{e}: the master runs with aclEnable, and this slave has no keys"
                self._drop(reconnect=True, why=self.failure)
                return
            except zmtp.ZmtpError as e:
                self._drop(reconnect=True, why=f"the master broke ZMTP: {e}")
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
            self._drop(reconnect=True, why=f"the master's connection failed: {e}")
            return
        del self._out[:sent]

    # ---- sending ------------------------------------------------------------------------------
    def send(self, frames: tuple[bytes | memoryview, ...] | list[bytes]) -> bool:
        """A message to the master; False when it was dropped (no connection since one was
        lost, or the master has not read ``MAX_BUFFERED`` bytes)."""
        data = zmtp.encode(frames)
        if not self.connected:
            if self._queued is None or len(self._queued) >= MAX_QUEUED:
                return False
            self._queued.append(data)
            return True
        if len(self._out) + len(data) > MAX_BUFFERED:
            return False
        if self._out:
            self._out += data
            return True
        sock = self.sock
        assert sock is not None
        try:
            sent = sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as e:
            self._drop(reconnect=True, why=f"the master's connection failed: {e}")
            return False
        if sent < len(data):
            self._out += memoryview(data)[sent:]
        return True

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

    def close(self) -> None:
        self._drop(reconnect=False)
