"""The ZeroMQ front end (common/broker/server.py) on the in-memory store: malformed frames,
overload, and answers held for the controller lease (the reply gate)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import zmq
from helpers.brokers import addr
from helpers.zmq_sockets import bounded_socket

from common.broker.broker import Broker
from common.client import Consumer, Producer
from common.core.errors import (
    BrokerError,
    PullStatus,
    ResponseCode,
    SendStatus,
)
from common.format import protocol
from common.format.protocol import PROTOCOL_VERSION, RequestCode, decode_response

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def raw_call(address: str, frames: list[bytes], timeout_ms: int = 3000) -> Any:
    ctx = zmq.Context()
    sock = bounded_socket(ctx, zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
    try:
        sock.connect(f"tcp://{address}")
        sock.send_multipart(frames)
        return decode_response(
            sock.recv_multipart(), protocol.Limits()
        )
    finally:
        sock.close()
        ctx.term()


def test_malformed_frames_get_typed_errors(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    resp = raw_call(addr(broker), [b"\x93\x01"])
    assert resp.code == ResponseCode.BAD_REQUEST and resp.fields["field"] == "header"
    header = msgpack.packb([PROTOCOL_VERSION, RequestCode.SEND, 77, {"topic": "t", "queueId": -1}])
    resp = raw_call(addr(broker), [header, b"x"])
    assert (resp.code, resp.opaque, resp.fields["field"]) == (
        ResponseCode.BAD_REQUEST,
        77,
        "queueId",
    )
    resp = raw_call(addr(broker), [msgpack.packb([PROTOCOL_VERSION, 4242, 5, {}])])
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and resp.opaque == 5
    assert broker.store.phy == 0


def test_overload_answers_system_busy(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(maxInflightRequests=2)
    with Consumer([addr(broker)], timeout_ms=5000) as c:
        pool = concurrent.futures.ThreadPoolExecutor(2)
        parked = [pool.submit(c.pull, "busy", 0, 0, 32, 2000) for _ in range(2)]
        deadline = time.monotonic() + 5
        while broker.server.stats.inflight < 2:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        with Consumer([addr(broker)], retries=0) as c2, pytest.raises(BrokerError) as e:
            c2.pull("busy", 0, 0, 32, 1000)
        assert e.value.code == ResponseCode.SYSTEM_BUSY and e.value.retriable
        assert all(f.result(10).status == PullStatus.NO_NEW_MSG for f in parked)
        pool.shutdown()


# ---- answers held for the controller lease (Broker._reply_gate) ------------------------------
def _lapsed(resp: Any) -> Any:
    return resp._replace(code=ResponseCode.FLUSH_SLAVE_TIMEOUT, remark="lease lapsed")


def test_a_send_ok_held_by_the_gate_leaves_once_the_gate_lets_it(
        make_broker: Callable[..., Broker]) -> None:
    """The answer waits while the gate holds it (a lapsed lease, still master) and leaves as
    SEND_OK as soon as the gate lets it: the put is not turned indeterminate."""
    broker = make_broker()
    confirmed = threading.Event()
    broker.server.reply_hold_s = 30.0
    broker.server.reply_gate = lambda resp, final: resp if confirmed.is_set() or final else None
    with Producer([addr(broker)], retries=0) as p:
        pool = concurrent.futures.ThreadPoolExecutor(1)
        fut = pool.submit(p.send, "held", b"m", queue_id=0)
        deadline = time.monotonic() + 10
        while broker.server.stats.answers_held_for_lease < 1:
            assert time.monotonic() < deadline, "the answer was never held"
            time.sleep(0.005)
        time.sleep(0.2)
        assert not fut.done() and broker.server.stats.inflight >= 1
        confirmed.set()
        assert fut.result(10).status == SendStatus.SEND_OK
        assert broker.server.stats.inflight == 0
        pool.shutdown()


def test_a_held_send_ok_gets_the_gates_final_answer_at_its_deadline(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    broker.server.reply_hold_s = 0.3
    broker.server.reply_gate = lambda resp, final: _lapsed(resp) if final else None
    with Producer([addr(broker)], retries=0) as p:
        started = time.monotonic()
        r = p.send("held", b"m", queue_id=0)
        assert r.status == SendStatus.FLUSH_SLAVE_TIMEOUT
        assert time.monotonic() - started >= 0.3
    assert broker.server.stats.answers_held_for_lease == 1 and broker.server.stats.inflight == 0


def test_a_drain_gives_held_answers_the_gates_final_word(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    broker.server.reply_hold_s = 60.0
    broker.server.reply_gate = lambda resp, final: _lapsed(resp) if final else None
    with Producer([addr(broker)], retries=0) as p:
        pool = concurrent.futures.ThreadPoolExecutor(1)
        fut = pool.submit(p.send, "held", b"m", queue_id=0)
        deadline = time.monotonic() + 10
        while broker.server.stats.answers_held_for_lease < 1:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert broker.server.drain(5.0)  # the held answer counts in flight: it is answered
        assert fut.result(5).status == SendStatus.FLUSH_SLAVE_TIMEOUT
        pool.shutdown()


class _Lease:
    def __init__(self, master: bool, fresh: bool):
        self.master, self.fresh = master, fresh
        self.stats = types.SimpleNamespace(fenced_writes=0)

    def acknowledge_ok(self) -> bool:
        return self.master and self.fresh

    def is_master(self) -> bool:
        return self.master


@pytest.mark.parametrize(("master", "fresh", "final", "want"), [
    (True, True, False, "ok"),
    (True, True, True, "ok"),
    (True, False, False, "hold"),  # lapsed, still master: its session may be confirmed again
    (True, False, True, "flush"),  # the hold ended: indeterminate
    (False, False, False, "flush"),  # no longer master (session lost, replaced): never OK
])
def test_the_broker_gate_holds_only_a_master_whose_lease_lapsed(
        master: bool, fresh: bool, final: bool, want: str) -> None:
    gate_owner = types.SimpleNamespace(controller=_Lease(master, fresh))
    resp = protocol.Response(ResponseCode.SUCCESS, 7, "", {"msgId": "x"}, [])
    out = Broker._reply_gate(gate_owner, resp, final)  # type: ignore[arg-type]
    if want == "ok":
        assert out is resp
    elif want == "hold":
        assert out is None and gate_owner.controller.stats.fenced_writes == 0
    else:
        assert out is not None and out.code == ResponseCode.FLUSH_SLAVE_TIMEOUT
        assert gate_owner.controller.stats.fenced_writes == 1
