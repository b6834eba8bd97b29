"""SYNC_MASTER: make a stored put wait until enough in-sync slaves have acked it.

The driver of ``common.ha.group_transfer_core.GroupTransferCore``, run on the request server's
I/O thread (a ``common.broker.replies.LoopWaits``: no thread of its own, no Future per put)::

    master role (I/O thread)  admit(put, end_phy_offset, flushed) -> a status now, or None: the
                              put (a ``common.broker.replies.Deferred``) is held
    HA service (I/O thread)   report_quorum(quorum_offset) after each batch of acks: stores the
                              offset and wakes the owner; the HA socket is polled by the I/O
                              thread itself, so the server polls us in that same pass (no
                              mailbox item; from any other thread it would be one)
    flush thread (SYNC_FLUSH) the put's flush future completed: queued, wakes the I/O thread
    I/O thread                poll() -> answers: every put the quorum covers, in end-offset
                              order, and FLUSH_SLAVE_TIMEOUT for the passed deadlines, in
                              deadline order; the server sleeps at most ``timeout_ms()``

Nothing polls: an ack answers every put it covers in one pass of the I/O thread; the I/O
thread's own poll timeout is the earliest deadline. Only the I/O thread touches the core; other
threads (the flush thread; an HA service on a thread of its own) only store a value or append
to a deque and call the server's ``wake``. A report wakes only while puts wait; ``admit``
re-reads the reported offset after registering a put, so an ack reported meanwhile is never
missed (Dekker's order: each side writes, then reads).

Statuses (``PutStatus``; the record is on the master's log in every case):

* PUT_OK: ``inSyncReplicas - 1`` in-sync slaves hold the record's last byte in their page cache
  (a slave acks once ``append_replicated`` returned; its own flush follows its flushDiskType,
  as RocketMQ separates FLUSH_SLAVE from FLUSH_DISK).
* SLAVE_NOT_AVAILABLE, at once: fewer in-sync slaves than needed when the put arrives.
* FLUSH_SLAVE_TIMEOUT: not acked within ``slaveTimeout`` ms. Never early: the deadline is
  computed from the admission time rounded *up* to the millisecond, and fires when the
  monotonic clock rounded *down* reaches it. Also the answer to waiters still pending when the
  role stops or the server's loop ends (indeterminate: the record is stored, its replication
  unknown).
* OS_PAGE_CACHE_BUSY (SYSTEM_BUSY): already ``maxInflightRequests`` waiters.

Under SYNC_FLUSH both waits run together: the put is answered once both are known, with the
flush's status if that failed (FLUSH_DISK_TIMEOUT), else the replica's. A put whose flush is
still unknown when the server's loop ends is answered FLUSH_DISK_TIMEOUT.
"""

from __future__ import annotations

import abc
import collections
import concurrent.futures
import functools
import math
import time
from collections.abc import Callable

from common.broker.replies import Answers, Deferred, LoopWaits
from common.core.config import BrokerConfig
from common.core.errors import PutStatus
from common.format.protocol import Response
from common.ha.group_transfer_core import Admission, GroupTransferCore, needed_acks

_ADMISSION_STATUS = {
    Admission.SEND_OK: PutStatus.PUT_OK,
    Admission.SLAVE_NOT_AVAILABLE: PutStatus.SLAVE_NOT_AVAILABLE,
    Admission.SYSTEM_BUSY: PutStatus.OS_PAGE_CACHE_BUSY,
}


class ReplicaPut(Deferred, abc.ABC):
    """A SYNC put held for its replica ack (and its flush); ``reply`` is the role's answer."""

    __slots__ = ("flush_status", "replica_status")

    def __init__(self, owner: LoopWaits) -> None:
        super().__init__(owner)
        self.flush_status: PutStatus | None = None
        self.replica_status: PutStatus | None = None

    @abc.abstractmethod
    def reply(self, status: PutStatus) -> Response:
        """The role's answer to the put, given its final status (each kind of put its own)."""

    def answer(self) -> tuple[Deferred, Response]:
        flush = self.flush_status
        replica = self.replica_status
        assert flush is not None and replica is not None
        return self, self.reply(flush if flush is not PutStatus.PUT_OK else replica)


class GroupTransfer:
    """Replica waits of one master term, driven by the request server's I/O thread."""

    def __init__(
        self,
        cfg: BrokerConfig,
        in_sync: Callable[[], int],
        clock: Callable[[], float] = time.monotonic,
        sync_set: Callable[[], int] | None = None,
    ):
        self._core = GroupTransferCore.from_config(cfg)
        self._needed = needed_acks(cfg)
        self._in_sync = in_sync
        # controller mode: how many SyncStateSet members (the master aside) a put waits for;
        # every one of them, and SLAVE_NOT_AVAILABLE while they are fewer than needed
        self._sync_set = sync_set
        self._clock = clock
        self._quorum = -1  # the latest quorum offset the HA service reported
        self._flushed: collections.deque[tuple[ReplicaPut, PutStatus]] = collections.deque()
        self._awaiting_flush: set[ReplicaPut] = set()  # replica answered, flush not yet
        self._wake: Callable[[LoopWaits], None] | None = None
        self._armed = False  # a wake is posted and its poll has not started yet
        self._stopped = False
        self.timeouts = 0
        self.not_available = 0

    @property
    def needed(self) -> int:
        return self._needed

    @property
    def pending(self) -> int:
        return self._core.pending + len(self._awaiting_flush)


    # ---- reports (any thread) ----------------------------------------------------------------
    def report_quorum(self, quorum_offset: int) -> None:
        """HA service: ``needed`` in-sync slaves now hold ``quorum_offset`` (AcksAdvanced)."""
        self._quorum = quorum_offset
        if self._core.pending:  # read after the write above; admit does the mirror image
            self._kick()

    def stop(self) -> None:
        """Any thread (the role stops): puts still waiting get FLUSH_SLAVE_TIMEOUT, and so do
        later ones, at once."""
        self._stopped = True
        self._kick()

    def _on_flushed(self, put: ReplicaPut, flushed: concurrent.futures.Future[PutStatus]) -> None:
        self._flushed.append((put, _status_of(flushed)))  # flush thread (or this one, if done)
        self._kick()

    def _kick(self) -> None:
        wake = self._wake
        if wake is not None and not self._armed:
            self._armed = True
            wake(self)

    # ---- the I/O thread ----------------------------------------------------------------------
    def bind(self, wake: Callable[[LoopWaits], None]) -> None:
        self._wake = wake
        if self._flushed or self._stopped or self._quorum > self._core.acked_offset:
            self._kick()  # reported before the server could be woken

    def admit(
        self, put: ReplicaPut, end_phy_offset: int, flushed: concurrent.futures.Future[PutStatus]
    ) -> PutStatus | None:
        """The put's status now, or None: ``put`` is held and a later ``poll`` answers it."""
        if flushed.done():
            put.flush_status = _status_of(flushed)
            if put.flush_status is not PutStatus.PUT_OK:
                return put.flush_status
            return self._admit_replica(put, end_phy_offset)
        replica = self._admit_replica(put, end_phy_offset)
        if replica is not None:
            put.replica_status = replica
            self._awaiting_flush.add(put)
        flushed.add_done_callback(functools.partial(self._on_flushed, put))
        return None

    def _admit_replica(self, put: ReplicaPut, end_phy_offset: int) -> PutStatus | None:
        if self._stopped:
            return PutStatus.FLUSH_SLAVE_TIMEOUT
        needed, in_sync = self._needed, -1
        if self._sync_set is not None:
            members = self._sync_set()
            if members < self._needed:
                self.not_available += 1
                return PutStatus.SLAVE_NOT_AVAILABLE
            needed = in_sync = members
        if needed <= 0 or end_phy_offset <= self._quorum:
            return PutStatus.PUT_OK  # already acked (the core's own mark may lag the report)
        core = self._core
        if not core.pending:
            core.on_acks(self._quorum)  # nobody waits: just the high-water mark
        now_ms = math.ceil(self._clock() * 1000)  # rounded up: a deadline is never early
        if in_sync < 0:
            in_sync = self._in_sync()
        admission = core.admit(put, end_phy_offset, now_ms, in_sync, needed)
        if admission is Admission.WAIT:
            if self._quorum > core.acked_offset:
                self._kick()  # reported while this put was being registered
            return None
        if admission is Admission.SLAVE_NOT_AVAILABLE:
            self.not_available += 1
        return _ADMISSION_STATUS[admission]

    def poll(self) -> Answers:
        """Every held put that reports, passed deadlines or a stop have settled."""
        self._armed = False  # before reading the reports: a later report wakes again
        answers: Answers = []
        while self._flushed:
            put, status = self._flushed.popleft()
            put.flush_status = status
            if put.replica_status is not None:
                self._awaiting_flush.discard(put)
                answers.append(put.answer())
        core = self._core
        if core.pending:
            if self._quorum > core.acked_offset:
                self._replicated(core.on_acks(self._quorum), PutStatus.PUT_OK, answers)
            deadline = core.next_deadline_ms()
            now_ms = math.floor(self._clock() * 1000)
            if deadline is not None and now_ms >= deadline:
                expired = core.tick(now_ms)
                self.timeouts += len(expired)
                self._replicated(expired, PutStatus.FLUSH_SLAVE_TIMEOUT, answers)
            if self._stopped:
                self._replicated(core.cancel_all(), PutStatus.FLUSH_SLAVE_TIMEOUT, answers)
        return answers

    def timeout_ms(self) -> int | None:
        deadline = self._core.next_deadline_ms()
        if deadline is None:
            return None
        return max(0, math.ceil(deadline - self._clock() * 1000))

    def release_all(self) -> Answers:
        """The server's loop ends: answer every held put (indeterminate statuses)."""
        answers = self.poll()
        self._replicated(self._core.cancel_all(), PutStatus.FLUSH_SLAVE_TIMEOUT, answers)
        for put in self._awaiting_flush:
            put.flush_status = PutStatus.FLUSH_DISK_TIMEOUT
            answers.append(put.answer())
        self._awaiting_flush.clear()
        return answers

    def _replicated(self, tokens: list[object], status: PutStatus, answers: Answers) -> None:
        for token in tokens:
            put = token
            assert isinstance(put, ReplicaPut)
            put.replica_status = status
            if put.flush_status is None:
                self._awaiting_flush.add(put)
            else:
                answers.append(put.answer())


def _status_of(fut: concurrent.futures.Future[PutStatus]) -> PutStatus:
    try:
        return fut.result()
    except Exception:  # noqa: BLE001 - a failed wait is reported, the record is already stored
        return PutStatus.UNKNOWN_ERROR
