"""A dead letter is resent without the properties of its stored copy: a committed
transactional message's letter carries ``__TRAN_HALF`` (a send-back keeps it), which only the
broker may set, and its resend was refused for it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from helpers.brokers import addr

from common.broker.broker import Broker
from common.client import Admin, Consumer, Producer, dead_letters
from common.core.message import MessageExt, retry_topic
from common.core.transaction import HALF_ORIGIN

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_a_letter_with_a_brokers_property_is_resent_without_it(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(real_store=True)
    with Admin([addr(broker)]) as admin:
        admin.create_topic(retry_topic("g"), 1)
        admin.create_topic("%DLQ%g", 1)
    letter = MessageExt(topic="%DLQ%g", queue_id=0, queue_offset=0, commit_log_offset=0,
                        store_size=0, body=b"paid", properties={
                            HALF_ORIGIN: "4096", "__SCHED_SRC": "8192", "region": "eu",
                            "TAGS": "T"}, msg_id="0A00000900002A9F0000000000001000")
    letters = dead_letters.Letters("g", 0, 1, [letter])
    with Producer([addr(broker)]) as p, Consumer([addr(broker)], group="g") as c:
        [sent] = dead_letters.redrive(p, c, letters)
        [got] = c.pull(retry_topic("g"), 0, 0, 8).messages
    assert got.body == b"paid" and got.tags == "T" and got.properties["region"] == "eu"
    assert HALF_ORIGIN not in got.properties and "__SCHED_SRC" not in got.properties
    assert sent.msg_id
