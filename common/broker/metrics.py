"""Prometheus collectors (``metricsPort``): the status snapshot and consumer groups' lag.

Every numeric figure of ``replog status`` is exported labelled with the broker name and id:
a figure that only grows (``COUNTERS``: requests, messages stored and pulled, refusals,
failures) is a counter ``replog_<snake_case>_total``, so ``rate()`` and ``increase()`` work
across restarts; every other one is a ``replog_<snake_case>`` gauge. Each component in
``status.health`` (the master's HA service, a slave's HA client) adds
``replog_component_failures_total``, ``replog_component_restarts_total`` and
``replog_component_up`` (1 while running) labelled ``component``; each slave a master serves
``replog_slave_{ack_offset,lag_bytes,in_sync}`` labelled with its address; each consumer group
and topic in this broker's offset table ``replog_consumer_lag`` and
``replog_consumer_delay_seconds``; each group with live ``GroupConsumer`` members
``replog_consumer_group_members``; each group with a dead-letter topic ``replog_dead_letters``
(messages its ``%DLQ%<group>`` holds). Collected per scrape, from one ``BrokerStatus``
snapshot (``common/broker/server_stats.py`` copies what the I/O thread mutates under a lock).

Renamed from gauges to counters (the gauges of the same figures are gone: a gauge and a counter
cannot share a family name): ``replog_requests`` -> ``replog_requests_total``, and likewise
``refused_busy``, ``bad_requests``, ``long_polls``, ``wakes_inline``, ``wakes_posted``,
``refused_writes``, ``store_puts``, ``store_put_failures``, ``store_dispatched_records``,
``store_deleted_segments``, ``config_sync_rounds``, ``config_sync_failures``,
``config_sync_changes``; ``replog_put_total`` and ``replog_get_total`` keep their names and
become counters.
With ``aclEnable``, ``SecurityCollector`` adds ``replog_handshake_total{port,result}``,
``replog_authz_denied_total{port,op,reason}``, ``replog_acl_reload_total{result}``,
``replog_acl_version`` and ``replog_acl_reload_failing``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from common.broker.tables import ConsumerOffsetTable
from common.core.message import DLQ_PREFIX

if TYPE_CHECKING:
    from common.broker.broker import BrokerStatus
    from common.broker.security import Security
    from common.store.api import ReadStore


# Status figures that only grow (counted since the broker started): exported as counters.
COUNTERS = frozenset({
    "putTotal", "getTotal", "requests", "refusedBusy", "badRequests", "longPolls",
    "wakesInline", "wakesPosted", "refusedWrites", "answersHeldForLease",
    "store_puts", "store_put_failures", "store_dispatched_records", "store_deleted_segments",
    "store_segment_close_failures", "store_segments_held_too_long",
    "config_sync_rounds", "config_sync_failures", "config_sync_changes",
    "timer_enqueued", "timer_delivered", "timer_rolled", "timer_rolled_in", "timer_recalled",
    "timer_skipped_delivered", "timer_put_failures", "timer_refused", "timer_gated",
    "timer_unreadable", "timer_illegal", "timer_enqueued_late", "timer_untrusted_marks",
    "timer_refused_targets",
    "transaction_commits", "transaction_rollbacks", "transaction_repeated",
    "transaction_refused_conflicts", "transaction_ops_repaired", "transaction_fresh",
    "transaction_op_batches", "transaction_ops_dropped", "transaction_halves_sent_twice",
    "transaction_check_rounds", "transaction_check_checks", "transaction_check_held",
    "transaction_check_discarded", "transaction_check_unmovable",
    "transaction_check_answered_commit", "transaction_check_answered_rollback",
    "transaction_check_unknown", "transaction_check_unanswered",
    "transaction_check_no_producer", "transaction_check_gated",
    "pop_popped", "pop_redelivered", "pop_acked", "pop_acks_stale", "pop_changed", "pop_dlq",
    "pop_skipped_records", "pop_expired",
    "clientConnectionsRefused", "clientPeersHeldBack", "clientPeersClosedOverBudget",
    "clientAnswersDropped",
})


class StatusCollector:
    """Prometheus collector: every numeric status figure as a ``replog_*`` counter (figures
    that only grow) or gauge, and each component's health, per scrape."""

    def __init__(self, snapshot: Callable[[], BrokerStatus]):
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        status = self._snapshot()
        labels = {"broker": status.brokerName, "id": str(status.brokerId)}
        numbers = {**status.to_json(), **{f"store_{k}": v for k, v in status.store.items()},
                   **{f"config_sync_{k}": v for k, v in status.configSync.items()},
                   **{f"timer_{k}": v for k, v in status.timer.items()
                      if k != "pendingWithin"},
                   **{f"timer_pending_within_{k}": v
                      for k, v in (status.timer.get("pendingWithin") or {}).items()},
                   **{f"transaction_{k}": v for k, v in status.transactions.items()
                      if k != "check"},
                   **{f"transaction_check_{k}": v
                      for k, v in (status.transactions.get("check") or {}).items()},
                   **{f"pop_{k}": v for k, v in status.pop.items()}}
        for key, value in numbers.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            name = f"replog_{_snake(key)}"
            family: Metric
            if key in COUNTERS:  # the sample is <name>_total (a trailing _total is not doubled)
                family = CounterMetricFamily(name, f"status field {key}", labels=list(labels))
            else:
                family = GaugeMetricFamily(name, f"status field {key}", labels=list(labels))
            family.add_metric(list(labels.values()), float(value))
            yield family
        yield from _health_metrics(status, labels)
        yield from _slave_gauges(status, labels)

    def describe(self) -> list[Metric]:
        return []


class ConsumerLagCollector:
    """Prometheus collector: per consumer group and topic, what the group has yet to consume
    (as rocketmq-exporter's ``rocketmq_group_diff``) and how old the oldest of it is.

    ``replog_consumer_lag{group,topic}``: messages between the group's committed offsets and
    the queues' max offsets, summed over the queues it committed; ``replog_consumer_delay_
    seconds{group,topic}``: now minus the store time of the oldest unconsumed message (0 when
    the group is caught up). Read from this broker's ConsumeQueues and offset table.
    """

    def __init__(self, offsets: ConsumerOffsetTable, store: ReadStore,
                 groups: Callable[[], dict[str, int]] = dict,
                 now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000):
        self._offsets = offsets
        self._store = store
        self._groups = groups
        self._now_ms = now_ms

    def collect(self) -> Iterator[GaugeMetricFamily]:
        names = ["group", "topic"]
        lag = GaugeMetricFamily("replog_consumer_lag", "messages not yet consumed", labels=names)
        delay = GaugeMetricFamily("replog_consumer_delay_seconds",
                                  "age of the oldest message not yet consumed", labels=names)
        now = self._now_ms()
        for (group, topic), queues in sorted(self._offsets.snapshot().items()):
            behind, oldest = group_lag(self._store, topic, queues)
            lag.add_metric([group, topic], float(behind))
            delay.add_metric([group, topic], max(0.0, (now - oldest) / 1000) if oldest else 0.0)
        yield lag
        yield delay
        members = GaugeMetricFamily("replog_consumer_group_members",
                                    "live members of a consumer group (GroupConsumer heartbeats)",
                                    labels=["group"])
        for group, n in sorted(self._groups().items()):
            members.add_metric([group], float(n))
        yield members
        dead = GaugeMetricFamily("replog_dead_letters",
                                 "messages a group gave up on, held in its %DLQ% topic",
                                 labels=["group"])
        for group, n in sorted(dead_letters(self._store).items()):
            dead.add_metric([group], float(n))
        yield dead

    def describe(self) -> list[GaugeMetricFamily]:
        return []


class SecurityCollector:
    """Prometheus collector of the security layer's counters (``common/broker/security.py``)."""

    def __init__(self, security: Security):
        self._security = security

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        sec = self._security
        handshakes, denied = sec.audit.counts()
        shakes = CounterMetricFamily("replog_handshake", "CURVE handshakes by port and result",
                                     labels=["port", "result"])
        for (port, result), n in sorted(handshakes.items()):
            shakes.add_metric([port, result], float(n))
        yield shakes
        refusals = CounterMetricFamily("replog_authz_denied", "refused handshakes and requests",
                                       labels=["port", "op", "reason"])
        for (port, op, reason), n in sorted(denied.items()):
            refusals.add_metric([port, op, reason], float(n))
        yield refusals
        if sec.acl is None:
            return
        reloads = CounterMetricFamily("replog_acl_reload", "ACL file reloads by result",
                                      labels=["result"])
        for result in ("ok", "error"):
            reloads.add_metric([result], float(sec.acl.reloads[result]))
        yield reloads
        version = GaugeMetricFamily("replog_acl_version", "the version of the ACL in force")
        version.add_metric([], float(sec.acl.current.version))
        yield version
        failing = GaugeMetricFamily("replog_acl_reload_failing",
                                    "1 while the ACL file on disk is refused (the last good "
                                    "one stays in force)")
        failing.add_metric([], 1.0 if sec.acl.failing else 0.0)
        yield failing

    def describe(self) -> list[GaugeMetricFamily]:
        return []


def dead_letters(store: ReadStore) -> dict[str, int]:
    """group -> messages held in its dead-letter topic ``%DLQ%<group>`` (as retention left them)."""
    out = {}
    for topic, nums in store.topic_queues().items():
        if topic.startswith(DLQ_PREFIX):
            out[topic[len(DLQ_PREFIX):]] = sum(
                store.max_queue_offset(topic, q) - store.min_queue_offset(topic, q)
                for q in range(nums))
    return out


def lag_by_group(offsets: ConsumerOffsetTable, store: ReadStore) -> dict[str, dict[str, int]]:
    """Per consumer group of this broker's offset table: ``lag`` (messages between its
    committed offsets and the queues' max offsets, over the queues it committed) and
    ``committed`` (the sum of those offsets: its consumption, as a counter). In-memory reads
    only (no store time looked up): cheap enough for every STATUS."""
    out: dict[str, dict[str, int]] = {}
    for (group, topic), queues in offsets.snapshot().items():
        mine = out.setdefault(group, {"lag": 0, "committed": 0})
        mine["lag"] += group_lag(store, topic, queues, oldest_time=False)[0]
        mine["committed"] += sum(max(0, committed) for committed in queues.values())
    return out


def group_lag(store: ReadStore, topic: str, queues: dict[int, int],
              oldest_time: bool = True) -> tuple[int, int | None]:
    """(messages behind, store time of the oldest of them or None) over ``queues``
    (queue id -> committed offset; -1 or an offset below the queue's min counts from its min);
    ``oldest_time`` False: no store time is looked up (None)."""
    behind, oldest = 0, None
    for queue_id, committed in queues.items():
        start = max(committed, store.min_queue_offset(topic, queue_id))
        n = store.max_queue_offset(topic, queue_id) - start
        if n <= 0:
            continue
        behind += n
        if not oldest_time:
            continue
        ts = store.store_timestamp_of(topic, queue_id, start)
        if ts is not None and (oldest is None or ts < oldest):
            oldest = ts
    return behind, oldest


def _health_metrics(status: BrokerStatus, labels: dict[str, str]) -> Iterator[Metric]:
    """Per component of ``status.health``: failures and restarts (counters), up (gauge)."""
    names = [*labels, "component"]
    failures = CounterMetricFamily("replog_component_failures",
                                   "times a component (thread, loop participant) failed",
                                   labels=names)
    restarts = CounterMetricFamily("replog_component_restarts",
                                   "times a failed component was restarted", labels=names)
    up = GaugeMetricFamily("replog_component_up", "1 while the component runs, 0 while it is "
                           "failed or waiting for its restart", labels=names)
    for component, health in sorted(status.health.items()):
        values = [*labels.values(), component]
        failures.add_metric(values, float(health.get("failures", 0)))
        restarts.add_metric(values, float(health.get("restarts", 0)))
        up.add_metric(values, 1.0 if health.get("state") == "running" else 0.0)
    yield failures
    yield restarts
    yield up


def _slave_gauges(status: BrokerStatus, labels: dict[str, str]) -> Iterator[GaugeMetricFamily]:
    names = [*labels, "slave"]
    for field in ("ackOffset", "lagBytes", "inSync"):
        gauge = GaugeMetricFamily(
            f"replog_slave_{_snake(field)}", f"per-slave {field}", labels=names
        )
        for slave in status.slaves:
            value = slave.get(field)
            if isinstance(value, int | float | bool):
                gauge.add_metric([*labels.values(), str(slave.get("address", ""))], float(value))
        yield gauge


def _snake(name: str) -> str:
    out = []
    for ch in name:
        if ch.isupper():
            out.append("_" + ch.lower())
        else:
            out.append(ch if ch.isalnum() else "_")
    return "".join(out).strip("_")
