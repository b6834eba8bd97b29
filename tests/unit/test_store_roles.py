"""A store that was a slave and becomes a master continues every queue's offsets."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.config import load_config
from common.errors import PutStatus
from common.message import Message
from common.store.message_store import MessageStore

pytestmark = pytest.mark.unit


def open_store(root: Path, **over: object) -> MessageStore:
    store = MessageStore(load_config(env={}, storePathRootDir=str(root),
                                     mappedFileSizeCommitLog=16 * 1024,
                                     mappedFileSizeConsumeQueue=20 * 64, maxHashSlotNum=97,
                                     maxIndexNum=400, **over))
    store.start()
    return store


@pytest.mark.timeout(60)
def test_promoted_replica_continues_queue_offsets(tmp_path: Path) -> None:
    master = open_store(tmp_path / "m")
    slave = open_store(tmp_path / "s", brokerRole="SLAVE", brokerId=1)
    try:
        for i in range(100):
            assert master.put(Message("orders", b"m%d" % i, keys=f"k{i}"), i % 3).ok
        offset = 0
        while offset < master.max_phy_offset:  # what the HA client does
            chunk = master.read_committed(offset, 1000)
            slave.append_replicated(offset, chunk)
            offset += len(chunk)
        slave.become_master()
        for queue_id in range(3):
            expected = master.max_queue_offset("orders", queue_id)
            r = slave.put(Message("orders", b"after"), queue_id)
            assert r.status is PutStatus.PUT_OK and r.queue_offset == expected
            assert slave.wait_dispatched(slave.max_phy_offset)
            got = slave.get_message("g", "orders", queue_id, expected, 1).messages()
            assert [m.body for m in got] == [b"after"]
        assert [m.body for m in slave.query_by_key("orders", "k42")] == [b"m42"]
    finally:
        master.shutdown()
        slave.shutdown()
