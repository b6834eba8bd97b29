"""Controller mode on a real ZooKeeper with real broker processes (docs/operations.md,
"Automatic failover"): election, the SyncStateSet, fencing when cut off from ZooKeeper, unclean
elections, short session blips, an ensemble losing a node, clients that follow the controller,
and (without a controller) slaves that follow a promoted master."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from broker_harness import BrokerProcess, free_port, run_cli
from controller_harness import (
    SESSION_MS,
    Group,
    chroot,
    controller_fields,
    running_zookeeper,
    wait_master,
    wait_sync_state_set,
)
from replication_harness import Relay, stop_process, wait_for

from common.client import Admin, Consumer, Producer
from common.core.errors import BrokerError, PullStatus, ResponseCode, SendStatus
from common.core.message import decode_msg_id, encode_msg_id, host_bytes
from common.format.protocol import RequestCode

pytestmark = pytest.mark.integration


def _store_host(broker: BrokerProcess) -> str:
    """The store host a broker's msgIds carry (its brokerIP1:listenPort)."""
    return broker.address


def _send(addresses: list[str], n: int, tag: str, **kw: Any) -> list[Any]:
    with Producer(addresses, timeout_ms=5000, retries=0, **kw) as p:
        return [p.send("t", f"{tag}-{i}".encode(), queue_id=0) for i in range(n)]


@pytest.mark.timeout(120)
def test_the_group_elects_a_master_fills_the_set_and_shows_it(tmp_path: Path) -> None:
    with running_zookeeper(tmp_path / "zk") as zk, Group(tmp_path, zk.hosts + chroot()) as g:
        master = g.master()
        st = wait_sync_state_set(master.status, {1, 2, 3})
        assert st["brokerId"] == 0 and st["controller"]["leaseFresh"]
        assert st["controller"]["leaseAgeMs"] < SESSION_MS
        assert all(r.status == SendStatus.SEND_OK for r in _send(g.addresses, 10, "a"))
        slaves = [p for p in g.procs if p is not master]
        assert {p.status()["brokerId"] for p in slaves} == {
            int(p.cfg.brokerId) for p in slaves}
        code, doc = run_cli("controller", "status", "-s", slaves[0].address)
        assert code == 0, doc
        row = doc["groups"][0]
        assert row["master"] == master.address and row["syncStateSet"] == [1, 2, 3]
        assert len(row["members"]) == 3 and row["epoch"] == st["epoch"]


@pytest.mark.timeout(180)
def test_a_killed_master_is_replaced_the_other_follows_and_it_rejoins(tmp_path: Path) -> None:
    with running_zookeeper(tmp_path / "zk") as zk, Group(tmp_path, zk.hosts + chroot()) as g:
        master = g.master()
        wait_sync_state_set(master.status, {1, 2, 3})
        acked = [r for r in _send(g.addresses, 30, "before") if r.status == SendStatus.SEND_OK]
        assert len(acked) == 30
        old_epoch = master.status()["epoch"]
        killed_at = time.monotonic()
        os.kill(master.pid, signal.SIGKILL)
        master.proc.wait(10)  # type: ignore[union-attr]
        new = g.master()
        elected_s = time.monotonic() - killed_at
        assert new is not master and new.status()["epoch"] > old_epoch
        assert elected_s < SESSION_MS / 1000 + 5, elected_s
        assert all(r.status == SendStatus.SEND_OK for r in _send(g.addresses, 10, "after"))
        master.start()
        assert g.master() is new  # the old master rejoined as a slave of the new one
        wait_sync_state_set(new.status, {1, 2, 3})
        with Consumer(g.addresses) as c:
            bodies = [m.body for m in c.pull("t", 0, 0, 100).messages]
        assert [b.decode() for b in bodies[:30]] == [f"before-{i}" for i in range(30)]


@pytest.mark.timeout(180)
def test_a_stopped_slave_leaves_the_set_and_sync_writes_resume(tmp_path: Path) -> None:
    """It leaves (committed in ZooKeeper) after haMaxTimeSlaveNotCatchup, SEND_OK comes back,
    and it joins again only once it caught up."""
    with running_zookeeper(tmp_path / "zk") as zk, Group(tmp_path, zk.hosts + chroot()) as g:
        master = g.master()
        wait_sync_state_set(master.status, {1, 2, 3})
        lagging = next(p for p in g.procs if p is not master)
        member = int(lagging.cfg.brokerId)
        held = lagging.status()["maxPhyOffset"]
        stop_process(lagging.pid)
        stopped = time.monotonic()
        others = {1, 2, 3} - {member}
        wait_sync_state_set(master.status, others, timeout_s=30)
        left_after = time.monotonic() - stopped
        assert left_after >= 1.0  # not at the first slow ack: after the catch-up timeout
        results = _send(g.addresses, 20, "without")
        assert [r.status for r in results] == [SendStatus.SEND_OK] * 20
        top = master.status()["maxPhyOffset"]
        assert top > held
        os.kill(lagging.pid, signal.SIGCONT)
        wait_sync_state_set(master.status, {1, 2, 3}, timeout_s=30)
        # no write since: it joined only holding all of them
        assert lagging.status()["maxPhyOffset"] == top


@pytest.mark.timeout(180)
@pytest.mark.parametrize("role", ["SYNC_MASTER", "ASYNC_MASTER"])
def test_a_master_cut_off_from_zookeeper_stops_writing_before_another_is_elected(
        tmp_path: Path, role: str) -> None:
    """The master reaches its slaves but not ZooKeeper (a relay in front of ZooKeeper drops
    every byte): its lease runs out and it refuses writes before ZooKeeper expires its
    session, so there are never two writable masters; nothing acknowledged is lost. Checked
    from the writers' histories, not by sampling: an ASYNC master waits for no slave, so its
    lease is all that stops it."""
    with running_zookeeper(tmp_path / "zk") as zk:
        root = chroot()
        port = int(zk.hosts.rsplit(":", 1)[1])
        relays = [Relay(port) for _ in range(3)]
        try:
            with Group(tmp_path, [f"127.0.0.1:{r.port}{root}" for r in relays],
                       role=role) as g:
                master = g.master()
                wait_sync_state_set(master.status, {1, 2, 3})
                index = g.procs.index(master)
                acked = _send(g.addresses, 20, "before")
                assert all(r.status == SendStatus.SEND_OK for r in acked)
                top = master.status()["maxPhyOffset"]
                wait_for(lambda: all(s and s["maxPhyOffset"] == top for s in g.statuses()), 10,
                         "every member to hold the 20")
                relays[index].blackhole()
                cut = time.monotonic()
                # Two writers: one pinned to the cut-off master, one following the group's
                # master; every SEND_OK is kept with when it was sent and answered, and which
                # broker stored it. No sampling: the check reads the histories.
                stop = threading.Event()
                history: list[tuple[float, float, str]] = []  # (sent, answered, storeHost)
                refused: list[float] = []

                def write(pinned: bool) -> None:
                    """Pinned: SEND requests to the cut-off master's address and no other
                    (a producer would follow the new master); else a producer of the group."""
                    with Producer(g.addresses, timeout_ms=2000, retries=0) as p:
                        while not stop.is_set():
                            sent = time.monotonic()
                            try:
                                if pinned:
                                    resp = p._cluster.request(
                                        master.address, RequestCode.SEND,
                                        {"topic": "t", "queueId": 0}, [b"probe"])
                                    if resp.code != ResponseCode.SUCCESS:
                                        raise BrokerError(resp.code, resp.remark)
                                    msg_id = encode_msg_id(
                                        host_bytes(master.address.split(":")[0]), master.port,
                                        resp.fields["commitLogOffset"])
                                else:
                                    msg_id = p.send("t", b"probe", queue_id=0).msg_id
                            except BrokerError as e:
                                if pinned and e.code == ResponseCode.SERVICE_NOT_AVAILABLE:
                                    refused.append(sent - cut)
                                stop.wait(0.01)
                                continue
                            ip, port, _ = decode_msg_id(msg_id)
                            history.append((sent, time.monotonic(), f"{ip}:{port}"))

                writers = [threading.Thread(target=write, args=(pinned,)) for pinned in
                           (True, False)]
                for w in writers:
                    w.start()
                try:
                    index2, _ = wait_master(lambda: [
                        s if i != index else None for i, s in enumerate(g.statuses())], 30)
                    new = g.procs[index2]
                    wait_for(lambda: any(h[2] != _store_host(master) for h in history), 30,
                             "a SEND_OK from the new master")
                finally:
                    stop.set()
                    for w in writers:
                        w.join(10)
                old_host = _store_host(master)
                first_new = min(a for _, a, h in history if h != old_host)
                # no SEND_OK of the old master for a send made after the new one acknowledged
                late = [(sent - cut, h) for sent, _, h in history
                        if h == old_host and sent > first_new]
                assert not late, late
                # it acknowledged nothing sent after its session could have expired (no
                # election before that), and refuses writes from then on
                last_old = max(sent - cut for sent, _, h in history if h == old_host)
                assert last_old < SESSION_MS / 1000, last_old
                if not refused:
                    # The pinned writer can spend the whole gap between the lapse and the new
                    # master's first SEND_OK inside one request: sent while the lease was
                    # fresh, its SEND_OK held by the lease gate (up to a session) past the
                    # client's 2 s deadline (seen under load, SYNC_MASTER). Still cut off,
                    # the old master must refuse a write now.
                    with Producer([master.address], timeout_ms=5000, retries=0) as p:
                        resp = p._cluster.request(master.address, RequestCode.SEND,
                                                  {"topic": "t", "queueId": 0}, [b"probe"])
                    assert resp.code == ResponseCode.SERVICE_NOT_AVAILABLE, resp
                    refused.append(time.monotonic() - cut)
                others = [p for p in g.procs if p is not master]
                assert new is not master
                relays[index].heal()
                assert g.master(30) is new  # the old one follows once it hears ZooKeeper
                with Consumer([new.address]) as c:
                    got = {m.body for m in c.pull("t", 0, 0, 200).messages}
                assert {f"before-{i}".encode() for i in range(20)} <= got
                del others
        finally:
            for r in relays:
                r.close()


@pytest.mark.timeout(180)
def test_short_zookeeper_blips_change_no_epoch(tmp_path: Path) -> None:
    """Connection drops shorter than the session timeout: the session survives, no election."""
    with running_zookeeper(tmp_path / "zk") as zk:
        root = chroot()
        port = int(zk.hosts.rsplit(":", 1)[1])
        relays = [Relay(port) for _ in range(3)]
        try:
            with Group(tmp_path, [f"127.0.0.1:{r.port}{root}" for r in relays]) as g:
                master = g.master()
                epoch = master.status()["epoch"]
                for _ in range(3):
                    for r in relays:
                        r.blackhole()
                    time.sleep(SESSION_MS / 1000 / 4)  # the blip itself: a quarter session
                    for r in relays:
                        r.heal()
                    assert g.master(30) is master
                assert [s["epoch"] for s in g.statuses() if s] == [epoch] * 3
                st = master.status()["controller"]
                assert st["stats"]["elections_won"] == 1 and st["stats"]["session_losses"] == 0
        finally:
            for r in relays:
                r.close()


@pytest.mark.timeout(180)
def test_only_a_lagging_non_member_alive_elects_nobody_unless_unclean(tmp_path: Path) -> None:
    with running_zookeeper(tmp_path / "zk") as zk:
        for unclean in (False, True):
            root = chroot()
            with Group(tmp_path / f"u{int(unclean)}", zk.hosts + root, size=2,
                       enableElectUncleanMaster=unclean) as g:
                master = g.master()
                slave = next(p for p in g.procs if p is not master)
                wait_sync_state_set(master.status, {1, 2})
                stop_process(slave.pid)
                wait_sync_state_set(master.status, {int(master.cfg.brokerId)}, timeout_s=30)
                # the master alone acknowledges what inSyncReplicas 1 allows; the slave lacks it
                with Producer([master.address], timeout_ms=3000, retries=0) as p:
                    for i in range(10):
                        p.send("t", f"alone-{i}".encode(), queue_id=0)
                os.kill(master.pid, signal.SIGKILL)
                master.proc.wait(10)  # type: ignore[union-attr]
                os.kill(slave.pid, signal.SIGCONT)
                if not unclean:
                    def refused(slave: BrokerProcess = slave) -> dict[str, Any] | None:
                        st = slave.status()
                        reason = st["controller"]["noMasterReason"]
                        return st if "SyncStateSet" in reason else None

                    st = wait_for(refused, SESSION_MS / 1000 + 20, "no master, with a reason")
                    assert st["role"] == "SLAVE"
                    assert "enableElectUncleanMaster" in st["controller"]["noMasterReason"]
                    with pytest.raises(BrokerError):
                        _send([slave.address], 1, "x")
                else:
                    assert g.master(SESSION_MS / 1000 + 20) is slave
                    log = (slave.home / "broker.log").read_text()
                    assert "controller_unclean_election" in log and "lost_bytes=" in log


@pytest.mark.timeout(180)
def test_a_three_node_ensemble_losing_a_node_keeps_the_group_working(tmp_path: Path) -> None:
    with running_zookeeper(tmp_path / "zk", size=3) as zk, \
            Group(tmp_path, zk.hosts + chroot()) as g:
        master = g.master()
        wait_sync_state_set(master.status, {1, 2, 3})
        zk.nodes[0].kill()
        for round_ in range(3):
            assert all(r.status == SendStatus.SEND_OK
                       for r in _send(g.addresses, 10, f"r{round_}"))
            time.sleep(SESSION_MS / 1000)  # sessions must outlive the lost node
        assert g.master() is master
        assert master.status()["controller"]["stats"]["session_losses"] == 0
        os.kill(master.pid, signal.SIGKILL)  # and a failover still works on two nodes
        master.proc.wait(10)  # type: ignore[union-attr]
        assert g.master(30) is not master


@pytest.mark.timeout(180)
def test_clients_find_the_master_from_a_slave_and_read_from_slaves_meanwhile(
        tmp_path: Path) -> None:
    """A client given only a slave's address finds the master; a consumer reads from a slave
    while no master answers and commits are kept until one does."""
    with running_zookeeper(tmp_path / "zk") as zk, Group(tmp_path, zk.hosts + chroot()) as g:
        master = g.master()
        wait_sync_state_set(master.status, {1, 2, 3})
        slave = next(p for p in g.procs if p is not master)
        assert all(r.status == SendStatus.SEND_OK for r in _send([slave.address], 20, "m"))
        with Consumer([slave.address], group="g1", timeout_ms=3000, retries=0) as c:
            pr = c.pull("t", 0, 0, 10)
            assert pr.status == PullStatus.FOUND and len(pr.messages) == 10
            c.commit_offset("t", 0, 10)
            os.kill(master.pid, signal.SIGKILL)
            master.proc.wait(10)  # type: ignore[union-attr]
            killed = time.monotonic()
            got_at = None
            errors: list[str] = []
            while time.monotonic() - killed < SESSION_MS / 1000:
                try:
                    pr = c.pull("t", 0, 10, 10)
                except BrokerError as e:
                    errors.append(f"{time.monotonic() - killed:.2f} {e!r}")
                    continue
                if pr.status == PullStatus.FOUND and got_at is None:
                    got_at = time.monotonic() - killed
                    c.commit_offset("t", 0, 15)
            assert got_at is not None and got_at < 3.0, (got_at, errors[:10])
            new = g.master()
            assert c.fetch_offset("t", 0) == 15
            assert c.unsent_commits == {("t", 0): 15}  # kept while no master answered
            wait_for(c.flush_commits, 10, "the kept commit to reach the new master")
            assert c.unsent_commits == {}
        with Consumer([new.address], group="g1") as c2:
            assert c2.fetch_offset("t", 0) == 15  # the commit made meanwhile reached the master


@pytest.mark.timeout(180)
def test_without_a_controller_promote_leaves_no_orphan_slave(tmp_path: Path) -> None:
    """Master M, slaves A and B. M dies, A is promoted: B follows A at run time (it asks
    groupServers), so SYNC sends to A answer SEND_OK without any YAML edited or restart."""
    ports = [free_port() for _ in range(3)]
    addrs = [f"127.0.0.1:{p}" for p in ports]

    def group(i: int) -> str:
        return ",".join(a for j, a in enumerate(addrs) if j != i)

    common = {"slaveTimeout": 1000, "haSendHeartbeatInterval": 200,
              "haHousekeepingInterval": 2000}
    m = BrokerProcess(tmp_path / "m", listenPort=ports[0], brokerRole="SYNC_MASTER",
                      groupServers=group(0), **common)
    a = BrokerProcess(tmp_path / "a", listenPort=ports[1], brokerRole="SLAVE", brokerId=1,
                      haMasterAddress=f"127.0.0.1:{ports[0] + 1}", groupServers=group(1),
                      **common)
    b = BrokerProcess(tmp_path / "b", listenPort=ports[2], brokerRole="SLAVE", brokerId=2,
                      haMasterAddress=f"127.0.0.1:{ports[0] + 1}", groupServers=group(2),
                      **common)
    try:
        for p in (m, a, b):
            p.start()
        wait_for(lambda: sum(s["inSync"] for s in m.status()["slaves"]) == 2, 30, "2 slaves")
        assert all(r.status == SendStatus.SEND_OK for r in _send(addrs, 10, "m"))
        os.kill(m.pid, signal.SIGKILL)
        m.proc.wait(10)  # type: ignore[union-attr]
        with Admin([a.address], timeout_ms=15_000, retries=0) as admin:
            assert admin.promote(a.address)["role"] == "SYNC_MASTER"
        wait_for(lambda: b.status()["haMasterAddress"] == f"127.0.0.1:{ports[1] + 1}", 30,
                 "B to follow the promoted A")
        wait_for(lambda: any(s["inSync"] for s in a.status()["slaves"]), 30, "B in sync")
        assert all(r.status == SendStatus.SEND_OK for r in _send([a.address], 10, "a"))
        assert "broker_follows_promoted_master" in (b.home / "broker.log").read_text()
    finally:
        for p in (m, a, b):
            p.close()


@pytest.mark.timeout(120)
def test_a_session_shorter_than_asked_shortens_the_lease(tmp_path: Path) -> None:
    """ZooKeeper grants at most 20 tickTimes (2 s at tickTime 100 ms): a broker asking 3 s
    must not keep a 1.5 s lease on a 2 s session. It takes half the granted session."""
    with running_zookeeper(tmp_path / "zk", tick_ms=100) as zk, \
            Group(tmp_path, zk.hosts + chroot(), size=1) as g:
        master = g.master()
        ctl = master.status()["controller"]
        assert ctl["sessionMs"] == 2000 and ctl["leaseMs"] == 1000, ctl
        assert "controller_session_shortened" in (master.home / "broker.log").read_text()


@pytest.mark.timeout(180)
def test_every_broker_answers_the_cluster_view_of_all_groups(tmp_path: Path) -> None:
    """Two groups on one ZooKeeper under one brokerClusterName: any broker answers
    CLUSTER_INFO with both groups, their masters and slaves, and each group's topics (what
    clients route by); a topic made on one master shows up without waiting a poll."""
    with running_zookeeper(tmp_path / "zk") as zk:
        controller = zk.hosts + chroot()
        a = Group(tmp_path / "a", controller, size=2, brokerName="broker-a",
                  controllerPollIntervalMs=5000)
        b = Group(tmp_path / "b", controller, size=2, brokerName="broker-b",
                  controllerPollIntervalMs=5000)
        with a, b:
            ma, mb = a.master(), b.master()
            with Admin([ma.address], timeout_ms=5000) as admin:  # each group its own count
                admin.create_topic("orders", 4, broker_names=["broker-a"])
            with Admin([mb.address], timeout_ms=5000) as admin:
                admin.create_topic("orders", 2, broker_names=["broker-b"])

            def both() -> dict[str, Any] | None:
                with Admin([b.procs[1].address], timeout_ms=2000, retries=0) as admin:
                    doc = admin.cluster_info(b.procs[1].address)
                groups = {g["brokerName"]: g for g in doc["groups"]}
                ok = (set(groups) == {"broker-a", "broker-b"}
                      and groups["broker-a"]["topics"].get("orders") == 4
                      and groups["broker-b"]["topics"].get("orders") == 2)
                return groups if ok else None

            groups = wait_for(both, 3.0, "both groups and their topics in the view")
            assert groups["broker-a"]["master"] == ma.address
            assert groups["broker-b"]["master"] == mb.address
            assert groups["broker-a"]["slaves"] == [p.address for p in a.procs if p is not ma]


@pytest.mark.timeout(120)
def test_zookeeper_digest_auth_keeps_others_out_of_the_groups_znodes(tmp_path: Path) -> None:
    """controllerAuthFile: the brokers authenticate with ZooKeeper's digest scheme and every
    znode they make carries an ACL for that identity only: an unauthenticated ZooKeeper
    client cannot read or change the group's state. A readable or malformed file refuses the
    start."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError

    secret = tmp_path / "zk-auth"
    secret.write_text("replog:s3cret\n")
    secret.chmod(0o600)
    with running_zookeeper(tmp_path / "zk") as zk:
        root = chroot()
        with Group(tmp_path, zk.hosts + root, size=2, controllerAuthFile=str(secret)) as g:
            g.master()
            stranger = KazooClient(hosts=zk.hosts + root, timeout=3.0)
            stranger.start(10)
            try:
                state = "/replog/DefaultCluster/broker-a/state"
                with pytest.raises(NoAuthError):
                    stranger.get(state)
                with pytest.raises(NoAuthError):
                    stranger.set(state, b"{}")
                with pytest.raises(NoAuthError):  # nor delete a member's znode (issue 36)
                    stranger.delete("/replog/DefaultCluster/broker-a/brokers/1")
            finally:
                stranger.stop()
                stranger.close()
        secret.chmod(0o644)
        bad = BrokerProcess(tmp_path / "bad", **controller_fields(
            zk.hosts + root, 3, controllerAuthFile=str(secret)))
        with pytest.raises(RuntimeError, match="others may read it"):
            bad.start(timeout_s=20)
        bad.close()
