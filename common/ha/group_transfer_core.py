"""SYNC_MASTER waits for slave acks, as pure logic (no threads, no clock of its own).

A SYNC put that appended bytes ending at ``end_phy_offset`` is *admitted* with a token chosen
by the driver (``master/group_transfer.py``, run on the request loop), which later answers the
put that token stands for:

    admit(token, end_phy_offset, now_ms, in_sync_slaves, needed) -> Admission
        SEND_OK               nothing to wait for (needed == 0, or already acked)
        SLAVE_NOT_AVAILABLE   fewer in-sync slaves than ``needed`` (= inSyncReplicas - 1)
        SYSTEM_BUSY           already ``max_waiters`` waiting
        WAIT                  registered; completes via on_acks or tick
    on_acks(quorum_offset) -> tokens to complete with SEND_OK, in end-offset order
        ``quorum_offset`` = MasterCore.acked_offset_quorum(needed): the offset at least
        ``needed`` in-sync slaves hold; the core keeps its high-water mark.
    tick(now_ms) -> tokens to complete with FLUSH_SLAVE_TIMEOUT, in deadline order
        a waiter times out at admit time + ``slaveTimeout`` (``timeout_ms``), never before.
    cancel_all() -> every waiting token (role change or shutdown; the driver picks the status)

Waiters live in two heaps (by end offset, by deadline) with lazy deletion, so each operation is
O(log n); ``next_deadline_ms`` tells the driver how long it may sleep.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Hashable

from common.core.config import BrokerConfig


class Admission(enum.Enum):
    WAIT = "WAIT"
    SEND_OK = "SEND_OK"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SYSTEM_BUSY = "SYSTEM_BUSY"


def needed_acks(cfg: BrokerConfig) -> int:
    """Slave acks a SYNC put needs: inSyncReplicas counts the master itself."""
    return max(0, cfg.inSyncReplicas - 1)


class GroupTransferCore:
    """Ordered waiters for replica acks, each with a deadline."""

    def __init__(self, timeout_ms: int, max_waiters: int):
        if timeout_ms < 0 or max_waiters < 1:
            raise ValueError(f"bad timeout_ms={timeout_ms} or max_waiters={max_waiters}")
        self._timeout_ms = timeout_ms
        self._max_waiters = max_waiters
        # read by the driver a few times a SYNC put: plain attributes, not properties
        self.acked_offset = -1  # the quorum's high-water mark
        self.pending = 0  # tokens waiting (len(_pending))
        self._seq = 0
        self._pending: dict[Hashable, int] = {}  # token -> admission sequence number
        self._by_offset: list[tuple[int, int, Hashable]] = []
        self._by_deadline: list[tuple[int, int, Hashable]] = []

    @classmethod
    def from_config(cls, cfg: BrokerConfig) -> GroupTransferCore:
        return cls(timeout_ms=cfg.slaveTimeout, max_waiters=cfg.maxInflightRequests)

    def next_deadline_ms(self) -> int | None:
        self._discard_done(self._by_deadline)
        return self._by_deadline[0][0] if self._by_deadline else None

    def admit(self, token: Hashable, end_phy_offset: int, now_ms: int, in_sync_slaves: int,
              needed: int) -> Admission:
        if token in self._pending:
            raise ValueError(f"token {token!r} is already waiting")
        if needed <= 0 or end_phy_offset <= self.acked_offset:
            return Admission.SEND_OK
        if in_sync_slaves < needed:
            return Admission.SLAVE_NOT_AVAILABLE
        if len(self._pending) >= self._max_waiters:
            return Admission.SYSTEM_BUSY
        self._seq += 1
        self._pending[token] = self._seq
        self.pending = len(self._pending)
        heapq.heappush(self._by_offset, (end_phy_offset, self._seq, token))
        heapq.heappush(self._by_deadline, (now_ms + self._timeout_ms, self._seq, token))
        self._compact()
        return Admission.WAIT

    def on_acks(self, quorum_offset: int) -> list[Hashable]:
        self.acked_offset = max(self.acked_offset, quorum_offset)
        return self._pop_while(self._by_offset, self.acked_offset)

    def tick(self, now_ms: int) -> list[Hashable]:
        return self._pop_while(self._by_deadline, now_ms)

    def cancel_all(self) -> list[Hashable]:
        tokens = [t for _, _, t in sorted(self._by_offset) if t in self._pending]
        self._pending.clear()
        self.pending = 0
        self._by_offset.clear()
        self._by_deadline.clear()
        return tokens

    def _pop_while(self, heap: list[tuple[int, int, Hashable]], limit: int) -> list[Hashable]:
        done: list[Hashable] = []
        while heap and heap[0][0] <= limit:
            _, seq, token = heapq.heappop(heap)
            if self._pending.get(token) == seq:
                del self._pending[token]
                done.append(token)
        if done:
            self.pending = len(self._pending)
        return done

    def _discard_done(self, heap: list[tuple[int, int, Hashable]]) -> None:
        while heap and self._pending.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)

    def _compact(self) -> None:
        """Rebuild the heaps when completed entries outnumber live ones (bounded memory)."""
        for heap in (self._by_offset, self._by_deadline):
            if len(heap) > 2 * len(self._pending) + 64:
                heap[:] = [e for e in heap if self._pending.get(e[2]) == e[1]]
                heapq.heapify(heap)
