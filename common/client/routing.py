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
    cluster: str
    groups: dict[str, GroupRoute]
    topics: dict[str, dict[str, int]]  # topic -> group -> queue count

    @classmethod
    def from_cluster_info(cls, doc: dict[str, Any]) -> RouteTable:
        groups: dict[str, GroupRoute] = {}
        topics: dict[str, dict[str, int]] = {}
        raw_groups = doc.get("groups")
        if not isinstance(raw_groups, list):
            raise RouteError("cluster info: no groups")
        for g in raw_groups:
            if not isinstance(g, dict) or not isinstance(g.get("brokerName"), str):
                raise RouteError(f"cluster info: a group without a name: {g!r:.80}")
            name = g["brokerName"]
            master = g.get("master") or ""
            slaves = g.get("slaves") or []
            if not isinstance(master, str) or not isinstance(slaves, list) or not all(
                    isinstance(s, str) for s in slaves):
                raise RouteError(f"cluster info: group {name}: bad addresses")
            epoch = g.get("masterEpoch") or 0
            groups[name] = GroupRoute(name, master, tuple(slaves),
                                      epoch if isinstance(epoch, int) else 0)
            for topic, nums in (g.get("topics") or {}).items():
                if isinstance(topic, str) and isinstance(nums, int) and nums > 0:
                    topics.setdefault(topic, {})[name] = nums
        return cls(str(doc.get("cluster", "")), groups, topics)

    def queues(self, topic: str) -> list[MessageQueue]:
        """Every queue of ``topic`` over all groups, in RocketMQ's order."""
        per_group = self.topics.get(topic, {})
        return [MessageQueue(g, q) for g in sorted(per_group) for q in range(per_group[g])]

    def writable(self, topic: str) -> list[MessageQueue]:
        """The queues of groups that have a master now."""
        return [mq for mq in self.queues(topic) if self.groups.get(mq.broker_name)
                and self.groups[mq.broker_name].master]

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

    def failed(self, broker_name: str) -> None:
        with self._lock:
            self._down_until[broker_name] = self._clock() + self.isolation_s

    def recovered(self, broker_name: str) -> None:
        with self._lock:
            self._down_until.pop(broker_name, None)

    def available(self, broker_name: str) -> bool:
        with self._lock:
            until = self._down_until.get(broker_name)
        return until is None or self._clock() >= until

    def pick(self, queues: Sequence[MessageQueue]) -> MessageQueue:
        if not queues:
            raise ValueError("no queue to choose from")
        up = [mq for mq in queues if self.available(mq.broker_name)] or list(queues)
        return up[next(self._counter) % len(up)]


def groups_of(queues: Iterable[MessageQueue]) -> list[str]:
    return sorted({mq.broker_name for mq in queues})
