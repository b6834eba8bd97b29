"""With the ACL on, a transaction's check-back answers only to an account that may publish
the half's topic: a producer heartbeat needs only SUB on its group, so another account using
the same group name was sent the halves' bodies and decided them by its answer
(``common/format/acl.py`` ``publisher_refusal``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.brokers import addr, wait_for

from common.broker.broker import Broker
from common.client import Consumer, TransactionProducer, TransactionState
from common.core.errors import BrokerError
from common.core.message import MessageExt

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))

from security_harness import Realm

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


def accounts(realm: Realm) -> list[dict[str, Any]]:
    return [
        realm.account("broker", replica=True),
        realm.account("admin", admin=True),
        # the group's producers: publish orders
        realm.account("owner", topicPerms=["orders=PUB"], groupPerms=["pg=SUB"]),
        # may use the group's name and read orders, publishes only its own topic
        realm.account("snoop", topicPerms=["orders=SUB", "mine=PUB"], groupPerms=["pg=SUB"]),
    ]


class Checker:
    def __init__(self, answer: TransactionState):
        self.answer = answer
        self.asked: list[bytes] = []

    def __call__(self, half: MessageExt) -> TransactionState:
        self.asked.append(half.body)
        return self.answer


def test_a_check_back_goes_only_to_an_account_that_may_publish_the_topic(
        make_broker: Callable[..., Broker], tmp_path: Path) -> None:
    realm = Realm(tmp_path / "realm", ["owner", "snoop"])
    realm.write_acl(accounts(realm))
    broker = make_broker(real_store=True, brokerName="ta", transactionCheckInterval=200,
                         transactionTimeOut=300, transactionCheckMax=100,
                         **realm.broker_fields())
    with TransactionProducer([addr(broker)], "pg", Checker(TransactionState.UNKNOWN),
                             **realm.curve("owner")) as first:
        half = first.send_half("orders", b"paid", queue_id=0)  # gone before its end
    snoop = Checker(TransactionState.ROLLBACK)
    with TransactionProducer([addr(broker)], "pg", snoop, heartbeat_ms=200,
                             **realm.curve("snoop")) as snooping:
        # nor does its END decide it, even with the broker's id: PUB on the real topic
        with pytest.raises(BrokerError, match="PUB Topic:orders"):
            snooping.end(half, TransactionState.ROLLBACK)
        with pytest.raises(BrokerError, match="a message of topic orders"):
            snooping.end(half._replace(topic="mine"), TransactionState.ROLLBACK)
        wait_for(lambda: snoop.asked or broker.status()["transactions"]["check"]["checks"] >= 3,
                 "three check rounds with the snoop's producer live", timeout_s=30)
        check = broker.status()["transactions"]["check"]
        assert snoop.asked == [] and check["answered_rollback"] == 0, check
        assert check["no_producer"] >= 1
        owner = Checker(TransactionState.COMMIT)
        with TransactionProducer([addr(broker)], "pg", owner, heartbeat_ms=200,
                                 **realm.curve("owner")):

            def delivered() -> list[bytes]:
                with Consumer([addr(broker)], group="g", **realm.curve("admin")) as c:
                    return [m.body for m in c.pull("orders", 0, 0, 32).messages]

            assert wait_for(delivered, "the owner's commit", timeout_s=30) == [b"paid"]
    assert snoop.asked == [] and owner.asked[:1] == [b"paid"]
