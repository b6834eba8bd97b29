"""SYNC_MASTER: make a stored put wait until enough in-sync slaves have acked it.

The thin driver of ``common.ha.group_transfer_core.GroupTransferCore``::

    put (server / flush thread)  -> replica_waiter(end_phy_offset) -> Future[PutStatus]
    HA service thread            -> on_acks(quorum_offset)       completes, in end-offset order
    the timer thread "replog-group-transfer" sleeps on a condition until the earliest deadline
                                 -> FLUSH_SLAVE_TIMEOUT, in deadline order

Nothing polls: acks complete waiters on the HA thread that received them; the timer thread
waits exactly until the earliest deadline (or until a new, earlier waiter arrives).

Statuses (``PutStatus``; the record is on the master's log in every case):

* PUT_OK: ``inSyncReplicas - 1`` in-sync slaves hold the record's last byte in their page cache
  (a slave acks once ``append_replicated`` returned; its own flush follows its flushDiskType,
  as RocketMQ separates FLUSH_SLAVE from FLUSH_DISK).
* SLAVE_NOT_AVAILABLE, at once: fewer in-sync slaves than needed when the put arrives.
* FLUSH_SLAVE_TIMEOUT: not acked within ``slaveTimeout`` ms. Never early: the deadline is
  computed from the admission time rounded *up* to the millisecond, and fires when the
  monotonic clock rounded *down* reaches it. Also the answer to waiters still pending when the
  role stops (indeterminate: the record is stored, its replication unknown).
* OS_PAGE_CACHE_BUSY (SYSTEM_BUSY): already ``maxInflightRequests`` waiters.

Lock order: callers of ``in_sync`` / ``quorum`` (the HA service's lock) are never called while
this module's lock is held, and futures are completed outside it (their callbacks run the
master role's reply path).
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Callable, Hashable

from common.config import BrokerConfig
from common.errors import PutStatus
from common.ha.group_transfer_core import Admission, GroupTransferCore, needed_acks

log = logging.getLogger("replog.group_transfer")

JOIN_TIMEOUT_S = 5.0

_ADMISSION_STATUS = {
    Admission.SEND_OK: PutStatus.PUT_OK,
    Admission.SLAVE_NOT_AVAILABLE: PutStatus.SLAVE_NOT_AVAILABLE,
    Admission.SYSTEM_BUSY: PutStatus.OS_PAGE_CACHE_BUSY,
}


class GroupTransfer:
    """Replica waits of one master term; ``start`` the timer thread, ``stop`` to end it."""

    def __init__(
        self,
        cfg: BrokerConfig,
        in_sync: Callable[[], int],
        quorum: Callable[[int], int],
        clock: Callable[[], float] = time.monotonic,
    ):
        self._core = GroupTransferCore.from_config(cfg)
        self._needed = needed_acks(cfg)
        self._in_sync = in_sync
        self._quorum = quorum
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.timeouts = 0
        self.not_available = 0

    @property
    def needed(self) -> int:
        return self._needed

    @property
    def pending(self) -> int:
        with self._cond:
            return self._core.pending

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="replog-group-transfer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the timer thread; waiters still pending get FLUSH_SLAVE_TIMEOUT."""
        with self._cond:
            self._stopped = True
            left = self._core.cancel_all()
            self._cond.notify_all()
        _complete(left, PutStatus.FLUSH_SLAVE_TIMEOUT)
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                log.error("event=group_transfer_thread_stuck")

    # ---- inputs ------------------------------------------------------------------------------
    def replica_waiter(self, end_phy_offset: int) -> concurrent.futures.Future[PutStatus]:
        """The wait for a put whose bytes end at ``end_phy_offset`` (MasterRole's hook)."""
        fut: concurrent.futures.Future[PutStatus] = concurrent.futures.Future()
        if self._needed <= 0:
            fut.set_result(PutStatus.PUT_OK)
            return fut
        in_sync = self._in_sync()  # the HA service's lock, taken before ours (lock order)
        quorum = self._quorum(self._needed)
        now_ms = math.ceil(self._clock() * 1000)  # rounded up: a deadline is never early
        with self._cond:
            if self._stopped:
                admission = None
                acked: list[Hashable] = []
            else:
                acked = self._core.on_acks(quorum)
                before = self._core.next_deadline_ms()
                admission = self._core.admit(fut, end_phy_offset, now_ms, in_sync, self._needed)
                if admission is Admission.WAIT and before is None:
                    self._cond.notify()  # the timer thread was idle (a later deadline can wait)
        _complete(acked, PutStatus.PUT_OK)
        if admission is None:
            fut.set_result(PutStatus.FLUSH_SLAVE_TIMEOUT)
        elif admission is not Admission.WAIT:
            if admission is Admission.SLAVE_NOT_AVAILABLE:
                self.not_available += 1
            fut.set_result(_ADMISSION_STATUS[admission])
        return fut

    def on_acks(self, quorum_offset: int) -> None:
        """The offset ``needed`` in-sync slaves now hold (HA thread, after AcksAdvanced)."""
        with self._cond:
            done = self._core.on_acks(quorum_offset)
        _complete(done, PutStatus.PUT_OK)

    # ---- the timer thread --------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                expired = self._wait_for_deadline()
                if expired is None:
                    return
            self.timeouts += len(expired)
            _complete(expired, PutStatus.FLUSH_SLAVE_TIMEOUT)

    def _wait_for_deadline(self) -> list[Hashable] | None:
        """Sleep (lock held by the caller) until a deadline passes; None once stopped."""
        while not self._stopped:
            deadline = self._core.next_deadline_ms()
            now_ms = math.floor(self._clock() * 1000)
            if deadline is None:
                self._cond.wait()
            elif now_ms < deadline:
                self._cond.wait((deadline - now_ms) / 1000)
            else:
                return self._core.tick(now_ms)
        return None


def _complete(tokens: list[Hashable], status: PutStatus) -> None:
    for token in tokens:
        fut = token
        assert isinstance(fut, concurrent.futures.Future)
        if not fut.done():
            fut.set_result(status)
