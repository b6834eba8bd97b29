"""A cluster of several broker groups on a real ZooKeeper with real broker processes (issue 25;
docs/operations.md "Adding a broker group", docs/contract.md §4): topics over every group,
clients that route over all of them, consumer groups that balance every group's queues,
failover that stays inside its group, a group added while producers run, and the CLI's
cluster views (``replog cluster up --groups``, ``topics``, ``groups``, ``status --cluster``).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from broker_harness import REPO, _child_env, free_port, run_cli
from cluster_harness import Groups
from controller_harness import SESSION_MS, chroot, need_zookeeper, running_zookeeper
from replication_harness import StallWatch, wait_for

from common.client import Admin, Consumer, Producer
from common.client.group_consumer import GroupConsumer
from common.client.routing import queue_for_key
from common.core import ports
from common.core.errors import BrokerError, SendStatus

pytestmark = pytest.mark.integration

TOPIC = "orders"


@pytest.mark.timeout(300)
def test_a_topic_over_two_groups_of_four_queues(tmp_path: Path) -> None:
    """2 groups x 4 queues: keyless sends reach all 8 queues; keyed sends keep their queue and
    their order; a GroupConsumer of 3 members reads every message (at least once, none lost)
    and the committed offsets of every (group, queue) reach its end; the CLI shows the whole
    cluster."""
    with running_zookeeper(tmp_path / "zk") as zk, \
            Groups(tmp_path, zk.hosts + chroot(), groups=2, size=2) as cluster:
        for name in cluster.groups:
            cluster.wait_in_sync(name)
        servers = [cluster.groups["broker-a"][1].address]  # one slave: it names the rest
        with Admin(servers, timeout_ms=10_000) as admin:
            assert admin.create_topic_on_groups(TOPIC, 4) == {"broker-a": 0, "broker-b": 0}
        cluster.wait_route(TOPIC, {"broker-a": 4, "broker-b": 4})

        keys = [f"customer-{i}" for i in range(16)]
        with Producer(servers, timeout_ms=10_000) as p:
            keyless = [p.send(TOPIC, b"keyless-%d" % i) for i in range(64)]
            queues = p.queues(TOPIC)
            futures = [(k, n, p.send_async(TOPIC, f"{k}#{n}".encode(), shard_key=k))
                       for n in range(12) for k in keys]
            keyed = [(k, n, f.result(30)) for k, n, f in futures]
        assert all(r.status == SendStatus.SEND_OK for r in keyless)
        assert {(r.broker_name, r.queue_id) for r in keyless} == {
            (g, q) for g in ("broker-a", "broker-b") for q in range(4)}
        for k in keys:
            mq = queue_for_key(queues, k)
            mine = [r for key, _, r in keyed if key == k]
            assert {(r.broker_name, r.queue_id) for r in mine} == {(mq.broker_name, mq.queue_id)}
            offsets = [r.queue_offset for r in mine]
            assert offsets == sorted(offsets)  # stored in the order sent
        sent = {r.msg_id for r in keyless} | {r.msg_id for _, _, r in keyed}

        # read back per queue: each key's messages in the order sent
        with Consumer(servers, timeout_ms=10_000) as c:
            for mq in queues:
                bodies = [m.body.decode() for m in c.pull(
                    TOPIC, mq.queue_id, 0, 256, broker_name=mq.broker_name).messages]
                for k in keys:
                    seq = [int(b.split("#")[1]) for b in bodies if b.startswith(f"{k}#")]
                    assert seq in ([], list(range(12))), (k, mq, seq)

        read = _consume_with_three_members(servers, sent)
        assert {m.msg_id for m in read} >= sent  # at least once: none lost
        assert {m.broker_name for m in read} == {"broker-a", "broker-b"}
        with Consumer(servers, group="billing", timeout_ms=10_000) as c:
            for mq in queues:
                end = c.max_offset(TOPIC, mq.queue_id, broker_name=mq.broker_name)
                assert c.fetch_offset(TOPIC, mq.queue_id, broker_name=mq.broker_name) == end

        _check_cli_views(servers, len(sent))


def _consume_with_three_members(servers: list[str], sent: set[str]) -> list[Any]:
    members = [GroupConsumer(servers, "billing", [TOPIC], start="earliest", heartbeat_ms=300,
                             timeout_ms=10_000, client_id=f"member-{i}") for i in range(3)]
    read: list[Any] = []
    try:
        deadline = time.monotonic() + 60
        while not sent <= {m.msg_id for m in read} or not _settled(members):
            assert time.monotonic() < deadline, (len({m.msg_id for m in read}),
                                                 [m.assignment() for m in members])
            for m in members:
                read += m.poll(100)
        shares = [{q for q in m.assignment() if q[0] == TOPIC} for m in members]
        assert sorted(len(s) for s in shares) == [2, 3, 3]  # 8 queues over 3 members
        for m in members:
            m.commit()
    finally:
        for m in members:
            m.close()
    return read


def _settled(members: list[GroupConsumer]) -> bool:
    shares = [{q for q in m.assignment() if q[0] == TOPIC} for m in members]
    return sum(map(len, shares)) == 8 and len(set().union(*shares)) == 8


def _check_cli_views(servers: list[str], messages: int) -> None:
    s = ["-s", servers[0]]
    rc, doc = run_cli("topics", *s, "-t", TOPIC)
    assert rc == 0, doc
    (row,) = doc["topics"]
    assert row["queueNums"] == 8 and row["messages"] == messages and row["perm"] == 6
    assert [(g["brokerName"], g["queueNums"]) for g in row["groups"]] == [
        ("broker-a", 4), ("broker-b", 4)]
    rc, doc = run_cli("groups", *s, "--group", "billing")
    assert rc == 0, doc
    (group,) = doc["groups"]
    (topic,) = [t for t in group["topics"] if t["topic"] == TOPIC]
    assert topic["lag"] == 0 and {q["brokerName"] for q in topic["queues"]} == {
        "broker-a", "broker-b"} and len(topic["queues"]) == 8
    rc, doc = run_cli("status", *s, "--cluster")
    assert rc == 0, doc
    assert doc["controller"] is True
    assert sorted(g["brokerName"] for g in doc["groups"]) == ["broker-a", "broker-b"]
    assert all(g["master"] and g["masterStatus"]["role"] == "SYNC_MASTER" for g in doc["groups"])
    rc, doc = run_cli("send", *s, "-t", TOPIC, "-b", "x", "--queue", "1")
    assert rc == 1 and doc["error"] == "BAD_REQUEST" and "broker_name" in doc["remark"]
    rc, doc = run_cli("send", *s, "-t", TOPIC, "-b", "x", "--queue", "1",
                      "--broker-name", "broker-b")
    assert rc == 0 and (doc["brokerName"], doc["queueId"]) == ("broker-b", 1)
    rc, doc = run_cli("pull", *s, "-t", TOPIC, "-q", "1", "--broker-name", "broker-b",
                      "-o", "0", "-n", "500")
    assert rc == 0 and doc["messages"][-1]["body"] == "x"
    assert {m["brokerName"] for m in doc["messages"]} == {"broker-b"}


@pytest.mark.timeout(300)
def test_a_failover_in_one_group_never_pauses_the_other(tmp_path: Path) -> None:
    """SIGKILL broker-a's master while producers send to both groups: the sends to broker-b
    (pinned there) never fail and never wait on broker-a (no gap near the session timeout
    between their SEND_OKs); keyless sends pass over broker-a and none fails (one retry);
    broker-a elects a new master, the old one rejoins as its slave, and keyless sends reach
    broker-a again.

    Both groups detect failures in the harness's short times. A failed run says whether this
    machine stalled meanwhile (``StallWatch``): broker-b's own failure detection firing on a
    stall of a second or two (a slave silent 2 s is dropped from its set) is not broker-a's
    failover reaching it, and the report tells the two apart."""
    with running_zookeeper(tmp_path / "zk") as zk, \
            Groups(tmp_path, zk.hosts + chroot(), groups=2, size=2) as cluster, \
            StallWatch() as stalls:
        for name in cluster.groups:
            cluster.wait_in_sync(name)
        servers = cluster.servers
        with Admin(servers, timeout_ms=10_000) as admin:
            admin.create_topic(TOPIC, 4)
        cluster.wait_route(TOPIC, {"broker-a": 4, "broker-b": 4})
        stop = threading.Event()
        log: dict[str, list[tuple[float, str, str]]] = collections.defaultdict(list)

        def sender(kind: str, **kw: Any) -> None:
            with Producer(servers, timeout_ms=10_000, retries=1) as p:
                i = 0
                while not stop.is_set():
                    i += 1
                    try:
                        r = p.send(TOPIC, b"%s-%d" % (kind.encode(), i), **kw)
                        log[kind].append((time.monotonic(), r.status.value, r.broker_name))
                    except BrokerError as e:
                        log[kind].append((time.monotonic(), e.code.name, ""))
                    stop.wait(0.01)

        threads = [threading.Thread(target=sender, args=("b",), kwargs={
            "broker_name": "broker-b"}), threading.Thread(target=sender, args=("any",))]
        for t in threads:
            t.start()
        try:
            wait_for(lambda: len(log["b"]) > 20 and len(log["any"]) > 20, 30, "sends")
            old = cluster.master("broker-a")
            killed_at = time.monotonic()
            os.kill(old.pid, signal.SIGKILL)
            new = cluster.master("broker-a", timeout_s=60)
            assert new is not old
            old.start()  # rejoins as the new master's slave: SYNC sends are confirmed again
            cluster.wait_in_sync("broker-a", timeout_s=60)
            rejoined_at = time.monotonic()
            wait_for(lambda: any(t > rejoined_at and g == "broker-a" and st == "SEND_OK"
                                 for t, st, g in list(log["any"])), 30,
                     "keyless sends to reach broker-a's new master")
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        during = [e for e in log["b"] if e[0] >= killed_at]
        bad = [(round(t - killed_at, 3), st, g) for t, st, g in during
               if st != "SEND_OK" or g != "broker-b"]
        assert during and not bad, (
            f"{len(bad)} of {len(during)} sends to broker-b after the kill were not SEND_OK "
            f"(seconds after the kill, status, group): the first {bad[:5]}, the last "
            f"{bad[-3:]}; before the kill: "
            f"{collections.Counter(st for t, st, _ in log['b'] if t < killed_at)}; this "
            f"machine's stalls over 0.5 s meanwhile (seconds after the kill, length): "
            f"{stalls.since(killed_at)}")
        times = [killed_at] + [t for t, _, _ in during]
        gap = max(b - a for a, b in itertools.pairwise(times))
        assert gap < SESSION_MS / 1000 / 2, gap  # broker-a is replaced after ~a session
        keyless = [e for e in log["any"] if e[0] >= killed_at]
        # none failed; broker-a's new master, alone until the old one rejoined, stored some as
        # SLAVE_NOT_AVAILABLE (its group has no other replica then) before keyless sends
        # passed it over; every other send got SEND_OK
        assert all(st in ("SEND_OK", "SLAVE_NOT_AVAILABLE") for _, st, _ in keyless), \
            collections.Counter(st for _, st, _ in keyless)
        assert all(g == "broker-a" for _, st, g in keyless if st != "SEND_OK")


@pytest.mark.timeout(300)
def test_a_group_added_while_producers_run_gets_traffic_within_one_route_ttl(
        tmp_path: Path) -> None:
    """A producer sends keyless messages to a one-group cluster; a second group starts and
    the topic is made on it: within one route TTL (plus a load margin) sends reach it, with no
    failed send on the way."""
    ttl_ms = 3000
    with running_zookeeper(tmp_path / "zk") as zk, \
            Groups(tmp_path, zk.hosts + chroot(), groups=1, size=1,
                   role="ASYNC_MASTER") as cluster:
        cluster.master("broker-a")
        with Admin(cluster.servers, timeout_ms=10_000) as admin:
            admin.create_topic(TOPIC, 2)
        stop = threading.Event()
        results: list[tuple[float, str]] = []
        errors: list[BrokerError] = []

        def sender() -> None:
            with Producer(cluster.servers, timeout_ms=10_000, route_ttl_ms=ttl_ms) as p:
                while not stop.is_set():
                    try:
                        results.append((time.monotonic(), p.send(TOPIC, b"x").broker_name))
                    except BrokerError as e:
                        errors.append(e)
                    stop.wait(0.02)

        thread = threading.Thread(target=sender)
        thread.start()
        try:
            wait_for(lambda: len(results) > 10, 30, "sends to broker-a")
            cluster.add("broker-b")
            cluster.master("broker-b")
            with Admin([cluster.groups["broker-b"][0].address], timeout_ms=10_000) as admin:
                admin.create_topic(TOPIC, 2, broker_names=["broker-b"])
            made_at = time.monotonic()
            reached = wait_for(lambda: next((t for t, g in list(results) if g == "broker-b"),
                                            None), ttl_ms / 1000 + 10, "a send to broker-b")
            wait_for(lambda: len([t for t, _ in list(results) if t > reached]) >= 20, 30,
                     "sends after the first to broker-b")
        finally:
            stop.set()
            thread.join(30)
        assert reached - made_at <= ttl_ms / 1000 + 2.0, reached - made_at
        assert not errors, errors[:3]
        after = [g for t, g in results if t > reached]
        assert {"broker-a", "broker-b"} <= set(after)


@pytest.mark.timeout(240)
def test_cluster_up_runs_several_groups_on_one_zookeeper(tmp_path: Path) -> None:
    """``replog cluster up --groups 2 --slaves 1``: two groups, the first group's master on
    the base port, the second's brokers 100 ports up; every broker answers CLUSTER_INFO with
    both groups; a topic made with ``replog topics --create`` lands on both."""
    need_zookeeper()
    base = _free_base()
    proc = subprocess.Popen(
        [sys.executable, "-m", "common.cli", "cluster", "up", "--dir", str(tmp_path / "c"),
         "--groups", "2", "--slaves", "1", "--base-port", str(base), "--json"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_child_env(),
        start_new_session=True)
    pids: list[int] = []  # what cluster up started: killed by pid whatever happens
    try:
        assert proc.stdout is not None
        doc = json.loads(proc.stdout.readline())
        pids = [b["pid"] for b in doc["brokers"]] + [z["pid"] for z in doc["zookeeper"]] + \
            [doc["console"]["pid"]]
        brokers = {b["name"]: b for b in doc["brokers"]}
        assert set(brokers) == {"broker-a-0", "broker-a-1", "broker-b-0", "broker-b-1"}
        assert brokers["broker-a-0"]["address"] == f"127.0.0.1:{base}"
        assert brokers["broker-b-1"]["address"] == f"127.0.0.1:{base + 110}"
        assert {b["group"] for b in doc["brokers"]} == {"broker-a", "broker-b"}

        def both() -> dict[str, Any] | None:
            rc, info = run_cli("status", "-s", f"127.0.0.1:{base + 100}", "--cluster")
            if rc != 0 or len(info["groups"]) != 2 or not all(
                    g["master"] for g in info["groups"]):
                return None
            return info

        # ready means routed: every group has a master in the routes the moment the ready line
        # is out (it once came before, and a topic made then landed on one group only)
        info = both()
        assert info is not None, run_cli("status", "-s", f"127.0.0.1:{base + 100}", "--cluster")
        assert sorted(g["brokerName"] for g in info["groups"]) == ["broker-a", "broker-b"]
        rc, made = run_cli("topics", "-s", f"127.0.0.1:{base}", "--create", "t", "--queues", "3")
        assert rc == 0 and made["groups"] == {"broker-a": 0, "broker-b": 0}
        # the brokers authenticate with ZooKeeper: nobody else may touch their znodes
        auth = tmp_path / "c" / "zookeeper-auth"
        assert auth.stat().st_mode & 0o077 == 0
        configs = [(tmp_path / "c" / name / "broker.yaml").read_text() for name in brokers]
        assert all(f"controllerAuthFile: {auth}" in text for text in configs)
    finally:
        proc.send_signal(signal.SIGTERM)  # cluster up stops its children, ZooKeeper last
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # stopped cleanly by cluster up


def _free_base() -> int:
    for _ in range(50):
        base = free_port(3)
        if base + 200 < ports.unassigned_range()[1] and all(ports.is_free(base + off) for off in (
                10, 11, 12, 88, 90, 100, 101, 102, 110, 111, 112)):
            return base
    raise RuntimeError("no free port range for a two-group cluster")
