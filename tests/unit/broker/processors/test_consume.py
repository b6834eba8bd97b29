"""Reads (processors/consume.py) over real sockets on the in-memory store: long polling
woken by an arrival or timed out, parked polls answered by a drain, a group's retry topic."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable

import pytest
from helpers.brokers import addr
from time_bounds import late_s, tier

from common.broker.broker import Broker
from common.client import Consumer, Producer
from common.core.errors import (
    PullStatus,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


LONG_POLL_SUSPEND_MS = 10_000


# answered by the arrival, not by the suspend running out (PR tier); at once (perf: 0.5 s)
@pytest.mark.parametrize("wake_bound_s", tier(LONG_POLL_SUSPEND_MS / 1000 / 2, 0.5))
def test_long_poll_wakes_on_arrival(make_broker: Callable[..., Broker],
                                    wake_bound_s: float) -> None:
    broker = make_broker()
    with Producer([addr(broker)]) as p, Consumer([addr(broker)]) as c:
        p.send("lp", b"first", queue_id=0)
        pool = concurrent.futures.ThreadPoolExecutor(1)
        fut = pool.submit(c.pull, "lp", 0, 1, 32, LONG_POLL_SUSPEND_MS)
        deadline = time.monotonic() + 5
        while broker.server.stats.long_polls == 0:
            assert time.monotonic() < deadline, "pull never parked"
            time.sleep(0.001)
        sent_at = time.monotonic()
        p.send("lp", b"second", queue_id=0)
        pr = fut.result(LONG_POLL_SUSPEND_MS / 1000 + 5)
        woke_after = time.monotonic() - sent_at
        pool.shutdown()
    assert pr.status == PullStatus.FOUND and [m.body for m in pr.messages] == [b"second"]
    print(f"long poll woke {woke_after * 1000:.1f} ms after the send")
    assert woke_after < wake_bound_s


def test_long_poll_times_out_with_no_new_msg(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    suspend_s = 0.3
    with Consumer([addr(broker)]) as c:
        started = time.monotonic()
        pr = c.pull("empty", 0, 0, 32, suspend_ms=int(suspend_s * 1000))
    took = time.monotonic() - started
    # answered at its suspend: not before it (50 ms of slack, as before), not long after
    assert pr.status == PullStatus.NO_NEW_MSG and suspend_s - 0.05 <= took < late_s(suspend_s)


def test_drain_answers_parked_polls(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    suspend_s = 20.0
    with Consumer([addr(broker)], retries=0) as c:
        pool = concurrent.futures.ThreadPoolExecutor(1)
        fut = pool.submit(c.pull, "d", 0, 0, 32, int(suspend_s * 1000))
        deadline = time.monotonic() + 5
        # parked, not merely in flight: the client's discovery STATUS counts in flight too,
        # and a drain that ends with it leaves the pull to arrive at a closed loop
        while broker.server.stats.long_polls < 1:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        started = time.monotonic()
        assert broker.server.drain(5.0)
        assert fut.result(5).status == PullStatus.NO_NEW_MSG
        assert time.monotonic() - started < suspend_s / 2  # by the drain, not its suspend
        pool.shutdown()


def test_a_groups_first_heartbeat_makes_its_retry_topic_on_a_master_only(
        make_broker: Callable[..., Broker]) -> None:
    """RocketMQ's heartbeat creates %RETRY%<group> (one queue): members read it before any
    send-back, and a new master has it from the members' next heartbeats. A slave's topics
    are its master's copy: a heartbeat there changes nothing."""
    master = make_broker()
    with Consumer([addr(master)], group="billing") as c:
        c.heartbeat("member-1")
        c.heartbeat("member-1", leave=True)
    assert master.topics.queue_nums("%RETRY%billing") == 1
    slave = make_broker(brokerRole="SLAVE", brokerId=1, haMasterAddress="127.0.0.1:1")
    with Consumer([addr(slave)], group="billing", read_from=addr(slave)) as c:
        c._cluster._master = addr(slave)  # a client that takes the slave for the master
        c.heartbeat("member-1")
    assert slave.topics.queue_nums("%RETRY%billing") == 0
    with Consumer([addr(master)], group="g" * 250) as c:  # its retry topic would be too long
        c.heartbeat("member-1")
    assert master.topics.queue_nums("%RETRY%" + "g" * 250) == 0
