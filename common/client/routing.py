"""Routes over a cluster of broker groups, pure: which queues a topic has in which group,
where each group's master and slaves serve, and which queue a message goes to.

A route table is built from one CLUSTER_INFO answer (any broker gives it: in controller mode
from ZooKeeper, where every group's master publishes its topics; without a controller, the
broker's own group). A topic's queues are RocketMQ's ``MessageQueue`` list: (group, queue id)
pairs sorted by group name then queue id, as a RocketMQ producer orders its
``TopicPublishInfo``. That order is what keyed sends hash over, so a key keeps its queue while
the route is unchanged, and a Java producer of the same topic and route agrees with us.

Keyless sends go round the queues of groups that have a master (RocketMQ's latency fault
tolerance avoids a broker that failed for a while; Kafka's sticky partitioner keeps a batch's
worth on one partition): ``QueueSelector`` skips a group marked unavailable after a failure
for ``isolation_ms``, and falls back to every queue only when all groups are out.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from common.core.message import java_hash
from common.format.tables import PERM_READ, PERM_READ_WRITE, PERM_WRITE

ISOLATION_MS = 3_000  # a group whose send failed is passed over this long by keyless sends


@dataclasses.dataclass(frozen=True, order=True)
class MessageQueue:
    """RocketMQ's MessageQueue without the topic: a queue is its group and its id."""

    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.broker_name}/{self.queue_id}"


@dataclasses.dataclass(frozen=True)
class GroupRoute:
    name: str
    master: str  # "" while the group has no master
    slaves: tuple[str, ...]
    epoch: int

    @property
    def addresses(self) -> list[str]:
        return ([self.master] if self.master else []) + [s for s in self.slaves
                                                          if s != self.master]


class RouteError(ValueError):
    """A CLUSTER_INFO answer that is not a route table (names what is wrong)."""


@dataclasses.dataclass(frozen=True)
class RouteTable:
    """One CLUSTER_INFO answer: the groups and, per topic, its queue count and RocketMQ
    ``perm`` in each group holding it. Queue lists are computed once per table (a send asks
    for them every time)."""

    cluster: str
    groups: dict[str, GroupRoute]
    topics: dict[str, dict[str, int]]  # topic -> group -> queue count
    perms: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)  # same, perm
    _cache: dict[tuple[str, str], list[MessageQueue]] = dataclasses.field(
        default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_cluster_info(cls, doc: dict[str, Any]) -> RouteTable:
        groups: dict[str, GroupRoute] = {}
        topics: dict[str, dict[str, int]] = {}
        perms: dict[str, dict[str, int]] = {}
        raw_groups = doc.get("groups") if isinstance(doc, dict) else None
        if not isinstance(raw_groups, list):
            raise RouteError("cluster info: no groups")
        for g in raw_groups:
            if not isinstance(g, dict) or not isinstance(g.get("brokerName"), str) \
                    or not g["brokerName"]:
                raise RouteError(f"cluster info: a group without a name: {g!r:.80}")
            name = g["brokerName"]
            if name in groups:
                raise RouteError(f"cluster info: group {name} listed twice")
            master = g.get("master") or ""
            slaves = g.get("slaves") or []
            if not isinstance(master, str) or not isinstance(slaves, list) or not all(
                    isinstance(s, str) for s in slaves):
                raise RouteError(f"cluster info: group {name}: bad addresses")
            epoch = g.get("masterEpoch") or 0
            groups[name] = GroupRoute(name, master, tuple(slaves),
                                      epoch if isinstance(epoch, int) else 0)
            raw_topics, raw_perms = g.get("topics") or {}, g.get("perms") or {}
            if not isinstance(raw_topics, dict) or not isinstance(raw_perms, dict):
                raise RouteError(f"cluster info: group {name}: bad topics")
            for topic, nums in raw_topics.items():
                if isinstance(topic, str) and isinstance(nums, int) and nums > 0:
                    topics.setdefault(topic, {})[name] = nums
                    perm = raw_perms.get(topic, PERM_READ_WRITE)
                    perms.setdefault(topic, {})[name] = (
                        perm if isinstance(perm, int) and 0 <= perm <= 7 else PERM_READ_WRITE)
        return cls(str(doc.get("cluster", "")), groups, topics, perms)

    def queues(self, topic: str) -> list[MessageQueue]:
        """Every queue of ``topic`` over all groups, in RocketMQ's order (what keys hash over:
        a group that loses its master keeps its place, so no key moves)."""
        found = self._cache.get(("all", topic))
        if found is None:
            per_group = self.topics.get(topic, {})
            found = [MessageQueue(g, q) for g in sorted(per_group) for q in range(per_group[g])]
            self._cache[("all", topic)] = found
        return found

    def perm(self, topic: str, group: str) -> int:
        return self.perms.get(topic, {}).get(group, PERM_READ_WRITE)

    def writable(self, topic: str) -> list[MessageQueue]:
        """The queues of groups that have a master now and whose ``perm`` allows writes."""
        found = self._cache.get(("w", topic))
        if found is None:
            found = [mq for mq in self.queues(topic) if self.groups.get(mq.broker_name)
                     and self.groups[mq.broker_name].master
                     and self.perm(topic, mq.broker_name) & PERM_WRITE]
            self._cache[("w", topic)] = found
        return found

    def readable(self, topic: str) -> list[MessageQueue]:
        """The queues whose ``perm`` allows reads (a group without a master still serves
        reads from its slaves)."""
        found = self._cache.get(("r", topic))
        if found is None:
            found = [mq for mq in self.queues(topic) if self.perm(topic, mq.broker_name)
                     & PERM_READ]
            self._cache[("r", topic)] = found
        return found

    def layout(self, topic: str) -> dict[str, int]:
        """Group -> queue count of ``topic``."""
        return dict(self.topics.get(topic, {}))

    def group_of(self, topic: str) -> str | None:
        """The one group holding ``topic`` (None when none or several do)."""
        held = self.topics.get(topic, {})
        return next(iter(held)) if len(held) == 1 else None

    @property
    def group_names(self) -> list[str]:
        return sorted(self.groups)


def queue_for_key(queues: Sequence[MessageQueue], key: str) -> MessageQueue:
    """RocketMQ's SelectMessageQueueByHash over the topic's queue list: a key keeps its queue
    while the route is unchanged."""
    if not queues:
        raise ValueError("no queue to choose from")
    return queues[abs(java_hash(key)) % len(queues)]


class QueueSelector:
    """Keyless queue choice: round robin over the queues of groups that are up, passing over a
    group that failed within ``isolation_ms`` (RocketMQ's latency fault tolerance)."""

    def __init__(self, isolation_ms: int = ISOLATION_MS,
                 clock: Callable[[], float] = time.monotonic):
        self.isolation_s = isolation_ms / 1000.0
        self._clock = clock
        self._down_until: dict[str, float] = {}
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._filtered: dict[int, tuple[Sequence[MessageQueue], frozenset[str],
                                        Sequence[MessageQueue]]] = {}

    def failed(self, broker_name: str) -> None:
        with self._lock:
            self._down_until[broker_name] = self._clock() + self.isolation_s

    def recovered(self, broker_name: str) -> None:
        if broker_name in self._down_until:
            with self._lock:
                self._down_until.pop(broker_name, None)

    def available(self, broker_name: str) -> bool:
        until = self._down_until.get(broker_name)
        return until is None or self._clock() >= until

    def down(self) -> frozenset[str]:
        """The groups passed over now (expired isolations are dropped)."""
        if not self._down_until:  # the common case: one dict read, no lock
            return frozenset()
        now = self._clock()
        with self._lock:
            for name in [n for n, until in self._down_until.items() if now >= until]:
                del self._down_until[name]
            return frozenset(self._down_until)

    def pick(self, queues: Sequence[MessageQueue]) -> MessageQueue:
        if not queues:
            raise ValueError("no queue to choose from")
        down = self.down()
        if down:
            queues = self._passing_over(queues, down)
        return queues[next(self._counter) % len(queues)]

    def _passing_over(self, queues: Sequence[MessageQueue],
                      down: frozenset[str]) -> Sequence[MessageQueue]:
        """``queues`` without the groups ``down`` (all of them when every group is down),
        kept per queue list while the same groups are down: a route table's lists live as
        long as the table, and filtering 512 queues on every send would cost more than the
        rest of the routing."""
        key = id(queues)
        cached = self._filtered.get(key)
        if cached is not None and cached[0] is queues and cached[1] == down:
            return cached[2]
        kept = [mq for mq in queues if mq.broker_name not in down] or list(queues)
        if len(self._filtered) >= 64:
            self._filtered.clear()
        self._filtered[key] = (queues, down, kept)  # holds ``queues``: its id stays its own
        return kept


def groups_of(queues: Iterable[MessageQueue]) -> list[str]:
    return sorted({mq.broker_name for mq in queues})
