"""Automatic failover drills on a real ZooKeeper (docs/drills.md rows 1, 2 and 14 in controller
mode; docs/operations.md "Automatic failover").

Every drill runs a local ZooKeeper (``common/cli/zookeeper.py``, tickTime 250 ms) and three
brokers in controller mode with a 3 s session; nobody promotes anyone. The checker is the
total-queue of ``harness``: lost = 0 and unexpected = 0 under SYNC, replicas byte-identical.
``DRILL_CONTROLLER_CYCLES`` sets the number of kills of the first drill (10 by default, the PR
tier; 20 nightly).
"""

from __future__ import annotations

import itertools
import os
import random
import statistics
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from controller_harness import SESSION_MS, chroot, running_zookeeper, wait_sync_state_set
from harness import QUEUES, TOPIC, Drill, Node, make_body, rto_after, wait_more_puts
from replication_harness import wait_for

from common.client import Transport
from common.core.errors import ResponseCode
from common.format.protocol import RequestCode

pytestmark = [pytest.mark.drill, pytest.mark.integration]

CYCLES = int(os.environ.get("DRILL_CONTROLLER_CYCLES", "10"))
PRODUCERS = 3
RATE = 50.0  # puts/s per producer: three brokers, ZooKeeper and the clients share 2 cores


def _pinned_write(transport: Transport, address: str, i: int) -> Any:
    body = make_body(f"zombie-{i}", 64, random.Random(i))
    return transport.call(address, RequestCode.SEND, {"topic": TOPIC, "queueId": i % QUEUES},
                          [body], 20_000)


def _group(drill: Drill, controller: str, role: str = "SYNC_MASTER",
           **fields: Any) -> tuple[list[Node], Node]:
    nodes = [drill.node(name, slave_id=i + 1) for i, name in enumerate("abc")]
    for n in nodes:
        n.start_controlled(controller, role, **fields)
    master = drill.wait_controller_master(nodes)
    return nodes, master


def _all_in_sync(master: Node, nodes: list[Node]) -> None:
    wait_sync_state_set(master.status, {n.slave_id for n in nodes}, timeout_s=30)


def _failover_figures(drill: Drill, kills: list[float]) -> dict[str, Any]:
    times = [rto_after(drill.history.events, t) for t in kills]
    done = sorted(t for t in times if t is not None)
    return {"failover_s": [round(t, 3) for t in done],
            "failover_p50_s": round(statistics.median(done), 3) if done else None,
            "failover_max_s": round(max(done), 3) if done else None,
            "session_timeout_ms": SESSION_MS}


@pytest.mark.timeout(1500)
def test_sync_master_sigkilled_again_and_again_heals_itself(tmp_path: Path) -> None:
    """SIGKILL the SYNC master CYCLES times with producers and a consumer running; no operator
    acts. Each time a member of the SyncStateSet is elected, the other slave follows it at run
    time, and the old master restarts and rejoins as a slave. lost = 0, unexpected = 0, logs
    byte-identical; failover time (kill to the first SEND_OK a client gets) p50/max reported."""
    with running_zookeeper(tmp_path / "zk") as zk, Drill("controller-kill", tmp_path) as drill:
        controller = zk.hosts + chroot()
        nodes, master = _group(drill, controller)
        drill.add_load([n.address for n in nodes], PRODUCERS, RATE)
        kills: list[float] = []
        epochs: list[int] = [master.status()["epoch"]]
        for _cycle in range(CYCLES):
            _all_in_sync(master, nodes)
            wait_more_puts(drill.history, 20)
            threading.Event().wait(drill.rng.uniform(0.5, 2.0))
            master.kill()
            kills.append(drill.faults[-1]["t"])
            survivors = [n for n in nodes if n is not master]
            new = drill.wait_controller_master(survivors)  # the other one follows it
            epoch = new.status()["epoch"]
            assert epoch > epochs[-1], (epoch, epochs)
            epochs.append(epoch)
            master.start_controlled(controller)
            assert drill.wait_controller_master(nodes) is new  # rejoined as a slave
            # caught up past where the new master stood (the load goes on: never "equal"),
            # then byte-identical over the range all three hold
            top = new.status()["maxPhyOffset"]
            wait_for(lambda top=top: all(n.status()["maxPhyOffset"] >= top for n in nodes),
                     60, "the replicas to catch up with the new master")
            logs = drill.compare_logs(nodes)
            assert logs["identical"], logs
            master = new
        drill.extra.update(_failover_figures(drill, kills), epochs=epochs, kills=len(kills))
        summary = drill.finish(master, [n for n in nodes if n is not master])
        assert summary["verdict"] == "pass", summary["problems"]
        assert summary["lost"] == 0 and summary["unexpected"] == 0


@pytest.mark.parametrize("role", ["SYNC_MASTER", "ASYNC_MASTER"])
@pytest.mark.timeout(300)
def test_a_paused_master_never_acknowledges_after_the_new_epoch(tmp_path: Path,
                                                                role: str) -> None:
    """Zombie master: SIGSTOP for 2x the session timeout, then SIGCONT. A new master is
    elected meanwhile; the resumed one answers no SEND_OK (its lease is stale at once), steps
    down and truncates at run time, with no restart. Under ASYNC too, where no slave ack would
    stop it. Under ASYNC the paused master's unreplicated tail may be lost (never more than
    what it had acknowledged before the pause); under SYNC nothing is."""
    with running_zookeeper(tmp_path / "zk") as zk, Drill(f"zombie-{role}", tmp_path) as drill:
        nodes, master = _group(drill, zk.hosts + chroot(), role)
        _all_in_sync(master, nodes)
        drill.add_load([n.address for n in nodes], PRODUCERS, RATE)
        wait_more_puts(drill.history, 60)
        transport = Transport(name="zombie-writer")
        try:
            master.pause()
            paused_at = drill.faults[-1]["t"]
            # writes pinned to the paused master (no discovery), queued in its socket: it
            # reads them when it resumes, after the new epoch began
            queued = [_pinned_write(transport, master.address, i) for i in range(50)]
            survivors = [n for n in nodes if n is not master]
            new = drill.wait_controller_master(survivors, timeout_s=30)
            threading.Event().wait(max(0.0, 2 * SESSION_MS / 1000
                                       - (drill.history.now() - paused_at)))
            master.resume()
            resumed_at = drill.faults[-1]["t"]
            answers = [f.result(30) for f in queued]
            answers += [f.result(30) for f in
                        [_pinned_write(transport, master.address, 100 + i) for i in range(50)]]
        finally:
            transport.close()
        accepted = [(a.code.name, a.remark) for a in answers if a.code == ResponseCode.SUCCESS]
        refused = Counter(a.code.name for a in answers)
        # it steps down by itself and follows the new master, truncating its own tail
        assert drill.wait_controller_master(nodes, timeout_s=30) is new
        wait_more_puts(drill.history, 60)
        zombie = master.address
        late = [e for e in drill.history.events
                if e["op"] == "put" and e["type"] == "ok" and e.get("handler") == zombie
                and e["t"] >= resumed_at]
        drill.extra.update(zombie_ok_after_resume=len(late), pinned_writes=dict(refused),
                           paused_s=round(
            resumed_at - paused_at, 2), rto_s=rto_after(drill.history.events, paused_at))
        loss_allowed = None
        if role == "ASYNC_MASTER":
            before = {e["msg_id"] for e in drill.history.events
                      if e["op"] == "put" and e["type"] == "ok" and e.get("handler") == zombie
                      and e["t"] <= resumed_at}

            def loss_allowed(msg_id: str) -> bool:
                return msg_id in before

        summary = drill.finish(new, [n for n in nodes if n is not new],
                               loss_allowed=loss_allowed)
        assert not late, late[:5]
        assert not accepted, accepted[:5]
        assert refused["SERVICE_NOT_AVAILABLE"] > 0, refused
        assert summary["verdict"] == "pass", summary["problems"]


@pytest.mark.timeout(300)
def test_switchover_under_load_loses_nothing_and_pauses_writes_briefly(tmp_path: Path) -> None:
    """``replog promote -s X`` in controller mode is a planned handover: the master fences
    writes, waits (bounded) until X holds everything, and hands the group to X with a new
    epoch. Nothing acknowledged is lost; the write pause stays within switchoverTimeoutMs."""
    timeout_ms = 5000
    with running_zookeeper(tmp_path / "zk") as zk, Drill("switchover", tmp_path) as drill:
        nodes, master = _group(drill, zk.hosts + chroot(), switchoverTimeoutMs=timeout_ms)
        _all_in_sync(master, nodes)
        drill.add_load([n.address for n in nodes], PRODUCERS, RATE)
        pauses = []
        for _round in range(3):
            wait_more_puts(drill.history, 60)
            target = next(n for n in nodes if n is not master)
            asked = drill.history.now()
            doc = drill.promote(target)
            assert doc["role"] == "SYNC_MASTER" and doc["controller"]["isMaster"], doc
            new = drill.wait_controller_master(nodes)
            assert new is target
            wait_more_puts(drill.history, 30)
            oks = sorted(e["t"] for e in drill.history.events
                         if e["op"] == "put" and e["type"] == "ok")
            gaps = [b - a for a, b in itertools.pairwise(oks) if b >= asked]
            pauses.append(round(max(gaps), 3))
            _all_in_sync(new, nodes)
            master = new
        drill.extra.update(write_pauses_s=pauses)
        summary = drill.finish(master, [n for n in nodes if n is not master])
        assert summary["verdict"] == "pass", summary["problems"]
        assert max(pauses) < timeout_ms / 1000, pauses
