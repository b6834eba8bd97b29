"""A promotion routes every topic the new master holds (docs/guarantees.md, "Failover"): a topic
created on the old master within the last config-sync interval exists on its slave only as
replicated records, and once merged only at start-up it was missing (or had fewer queues) on a
slave promoted while running."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.brokers import free_port
from test_promotion_fence import address, wait_for

from common.broker.broker import Broker
from common.cli.bootstrap import make_role
from common.client import Admin, Producer
from common.core.config import load_config
from common.core.errors import SendStatus
from common.store.message_store import MessageStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(90)]


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[Callable[..., Broker]]:
    made: list[Broker] = []

    def start(name: str, **fields: Any) -> Broker:
        cfg = load_config(None, (), env={}, listenPort=free_port(), haListenPort=free_port(),
                          storePathRootDir=str(tmp_path / name),
                          mappedFileSizeCommitLog=1024 * 1024, **fields)
        broker = Broker(cfg, MessageStore(cfg), make_role)
        broker.start()
        made.append(broker)
        return broker

    yield start
    for b in reversed(made):
        b.shutdown()


def test_a_promoted_slave_routes_the_topics_it_only_holds_as_records(
        brokers: Callable[..., Broker]) -> None:
    master = brokers("m", brokerRole="ASYNC_MASTER", defaultTopicQueueNums=4)
    slave = brokers("s", brokerRole="SLAVE", brokerId=1, slaveConfigSyncIntervalMs=0,
                    haMasterAddress=f"127.0.0.1:{master.cfg.ha_port}")
    with Producer([address(master)]) as p:
        assert p.send("fresh", b"x", queue_id=3).status == SendStatus.SEND_OK
    wait_for(lambda: slave.store.dispatched_phy_offset == master.store.max_phy_offset,
             "the slave to hold and index the record")
    assert slave.topics.queue_nums("fresh") == 0  # no config sync: only the record says so
    with Admin([address(slave)], timeout_ms=15_000) as admin:
        admin.promote(address(slave))
    assert slave.role is not None and slave.role.name != "SLAVE"
    assert slave.topics.queue_nums("fresh") == 4
    with Admin([address(slave)]) as admin:
        assert admin.topics()["fresh"] == 4  # routed: written and served
