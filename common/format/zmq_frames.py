"""Sending multipart messages without pyzmq's per-frame enum arithmetic.

``Socket.send_multipart`` computes ``zmq.SNDMORE | flags`` for every frame but the last; both
are ``enum.Flag`` members, so each ``|`` runs enum's Python-level ``__or__`` (about 0.6 us
here), and so does ``mask & zmq.POLLIN`` on a poll result. On the hot paths (every answer the
broker sends, every request, every replication frame) we use plain ``int`` flags instead:
``send_frames`` is ``send_multipart(frames, zmq.NOBLOCK)`` with the same semantics (the first
frame decides: zmq.Again or an error there means nothing was sent; once it is queued, the
rest of the message is too), 6.2 -> 4.3 us for a 3-frame send and receive on this VM; and it
calls pyzmq's compiled ``send`` itself, not the Python method in front of it.

Loops that drain a socket ask ``readable(sock)`` before each ``recv``: a ``recv`` on an empty
socket raises ``zmq.Again``, whose construction costs about 3 us here, against 1 us for reading
``ZMQ_EVENTS``; every burst ends that way, so every request paid it.

``peer_address(frame)``: who sent a message received with ``copy=False``, as RocketMQ takes a
channel's remote address: the IP from the message's ``Peer-Address`` metadata, the port from the
connection's descriptor (``ZMQ_SRCFD``, deprecated in libzmq 4.3 but served; ``getpeername`` on
a duplicate of it), kept only when that descriptor's peer has the same IP (it could have been
closed and reused meanwhile); else 0. ``("0.0.0.0", 0)`` when there is no peer address (not
TCP).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any, cast

import zmq

NOBLOCK = int(zmq.NOBLOCK)
SNDMORE_NOBLOCK = int(zmq.SNDMORE) | NOBLOCK
POLLIN = int(zmq.POLLIN)
POLLOUT = int(zmq.POLLOUT)
EVENTS = int(zmq.EVENTS)

Frame = bytes | memoryview | zmq.Frame
# pyzmq's compiled send: ``zmq.Socket.send`` is a Python method in front of it (for the
# DRAFT routing_id and group arguments), one more call per frame
_SEND = zmq.backend.Socket.send


def send_frames(sock: zmq.Socket[Any], frames: Sequence[Frame], first: Frame | None = None) -> None:
    """``first`` (a ROUTER's peer identity, if given) then ``frames``, as one message, without
    blocking; raises zmq.Again (nothing sent) when the socket cannot take it now."""
    if not frames:
        raise ValueError("a message needs at least one frame besides the identity")
    send = _SEND
    if first is not None:
        send(sock, first, SNDMORE_NOBLOCK)
    last = len(frames) - 1
    for i in range(last):
        send(sock, frames[i], SNDMORE_NOBLOCK)
    send(sock, frames[last], NOBLOCK)


def readable(sock: zmq.Socket[Any]) -> bool:
    """Whether a whole message waits in ``sock`` (``ZMQ_EVENTS``: level-triggered, and it also
    processes the socket's pending commands, as a ``recv`` would)."""
    return bool(sock.getsockopt(EVENTS) & POLLIN)  # type: ignore[operator]  # an int


def recv_rest(sock: zmq.Socket[Any], first: zmq.Frame) -> list[bytes]:
    """The frames after ``first`` (received with ``copy=False``) of the same message, as
    bytes, without blocking: each read uncopied and its ``more`` flag taken from the frame.
    ``recv_multipart`` asks ``ZMQ_RCVMORE`` after every frame, and pyzmq's ``getsockopt`` maps
    the option through its enum in Python each time: 9.7 -> 5.3 us for a 3-frame request here.
    A message's frames are all there once its first is (ZeroMQ delivers it whole)."""
    frames = []
    more = first.more
    recv = sock.recv
    while more:
        frame = recv(NOBLOCK, copy=False)
        frames.append(frame.bytes)
        more = frame.more
    return frames


def recv_message(sock: zmq.Socket[Any], flags: int = NOBLOCK) -> list[bytes]:
    """A whole message as bytes (``recv_multipart(flags)``, through ``recv_rest``); raises
    zmq.Again as ``recv`` does (nothing was taken)."""
    first = sock.recv(flags, copy=False)
    return [first.bytes, *recv_rest(sock, first)]


def recv_buffers(sock: zmq.Socket[Any], flags: int = NOBLOCK) -> list[memoryview]:
    """A whole message as memoryviews of its frames, uncopied (``recv_multipart(flags,
    copy=False)`` and each frame's ``buffer``, without the per-frame ``ZMQ_RCVMORE``): a slave's
    replicated bytes go to its log from libzmq's buffer. Raises zmq.Again as ``recv`` does."""
    frame = sock.recv(flags, copy=False)
    out = [frame.buffer]
    recv = sock.recv
    while frame.more:
        frame = recv(NOBLOCK, copy=False)
        out.append(frame.buffer)
    return out


UNKNOWN_PEER = ("0.0.0.0", 0)


def peer_address(frame: zmq.Frame) -> tuple[str, int]:
    """(ip, port) of the connection ``frame`` came over (see the module docstring)."""
    try:
        ip = frame.get("Peer-Address")
    except zmq.ZMQError:
        return UNKNOWN_PEER
    if not isinstance(ip, str) or not ip:
        return UNKNOWN_PEER
    port = 0
    try:
        fd = os.dup(cast(int, frame.get(zmq.SRCFD)))
    except (OSError, zmq.ZMQError, AttributeError):
        return ip, port
    try:
        conn = socket.socket(fileno=fd)  # owns the duplicate from here
    except OSError:
        os.close(fd)
        return ip, port
    with conn:
        try:
            peer = conn.getpeername()
        except OSError:
            return ip, port  # closed meanwhile, or not a connected socket any more
    if isinstance(peer, tuple) and peer[0] == ip:
        port = int(peer[1])
    return ip, port
