"""Prometheus collector for controller mode (``common/broker/controller.py``).

Gauges: ``replog_controller_connected``, ``replog_controller_is_master``,
``replog_controller_lease_fresh``, ``replog_controller_lease_age_seconds``,
``replog_controller_master_epoch``, ``replog_sync_state_set_size``,
``replog_sync_state_set_epoch`` and ``replog_controller_no_master`` (1 while no member may
be elected: see ``noMasterReason`` in ``replog status``). Counters, ``_total``: elections won,
unclean elections, resignations, demotions, follows (re-points to a new master), SyncStateSet
changes and refused changes, session losses, suspensions, fenced writes, lease lapses and
switchovers.
All labelled with the broker name and its member id (``id``, as the other replog metrics).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_COUNTERS = {
    "elections_won": "elections this broker won",
    "unclean_elections": "elections won outside the SyncStateSet (enableElectUncleanMaster)",
    "resignations": "claims of mastership this broker gave up (a stale claim after a restart)",
    "demotions": "times this broker stopped being the master",
    "follows": "times this broker re-pointed its replication at a new master",
    "sss_changes": "SyncStateSet changes this master committed",
    "sss_change_failures": "SyncStateSet changes refused (compare-and-set lost)",
    "session_losses": "ZooKeeper sessions lost",
    "suspensions": "ZooKeeper connections suspended (writes fenced meanwhile)",
    "fenced_writes": "writes refused or unconfirmed for a stale lease or a lost election",
    "lease_lapses": "times the master's lease ran out while it was master, then was renewed",
    "switchovers": "planned handovers this master carried out",
}


class ControllerCollector:
    def __init__(self, status: Callable[[], dict[str, Any]], broker: str):
        self._status = status
        self._broker = broker

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        st = self._status()
        labels = ["broker", "id"]
        values = [self._broker, str(st.get("memberId", ""))]
        age = st.get("leaseAgeMs")
        gauges = {
            "controller_connected": ("connected to ZooKeeper", st.get("connected")),
            "controller_is_master": ("elected master in this session", st.get("isMaster")),
            "controller_lease_fresh": ("the master's write lease holds", st.get("leaseFresh")),
            "controller_lease_age_seconds": ("since the last confirmed ZooKeeper write",
                                             None if age is None else age / 1000),
            "controller_master_epoch": ("the group's master epoch", st.get("masterEpoch")),
            "sync_state_set_size": ("members in the SyncStateSet",
                                    len(st.get("syncStateSet") or [])),
            "sync_state_set_epoch": ("the SyncStateSet's epoch", st.get("syncStateSetEpoch")),
            "controller_no_master": ("1 while no member may be elected",
                                     bool(st.get("noMasterReason"))
                                     and not st.get("masterAddress")),
        }
        for name, (doc, value) in gauges.items():
            if value is None:
                continue
            gauge = GaugeMetricFamily(f"replog_{name}", doc, labels=labels)
            gauge.add_metric(values, float(value))
            yield gauge
        stats = st.get("stats") or {}
        for name, doc in _COUNTERS.items():
            counter = CounterMetricFamily(f"replog_controller_{name}", doc, labels=labels)
            counter.add_metric(values, float(stats.get(name, 0)))
            yield counter

    def describe(self) -> list[Any]:
        return []
