"""The client port's budget (common/broker/tcp_port.py ``PortBudget``), for all its peers
together: a peer that does not read its answers is no longer read nor served past its share
(its requests wait, then are served in order once it reads); past the port's total the peer
holding the most is closed; connections past the cap are closed as they come."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from common.broker import tcp_port
from common.broker.tcp_port import PortBudget, TcpPort
from common.core.config import BrokerConfig
from common.core.errors import ConfigError
from common.format import zmtp

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

MIB = 1024 * 1024


def pump(port: TcpPort, handle: Callable[[bytes, list[bytes]], None],
         until: Callable[[], bool], timeout_s: float = 10) -> None:
    """Serve the port as the request loop does until ``until()``."""
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, "timed out"
        port.serve(handle)
        if time.monotonic() >= port.next_sweep:
            port.sweep(None, time.monotonic())
        time.sleep(0.002)


def raw_peer(port: TcpPort) -> socket.socket:
    """A ZMTP DEALER on a plain socket with a small receive buffer (it reads only when told)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port.port))
    sock.sendall(zmtp.GREETING + zmtp.ready(b"DEALER"))
    return sock


def test_a_peer_that_does_not_read_is_held_back_then_served_in_order() -> None:
    budget = PortBudget(max_connections=16, peer_bytes=1 * MIB, total_bytes=64 * MIB)
    port = TcpPort("tcp://127.0.0.1:0", 4, 10_000, {}, budget=budget)
    served: list[bytes] = []
    answer = b"a" * (256 * 1024)

    def handle(identity: bytes, frames: list[bytes]) -> None:
        served.append(frames[0])
        port.send(None, identity, [frames[0], answer])

    peer = raw_peer(port)
    try:
        requests = [b"req%04d" % i for i in range(200)]
        peer.sendall(b"".join(zmtp.encode([r]) for r in requests))  # pipelined, never read
        pump(port, handle, lambda: port.figures()["clientPeersWaiting"] == 1)
        until = time.monotonic() + 0.5
        while time.monotonic() < until:  # held back: nothing more is served
            port.serve(handle)
            time.sleep(0.005)
        assert port.buffered <= budget.peer_bytes + len(answer) + 64
        assert 0 < len(served) < len(requests)
        assert port.peers_held_back >= 1
        peer.settimeout(0.05)
        received = 0
        deadline = time.monotonic() + 20
        while len(served) < len(requests) or port.buffered:  # it reads: the rest is served
            assert time.monotonic() < deadline, (len(served), port.buffered)
            try:
                received += len(peer.recv(1 << 20))
            except TimeoutError:
                pass
            port.serve(handle)
        assert served == requests  # every one, in order
        assert port.figures()["clientPeersWaiting"] == 0
    finally:
        peer.close()
        port.shutdown(0)


def test_past_the_total_the_peer_holding_the_most_is_closed() -> None:
    budget = PortBudget(max_connections=16, peer_bytes=4 * MIB, total_bytes=12 * MIB)
    port = TcpPort("tcp://127.0.0.1:0", 4, 10_000, {}, budget=budget)
    asked: list[bytes] = []
    peers = [raw_peer(port) for _ in range(3)]
    try:
        for i, p in enumerate(peers):
            p.sendall(zmtp.encode([b"ask%d" % i]))
        pump(port, lambda identity, _frames: asked.append(identity), lambda: len(asked) == 3)
        for _ in range(8):  # far more than the total, to peers that do not read
            for identity in asked:
                port.send(None, identity, [b"x" * (3 * MIB)])
        assert port.buffered <= budget.total_bytes
        assert port.peers_closed_over_budget >= 1
        assert len(port.conns) < 3
        assert port.figures()["clientBufferedBytes"] == port.buffered
    finally:
        for p in peers:
            p.close()
        port.shutdown(0)


def test_connections_past_the_cap_are_closed_as_they_come() -> None:
    budget = PortBudget(max_connections=3, peer_bytes=MIB, total_bytes=4 * MIB)
    port = TcpPort("tcp://127.0.0.1:0", 4, 10_000, {}, budget=budget)
    socks: list[Any] = []
    try:
        socks = [socket.create_connection(("127.0.0.1", port.port), timeout=10)
                 for _ in range(5)]
        pump(port, lambda *_: None, lambda: port.connections_refused == 2)
        assert len(port.conns) == 3
        ended = 0
        for s in socks:
            s.settimeout(2)
            data = s.recv(64)  # the port's greeting, or the close of a refused one
            ended += data == b""
        assert ended == 2
        for s in socks[:2]:
            s.close()
        pump(port, lambda *_: None, lambda: len(port.conns) == 1)
        late = socket.create_connection(("127.0.0.1", port.port), timeout=10)
        socks.append(late)
        pump(port, lambda *_: None, lambda: any(p.address[1] == late.getsockname()[1]
                                                for p in port.conns.values()))
    finally:
        for s in socks:
            s.close()
        port.shutdown(0)


def test_the_budget_is_config_keys_with_sane_defaults() -> None:
    cfg = BrokerConfig()
    budget = PortBudget.from_config(cfg)
    assert budget.max_connections >= 1024 and budget.peer_bytes <= budget.total_bytes
    assert budget.total_bytes <= 512 * MIB
    bad = BrokerConfig(clientBufferBytes=MIB, clientPeerBufferBytes=2 * MIB)
    with pytest.raises(ConfigError, match="clientBufferBytes"):
        bad.validate()


def test_a_peer_gets_a_quota_of_requests_a_turn_and_the_others_theirs() -> None:
    budget = PortBudget(max_connections=16, peer_bytes=MIB, total_bytes=8 * MIB)
    port = TcpPort("tcp://127.0.0.1:0", 4, 10_000, {}, budget=budget)
    turns: list[list[bytes]] = []
    busy, other = raw_peer(port), raw_peer(port)
    try:
        pump(port, lambda *_: None, lambda: len(port.conns) == 2
             and all(p.wire.state == zmtp.TRAFFIC for p in port.conns.values()))
        requests = [b"r%04d" % i for i in range(1000)]  # one chunk of cheap requests
        busy.sendall(b"".join(zmtp.encode([r]) for r in requests))
        other.sendall(zmtp.encode([b"other"]))
        deadline = time.monotonic() + 10
        while sum(len(t) for t in turns) < len(requests) + 1:
            assert time.monotonic() < deadline
            turn: list[bytes] = []
            port.serve(lambda _identity, frames, turn=turn: turn.append(frames[0]))
            if turn:
                turns.append(turn)
        assert max(sum(f != b"other" for f in t) for t in turns) <= tcp_port.TURN_REQUESTS
        served = [f for t in turns for f in t]
        assert [f for f in served if f != b"other"] == requests  # in order
        assert served.index(b"other") <= 2 * tcp_port.TURN_REQUESTS  # not behind all of them
        assert port.peers_held_back == 0  # a quota is not a hold for unread answers
    finally:
        busy.close()
        other.close()
        port.shutdown(0)
