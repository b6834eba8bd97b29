"""Sharding keys pick queues as RocketMQ's SelectMessageQueueByHash does on a JVM."""

from __future__ import annotations

import pytest

from common.client import Producer, shard_queue
from common.core.errors import BrokerError, ResponseCode

pytestmark = pytest.mark.unit

# String.hashCode() and Math.abs(h) % 8, printed by Java 17 for these keys
JAVA = [("order-42", 5), ("key", 7), ("ключ", 2), ("\U0001F600x", 5),
        ("polygenelubricants", 0)]  # its hashCode is Integer.MIN_VALUE


@pytest.mark.parametrize(("key", "queue"), JAVA)
def test_the_queue_is_the_java_clients(key: str, queue: int) -> None:
    assert shard_queue(key, 8) == queue


def test_every_queue_is_reachable_and_in_range() -> None:
    for n in (1, 3, 7, 16):
        queues = {shard_queue(f"k{i}", n) for i in range(500)}
        assert queues == set(range(n))


def test_a_key_with_a_queue_or_an_empty_key_is_refused_before_sending() -> None:
    with Producer(["127.0.0.1:1"], retries=0, timeout_ms=200) as p:
        for kw in ({"shard_key": "k", "queue_id": 1}, {"shard_key": ""}):
            with pytest.raises(BrokerError) as e:
                p.send("t", b"x", **kw)  # type: ignore[arg-type]
            assert e.value.code == ResponseCode.MESSAGE_ILLEGAL and not e.value.retriable
        with pytest.raises(BrokerError, match="not both"):
            p.send_async("t", b"x", shard_key="k", queue_id=0)
