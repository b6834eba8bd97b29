"""A port without CURVE (``aclEnable`` off) on its loop thread's own TCP sockets: the client
port and the HA port. The connections are accepted, read and written here, with
``common/format/zmtp.py`` speaking ZMTP 3.1 (NULL) to each, so no libzmq thread stands between
a request (or a slave's ack) and the broker's loop.

Why: a ZMQ_STREAM socket hands each chunk from libzmq's I/O thread to the broker's through a
pipe and a mailbox, and each answer back the same way: two thread wake-ups a request on top of
the client's. A ZMTP echo in Python answered 2.3-4.6x as many requests a second on its own
sockets as through a STREAM socket, in one interleaved run (docs/benchmarks.md).

Why ZMTP read here and not a ROUTER: libzmq keeps every frame of a multipart message until its
last has arrived and bounds only each frame, so through a ROUTER one unauthenticated peer could
make the broker hold gigabytes (160 frames of 4 MiB took a broker from 40 MiB to 680 MiB).
Here:
- a whole message is bounded before any of it is kept (``zmtp.Connection``), a message past the
  bounds read to its end and dropped, for the caller to refuse (``dropped``), and a peer that
  breaks ZMTP closed;
- each connection has a routing identity (5 bytes, never reused), its address in ``peers`` (the
  server's BORNHOST look-up), its greeting and READY sent as it connects;
- the heartbeat sweep: a peer silent since the last sweep is pinged, one silent for
  ``SILENT_SWEEPS`` sweeps closed (with ``keep_silent``, the HA port's, only one that has not
  finished its greeting: a paused slave goes on where it stopped, and the HA protocol's own
  timeouts judge it); TCP keepalive finds connections whose host is gone;
- an answer to a peer that is gone is dropped; without a budget (the HA port) so is one to a
  peer that does not read past ``MAX_BUFFERED`` bytes (a ROUTER's SNDHWM: the answer dropped,
  the connection kept).

The client port has a ``PortBudget`` that holds for all its peers together (``PortBudget``'s
docstring): connections past ``max_connections`` are closed as they are accepted; a peer whose
unsent answers reach ``peer_bytes`` (or, once every peer's together reach ``total_bytes``, any
peer with answers waiting) is no longer read, and its requests already read wait in ``held``,
unserved, until it has read its answers (``admit``: the request server asks before serving
each); past ``total_bytes`` the peer holding the most is closed. Each is counted
(``figures``) and logged. A peer that reads nothing stays silent, so the sweep closes it. And
at most ``TURN_REQUESTS`` of a peer's requests are served a turn, the rest held for the next
(``release_due``: the loop does not sleep meanwhile), so one chunk of cheap requests does not
hold the loop from the other peers.

The I/O thread registers the port (its epoll's descriptor) in its poller and calls ``serve``
when it is readable: each ready connection is read once (at most ``RECV_BYTES``) per call, so
one busy client cannot hold the loop, and accepted, flushed or closed there. ``send`` may also
run on a thread serving a local call under the loop's turn lock (``RequestServer._serve_local``):
the loop is then in its poll, and an answer that cannot leave at once is left to the loop's next
turn (the epoll's POLLOUT wakes it).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import select
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from common.core.logs import log_event
from common.format import zmtp

SWEEP_S = 1.0
SILENT_SWEEPS = 5  # a peer silent this many sweeps in a row (about 5 s) is closed
RECV_BYTES = 64 * 1024
ACCEPT_BURST = 64  # connections accepted a turn
MAX_BUFFERED = 256 * 1024 * 1024  # bytes waiting for a peer that reads slowly; more is dropped
LISTEN_BACKLOG = 512
TURN_REQUESTS = 128  # with a budget: a peer's requests served a turn; the rest wait for the next
REFUSAL_LOG_S = 1.0  # refused connections, held-back peers: one log line at most this often
_IN, _INOUT = select.EPOLLIN, select.EPOLLIN | select.EPOLLOUT

log = logging.getLogger("replog.server")


class ZmtpPort(Protocol):
    """What ``feed_chunk`` needs of a port (``TcpPort``; a test's stand-in)."""

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


def parse_endpoint(endpoint: str) -> tuple[str, int, socket.AddressFamily]:
    """``tcp://host:port`` (``*`` for every address, ``[v6]`` for IPv6) as a bind address."""
    if not endpoint.startswith("tcp://"):
        raise ValueError(f"{endpoint}: not a tcp:// endpoint")
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    family = socket.AF_INET
    if host.startswith("["):
        host, family = host.strip("[]"), socket.AF_INET6
    if host in ("*", ""):
        host = "::" if family == socket.AF_INET6 else "0.0.0.0"
    return host, int(port), family


@dataclasses.dataclass(frozen=True)
class PortBudget:
    """What a port's peers may take, all together: connections at once; unsent answers per
    peer before its requests wait (``peer_bytes``: reading resumes once it has read below
    half); unsent answers of every peer together before each peer with answers waiting is
    no longer read, and past which the peer holding the most is closed (``total_bytes``)."""

    max_connections: int
    peer_bytes: int
    total_bytes: int

    @classmethod
    def from_config(cls, cfg: Any) -> PortBudget:
        return cls(cfg.clientMaxConnections, cfg.clientPeerBufferBytes, cfg.clientBufferBytes)


class TcpPeer:
    """One connection: its socket, identity, ZMTP state, address, silence, what waits to
    be written, the requests read but held back (its answers unread) and its epoll mask."""

    __slots__ = ("address", "held", "identity", "mask", "out", "silent", "sock", "turn",
                 "unread", "wire")

    def __init__(self, sock: socket.socket, identity: bytes, wire: zmtp.Connection,
                 address: tuple[str, int]):
        self.sock = sock
        self.identity = identity
        self.wire = wire
        self.address = address
        self.silent = 0
        self.out = bytearray()
        self.held: collections.deque[list[bytes]] = collections.deque()
        self.mask = _IN
        self.turn = 0  # the port's turn in which it was last read or released
        self.unread = False  # held back for answers it has not read (counted once)


class TcpPort:
    """A listening socket, its connections and an epoll over them, owned by the I/O thread."""

    def __init__(self, endpoint: str, max_frames: int, max_bytes: int,
                 peers: dict[bytes, tuple[str, int]], keep_silent: bool = False,
                 budget: PortBudget | None = None):
        self.budget = budget
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.peers = peers
        self.keep_silent = keep_silent  # the HA port: a silent peer past its greeting stays
        self.conns: dict[bytes, TcpPeer] = {}
        self._by_fd: dict[int, TcpPeer] = {}
        self._ids = itertools.count(1)
        self.next_sweep = 0.0
        self.protocol_errors = 0
        self.oversized = 0
        self.answers_dropped = 0  # to peers with MAX_BUFFERED waiting already
        self.dropped: list[tuple[bytes, zmtp.Oversized]] = []
        # the budget's figures: unsent bytes of every peer, peers held back (not read), and
        # counts of connections refused, peers held back and peers closed over the budget
        self.buffered = 0
        self._waiting: dict[bytes, TcpPeer] = {}
        self.connections_refused = 0
        self.peers_held_back = 0
        self.peers_closed_over_budget = 0
        self._refusal_logged = float("-inf")
        self._held_logged = float("-inf")
        self.release_due = False  # serve even with nothing ready: held peers may go on
        self._turn = 0  # serve calls: a peer gets one quota of requests a turn
        host, port, family = parse_endpoint(endpoint)
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(LISTEN_BACKLOG)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._epoll = select.epoll()
        self._epoll.register(listener.fileno(), _IN)

    def fileno(self) -> int:
        """The epoll's descriptor: readable when a connection or the listener is ready."""
        return self._epoll.fileno()

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    # ---- the loop's turn --------------------------------------------------------------------
    def serve(self, handle: Callable[[bytes, list[bytes]], None],
              burst: list[tuple[bytes, list[bytes]]] | None = None) -> None:
        """What is ready now: connections accepted, bytes read (``handle(identity, frames)``
        for each whole message, or, given ``burst``, each appended to it as ``(identity,
        frames)``, for the caller to serve together), waiting answers written, the closed
        forgotten."""
        listener_fd = self._listener.fileno()
        self._turn += 1
        self.release_due = False
        for fd, events in self._epoll.poll(0):
            if fd == listener_fd:
                self._accept()
                continue
            peer = self._by_fd.get(fd)
            if peer is None:
                continue
            if events & select.EPOLLOUT and peer.out:
                self._flush(peer)
                if peer.identity not in self.conns:
                    continue
            if peer.mask & _IN:
                if events & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                    self._read(peer, handle, burst)
            elif events & (select.EPOLLHUP | select.EPOLLERR):  # held back, and gone
                self._drop(peer)
        if self._waiting:
            self._release(handle, burst)

    def _accept(self) -> None:
        for _ in range(ACCEPT_BURST):
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors, ...: the next turn tries again
                log_event(log, "accept_failed", logging.WARNING, error=str(e))
                return
            if self.budget is not None and len(self.conns) >= self.budget.max_connections:
                self._refuse_connection(sock, address)
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 60)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 6)
            identity = b"\x00" + (next(self._ids) & 0xFFFFFFFF).to_bytes(4, "big")
            peer = TcpPeer(sock, identity, zmtp.Connection(self.max_frames, self.max_bytes),
                           (address[0], address[1]))
            self.conns[identity] = peer
            self._by_fd[sock.fileno()] = peer
            self.peers[identity] = peer.address
            self._epoll.register(sock.fileno(), _IN)
            self.write(None, identity, zmtp.SERVER_HELLO)

    def _read(self, peer: TcpPeer, handle: Callable[[bytes, list[bytes]], None],
              burst: list[tuple[bytes, list[bytes]]] | None) -> None:
        try:
            chunk = peer.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset
            self._drop(peer)
            return
        if not chunk:  # the peer closed
            self._drop(peer)
            return
        peer.silent = 0
        peer.turn = self._turn
        identity = peer.identity
        messages = feed_chunk(self, None, identity, peer.wire, chunk)
        if self.budget is None:
            if burst is not None:
                burst.extend([(identity, frames) for frames in messages])
                return
            for frames in messages:
                handle(identity, frames)
            return
        quota = TURN_REQUESTS  # so one peer's chunk of cheap requests cannot hold the turn
        for frames in messages:  # each asked first: one answer may put the peer over
            if peer.held or quota <= 0 or self._over(peer):
                peer.held.append(frames)
            elif burst is not None:
                burst.append((identity, frames))
                quota -= 1
            else:
                handle(identity, frames)
                quota -= 1
        if peer.held:
            self._hold_back(peer)

    # ---- the budget ---------------------------------------------------------------------------
    def _over(self, peer: TcpPeer) -> bool:
        """Whether the peer's unsent answers are past its share of the budget."""
        budget = self.budget
        if budget is None or not peer.out:
            return False
        return len(peer.out) >= budget.peer_bytes or self.buffered >= budget.total_bytes

    def admit(self, identity: bytes) -> bool:
        """Whether a request of a burst from ``identity`` may be served now; False: the peer's
        answers wait unread past its share (``hold_rest`` then keeps it and its later ones)."""
        peer = self.conns.get(identity)
        return peer is None or not self._over(peer)

    def hold_rest(self, identity: bytes, frames: list[bytes],
                  rest: list[tuple[bytes, list[bytes]]]) -> list[tuple[bytes, list[bytes]]]:
        """``admit`` refused ``frames``: it and the peer's later requests in the rest of the
        burst go back before what the peer has held (its requests are served in order); the
        others' are returned."""
        peer = self.conns.get(identity)
        if peer is None:
            return rest
        mine = [frames, *(f for who, f in rest if who == identity)]
        peer.held.extendleft(reversed(mine))
        self._hold_back(peer)
        return [entry for entry in rest if entry[0] != identity]

    def _hold_back(self, peer: TcpPeer) -> None:
        """Stop reading the peer: it has requests held (past its share, or its turn's)."""
        if peer.identity not in self._waiting:
            self._waiting[peer.identity] = peer
            self._rearm(peer)
        if not self._over(peer):  # only its turn's quota: served again next turn
            self.release_due = True
            return
        if peer.unread:
            return
        peer.unread = True
        self.peers_held_back += 1
        now = time.monotonic()
        if now - self._held_logged >= REFUSAL_LOG_S:  # one line a second at most
            self._held_logged = now
            log_event(log, "peer_held_back", logging.INFO, reason="answers not read",
                      peer=f"{peer.address[0]}:{peer.address[1]}", waiting_bytes=len(peer.out),
                      port_bytes=self.buffered, held_back=self.peers_held_back)

    def _release(self, handle: Callable[[bytes, list[bytes]], None],
                 burst: list[tuple[bytes, list[bytes]]] | None) -> None:
        """Serve the held requests of peers that have read their answers (below half their
        share, and the port below its total), in order, at most a turn's quota each, and read
        them again once none is left."""
        budget = self.budget
        assert budget is not None
        if self.buffered >= budget.total_bytes:
            return
        for identity, peer in list(self._waiting.items()):
            if self.conns.get(identity) is not peer:
                self._waiting.pop(identity, None)
                continue
            if len(peer.out) * 2 >= budget.peer_bytes:
                continue
            if peer.turn == self._turn:  # its quota served this turn already
                self.release_due = True
                continue
            peer.turn = self._turn
            held = peer.held
            for _ in range(min(TURN_REQUESTS, len(held))):
                if burst is not None:  # asked again (admit) as the burst is served
                    burst.append((identity, held.popleft()))
                elif self._over(peer):
                    break
                else:
                    handle(identity, held.popleft())
            if self.conns.get(identity) is not peer:
                continue
            if held:
                if not self._over(peer):
                    self.release_due = True  # the rest next turn
            elif not self._over(peer):
                self._waiting.pop(identity, None)
                peer.unread = False
                self._rearm(peer)

    def _rearm(self, peer: TcpPeer) -> None:
        mask = (0 if peer.identity in self._waiting else _IN) \
            | (select.EPOLLOUT if peer.out else 0)
        if mask != peer.mask:
            peer.mask = mask
            self._epoll.modify(peer.sock.fileno(), mask)

    def _over_total(self) -> None:
        """Past the port's total: close the peers holding the most until it is below."""
        budget = self.budget
        assert budget is not None
        while self.buffered > budget.total_bytes and self.conns:
            victim = max(self.conns.values(), key=lambda p: len(p.out))
            self.peers_closed_over_budget += 1
            self.close(None, victim.identity, f"not reading its answers: {len(victim.out)} "
                       f"bytes waiting, {self.buffered} for every peer together "
                       f"(clientBufferBytes {budget.total_bytes})")

    def _refuse_connection(self, sock: socket.socket, address: Any) -> None:
        """A connection past ``max_connections``: closed at once, logged once a second."""
        self.connections_refused += 1
        sock.close()
        now = time.monotonic()
        if now - self._refusal_logged >= REFUSAL_LOG_S:
            self._refusal_logged = now
            assert self.budget is not None
            log_event(log, "connection_refused", logging.WARNING,
                      reason=f"{len(self.conns)} connections (clientMaxConnections)",
                      peer=f"{address[0]}:{address[1]}", refused=self.connections_refused)

    def figures(self) -> dict[str, int]:
        """The port's budget figures, for status and metrics."""
        return {"clientConnections": len(self.conns),
                "clientBufferedBytes": self.buffered,
                "clientPeersWaiting": len(self._waiting),
                "clientConnectionsRefused": self.connections_refused,
                "clientPeersHeldBack": self.peers_held_back,
                "clientPeersClosedOverBudget": self.peers_closed_over_budget,
                "clientAnswersDropped": self.answers_dropped}

    # ---- writing ------------------------------------------------------------------------------
    def send(self, _sock: object, identity: bytes,
             frames: Sequence[bytes | memoryview]) -> bool:
        """One message to a peer, framed here; False when it was dropped (the peer is gone, or
        reads too slowly)."""
        return self.write(None, identity, zmtp.encode(frames))

    def write(self, _sock: object, identity: bytes, data: bytes) -> bool:
        """Bytes to a peer, in order; False when they were dropped (the peer is gone, or has
        ``MAX_BUFFERED`` waiting already)."""
        peer = self.conns.get(identity)
        if peer is None:
            return False  # gone since it asked: nobody to tell (a ROUTER's EHOSTUNREACH)
        if peer.out:  # behind already: in order, after what waits
            if self.budget is None and len(peer.out) + len(data) > MAX_BUFFERED:
                self.answers_dropped += 1
                log_event(log, "answer_dropped", logging.WARNING, reason="peer not reading",
                          peer=f"{peer.address[0]}:{peer.address[1]}")
                return False
            peer.out += data
            self.buffered += len(data)
        else:
            try:
                sent = peer.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:  # reset: its reading side finds it closed
                return False
            if sent == len(data):
                return True
            peer.out += memoryview(data)[sent:]
            self.buffered += len(data) - sent
            self._rearm(peer)
        if self.budget is not None and self.buffered > self.budget.total_bytes:
            self._over_total()
            return self.conns.get(identity) is peer
        return True

    def _flush(self, peer: TcpPeer) -> None:
        try:
            sent = peer.sock.send(peer.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(peer)
            return
        del peer.out[:sent]
        self.buffered -= sent
        if sent:
            peer.silent = 0  # it reads: alive, though held back and sending nothing
        if not peer.out:
            self._rearm(peer)

    # ---- ending connections -------------------------------------------------------------------
    def _drop(self, peer: TcpPeer) -> None:
        """Forget a connection that ended, and close its socket."""
        if self.conns.get(peer.identity) is not peer:
            return
        del self.conns[peer.identity]
        self.peers.pop(peer.identity, None)
        self._waiting.pop(peer.identity, None)
        self.buffered -= len(peer.out)
        fd = peer.sock.fileno()
        self._by_fd.pop(fd, None)
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):
            pass
        peer.sock.close()

    def close(self, _sock: object, identity: bytes, reason: str) -> None:
        """Disconnect a peer."""
        peer = self.conns.get(identity)
        if peer is None:
            return
        log_event(log, "peer_closed", logging.INFO, reason=reason,
                  peer=f"{peer.address[0]}:{peer.address[1]}")
        self._drop(peer)

    def forget(self, identity: bytes) -> None:
        peer = self.conns.get(identity)
        if peer is not None:
            self._drop(peer)

    def sweep(self, _sock: object, now: float) -> None:
        """Once a second: ping the peers silent since the last sweep, close the long silent
        (``keep_silent``: only one still in its greeting)."""
        self.next_sweep = now + SWEEP_S
        if self._waiting:  # a close may have brought the port below its total: look again
            self.release_due = True
        for identity, peer in list(self.conns.items()):
            peer.silent += 1
            if peer.silent > SILENT_SWEEPS and peer.wire.state != zmtp.TRAFFIC:
                self.close(None, identity, f"greeting unfinished for {SILENT_SWEEPS} s")
            elif peer.silent > SILENT_SWEEPS and not self.keep_silent:
                self.close(None, identity, f"silent for {SILENT_SWEEPS} s")
            elif peer.silent > 1 and peer.wire.state == zmtp.TRAFFIC:
                self.write(None, identity, zmtp.PING)

    def shutdown(self, linger_ms: int) -> None:
        """Stop listening; answers still waiting get ``linger_ms`` to leave, then each
        connection is ended with a FIN (after what was written) and closed."""
        try:
            self._epoll.unregister(self._listener.fileno())
        except (OSError, ValueError):
            pass
        self._listener.close()
        deadline = time.monotonic() + linger_ms / 1000
        for peer in list(self.conns.values()):
            while peer.out and time.monotonic() < deadline:
                try:
                    del peer.out[:peer.sock.send(peer.out)]
                except (BlockingIOError, InterruptedError):
                    select.select([], [peer.sock], [], max(0.0, deadline - time.monotonic()))
                except OSError:
                    break
            try:
                peer.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self._drop(peer)
        self._epoll.close()
