"""The client port on the I/O thread's own TCP sockets (common/broker/tcp_port.py), served as
the request loop serves it (its epoll's descriptor in a zmq.Poller), with libzmq DEALERs and
raw sockets as the peers: greeting, messages, bounds, a protocol error, PING/PONG and the
sweep, an answer to a gone peer, a peer that does not read (the answer waits, then leaves), and
the shutdown that lets waiting answers leave before the FIN; the HA port's sweep, which keeps a
silent slave."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from helpers.zmq_sockets import bounded_socket

from common.broker import tcp_port
from common.broker.tcp_port import SILENT_SWEEPS, TcpPort, parse_endpoint
from common.format import zmtp

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class Rig:
    def __init__(self, ctx: zmq.Context[Any], max_frames: int = 4, keep_silent: bool = False):
        self.ctx = ctx
        self.peers: dict[bytes, tuple[str, int]] = {}
        self.port = TcpPort("tcp://127.0.0.1:0", max_frames, 10_000, self.peers,
                            keep_silent=keep_silent)
        self.poller = zmq.Poller()
        self.poller.register(self.port.fileno(), zmq.POLLIN)
        self.messages: list[tuple[bytes, list[bytes]]] = []

    def dealer(self) -> zmq.Socket[Any]:
        sock = bounded_socket(self.ctx, zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{self.port.port}")
        return sock

    def pump(self, until: Any, timeout_s: float = 10) -> None:
        """Serve the port as the request loop does until ``until()`` is true."""
        deadline = time.monotonic() + timeout_s
        while not until():
            assert time.monotonic() < deadline, "timed out"
            if dict(self.poller.poll(20)):
                self.port.serve(lambda identity, frames: self.messages.append((identity,
                                                                              frames)))

    def ready(self) -> bool:
        return any(p.wire.state == zmtp.TRAFFIC for p in self.port.conns.values())


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    c: zmq.Context[Any] = zmq.Context()
    yield c
    c.destroy(linger=0)


def test_endpoints_parse_as_libzmq_takes_them() -> None:
    assert parse_endpoint("tcp://0.0.0.0:10911")[:2] == ("0.0.0.0", 10911)
    assert parse_endpoint("tcp://*:5")[:2] == ("0.0.0.0", 5)
    assert parse_endpoint("tcp://[::1]:7") == ("::1", 7, socket.AF_INET6)
    with pytest.raises(ValueError):
        parse_endpoint("ipc:///tmp/x")


def test_a_port_already_taken_is_an_error_at_once(ctx: zmq.Context[Any]) -> None:
    rig = Rig(ctx)
    with pytest.raises(OSError):
        TcpPort(f"tcp://127.0.0.1:{rig.port.port}", 4, 10_000, {})
    rig.port.shutdown(0)


def test_a_dealer_is_greeted_served_and_answered(ctx: zmq.Context[Any]) -> None:
    rig = Rig(ctx)
    client = rig.dealer()
    client.send_multipart([b"header", b"body"])
    rig.pump(lambda: rig.messages)
    [(identity, frames)] = rig.messages
    assert frames == [b"header", b"body"]
    assert rig.peers[identity][0] == "127.0.0.1" and rig.peers[identity][1] > 0
    rig.port.send(None, identity, [b"answer", b"x" * 300])
    assert client.poll(5000) and client.recv_multipart() == [b"answer", b"x" * 300]
    rig.port.shutdown(1000)


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
    rig.port.shutdown(0)


def test_a_peer_breaking_the_protocol_is_closed_and_forgotten(ctx: zmq.Context[Any]) -> None:
    rig = Rig(ctx)
    with socket.create_connection(("127.0.0.1", rig.port.port), timeout=10) as raw:
        raw.sendall(b"\xff" + bytes(8) + b"\x7f\x03\x01" + b"CURVE".ljust(20, b"\x00")
                    + bytes(32))
        rig.pump(lambda: rig.port.protocol_errors == 1)
        raw.settimeout(5)
        greeting = b""
        while chunk := raw.recv(4096):
            greeting += chunk
        assert greeting.startswith(zmtp.GREETING)  # and then the connection ended
    assert rig.port.conns == {} and rig.peers == {}
    rig.port.shutdown(0)


def test_a_silent_peer_is_pinged_and_one_that_stays_silent_is_closed(
        ctx: zmq.Context[Any]) -> None:
    rig = Rig(ctx)
    client = rig.dealer()
    rig.pump(rig.ready)
    (peer,) = rig.port.conns.values()
    rig.port.sweep(None, time.monotonic())
    rig.port.sweep(None, time.monotonic())  # silent two sweeps: pinged
    rig.pump(lambda: peer.silent == 0)  # libzmq's PONG
    for _ in range(SILENT_SWEEPS + 1):
        rig.port.sweep(None, time.monotonic())  # nothing pumped: nothing heard
    assert rig.port.conns == {} and rig.peers == {}
    client.close()
    rig.port.shutdown(0)


def test_the_ha_port_keeps_a_silent_slave_but_not_a_peer_stuck_in_its_greeting(
        ctx: zmq.Context[Any]) -> None:
    rig = Rig(ctx, keep_silent=True)
    slave = rig.dealer()  # kept: a collected socket would close its connection
    rig.pump(rig.ready)
    with socket.create_connection(("127.0.0.1", rig.port.port), timeout=10) as stuck:
        stuck.sendall(b"\xff")
        rig.pump(lambda: len(rig.port.conns) == 2)
        for _ in range(SILENT_SWEEPS + 3):
            rig.port.sweep(None, time.monotonic())
        [kept] = rig.port.conns.values()
        assert kept.wire.state == zmtp.TRAFFIC
    slave.close()
    rig.port.shutdown(0)


def test_an_answer_to_a_gone_peer_is_dropped_and_the_port_serves_on(
        ctx: zmq.Context[Any]) -> None:
    rig = Rig(ctx)
    rig.port.send(None, b"\x00gone", [b"answer"])  # nobody: nothing raised, nothing sent
    client = rig.dealer()
    client.send(b"ok")
    rig.pump(lambda: rig.messages)
    client.close()
    rig.pump(lambda: not rig.port.conns)  # its close seen: forgotten
    rig.port.send(None, rig.messages[0][0], [b"late"])
    rig.port.shutdown(0)


def test_an_answer_to_a_peer_that_does_not_read_waits_and_leaves_in_order(
        ctx: zmq.Context[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers larger than the socket's buffers wait in the peer's buffer (POLLOUT wakes the
    loop) and leave whole and in order once the peer reads; one that would take the waiting
    bytes past MAX_BUFFERED is dropped, not the connection."""
    monkeypatch.setattr(tcp_port, "MAX_BUFFERED", 4 * 1024 * 1024)
    rig = Rig(ctx)
    client = rig.dealer()
    client.send(b"hello")
    rig.pump(lambda: rig.messages)
    identity = rig.messages[0][0]
    bodies = [bytes([i]) * (3 * 1024 * 1024) for i in range(6)]  # 18 MiB, nobody reading
    kept = [body for body in bodies if rig.port.send(None, identity, [body])]
    assert 1 <= len(kept) < len(bodies) and rig.port.answers_dropped == len(bodies) - len(kept)
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(got) < len(kept) and time.monotonic() < deadline:
        if dict(rig.poller.poll(10)):
            rig.port.serve(lambda *_: None)
        if client.poll(10):
            got.append(client.recv())
    assert got == kept  # whole, in order
    (peer,) = rig.port.conns.values()
    assert not peer.out and not client.poll(200)
    client.send(b"still")  # and the connection serves on
    rig.pump(lambda: len(rig.messages) == 2)
    rig.port.shutdown(0)


def test_the_shutdown_lets_waiting_answers_leave_then_ends_each_connection(
        ctx: zmq.Context[Any]) -> None:
    rig = Rig(ctx)
    raw = socket.create_connection(("127.0.0.1", rig.port.port), timeout=10)
    raw.sendall(zmtp.GREETING)
    rig.pump(lambda: len(rig.port.conns) == 1)
    raw.sendall(zmtp.ready(b"DEALER") + zmtp.encode([b"ask"]))
    rig.pump(lambda: rig.messages)
    body = b"z" * (6 * 1024 * 1024)  # more than the socket buffers hold
    rig.port.send(None, rig.messages[0][0], [body])
    received = bytearray()

    def read_all() -> None:
        while chunk := raw.recv(1 << 20):
            received.extend(chunk)

    import threading

    reader = threading.Thread(target=read_all)
    reader.start()
    rig.port.shutdown(5000)
    reader.join(10)
    assert not reader.is_alive()  # the FIN came
    assert bytes(received).endswith(body)  # after the whole answer
    raw.close()
