"""Delayed deliveries happen exactly once by the log (docs/guarantees.md, "Delayed messages"):
where each level stands comes from the deliveries the store's own log holds, not from
``delayOffset.json``, which may lag the log (a crash before its write) or lead it (a copy from a
master whose log the new master does not share), and a master whose writes are fenced delivers
nothing. The service runs on its own thread, as on a master, with its clock set ahead."""

from __future__ import annotations

import json
import threading
import time
import types
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from common.core.config import load_config
from common.core.message import SCHEDULE_SOURCE, SCHEDULE_TOPIC, Message
from common.store import schedule
from common.store.message_store import MessageStore
from common.store.schedule import MAX_PER_PASS

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

LATER_MS = 2**50  # every entry is due


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = MessageStore(load_config(env={}, storePathRootDir=str(tmp_path),
                                 mappedFileSizeCommitLog=1024 * 1024, messageDelayLevel="1s 5s"))
    s.start()
    s.set_master_services(False)  # started per test, with its clock
    yield s
    s.shutdown()


def wait_for(cond: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        threading.Event().wait(0.005)


def run(store: MessageStore, monkeypatch: pytest.MonkeyPatch, file_offsets: dict[int, int],
        now_ms: int, until: dict[int, int]) -> None:
    """Start delivery as a start or a promotion does, after ``delayOffset.json`` said
    ``file_offsets``, with the clock at ``now_ms``; stop once each level of ``until`` stands
    at its offset."""
    path = store.root / "config" / "delayOffset.json"
    path.write_text(json.dumps({"offsetTable": {str(k): v for k, v in file_offsets.items()}}))
    store.reput.catch_up()  # the schedule queues hold every entry put so far
    monkeypatch.setattr(schedule, "time", types.SimpleNamespace(time=lambda: now_ms / 1000))
    store.set_master_services(True)
    try:
        wait_for(lambda: all(store.schedule.offsets.get(level) == offset
                             for level, offset in until.items()), f"levels at {until}")
    finally:
        store.set_master_services(False)


def deliveries(store: MessageStore) -> Counter[str]:
    store.reput.catch_up()
    out: Counter[str] = Counter()
    for topic, queues in store.topic_queues().items():
        if topic.startswith("real"):
            for q in range(queues):
                got = store.get_message("g", topic, q, 0, 1024)
                while got.records:
                    for m in got.messages():
                        out[m.properties[SCHEDULE_SOURCE]] += 1
                    got = store.get_message("g", topic, q, got.next_begin_offset, 1024)
    return out


def test_a_level_with_a_backlog_does_not_make_another_deliver_twice(
        store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Level 1 delivered whole, more than one pass's worth, level 2 not at all, and the file
    written before either: one flag for all levels once stopped checking at level 2's first
    entry, and level 1's second pass delivered its entries again."""
    backlog = MAX_PER_PASS + 76
    first = store.put(Message("real1", b"x", delay_level=1), 0)
    for _ in range(backlog - 1):
        store.put(Message("real1", b"x", delay_level=1), 0)
    for _ in range(10):
        store.put(Message("real2", b"y", delay_level=2), 0)
    run(store, monkeypatch, {}, first.store_timestamp + 2000, {1: backlog})  # level 2 not due
    assert sum(deliveries(store).values()) == backlog
    run(store, monkeypatch, {1: 0, 2: 0}, LATER_MS, {1: backlog, 2: 10})  # file never written
    counts = deliveries(store)
    assert sum(counts.values()) == backlog + 10
    assert max(counts.values()) == 1


def test_a_file_ahead_of_the_log_skips_nothing(store: MessageStore,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(10):
        store.put(Message("real1", b"%d" % i, delay_level=1), 0)
    run(store, monkeypatch, {1: 7}, LATER_MS, {1: 10})  # copied from a master further on
    assert sorted(deliveries(store).values()) == [1] * 10


def test_a_file_behind_the_log_delivers_nothing_twice(store: MessageStore,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(10):
        store.put(Message("real1", b"%d" % i, delay_level=1), 0)
    run(store, monkeypatch, {}, LATER_MS, {1: 10})
    run(store, monkeypatch, {1: 2}, LATER_MS, {1: 10})  # a crash before the file said more
    assert sorted(deliveries(store).values()) == [1] * 10


def test_deliveries_past_the_confirmed_offset_count_as_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = MessageStore(load_config(env={}, storePathRootDir=str(tmp_path), brokerId=1,
                                 enableControllerMode=True, controllerAddr="127.0.0.1:2181",
                                 messageDelayLevel="1s"))
    s.start()
    try:
        s.set_master_services(False)
        for i in range(4):
            s.put(Message("real1", b"%d" % i, delay_level=1), 0)
        s.set_confirm_offset(None)
        s.reput.catch_up()
        s.set_confirm_offset(s.max_phy_offset)  # from here on nothing new is confirmed
        run(s, monkeypatch, {}, LATER_MS, {1: 4})
        assert s.dispatched_phy_offset < s.max_phy_offset  # the deliveries are not indexed
        before = s.max_phy_offset
        run(s, monkeypatch, {}, LATER_MS, {1: 4})  # a promotion before they are confirmed
        assert s.max_phy_offset == before  # nothing delivered again
    finally:
        s.shutdown()


def test_a_fenced_master_delivers_nothing(store: MessageStore,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(3):
        store.put(Message("real1", b"%d" % i, delay_level=1), 0)
    reason = "the controller lease is not fresh"
    store.delivery_gate = lambda: reason
    store.reput.catch_up()
    monkeypatch.setattr(schedule, "time", types.SimpleNamespace(time=lambda: LATER_MS / 1000))
    store.set_master_services(True)
    try:
        wait_for(lambda: getattr(store.schedule, "gated", 0) >= 3, "three gated passes")
        assert deliveries(store) == Counter()
        reason = ""
        wait_for(lambda: store.schedule.offsets.get(1) == 3, "the deliveries")
    finally:
        store.set_master_services(False)
    assert sorted(deliveries(store).values()) == [1] * 3
    assert store.cq_store.get(SCHEDULE_TOPIC, 0) is not None


def test_keys_of_the_same_hash_as_a_delivery_mark_hide_no_delivery(
        store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a delayed message was delivered is looked up in the index by its mark's key
    (``__SCHED_SRC<offset>``): a producer of the real topic may index any number of newer
    records under a key of the same Java hash (``"`@"`` for ``"__"``). The look-up read 4
    hits: behind them the delivery was not found, and the message was delivered again."""
    held = store.put(Message("real1", b"once", delay_level=1), 0)
    run(store, monkeypatch, {}, LATER_MS, {1: 1})
    for i in range(8):
        noise = Message("real1", b"noise%d" % i, keys=f"`@SCHED_SRC{held.phy_offset}")
        assert store.put(noise, 0).ok
    run(store, monkeypatch, {1: 0}, LATER_MS, {1: 1})  # a crash before the file said more
    store.reput.catch_up()
    got = store.get_message("g", "real1", 0, 0, 64)
    assert [m.body for m in got.messages()].count(b"once") == 1
