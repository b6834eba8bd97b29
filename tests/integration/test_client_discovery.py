"""Clients find the right broker: a consumer pinned to a slave needs no master, and a producer
whose master answers "no slave confirmed this" asks the group again and follows a newer term."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import pytest
from broker_harness import BrokerProcess, brokers

from common.client import Admin, Consumer, Producer
from common.core.errors import PullStatus, SendStatus

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
def test_consumer_reads_from_a_slave_with_no_master_reachable(tmp_path: Path) -> None:
    master = BrokerProcess(tmp_path / "m", brokerRole="ASYNC_MASTER")
    with brokers(master):
        ha = f"127.0.0.1:{int(master.address.split(':')[1]) + 1}"
        slave = BrokerProcess(tmp_path / "s", brokerRole="SLAVE", brokerId=1, haMasterAddress=ha)
        with brokers(slave):
            with Producer([master.address]) as p:
                sent = [p.send("t", b"m%d" % i, queue_id=0).msg_id for i in range(20)]
            deadline = time.monotonic() + 20
            with Consumer([slave.address], read_from=slave.address, retries=0) as c:
                while True:
                    got = c.pull("t", 0, 0, 32)
                    if got.status is PullStatus.FOUND and len(got.messages) == len(sent):
                        break
                    assert time.monotonic() < deadline, got.status
                    time.sleep(0.02)
                assert [m.msg_id for m in got.messages] == sent


@pytest.mark.timeout(120)
def test_producer_follows_a_newer_term_after_degraded_answers(tmp_path: Path) -> None:
    # A: a SYNC_MASTER with no slave answers SLAVE_NOT_AVAILABLE (stored, unconfirmed).
    a = BrokerProcess(tmp_path / "a", brokerRole="SYNC_MASTER")
    b = BrokerProcess(tmp_path / "b", brokerRole="SLAVE", brokerId=1,
                      haMasterAddress="127.0.0.1:1")
    with brokers(a, b), Producer([a.address, b.address], retries=0) as p:
        first = p.send("t", b"x", queue_id=0)
        assert first.status is SendStatus.SLAVE_NOT_AVAILABLE
        with Admin([b.address]) as admin:
            admin.promote(b.address, role="ASYNC_MASTER")
        deadline = time.monotonic() + 10
        while True:
            r = p.send("t", b"y", queue_id=0)
            if r.status is SendStatus.SEND_OK:
                break  # only B, the newer term, answers SEND_OK
            assert r.status is SendStatus.SLAVE_NOT_AVAILABLE
            assert time.monotonic() < deadline, "the producer never left the old master"
            time.sleep(0.05)
        assert b.status()["epoch"] > a.status()["epoch"]
        assert b.status()["maxPhyOffset"] > 0


@pytest.mark.timeout(120)
def test_async_sends_in_flight_when_the_master_dies_are_retried_at_once(tmp_path: Path) -> None:
    """A SIGKILLed master's connection drops: send_async batches in flight on it end at once
    (their answers can no longer come) and are retried on the master found again, here the
    same broker restarted, instead of waiting out their 20 s deadline first."""
    master = BrokerProcess(tmp_path / "m", brokerRole="ASYNC_MASTER")
    timeout_s = 20.0
    with brokers(master), Producer([master.address], retries=3,
                                   timeout_ms=int(timeout_s * 1000)) as p:
        assert p.send_async("t", b"warm", queue_id=0).result(10).status == SendStatus.SEND_OK
        in_flight = [p.send_async("t", b"k%d" % i, queue_id=0) for i in range(256)]
        master.close()  # SIGKILL
        unfinished = [f for f in in_flight if not f.done()]
        master.start()
        up = time.monotonic()
        concurrent.futures.wait(unfinished, timeout=30)
        late = time.monotonic() - up
        assert unfinished, "every send was answered before the kill: nothing was tested"
        # retried at once, not after their deadline ran out
        assert all(f.done() for f in unfinished) and late < timeout_s / 2, late
        outcomes = [f.result().status if f.exception() is None else "error" for f in unfinished]
        assert outcomes.count(SendStatus.SEND_OK) == len(unfinished), outcomes
