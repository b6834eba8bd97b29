"""ZeroMQ sockets a test makes by hand, every one bounded: LINGER 0, and a send or a receive
that no peer takes fails within its timeout, saying so, instead of blocking the run.

libzmq holds a blocking send for ever when no pipe can take the message: a DEALER whose
handshake failed (a plain client on a CURVE port, a wrong server key: the pipe goes once the
socket sees the failure) or whose peer's queue is full. Every test's socket comes from
``bounded_socket`` (held by tests/unit/test_raw_sockets.py), so the rule has one place.
"""

from __future__ import annotations

from typing import Any

import zmq

SEND_TIMEOUT_MS = 5000  # a send no pipe took in this time will not be taken
RECV_TIMEOUT_MS = 10_000  # tests wait for answers with poll(); a bare recv gets this long


class TimedOut(zmq.Again):
    """A blocking call's timeout, with what it waited for (``zmq.Again`` drops its message)."""

    def __init__(self, message: str):
        super().__init__()
        self.strerror = message


class SendTimedOut(TimedOut):
    """A blocking send no peer took in time (no handshake succeeded, or the queue is full)."""


class RecvTimedOut(TimedOut):
    """A blocking receive that nothing answered in time."""


class BoundedSocket(zmq.Socket[Any]):
    """``zmq.Socket`` whose blocking send and receive end at their timeouts with an error that
    names the socket and the wait; NOBLOCK calls raise ``zmq.Again`` as usual."""

    def send(self, data: Any, flags: int = 0, copy: bool = True,  # type: ignore[override]
             track: bool = False, **kwargs: Any) -> Any:
        try:
            return super().send(data, flags, copy=copy, track=track, **kwargs)
        except zmq.Again as e:
            if flags & zmq.NOBLOCK:
                raise
            raise SendTimedOut(f"{self._what()}: no peer took the send within "
                               f"{int(self.sndtimeo)} ms (no handshake succeeded, "
                               "or its queue is full)") from e

    def recv(self, flags: int = 0, copy: bool = True, track: bool = False) -> Any:
        try:
            return super().recv(flags, copy=copy, track=track)
        except zmq.Again as e:
            if flags & zmq.NOBLOCK:
                raise
            raise RecvTimedOut(f"{self._what()}: nothing to receive within "
                               f"{int(self.rcvtimeo)} ms") from e

    def _what(self) -> str:
        try:
            endpoint = self.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError:
            endpoint = "?"
        return f"{zmq.SocketType(int(self.type)).name} socket {endpoint or '(unbound)'}"


def bounded_socket(ctx: zmq.Context[Any], kind: int, send_timeout_ms: int = SEND_TIMEOUT_MS,
                   recv_timeout_ms: int = RECV_TIMEOUT_MS) -> BoundedSocket:
    """A socket of ``kind`` on ``ctx`` with LINGER 0 and both timeouts set (never infinite)."""
    assert send_timeout_ms > 0 and recv_timeout_ms > 0, "a test's socket waits a bounded time"
    sock = ctx.socket(kind, socket_class=BoundedSocket)
    sock.linger = 0
    sock.sndtimeo = send_timeout_ms
    sock.rcvtimeo = recv_timeout_ms
    return sock
