"""A cluster of two broker groups under load; SIGKILL the master of one group (docs/drills.md
row 24; issue 25). The other group's sends go on without a single failure or pause, the
failed group elects a new master, the old one rejoins as its slave, and the checker runs over
both groups: per group lost = 0 under SYNC, replicas byte-identical group by group.

Each group is two brokers in controller mode (SYNC_MASTER, member ids 1 and 2) on one local
ZooKeeper (tickTime 250 ms, 3 s sessions). Producers: one pinned to each group (queues in
turn, ``broker_name=``) and one keyless (the client picks over both groups), each its own
client with no retries (every put is one history operation); a consumer reads every queue of
both groups. ``DRILL_CLUSTER_CYCLES`` kills (default 4), alternating the groups.
"""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from controller_harness import SESSION_MS, chroot, running_zookeeper, wait_sync_state_set
from harness import (
    QUEUES,
    TOPIC,
    ConsumerWorker,
    Drill,
    Node,
    ProducerWorker,
    rto_after,
    wait_more_puts,
)
from replication_harness import wait_for

from common.client import Admin, Producer

pytestmark = [pytest.mark.drill, pytest.mark.integration]

CYCLES = int(os.environ.get("DRILL_CLUSTER_CYCLES", "4"))
RATE = 40.0  # puts/s per producer: four brokers, ZooKeeper and the clients share 2 cores
GROUPS = ("broker-a", "broker-b")
# a healthy group's SEND_OKs never stop for this long: the failed group is replaced about a
# session timeout after the kill, so a send that waited on it would leave a gap of that order
MAX_GAP_S = SESSION_MS / 1000 / 2


def _start_groups(drill: Drill, controller: str) -> dict[str, list[Node]]:
    groups = {g: [drill.node(f"{g}-{i + 1}", slave_id=i + 1, brokerName=g,
                             brokerClusterName="drill") for i in range(2)] for g in GROUPS}
    for nodes in groups.values():
        for n in nodes:
            n.start_controlled(controller)
    for nodes in groups.values():
        master = drill.wait_controller_master(nodes)
        wait_sync_state_set(master.status, {n.slave_id for n in nodes}, timeout_s=30)
    return groups


def _puts(drill: Drill, group: str, t0: float, t1: float) -> list[dict[str, Any]]:
    """Completed puts of ``group`` invoked in [t0, t1)."""
    invoked = {e["msg_id"]: e["t"] for e in drill.history.events
               if e["op"] == "put" and e["type"] == "invoke"}
    return [e for e in drill.history.events if e["op"] == "put" and e["type"] != "invoke"
            and e.get("group") == group and t0 <= invoked.get(e["msg_id"], -1.0) < t1]


def _healthy_figures(drill: Drill, group: str, proc: str, t0: float,
                     t1: float) -> dict[str, Any]:
    """The healthy group's puts during the other's failover: failures, and the longest time
    its pinned producer went without a SEND_OK."""
    puts = _puts(drill, group, t0, t1)
    pinned = sorted(e["t"] for e in puts if e["proc"] == proc and e["type"] == "ok")
    gaps = [b - a for a, b in itertools.pairwise([t0, *pinned, t1])]
    return {"puts": len(puts), "failed": sum(e["type"] != "ok" for e in puts),
            "max_gap_s": round(max(gaps), 3), "pinned_ok": len(pinned)}


@pytest.mark.timeout(1200)
def test_a_master_killed_in_one_group_of_two(tmp_path: Path) -> None:
    with running_zookeeper(tmp_path / "zk") as zk, Drill("cluster-kill", tmp_path) as drill:
        controller = zk.hosts + chroot()
        groups = _start_groups(drill, controller)
        servers = [n.address for nodes in groups.values() for n in nodes]
        with Admin(servers, timeout_ms=10_000) as admin:
            admin.create_topic(TOPIC, QUEUES)

        def routed() -> bool:  # a new client's route names both groups' queues
            with Producer(servers, timeout_ms=10_000) as p:
                return len(p.queues(TOPIC)) == 2 * QUEUES

        wait_for(routed, 30, "the route of both groups", step_s=0.2)
        groups_of = {n.address: g for g, nodes in groups.items() for n in nodes}
        for g in GROUPS:
            drill.add_worker(ProducerWorker(drill.history, servers, f"p-{g}", RATE,
                                            seed=drill.seed, group=g))
        drill.add_worker(ProducerWorker(drill.history, servers, "p-any", RATE, seed=drill.seed,
                                        keyless=True, groups_of=groups_of))
        drill.add_worker(ConsumerWorker(drill.history, servers, groups=list(GROUPS)))
        wait_more_puts(drill.history, 60)

        windows = []
        for cycle in range(CYCLES):
            victim, healthy = GROUPS[cycle % 2], GROUPS[(cycle + 1) % 2]
            nodes = groups[victim]
            master = drill.wait_controller_master(nodes)
            wait_sync_state_set(master.status, {n.slave_id for n in nodes}, timeout_s=30)
            wait_more_puts(drill.history, 20)
            threading.Event().wait(drill.rng.uniform(0.5, 1.5))
            master.kill()
            t_kill = drill.faults[-1]["t"]
            survivor = drill.wait_controller_master([n for n in nodes if n is not master])
            master.start_controlled(controller)  # rejoins as the new master's slave
            assert drill.wait_controller_master(nodes) is survivor
            wait_sync_state_set(survivor.status, {n.slave_id for n in nodes}, timeout_s=60)
            t_back = drill.history.now()
            windows.append({"cycle": cycle, "victim": victim, "t_kill": t_kill,
                            "recovered_s": round(t_back - t_kill, 3),
                            "victim_rto_s": _group_rto(drill, victim, t_kill),
                            "healthy": _healthy_figures(drill, healthy, f"p-{healthy}",
                                                        t_kill, t_back)})
        drill.extra.update(windows=windows, session_timeout_ms=SESSION_MS)

        def healthy_never_paused(summary: dict[str, Any]) -> list[str]:
            problems = []
            for w in windows:
                h = w["healthy"]
                if h["failed"]:
                    problems.append(f"cycle {w['cycle']}: {h['failed']} failed sends to the "
                                    f"healthy group while {w['victim']} failed over")
                if h["max_gap_s"] >= MAX_GAP_S:
                    problems.append(f"cycle {w['cycle']}: the healthy group went "
                                    f"{h['max_gap_s']} s without a SEND_OK")
                if h["pinned_ok"] == 0:
                    problems.append(f"cycle {w['cycle']}: no SEND_OK to the healthy group")
            if summary["unattributed"]:
                problems.append(f"{summary['unattributed']} puts name no group")
            return problems

        final = {g: (drill.wait_controller_master(nodes),
                     [n for n in nodes if n is not drill.wait_controller_master(nodes)])
                 for g, nodes in groups.items()}
        summary = drill.finish_groups(final, healthy_never_paused)
        assert summary["verdict"] == "pass", summary["problems"]
        assert all(figures["lost"] == 0 for figures in summary["groups"].values())
        assert summary["unexpected"] == 0


def _group_rto(drill: Drill, group: str, t_fault: float) -> float | None:
    """Seconds from the kill to the first SEND_OK of the victim group's pinned producer
    invoked after it."""
    events = [e for e in drill.history.events if e["proc"] == f"p-{group}"]
    return rto_after(events, t_fault)
