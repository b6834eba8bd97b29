"""Look-ups (processors/query.py) over real sockets on the in-memory store: a message sent,
pulled and found again by key, msgId and offset."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from helpers.brokers import addr

from common.broker.broker import Broker
from common.client import Admin, Consumer, Producer
from common.core.errors import (
    PullStatus,
    SendStatus,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_send_pull_query_round_trip(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker()
    with Producer([addr(broker)]) as p, Consumer([addr(broker)], group="g") as c:
        r = p.send("orders", b"hello", tags="TagA", keys="order-42", queue_id=1)
        assert r.status == SendStatus.SEND_OK and r.queue_id == 1 and r.queue_offset == 0
        pr = c.pull("orders", queue_id=1, offset=0, max_nums=32)
        assert pr.status == PullStatus.FOUND and pr.next_begin_offset == 1
        assert [m.body for m in pr.messages] == [b"hello"] and pr.messages[0].msg_id == r.msg_id
        c.commit_offset("orders", 1, pr.next_begin_offset)
        assert c.fetch_offset("orders", 1) == 1 and c.fetch_offset("orders", 0) == -1
    with Admin([addr(broker)]) as a:
        assert [m.body for m in a.query_by_key("orders", "order-42")] == [b"hello"]
        assert a.query_by_msg_id(r.msg_id).body == b"hello"  # type: ignore[union-attr]
        assert a.query_by_offset(r.commit_log_offset).tags == "TagA"  # type: ignore[union-attr]
        assert a.query_by_offset(r.commit_log_offset + 1) is None
        status = a.status(addr(broker))
    for key in (
        "brokerName",
        "brokerId",
        "role",
        "epoch",
        "minPhyOffset",
        "maxPhyOffset",
        "flushedPhyOffset",
        "masterAddress",
        "slaves",
    ):
        assert key in status
    assert status["role"] == "ASYNC_MASTER" and status["maxPhyOffset"] == broker.store.phy
