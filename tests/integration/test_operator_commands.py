"""replog topics and replog groups: the topics and consumer groups as an operator sees them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from broker_harness import REPO, BrokerProcess, _child_env, brokers, run_cli

from common.client import Admin, Producer
from common.core.errors import BrokerError, ResponseCode

pytestmark = pytest.mark.integration


@pytest.mark.timeout(120)
def test_topics_are_listed_made_and_grown_never_shrunk(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "b", defaultTopicQueueNums=2)
    with brokers(b):
        s = ["-s", b.address]
        rc, made = run_cli("topics", *s, "--create", "orders", "--queues", "3")
        assert rc == 0 and made == {"topic": "orders", "queueNums": 3, "before": 0,
                                    "groups": {"broker-a": 0}}  # the cluster: one group
        rc, grown = run_cli("topics", *s, "--create", "orders", "--queues", "4")
        assert rc == 0 and grown["before"] == 3
        rc, refused = run_cli("topics", *s, "--create", "orders", "--queues", "1")
        assert rc == 1 and refused["error"] == "BAD_REQUEST" and "cannot shrink" in refused["remark"]
        with Admin([b.address]) as admin:
            with pytest.raises(BrokerError) as e:
                admin.create_topic("orders", 2)
            assert e.value.code == ResponseCode.BAD_REQUEST and not e.value.retriable
            with Producer([b.address]) as p:
                for q in (0, 0, 3):
                    p.send("orders", b"x", queue_id=q)
                p.send("auto", b"y")  # made on first use, with defaultTopicQueueNums
            assert admin.topics() == {"orders": 4, "auto": 2}
        rc, listed = run_cli("topics", *s)
        assert rc == 0
        auto, orders = listed["topics"]  # sorted by name
        assert (auto["topic"], auto["queueNums"], auto["messages"]) == ("auto", 2, 1)
        assert sorted(auto["maxOffsets"]) == [0, 1]  # the producer picked one of its queues
        assert orders == {"topic": "orders", "queueNums": 4, "messages": 3,
                          "maxOffsets": [2, 0, 0, 1], "perm": 6, "groups": [
                              {"brokerName": "broker-a", "queueNums": 4, "perm": 6,
                               "messages": 3, "maxOffsets": [2, 0, 0, 1]}]}
        rc, one = run_cli("topics", *s, "-t", "orders")
        assert rc == 0 and [t["topic"] for t in one["topics"]] == ["orders"]
        rc, missing = run_cli("topics", *s, "-t", "nope")
        assert rc == 1 and missing["error"] == "TOPIC_NOT_EXIST"
        rc, _ = run_cli("topics", *s, "--create", "x")
        assert rc == 2  # --create without --queues is bad usage
        human = subprocess.run([sys.executable, "-m", "common.cli", "topics", *s], cwd=REPO,
                               env=_child_env(), capture_output=True, timeout=60, check=True)
        text = human.stdout.decode()
        assert "orders" in text and "2 0 0 1" in text, text


@pytest.mark.timeout(120)
def test_groups_show_members_lag_and_dead_letters(tmp_path: Path) -> None:
    from common.client import Consumer

    b = BrokerProcess(tmp_path / "b", defaultTopicQueueNums=2)
    with brokers(b):
        s = ["-s", b.address]
        with Producer([b.address]) as p, Consumer([b.address], group="billing") as c:
            for q, count in ((0, 5), (1, 3)):
                for i in range(count):
                    p.send("orders", f"m{q}-{i}".encode(), queue_id=q)
            c.commit_offset("orders", 0, 2)
            c.commit_offset("orders", 1, 3)
            c.heartbeat("member-1")
            first = c.pull("orders", 0, 0, 1).messages[0]
            assert c.send_back(first, delay_level=-1).topic == "%DLQ%billing"
            with Consumer([b.address], group="audit") as other:
                other.commit_offset("orders", 0, 5)
        rc, doc = run_cli("groups", *s)
        assert rc == 0
        by_name = {g["group"]: g for g in doc["groups"]}
        assert set(by_name) == {"audit", "billing"}
        billing = by_name["billing"]
        assert (billing["members"], billing["deadLetters"], billing["lag"]) == (1, 1, 3)
        (orders,) = billing["topics"]
        assert orders["queues"] == [
            {"queueId": 0, "committedOffset": 2, "maxOffset": 5, "lag": 3},
            {"queueId": 1, "committedOffset": 3, "maxOffset": 3, "lag": 0},
        ]
        assert (by_name["audit"]["members"], by_name["audit"]["lag"]) == (0, 0)
        rc, one = run_cli("groups", *s, "--group", "audit")
        assert rc == 0 and [g["group"] for g in one["groups"]] == ["audit"]
        rc, missing = run_cli("groups", *s, "--group", "nope")
        assert rc == 1 and missing["error"] == "QUERY_NOT_FOUND"
        human = subprocess.run([sys.executable, "-m", "common.cli", "groups", *s], cwd=REPO,
                               env=_child_env(), capture_output=True, timeout=60, check=True)
        assert "billing" in human.stdout.decode() and "orders" in human.stdout.decode()
