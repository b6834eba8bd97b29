"""A slave copies its master's topics, consumer offsets and delay offsets (RocketMQ's
SlaveSynchronize), so that after a failover consumers resume where they stood and producers
see every queue of a topic."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from broker_harness import BrokerProcess, brokers, free_port
from replication_harness import wait_for

from common.client import Admin, Consumer, Producer
from common.core.errors import PullStatus, SendStatus
from common.format.protocol import RequestCode

pytestmark = pytest.mark.integration


def _delay_offsets(b: BrokerProcess) -> dict[str, int]:
    path = b.store_root / "config" / "delayOffset.json"
    try:
        return dict(json.loads(path.read_text())["offsetTable"])
    except (FileNotFoundError, ValueError, KeyError):
        return {}


@pytest.mark.timeout(120)
def test_a_promoted_slave_knows_topics_offsets_and_delay_progress(tmp_path: Path) -> None:
    port = free_port()
    master = BrokerProcess(tmp_path / "m", listenPort=port, messageDelayLevel="1s 2s")
    slave = BrokerProcess(tmp_path / "s", brokerRole="SLAVE", brokerId=1,
                          haMasterAddress=f"127.0.0.1:{port + 1}", slaveConfigSyncIntervalMs=200,
                          messageDelayLevel="1s 2s")
    with brokers(master, slave):
        with Admin([master.address]) as admin:
            admin.create_topic("wide", 6)  # more queues than any message reaches
        with Producer([master.address]) as p:
            for i in range(10):
                assert p.send("wide", b"w%d" % i, queue_id=i % 2).status == SendStatus.SEND_OK
            assert p.send("later", b"d", delay_level=1).status == SendStatus.SEND_OK
        with Consumer([master.address], group="billing") as c:
            c.commit_offset("wide", 0, 3)
            c.commit_offset("wide", 1, 5)
            wait_for(lambda: c.pull("later", 0, 0, 1).status == PullStatus.FOUND
                     or any(c.pull("later", q, 0, 1).status == PullStatus.FOUND
                            for q in range(8)), 20, "the delayed message to be delivered")
        wait_for(lambda: _delay_offsets(master).get("1") == 1, 20, "the master's delay progress")

        # the slave reads the same tables through the client and on its disk
        with Consumer([master.address], group="billing", read_from=slave.address) as c:
            wait_for(lambda: c.fetch_offset("wide", 1) == 5, 20, "the slave to have the offsets")
            assert c.fetch_offset("wide", 0) == 3
        with Admin([slave.address]) as admin:
            topics = json.loads(admin.config_document(RequestCode.GET_ALL_TOPIC_CONFIG))
        assert topics["topicConfigTable"]["wide"]["writeQueueNums"] == 6
        wait_for(lambda: _delay_offsets(slave).get("1") == 1, 20, "the slave's delay progress")
        sync = slave.status()["configSync"]
        assert sync["rounds"] >= 1 and sync["failures"] == 0, sync
        # with nothing changing on the master, rounds change nothing (no rewrite every round)
        wait_for(lambda: slave.status()["configSync"]["rounds"] >= sync["rounds"] + 3, 20,
                 "three more rounds")
        assert slave.status()["configSync"]["changes"] == sync["changes"]

        # failover: the new master has them
        os.kill(master.pid, signal.SIGKILL)
        assert master.proc is not None
        master.proc.wait(10)
        with Admin([slave.address]) as admin:
            promoted = admin.promote(slave.address, role="ASYNC_MASTER")
        assert promoted["role"] == "ASYNC_MASTER" and promoted["configSync"] == {}
        with Consumer([slave.address], group="billing") as c:
            assert (c.fetch_offset("wide", 0), c.fetch_offset("wide", 1)) == (3, 5)
            assert c.queue_nums("wide") == 6
            pr = c.pull("wide", 0, c.fetch_offset("wide", 0), 32)
            assert [m.body for m in pr.messages] == [b"w6", b"w8"]
        with Producer([slave.address]) as p:
            used = {p.send("wide", b"after").queue_id for _ in range(12)}
        assert used == set(range(6))  # the producer sees all six queues on the new master


@pytest.mark.timeout(180)
def test_a_consumer_group_resumes_on_the_promoted_slave_without_a_gap(tmp_path: Path) -> None:
    """A GroupConsumer reading while its master is killed and the slave promoted: it finds the
    new master, whose offsets came from the old one, and reads on. Every message sent with
    SEND_OK (SYNC_MASTER) is consumed, and what comes twice is at most what was consumed in
    the last sync interval before the kill."""
    from common.client.group_consumer import GroupConsumer

    port = free_port()
    master = BrokerProcess(tmp_path / "m", listenPort=port, brokerRole="SYNC_MASTER")
    slave = BrokerProcess(tmp_path / "s", brokerRole="SLAVE", brokerId=1,
                          haMasterAddress=f"127.0.0.1:{port + 1}", slaveConfigSyncIntervalMs=200)
    with brokers(master, slave):
        with Admin([master.address]) as admin:
            admin.create_topic("fo", 4)
        servers = [master.address, slave.address]
        with Producer(servers) as p:
            sent = [b"a%03d" % i for i in range(100)]
            assert all(p.send("fo", body).status == SendStatus.SEND_OK for body in sent)
        got: list[bytes] = []
        with GroupConsumer(servers, "fo-group", ["fo"], start="earliest",
                           heartbeat_ms=200, timeout_ms=5000) as c:
            wait_for(lambda: (got.extend(m.body for m in c.poll(200)) or len(set(got))) >= 100,
                     30, "the first 100 messages")
            c.poll(0)  # commits what the polls returned
            with Consumer([master.address], group="fo-group", read_from=slave.address) as peek:
                wait_for(lambda: sum(peek.fetch_offset("fo", q) for q in range(4)) == 100, 20,
                         "the slave to have the group's offsets")
            os.kill(master.pid, signal.SIGKILL)
            assert master.proc is not None
            master.proc.wait(10)
            with Admin([slave.address]) as admin:
                admin.promote(slave.address, role="ASYNC_MASTER")
            with Producer(servers) as p:
                later = [b"b%03d" % i for i in range(60)]
                assert all(p.send("fo", body).status == SendStatus.SEND_OK for body in later)
            wait_for(lambda: (got.extend(m.body for m in c.poll(200)) or True)
                     and set(got) >= set(sent + later), 60, "every message after the failover")
        assert len(got) == len(set(got))  # the offsets were synced before the kill: no repeats
