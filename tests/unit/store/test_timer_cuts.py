"""The timer when its CommitLog is cut back (a member that rejoins its group drops what only it
held, then takes the new master's records at the same offsets) and when its enqueue reads a
queue entry in the moment before reput has moved its dispatched offset past the record.

Each would lose or misplace an acknowledged timer message: a unit naming a record that is
gone (the new master's record there delivered at the old one's time), a queue offset left
past the cut (the new master's timer messages never put on the wheel), a read time left past
deliveries that were cut (those messages never delivered again), an entry taken for
unreadable (the message dropped)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_timer_messages import START_S, Clock, bodies, enqueued, open_store, wait_for

from common.core.errors import StoreError
from common.core.message import Message
from common.core.timer import TIMER_DELAY_SEC
from common.store.timer.checkpoint import TimerCheckpoint
from common.store.timer.layout import CHECKPOINT
from common.store.timer.marks import ReadMarks

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


@pytest.fixture
def clock() -> Clock:
    return Clock()


def timed(topic: str, body: bytes, delay_s: int) -> Message:
    return Message(topic, body, properties={TIMER_DELAY_SEC: str(delay_s)})


def test_an_entry_read_before_reput_moves_its_offset_is_enqueued(
        tmp_path: Path, clock: Clock) -> None:
    """Reput writes a pass's queue entries, then moves ``dispatched_phy_offset``: an enqueue
    that reads the entry in between must still find the record (a store with a confirmed
    offset, as in controller mode: the client's gate is shut for it in that moment)."""
    store = open_store(tmp_path / "s", clock, timerStopEnqueue=True)
    try:
        put = store.put(timed("t", b"m", 2), 0)
        assert put.ok
        store.reput.catch_up()
        timer = store.timer
        with store.reput._lock:  # reput holds still; its offset as in the middle of a pass
            dispatched = store.dispatched_phy_offset
            store.confirm_phy_offset = store.commit_log.max_offset
            store.dispatched_phy_offset = put.phy_offset
            try:
                assert not store.confirmed(put.phy_offset)
                assert timer.enqueue_available() == 1
            finally:
                store.dispatched_phy_offset = dispatched
                store.confirm_phy_offset = None
        assert timer.stats["enqueued"] == 1 and timer.stats["unreadable"] == 0
        timer.stop_enqueue = False
        clock.now = START_S + 2
        wait_for(lambda: bodies(store, "t") == [b"m"], "the delivery")
    finally:
        store.shutdown()


def test_a_cut_takes_back_the_units_and_the_queue_offset_of_what_it_dropped(
        tmp_path: Path, clock: Clock) -> None:
    """Records past the cut are replaced by the new master's at the same offsets: its message
    is put on the wheel at its own time, and the unit of the one cut is gone with it."""
    store = open_store(tmp_path / "s", clock)
    try:
        assert store.put(timed("t", b"kept", 3), 0).ok
        cut = store.put(timed("t", b"only-here", 2), 0)  # the old master's alone: cut
        assert cut.ok
        enqueued(store, 2)
        store.reput.catch_up()
        store.set_master_services(False)  # a member rejoining as a slave
        store.truncate_to(cut.phy_offset)
        timer = store.timer
        assert timer.enqueued_offset == 1 and timer.stats["units_cut"] == 1
        # the new master's message, stored at the offsets the cut one had, due later
        new = store.put(timed("t", b"new-master", 8), 0)
        assert new.phy_offset == cut.phy_offset and new.queue_offset == cut.queue_offset
        enqueued(store, 3)
        store.set_master_services(True)
        clock.now = START_S + 4  # past the time of the one cut, before the new one's
        wait_for(lambda: bodies(store, "t") == [b"kept"], "the one kept")
        wait_for(lambda: timer.read_time_ms > int(START_S * 1000) + 3000, "the dequeue to go on")
        assert bodies(store, "t") == [b"kept"]  # not the new one, at the cut one's time
        clock.now = START_S + 8
        wait_for(lambda: bodies(store, "t") == [b"kept", b"new-master"], "the new master's")
    finally:
        store.shutdown()


@pytest.mark.parametrize("restart", [False, True], ids=["running", "restarted"])
def test_a_cut_of_deliveries_delivers_them_again(
        tmp_path: Path, clock: Clock, restart: bool) -> None:
    """A master delivered a tick, then was cut back to before those deliveries (they never
    reached the others): its read time goes back, and as master again it delivers them, once.
    ``restarted``: killed and restarted between, so that only its checkpoint's marks know."""
    root = tmp_path / "s"
    store = open_store(root, clock)
    try:
        for i in range(3):
            assert store.put(timed("t", b"m%d" % i, i + 1), 0).ok
        enqueued(store, 3)
        clock.now = START_S + 1.5
        wait_for(lambda: bodies(store, "t") == [b"m0"], "the first delivery")
        before_second = store.commit_log.max_offset
        clock.now = START_S + 2.5
        wait_for(lambda: bodies(store, "t") == [b"m0", b"m1"], "the second delivery")
        wait_for(lambda: store.timer.read_time_ms >= int(START_S * 1000) + 2000,
                 "the dequeue to leave the second tick")
        store.timer.flush()
        if restart:
            store.shutdown()
            store = open_store(root, clock)
        store.set_master_services(False)  # rejoining as a slave: the second delivery is cut
        store.truncate_to(before_second)
        assert store.timer.read_time_ms <= int(START_S * 1000) + 2000
        assert bodies(store, "t") == [b"m0"]
        store.set_master_services(True)  # master again
        clock.now = START_S + 5
        wait_for(lambda: bodies(store, "t") == [b"m0", b"m1", b"m2"], "m1 again, then m2")
        clock.now = START_S + 10
        wait_for(lambda: store.timer.read_time_ms > int(START_S * 1000) + 9000, "the dequeue")
        assert bodies(store, "t") == [b"m0", b"m1", b"m2"]
    finally:
        store.shutdown()


def test_read_marks_go_back_to_the_newest_below_a_cut() -> None:
    marks = ReadMarks([(0, 100)])
    marks.note(500, 200)
    marks.note(500, 300)  # the same end, a later read time: replaces it
    marks.note(700, 300)  # a later end, no later read time: nothing new
    marks.note(900, 400)
    assert marks.since((500, 200)) == [(500, 300), (900, 400)]
    assert marks.cut(899) == (300, 400)
    assert marks.cut(10) == (100, 300)
    assert marks.cut(-1) == (None, 100)


def test_the_checkpoint_keeps_its_marks_after_rocketmqs_fields(tmp_path: Path) -> None:
    path = tmp_path / "timercheck"
    cp = TimerCheckpoint(path, last_read_time_ms=5, last_timer_log_flush_pos=52,
                         marks=[(10, 1), (20, 2)])
    cp.flush()
    raw = path.read_bytes()
    assert len(raw) == 4096 and CHECKPOINT.unpack_from(raw)[:3] == (5, 52, 0)
    assert TimerCheckpoint.load(path).marks == [(10, 1), (20, 2)]
    damaged = bytearray(raw)
    damaged[CHECKPOINT.size:CHECKPOINT.size + 8] = (10**6).to_bytes(8, "big")
    path.write_bytes(bytes(damaged))
    with pytest.raises(StoreError, match="read marks"):
        TimerCheckpoint.load(path)
