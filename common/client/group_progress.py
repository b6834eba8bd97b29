"""Consumer groups as an operator sees them (``replog groups``, ``replog offsets --reset``, the
console): each group's members, per-queue committed offsets and lag, dead letters, POP
figures and config, over every broker group of the cluster (``kafka-consumer-groups
--describe``, RocketMQ's consumerProgress); and a group's offsets moved to a time."""

from __future__ import annotations

from typing import Any

from common.client.admin import Admin
from common.client.consumer import Consumer
from common.core.errors import BrokerError, ResponseCode

# a group's POP figures, summed over the masters (status ``pop.groups``)
POP_FIGURES = ("inFlight", "due", "redelivered", "backlog")


def describe_groups(admin: Admin, consumer: Consumer,
                    group: str | None = None) -> list[dict[str, Any]]:
    """Every consumer group the masters know (or ``group``: QUERY_NOT_FOUND when none
    does): ``{group, members, memberIds (client ids), deadLetters, lag, topics: [{topic, lag, queues: [{brokerName?,
    queueId, committedOffset, maxOffset, lag}]}], pop, config}``; ``brokerName`` only with
    several broker groups. ``consumer``: any consumer of the cluster (its offsets are read,
    never its group's)."""
    configs: dict[str, dict[str, Any]] = {}  # the first master's that has the group
    for by_group in admin.group_configs().values():
        for name, config in by_group.items():
            configs.setdefault(name, config.to_json())
    multi = len(admin.route_table().groups) > 1
    if multi:
        by_broker = admin.group_offsets_by_broker()
        statuses = admin.status_of_masters()
    else:
        by_broker = {"": admin.group_offsets()}
        statuses = {"": admin.status(admin.master_address())}
    members: dict[str, int] = {}
    dead: dict[str, int] = {}
    popping: dict[str, dict[str, int]] = {}  # POP: in flight, due, redelivered, backlog
    for status in statuses.values():
        for name, figures in ((status.get("pop") or {}).get("groups") or {}).items():
            mine = popping.setdefault(name, dict.fromkeys(POP_FIGURES, 0))
            for k in mine:
                mine[k] += int(figures.get(k, 0))
    for status in statuses.values():  # every member heartbeats every master: the most seen
        for name, n in (status.get("consumerGroups") or {}).items():
            members[name] = max(members.get(name, 0), int(n))
        for name, n in (status.get("deadLetters") or {}).items():
            dead[name] = dead.get(name, 0) + int(n)
    names = sorted({g for offsets in by_broker.values() for g in offsets}
                   | {*members, *dead, *popping, *configs})
    if group is not None:
        if group not in names:
            raise BrokerError(ResponseCode.QUERY_NOT_FOUND,
                              f"no consumer group {group} on the master"
                              + ("s" if multi else ""), False)
        names = [group]
    groups = []
    for name in names:
        per_topic: dict[str, list[dict[str, Any]]] = {}
        for broker, offsets in sorted(by_broker.items()):
            for topic, committed in sorted(offsets.get(name, {}).items()):
                for q, offset in sorted(committed.items()):
                    b = broker or None
                    low = consumer.min_offset(topic, q, broker_name=b)
                    high = consumer.max_offset(topic, q, broker_name=b)
                    row: dict[str, Any] = {"brokerName": broker} if multi else {}
                    row.update(queueId=q, committedOffset=offset, maxOffset=high,
                               lag=max(0, high - max(offset, low)))
                    per_topic.setdefault(topic, []).append(row)
        topics = [{"topic": t, "lag": sum(r["lag"] for r in qs), "queues": qs}
                  for t, qs in sorted(per_topic.items())]
        ids = admin.consumer_members(name) if members.get(name) else []
        groups.append({"group": name, "members": members.get(name, 0), "memberIds": ids,
                       "deadLetters": dead.get(name, 0),
                       "lag": sum(t["lag"] for t in topics), "topics": topics,
                       "pop": popping.get(name, dict.fromkeys(POP_FIGURES, 0)),
                       "config": configs.get(name)})
    return groups


def topic_queues(consumer: Consumer, topic: str, broker_name: str | None = None,
                 queue: int | None = None) -> tuple[bool, list[tuple[str | None, int]]]:
    """(several broker groups?, the (broker group, queue id) pairs of ``topic``), narrowed to
    ``broker_name`` and ``queue`` when given."""
    multi = len(consumer.route_table().groups) > 1
    if not multi:  # one broker group: its queue ids, as always
        if queue is not None:
            return False, [(broker_name, queue)]
        return False, [(broker_name, q) for q in range(consumer.queue_nums(
            topic, broker_name=broker_name))]
    queues: list[tuple[str | None, int]] = [
        (q.broker_name, q.queue_id) for q in consumer.queues(topic)
        if broker_name in (None, q.broker_name) and queue in (None, q.queue_id)]
    if not queues and broker_name is not None and queue is not None:
        queues = [(broker_name, queue)]
    return True, queues


def reset_to_time(consumer: Consumer, topic: str, timestamp_ms: int) -> list[dict[str, Any]]:
    """Commit, for the consumer's group, each queue of ``topic`` at the first message stored
    at or after ``timestamp_ms`` (RocketMQ's resetOffsetByTime): ``[{brokerName?, queueId,
    previousOffset, committedOffset}]``. Members pick the new offsets up at their next fetch
    (a group with live members should be stopped first, or they may commit over it)."""
    multi, queues = topic_queues(consumer, topic)
    rows = []
    for name, q in queues:
        at = consumer.search_offset(topic, q, timestamp_ms, broker_name=name)
        before = consumer.fetch_offset(topic, q, broker_name=name)
        consumer.commit_offset(topic, q, at, broker_name=name)
        row: dict[str, Any] = {"brokerName": name} if multi else {}
        row.update(queueId=q, previousOffset=before, committedOffset=at)
        rows.append(row)
    return rows
