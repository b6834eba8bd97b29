"""Timer messages on a real store with a clock of the test's: held in the timer topic until
their tick has passed, then delivered once to their real topic and queue, never early; the
limits (too far, a delay level, already due, a full tick), the roll window, a restart, and a
checkpoint that lags behind the deliveries (a crash) never deliver one twice."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from common.core.config import load_config
from common.core.errors import GetStatus, PutStatus
from common.core.message import SCHEDULE_TOPIC, Message
from common.core.timer import (
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    TIMER_DEQUEUE_MS,
    TIMER_ENQUEUE_MS,
    TIMER_TOPIC,
)
from common.store.message_store import MessageStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

START_S = 1_800_000_000.0  # a fixed "now" the test moves by hand


class Clock:
    def __init__(self) -> None:
        self.now = START_S

    def __call__(self) -> float:
        return self.now


def open_store(root: Path, clock: Clock, **over: object) -> MessageStore:
    fields: dict[str, object] = {
        "storePathRootDir": str(root), "mappedFileSizeCommitLog": 1024 * 1024,
        "mappedFileSizeConsumeQueue": 20 * 1000, "mappedFileSizeTimerLog": 52 * 200,
        "timerFlushIntervalMs": 50, "timerPrecisionMs": 1000,
    }
    fields.update(over)
    store = MessageStore(load_config(env={}, **fields))  # type: ignore[arg-type]
    store.timer.set_clock(clock)
    store.start()
    return store


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, clock: Clock) -> Iterator[MessageStore]:
    s = open_store(tmp_path / "s", clock)
    yield s
    s.shutdown()


def bodies(store: MessageStore, topic: str, queue_id: int = 0) -> list[bytes]:
    got = store.get_message("g", topic, queue_id, 0, 1000)
    return [m.body for m in got.messages()] if got.status is GetStatus.FOUND else []


def wait_for(cond: Callable[[], object], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def enqueued(store: MessageStore, n: int) -> None:
    wait_for(lambda: store.timer.stats["enqueued"] >= n, f"{n} enqueued")


def test_a_timer_message_waits_for_its_tick_then_is_delivered_once(
        store: MessageStore, clock: Clock) -> None:
    msg = Message("orders", b"later", tags="T", keys="k1",
                  properties={TIMER_DELAY_MS: "2500"})
    put = store.put(msg, 3)
    assert put.ok and put.queue_id == 0  # the timer topic's queue
    store.reput.catch_up()
    assert bodies(store, "orders", 3) == []
    enqueued(store, 1)
    # due at +2.5 s (on tick +2 s): delivered once that time has passed, never before
    clock.now = START_S + 2.499
    time.sleep(0.3)
    assert bodies(store, "orders", 3) == []
    clock.now = START_S + 2.5
    wait_for(lambda: bodies(store, "orders", 3) == [b"later"], "the delivery")
    got = store.get_message("g", "orders", 3, 0, 10).messages()[0]
    assert got.tags == "T" and got.keys == "k1"
    assert int(got.properties[TIMER_DEQUEUE_MS]) >= int(START_S * 1000) + 2500
    assert TIMER_ENQUEUE_MS in got.properties and TIMER_DELAY_MS not in got.properties
    clock.now = START_S + 60
    time.sleep(0.3)
    assert bodies(store, "orders", 3) == [b"later"]  # once
    assert store.timer.stats["delivered"] == 1


def test_the_limits_of_a_timer_message(tmp_path: Path, clock: Clock) -> None:
    store = open_store(tmp_path / "s", clock, timerMaxDelaySec=3600, timerCongestNumEachSlot=2)
    try:
        too_far = store.put(Message("t", b"x", properties={TIMER_DELAY_SEC: "3601"}), 0)
        assert too_far.status is PutStatus.WHEEL_TIMER_MSG_ILLEGAL
        assert "timerMaxDelaySec (3600 s)" in too_far.remark
        huge = store.put(Message("t", b"x", properties={TIMER_DELAY_SEC: str(2**62)}), 0)
        assert huge.status is PutStatus.WHEEL_TIMER_MSG_ILLEGAL  # no overflow into the past
        bad = store.put(Message("t", b"x", properties={TIMER_DELIVER_MS: "soon"}), 0)
        assert bad.status is PutStatus.WHEEL_TIMER_MSG_ILLEGAL and "not an integer" in bad.remark
        due = store.put(Message("t", b"now", properties={TIMER_DELIVER_MS: "1"}), 0)
        assert due.ok and due.queue_id == 0
        store.reput.catch_up()
        assert bodies(store, "t") == [b"now"]  # in the past: a plain message
        level = store.put(Message("t", b"lvl", delay_level=1,
                                  properties={TIMER_DELAY_SEC: "100"}), 0)
        store.reput.catch_up()
        held = store.get_message("g", SCHEDULE_TOPIC, 0, 0, 10).messages()
        assert level.ok and [m.body for m in held] == [b"lvl"]  # the delay level won
        assert TIMER_DELAY_SEC not in held[0].properties
        for i in range(2):
            assert store.put(Message("t", b"%d" % i, properties={TIMER_DELAY_SEC: "10"}), 0).ok
        enqueued(store, 2)
        full = store.put(Message("t", b"x", properties={TIMER_DELAY_SEC: "10"}), 0)
        assert full.status is PutStatus.WHEEL_TIMER_FLOW_CONTROL  # refused, not dropped
        assert store.put(Message("t", b"y", properties={TIMER_DELAY_SEC: "20"}), 0).ok
    finally:
        store.shutdown()


def test_a_delivery_past_the_roll_window_is_rolled_then_delivered_on_time(
        tmp_path: Path, clock: Clock) -> None:
    store = open_store(tmp_path / "s", clock, timerRollWindowSlot=5)
    try:
        assert store.put(Message("t", b"far", properties={TIMER_DELAY_SEC: "12"}), 0).ok
        enqueued(store, 1)
        assert store.timer.stats["rolled_in"] == 1
        for second in range(1, 13):
            clock.now = START_S + second - 0.001
            time.sleep(0.05)
            assert bodies(store, "t") == [], f"delivered early, at +{second - 0.001} s"
        clock.now = START_S + 12
        wait_for(lambda: bodies(store, "t") == [b"far"], "the rolled delivery")
        assert store.timer.stats["rolled"] >= 1
        assert store.cq_store.get(TIMER_TOPIC, 0).max_queue_offset >= 2  # type: ignore[union-attr]
    finally:
        store.shutdown()


def test_a_restart_keeps_what_is_pending_and_delivers_nothing_twice(
        tmp_path: Path, clock: Clock) -> None:
    root = tmp_path / "s"
    store = open_store(root, clock)
    for i in range(20):
        assert store.put(Message("t", b"m%02d" % i, properties={TIMER_DELAY_SEC: str(i + 1)}),
                         0).ok
    enqueued(store, 20)
    clock.now = START_S + 6  # due at +1 s .. +6 s: six of them
    wait_for(lambda: len(bodies(store, "t")) == 6, "the first six")
    store.shutdown()
    store = open_store(root, clock)
    try:
        clock.now = START_S + 30
        wait_for(lambda: len(bodies(store, "t")) == 20, "the rest after the restart")
        assert bodies(store, "t") == [b"m%02d" % i for i in range(20)]
    finally:
        store.shutdown()


def test_a_checkpoint_behind_the_deliveries_delivers_nothing_twice(
        tmp_path: Path, clock: Clock) -> None:
    """A crash after deliveries and before the checkpoint that says so: the restarted dequeue
    starts behind, and finds in its own log what was delivered already."""
    root = tmp_path / "s"
    store = open_store(root, clock)
    for i in range(10):
        assert store.put(Message("t", b"m%d" % i, properties={TIMER_DELAY_SEC: str(i + 1)}),
                         0).ok
    enqueued(store, 10)
    store.timer.flush()
    stale = (root / "config" / "timercheck").read_bytes()  # read time: before any delivery
    clock.now = START_S + 6  # due at +1 s .. +6 s: six of them
    wait_for(lambda: len(bodies(store, "t")) == 6, "six deliveries")
    store.shutdown()
    (root / "config" / "timercheck").write_bytes(stale)
    store = open_store(root, clock)
    try:
        time.sleep(0.5)
        assert len(bodies(store, "t")) == 6  # the same six, not again
        clock.now = START_S + 20
        wait_for(lambda: len(bodies(store, "t")) == 10, "the other four")
        assert sorted(bodies(store, "t")) == sorted(b"m%d" % i for i in range(10))
    finally:
        store.shutdown()


def test_a_delete_marker_drops_its_message_in_its_own_topic_only(
        store: MessageStore, clock: Clock) -> None:
    from common.core.message import PROPERTY_UNIQ_KEY
    from common.core.timer import TIMER_DEL_UNIQKEY, RecallHandle
    from common.store.timer.recall import delete_marker

    due = str(int(START_S * 1000) + 3000)
    for topic, key in (("a", "K1"), ("a", "K2"), ("b", "K1")):
        assert store.put(Message(topic, f"{topic}{key}".encode(), properties={
            TIMER_DELIVER_MS: due, PROPERTY_UNIQ_KEY: key}), 0).ok
    assert store.put(delete_marker(RecallHandle("a", "x", int(due), "K1")), 0).ok
    # a marker sent to b naming a's message: it may delete in b only, so it deletes nothing
    assert store.put(Message("b", b"", properties={
        TIMER_DELIVER_MS: due, TIMER_DEL_UNIQKEY: "a+K2", PROPERTY_UNIQ_KEY: "M"}), 0).ok
    enqueued(store, 5)
    clock.now = START_S + 3
    wait_for(lambda: bodies(store, "a") == [b"aK2"] and bodies(store, "b") == [b"bK1"],
             "the deliveries")
    time.sleep(0.2)
    assert bodies(store, "a") == [b"aK2"] and bodies(store, "b") == [b"bK1"]
    assert store.timer.stats["recalled"] == 1


def test_a_unit_for_the_tick_being_delivered_waits_for_the_next_one(
        store: MessageStore, clock: Clock) -> None:
    """The dequeue took tick T's units; an enqueue that comes now (a late one) must not add to
    T, which is left once its units are delivered: it goes to T + 1 tick."""
    timer = store.timer
    with timer.lock:
        tick = timer.read_time_ms
        timer.delivering_tick = tick
    assert store.put(Message("t", b"late", properties={
        TIMER_DELIVER_MS: str(tick + 1)}), 0).ok  # due in the tick being delivered
    enqueued(store, 1)
    assert timer.wheel is not None
    assert timer.wheel.slot(tick).num == 0
    assert timer.wheel.slot(tick + timer.precision_ms).num == 1


def test_each_message_of_a_tick_is_delivered_at_its_own_time(
        store: MessageStore, clock: Clock) -> None:
    """Not at the end of its tick (RocketMQ's rule, up to a tick late): a tick's messages go
    out one by one as their times pass, and a message enqueued into the tick under way is
    still picked up."""
    base = int(START_S * 1000) + 2000
    for at in (2100, 2800):
        assert store.put(Message("t", b"%d" % at, properties={
            TIMER_DELIVER_MS: str(base - 2000 + at)}), 0).ok
    enqueued(store, 2)
    clock.now = START_S + 2.1
    wait_for(lambda: bodies(store, "t") == [b"2100"], "the first of the tick")
    assert store.put(Message("t", b"2500", properties={TIMER_DELIVER_MS: str(base + 500)}),
                     0).ok  # joins the tick under way
    enqueued(store, 3)
    clock.now = START_S + 2.6
    wait_for(lambda: bodies(store, "t") == [b"2100", b"2500"], "the one that joined")
    time.sleep(0.1)
    assert bodies(store, "t") == [b"2100", b"2500"]
    clock.now = START_S + 2.8
    wait_for(lambda: len(bodies(store, "t")) == 3, "the last of the tick")
    assert list(store.timer.lateness_ms) == [0, 100, 0]  # ms after each one's time


def test_a_fenced_master_delivers_nothing_until_its_gate_opens(
        store: MessageStore, clock: Clock) -> None:
    fence = ["the lease is not fresh"]
    store.delivery_gate = lambda: fence[0]
    assert store.put(Message("t", b"held", properties={TIMER_DELAY_SEC: "1"}), 0).ok
    enqueued(store, 1)
    clock.now = START_S + 5
    wait_for(lambda: store.timer.stats["gated"] >= 3, "the dequeue to meet the fence")
    assert bodies(store, "t") == []
    fence[0] = ""
    wait_for(lambda: bodies(store, "t") == [b"held"], "the delivery once the gate opens")


def test_the_pending_count_skips_the_wheel_while_nothing_is_pending(store: MessageStore,
                                                                    clock: Clock) -> None:
    """The status figures are counted by a pass over up to two days of slots; with nothing
    pending and nothing put since, the pass is skipped (it cost ~10% of a core on an idle
    broker), and a put makes the next count look again."""
    timer = store.timer
    wait_for(lambda: timer._pending_puts == timer.wheel.puts, "the first count")
    scans: list[int] = []
    real = timer.wheel.count
    timer.wheel.count = lambda a, b: scans.append(1) or real(a, b)  # type: ignore[method-assign]
    timer._count_pending()
    assert scans == [] and timer.status()["pending"] == 0
    assert store.put(Message("t", b"later", properties={TIMER_DELAY_SEC: "30"}), 0).ok
    enqueued(store, 1)
    timer._count_pending()
    assert scans and timer.status()["pending"] == 1
    scans.clear()
    timer._count_pending()  # something pending: the windows move with the clock, counted again
    assert scans


def test_keys_of_the_same_hash_as_a_delivery_mark_hide_no_delivery(
        tmp_path: Path, clock: Clock) -> None:
    """A restarted dequeue behind its deliveries looks each up in the index by its mark's key
    (``__TIMER_SRC<offset>``): a producer of the real topic may index any number of newer
    records under a key of the same Java hash (``"`@"`` for ``"__"``). The look-up read 4
    hits: behind them the delivery was not found, and the message was delivered again."""
    root = tmp_path / "s"
    store = open_store(root, clock)
    held = store.put(Message("t", b"once", properties={TIMER_DELAY_SEC: "1"}), 0)
    assert held.ok
    enqueued(store, 1)
    store.timer.flush()
    stale = (root / "config" / "timercheck").read_bytes()  # read time: before the delivery
    clock.now = START_S + 2
    wait_for(lambda: bodies(store, "t") == [b"once"], "the delivery")
    for i in range(8):
        noise = Message("t", b"noise%d" % i, keys=f"`@TIMER_SRC{held.phy_offset}")
        assert store.put(noise, 0).ok
    store.shutdown()
    (root / "config" / "timercheck").write_bytes(stale)
    store = open_store(root, clock)
    try:
        wait_for(lambda: store.timer.stats["skipped_delivered"] >= 1
                 or bodies(store, "t").count(b"once") > 1, "the delivery met again")
        assert store.timer.stats["delivered"] == 0
        assert bodies(store, "t").count(b"once") == 1
    finally:
        store.shutdown()
