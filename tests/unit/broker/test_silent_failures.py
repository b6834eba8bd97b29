"""Failures that used to stay silent (issue 21, item 1): a dead thread or loop participant is
logged at ERROR, shown in ``status`` and the metrics, and answered.

* the master's HA service (a participant of the request server's I/O thread) that raises is
  restarted: new socket, new core, its slaves say HELLO again; meanwhile it reports no slave
  in sync, so a SYNC put is answered SLAVE_NOT_AVAILABLE at once instead of timing out;
* the slave's HA client thread that raises is restarted from its store (a new session);
* the client's I/O thread that dies fails every waiting call at once, and every later one.

The broker's own I/O thread ends the process with a non-zero status
(``tests/integration/test_io_thread_death.py``).
"""

from __future__ import annotations

import concurrent.futures
import errno
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers.brokers import addr
from helpers.replica_store import MemoryReplicaStore
from helpers.zmq_sockets import bounded_socket
from test_loop_participants import FakeSlave, Probe, ha_service, in_sync, probes, wait_for

from common.broker import loop
from common.broker.broker import Broker
from common.broker.loop import ParticipantThread
from common.broker.metrics import StatusCollector
from common.client import Producer
from common.client.transport import Transport
from common.core.config import load_config
from common.core.errors import BrokerError, SendStatus
from common.format.protocol import RequestCode
from common.ha.epochs import EpochEntry
from common.ha.protocol import Ack, Hello, HelloReply, Limits, decode, encode, encode_data
from slave.ha_client import HaClient

pytestmark = [pytest.mark.unit, pytest.mark.timeout(90)]

__all__ = ["probes"]  # the fixture, imported for the tests below


def errors_of(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.ERROR and f"event={event}" in r.getMessage()]


def samples(broker: Broker) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in StatusCollector(broker.snapshot).collect() for s in family.samples}


def test_a_dead_ha_service_is_logged_shown_and_restarted(
        make_broker: Callable[..., Broker], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    broker = make_broker(brokerRole="SYNC_MASTER", slaveTimeout=3000)
    slave = FakeSlave(broker)
    pool = concurrent.futures.ThreadPoolExecutor(1)
    caplog.set_level(logging.ERROR)
    try:
        slave.hello()
        wait_for(in_sync(broker), "the fake slave in sync")

        def unreadable(phy_offset: int, max_bytes: int) -> bytes:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(broker.store, "read_committed", unreadable)
        with Producer([addr(broker)], retries=0) as p:
            # streaming this put's bytes fails on the I/O thread: the service dies
            first = pool.submit(p.send, "t", b"x", queue_id=0)
            wait_for(lambda: errors_of(caplog, "participant_failed"), "the failure logged")
            # it reports no slave any more (a frozen core said in sync, and SYNC puts waited)
            wait_for(lambda: broker.status()["slaves"] == [], "no slave reported in sync")
            assert "haService" in errors_of(caplog, "participant_failed")[0]
            health = broker.status()["health"]["haService"]
            assert health["failures"] == 1 and "Input/output error" in health["lastError"]
            m = samples(broker)
            key = (("broker", broker.cfg.brokerName), ("component", "haService"),
                   ("id", str(broker.cfg.brokerId)))
            assert m[("replog_component_failures_total", key)] == 1
            monkeypatch.undo()  # the disk is back
            wait_for(lambda: broker.status()["health"]["haService"]["restarts"] >= 1,
                     "the service restarted")
            assert broker.status()["health"]["haService"]["state"] == "running"
            assert samples(broker)[("replog_component_up", key)] == 1
            # no slave has said HELLO to the new one: answered at once (a wait would end in
            # FLUSH_SLAVE_TIMEOUT at slaveTimeout)
            refused = p.send("t", b"y", queue_id=0)
            assert refused.status == SendStatus.SLAVE_NOT_AVAILABLE
            end_of_log = broker.store.phy
            # the slave's DEALER reconnects to the new socket; its HELLO is served again
            reply = slave.hello()
            assert reply.epoch == ha_service(broker).epoch
            catch_up(slave, broker.store.phy)  # the new core streams from the slave's offset
            wait_for(in_sync(broker), "the slave in sync again")
            done = pool.submit(p.send, "t", b"z", queue_id=0)
            wait_for(lambda: broker.store.phy > end_of_log, "the put appended")
            catch_up(slave, broker.store.phy)
            assert done.result(10).status == SendStatus.SEND_OK
            # the first put was held for the old core's ack: its answer is indeterminate
            assert first.result(10).status in (SendStatus.FLUSH_SLAVE_TIMEOUT, SendStatus.SEND_OK)
    finally:
        pool.shutdown()
        slave.close()


def catch_up(slave: FakeSlave, target: int) -> None:
    """Read what the master streams and ack it, up to ``target``."""
    end = -1
    while end < target:
        data = slave.data()
        end = data.phy_offset + len(data.data)
        slave.ack(end)


def test_a_participant_without_reopen_is_dropped_and_shown_failed(
        make_broker: Callable[..., Broker], probes: list[Probe],
        caplog: pytest.LogCaptureFixture) -> None:
    broker = make_broker()
    probe = Probe(fail_in="on_events")
    probes.append(probe)
    caplog.set_level(logging.ERROR)
    broker.server.attach(probe)
    probe.push(b"boom")
    wait_for(probe.closed.is_set, "the failing probe to be closed")
    health = broker.status()["health"]["Probe"]
    assert health["state"] == "failed" and health["failures"] == 1
    assert "probe fails in on_events" in health["lastError"]
    assert errors_of(caplog, "participant_failed")


class ReopenProbe(Probe):
    """A probe that fails once in ``on_events`` and can be reopened (a new socket)."""

    def __init__(self) -> None:
        super().__init__(fail_in="on_events")
        self.reopened = 0

    def reopen(self) -> None:
        self.reopened += 1
        self._fail_in = ""  # the cause is gone
        port = int(self.endpoint.rsplit(":", 1)[1])
        self.sock = bounded_socket(self.ctx, zmq.PULL)
        self.sock.bind(f"tcp://127.0.0.1:{port}")
        self.closed.clear()


def test_a_failed_participant_with_reopen_is_restarted_on_the_io_thread(
        make_broker: Callable[..., Broker], probes: list[Probe]) -> None:
    broker = make_broker()
    probe = ReopenProbe()
    probes.append(probe)
    broker.server.attach(probe)
    probe.push(b"boom")
    wait_for(lambda: probe.reopened == 1 and probe.calls["bind"] == 2, "the restart")
    assert broker.status()["health"]["ReopenProbe"]["state"] == "running"
    probe.push(b"after")
    wait_for(lambda: b"after" in probe.received, "the reopened socket served")
    assert probe.threads == {"replog-io"}
    assert broker.server.detach(probe, 5.0) and probe.closed.is_set()


def test_a_detach_cancels_a_pending_restart(
        make_broker: Callable[..., Broker], probes: list[Probe],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "RESTART_BACKOFF_S", 0.5)
    broker = make_broker()
    probe = ReopenProbe()
    probes.append(probe)
    broker.server.attach(probe)
    probe.push(b"boom")
    wait_for(lambda: broker.status()["health"]["ReopenProbe"]["state"] == "restarting",
             "the failure")
    assert broker.server.detach(probe, 5.0)  # within the back-off
    assert "ReopenProbe" not in broker.status()["health"]
    with Producer([addr(broker)]) as p:  # the loop goes on, past the restart's due time
        for _ in range(3):
            assert p.send("t", b"x", queue_id=0).status == SendStatus.SEND_OK
    deadline = time.monotonic() + 1.0  # twice the back-off: a restart would have run
    while time.monotonic() < deadline:
        assert probe.reopened == 0
        time.sleep(0.02)


def test_a_participant_thread_restarts_its_participant(probes: list[Probe]) -> None:
    host = ParticipantThread("probe-host")
    probe = ReopenProbe()
    probes.append(probe)
    host.attach(probe)
    probe.push(b"boom")
    wait_for(lambda: probe.reopened == 1, "the restart")
    probe.push(b"after")
    wait_for(lambda: b"after" in probe.received, "the reopened socket served")
    health = host.health()["ReopenProbe"]
    assert health["failures"] == 1 and health["restarts"] == 1
    assert host.detach(probe, 5.0) and probe.closed.is_set()


# ---- the slave's HA client thread --------------------------------------------------------------


class FlakyStore(MemoryReplicaStore):
    """Appends in memory; the second append raises what no store should (a bug)."""

    def __init__(self) -> None:
        super().__init__()
        self.appends = 0

    def append_replicated(self, phy_offset: int, data: bytes | memoryview,
                          generation: int | None = None) -> int:
        self.appends += 1
        if self.appends == 2:
            raise RuntimeError("a bug in the store")
        return super().append_replicated(phy_offset, data, generation)


def test_a_dead_ha_client_thread_is_logged_and_restarted_from_its_store(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    master = bounded_socket(ctx, zmq.ROUTER)
    master.setsockopt(zmq.RCVTIMEO, 10_000)
    port = master.bind_to_random_port("tcp://127.0.0.1")
    cfg = load_config(None, (), env={}, brokerRole="SLAVE", brokerId=1,
                      haMasterAddress=f"127.0.0.1:{port}", storePathRootDir=str(tmp_path))
    limits = Limits.from_config(cfg)
    store = FlakyStore()
    client = HaClient(cfg, store)
    caplog.set_level(logging.ERROR)

    def handshake() -> tuple[bytes, int, int]:
        while True:
            peer, *frames = master.recv_multipart()
            hello = decode(frames, limits)
            if isinstance(hello, Hello):
                break
        master.send_multipart([peer, *encode(HelloReply(
            hello.session, 1, 0, 10_000, hello.max_phy_offset, (EpochEntry(1, 0),)))])
        return peer, hello.session, hello.max_phy_offset

    client.start()
    try:
        peer, session, offset = handshake()
        assert offset == 0
        master.send_multipart([peer, *encode_data(session, 1, 0, 0, b"a" * 100)])
        master.send_multipart([peer, *encode_data(session, 1, 0, 100, b"b" * 100)])  # raises
        peer, session2, offset = handshake()  # the thread came back: a new session, HELLO
        assert session2 > session and offset == 100  # resumed from what the store holds
        assert errors_of(caplog, "ha_client_failed")
        health = client.health()
        assert health["failures"] == 1 and "a bug in the store" in health["lastError"]
        assert health["restarts"] == 1 and health["state"] == "running"
        master.send_multipart([peer, *encode_data(session2, 1, 0, 100, b"b" * 100)])
        deadline = time.monotonic() + 10
        while True:  # acked: replicating again
            ack = decode(master.recv_multipart()[1:], limits)
            if isinstance(ack, Ack) and ack.ack_offset == 200:
                break
            assert time.monotonic() < deadline
        assert store.max_phy_offset == 200
    finally:
        client.stop()
        master.close(0)
        ctx.term()


# ---- the client's I/O thread -------------------------------------------------------------------


@pytest.fixture
def silent_broker() -> Iterator[str]:
    """A ROUTER that reads requests and never answers."""
    ctx: zmq.Context[Any] = zmq.Context()
    sock = bounded_socket(ctx, zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            if sock.poll(50):
                sock.recv_multipart()

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    yield f"127.0.0.1:{port}"
    stop.set()
    t.join(5)
    sock.close(0)
    ctx.term()


def kill_io_thread(transport: Transport, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(now: float) -> None:
        raise RuntimeError("a bug on the client's I/O thread")

    monkeypatch.setattr(transport, "_expire", broken)
    transport._wakeup.wake()
    transport._thread.join(5)
    assert not transport._thread.is_alive()


def test_a_dead_client_io_thread_fails_every_waiting_call_at_once(
        silent_broker: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    transport = Transport(name="t-io")
    try:
        waiting = [transport.call(silent_broker, RequestCode.STATUS, timeout_ms=60_000)
                   for _ in range(3)]
        wait_for(lambda: len(transport._pending) == 3, "the calls sent")  # never answered
        kill_io_thread(transport, monkeypatch)
        for fut in waiting:
            err = fut.exception(timeout=2)  # at once, not at the 60 s deadline
            assert isinstance(err, BrokerError) and "I/O thread died" in err.remark
        assert errors_of(caplog, "client_io_thread_died")
        later = transport.call(silent_broker, RequestCode.STATUS, timeout_ms=60_000)
        err = later.exception(timeout=2)
        assert isinstance(err, BrokerError) and "I/O thread died" in err.remark
    finally:
        transport.close(2)


def test_send_async_after_the_client_io_thread_died_fails_at_once(
        make_broker: Callable[..., Broker], monkeypatch: pytest.MonkeyPatch) -> None:
    broker = make_broker()
    with Producer([addr(broker)], timeout_ms=30_000) as p:
        assert p.send_async("t", b"before", queue_id=0).result(10).status == SendStatus.SEND_OK
        kill_io_thread(p._transport, monkeypatch)
        futures = [p.send_async("t", b"after %d" % i, queue_id=0) for i in range(5)]
        for fut in futures:
            err = fut.exception(timeout=2)  # old: queued into a dead inbox, waited forever
            assert isinstance(err, BrokerError) and "I/O thread died" in err.remark


def test_the_restart_back_off_grows_and_starts_over_after_a_healthy_run() -> None:
    health = loop.ParticipantHealth()
    health.up_since -= loop.HEALTHY_AFTER_S  # ran long enough before its first failure
    waits = []
    for _ in range(8):  # failing right after each restart: no tight loop
        waits.append(health.failed(RuntimeError("again"), restarting=True))
        health.restarted()
    assert waits[:3] == [loop.RESTART_BACKOFF_S, 2 * loop.RESTART_BACKOFF_S,
                         4 * loop.RESTART_BACKOFF_S]
    assert waits[-1] == loop.RESTART_BACKOFF_MAX_S == max(waits)
    health.up_since -= loop.HEALTHY_AFTER_S  # then it ran well for a while
    assert health.failed(RuntimeError("once more"), restarting=True) == loop.RESTART_BACKOFF_S
    assert health.as_status() == {"state": "restarting", "failures": 9, "restarts": 8,
                                  "lastError": "RuntimeError: once more"}
