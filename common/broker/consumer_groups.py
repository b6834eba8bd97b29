"""Which consumers of each group are alive (RocketMQ's ConsumerManager, in short).

A ``GroupConsumer`` (``common/client/group_consumer.py``) sends CONSUMER_HEARTBEAT every
``heartbeat_ms`` to the group's master; the answer is the group's live members, sorted, from
which every member computes the same assignment, topic by topic (as RocketMQ's rebalance
does). So can the master: it refuses a member's offset commit for a queue the allocation gives
to another member or to nobody (CONSUMER_NOT_ONLINE, as Kafka fences a stale generation), so a
member dropped while it hung cannot move an offset back when it wakes. A member not heard from
for its ``sessionTimeoutMs`` (Kafka's ``session.timeout.ms``; 10 s by default) is dropped,
and a killed consumer's queues move to the others then; one that leaves says so (``leave``)
and is dropped at once. The table lives in the master's memory only, as RocketMQ's does:
after a failover the members are known again after one heartbeat each.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from common.core.allocation import allocate_averagely


def topic_queues(layout: dict[str, int]) -> list[tuple[str, int]]:
    """A topic's queues over the broker groups holding it: (group, queue id), sorted (the
    order the client's route table lists them in, ``common/client/routing.py``)."""
    return [(name, q) for name in sorted(layout) for q in range(layout[name])]


MAX_GROUPS = 100_000  # bounds the table against clients inventing group names


class ConsumerGroups:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, float]] = {}  # group -> client id -> expires at

    def heartbeat(self, group: str, client_id: str, session_ms: int,
                  leave: bool = False) -> list[str]:
        """Record (or, with ``leave``, drop) ``client_id``; the group's live members, sorted."""
        now = self._clock()
        with self._lock:
            members = self._groups.get(group)
            if members is None:
                if leave or len(self._groups) >= MAX_GROUPS:
                    self._expire_all(now)
                    members = self._groups.get(group, {})
                    if leave or len(self._groups) >= MAX_GROUPS:
                        return sorted(members)
                members = self._groups.setdefault(group, {})
            if leave:
                members.pop(client_id, None)
            else:
                members[client_id] = now + session_ms / 1000.0
            for cid in [c for c, expires in members.items() if expires < now]:
                del members[cid]
            if not members:
                del self._groups[group]
            return sorted(members)

    def members(self, group: str) -> list[str]:
        now = self._clock()
        with self._lock:
            return sorted(c for c, expires in self._groups.get(group, {}).items()
                          if expires >= now)

    def owns(self, group: str, client_id: str, topic: str, queue_id: int,
             layout: dict[str, int], broker_name: str) -> bool:
        """Whether ``client_id`` is a live member that the group's allocation gives queue
        ``queue_id`` of ``topic`` in this broker group (``broker_name``). ``layout`` is the
        topic's queue count per broker group: allocated over the queues of every group,
        (group, queue id) in RocketMQ's order, with the members that heartbeat this master
        (every member heartbeats every group's master, ``GroupConsumer``). A topic held by
        one group is allocated over its queue ids alone, as before there were several."""
        return (broker_name, queue_id) in allocate_averagely(
            topic_queues(layout), self.members(group), client_id)

    def groups(self) -> dict[str, int]:
        """Group -> live members (status)."""
        now = self._clock()
        with self._lock:
            self._expire_all(now)
            return {g: len(m) for g, m in self._groups.items()}

    def _expire_all(self, now: float) -> None:
        for group in list(self._groups):
            members = self._groups[group]
            for cid in [c for c, expires in members.items() if expires < now]:
                del members[cid]
            if not members:
                del self._groups[group]
