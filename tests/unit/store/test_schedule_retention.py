"""Delay levels (deliver once, on time, across restarts) and retention (issue 3)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers.stores import make_store
from helpers.stores import wait_until as wait_for
from time_bounds import late_s

from common.core.errors import GetStatus, PutStatus
from common.core.message import SCHEDULE_TOPIC, Message
from common.store.message_store import MessageStore

pytestmark = pytest.mark.unit


def delivered(store: MessageStore, topic: str, queue_id: int) -> list[bytes]:
    got = store.get_message("g", topic, queue_id, 0, 100)
    return [m.body for m in got.messages()] if got.status is GetStatus.FOUND else []


@pytest.mark.timeout(30)
def test_level_one_delivers_after_one_second(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    try:
        sent = time.monotonic()
        r = store.put(Message("orders", b"late", tags="T", keys="k1", delay_level=1), 3)
        assert r.status is PutStatus.PUT_OK
        held = store.message_by_offset(r.phy_offset)
        assert held is not None and held.topic == SCHEDULE_TOPIC and held.queue_id == 0
        assert held.properties["REAL_TOPIC"] == "orders" and held.properties["REAL_QID"] == "3"
        assert wait_for(lambda: store.max_queue_offset("orders", 3) == 1, late_s(1.0))
        elapsed = time.monotonic() - sent
        assert 0.5 <= elapsed <= late_s(1.0), elapsed  # level 1 is 1 s
        (msg,) = store.get_message("g", "orders", 3, 0, 10).messages()
        assert msg.body == b"late" and msg.tags == "T" and msg.keys == "k1"
        assert "DELAY" not in msg.properties
        assert [m.body for m in store.query_by_key("orders", "k1")] == [b"late"]
    finally:
        store.shutdown()


@pytest.mark.timeout(30)
def test_restart_before_due_time_delivers_once(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.put(Message("orders", b"a", delay_level=2), 0)  # due in 2 s
    store.shutdown()
    store = make_store(tmp_path)
    try:
        assert store.max_queue_offset("orders", 0) == 0
        assert wait_for(lambda: store.max_queue_offset("orders", 0) == 1, 4.0)
    finally:
        store.shutdown()
    store = make_store(tmp_path)
    try:
        time.sleep(0.3)  # give a wrong re-delivery the chance to happen
        assert delivered(store, "orders", 0) == [b"a"]
    finally:
        store.shutdown()


@pytest.mark.timeout(30)
def test_crash_between_delivery_and_progress_write_does_not_repeat(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.put(Message("orders", b"once", delay_level=1), 1)
    assert wait_for(lambda: store.max_queue_offset("orders", 1) == 1, 3.0)
    store.shutdown()
    # Simulate dying before the progress file recorded the delivery.
    progress = tmp_path / "config" / "delayOffset.json"
    progress.write_text(json.dumps({"offsetTable": {"1": 0}}))
    store = make_store(tmp_path)
    try:
        assert wait_for(lambda: store.schedule.offsets.get(1) == 1, 3.0)
        assert delivered(store, "orders", 1) == [b"once"]
    finally:
        store.shutdown()


@pytest.mark.timeout(30)
def test_due_entries_after_a_delivered_one_still_arrive(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.put(Message("orders", b"first", delay_level=1), 0)
    assert wait_for(lambda: store.max_queue_offset("orders", 0) == 1, 3.0)
    store.put(Message("orders", b"second", delay_level=1), 0)
    store.shutdown()
    progress = tmp_path / "config" / "delayOffset.json"
    progress.write_text(json.dumps({"offsetTable": {"1": 0}}))
    store = make_store(tmp_path)
    try:
        assert wait_for(lambda: store.max_queue_offset("orders", 0) == 2, 4.0)
        assert delivered(store, "orders", 0) == [b"first", b"second"]
    finally:
        store.shutdown()


@pytest.mark.timeout(30)
def test_slave_store_does_not_deliver(tmp_path: Path) -> None:
    store = make_store(tmp_path, brokerRole="SLAVE", brokerId=1)
    try:
        store.commit_log.writeable = True
        store.put(Message("orders", b"x", delay_level=1), 0)
        time.sleep(1.5)
        assert store.max_queue_offset("orders", 0) == 0
    finally:
        store.shutdown()


@pytest.mark.timeout(30)
def test_retention_deletes_old_segments_and_their_queue_entries(tmp_path: Path) -> None:
    store = make_store(tmp_path, fileReservedTime=0, deleteFileBatchMax=100)
    try:
        for i in range(300):
            assert store.put(Message("t", b"%03d" % i + b"x" * 100), 0).ok
        assert store.wait_dispatched(store.max_phy_offset)
        segments = len(store.commit_log.queue.files)
        assert segments >= 4
        newest = store.max_queue_offset("t", 0) - 1
        deleted = store.clean_now()
        assert deleted == segments - 1  # never the segment being written
        assert store.snapshot().deleted_segments == deleted
        on_disk = sorted(int(p.name) for p in (tmp_path / "commitlog").iterdir()
                         if not p.name.startswith("."))  # hidden: being created
        assert on_disk[0] == store.min_phy_offset  # older ones are gone; later ones preallocated
        min_q = store.min_queue_offset("t", 0)
        assert min_q > 0
        got = store.get_message("g", "t", 0, 0, 1)
        assert got.status is GetStatus.OFFSET_TOO_SMALL and got.next_begin_offset == min_q
        (last,) = store.get_message("g", "t", 0, newest, 1).messages()
        assert last.body.startswith(b"299")
        first_kept = store.get_message("g", "t", 0, min_q, 1).messages()[0]
        assert first_kept.commit_log_offset >= store.min_phy_offset
    finally:
        store.shutdown()
    store = make_store(tmp_path)
    try:
        assert store.min_queue_offset("t", 0) == min_q
        assert store.put(Message("t", b"after"), 0).queue_offset == newest + 1
    finally:
        store.shutdown()


@pytest.mark.timeout(30)
def test_retention_keeps_young_segments(tmp_path: Path) -> None:
    store = make_store(tmp_path, fileReservedTime=1)
    try:
        for _ in range(200):
            store.put(Message("t", b"x" * 100), 0)
        assert store.clean_now() == 0
        assert store.min_phy_offset == 0
    finally:
        store.shutdown()


@pytest.mark.timeout(30)
def test_down_across_the_due_time_delivers_once_at_start(tmp_path: Path) -> None:
    level_s = 3.0  # level 1 here: "at once" is told apart from a wait of another level
    store = make_store(tmp_path, messageDelayLevel="3s 5s 10s")
    sent = time.monotonic()
    store.put(Message("orders", b"overdue", delay_level=1), 2)  # due level_s after the put
    store.shutdown()
    while time.monotonic() - sent < level_s + 0.5:  # stay down past the due time
        time.sleep(0.05)
    store = make_store(tmp_path, messageDelayLevel="3s 5s 10s")
    try:
        started = time.monotonic()
        assert wait_for(lambda: store.max_queue_offset("orders", 2) == 1, late_s(level_s))
        assert time.monotonic() - started < level_s  # overdue entries go out at once
    finally:
        store.shutdown()
    store = make_store(tmp_path, messageDelayLevel="3s 5s 10s")
    try:
        time.sleep(0.3)  # a wrong second delivery would happen now
        assert delivered(store, "orders", 2) == [b"overdue"]
    finally:
        store.shutdown()
