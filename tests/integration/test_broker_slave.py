"""docs/drills.md row 13: a slave-role broker refuses every write; its files stay unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
from broker_harness import BrokerProcess, brokers, run_cli, tree_digest

from common.client import Admin, Producer
from common.core.errors import BrokerError, ResponseCode
from common.format.protocol import RequestCode

pytestmark = pytest.mark.integration

WRITES = 1000


@pytest.mark.timeout(180)
def test_slave_refuses_writes_and_files_stay_unchanged(tmp_path: Path) -> None:
    master_ha = "127.0.0.1:1"  # no master running: the slave must refuse on its own
    slave = BrokerProcess(tmp_path / "s", brokerRole="SLAVE", brokerId=1, haMasterAddress=master_ha)
    with brokers(slave):
        before_status = slave.status()
        before = tree_digest(slave.store_root / "commitlog")
        refused = 0
        with Producer([slave.address], retries=0) as p:
            transport = p._transport  # talk to the slave as a client that believes it is the master
            for i in range(WRITES):
                if i % 3 == 1:
                    code, fields, bodies = (
                        RequestCode.SEND,
                        {"topic": "t", "queueId": 0},
                        [b"x" * 100],
                    )
                elif i % 3 == 2:  # a consumer's send-back stores a copy: a write too
                    code, fields, bodies = (
                        RequestCode.CONSUMER_SEND_MSG_BACK,
                        {"group": "g", "offset": 0, "originTopic": "t"},
                        [],
                    )
                else:
                    code, fields, bodies = (
                        RequestCode.SEND_BATCH,
                        {"topic": "t", "queueId": 1},
                        [b"a", b"b"],
                    )
                resp = transport.call_sync(slave.address, code, fields, bodies, 5000)
                assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE, resp
                assert "SLAVE" in resp.remark and master_ha in resp.remark
                refused += 1
            with pytest.raises(BrokerError) as e:  # the client itself finds no master
                p.send("t", b"x")
            assert e.value.code == ResponseCode.SERVICE_NOT_AVAILABLE
        with Admin([slave.address], retries=0) as a, pytest.raises(BrokerError) as e:
            a.create_topic("new-topic", 8)
        assert e.value.code == ResponseCode.SERVICE_NOT_AVAILABLE
        rc, doc = run_cli("send", "-s", slave.address, "-t", "t", "-b", "x")
        assert rc == 1 and doc["error"] == "SERVICE_NOT_AVAILABLE"
        after_status = slave.status()
        assert refused == WRITES
        assert tree_digest(slave.store_root / "commitlog") == before
        assert after_status["maxPhyOffset"] == before_status["maxPhyOffset"]
        assert after_status["pid"] == before_status["pid"]
        assert not (slave.store_root / "config" / "topics.json").exists()
