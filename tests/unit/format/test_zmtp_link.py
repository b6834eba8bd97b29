"""A DEALER's side of ZMTP on a plain socket (common/format/zmtp_link.py), against the broker's
own port (common/broker/tcp_port.py) and raw sockets, polled as its owners poll it: a message
sent before the connection waits for it (the slave's), or is refused (the client's); the
port's PING answered; a lost connection reported, sends dropped until the next handshake, which
is reported; a refused connection retried with a growing interval; a peer speaking CURVE a
handshake failure; a message past the bounds reported and the next one read; the greeting
first; the heartbeat: an idle connection pinged, a silent one dropped."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
import zmq

from common.broker.tcp_port import TcpPort
from common.format import zmtp
from common.format import zmtp_link as ha_link
from common.format.zmtp_link import ZmtpLink

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class Rig:
    """A master's port and a link to it, pumped in turn as their two threads would."""

    def __init__(self, max_bytes: int = 10_000, **options: Any) -> None:
        self.port = TcpPort("tcp://127.0.0.1:0", 2, 10_000, {}, keep_silent=True)
        self.link = ZmtpLink(f"127.0.0.1:{self.port.port}", 2, max_bytes, **options)
        self.at_master: list[tuple[bytes, list[bytes]]] = []
        self.at_slave: list[list[bytes]] = []
        self.connected = 0
        self.lost: list[str] = []

    def turn(self) -> None:
        self.port.serve(lambda identity, frames: self.at_master.append((identity, frames)))
        link = self.link
        link.tick(time.monotonic())
        fd = link.fileno()
        if fd is not None:
            poller = zmq.Poller()
            poller.register(fd, link.events())
            events = dict(poller.poll(5))
            if fd in events:
                self.at_slave.extend(link.on_ready(events[fd]))
        self.connected += link.just_connected
        link.just_connected = False
        if link.lost:
            self.lost.append(link.lost)
            link.lost = ""

    def pump(self, until: Callable[[], Any], timeout_s: float = 10) -> None:
        deadline = time.monotonic() + timeout_s
        while not until():
            assert time.monotonic() < deadline, "timed out"
            self.turn()

    def close(self) -> None:
        self.link.close()
        self.port.shutdown(0)


def turn(link: ZmtpLink) -> None:
    """One poll of the link's socket (it has one), and its turn if it was ready."""
    fd = link.fileno()
    assert fd is not None
    poller = zmq.Poller()
    poller.register(fd, link.events())
    events = dict(poller.poll(100))
    if fd in events:
        link.on_ready(events[fd])


def test_a_message_sent_before_the_connection_waits_for_it_and_answers_come_back() -> None:
    rig = Rig()
    assert rig.link.send((b"hello",))  # no connection yet: queued, as in a DEALER's pipe
    rig.pump(lambda: rig.at_master)
    assert rig.connected == 1 and rig.link.connections == 1
    identity, frames = rig.at_master[0]
    assert frames == [b"hello"]
    rig.port.send(None, identity, [b"header", b"x" * 5000])
    rig.pump(lambda: rig.at_slave)
    assert rig.at_slave == [[b"header", b"x" * 5000]]
    rig.close()


def test_the_ports_ping_is_answered() -> None:
    rig = Rig()
    rig.link.send((b"hello",))
    rig.pump(lambda: rig.at_master)
    (peer,) = rig.port.conns.values()
    rig.port.sweep(None, time.monotonic())
    rig.port.sweep(None, time.monotonic())  # silent two sweeps: pinged
    assert peer.silent == 2
    rig.pump(lambda: peer.silent == 0)  # the link's PONG
    rig.close()


def test_a_lost_connection_is_reported_sends_dropped_until_the_next_handshake() -> None:
    rig = Rig()
    rig.link.send((b"first",))
    rig.pump(lambda: rig.at_master)
    identity = rig.at_master[0][0]
    rig.port.close(None, identity, "test")  # the master ends the connection
    rig.pump(lambda: rig.lost)
    assert rig.lost == ["the peer closed the connection"]
    assert not rig.link.connected
    assert not rig.link.send((b"while down",))  # dropped: the client counts it, re-sends
    rig.pump(lambda: rig.connected == 2)
    assert rig.link.send((b"second",))
    rig.pump(lambda: len(rig.at_master) == 2)
    assert rig.at_master[1][1] == [b"second"] and rig.at_master[1][0] != identity
    rig.close()


def test_a_refused_connection_is_retried_with_a_growing_interval() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nobody listens there now
    link = ZmtpLink(f"127.0.0.1:{port}", 2, 10_000)
    gaps = []
    for _ in range(6):
        while link.fileno() is None:  # the next attempt's time
            time.sleep(max(0.0, link.next_attempt - time.monotonic()))
            link.connect_if_due(time.monotonic())
        poller = zmq.Poller()
        poller.register(link.fileno(), link.events())
        events = dict(poller.poll(5000))
        assert events, "a refused connect is reported at once"
        started = time.monotonic()
        link.on_ready(events[link.fileno()])  # type: ignore[index]
        assert link.fileno() is None and not link.lost  # never established: nothing lost
        gaps.append(link.next_attempt - started)
    first, most = ha_link.RECONNECT_S, ha_link.RECONNECT_MAX_S
    expected = [min(most, first * 2 ** i) for i in range(6)]  # 0.1, 0.2, 0.4, 0.8, 1, 1
    assert gaps == [pytest.approx(e, abs=0.05) for e in expected]
    link.close()


def test_a_master_speaking_curve_is_a_handshake_failure() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        link = ZmtpLink(f"127.0.0.1:{server.getsockname()[1]}", 2, 10_000)
        link.connect_if_due(time.monotonic())
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"\xff" + bytes(8) + b"\x7f\x03\x01" + b"CURVE".ljust(20, b"\x00")
                         + bytes(32))
            deadline = time.monotonic() + 10
            while not link.failure:
                assert time.monotonic() < deadline
                turn(link)
            assert "aclEnable" in link.failure and link.fileno() is None
    link.close()


def test_a_message_past_the_bounds_is_reported_and_the_next_is_read() -> None:
    rig = Rig(max_bytes=1000)
    rig.link.send((b"hello",))
    rig.pump(lambda: rig.at_master)
    identity = rig.at_master[0][0]
    rig.port.send(None, identity, [b"h", b"x" * 5000])
    rig.port.send(None, identity, [b"h", b"small"])
    rig.pump(lambda: rig.at_slave)
    assert rig.at_slave == [[b"h", b"small"]]
    (what,) = rig.link.oversized
    assert what.size == 5001 and "bytes" in what.reason
    assert rig.link.connected  # the connection serves on
    rig.close()


def test_the_greeting_goes_first_and_ready_after_the_masters(monkeypatch: Any) -> None:
    """libzmq's ROUTER refuses a READY sent before it has sent the rest of its greeting."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        link = ZmtpLink(f"127.0.0.1:{server.getsockname()[1]}", 2, 10_000)
        link.send((b"queued",))
        link.connect_if_due(time.monotonic())
        conn, _ = server.accept()
        with conn:
            conn.settimeout(5)
            got = b""
            while len(got) < zmtp.GREETING_BYTES:
                turn(link)
                conn.setblocking(False)
                try:
                    got += conn.recv(4096)
                except BlockingIOError:
                    pass
            assert got == zmtp.GREETING  # nothing more before the master's greeting
            conn.sendall(zmtp.SERVER_HELLO)
            while not link.connected:
                turn(link)
            conn.setblocking(True)
            rest = b""
            want = ha_link.READY + zmtp.encode([b"queued"])
            while len(rest) < len(want):
                rest += conn.recv(4096)
            assert rest == want
    link.close()


def test_without_queue_first_nothing_waits_for_a_connection() -> None:
    rig = Rig(queue_first=False)
    assert not rig.link.send((b"early",))  # ZMQ_IMMEDIATE: refused, the caller keeps it
    rig.pump(lambda: rig.connected == 1)
    assert rig.link.writable and rig.link.send((b"now",))
    rig.pump(lambda: rig.at_master)
    assert [frames for _, frames in rig.at_master] == [[b"now"]]
    rig.close()


def test_the_heartbeat_pings_an_idle_connection_and_drops_a_silent_one() -> None:
    rig = Rig(queue_first=False, heartbeat_s=0.1)
    rig.pump(lambda: rig.connected == 1)
    rig.pump(lambda: rig.port.conns and all(
        p.wire.state == zmtp.TRAFFIC for p in rig.port.conns.values()))
    quiet_until = time.monotonic() + 0.5  # five beats: pinged, the port's PONGs keep it
    rig.pump(lambda: time.monotonic() >= quiet_until)
    assert rig.lost == [] and rig.link.connected
    # just after a PING, the next work is a beat away (the PONG may take its time): no busy
    # loop on a poll timeout of zero while it is awaited
    now = time.monotonic()
    rig.link.tick(now + 0.1)
    wait_s = rig.link.timeout_s(now + 0.1)
    assert wait_s is not None and wait_s >= 0.05
    # a peer that stops answering (a cut network): nothing read from it any more
    fd = rig.link.fileno()
    started = time.monotonic()
    while not rig.lost:
        assert time.monotonic() - started < 5
        rig.link.tick(time.monotonic())
        if rig.link.lost:
            rig.lost.append(rig.link.lost)
        time.sleep(0.01)
    assert rig.lost == ["the peer was silent for 0.3 s"] and fd is not None
    assert time.monotonic() - started == pytest.approx(0.3, abs=0.2)
    rig.close()
