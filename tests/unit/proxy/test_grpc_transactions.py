"""RocketMQ 5's gRPC protocol (issue 41): the official Python client's transactional Producer
(``rocketmq-python-client`` from PyPI, unchanged, with a TransactionChecker) against a broker
with ``grpcServerPort``: a committed half is delivered, a rolled-back one never is, and one
left open is decided by the client's checker when the broker checks back (the check reaches
the client as RecoverOrphanedTransactionCommand on its telemetry stream; its answer comes back
by EndTransaction)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from helpers.brokers import addr, free_port
from rocketmq import (
    ClientConfiguration,
    Credentials,
    Message,
    Producer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

from common.broker.broker import Broker
from common.client import Admin, Consumer
from common.proxy import convert

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


class Checker(TransactionChecker):
    def __init__(self) -> None:
        self.asked: list[bytes] = []

    def check(self, message: Any) -> TransactionResolution:
        self.asked.append(message.body)
        return TransactionResolution.COMMIT if message.body.startswith(b"yes") else \
            TransactionResolution.ROLLBACK


@pytest.fixture
def broker(make_broker: Callable[..., Broker]) -> Broker:
    # halves 1 s old are checked every second
    b = make_broker(real_store=True, brokerName="gb", grpcServerPort=free_port(),
                    transactionTimeOut=1000, transactionCheckInterval=1000)
    with Admin([addr(b)]) as admin:
        admin.create_topic("tx", 1)
    return b


@pytest.fixture
def checker() -> Checker:
    return Checker()


@pytest.fixture
def producer(broker: Broker, checker: Checker) -> Iterator[Any]:
    p = Producer(ClientConfiguration(f"127.0.0.1:{broker.cfg.grpcServerPort}", Credentials()),
                 ("tx",), checker=checker)
    p.startup()
    yield p
    p.shutdown()


def half(producer: Any, body: bytes) -> Any:
    transaction = producer.begin_transaction()
    msg = Message()
    msg.topic, msg.body = "tx", body
    producer.send(msg, transaction)
    return transaction


def delivered(broker: Broker) -> list[bytes]:
    with Consumer([addr(broker)]) as c:
        return [m.body for m in c.pull("tx", 0, 0, 32).messages]


def test_a_committed_half_is_delivered_and_a_rolled_back_one_never(
        broker: Broker, producer: Any) -> None:
    half(producer, b"kept").commit()
    half(producer, b"dropped").rollback()
    deadline = time.monotonic() + 10
    while delivered(broker) != [b"kept"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert delivered(broker) == [b"kept"]


def test_an_open_transaction_is_decided_by_the_clients_checker(
        broker: Broker, producer: Any, checker: Checker) -> None:
    half(producer, b"yes, commit me")  # neither committed nor rolled back: left open
    half(producer, b"no, roll me back")
    deadline = time.monotonic() + 30
    while delivered(broker) != [b"yes, commit me"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert delivered(broker) == [b"yes, commit me"]
    assert set(checker.asked) >= {b"yes, commit me", b"no, roll me back"}
    status = broker.status()["transactions"]
    assert status["commits"] >= 1 and status["rollbacks"] >= 1


def test_an_end_naming_a_half_by_its_offsets_alone_is_refused(broker: Broker) -> None:
    """Every half sent through the front end shares its producer group, so offsets and topic
    were all an END had to name when its id's token part was empty: any account that may
    publish the topic could end another's transaction by guessing them. The broker's token
    is required now."""
    with grpc.insecure_channel(f"127.0.0.1:{broker.cfg.grpcServerPort}") as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        msg = pb.Message(topic=pb.Resource(name="tx"), body=b"victim's",
                         system_properties=pb.SystemProperties(
                             message_id="victim-1", body_encoding=pb.IDENTITY,
                             message_type=pb.TRANSACTION))
        [entry] = stub.SendMessage(rpc.SendMessageRequest(messages=[msg]), timeout=10).entries
        assert entry.status.code == pb.OK, entry
        name, topic, clo, qo, msg_id, token = convert.parse_transaction_id(entry.transaction_id)

        def end(transaction_id: str, resolution: Any) -> Any:
            return stub.EndTransaction(rpc.EndTransactionRequest(
                topic=pb.Resource(name="tx"), message_id="victim-1",
                transaction_id=transaction_id, resolution=resolution), timeout=10).status

        for guess in ("", "victim-1", "0" * 32):
            forged = convert.transaction_id(name, topic, clo, qo, msg_id, guess)
            refused = end(forged, pb.ROLLBACK)
            assert refused.code != pb.OK and "transactionId" in refused.message, refused
        assert len(token) == 32 and token != "victim-1"  # the broker's, not the client's id
        assert end(entry.transaction_id, pb.COMMIT).code == pb.OK
    deadline = time.monotonic() + 10
    while delivered(broker) != [b"victim's"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert delivered(broker) == [b"victim's"]
