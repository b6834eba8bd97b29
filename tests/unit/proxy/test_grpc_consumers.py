"""RocketMQ 5's gRPC protocol (issue 41): the official Python client's SimpleConsumer and
PushConsumer (``rocketmq-python-client`` from PyPI, unchanged) consume over POP from a broker
with ``grpcServerPort``: what replog's own Producer sent, with its id, tag, keys and
properties; an ack; a change of invisible duration; a message not acked comes back with its
delivery attempt counted; a group made orderly is told FIFO; a stale handle is refused."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers.brokers import addr, free_port
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    MessageListener,
    PushConsumer,
    SimpleConsumer,
)

from common.broker.broker import Broker
from common.client import Admin, Consumer, Producer
from common.core.message import PROPERTY_UNIQ_KEY

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


@pytest.fixture
def broker(make_broker: Callable[..., Broker]) -> Broker:
    b = make_broker(real_store=True, brokerName="gb", grpcServerPort=free_port())
    with Admin([addr(b)]) as admin:
        admin.create_topic("jobs", 2)
    return b


def config(broker: Broker) -> ClientConfiguration:
    return ClientConfiguration(f"127.0.0.1:{broker.cfg.grpcServerPort}", Credentials())


@pytest.fixture
def simple(broker: Broker) -> Iterator[Any]:
    c = SimpleConsumer(config(broker), "workers", {"jobs": FilterExpression()},
                       await_duration=2)
    c.startup()
    yield c
    c.shutdown()


def front(broker: Broker) -> Any:
    assert broker._grpc is not None and broker._grpc.service is not None
    return broker._grpc.service


def send(broker: Broker, n: int, **kw: Any) -> list[Any]:
    with Producer([addr(broker)]) as p:
        return [p.send("jobs", b"job-%d" % i, **kw) for i in range(n)]


def receive_all(consumer: Any, n: int, invisible_s: int = 30, timeout_s: float = 20) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += consumer.receive(16, invisible_s)
    return got


def test_a_simple_consumer_receives_acks_and_sees_what_it_did_not_ack_again(
        broker: Broker, simple: Any) -> None:
    sent = send(broker, 4, tags="TagA", keys=["k"], properties={"region": "eu"})
    got = receive_all(simple, 4, invisible_s=2)
    assert sorted(m.body for m in got) == [b"job-0", b"job-1", b"job-2", b"job-3"]
    first = got[0]
    assert first.tag == "TagA" and first.keys == {"k"} and first.properties == {"region": "eu"}
    assert first.delivery_attempt == 1 and not first.corrupted
    with Consumer([addr(broker)]) as reader:  # the id its producer gave it (UNIQ_KEY)
        stored = [m for q in range(2) for m in reader.pull("jobs", q, 0, 8).messages]
    assert sorted(m.message_id for m in got) == sorted(
        m.properties.get(PROPERTY_UNIQ_KEY) or m.msg_id for m in stored)  # else its msgId
    assert len(sent) == 4
    for m in got[1:]:
        simple.ack(m)
    again = receive_all(simple, 1, invisible_s=30, timeout_s=10)  # after its 2 s
    assert [(m.body, m.delivery_attempt) for m in again] == [(first.body, 2)]
    local = front(broker).local_consume  # the broker's own POPs and acks, in-process
    assert local is not None and local.pops >= 2 and local.acks == 3
    with pytest.raises(Exception, match="INVALID_RECEIPT_HANDLE|receipt"):
        simple.ack(first)  # its old handle: handed out again since
    simple.change_invisible_duration(again[0], 60)
    time.sleep(0.2)
    assert simple.receive(16, 30) == []  # hidden for a minute now


def test_a_push_consumer_consumes_and_what_failed_comes_back(broker: Broker) -> None:
    send(broker, 6)
    seen: list[tuple[bytes, int]] = []
    lock = threading.Lock()

    class Listener(MessageListener):
        def consume(self, message: Any) -> ConsumeResult:
            with lock:
                seen.append((message.body, message.delivery_attempt))
            if message.body == b"job-0" and message.delivery_attempt == 1:
                return ConsumeResult.FAILURE  # comes back
            return ConsumeResult.SUCCESS

    c = PushConsumer(config(broker), "pushers", Listener(), {"jobs": FilterExpression()},
                     consumption_thread_count=2)
    c.startup()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with lock:
                done = {b for b, _ in seen} == {b"job-%d" % i for i in range(6)} and \
                    (b"job-0", 2) in seen
            if done:
                break
            time.sleep(0.2)
    finally:
        c.shutdown()
    assert (b"job-0", 1) in seen and (b"job-0", 2) in seen
    assert {b for b, _ in seen} == {b"job-%d" % i for i in range(6)}


def test_an_orderly_group_is_told_fifo(broker: Broker) -> None:
    from rocketmq.grpc_protocol import definition_pb2 as pb

    from common.proxy.service import MessagingService

    with Admin([addr(broker)]) as admin:
        admin.create_group("ordered", orderly=True, retry_max_times=3)
    service = MessagingService([addr(broker)], 1024)
    try:
        settings = pb.Settings(subscription=pb.Subscription(group=pb.Resource(name="ordered")))
        MessagingService._consumer_settings(settings, service._group("ordered"))
        assert settings.subscription.fifo and settings.backoff_policy.max_attempts == 4
        plain = pb.Settings(subscription=pb.Subscription(group=pb.Resource(name="new")))
        MessagingService._consumer_settings(plain, service._group("new"))
        assert not plain.subscription.fifo and plain.backoff_policy.max_attempts == 17
    finally:
        service.close()


def test_a_message_given_up_goes_to_the_dlq_and_is_not_handed_out_again(
        broker: Broker, simple: Any) -> None:
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as rpc
    from rocketmq.grpc_protocol import service_pb2_grpc

    from common.core.message import dlq_topic

    send(broker, 1)
    [m] = receive_all(simple, 1, invisible_s=2)
    with grpc.insecure_channel(f"127.0.0.1:{broker.cfg.grpcServerPort}") as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        req = rpc.ForwardMessageToDeadLetterQueueRequest(
            group=pb.Resource(name="workers"), topic=pb.Resource(name="jobs"),
            receipt_handle=m.receipt_handle, message_id=m.message_id)
        assert stub.ForwardMessageToDeadLetterQueue(req, timeout=10).status.code == pb.OK
        bad = stub.ForwardMessageToDeadLetterQueue(
            rpc.ForwardMessageToDeadLetterQueueRequest(
                group=pb.Resource(name="workers"), receipt_handle="nonsense"), timeout=10)
        assert bad.status.code == pb.INVALID_RECEIPT_HANDLE
    with Consumer([addr(broker)]) as reader:
        dead = reader.pull(dlq_topic("workers"), 0, 0, 8).messages
    assert [d.body for d in dead] == [m.body]
    time.sleep(2.5)  # past its invisible time: acked, so never handed out again
    assert simple.receive(16, 30) == []


def test_an_ack_of_several_handles_answers_each_and_says_when_they_differ(
        broker: Broker, simple: Any) -> None:
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as rpc
    from rocketmq.grpc_protocol import service_pb2_grpc

    send(broker, 3)
    got = receive_all(simple, 3, invisible_s=2)
    assert len(got) == 3
    stale, fresh = got[0], got[1:]

    def ack(handles: list[tuple[str, str]]) -> Any:
        return stub.AckMessage(rpc.AckMessageRequest(
            group=pb.Resource(name="workers"), topic=pb.Resource(name="jobs"),
            entries=[rpc.AckMessageEntry(receipt_handle=h, message_id=i) for h, i in handles]),
            timeout=10)

    with grpc.insecure_channel(f"127.0.0.1:{broker.cfg.grpcServerPort}") as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        both = ack([(m.receipt_handle, m.message_id) for m in fresh])
        assert both.status.code == pb.OK
        assert [(e.message_id, e.receipt_handle, e.status.code) for e in both.entries] == [
            (m.message_id, m.receipt_handle, pb.OK) for m in fresh]
        [again] = receive_all(simple, 1, timeout_s=10)  # the one not acked, after its 2 s
        assert again.message_id == stale.message_id
        mixed = ack([(again.receipt_handle, again.message_id),
                     (stale.receipt_handle, stale.message_id)])  # handed out again since
        assert mixed.status.code == pb.MULTIPLE_RESULTS
        assert [e.status.code for e in mixed.entries] == [pb.OK, pb.INVALID_RECEIPT_HANDLE]
        assert mixed.entries[1].status.message  # says why
        assert ack([]).status.code == pb.BAD_REQUEST


def stub_of(channel: Any) -> Any:
    from rocketmq.grpc_protocol import service_pb2_grpc

    return service_pb2_grpc.MessagingServiceStub(channel)


def receive_request(broker_name: str, wait_s: int = 0) -> Any:
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as rpc

    req = rpc.ReceiveMessageRequest(
        group=pb.Resource(name="workers"), batch_size=16,
        message_queue=pb.MessageQueue(topic=pb.Resource(name="jobs"),
                                      broker=pb.Broker(name=broker_name)))
    req.invisible_duration.seconds = 30
    if wait_s:
        req.long_polling_timeout.seconds = wait_s
    return req


def test_a_long_polling_receive_from_this_broker_is_answered_when_a_message_comes(
        broker: Broker) -> None:
    """Held by the broker (its answer comes on the broker's I/O thread, not at once) and
    awaited on the front end's event loop: the message sent meanwhile, well before the wait
    ends."""
    import grpc

    local = front(broker).local_consume
    with grpc.insecure_channel(f"127.0.0.1:{broker.cfg.grpcServerPort}") as channel:
        stub = stub_of(channel)
        later = threading.Timer(0.5, send, (broker, 1))
        started = time.monotonic()
        later.start()
        try:
            got = [r for r in stub.ReceiveMessage(receive_request("gb", wait_s=8), timeout=20)
                   if r.HasField("message")]
        finally:
            later.join()
        assert [r.message.body for r in got] == [b"job-0"]
        assert time.monotonic() - started < 6
    assert local.pops >= 1


def test_a_receive_this_broker_refuses_as_retriable_goes_through_the_front_ends_client(
        broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker became a slave, or stops, between the check and the call: the front end's
    SimpleConsumer routes the receive (and the acks) as for any broker group."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as rpc

    from common.core.errors import BrokerError, ResponseCode

    asked: list[Any] = []

    async def refused(*args: Any) -> Any:
        asked.append(args)
        raise BrokerError(ResponseCode.SERVICE_NOT_AVAILABLE, "a slave now")

    local = front(broker).local_consume
    monkeypatch.setattr(local, "pop", refused)
    monkeypatch.setattr(local, "batch_ack", refused)
    send(broker, 3)
    with grpc.insecure_channel(f"127.0.0.1:{broker.cfg.grpcServerPort}") as channel:
        stub = stub_of(channel)
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < 3 and time.monotonic() < deadline:  # a queue at a time
            got += [r.message for r in stub.ReceiveMessage(receive_request("gb"), timeout=20)
                    if r.HasField("message")]
        assert sorted(m.body for m in got) == [b"job-0", b"job-1", b"job-2"]
        ack = stub.AckMessage(rpc.AckMessageRequest(
            group=pb.Resource(name="workers"), topic=pb.Resource(name="jobs"),
            entries=[rpc.AckMessageEntry(receipt_handle=m.system_properties.receipt_handle)
                     for m in got]), timeout=10)
        assert ack.status.code == pb.OK
        assert [r for r in stub.ReceiveMessage(receive_request("gb"), timeout=20)
                if r.HasField("message")] == []
    assert len(asked) >= 4  # each receive and the ack asked this broker first


def test_a_refusal_that_is_final_is_answered_as_the_broker_gave_it(broker: Broker) -> None:
    """A topic this broker does not have: not retried elsewhere, its status at once."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb

    with grpc.insecure_channel(f"127.0.0.1:{broker.cfg.grpcServerPort}") as channel:
        req = receive_request("gb")
        req.message_queue.topic.name = "no-such-topic"
        [answer] = list(stub_of(channel).ReceiveMessage(req, timeout=20))
        assert answer.status.code == pb.TOPIC_NOT_FOUND, answer.status


@pytest.mark.parametrize("served_here", [True, False])
def test_a_sql92_filter_nested_too_deep_is_an_illegal_filter_expression(
        make_broker: Callable[..., Broker], served_here: bool) -> None:
    """Refused as the expression's fault on both ways a receive goes (this broker's own POP,
    the front end's client), never an internal error."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb

    b = make_broker(real_store=True, brokerName="gb", grpcServerPort=free_port(),
                    enablePropertyFilter=True)
    with Admin([addr(b)]) as admin:
        admin.create_topic("jobs", 2)
    with grpc.insecure_channel(f"127.0.0.1:{b.cfg.grpcServerPort}") as channel:
        for deep in ("(" * 1000 + "n = 1" + ")" * 1000, "NOT " * 1000 + "n = 1"):
            req = receive_request("gb" if served_here else "")
            req.filter_expression.type = pb.SQL
            req.filter_expression.expression = deep
            [answer] = list(stub_of(channel).ReceiveMessage(req, timeout=20))
            assert answer.status.code == pb.ILLEGAL_FILTER_EXPRESSION, answer.status
