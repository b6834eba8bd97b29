"""Loop participants (``common/broker/loop.py``): the request server's I/O thread drives other sockets.

A probe participant records which thread calls it; a fake slave (a DEALER speaking the HA
protocol, played by the test) shows the master's HA service served by the I/O thread itself:
a SYNC put is answered from the ack in the I/O thread's own pass (no mailbox wake), never
before the ack, a refused send is retried by the loop alone, and a role's stop or a promotion
detaches or attaches the service at runtime. Without a server it runs on a thread of its own.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers.brokers import addr, free_port
from helpers.fake_slave import FakeSlave, ha_service
from helpers.fake_store import FakeStore
from helpers.zmq_sockets import bounded_socket

from common.broker.broker import Broker
from common.broker.loop import ParticipantThread
from common.broker.server import RequestServer
from common.client import Admin, Producer
from common.core.config import load_config
from common.core.errors import SendStatus
from common.core.message import Message
from master.ha_service import HaService

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def wait_for(cond: Callable[[], Any], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


class Probe:
    """A participant with one PULL socket; counts calls and the threads they came on."""

    def __init__(self, timeout_ms: int | None = None, fail_in: str = "") -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.sock = bounded_socket(self.ctx, zmq.PULL)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.calls: collections.Counter[str] = collections.Counter()
        self.threads: set[str] = set()
        self.received: list[bytes] = []
        self.wake: Callable[[], None] | None = None
        self.closed = threading.Event()
        self._timeout_ms = timeout_ms
        self._fail_in = fail_in

    def _note(self, name: str) -> None:
        self.calls[name] += 1
        self.threads.add(threading.current_thread().name)
        if name == self._fail_in:
            raise RuntimeError(f"probe fails in {name}")

    def bind(self, wake: Callable[[], None]) -> None:
        self.wake = wake
        self._note("bind")

    def poll_items(self) -> tuple[tuple[zmq.Socket[Any], int], ...]:
        return ((self.sock, zmq.POLLIN),)

    def on_events(self, sock: zmq.Socket[Any], events: int) -> None:
        assert sock is self.sock and events & zmq.POLLIN
        while True:
            try:
                self.received.append(sock.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
        self._note("on_events")

    def after_burst(self) -> None:
        self._note("after_burst")

    def timeout_ms(self) -> int | None:
        return self._timeout_ms

    def on_timer(self) -> None:
        self._note("on_timer")

    def close(self) -> None:
        self.calls["close"] += 1
        self.threads.add(threading.current_thread().name)
        self.sock.close(0)
        self.closed.set()

    def push(self, payload: bytes) -> None:
        with bounded_socket(self.ctx, zmq.PUSH) as push:
            push.setsockopt(zmq.LINGER, 1000)
            push.connect(self.endpoint)
            push.send(payload)

    def term(self) -> None:
        self.ctx.term()


@pytest.fixture
def probes() -> Iterator[list[Probe]]:
    made: list[Probe] = []
    yield made
    for p in made:
        if not p.closed.is_set():
            p.close()
        p.term()


def test_server_drives_a_participant_on_its_io_thread(
    make_broker: Callable[..., Broker], probes: list[Probe]
) -> None:
    broker = make_broker()
    probe = Probe(timeout_ms=20)
    probes.append(probe)
    broker.server.attach(probe)
    wait_for(lambda: probe.calls["bind"] == 1, "bind")
    probe.push(b"hello")
    wait_for(lambda: probe.received == [b"hello"], "the probe's socket to be served")
    wait_for(lambda: probe.calls["on_timer"] >= 2, "on_timer at the probe's timeout")
    before = probe.calls["after_burst"]
    with Producer([addr(broker)]) as p:
        assert p.send("t", b"x", queue_id=0).status == SendStatus.SEND_OK
    wait_for(lambda: probe.calls["after_burst"] > before, "after_burst after a request burst")
    before = probe.calls["after_burst"]
    assert probe.wake is not None
    threading.Thread(target=probe.wake).start()  # a wake from another thread
    wait_for(lambda: probe.calls["after_burst"] > before, "after_burst after a wake")
    assert broker.server.detach(probe, 5.0)
    assert probe.closed.is_set() and probe.calls["close"] == 1  # closed before detach returned
    assert probe.threads == {"replog-io"}
    with Producer([addr(broker)]) as p:  # still serving, and no longer calling the probe
        calls = sum(probe.calls.values())
        assert p.send("t", b"y", queue_id=0).status == SendStatus.SEND_OK
    assert sum(probe.calls.values()) == calls
    assert broker.server.detach(probe, 5.0)  # twice is fine


def test_a_failing_participant_is_closed_and_the_server_keeps_serving(
    make_broker: Callable[..., Broker], probes: list[Probe]
) -> None:
    broker = make_broker()
    probe = Probe(fail_in="on_events")
    probes.append(probe)
    broker.server.attach(probe)
    probe.push(b"boom")
    wait_for(probe.closed.is_set, "the failing probe to be closed")
    with Producer([addr(broker)]) as p:
        assert p.send("t", b"x", queue_id=0).status == SendStatus.SEND_OK
    assert broker.server.detach(probe, 1.0)


def test_the_loop_end_closes_participants_and_refuses_new_ones(tmp_path: Path) -> None:
    cfg = load_config(None, (), env={}, listenPort=free_port(), storePathRootDir=str(tmp_path))
    server = RequestServer(cfg, types.SimpleNamespace(store=FakeStore()))  # type: ignore[arg-type]
    early, late = Probe(), Probe()
    try:
        server.attach(early)  # before start: taken over when the loop starts
        server.start()
        wait_for(lambda: early.calls["bind"] == 1, "bind on start")
        server.stop()
        assert early.closed.is_set() and early.threads == {"replog-io"}
        assert server.detach(early, 1.0)
        with pytest.raises(RuntimeError):
            server.attach(late)
    finally:
        late.close()
        for p in (early, late):
            p.term()


def test_participant_thread_hosts_one_participant(probes: list[Probe]) -> None:
    host = ParticipantThread("probe-host")
    probe = Probe(timeout_ms=10)
    probes.append(probe)
    host.attach(probe)
    probe.push(b"a")
    wait_for(lambda: probe.received == [b"a"], "the probe's socket to be served")
    wait_for(lambda: probe.calls["on_timer"] >= 2, "timers")
    assert probe.wake is not None
    probe.wake()
    wait_for(lambda: probe.calls["after_burst"] >= 1, "after_burst after a wake")
    assert host.detach(probe, 5.0)
    assert probe.closed.is_set() and probe.threads == {"probe-host"}


# ---- the master's HA service on the I/O thread ------------------------------------------------


def in_sync(broker: Broker) -> Callable[[], bool]:
    return lambda: ha_service(broker).in_sync_count() == 1


def test_sync_put_is_answered_from_the_ack_in_the_io_threads_own_pass(
    make_broker: Callable[..., Broker],
) -> None:
    broker = make_broker(brokerRole="SYNC_MASTER", slaveTimeout=300)
    service = ha_service(broker)
    slave = FakeSlave(broker)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        slave.hello()
        wait_for(in_sync(broker), "the fake slave in sync")
        with Producer([addr(broker)], retries=0) as p:
            stats = broker.server.stats
            posted, inline = stats.wakes_posted, stats.wakes_inline
            fut = pool.submit(p.send, "t", b"x" * 100, queue_id=0)
            data = slave.data()  # streamed at once after the put's burst
            end = data.phy_offset + len(data.data)
            assert end == broker.store.phy
            assert not fut.done()  # nothing answers a SYNC put before an ack covers it
            slave.ack(end - 1)  # not enough
            wait_for(lambda: service.acked_offset_quorum(1) == end - 1, "the partial ack")
            assert not fut.done()
            slave.ack(end)
            assert fut.result(5).status == SendStatus.SEND_OK
            assert stats.wakes_posted == posted and stats.wakes_inline > inline
            # no ack at all: FLUSH_SLAVE_TIMEOUT, and never before slaveTimeout
            started = time.monotonic()
            late = p.send("t", b"y", queue_id=0)
            assert late.status == SendStatus.FLUSH_SLAVE_TIMEOUT
            assert time.monotonic() - started >= 0.3
            assert slave.data().phy_offset == end  # it was streamed, just not acked
        names = {t.name for t in threading.enumerate()}
        assert "replog-ha-service" not in names  # no thread of its own next to a server
        assert service._loop_ident == broker.server._io_ident
    finally:
        pool.shutdown()
        slave.close()


def free_to_bind(port: int) -> bool:
    ctx: zmq.Context[Any] = zmq.Context()
    sock = bounded_socket(ctx, zmq.ROUTER)
    try:
        sock.bind(f"tcp://127.0.0.1:{port}")
        return True
    except zmq.ZMQError:
        return False
    finally:
        sock.close(0)
        ctx.term()


def test_role_stop_detaches_and_closes_the_ha_socket(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(brokerRole="SYNC_MASTER")
    service = ha_service(broker)
    wait_for(lambda: service in broker.server._participants, "attached")
    assert not free_to_bind(broker.cfg.ha_port)
    assert broker.role is not None
    broker.role.stop()  # returns once the socket is closed on the I/O thread
    assert service not in broker.server._participants
    assert free_to_bind(broker.cfg.ha_port)
    with Admin([addr(broker)]) as a:  # the server goes on
        assert a.status(addr(broker))["role"] == "SYNC_MASTER"


def test_promotion_attaches_the_ha_service_to_the_running_server(
    make_broker: Callable[..., Broker],
) -> None:
    broker = make_broker(brokerRole="SLAVE", brokerId=1, haMasterAddress="127.0.0.1:1")
    assert not len(broker.server._participants)
    with Admin([addr(broker)]) as a:
        assert a.promote(addr(broker), role="SYNC_MASTER")["role"] == "SYNC_MASTER"
    service = ha_service(broker)
    slave = FakeSlave(broker)
    try:
        reply = slave.hello()  # answered by the running server's I/O thread
        assert reply.epoch == service.epoch
        wait_for(in_sync(broker), "the fake slave in sync")
        assert service._loop_ident == broker.server._io_ident
        with Producer([addr(broker)], retries=0) as p:
            fut = concurrent.futures.ThreadPoolExecutor(1).submit(p.send, "t", b"z", queue_id=0)
            data = slave.data()
            slave.ack(data.phy_offset + len(data.data))
            assert fut.result(5).status == SendStatus.SEND_OK
    finally:
        slave.close()
    assert broker.role is not None
    broker.role.stop()
    assert not len(broker.server._participants)


def test_a_parked_send_is_retried_by_the_loop_alone(make_broker: Callable[..., Broker]) -> None:
    """EAGAIN parks the DATA frame in the peer's backlog; the I/O thread retries it with no
    other traffic. (Only the CURVE ROUTER says EAGAIN, and retries on POLLOUT; the plain port
    this broker has never does, and its backlog, forced here, is retried by the timer.)"""
    broker = make_broker(brokerRole="SYNC_MASTER")
    service = ha_service(broker)
    slave = FakeSlave(broker)
    real = service._try_send
    refusals = [3]

    def flaky(sock: zmq.Socket[Any], action: Any) -> str:
        if refusals[0] > 0:
            refusals[0] -= 1
            service.stats.eagain += 1
            return "again"  # what a full peer queue says under ROUTER_MANDATORY
        return real(sock, action)

    try:
        slave.hello()
        wait_for(in_sync(broker), "the fake slave in sync")
        service._try_send = flaky  # type: ignore[method-assign]
        with Producer([addr(broker)], retries=0) as p:
            fut = concurrent.futures.ThreadPoolExecutor(1).submit(p.send, "t", b"q", queue_id=0)
            data = slave.data()
            assert refusals == [0] and service.stats.eagain >= 3
            wait_for(lambda: not service._backlog, "the backlog emptied")
            slave.ack(data.phy_offset + len(data.data))
            assert fut.result(5).status == SendStatus.SEND_OK
    finally:
        slave.close()


def test_without_a_server_the_ha_service_runs_on_a_thread_of_its_own(tmp_path: Path) -> None:
    cfg = load_config(None, (), env={}, haListenPort=free_port(), storePathRootDir=str(tmp_path))
    store = FakeStore()
    service = HaService(cfg, store, "ASYNC_MASTER")
    service.start()
    slave = FakeSlave(types.SimpleNamespace(cfg=cfg))  # type: ignore[arg-type]
    try:
        assert "replog-ha-service" in {t.name for t in threading.enumerate()}
        slave.hello()
        wait_for(lambda: service.in_sync_count() == 1, "the fake slave in sync")
        store.put_nowait(Message("t", b"m"), 0)  # appended on this thread: the listener wakes
        for listener in store.append_listeners:
            listener(store.phy)
        data = slave.data()
        assert (data.phy_offset, data.phy_offset + len(data.data)) == (0, store.phy)
    finally:
        slave.close()
        service.stop()
    assert "replog-ha-service" not in {t.name for t in threading.enumerate()}
    assert free_to_bind(cfg.ha_port)
