"""master/group_transfer.py: SYNC waits answered on acks in order, time out never early.

The driver runs on the request server's I/O thread; here the test plays that thread: it
binds a ``wake`` that counts, calls ``poll`` and sleeps ``timeout_ms``.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest
from time_bounds import LOAD_MARGIN_S, ROW12_LATE_S, tier

from common.broker.replies import Deferred, LoopWaits
from common.core.config import load_config
from common.core.errors import PutStatus, ResponseCode
from common.format.protocol import Response
from master.group_transfer import GroupTransfer, ReplicaPut

pytestmark = pytest.mark.unit


class FakeHa:
    def __init__(self) -> None:
        self.in_sync = 1


class Put(ReplicaPut):
    __slots__ = ("end",)

    def __init__(self, owner: GroupTransfer, end: int) -> None:
        super().__init__(owner)
        self.end = end

    def reply(self, status: PutStatus) -> Response:
        return Response(ResponseCode.SUCCESS, self.end, status.value, {}, [])


class Loop:
    """The I/O thread's side: counts wakes, collects answers as {end: status}."""

    def __init__(self, gt: GroupTransfer) -> None:
        self.gt = gt
        self.wakes = 0
        self.answered: dict[int, str] = {}
        self.order: list[int] = []
        gt.bind(self.wake)

    def wake(self, owner: LoopWaits) -> None:
        assert owner is self.gt
        self.wakes += 1

    def take(self, answers: list[tuple[Deferred, Response]]) -> list[int]:
        ends = []
        for held, resp in answers:
            assert isinstance(held, Put) and held.end not in self.answered
            self.answered[held.end] = resp.remark
            ends.append(held.end)
        self.order.extend(ends)
        return ends

    def poll(self) -> list[int]:
        return self.take(self.gt.poll())


def done(status: PutStatus = PutStatus.PUT_OK) -> concurrent.futures.Future[PutStatus]:
    fut: concurrent.futures.Future[PutStatus] = concurrent.futures.Future()
    fut.set_result(status)
    return fut


def make(timeout_ms: int, ha: FakeHa, isr: int = 2) -> GroupTransfer:
    cfg = load_config(
        None, (), env={}, slaveTimeout=timeout_ms, inSyncReplicas=isr, brokerRole="SYNC_MASTER"
    )
    return GroupTransfer(cfg, lambda: ha.in_sync)


def admit(
    gt: GroupTransfer, end: int, flushed: concurrent.futures.Future[PutStatus] | None = None
) -> PutStatus | None:
    return gt.admit(Put(gt, end), end, flushed or done())


def test_acks_answer_waiters_in_order_with_one_wake() -> None:
    ha = FakeHa()
    gt = make(60_000, ha)
    loop = Loop(gt)
    assert [admit(gt, end) for end in (300, 100, 200)] == [None, None, None]
    assert gt.pending == 3 and loop.poll() == []
    gt.report_quorum(150)
    gt.report_quorum(200)  # coalesced: a wake is already posted
    assert loop.wakes == 1
    assert loop.poll() == [100, 200]
    assert loop.answered == {100: "PUT_OK", 200: "PUT_OK"}
    gt.report_quorum(300)  # acked before this put was admitted: at once, and wakes 300 too
    assert loop.wakes == 2
    assert admit(gt, 250) == PutStatus.PUT_OK
    assert loop.poll() == [300]
    assert admit(gt, 1000) is None
    gt.stop()
    assert loop.wakes == 3
    assert loop.poll() == [1000]
    assert loop.answered[1000] == "FLUSH_SLAVE_TIMEOUT"  # indeterminate on stop
    assert admit(gt, 2000) == PutStatus.FLUSH_SLAVE_TIMEOUT  # refused at once once stopped
    assert gt.pending == 0


def test_no_wake_while_nobody_waits() -> None:
    ha = FakeHa()
    gt = make(60_000, ha)
    loop = Loop(gt)
    gt.report_quorum(100)
    assert loop.wakes == 0
    assert admit(gt, 100) == PutStatus.PUT_OK and loop.wakes == 0


def test_ack_reported_before_bind_is_not_lost() -> None:
    ha = FakeHa()
    gt = make(60_000, ha)
    assert admit(gt, 100) is None  # not bound yet: the server binds when it holds the put
    gt.report_quorum(100)
    loop = Loop(gt)
    assert loop.wakes == 1 and loop.poll() == [100]


def test_no_in_sync_slave_is_refused_at_once() -> None:
    ha = FakeHa()
    ha.in_sync = 0
    gt = make(60_000, ha)
    assert admit(gt, 10) == PutStatus.SLAVE_NOT_AVAILABLE
    assert gt.pending == 0 and gt.not_available == 1


def test_async_quorum_of_one_needs_no_wait() -> None:
    ha = FakeHa()
    ha.in_sync = 0
    gt = make(60_000, ha, isr=1)
    assert admit(gt, 10) == PutStatus.PUT_OK


def test_failed_flush_is_answered_at_once() -> None:
    gt = make(60_000, FakeHa())
    assert admit(gt, 10, done(PutStatus.FLUSH_DISK_TIMEOUT)) == PutStatus.FLUSH_DISK_TIMEOUT
    assert gt.pending == 0


@pytest.mark.parametrize("flush_first", [True, False])
def test_sync_flush_waits_for_both(flush_first: bool) -> None:
    gt = make(60_000, FakeHa())
    loop = Loop(gt)
    flushed: concurrent.futures.Future[PutStatus] = concurrent.futures.Future()
    assert admit(gt, 100, flushed) is None
    if flush_first:
        threading.Thread(target=flushed.set_result, args=(PutStatus.PUT_OK,)).start()
        deadline = time.monotonic() + 5
        while loop.wakes == 0:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert loop.poll() == []  # the replica has not acked yet
        gt.report_quorum(100)
    else:
        gt.report_quorum(100)
        assert loop.poll() == []  # acked, not flushed yet
        assert gt.pending == 1
        flushed.set_result(PutStatus.PUT_OK)
    assert loop.poll() == [100] and loop.answered[100] == "PUT_OK"
    assert gt.pending == 0


def test_flush_failure_wins_over_replica_ok() -> None:
    gt = make(60_000, FakeHa())
    loop = Loop(gt)
    flushed: concurrent.futures.Future[PutStatus] = concurrent.futures.Future()
    assert admit(gt, 100, flushed) is None
    gt.report_quorum(100)
    flushed.set_result(PutStatus.FLUSH_DISK_TIMEOUT)
    assert loop.poll() == [100] and loop.answered[100] == "FLUSH_DISK_TIMEOUT"


def test_release_all_answers_every_held_put() -> None:
    gt = make(60_000, FakeHa())
    loop = Loop(gt)
    unflushed: concurrent.futures.Future[PutStatus] = concurrent.futures.Future()
    assert admit(gt, 100) is None
    assert admit(gt, 200, unflushed) is None
    gt.report_quorum(200)
    assert loop.take(gt.release_all()) == [100, 200]
    assert loop.answered == {100: "PUT_OK", 200: "FLUSH_DISK_TIMEOUT"}
    assert gt.pending == 0


# never early (every tier); late by at most a loaded machine's margin (PR tier) or docs/
# drills.md row 12's 250 ms (perf tier)
@pytest.mark.parametrize("late_s", tier(LOAD_MARGIN_S, ROW12_LATE_S))
def test_timeout_is_never_early(late_s: float) -> None:
    ha = FakeHa()
    gt = make(150, ha)
    loop = Loop(gt)
    admitted: dict[int, float] = {}
    waits_ms: list[float] = []
    for i in range(20):
        admitted[10 + i] = time.monotonic()
        assert admit(gt, 10 + i) is None
        time.sleep(0.002)
    deadline = time.monotonic() + 5
    while gt.pending:
        assert time.monotonic() < deadline
        wait_ms = gt.timeout_ms()
        assert wait_ms is not None
        time.sleep(wait_ms / 1000)
        for end in loop.poll():
            waits_ms.append((time.monotonic() - admitted[end]) * 1000)
    assert len(waits_ms) == 20 and gt.timeouts == 20
    assert set(loop.answered.values()) == {"FLUSH_SLAVE_TIMEOUT"}
    assert loop.order == sorted(loop.order)  # deadline order
    assert min(waits_ms) >= 150
    print(f"FLUSH_SLAVE_TIMEOUT {max(waits_ms) - 150:.1f} ms late at most")
    assert max(waits_ms) <= 150 + late_s * 1000
