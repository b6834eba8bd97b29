"""Consumer send-back (RocketMQ CONSUMER_SEND_MSG_BACK): what copy is stored where, on the pure
plan and on a real store with its delay service (the copy's RECONSUMETIMES, born time and
properties survive the schedule topic)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers.stores import make_store
from helpers.stores import wait_until as wait_for

from common.core.errors import GetStatus, PutStatus
from common.core.message import Message, MessageExt
from master.send_back import SendBackRefused, plan

pytestmark = pytest.mark.unit

LEVELS = 18


def stored(topic: str = "orders", reconsume: int = 0, **props: str) -> MessageExt:
    return MessageExt(topic=topic, queue_id=2, queue_offset=7, commit_log_offset=4096,
                      store_size=200, body=b"payload", flag=3,
                      properties={"TAGS": "TagA", "KEYS": "k1", "user": "u", **props},
                      born_timestamp=1_700_000_000_000, born_host="10.0.0.9:5555",
                      reconsume_times=reconsume, msg_id="0A00000900002A9F0000000000001000")


def test_first_failure_goes_to_the_retry_topic_at_level_three() -> None:
    back = plan(stored(), "billing", "orders", 0, 16, LEVELS)
    m = back.message
    assert not back.dead
    assert m.topic == "%RETRY%billing" and m.delay_level == 3 and m.reconsume_times == 1
    assert m.body == b"payload" and m.flag == 3
    assert m.properties == {"TAGS": "TagA", "KEYS": "k1", "user": "u", "RETRY_TOPIC": "orders",
                            "ORIGIN_MESSAGE_ID": "0A00000900002A9F0000000000001000"}


def test_later_failures_wait_longer_and_keep_the_first_topic_and_id() -> None:
    again = stored("%RETRY%billing", reconsume=4, RETRY_TOPIC="orders", ORIGIN_MESSAGE_ID="FIRST",
                   DELAY="7", REAL_TOPIC="%RETRY%billing", REAL_QID="0", __SCHED_SRC="123")
    m = plan(again, "billing", "orders", 0, 16, LEVELS, origin_msg_id="OTHER").message
    assert m.topic == "%RETRY%billing" and m.delay_level == 7 and m.reconsume_times == 5
    assert m.properties["RETRY_TOPIC"] == "orders" and m.properties["ORIGIN_MESSAGE_ID"] == "FIRST"
    # what described the last stored copy is not carried to the next
    assert not {"DELAY", "REAL_TOPIC", "REAL_QID", "__SCHED_SRC"} & set(m.properties)
    late = plan(stored(reconsume=15), "billing", "orders", 0, 16, LEVELS).message
    assert late.delay_level == LEVELS  # 3 + 15 is past the last level: the last one
    asked = plan(stored(), "billing", "orders", 1, 16, LEVELS).message
    assert asked.delay_level == 1


def test_the_last_allowed_return_and_level_minus_one_go_to_the_dlq() -> None:
    back = plan(stored("%RETRY%billing", reconsume=16, RETRY_TOPIC="orders"), "billing",
                "orders", 0, 16, LEVELS)
    assert back.dead and back.message.topic == "%DLQ%billing"
    assert back.message.delay_level == 0 and back.message.reconsume_times == 17
    assert back.message.properties["RETRY_TOPIC"] == "orders"
    assert plan(stored(), "billing", "orders", -1, 16, LEVELS).dead
    assert plan(stored(), "billing", "orders", 0, 0, LEVELS).dead  # no retries allowed
    assert not plan(stored(reconsume=15), "billing", "orders", 0, 16, LEVELS).dead


@pytest.mark.parametrize(("record", "origin", "why"), [
    (stored("payments"), "orders", "topic payments, not of orders"),
    (stored("%RETRY%other", RETRY_TOPIC="orders"), "orders", "%RETRY%other (from orders)"),
    (stored("%RETRY%billing", RETRY_TOPIC="payments"), "orders", "(from payments), not of orders"),
    (stored("%DLQ%billing"), "%DLQ%billing", "cannot be sent back"),
    (stored("SCHEDULE_TOPIC_XXXX"), "SCHEDULE_TOPIC_XXXX", "a system topic"),
    # a timer message not due yet, an uncommitted half: never handed to a consumer
    (stored("rmq_sys_wheel_timer"), "rmq_sys_wheel_timer", "a system topic"),
    (stored("RMQ_SYS_TRANS_HALF_TOPIC"), "RMQ_SYS_TRANS_HALF_TOPIC", "a system topic"),
    # a retry copy that names a system topic as its first one
    (stored("%RETRY%billing", RETRY_TOPIC="rmq_sys_wheel_timer"), "rmq_sys_wheel_timer",
     "a system topic"),
])
def test_an_offset_that_is_not_the_consumers_message_is_refused(
        record: MessageExt, origin: str, why: str) -> None:
    with pytest.raises(SendBackRefused, match=why.replace("(", r"\(").replace(")", r"\)")):
        plan(record, "billing", origin, 0, 16, LEVELS)


@pytest.mark.timeout(30)
def test_a_copy_through_the_delay_service_keeps_its_count_and_born_time(tmp_path: Path) -> None:
    store = make_store(tmp_path, messageDelayLevel="1s 1s 1s")
    try:
        born = int(time.time() * 1000) - 60_000
        first = store.put(Message("orders", b"payload", tags="TagA"), 0, ("10.1.2.3", 4321), born)
        assert first.status is PutStatus.PUT_OK
        original = store.find_message(first.phy_offset)
        copy = plan(original, "billing", "orders", 0, 16, 3).message
        r = store.put(copy, 0, ("10.1.2.3", 4321), original.born_timestamp)
        assert r.status is PutStatus.PUT_OK
        assert wait_for(lambda: store.max_queue_offset("%RETRY%billing", 0) == 1, 5.0)
        got = store.get_message("billing", "%RETRY%billing", 0, 0, 10)
        assert got.status is GetStatus.FOUND
        (msg,) = got.messages()
        assert msg.body == b"payload" and msg.tags == "TagA" and msg.reconsume_times == 1
        assert msg.born_timestamp == born and msg.born_host == "10.1.2.3:4321"
        assert msg.store_timestamp > born + 60_000 - 1
        assert msg.properties["RETRY_TOPIC"] == "orders"
        assert msg.properties["ORIGIN_MESSAGE_ID"] == original.msg_id
    finally:
        store.shutdown()


def test_find_message_names_what_is_wrong_with_an_offset(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    try:
        r = store.put(Message("orders", b"x" * 100), 0)
        assert store.find_message(r.phy_offset).body == b"x" * 100
        with pytest.raises(LookupError, match="no message starts at commitLogOffset 7"):
            store.find_message(r.phy_offset + 7)
        with pytest.raises(LookupError, match="outside the CommitLog"):
            store.find_message(1 << 40)
    finally:
        store.shutdown()
