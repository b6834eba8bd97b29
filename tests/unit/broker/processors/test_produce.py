"""Writes (processors/produce.py) over real sockets on the in-memory store: batches, round
robin, send_async coalescing, a slave's refusal, SYNC_MASTER without replicas, waiting for a
master."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers.brokers import addr, free_port
from time_bounds import late_s

from common.broker.broker import Broker
from common.client import NoMasterError, Producer
from common.core.errors import (
    BrokerError,
    ResponseCode,
    SendStatus,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_batch_and_round_robin(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(defaultTopicQueueNums=3)
    with Producer([addr(broker)]) as p:
        rs = p.send_batch("t", [b"a", b"b", b"c"], queue_id=2)
        assert [r.queue_offset for r in rs] == [0, 1, 2] and {r.queue_id for r in rs} == {2}
        assert len({r.msg_id for r in rs}) == 3
        queues = [p.send("rr", b"x").queue_id for _ in range(6)]
    assert sorted(queues) == [0, 0, 1, 1, 2, 2]
    assert (broker.cfg.store_root / "config" / "topics.json").exists()


def test_send_async_coalesces_into_batches(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(defaultTopicQueueNums=2)
    n = 2000
    most_in_flight = 0
    with Producer([addr(broker)]) as p:
        batches = p._transport.batches
        send_batch = batches._send_batch

        def counting(key: Any, batch: Any) -> None:
            nonlocal most_in_flight
            send_batch(key, batch)
            most_in_flight = max(most_in_flight, batch.in_flight)

        batches._send_batch = counting  # type: ignore[method-assign]
        p.send("co", b"warm", queue_id=0)
        before = broker.server.stats.requests
        futures = [p.send_async("co", f"m{i}".encode(), queue_id=i % 2) for i in range(n)]
        results = [f.result(30) for f in futures]
        requests = broker.server.stats.requests - before
    assert all(r.status == SendStatus.SEND_OK for r in results)
    for q in (0, 1):  # dense offsets, in the order sent, per queue
        offsets = [r.queue_offset for r in results if r.queue_id == q]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    assert requests < n / 4, f"{requests} requests for {n} messages: not coalesced"
    assert most_in_flight == 2, "a queue's second batch never left while its first was out"


def test_slave_refuses_writes_naming_master(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(brokerRole="SLAVE", brokerId=1, haMasterAddress="10.1.2.3:10912")
    with Producer([addr(broker)], retries=0) as p:
        p._cluster._master = addr(broker)  # write to the slave directly, as a confused client would
        with pytest.raises(BrokerError) as e:
            p.send("t", b"x", queue_id=0)
    assert e.value.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "SLAVE" in e.value.remark and "10.1.2.3:10912" in e.value.remark
    assert broker.store.phy == 0
    with Producer([addr(broker)], retries=0, timeout_ms=500) as p, pytest.raises(BrokerError) as e:
        p.send("t", b"x")  # discovery finds no master (waited for one timeout_ms)
    assert e.value.code == ResponseCode.SERVICE_NOT_AVAILABLE


def test_sync_master_without_replication_reports_slave_not_available(
    make_broker: Callable[..., Broker],
) -> None:
    broker = make_broker(brokerRole="SYNC_MASTER")
    with Producer([addr(broker)]) as p:
        r = p.send("t", b"x", queue_id=0)
    assert r.status == SendStatus.SLAVE_NOT_AVAILABLE and broker.store.phy > 0


@pytest.mark.parametrize("blocking", [False, True])
def test_sends_wait_for_a_master_within_their_timeout_without_using_retries(
    make_broker: Callable[..., Broker], blocking: bool
) -> None:
    """A send made while no broker of the group answers (a master restarting) waits for one
    up to its timeout_ms, as Kafka's producer waits for a leader; that uses none of its
    retries (here 0). Both used to fail after the first discovery (~2 s)."""
    port = free_port()
    with Producer([f"127.0.0.1:{port}"], retries=0, timeout_ms=15_000) as p:
        pool = concurrent.futures.ThreadPoolExecutor(1)
        if blocking:
            fut = pool.submit(p.send, "t", b"x", queue_id=0)
        else:
            fut = p.send_async("t", b"x", queue_id=0)
        time.sleep(2.5)  # more than one discovery (2 s) has found nobody
        assert not fut.done()
        make_broker(listenPort=port)
        assert fut.result(20).status == SendStatus.SEND_OK
        pool.shutdown()
    with Producer([f"127.0.0.1:{free_port()}"], retries=0, timeout_ms=1_000) as p:
        started = time.monotonic()
        with pytest.raises(NoMasterError):
            p.send("t", b"x", queue_id=0)
        # the send waits for a master up to its timeout_ms (1 s); the discovery begun last
        # may take its own 1 s (min(timeout_ms, DISCOVERY_TIMEOUT_MS)); then it is out
        assert time.monotonic() - started < late_s(2 * 1.0)
