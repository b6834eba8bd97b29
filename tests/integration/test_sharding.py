"""Sharding keys against a real broker: every message of a key lands in one queue, in the order
sent, through send, send_async and the CLI; the key is kept as __SHARDINGKEY."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from broker_harness import BrokerProcess, brokers, run_cli

from common.client import Admin, Consumer, Producer, shard_queue
from common.core.errors import SendStatus

pytestmark = pytest.mark.integration

KEYS = [f"order-{i}" for i in range(6)]


@pytest.mark.timeout(120)
def test_each_key_keeps_to_its_queue_in_order(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "b")
    with brokers(b):
        with Admin([b.address]) as admin:
            admin.create_topic("s", 5)
        sent: dict[str, list[bytes]] = {k: [] for k in KEYS}
        with Producer([b.address]) as p:
            for i in range(60):
                key = KEYS[i % len(KEYS)]
                body = b"%s:%d" % (key.encode(), i)
                sent[key].append(body)
                if i % 2:
                    r = p.send("s", body, shard_key=key)
                else:
                    r = p.send_async("s", body, shard_key=key).result(30)
                assert r.status == SendStatus.SEND_OK and r.queue_id == shard_queue(key, 5)
        for key in KEYS[:2]:
            body = f"{key}:cli".encode()
            sent[key].append(body)
            rc, doc = run_cli("send", "-s", b.address, "-t", "s", "-b", body.decode(),
                              "--shard-key", key)
            assert rc == 0 and doc["queueId"] == shard_queue(key, 5)
        rc, _ = run_cli("send", "-s", b.address, "-t", "s", "-b", "x", "--shard-key", "k",
                        "--queue", "1")
        assert rc == 2  # bad usage
        got: dict[str, list[bytes]] = {k: [] for k in KEYS}
        with Consumer([b.address]) as c:
            for q in range(5):
                for m in c.pull("s", q, 0, 100).messages:
                    key = m.properties["__SHARDINGKEY"]
                    assert q == shard_queue(key, 5)
                    got[key].append(m.body)
        assert got == sent  # each key's messages in one queue, in the order sent


@pytest.mark.timeout(120)
def test_a_producer_uses_the_queues_a_topic_gains(tmp_path: Path) -> None:
    """The producer's queue counts are asked again after route_ttl_ms (RocketMQ's 30 s): it
    used to keep the first count for its life, so queues added later got nothing from it."""
    b = BrokerProcess(tmp_path / "b")
    with brokers(b):
        with Admin([b.address]) as admin:
            admin.create_topic("grow", 2)
        with Producer([b.address], route_ttl_ms=300) as p:
            assert {p.send("grow", b"x").queue_id for _ in range(8)} == {0, 1}
            with Admin([b.address]) as admin:
                admin.create_topic("grow", 4)
            used: set[int] = set()
            deadline = time.monotonic() + 20
            while used != {0, 1, 2, 3}:
                assert time.monotonic() < deadline, f"only queues {used} used"
                used.add(p.send("grow", b"y").queue_id)
            r = p.send("grow", b"z", shard_key="order-42")
            assert r.queue_id == shard_queue("order-42", 4)
