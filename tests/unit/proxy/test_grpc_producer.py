"""RocketMQ 5's gRPC protocol (issue 41), first part: the official Python client's Producer
(``rocketmq-python-client`` from PyPI, unchanged) sends to a broker with ``grpcServerPort``,
and replog's own Consumer reads what it sent: body, tag, keys, properties, message id, the
message group's queue (FIFO), the delivery time (DELAY). A topic made FIFO takes only FIFO
messages (the client checks the route's types); an RPC not served answers NOT_IMPLEMENTED."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from helpers.brokers import addr, free_port
from helpers.children import replog_child
from rocketmq import ClientConfiguration, Credentials, Message
from rocketmq import Producer as OfficialProducer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

from common.broker.broker import Broker
from common.client import Admin, Consumer
from common.core.message import PROPERTY_SHARDING_KEY, PROPERTY_UNIQ_KEY

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


@pytest.fixture
def broker(make_broker: Callable[..., Broker]) -> Broker:
    b = make_broker(real_store=True, brokerName="gb", grpcServerPort=free_port(),
                    defaultTopicQueueNums=4)
    with Admin([addr(b)]) as admin:
        admin.create_topic("orders", 4)
        admin.create_topic("fifo", 4, attributes={"message.type": "FIFO"})
    return b


@pytest.fixture
def producer(broker: Broker) -> Iterator[Any]:
    endpoint = f"127.0.0.1:{broker.cfg.grpcServerPort}"
    p = OfficialProducer(ClientConfiguration(endpoint, Credentials()), ("orders", "fifo"))
    p.startup()
    yield p
    p.shutdown()


def read_all(broker: Broker, topic: str) -> list[Any]:
    with Consumer([addr(broker)]) as c:
        return [m for q in range(4) for m in c.pull(topic, q, 0, 64).messages]


def message(topic: str, body: bytes, **kw: Any) -> Message:
    m = Message()
    m.topic, m.body = topic, body
    for k, v in kw.items():
        for one in v if k == "keys" else [v]:  # the client's keys setter adds one key
            setattr(m, k, one)
    return m


def test_the_official_producer_sends_and_replog_reads_it(broker: Broker, producer: Any) -> None:
    m = message("orders", b"hello", tag="TagA", keys=["k1", "k2"])
    m.add_property("region", "eu")
    receipt = producer.send(m)
    assert receipt.message_id and receipt.offset == 0
    [got] = read_all(broker, "orders")
    assert got.body == b"hello" and got.tags == "TagA"
    assert sorted(got.keys.split()) == ["k1", "k2"] and got.properties["region"] == "eu"
    assert got.properties[PROPERTY_UNIQ_KEY] == receipt.message_id  # the client's id


def test_a_fifo_topic_keeps_each_message_group_in_one_queue(broker: Broker,
                                                            producer: Any) -> None:
    for i in range(12):
        producer.send(message("fifo", b"%d" % i, message_group=f"g{i % 3}"))
    got = read_all(broker, "fifo")
    queues: dict[str, set[int]] = {}
    for m in got:
        queues.setdefault(m.properties[PROPERTY_SHARDING_KEY], set()).add(m.queue_id)
    assert len(got) == 12 and all(len(q) == 1 for q in queues.values())
    for group in queues:  # in the order sent
        bodies = [int(m.body) for m in sorted(got, key=lambda m: m.queue_offset)
                  if m.properties[PROPERTY_SHARDING_KEY] == group]
        assert bodies == sorted(bodies)
    with pytest.raises(Exception, match="message type"):  # the client checks the route
        producer.send(message("fifo", b"no group"))


def test_a_delayed_message_is_delivered_at_its_time(broker: Broker, producer: Any) -> None:
    due = int(time.time()) + 2
    producer.send(message("orders", b"later", delivery_timestamp=due))
    assert read_all(broker, "orders") == []  # held by the timer
    deadline = time.monotonic() + 15
    got: list[Any] = []
    while not got and time.monotonic() < deadline:
        got = read_all(broker, "orders")
        time.sleep(0.2)
    assert [m.body for m in got] == [b"later"] and time.time() >= due


def test_what_is_not_served_answers_not_implemented_and_a_missing_topic_not_found(
        broker: Broker) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{broker.cfg.grpcServerPort}") as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        update = stub.UpdateOffset(rpc.UpdateOffsetRequest(), timeout=5)
        assert update.status.code == pb.NOT_IMPLEMENTED
        assert "UpdateOffset" in update.status.message
        [first] = list(stub.PullMessage(rpc.PullMessageRequest(), timeout=5))
        assert first.status.code == pb.NOT_IMPLEMENTED
        ack = stub.AckMessage(rpc.AckMessageRequest(), timeout=5)
        assert ack.status.code == pb.BAD_REQUEST
        route = stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="nope")),
                                timeout=5)
        assert route.status.code == pb.TOPIC_NOT_FOUND
        route = stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="orders")),
                                timeout=5)
        assert route.status.code == pb.OK and len(route.message_queues) == 4
        assert {q.permission for q in route.message_queues} == {pb.READ_WRITE}
        assert set(route.message_queues[0].accept_message_types) == {
            pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION}


def test_replog_proxy_serves_a_cluster_from_a_process_of_its_own(
        make_broker: Callable[..., Broker], tmp_path: Path) -> None:
    """``replog proxy`` (RocketMQ's Cluster mode): a process of its own over brokers that
    serve no gRPC themselves, on the broker's key grpcServerPort; SIGTERM stops it, exit 0."""
    broker = make_broker(real_store=True, brokerName="pa")
    with Admin([addr(broker)]) as admin:
        admin.create_topic("orders", 2)
    port = free_port()
    with replog_child("proxy", "-s", addr(broker), "--set", f"grpcServerPort={port}", "--json",
                      ready=str(port), log=tmp_path / "proxy.err"):
        p = OfficialProducer(ClientConfiguration(f"127.0.0.1:{port}", Credentials()),
                             ("orders",))
        p.startup()
        try:
            receipt = p.send(message("orders", b"via the proxy"))
        finally:
            p.shutdown()
        with Consumer([addr(broker)]) as c:
            found = [m for q in range(2) for m in c.pull("orders", q, 0, 8).messages]
        assert [m.body for m in found] == [b"via the proxy"]
        assert found[0].properties[PROPERTY_UNIQ_KEY] == receipt.message_id


def test_a_delayed_message_is_recalled_by_the_handle_its_send_gave(broker: Broker,
                                                                   producer: Any) -> None:
    receipt = producer.send(message("orders", b"never", delivery_timestamp=int(time.time()) + 2))
    assert receipt.recall_handle
    producer.recall_message("orders", receipt.recall_handle)
    time.sleep(4)  # 2 s past its time: a message not recalled is delivered by then
    assert read_all(broker, "orders") == []  # recalled: never delivered
