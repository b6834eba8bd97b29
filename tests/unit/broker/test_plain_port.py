"""The HA port's connections (common/broker/plain_port.py) over a real STREAM socket, with
libzmq DEALERs as the peers: greeting, messages, bounds, PING/PONG, the heartbeat sweep (a
silent peer pinged and kept, one stuck in its greeting closed), answers to a gone peer."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from common.broker.plain_port import SILENT_SWEEPS, PlainPort
from common.format import zmtp

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class Rig:
    def __init__(self, ctx: zmq.Context[Any]):
        self.ctx = ctx
        self.server = ctx.socket(zmq.STREAM)
        self.server.setsockopt(zmq.LINGER, 0)
        PlainPort.configure(self.server, sndhwm=1000)
        self.port_number = self.server.bind_to_random_port("tcp://127.0.0.1")
        self.peers: dict[bytes, tuple[str, int]] = {}
        self.port = PlainPort(4, 10_000, self.peers)
        self.messages: list[tuple[bytes, list[bytes]]] = []

    def dealer(self) -> zmq.Socket[Any]:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://127.0.0.1:{self.port_number}")
        return sock

    def pump(self, until: Any, timeout_s: float = 10) -> None:
        """Serve the socket as the request loop does until ``until()`` is true."""
        deadline = time.monotonic() + timeout_s
        while not until():
            assert time.monotonic() < deadline, "timed out"
            if not self.server.poll(20):
                continue
            identity = self.server.recv()
            data = self.server.recv(copy=False)
            for frames in self.port.receive(self.server, identity, data):
                self.messages.append((identity, frames))

    def ready(self) -> bool:
        return any(p.wire.state == zmtp.TRAFFIC for p in self.port.conns.values())


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    c: zmq.Context[Any] = zmq.Context()
    yield c
    c.destroy(linger=0)


def test_a_dealer_is_greeted_served_and_answered(ctx: zmq.Context[Any]) -> None:
    rig = Rig(ctx)
    client = rig.dealer()
    client.send_multipart([b"header", b"body"])
    rig.pump(lambda: rig.messages)
    [(identity, frames)] = rig.messages
    assert frames == [b"header", b"body"]
    assert rig.peers[identity][0] == "127.0.0.1" and rig.peers[identity][1] > 0
    rig.port.send(rig.server, identity, [b"answer", b"x" * 300])
    assert client.poll(5000) and client.recv_multipart() == [b"answer", b"x" * 300]


def test_a_message_past_the_bounds_waits_in_dropped_and_the_next_is_served(
        ctx: zmq.Context[Any]) -> None:
    rig = Rig(ctx)
    client = rig.dealer()
    client.send_multipart([b"head"] + [b"f"] * 10)
    client.send_multipart([b"next"])
    rig.pump(lambda: rig.messages)
    assert [frames for _, frames in rig.messages] == [[b"next"]]
    [(identity, dropped)] = rig.port.dropped
    assert identity == rig.messages[0][0]
    assert dropped.head == b"head" and dropped.frames == 11 and rig.port.oversized == 1


def test_a_peer_breaking_the_protocol_is_closed_and_forgotten(ctx: zmq.Context[Any]) -> None:
    rig = Rig(ctx)
    with socket.create_connection(("127.0.0.1", rig.port_number), timeout=10) as raw:
        raw.sendall(b"\xff" + bytes(8) + b"\x7f\x03\x01" + b"CURVE".ljust(20, b"\x00")
                    + bytes(32))
        rig.pump(lambda: rig.port.protocol_errors == 1)
        raw.settimeout(0.05)
        greeting, closed = b"", False
        deadline = time.monotonic() + 10
        while not closed and time.monotonic() < deadline:
            rig.server.poll(10)  # the socket's owner goes on: libzmq ends the pipe there
            try:
                chunk = raw.recv(4096)
            except TimeoutError:
                continue
            closed = not chunk
            greeting += chunk
        assert closed and greeting.startswith(zmtp.GREETING)
    assert rig.port.conns == {} and rig.peers == {}


def test_a_silent_peer_is_pinged_and_answers(ctx: zmq.Context[Any]) -> None:
    rig = Rig(ctx)
    client = rig.dealer()
    rig.pump(rig.ready)
    (peer,) = rig.port.conns.values()
    rig.port.sweep(rig.server, time.monotonic())
    rig.port.sweep(rig.server, time.monotonic())  # silent two sweeps: pinged
    rig.pump(lambda: peer.silent == 0)  # libzmq's PONG (no heartbeat set on the DEALER)
    client.close()


def test_the_ha_port_keeps_a_silent_slave_but_not_a_peer_stuck_in_its_greeting(
        ctx: zmq.Context[Any]) -> None:
    rig = Rig(ctx)
    slave = rig.dealer()  # kept: a collected socket would close its connection
    rig.pump(rig.ready)
    with socket.create_connection(("127.0.0.1", rig.port_number), timeout=10) as stuck:
        stuck.sendall(b"\xff")
        rig.pump(lambda: len(rig.port.conns) == 2)
        for _ in range(SILENT_SWEEPS + 3):
            rig.port.sweep(rig.server, time.monotonic())
        [(kept)] = rig.port.conns.values()
        assert kept.wire.state == zmtp.TRAFFIC
    slave.close()


def test_an_answer_to_a_gone_peer_raises_before_anything_is_sent(ctx: zmq.Context[Any]) -> None:
    rig = Rig(ctx)
    with pytest.raises(zmq.ZMQError) as e:
        rig.port.send(rig.server, b"\x00gone", [b"answer"])
    assert e.value.errno == zmq.EHOSTUNREACH
    client = rig.dealer()  # and the socket serves on
    client.send(b"ok")
    rig.pump(lambda: rig.messages)
