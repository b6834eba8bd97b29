"""No producer can freeze a group's failure handling through its topics (docs/guarantees.md,
"Controller"): a master refuses to create a topic past what the ZooKeeper node of its routes
holds, and a routes record that cannot be written (a table from before that limit) stops only
the routes' publication, never a SyncStateSet change, an election or a switchover."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from broker_harness import BrokerProcess
from controller_harness import Group, chroot, running_zookeeper, wait_sync_state_set

from common.client import Admin, Producer
from common.core.errors import BrokerError, ResponseCode
from common.format.tables import TOPICS_FILE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _seed_topics(proc: BrokerProcess, count: int, name_chars: int) -> None:
    """The broker's topics.json holds ``count`` topics of ``name_chars`` characters."""
    table = {f"{i:06d}".ljust(name_chars, "t"): {"topicName": f"{i:06d}".ljust(name_chars, "t"),
                                                 "readQueueNums": 4, "writeQueueNums": 4,
                                                 "perm": 6} for i in range(count)}
    config = proc.store_root / "config"
    config.mkdir(parents=True, exist_ok=True)
    (config / TOPICS_FILE).write_text(json.dumps({
        "topicConfigTable": table, "dataVersion": {"timestamp": 0, "counter": 1}}))


def test_routes_that_cannot_be_published_do_not_stop_the_sync_state_set(tmp_path: Path) -> None:
    with running_zookeeper(tmp_path / "zk") as zk:
        group = Group(tmp_path, zk.hosts + chroot(), size=2, inSyncReplicas=1)
        for proc in group.procs:  # about 1.2 MB of routes: more than a znode takes
            _seed_topics(proc, 5000, 230)
        with group as g:
            master = g.master()
            # the slave joins: the proposal is carried out though every pass fails to
            # publish the routes (before, that failure ended the pass first)
            st = wait_sync_state_set(master.status, {1, 2}, timeout_s=30)
            assert st["controller"]["stats"]["pass_failures"] > 0
            assert "topics" in st["controller"]["lastError"]


def test_a_master_refuses_a_topic_its_routes_record_cannot_hold(tmp_path: Path) -> None:
    with running_zookeeper(tmp_path / "zk") as zk:
        group = Group(tmp_path, zk.hosts + chroot(), size=1, inSyncReplicas=1)
        _seed_topics(group.procs[0], 8150, 120)  # ~5 KB short of the record's limit
        with group as g:
            master = g.master()
            made = 0
            with Admin([master.address]) as admin, pytest.raises(BrokerError) as info:
                while made < 1000:
                    admin.create_topic(f"new-{made:06d}".ljust(120, "x"), 1)
                    made += 1
            assert info.value.code == ResponseCode.BAD_REQUEST
            assert "fit in the ZooKeeper node" in info.value.remark
            assert 10 < made < 100
            with Producer([master.address], retries=0) as p, \
                    pytest.raises(BrokerError, match="fit in the ZooKeeper node") as sent:
                p.send("one-more-auto-created-topic".ljust(120, "x"), b"x")
            assert sent.value.code == ResponseCode.TOPIC_NOT_EXIST
            with Producer([master.address]) as p:  # the group keeps working
                assert p.send(f"{0:06d}".ljust(120, "t"), b"x").status.name == "SEND_OK"
            with Admin([master.address]) as admin:  # and its routes are published
                assert len(admin.topics()) >= 8150
