"""master/group_transfer.py: SYNC waits complete on acks in order, time out never early."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from common.config import load_config
from common.errors import PutStatus
from master.group_transfer import GroupTransfer

pytestmark = pytest.mark.unit


class FakeHa:
    def __init__(self) -> None:
        self.in_sync = 1
        self.acked = 0

    def quorum(self, needed: int) -> int:
        return self.acked if self.in_sync >= needed else -1


def make(timeout_ms: int, ha: FakeHa, isr: int = 2) -> GroupTransfer:
    cfg = load_config(
        None, (), env={}, slaveTimeout=timeout_ms, inSyncReplicas=isr, brokerRole="SYNC_MASTER"
    )
    gt = GroupTransfer(cfg, lambda: ha.in_sync, ha.quorum)
    gt.start()
    return gt


def test_acks_complete_waiters_in_order() -> None:
    ha = FakeHa()
    gt = make(60_000, ha)
    try:
        futs = [gt.replica_waiter(end) for end in (100, 200, 300)]
        assert not any(f.done() for f in futs)
        gt.on_acks(200)
        assert [f.done() for f in futs] == [True, True, False]
        assert futs[0].result() == futs[1].result() == PutStatus.PUT_OK
        ha.acked = 300  # acked before this put was admitted: at once, and wakes 300 too
        assert gt.replica_waiter(250).result(0) == PutStatus.PUT_OK
        assert futs[2].result(0) == PutStatus.PUT_OK
        last = gt.replica_waiter(1000)
    finally:
        gt.stop()
    assert last.result(0) == PutStatus.FLUSH_SLAVE_TIMEOUT  # indeterminate on stop


def test_no_in_sync_slave_is_refused_at_once() -> None:
    ha = FakeHa()
    ha.in_sync = 0
    gt = make(60_000, ha)
    try:
        assert gt.replica_waiter(10).result(0) == PutStatus.SLAVE_NOT_AVAILABLE
    finally:
        gt.stop()


def test_async_quorum_of_one_needs_no_wait() -> None:
    ha = FakeHa()
    ha.in_sync = 0
    gt = make(60_000, ha, isr=1)
    try:
        assert gt.replica_waiter(10).result(0) == PutStatus.PUT_OK
    finally:
        gt.stop()


def test_timeout_is_never_early() -> None:
    ha = FakeHa()
    gt = make(150, ha)
    try:
        waits_ms: list[float] = []
        futs = []
        for i in range(20):
            admitted = time.monotonic()
            fut = gt.replica_waiter(10 + i)
            fut.add_done_callback(
                lambda _f, t=admitted: waits_ms.append((time.monotonic() - t) * 1000)
            )
            futs.append(fut)
        done, _ = concurrent.futures.wait(futs, timeout=5)
        assert len(done) == 20
        assert {f.result() for f in futs} == {PutStatus.FLUSH_SLAVE_TIMEOUT}
        assert min(waits_ms) >= 150
    finally:
        gt.stop()
