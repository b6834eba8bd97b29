"""Drills on the default configuration (docs/drills.md, "Default timings"): nothing shortened.

The other tests run with short failure detection (haHousekeepingInterval 2 s, sessions of 3 s)
to stay quick, and that hid a slave that stayed orphaned for 22 s after a manual promotion with
the defaults (it counted a dropped connection as transferring until 20 s of silence). These
drills keep every timing at its default and bound what a user of the defaults waits for.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from broker_harness import BrokerProcess, free_port
from controller_harness import Group, chroot, running_zookeeper, wait_sync_state_set
from replication_harness import wait_for

from common.client import Admin, Consumer, Producer
from common.core.config import BrokerConfig
from common.core.errors import SendStatus

pytestmark = [pytest.mark.drill, pytest.mark.slow]

DEFAULTS = BrokerConfig()
ORPHAN_BOUND_S = 8.0  # the broker's 2 s orphan wait, a probe of groupServers, a handshake


@pytest.mark.timeout(180)
def test_without_a_controller_the_other_slave_follows_a_promoted_one_within_seconds(
        tmp_path: Path) -> None:
    """Master M, slaves A and B, default timings. M dies, A is promoted: B follows A within
    ORPHAN_BOUND_S of the promotion, not after haHousekeepingInterval (20 s) of silence."""
    assert DEFAULTS.haHousekeepingInterval == 20_000
    ports = [free_port() for _ in range(3)]
    addrs = [f"127.0.0.1:{p}" for p in ports]

    def group(i: int) -> str:
        return ",".join(a for j, a in enumerate(addrs) if j != i)

    m = BrokerProcess(tmp_path / "m", listenPort=ports[0], brokerRole="SYNC_MASTER",
                      groupServers=group(0))
    a = BrokerProcess(tmp_path / "a", listenPort=ports[1], brokerRole="SLAVE", brokerId=1,
                      haMasterAddress=f"127.0.0.1:{ports[0] + 1}", groupServers=group(1))
    b = BrokerProcess(tmp_path / "b", listenPort=ports[2], brokerRole="SLAVE", brokerId=2,
                      haMasterAddress=f"127.0.0.1:{ports[0] + 1}", groupServers=group(2))
    try:
        for p in (m, a, b):
            p.start()
        wait_for(lambda: sum(s["inSync"] for s in m.status()["slaves"]) == 2, 60, "2 slaves")
        with Producer([m.address], timeout_ms=5000, retries=0) as p:
            assert p.send("t", b"before", queue_id=0).status == SendStatus.SEND_OK
        os.kill(m.pid, signal.SIGKILL)
        m.proc.wait(10)  # type: ignore[union-attr]
        with Admin([a.address], timeout_ms=15_000, retries=0) as admin:
            assert admin.promote(a.address)["role"] == "SYNC_MASTER"
        promoted = time.monotonic()
        wait_for(lambda: b.status()["haMasterAddress"] == f"127.0.0.1:{ports[1] + 1}", 30,
                 "B to follow the promoted A")
        followed_s = time.monotonic() - promoted
        assert followed_s < ORPHAN_BOUND_S, followed_s
        wait_for(lambda: any(s["inSync"] for s in a.status()["slaves"]), 30, "B in sync")
        with Producer([a.address], timeout_ms=5000, retries=0) as p:
            assert p.send("t", b"after", queue_id=0).status == SendStatus.SEND_OK
    finally:
        for p in (m, a, b):
            p.close()


@pytest.mark.timeout(240)
def test_a_killed_master_is_replaced_within_the_default_session_and_loses_nothing(
        tmp_path: Path) -> None:
    """Controller mode, default timings (a 10 s session, a 5 s poll): the group writes again
    within a session timeout and a few seconds, with every acknowledged message."""
    session_s = DEFAULTS.controllerSessionTimeoutMs / 1000
    with running_zookeeper(tmp_path / "zk", tick_ms=500) as zk, \
            Group(tmp_path, zk.hosts + chroot(), size=3, defaults=True) as g:
        master = g.master(timeout_s=60)
        wait_sync_state_set(master.status, {1, 2, 3}, timeout_s=60)
        with Producer(g.addresses, timeout_ms=5000, retries=0) as p:
            acked = [p.send("t", b"m%d" % i, queue_id=0) for i in range(20)]
        assert all(r.status == SendStatus.SEND_OK for r in acked)
        os.kill(master.pid, signal.SIGKILL)
        killed = time.monotonic()
        master.proc.wait(10)  # type: ignore[union-attr]
        new = g.master(timeout_s=60)
        with Producer([new.address], timeout_ms=5000, retries=0) as p:
            wait_for(lambda: p.send("t", b"after", queue_id=0).status == SendStatus.SEND_OK,
                     60, "a write on the new master")
        writable_s = time.monotonic() - killed
        assert writable_s < session_s + 10, writable_s
        with Consumer([new.address], read_from=new.address) as c:
            found = [m.body for m in c.pull("t", 0, 0, 32).messages]
        assert found[:20] == [b"m%d" % i for i in range(20)]
