"""A record of a system topic is the broker's alone, named by offset, msgId, key or handle: a
send-back of a timer message not due yet, a look-up of an uncommitted half or of a timer
message, all refused whatever the request's ``topic`` says (``common/format/boundary.py``
``record_refusal``, ``topic_refusal``); and a receipt handle of another broker group changes
nothing here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from helpers.brokers import addr, wait_for

from common.broker.broker import Broker
from common.client import Admin, Producer, SimpleConsumer, TransactionProducer, TransactionState
from common.core.errors import ResponseCode
from common.core.pop import ReceiptHandle
from common.core.timer import TIMER_TOPIC
from common.core.transaction import HALF_TOPIC
from common.format.protocol import RequestCode, Response

pytestmark = [pytest.mark.unit, pytest.mark.timeout(90)]

BROKER = {"real_store": True, "brokerName": "sb"}


def request(broker: Broker, code: RequestCode, fields: dict[str, Any]) -> Response:
    with Admin([addr(broker)], retries=0) as admin:
        return admin._cluster.request(addr(broker), code, fields)


def test_a_send_back_of_a_timer_message_not_due_is_refused(
        make_broker: Callable[..., Broker]) -> None:
    """Named by its CommitLog offset with ``originTopic`` the timer's own topic, a message due
    in a minute was copied into the group's retry topic, delivered a second later."""
    broker = make_broker(**BROKER)
    with Producer([addr(broker)]) as p:
        timed = p.send("orders", b"not yet", queue_id=0, delay=60_000)
    resp = request(broker, RequestCode.CONSUMER_SEND_MSG_BACK, {
        "group": "G", "offset": timed.commit_log_offset, "originTopic": TIMER_TOPIC,
        "delayLevel": 1})
    assert resp.code == ResponseCode.MESSAGE_ILLEGAL, resp
    assert f"{TIMER_TOPIC}, a system topic" in resp.remark
    assert broker.store.max_queue_offset("%RETRY%G", 0) == 0


def test_a_look_up_of_a_half_or_a_timer_message_is_refused(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(**BROKER)
    with Producer([addr(broker)]) as p:
        timed = p.send("orders", b"not yet", queue_id=0, delay=60_000)
        plain = p.send("orders", b"plain", queue_id=0)
    with TransactionProducer([addr(broker)], "pg", lambda _h: TransactionState.UNKNOWN) as tp:
        half = tp.send_half("orders", b"uncommitted", queue_id=0)
    for sent, topic in ((timed, TIMER_TOPIC), (half.send, HALF_TOPIC)):
        by_offset = request(broker, RequestCode.QUERY_BY_OFFSET,
                            {"phyOffset": sent.commit_log_offset})
        by_id = request(broker, RequestCode.QUERY_BY_MSG_ID, {"msgId": sent.msg_id})
        for resp in (by_offset, by_id):
            assert resp.code == ResponseCode.NO_PERMISSION, resp
            assert f"{topic}, a system topic" in resp.remark and not resp.bodies
    wait_for(lambda: broker.store.query_by_key(HALF_TOPIC, half.message_id), "the half indexed")
    by_key = request(broker, RequestCode.QUERY_BY_KEY, {"topic": HALF_TOPIC,
                                                        "key": half.message_id})
    assert by_key.code == ResponseCode.NO_PERMISSION and not by_key.bodies, by_key
    with Admin([addr(broker)]) as admin:  # the topic's own messages are found as before
        found = admin.query_by_offset(plain.commit_log_offset)
        assert found is not None and found.body == b"plain"


def test_a_handle_of_another_broker_group_changes_nothing_here(
        make_broker: Callable[..., Broker]) -> None:
    """As an ACK is, a change of invisible time by a handle naming another broker group is
    refused (it would change this group's state of a message it never named)."""
    broker = make_broker(**BROKER)
    with Producer([addr(broker)]) as p:
        p.send("t", b"m", queue_id=0)
    with SimpleConsumer([addr(broker)], "g") as c:
        [got] = c.receive("t", 1, 1_000)
    handle = ReceiptHandle.decode(got.receipt_handle)
    forged = handle._replace(broker_name="elsewhere").encode()
    for code, extra in ((RequestCode.CHANGE_MESSAGE_INVISIBLETIME, {"invisibleTime": 60_000}),
                        (RequestCode.ACK_MESSAGE, {})):
        resp = request(broker, code, {"topic": "t", "group": "g", "receiptHandle": forged,
                                      **extra})
        assert resp.code == ResponseCode.MESSAGE_ILLEGAL, (code, resp)
        assert "of broker group elsewhere, not sb" in resp.remark
    # the genuine handle still works: nothing was changed by the forged one
    resp = request(broker, RequestCode.ACK_MESSAGE, {"topic": "t", "group": "g",
                                                     "receiptHandle": got.receipt_handle})
    assert resp.code == ResponseCode.SUCCESS and resp.fields.get("already") is None, resp
