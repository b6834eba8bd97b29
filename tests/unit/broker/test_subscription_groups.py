"""Consumer groups' configs, ``config/subscriptionGroup.json`` (RocketMQ's
SubscriptionGroupConfig): made by ``replog groups --create`` or on first use, copied by slaves,
and acted on: ``consumeMessageOrderly`` makes a group's POPs FIFO, ``retryMaxTimes`` decides
when a message goes to the DLQ, ``consumeEnable`` false refuses the group's reads, and with
``autoCreateSubscriptionGroup`` off a group must be made first."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.brokers import addr, wait_for

from common.broker.broker import Broker
from common.broker.subscription_groups import SubscriptionGroupTable
from common.client import Admin, Consumer, Producer, SimpleConsumer
from common.core.errors import BrokerError, ResponseCode
from common.core.message import dlq_topic
from common.format.protocol import RequestCode
from common.format.tables import GroupConfig

pytestmark = [pytest.mark.unit, pytest.mark.timeout(90)]

INVISIBLE = 1_000
BROKER = {"real_store": True, "brokerName": "pb"}


def send(broker: Broker, bodies: list[tuple[str, str]], topic: str = "t") -> None:
    """(body, message group) pairs: a message group's to its queue, the others to queue 0."""
    with Producer([addr(broker)]) as p:
        for body, group in bodies:
            if group:
                p.send(topic, body.encode(), shard_key=group)
            else:
                p.send(topic, body.encode(), queue_id=0)


def test_the_table_is_rocketmqs_file_and_refuses_a_malformed_one(tmp_path: Path) -> None:
    table = SubscriptionGroupTable(tmp_path)
    assert table.get("g") is None and table.find("g", persist=False) == GroupConfig("g")
    assert not (tmp_path / "subscriptionGroup.json").exists()  # a slave writes nothing
    assert table.find("g", persist=True) == GroupConfig("g")
    assert table.update(GroupConfig("h", consume_message_orderly=True, retry_max_times=3)) is None
    doc = json.loads((tmp_path / "subscriptionGroup.json").read_text())
    assert doc["subscriptionGroupTable"]["h"] == {
        "groupName": "h", "consumeEnable": True, "consumeMessageOrderly": True,
        "retryMaxTimes": 3}
    assert SubscriptionGroupTable(tmp_path).groups() == table.groups()  # read back
    assert SubscriptionGroupTable(tmp_path, auto_create=False).find("new", persist=True) is None
    for bad in ({"subscriptionGroupTable": {"x": {"retryMaxTimes": -1}}},
                {"subscriptionGroupTable": {"x": {"consumeEnable": "yes"}}},
                {"subscriptionGroupTable": {"x": {"groupName": "y"}}},
                {"subscriptionGroupTable": []}):
        with pytest.raises(ValueError, match="subscriptionGroup|master"):
            table.replace(json.dumps(bad).encode(), "master")
    assert table.get("h") is not None  # nothing changed
    copy = SubscriptionGroupTable(tmp_path / "copy")
    assert copy.replace(table.to_bytes(), "master") and copy.groups() == table.groups()
    assert not copy.replace(table.to_bytes(), "master")
    assert table.delete("h") is not None and table.delete("h") is None


def test_an_orderly_group_pops_in_order_whatever_its_consumers_ask(
        make_broker: Callable[..., Broker]) -> None:
    """consumeMessageOrderly is the group's FIFO attribute: its consumers ask nothing, yet a
    message group's next message is handed out only after the one before it is acked."""
    broker = make_broker(**BROKER)
    send(broker, [("A0", "A"), ("A1", "A"), ("A2", "A")])
    with Admin([addr(broker)]) as admin:
        assert admin.create_group("fifo", orderly=True) == {"pb": True}
        assert admin.create_group("fifo", orderly=True) == {"pb": False}
    with SimpleConsumer([addr(broker)], "fifo") as c, \
            SimpleConsumer([addr(broker)], "plain") as p:
        assert len(p.receive("t", 32, INVISIBLE)) == 3  # another group: all at once
        order = []
        for _ in range(3):
            got = c.receive("t", 32, INVISIBLE, wait_ms=500)
            assert len(got) == 1  # one of the message group at a time
            order.append(got[0].message.body)
            assert c.receive("t", 32, INVISIBLE) == []  # the next waits for this ack
            c.ack(got[0])
        assert order == [b"A0", b"A1", b"A2"]


def test_the_groups_retry_max_times_decides_when_a_message_is_dead(
        make_broker: Callable[..., Broker]) -> None:
    """A consumer that names no maxReconsumeTimes gets its group's retryMaxTimes: for a POP's
    revive and for a send-back alike."""
    broker = make_broker(**BROKER)
    send(broker, [("p0", ""), ("s0", "")])
    with Admin([addr(broker)]) as admin:
        admin.create_group("g", retry_max_times=1)
    counts = []
    with SimpleConsumer([addr(broker)], "g") as c:
        deadline = time.monotonic() + 30
        while len(counts) < 3 and time.monotonic() < deadline:
            got = c.receive("t", 1, INVISIBLE, wait_ms=1500)
            for r in got:
                if r.message.body == b"s0":
                    c.ack(r)  # the send-back's message, read below by offset
                else:
                    counts.append(r.message.reconsume_times)
            if counts == [0, 1]:
                break
        assert counts == [0, 1]  # handed out twice (retryMaxTimes 1): then the DLQ
    with Consumer([addr(broker)], group="g") as reader:
        dead = wait_for(lambda: reader.pull(dlq_topic("g"), 0, 0, 8).messages,
                        "the POP's DLQ copy", timeout_s=10)
        assert [m.body for m in dead] == [b"p0"]
        [s0] = [m for m in reader.pull("t", 0, 0, 8).messages if m.body == b"s0"]
        assert reader.send_back(s0).topic == "%RETRY%g"  # first failure: retried
        copy = wait_for(lambda: reader.pull("%RETRY%g", 0, 0, 8).messages, "the retry copy",
                        timeout_s=60)[0]
        assert reader.send_back(copy).topic == dlq_topic("g")  # retried once: dead
        assert reader.send_back(s0, max_reconsume_times=5).topic == "%RETRY%g"  # its own


def test_a_disabled_group_is_refused_its_reads_until_enabled(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(**BROKER)
    send(broker, [("m0", "")])
    with Admin([addr(broker)]) as admin:
        admin.create_group("g", consume_enable=False)
        with SimpleConsumer([addr(broker)], "g", retries=0) as c, \
                Consumer([addr(broker)], group="g", retries=0) as puller:
            for read in (lambda: c.receive("t", 1, INVISIBLE),
                         lambda: puller.pull("t", 0, 0, 1)):
                with pytest.raises(BrokerError) as e:
                    read()
                assert e.value.code == ResponseCode.NO_PERMISSION
                assert "consumeEnable" in e.value.remark
            admin.create_group("g")
            assert [r.message.body for r in c.receive("t", 1, INVISIBLE)] == [b"m0"]
            assert [m.body for m in puller.pull("t", 0, 0, 1).messages] == [b"m0"]


def test_without_auto_create_a_group_must_be_made_first(
        make_broker: Callable[..., Broker], capsys: pytest.CaptureFixture[str]) -> None:
    from common.cli.main import main

    broker = make_broker(autoCreateSubscriptionGroup=False, **BROKER)
    send(broker, [("m0", "")])
    server = addr(broker)
    with SimpleConsumer([server], "g", retries=0) as c, \
            Consumer([server], group="g", retries=0) as puller:
        with pytest.raises(BrokerError) as e:
            c.receive("t", 1, INVISIBLE)
        assert e.value.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
        assert "replog groups --create g" in e.value.remark
        broker.groups.update(GroupConfig("reader"))
        with Consumer([server], group="reader") as reader:
            [m0] = reader.pull("t", 0, 0, 1).messages
        with pytest.raises(BrokerError) as e:
            puller.send_back(m0)
        assert e.value.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
        assert main(["groups", "-s", server, "--create", "g", "--orderly", "--retry-max",
                     "4", "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"group": "g", "created": {"pb": True}}
        assert [r.message.body for r in c.receive("t", 1, INVISIBLE)] == [b"m0"]
        puller.commit_offset("t", 0, 1)
    assert main(["groups", "-s", server, "--group", "g", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["groups"]
    assert row["config"] == {"groupName": "g", "consumeEnable": True,
                             "consumeMessageOrderly": True, "retryMaxTimes": 4}
    assert main(["groups", "-s", server, "--delete", "g", "--clean-offset", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["deleted"] == {
        "pb": {"deleted": 1, "offsetsRemoved": 1}}
    assert broker.groups.get("g") is None and broker.offsets.fetch("g", "t", 0) == -1
    with pytest.raises(SystemExit):
        main(["groups", "-s", server, "--orderly"])  # --orderly goes with --create


def test_a_group_made_on_first_use_is_written_by_the_master_only(
        make_broker: Callable[..., Broker]) -> None:
    master = make_broker(**BROKER)
    slave = make_broker(brokerRole="SLAVE", brokerId=1, haMasterAddress="127.0.0.1:1", **BROKER)
    send(master, [("m0", "")])
    with Consumer([addr(master)], group="first-use") as c:
        c.pull("t", 0, 0, 1)
    assert master.groups.get("first-use") == GroupConfig("first-use")
    with Consumer([addr(slave)], group="on-a-slave", retries=0) as c:
        resp = c._cluster.request(addr(slave), RequestCode.PULL, {
            "topic": "t", "queueId": 0, "queueOffset": 0, "group": "on-a-slave"})
    assert resp.code == ResponseCode.PULL_NOT_FOUND  # served: the slave holds no message
    assert slave.groups.get("on-a-slave") is None  # served with the defaults, not written
    with Admin([addr(slave)], retries=0) as admin:
        resp = admin._cluster.request(addr(slave), RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                                      {"groupName": "x"})
    assert resp.code != ResponseCode.SUCCESS and slave.groups.get("x") is None
