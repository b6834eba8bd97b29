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

from common.broker.broker import Broker
from common.client import Admin, Consumer

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
