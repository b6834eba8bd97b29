"""The store's services trust a broker-only property only on a record the broker wrote for it,
whatever a record of another topic carries: records written straight into the store here, as
an entry path that missed a check (or a log from before the checks) would have left them.

- a timer tick only on the timer's rolls and on deliveries that name a timer record of their
  topic: a forged 2100 tick would stop every timer message;
- a held delayed or timer message is delivered into a client's topic only, to a queue id that
  is one: a record that names a system topic or queue -1 is skipped, and the ones after it are
  delivered (a refused put was retried forever, everything behind it waiting);
- a revive record only as the POP writes it: a delayed message once delivered into the revive
  topic is no checkpoint, whatever its body;
- a transaction's commit only with the COMMIT sysflag, an op only as the broker writes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.brokers import wait_for

from common.core.config import load_config
from common.core.errors import GetStatus
from common.core.message import (
    PROPERTY_UNIQ_KEY,
    SCHEDULE_SOURCE,
    Message,
    MessageExt,
)
from common.core.pop import POP_RECORD, revive_topic
from common.core.timer import TIMER_DELAY_MS, TIMER_SOURCE, TIMER_TICK
from common.core.transaction import (
    HALF_ORIGIN,
    OP_STATE,
    OP_TAG,
    OP_TOPIC,
    PRODUCER_GROUP,
    TRAN_MSG,
)
from common.format.record import MAX_PROPERTIES_BYTES
from common.store.message_store import MessageStore
from common.store.pop import records as pop_records

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

YEAR_2100_MS = 4_102_444_800_000
HOST = ("10.0.0.9", 4000)


def open_store(root: Path, master: bool = True) -> MessageStore:
    cfg = load_config(env={}, storePathRootDir=str(root),
                      mappedFileSizeCommitLog=1024 * 1024, timerPrecisionMs=100,
                      timerFlushIntervalMs=50, messageDelayLevel="1s 2s")
    s = MessageStore(cfg, start_master_services=master)
    s.start()
    return s


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = open_store(tmp_path / "s")
    yield s
    s.shutdown()


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[MessageStore]:
    """A store without a master's services: a transaction's state is found in its log (a
    master that knows every end since it started takes no look)."""
    s = open_store(tmp_path / "r", master=False)
    yield s
    s.shutdown()


def bodies(store: MessageStore, topic: str, queue_id: int = 0) -> list[bytes]:
    got = store.get_message("g", topic, queue_id, 0, 100)
    return [m.body for m in got.messages()] if got.status is GetStatus.FOUND else []


def test_a_timer_tick_on_a_record_the_timer_did_not_write_is_ignored(
        store: MessageStore) -> None:
    forged = store.put(Message("mine", b"forged", properties={
        TIMER_TICK: str(YEAR_2100_MS), TIMER_SOURCE: "0"}), 0)
    assert forged.ok
    store.reput.catch_up()
    assert store.timer.delivered_tick < YEAR_2100_MS
    assert store.timer.stats["untrusted_marks"] == 1  # counted (and logged once)
    # a delivery the timer wrote still counts
    assert store.put(Message("mine", b"due", properties={TIMER_DELAY_MS: "200"}), 0).ok
    wait_for(lambda: b"due" in bodies(store, "mine"), "the timer's delivery")
    store.reput.catch_up()
    [delivered] = [m for m in store.get_message("g", "mine", 0, 0, 10).messages()
                   if m.body == b"due"]
    assert store.timer.delivered_tick == int(delivered.properties[TIMER_TICK])


@pytest.mark.parametrize("how", ["delay level", "timer"])
def test_a_held_message_with_no_real_queue_is_skipped_not_retried(
        store: MessageStore, how: str) -> None:
    ways: dict[str, dict[str, Any]] = {"delay level": {"delay_level": 1},
                                       "timer": {"properties": {TIMER_DELAY_MS: "100"}}}
    held = ways[how]
    assert store.put(Message("mine", b"bad", **held), -1).ok
    assert store.put(Message("mine", b"good", **held), 0).ok
    wait_for(lambda: bodies(store, "mine") == [b"good"], "the message after the bad one")
    skipped = store.schedule.refused if how == "delay level" else \
        store.timer.stats["refused_targets"]
    assert skipped == 1


def test_a_held_message_is_never_delivered_into_the_revive_topic(store: MessageStore) -> None:
    revive = revive_topic(store.cfg.brokerClusterName)
    key = ("billing", "orders", 0)
    ck = pop_records.ck(key, [0, 1, 2], [1, 1, 1], [None] * 3, YEAR_2100_MS, 3, 17)
    # held by the schedule with REAL_TOPIC the revive topic (what an injection made it say)
    assert store.put(Message(revive, ck.message(revive).body, tags=pop_records.CK,
                             delay_level=1, properties={POP_RECORD: pop_records.CK}), 0).ok
    assert store.put(Message("mine", b"after", delay_level=1), 0).ok
    wait_for(lambda: bodies(store, "mine") == [b"after"], "the delivery after it")
    store.reput.catch_up()
    assert bodies(store, revive) == [] and store.pop.state(key) is None


def test_a_revive_record_the_pop_did_not_write_is_not_applied(store: MessageStore) -> None:
    revive = revive_topic(store.cfg.brokerClusterName)
    ours, theirs = ("g1", "orders", 0), ("billing", "orders", 0)
    for key, extra in ((theirs, {SCHEDULE_SOURCE: "4096"}), (ours, {})):
        rec = pop_records.ck(key, [0, 1], [1, 1], [None, None], YEAR_2100_MS, 2, 17)
        msg = rec.message(revive)
        msg.properties.update(extra)
        assert store.put(msg, 0).ok
    store.reput.catch_up()
    assert store.pop.state(ours) is not None  # the POP's own record is applied
    assert store.pop.state(theirs) is None


def half_at(store: MessageStore) -> MessageExt:
    result = store.put(Message("orders", b"h", tags="T", properties={
        TRAN_MSG: "true", PRODUCER_GROUP: "pg", PROPERTY_UNIQ_KEY: "K1"}, sys_flag=0x4), 0)
    assert result.ok
    store.reput.catch_up()
    half = store.transactions.half_at(result.phy_offset)
    assert half is not None
    return half


def test_a_plain_record_with_a_half_origin_is_not_a_commit(replica: MessageStore) -> None:
    store = replica
    half = half_at(store)
    origin = str(half.commit_log_offset)
    store.set_confirm_offset(store.commit_log.max_offset)  # what follows stays undispatched
    try:
        assert store.put(Message("orders", b"plain", properties={HALF_ORIGIN: origin}), 0).ok
        assert store.dispatched_phy_offset < store.commit_log.max_offset
        assert store.transactions.decided(half).state is None
    finally:
        store.set_confirm_offset(None)
    store.reput.catch_up()
    assert store.transactions.decided(half).state is None


def test_an_op_delivered_into_the_op_topic_ends_nothing(replica: MessageStore) -> None:
    store = replica
    half = half_at(store)
    origin = half.commit_log_offset
    forged = Message(OP_TOPIC, b"0", tags=OP_TAG, keys=[HALF_ORIGIN + str(origin)],
                     properties={OP_STATE: "ROLLBACK", SCHEDULE_SOURCE: "4096"})
    store.set_confirm_offset(store.commit_log.max_offset)
    try:
        assert store.put(forged, 0).ok
        assert store.transactions.decided(half).state is None
    finally:
        store.set_confirm_offset(None)
    store.reput.catch_up()  # indexed now: found by the index, and still not taken
    assert store.transactions.decided(half).state is None


def test_a_forged_tick_not_yet_dispatched_does_not_move_a_new_masters_read_time(
        replica: MessageStore) -> None:
    """A promotion starts the dequeue from the newest tick in the records reput has not
    dispatched yet: a forged one there would move the read time to 2100."""
    store = replica
    store.set_confirm_offset(store.commit_log.max_offset)  # what follows stays undispatched
    assert store.put(Message("mine", b"forged", properties={
        TIMER_TICK: str(YEAR_2100_MS), TIMER_SOURCE: "0"}), 0).ok
    assert store.dispatched_phy_offset < store.commit_log.max_offset
    store.set_master_services(True)  # promoted: the dequeue starts
    assert store.timer.dequeuing
    assert store.timer.read_time_ms < YEAR_2100_MS
    store.set_confirm_offset(None)
    assert store.put(Message("mine", b"due", properties={TIMER_DELAY_MS: "200"}), 0).ok
    wait_for(lambda: b"due" in bodies(store, "mine"), "a delivery after the promotion")


def test_a_forged_delivery_mark_does_not_pass_for_a_delivery(replica: MessageStore) -> None:
    """A new master looks up whether each due message was delivered already (by its
    ``__TIMER_SRC`` in the log): a record of the topic naming it, with no tick the timer
    wrote, is not its delivery, and the message is delivered."""
    store = replica
    held = store.put(Message("mine", b"due", properties={TIMER_DELAY_MS: "300"}), 0)
    assert held.ok
    assert store.put(Message("mine", b"forged", properties={
        TIMER_SOURCE: str(held.phy_offset)}), 0).ok
    store.reput.catch_up()
    store.set_master_services(True)  # promoted: the dequeue checks what was delivered
    wait_for(lambda: b"due" in bodies(store, "mine"), "the delivery of the held message")



def _largest(store: MessageStore, topic: str, held: dict[str, Any]) -> Message:
    """The message ``held`` asks for, with a filler property that brings the held record's
    properties to the store's limit: the largest a producer may send (put here, to measure)."""
    props = held.get("properties", {})
    for size in range(MAX_PROPERTIES_BYTES - 64, 0, -1):
        msg = Message(topic, b"big", properties={**props, "fill": "x" * size},
                      delay_level=held.get("delay_level", 0))
        if store.put(msg, 0).ok:
            return msg
    raise AssertionError("no filler fits")


@pytest.mark.parametrize("how", ["delay level", "timer"])
def test_a_held_message_whose_delivery_would_be_too_large_does_not_stall_the_others(
        store: MessageStore, how: str) -> None:
    """The delivery adds the broker's marks to what a producer sent: a held record at the
    properties limit cannot be delivered, and is skipped; the ones behind it are delivered."""
    ways: dict[str, dict[str, Any]] = {"delay level": {"delay_level": 1},
                                       "timer": {"properties": {TIMER_DELAY_MS: "100"}}}
    held = ways[how]
    _largest(store, "mine", held)
    assert store.put(Message("mine", b"good", **held), 0).ok
    wait_for(lambda: b"good" in bodies(store, "mine"), "the message after the big one")
