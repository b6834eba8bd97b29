"""common/client/routing.py: route tables from CLUSTER_INFO, keyed and keyless queue choice."""

from __future__ import annotations

import pytest

from common.client.routing import (
    MessageQueue,
    QueueSelector,
    RouteError,
    RouteTable,
    queue_for_key,
)
from common.core.message import java_hash

pytestmark = pytest.mark.unit

INFO = {"cluster": "c", "groups": [
    {"brokerName": "broker-b", "master": "h:2", "slaves": ["h:3"], "masterEpoch": 514,
     "topics": {"orders": 2, "audit": 1}},
    {"brokerName": "broker-a", "master": "h:1", "slaves": [], "masterEpoch": 257,
     "topics": {"orders": 4}},
    {"brokerName": "broker-c", "master": "", "slaves": ["h:9"], "topics": {"orders": 1}},
]}


def test_a_topics_queues_are_ordered_by_group_then_id() -> None:
    table = RouteTable.from_cluster_info(INFO)
    assert table.group_names == ["broker-a", "broker-b", "broker-c"]
    assert [str(q) for q in table.queues("orders")] == [
        "broker-a/0", "broker-a/1", "broker-a/2", "broker-a/3", "broker-b/0", "broker-b/1",
        "broker-c/0"]
    assert MessageQueue("broker-c", 0) not in table.writable("orders")  # no master
    assert table.group_of("audit") == "broker-b" and table.group_of("orders") is None
    assert table.groups["broker-b"].addresses == ["h:2", "h:3"]
    assert table.queues("nothing") == []


def test_a_key_keeps_its_queue_while_the_route_is_unchanged() -> None:
    queues = RouteTable.from_cluster_info(INFO).queues("orders")
    for key in ("order-1", "order-42", "x" * 100):
        mq = queue_for_key(queues, key)
        assert mq == queues[abs(java_hash(key)) % 7]  # RocketMQ's SelectMessageQueueByHash
        assert all(queue_for_key(list(queues), key) == mq for _ in range(3))
    with pytest.raises(ValueError):
        queue_for_key([], "k")


def test_keyless_choice_goes_round_and_passes_over_a_failed_group() -> None:
    now = [100.0]
    sel = QueueSelector(isolation_ms=1000, clock=lambda: now[0])
    queues = RouteTable.from_cluster_info(INFO).writable("orders")
    picks = [sel.pick(queues) for _ in range(12)]
    assert {q.broker_name for q in picks} == {"broker-a", "broker-b"}
    sel.failed("broker-a")
    assert {sel.pick(queues).broker_name for _ in range(6)} == {"broker-b"}
    now[0] += 1.0
    assert "broker-a" in {sel.pick(queues).broker_name for _ in range(6)}
    sel.failed("broker-a")
    sel.failed("broker-b")  # every group out: still somewhere to send
    assert sel.pick(queues) in queues


@pytest.mark.parametrize("doc", [{}, {"groups": "x"}, {"groups": [{"master": "h:1"}]},
                                 {"groups": [{"brokerName": "a", "slaves": "h:1"}]}])
def test_a_malformed_answer_is_a_route_error(doc: dict[str, object]) -> None:
    with pytest.raises(RouteError):
        RouteTable.from_cluster_info(doc)
