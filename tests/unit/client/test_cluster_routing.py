"""Clients over two broker groups, in one process: routes, keyed and keyless sends, reads and
commits that go to the owning group, a group without a master passed over, consumer groups
over both (docs/contract.md §4, "Many broker groups").

Two brokers on the in-memory store, ``broker-a`` and ``broker-b``, each the master of its own
group. Each answers CLUSTER_INFO with both groups (as a controller-mode broker answers from
ZooKeeper) and fences commits over both groups' queues (as ``Broker.topic_layout`` does from
the controller's view); ``TwoGroups.down`` makes a group's route say it has no master, as
ZooKeeper says once its master's session is gone.
"""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers.brokers import addr

from common.broker.broker import Broker
from common.broker.consumer_groups import ConsumerGroups
from common.client import Admin, Consumer, Producer
from common.client.group_consumer import GroupConsumer, allocate_over_groups
from common.client.routes import ROUTE_RETRY_S
from common.client.routing import MessageQueue, RouteTable, queue_for_key
from common.core.errors import BrokerError, PullStatus, ResponseCode, SendStatus
from common.format.protocol import decode_record

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


class TwoGroups:
    def __init__(self, make_broker: Callable[..., Broker], **fields: Any):
        self.a = make_broker(brokerName="broker-a", brokerClusterName="c", **fields)
        self.b = make_broker(brokerName="broker-b", brokerClusterName="c", **fields)
        self.down: set[str] = set()
        self._own = {b.cfg.brokerName: b.cluster_info for b in (self.a, self.b)}
        self._docs: dict[str, dict[str, Any]] = {}
        for broker in (self.a, self.b):
            broker.cluster_info = self.cluster_info  # type: ignore[method-assign]
            broker.topic_layout = self.topic_layout  # type: ignore[method-assign]

    @property
    def brokers(self) -> dict[str, Broker]:
        return {"broker-a": self.a, "broker-b": self.b}

    def cluster_info(self) -> dict[str, Any]:
        groups = []
        for name, own in self._own.items():
            if name not in self.down:
                self._docs[name] = own()["groups"][0]
            doc = dict(self._docs[name])
            if name in self.down:
                doc["master"] = ""
            groups.append(doc)
        return {"cluster": "c", "controller": True, "groups": groups}

    def topic_layout(self, topic: str) -> dict[str, int]:
        return {name: b.topics.queue_nums(topic) for name, b in self.brokers.items()
                if b.topics.queue_nums(topic)}

    @property
    def servers(self) -> list[str]:
        return [addr(self.a)]  # one broker is enough: the route names the other group

    def stored(self, name: str, topic: str, queue_id: int) -> list[bytes]:
        store: Any = self.brokers[name].store
        return [decode_record(store.by_phy[phy]).body
                for phy in store.queues.get((topic, queue_id), [])]


@pytest.fixture
def groups(make_broker: Callable[..., Broker]) -> TwoGroups:
    g = TwoGroups(make_broker, autoCreateTopicEnable=True, defaultTopicQueueNums=4)
    with Admin(g.servers, timeout_ms=5000) as admin:
        assert admin.create_topic_on_groups("orders", 4) == {"broker-a": 0, "broker-b": 0}
    return g


def test_a_topic_created_on_the_cluster_has_its_queues_in_every_group(groups: TwoGroups) -> None:
    with Admin(groups.servers, timeout_ms=5000) as admin:
        assert admin.topics()["orders"] == 8
        assert admin.topic_layout()["orders"] == {"broker-a": 4, "broker-b": 4}
        assert admin.create_topic("orders", 6, broker_names=["broker-b"]) == 4  # grown
        assert admin.topic_layout()["orders"] == {"broker-a": 4, "broker-b": 6}
        with pytest.raises(BrokerError) as e:
            admin.create_topic("orders", 2)  # never shrinks: refused, naming the group
        assert e.value.code == ResponseCode.BAD_REQUEST and "broker-a" in e.value.remark
        with pytest.raises(BrokerError) as e:
            admin.create_topic("orders", 8, broker_names=["broker-z"])
        assert e.value.code == ResponseCode.BAD_REQUEST and "broker-a, broker-b" in \
            e.value.remark
        info = RouteTable.from_cluster_info(admin.cluster_info())
    assert info.perm("orders", "broker-a") == 6  # read|write, as the route carries it
    assert [str(q) for q in info.queues("orders")][:5] == [
        "broker-a/0", "broker-a/1", "broker-a/2", "broker-a/3", "broker-b/0"]


def test_keyless_sends_reach_every_queue_of_every_group(groups: TwoGroups) -> None:
    # send_async stays on a queue for batch_size messages (sticky): 400 cover 25 runs
    with Producer(groups.servers, timeout_ms=5000, batch_size=16) as p:
        results = [p.send("orders", b"m%d" % i) for i in range(40)]
        batch = p.send_batch("orders", [b"x", b"y"])
        futures = [p.send_async("orders", b"async-%d" % i) for i in range(400)]
        async_results = [f.result(20) for f in futures]
    assert all(r.status == SendStatus.SEND_OK for r in results + batch + async_results)
    assert {(r.broker_name, r.queue_id) for r in results} == {
        (g, q) for g in ("broker-a", "broker-b") for q in range(4)}
    assert {(r.broker_name, r.queue_id) for r in async_results} == {
        (g, q) for g in ("broker-a", "broker-b") for q in range(4)}
    assert len({r.broker_name for r in batch}) == 1  # one request, one queue, one group
    for r in results:  # stored where the result says
        assert b"m%d" % results.index(r) in groups.stored(r.broker_name, "orders", r.queue_id)


def test_keyed_sends_keep_their_queue_and_order_over_both_groups(groups: TwoGroups) -> None:
    keys = [f"order-{i}" for i in range(24)]
    with Producer(groups.servers, timeout_ms=5000) as p:
        queues = p.queues("orders")
        assert len(queues) == 8
        sent: dict[str, list[Any]] = collections.defaultdict(list)
        futures = []
        for n in range(10):
            for k in keys:
                if n % 2:
                    sent[k].append(p.send("orders", f"{k}#{n}".encode(), shard_key=k))
                else:
                    futures.append((k, p.send_async("orders", f"{k}#{n}".encode(),
                                                    shard_key=k)))
            for k, f in futures:
                sent[k].append(f.result(20))
            futures.clear()
    for k in keys:
        expected = queue_for_key(queues, k)  # RocketMQ's SelectMessageQueueByHash, whole list
        assert {(r.broker_name, r.queue_id) for r in sent[k]} == {
            (expected.broker_name, expected.queue_id)}
        bodies = [b for b in groups.stored(expected.broker_name, "orders", expected.queue_id)
                  if b.startswith(f"{k}#".encode())]
        assert bodies == [f"{k}#{n}".encode() for n in range(10)]  # the order sent
    assert len({queue_for_key(queues, k).broker_name for k in keys}) == 2


def test_a_queue_id_needs_its_group_once_several_hold_the_topic(groups: TwoGroups) -> None:
    with Producer(groups.servers, timeout_ms=5000, retries=0) as p, \
            Consumer(groups.servers, group="g", timeout_ms=5000) as c:
        with pytest.raises(BrokerError) as e:
            p.send("orders", b"x", queue_id=1)
        assert e.value.code == ResponseCode.BAD_REQUEST and not e.value.retriable
        assert "broker-a, broker-b" in e.value.remark and "broker_name" in e.value.remark
        r = p.send("orders", b"to-b", queue_id=1, broker_name="broker-b")
        assert (r.broker_name, r.queue_id) == ("broker-b", 1)
        with pytest.raises(BrokerError) as e:
            p.send("orders", b"x", broker_name="broker-q")
        assert e.value.code == ResponseCode.BAD_REQUEST and "broker-q" in e.value.remark
        # a topic one group holds: queue ids alone still work, as with one group
        with Admin(groups.servers) as admin:
            admin.create_topic("solo", 2, broker_names=["broker-a"])
        r = p.send("solo", b"only-a", queue_id=1)
        assert (r.broker_name, r.queue_id) == ("broker-a", 1)
        pr = c.pull("solo", 1, 0)
        assert [m.body for m in pr.messages] == [b"only-a"]
        assert pr.messages[0].broker_name == "broker-a"
        with pytest.raises(BrokerError) as e:
            c.pull("orders", 1, 0)
        assert e.value.code == ResponseCode.BAD_REQUEST
        pr = c.pull("orders", 1, 0, broker_name="broker-b")
        assert [m.body for m in pr.messages] == [b"to-b"]
        assert pr.messages[0].broker_name == "broker-b"
        assert c.max_offset("orders", 1, broker_name="broker-b") == 1
        assert c.max_offset("orders", 1, broker_name="broker-a") == 0
        c.commit_offset("orders", 1, 1, broker_name="broker-b")  # to broker-b's master
        assert c.fetch_offset("orders", 1, broker_name="broker-b") == 1
        assert c.fetch_offset("orders", 1, broker_name="broker-a") == -1
        assert groups.b.offsets.fetch("g", "orders", 1) == 1
        assert groups.a.offsets.fetch("g", "orders", 1) == -1


def test_a_group_without_a_master_is_passed_over_by_keyless_sends(groups: TwoGroups) -> None:
    """broker-b's master dies: the keyless send that meets the dead master retries on
    broker-a, and broker-b is passed over while it is isolated; once the route says it has no
    master, none goes there at all. Keyed sends of broker-b's queues wait, then fail naming
    the group; broker-a's go on."""
    with Producer(groups.servers, timeout_ms=3000, retries=1) as p:
        key_b = next(k for k in (f"k{i}" for i in range(100))
                     if queue_for_key(p.queues("orders"), k).broker_name == "broker-b")
        key_a = next(k for k in (f"k{i}" for i in range(100))
                     if queue_for_key(p.queues("orders"), k).broker_name == "broker-a")
        groups.b.shutdown()
        results = [p.send("orders", b"while-b-is-down-%d" % i) for i in range(20)]
        assert all(r.status == SendStatus.SEND_OK and r.broker_name == "broker-a"
                   for r in results)
        groups.down.add("broker-b")  # ZooKeeper: broker-b has no master now
        p._routes.refresh()
        started = time.monotonic()
        results = [p.send("orders", b"route-says-down-%d" % i) for i in range(40)]
        assert time.monotonic() - started < 2.0  # no send waited on broker-b
        assert {r.broker_name for r in results} == {"broker-a"}
        assert p.send("orders", b"keyed-a", shard_key=key_a).broker_name == "broker-a"
        started = time.monotonic()
        with pytest.raises(BrokerError) as e:
            p.send("orders", b"keyed-b", shard_key=key_b)
        assert e.value.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert "broker group broker-b" in e.value.remark
        assert time.monotonic() - started >= 2.5  # it waited for a master (timeout_ms)
        failed = p.send_async("orders", b"async-keyed-b", shard_key=key_b)
        assert isinstance(failed.exception(15), BrokerError)
        ok = [p.send_async("orders", b"async-%d" % i) for i in range(50)]
        assert {f.result(15).broker_name for f in ok} == {"broker-a"}


def test_a_refused_send_names_the_broker_and_group_that_refused_it(groups: TwoGroups) -> None:
    """A send a master refuses (here its controller lease, as a loaded drill saw) raises with
    ``address`` and ``broker_name`` set, as RocketMQ's MQBrokerException names the broker: a
    keyless send's caller learns which group it reached, and a drill can count the failure
    against that group."""
    groups.b.role._write_gate = lambda: "this master's controller lease is not fresh"  # type: ignore[union-attr]
    with Producer(groups.servers, timeout_ms=3000, retries=0) as p:
        refused = []
        for i in range(8):  # keyless: round robin over both groups' queues
            try:
                p.send("orders", b"m%d" % i)
            except BrokerError as e:
                refused.append(e)
    assert refused and all(e.code == ResponseCode.SERVICE_NOT_AVAILABLE for e in refused)
    assert {(e.broker_name, e.address) for e in refused} == {("broker-b", addr(groups.b))}
    with Producer(groups.servers, timeout_ms=3000) as p, \
            pytest.raises(BrokerError) as before:  # refused before any broker: names none
        p.send("orders", b"x" * (p.max_message_size + 1))
    assert before.value.code == ResponseCode.MESSAGE_ILLEGAL
    assert before.value.broker_name == "" and before.value.address is None


def test_a_group_consumer_of_three_members_reads_both_groups(
        groups: TwoGroups, caplog: pytest.LogCaptureFixture) -> None:
    """2 groups x 4 queues, 3 members: each (group, queue) is read by one member, the
    allocation each member computes is what each group's master fences commits by (no commit
    is refused), and every message is read; the committed offsets reach the queues' ends."""
    with Producer(groups.servers, timeout_ms=5000) as p:
        sent = {p.send("orders", f"m{i}".encode()).msg_id for i in range(160)}
    members = [GroupConsumer(groups.servers, "billing", ["orders"], start="earliest",
                             heartbeat_ms=200, timeout_ms=5000, client_id=f"member-{i}")
               for i in range(3)]
    read: list[Any] = []
    try:
        def assigned() -> bool:
            for m in members:
                read.extend(m.poll(50))
            shares = [set(m.assignment()) - {q for q in m.assignment() if q[0] != "orders"}
                      for m in members]
            return sum(map(len, shares)) == 8 and len(set().union(*shares)) == 8

        deadline = time.monotonic() + 20
        while not assigned():
            assert time.monotonic() < deadline, [m.assignment() for m in members]
        assert all(len(q) == 3 for m in members for q in m.assignment())  # (topic, id, group)
        caplog.clear()  # settled: from here no master refuses a member's commit
        deadline = time.monotonic() + 30
        while {m.msg_id for m in read} != sent:
            assert time.monotonic() < deadline, len({m.msg_id for m in read})
            for m in members:
                read += m.poll(100)
        for m in members:
            m.commit()
        fenced = [r for r in caplog.records if "group_commit_fenced" in r.getMessage()]
        assert not fenced, [r.getMessage() for r in fenced]
    finally:
        for m in members:
            m.close()
    for name, broker in groups.brokers.items():
        for q in range(4):
            assert broker.offsets.fetch("billing", "orders", q) == len(
                groups.stored(name, "orders", q))
    assert {m.broker_name for m in read} == {"broker-a", "broker-b"}


def test_the_allocation_over_groups_is_what_each_master_fences_by() -> None:
    """For random layouts and member lists (which may differ between the groups' masters),
    a member reads a queue of group g exactly when g's master lets it commit there."""
    rng = random.Random(7)
    for _ in range(300):
        layout = {f"g{i}": rng.randint(1, 6) for i in range(rng.randint(1, 4))}
        everyone = [f"m{i}" for i in range(rng.randint(1, 6))]
        members = {g: sorted(rng.sample(everyone, rng.randint(1, len(everyone))))
                   for g in layout}
        queues = [("t", q, g) for g in sorted(layout) for q in range(layout[g])]
        fences = {}
        for g in layout:
            fences[g] = ConsumerGroups()
            for m in members[g]:
                fences[g].heartbeat("cg", m, 10_000)
        for me in everyone:
            mine = set(allocate_over_groups(["t"], queues, dict(members), me))
            for _, q, g in queues:
                owns = fences[g].owns("cg", me, "t", q, layout, g)
                assert owns == (("t", q, g) in mine), (layout, members, me, g, q)
        if all(members[g] == everyone for g in layout):  # agreed lists: a partition
            shares = [allocate_over_groups(["t"], queues, dict(members), m) for m in everyone]
            assert sorted(q for s in shares for q in s) == sorted(queues)


def test_a_route_refresh_finds_a_topic_made_after_the_table(groups: TwoGroups) -> None:
    with Producer(groups.servers, timeout_ms=5000, route_ttl_ms=60_000) as p, \
            Consumer(groups.servers, timeout_ms=5000) as c:
        assert len(p.queues("orders")) == 8
        with Admin(groups.servers) as admin:
            admin.create_topic("later", 2, broker_names=["broker-b"])
        # not in the cached table: a consumer re-asks at once, a producer auto-creates on
        # no group it would not be told about (it asks each master's TOPIC_ROUTE)
        assert c.queue_nums("later") == 2
        assert [str(q) for q in c.queues("later")] == ["broker-b/0", "broker-b/1"]
        r = p.send("later", b"x", queue_id=0)
        assert r.broker_name == "broker-b"


def test_one_group_works_as_it_always_did(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(brokerName="solo")
    with Producer([addr(broker)], timeout_ms=5000) as p, \
            Consumer([addr(broker)], group="g") as c:
        r = p.send("t", b"x", queue_id=3)
        assert (r.broker_name, r.queue_id) == ("solo", 3)
        assert p.send("t", b"y", queue_id=3, broker_name="solo").queue_offset == 1
        with pytest.raises(BrokerError) as e:
            p.send("t", b"z", broker_name="other")
        assert e.value.code == ResponseCode.BAD_REQUEST
        pr = c.pull("t", 3, 0)
        assert pr.status == PullStatus.FOUND and [m.broker_name for m in pr.messages] == [
            "solo", "solo"]
        c.commit_offset("t", 3, 2)
        assert c.unsent_commits == {} and c.fetch_offset("t", 3) == 2
        assert p.queues("t") == [MessageQueue("solo", q) for q in range(8)]


def test_route_refreshes_take_turns(groups: TwoGroups) -> None:
    """Many threads whose table expired at once: one asks, the others go on with the table
    they had (no send waits for another's CLUSTER_INFO)."""
    with Producer(groups.servers, timeout_ms=5000, route_ttl_ms=1) as p:
        p.send("orders", b"warm-up")
        before, started = p._routes.refreshes, time.monotonic()
        errors: list[BaseException] = []

        def burst() -> None:
            try:
                while time.monotonic() - started < 3 * ROUTE_RETRY_S:
                    p.send("orders", b"t")
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=burst) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        asked = p._routes.refreshes - before
        assert 1 <= asked <= (time.monotonic() - started) / ROUTE_RETRY_S + 1, asked


def test_routes_naming_unreachable_addresses_still_reach_every_group_through_the_seeds(
        groups: TwoGroups) -> None:
    """The compose cluster from the host: brokers advertise addresses only the containers
    resolve, and the host reaches them through the addresses it was given. Each group's master
    discovery also asks those seeds and keeps only the answers of its own group's brokers."""
    import json

    from helpers.brokers import free_port

    real = {addr(groups.a): f"127.0.0.1:{free_port()}", addr(groups.b): f"127.0.0.1:{free_port()}"}
    answer = groups.cluster_info

    def advertised() -> dict[str, Any]:
        text = json.dumps(answer())
        for address, unreachable in real.items():
            text = text.replace(address, unreachable)
        return dict(json.loads(text))

    for broker in (groups.a, groups.b):
        broker.cluster_info = advertised  # type: ignore[method-assign]
    seeds = [addr(groups.b), addr(groups.a)]  # in either order: answers name their group
    with Producer(seeds, timeout_ms=5000) as p:
        table = p._routes.table()
        assert set(table.groups["broker-a"].addresses) == {real[addr(groups.a)]}
        results = [p.send("orders", b"m%d" % i) for i in range(16)]
        pinned = {g: p.send("orders", b"to " + g.encode(), queue_id=1, broker_name=g)
                  for g in ("broker-a", "broker-b")}
    assert all(r.status == SendStatus.SEND_OK for r in results)
    assert {(r.broker_name, r.queue_id) for r in results} == {
        (g, q) for g in ("broker-a", "broker-b") for q in range(4)}
    for g, r in pinned.items():
        assert r.broker_name == g and b"to " + g.encode() in groups.stored(g, "orders", 1)
    with Consumer(seeds, group="g", timeout_ms=5000) as c:
        for g in ("broker-a", "broker-b"):
            pr = c.pull("orders", 1, 0, max_nums=64, broker_name=g)
            assert pr.status == PullStatus.FOUND
            assert b"to " + g.encode() in [m.body for m in pr.messages]


def test_a_simple_consumer_receives_from_every_group_holding_the_topic(
        make_broker: Callable[..., Broker]) -> None:
    """No broker_name: a receive pops each broker group in turn (RocketMQ 5's clients take a
    topic's queues over every broker), waits on them all, and acks where each came from."""
    from common.client import SimpleConsumer

    two = TwoGroups(make_broker, real_store=True, defaultTopicQueueNums=2)
    with Admin(two.servers, timeout_ms=5000) as admin:
        admin.create_topic_on_groups("jobs", 2)
    with Producer(two.servers, timeout_ms=5000) as p:
        sent = {(r.broker_name, bytes(body))
                for body in (b"j%d" % i for i in range(12))
                for r in [p.send("jobs", body)]}
    assert {name for name, _ in sent} == {"broker-a", "broker-b"}
    got: dict[bytes, str] = {}
    with SimpleConsumer(two.servers, "workers", timeout_ms=5000) as c:
        deadline = time.monotonic() + 20
        while len(got) < 12 and time.monotonic() < deadline:
            for r in c.receive("jobs", 4, 60_000, wait_ms=500):
                got[r.message.body] = r.receipt_handle.split()[1]  # the handle's group
                c.ack(r)
        assert {(name, body) for body, name in got.items()} == sent
        with Producer(two.servers, timeout_ms=5000) as p:
            timer = threading.Timer(0.7, p.send, ("jobs", b"late"),
                                    {"broker_name": "broker-b", "queue_id": 1})
            timer.start()
            started = time.monotonic()
            late = c.receive("jobs", 4, 60_000, wait_ms=8_000)
            timer.join()
        assert [r.message.body for r in late] == [b"late"]
        assert time.monotonic() - started < 3  # found within a few slices, not at the end
        c.ack(late[0])
        assert c.receive("jobs", 4, 60_000) == []  # everything acked, on both groups
