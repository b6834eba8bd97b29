"""A blocking call's own connection without libzmq: a plain TCP socket speaking ZMTP 3.1 with
the NULL mechanism, the wire a DEALER speaks, to a broker's plain port (no ``aclEnable``).

Why: a blocking call on a DEALER crosses libzmq's I/O thread twice each way (the request
handed to it, the answer handed back through the socket's mailbox), four thread wake-ups a
round trip on top of the broker's. Here the calling thread writes the request and reads the
answer itself: one ``send`` and one ``recv``. A sync send one at a time went from 6.7k/s to
13.9k/s against the same broker in one interleaved run (docs/benchmarks.md, issue 43).

What a call sees is what the DEALER path gives (``Transport.call_sync``):
- a broker that is not listening yet is retried every ``RECONNECT_S`` until the call's
  deadline (a DEALER queues the request until it connects): ClientTimeoutError, and nothing
  was sent; one whose connection was lost (killed, restarting) is given ``down_wait_s`` to take
  a connection again, then the call ends with ConnectionLostError (a DEALER's DOWN_WAIT_S), so
  a client moves on from a killed master in a second;
- a connection that drops while a call waits ends it at once (ConnectionLostError: retriable,
  outcome unknown); one the broker closed between two calls (its port closes a connection
  silent for about 5 s: this side answers the port's PINGs only when it next calls) is found
  before the next request goes out, and that call connects anew;
- at its deadline a call closes its connection (no answer to it can come later on another
  call's connection) and raises ClientTimeoutError;
- answers to earlier, timed-out calls are skipped by opaque, as are frames that are not an
  answer (``decode_response`` refuses them);
- a broker that speaks CURVE (``aclEnable``) is a HandshakeError: this client has no keys.
  Clients with keys use DEALERs, whose CURVE is libzmq's.

The ZMTP is ``common/format/zmtp.py``'s, the broker's own: a connection's greeting and READY
read and checked, frames bounded as they arrive, a PING answered.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Sequence

from common.client.results import ClientTimeoutError, ConnectionLostError, HandshakeError
from common.format import zmtp
from common.format.protocol import Limits, ProtocolError, Response, decode_response

RECONNECT_S = 0.1  # a refused connect is tried again this often (a DEALER's RECONNECT_IVL)
WAIT_SLICE_MS = 100  # a blocking recv or send returns this often to look at the deadline
RECV_BYTES = 64 * 1024  # below glibc's mmap threshold: a recv's buffer is a heap block
READY = zmtp.ready(b"DEALER")
_GONE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def _timeval(ms: int) -> bytes:
    return struct.pack("ll", ms // 1000, (ms % 1000) * 1000)


class PlainConnection:
    """One thread's connection to one broker; not shared between threads (``close`` aside,
    which any thread may call: a recv blocked in it ends)."""

    __slots__ = ("_hello", "_slice_ms", "_wire", "address", "down", "down_wait_s", "limits",
                 "sock")

    def __init__(self, address: str, limits: Limits, down: dict[str, float],
                 down_wait_s: float):
        self.address = address
        self.limits = limits
        # address -> when a connection to it was lost (the transport's, every thread's): a
        # broker known down is given ``down_wait_s`` to take a connection again, then the call
        # ends (ConnectionLostError), as a DEALER whose connection dropped does; one never
        # reached is waited for until the call's deadline (a DEALER queues the request)
        self.down = down
        self.down_wait_s = down_wait_s
        self.sock: socket.socket | None = None
        self._wire: zmtp.Connection | None = None
        self._hello = b""  # our READY, sent with the connection's first request
        self._slice_ms = WAIT_SLICE_MS

    # ---- the connection -----------------------------------------------------------------
    def _connect(self, deadline: float, stopping: Callable[[], bool], timeout_ms: int) -> None:
        host, _, port = self.address.rpartition(":")
        host = host.strip("[]")
        lost = self.address in self.down
        give_up = min(deadline, time.monotonic() + self.down_wait_s) if lost else deadline
        while True:
            left = give_up - time.monotonic()
            if left <= 0 or stopping():
                if lost and not stopping() and time.monotonic() < deadline:
                    raise ConnectionLostError(self.address)
                raise ClientTimeoutError(self.address, timeout_ms)
            try:  # in slices: a dropped SYN waits out one, then the deadline is looked at
                sock = socket.create_connection((host, int(port)),
                                                timeout=min(left, WAIT_SLICE_MS * 10 / 1000))
                break
            except OSError:  # refused, unreachable, not resolved: tried again, as libzmq does
                time.sleep(min(RECONNECT_S, max(0.0, give_up - time.monotonic())))
        self.down.pop(self.address, None)
        sock.settimeout(None)  # blocking; the waits are bounded by SO_RCVTIMEO/SO_SNDTIMEO
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(WAIT_SLICE_MS))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(WAIT_SLICE_MS))
        self.sock, self._slice_ms = sock, WAIT_SLICE_MS
        wire = self._wire = zmtp.Connection(self.limits.max_batch_count + 2,
                                            self.limits.max_frame_bytes)
        # the greeting first, and READY only once the broker's greeting is read: libzmq (a
        # ROUTER) refuses a READY that comes before it has sent the rest of its greeting
        # (HANDSHAKE_FAILED_PROTOCOL, "unexpected command"); replog's own port takes either
        try:
            sock.sendall(zmtp.GREETING)
            while not wire.greeted:
                self._read(sock, wire, deadline, timeout_ms)
        except BaseException:
            self.close()
            raise
        self._hello = READY

    def _alive(self, sock: socket.socket, wire: zmtp.Connection) -> bool:
        """Whether the broker kept the connection since the last call, reading what came
        meanwhile: late answers to timed-out calls (dropped), the broker's PINGs (answered;
        its port closes a connection silent for about 5 s, so one idle longer is found closed
        here and the call connects anew), its close (b"")."""
        while True:
            try:
                data = sock.recv(RECV_BYTES, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not data:
                return False
            try:
                wire.feed(data)  # no call is waiting: whatever it completes is stale
            except zmtp.ZmtpError:
                return False
            if wire.replies:
                replies, wire.replies = wire.replies, []
                try:
                    sock.sendall(b"".join(replies))
                except OSError:
                    return False
            wire.oversized.clear()

    def _lost(self) -> None:
        """The broker ended an established connection (closed, reset): known down until a
        connection is made again."""
        self.down.setdefault(self.address, time.monotonic())
        self.close()

    def close(self) -> None:
        sock, self.sock, self._wire = self.sock, None, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked in another thread
            except OSError:
                pass
            sock.close()

    # ---- a call -----------------------------------------------------------------------------
    def send(self, frames: Sequence[bytes], deadline: float, stopping: Callable[[], bool],
             timeout_ms: int) -> None:
        """The request out, connecting first if there is no live connection."""
        if self.sock is not None and self._wire is not None and \
                not self._alive(self.sock, self._wire):
            self._lost()
        if self.sock is None:
            self._connect(deadline, stopping, timeout_ms)
        sock = self.sock
        assert sock is not None
        data = memoryview(self._hello + zmtp.encode(frames)) if self._hello else \
            memoryview(zmtp.encode(frames))
        self._hello = b""
        while data:
            try:
                sent = sock.send(data)
            except BlockingIOError:  # SO_SNDTIMEO: the broker reads slowly
                if time.monotonic() >= deadline:
                    self.close()
                    raise ClientTimeoutError(self.address, timeout_ms) from None
                continue
            except _GONE:
                self._lost()
                raise ConnectionLostError(self.address) from None
            data = data[sent:]

    def answer(self, opaque: int, deadline: float, timeout_ms: int,
               spin_until: float = 0.0) -> Response | None:
        """The answer to ``opaque``, waited for up to ``deadline`` (monotonic); with
        ``spin_until`` (perf_counter), read without sleeping until then, and None if it has not
        come by then."""
        sock, wire = self.sock, self._wire
        assert sock is not None and wire is not None
        while True:
            for message in self._read(sock, wire, deadline, timeout_ms, spin_until):
                try:
                    resp = decode_response(message, self.limits)
                except ProtocolError:
                    continue
                if resp.opaque == opaque:
                    if self._slice_ms != WAIT_SLICE_MS:  # the next call waits as usual
                        self._slice_ms = WAIT_SLICE_MS
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                                        _timeval(WAIT_SLICE_MS))
                    return resp
            if spin_until and time.perf_counter() >= spin_until:
                return None

    def _read(self, sock: socket.socket, wire: zmtp.Connection, deadline: float,
              timeout_ms: int, spin_until: float = 0.0) -> list[list[bytes]]:
        """The whole messages the next bytes complete (maybe none); the connection closed and
        the call's error raised when the broker closed it, broke the protocol or the deadline
        passed."""
        try:
            if spin_until:
                try:
                    data = sock.recv(RECV_BYTES, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    return []
            else:
                data = sock.recv(RECV_BYTES)
        except BlockingIOError:  # SO_RCVTIMEO: a slice without an answer
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                self.close()
                raise ClientTimeoutError(self.address, timeout_ms) from None
            if left_ms < self._slice_ms:  # the last slice ends at the deadline
                self._slice_ms = max(1, left_ms)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(self._slice_ms))
            return []
        except OSError:  # reset, or closed under us by Transport.close
            self._lost()
            raise ConnectionLostError(self.address) from None
        if not data:  # the broker closed the connection: nothing sent on it is answered
            self._lost()
            raise ConnectionLostError(self.address)
        try:
            messages = wire.feed(data)
        except zmtp.MechanismError as e:
            self.close()
            raise HandshakeError(self.address, False, f"{e}: the broker runs with "
                                 "aclEnable, and this client has no keys") from None
        except zmtp.ZmtpError:
            self.close()
            raise ConnectionLostError(self.address) from None
        if wire.replies:  # PONGs
            replies, wire.replies = wire.replies, []
            try:
                sock.sendall(b"".join(replies))
            except OSError:
                self.close()
                raise ConnectionLostError(self.address) from None
        if wire.oversized:  # an answer past the client's bounds: not one it can read
            self.close()
            raise ConnectionLostError(self.address)
        return messages
