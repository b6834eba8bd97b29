"""Replication with CURVE and the ACL on (docs/security.md): the HA port admits replica
accounts only and gives nothing to anyone else; a slave pinning the wrong master key replicates
nothing; SYNC replication, config sync, a revoked replica, and a failover drill (promote, then
the old master rejoining through its group probe) with security on."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq
from broker_harness import BrokerProcess, brokers, free_port, run_cli
from replication_harness import SEGMENT_BYTES, assert_identical, wait_converged
from security_harness import Realm, wait_until

from common.client import Admin, Consumer, Producer
from common.core.errors import PullStatus, SendStatus
from common.core.keys import fingerprint
from common.format.protocol import RequestCode
from common.ha import protocol as ha

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

QUIET_S = 2.0  # how long "nothing arrives" is watched, after the positive case arrived at once


@pytest.fixture
def realm(tmp_path: Path) -> Realm:
    r = Realm(tmp_path / "realm", ["app", "intruder", "replica2"])
    r.write_acl(accounts(r))
    return r


def accounts(realm: Realm, replica2: bool = True) -> list[dict[str, Any]]:
    return [realm.account("admin", admin=True),
            realm.account("broker", replica=True),
            realm.account("replica2", replica=replica2),
            realm.account("app", defaultTopicPerm="PUB|SUB", defaultGroupPerm="SUB")]


def pair(tmp: Path, realm: Realm, role: str = "SYNC_MASTER", slave_key: str = "broker",
         master_key: str | None = None, group: bool = False,
         **extra: Any) -> tuple[BrokerProcess, BrokerProcess]:
    """A secure master and slave; ``group``: each lists the other in groupServers."""
    port = free_port()
    slave_port = free_port()
    while abs(slave_port - port) < 3:
        slave_port = free_port()
    common = {"mappedFileSizeCommitLog": SEGMENT_BYTES, "defaultTopicQueueNums": 2, **extra}
    master = BrokerProcess(tmp / "master", client_curve=realm.curve("admin"), listenPort=port,
                           brokerRole=role,
                           groupServers=f"127.0.0.1:{slave_port}" if group else "",
                           **common, **realm.broker_fields())
    slave = BrokerProcess(tmp / "slave", client_curve=realm.curve("admin", server=slave_key),
                          listenPort=slave_port, brokerRole="SLAVE", brokerId=1,
                          haMasterAddress=f"127.0.0.1:{port + 1}",
                          groupServers=f"127.0.0.1:{port}" if group else "",
                          **common, **realm.broker_fields(slave_key, master_key or "broker"))
    return master, slave


def send(servers: list[str], realm: Realm, count: int, tag: str) -> list[Any]:
    with Producer(servers, **realm.curve("app")) as p:
        results = [p.send("orders", f"{tag}-{i}".encode(), queue_id=i % 2) for i in range(count)]
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    return results


def ha_dealer(ctx: zmq.Context[Any], realm: Realm, name: str, port: int) -> zmq.Socket[Any]:
    """A raw DEALER with ``name``'s key on the HA port, having said HELLO as a new slave."""
    sock = realm.dealer(ctx, name, port)
    hello = ha.Hello(session=1, broker_name="broker-a", broker_id=9, max_phy_offset=0,
                     slave_address="127.0.0.1:1", epochs=())
    sock.send_multipart(ha.encode(hello))
    return sock


def received_bytes(sock: zmq.Socket[Any], within_s: float) -> int:
    got = 0
    deadline = time.monotonic() + within_s
    while (left := deadline - time.monotonic()) > 0:
        if sock.poll(int(left * 1000) + 1):
            got += sum(len(f) for f in sock.recv_multipart())
    return got


def test_a_foreign_key_gets_no_bytes_of_the_log(tmp_path: Path, realm: Realm) -> None:
    master = BrokerProcess(tmp_path / "m", client_curve=realm.curve("admin"),
                           mappedFileSizeCommitLog=SEGMENT_BYTES, **realm.broker_fields())
    with brokers(master):
        send([master.address], realm, 20, "log")
        ctx: zmq.Context[Any] = zmq.Context()
        try:
            # the positive case: a replica account is answered at once, log bytes included
            replica = ha_dealer(ctx, realm, "broker", master.port + 1)
            wait_until(lambda: replica.poll(100), 10, "the replica's HELLO_REPLY")
            assert received_bytes(replica, 1.0) > 0
            # a client account and an unknown key: not one byte, whatever they say
            others = [ha_dealer(ctx, realm, name, master.port + 1)
                      for name in ("app", "admin", "intruder")]
            assert [received_bytes(s, QUIET_S) for s in others] == [0, 0, 0]
        finally:
            ctx.destroy(linger=0)
        log = master.log_path.read_text()
        for name, kind in (("app", "not_replica"), ("intruder", "unknown_key")):
            line = next(x for x in log.splitlines()
                        if f"key={fingerprint(realm.pub(name))}" in x and "port=ha" in x)
            assert f"reasonKind={kind}" in line and "logger=replog.audit" in line


def test_a_slave_pinning_the_wrong_master_key_replicates_nothing(tmp_path: Path,
                                                                realm: Realm) -> None:
    master, slave = pair(tmp_path, realm, role="ASYNC_MASTER", master_key="intruder")
    with brokers(master, slave):
        send([master.address], realm, 20, "x")
        wait_until(lambda: slave.status()["replication"].get("handshake_failures", 0) > 0,
                   20, "the slave's failed handshakes")
        assert slave.status()["maxPhyOffset"] == 0 < master.status()["maxPhyOffset"]
        assert master.status()["slaves"] == []
        assert "event=ha_handshake_failed" in slave.log_path.read_text()


def test_sync_replication_and_config_sync_with_security(tmp_path: Path, realm: Realm) -> None:
    master, slave = pair(tmp_path, realm)
    with brokers(master, slave):
        wait_until(lambda: master.status()["slaves"], 20, "the slave at the master")
        results = send([master.address], realm, 200, "sync")  # SEND_OK: a slave acked each
        with Producer([master.address], **realm.curve("app")) as p:
            batch = p.send_batch("orders", [b"b%d" % i for i in range(64)], queue_id=1)
        assert {r.status for r in batch} == {SendStatus.SEND_OK}
        end = wait_converged(master, slave)
        assert_identical(master, slave, 0, end)
        assert end > results[-1].commit_log_offset
        # the slave copied the master's tables with its replica key (GET_ALL_*)
        wait_until(lambda: slave.status()["configSync"]["rounds"] > 0, 20, "config sync")
        assert slave.status()["configSync"]["failures"] == 0
        with Admin([slave.address], **realm.curve("admin")) as admin:
            wait_until(lambda: b'"orders"' in admin.config_document(
                RequestCode.GET_ALL_TOPIC_CONFIG, slave.address), 20, "orders at the slave")


def test_a_revoked_replica_stops_receiving_on_its_open_connection(tmp_path: Path,
                                                                 realm: Realm) -> None:
    # each broker with its own key pair: the slave is "replica2", pinning the master's key
    master, slave = pair(tmp_path, realm, role="ASYNC_MASTER", slave_key="replica2",
                         haHousekeepingInterval=60_000)
    with brokers(master, slave):
        send([master.address], realm, 20, "before")
        wait_converged(master, slave)
        realm.write_acl(accounts(realm, replica2=False))
        wait_until(lambda: not master.status()["slaves"], 10, "the master to drop the slave")
        held = slave.status()["maxPhyOffset"]
        send([master.address], realm, 20, "after")
        assert master.status()["maxPhyOffset"] > held
        deadline = time.monotonic() + QUIET_S
        while time.monotonic() < deadline:
            assert slave.status()["maxPhyOffset"] == held
            threading.Event().wait(0.1)
        fp = fingerprint(realm.pub("replica2"))
        assert any(f"key={fp}" in x and "port=ha" in x and "op=REPLICATE" in x
                   for x in master.log_path.read_text().splitlines())
        realm.write_acl(accounts(realm))  # a replica again: it catches up
        end = wait_converged(master, slave, timeout_s=90)
        assert_identical(master, slave, 0, end)


def pull_all(address: str, realm: Realm) -> list[bytes]:
    bodies = []
    with Consumer([address], read_from=address, group="auditors", **realm.curve("app")) as c:
        for q in range(2):
            offset = 0
            while (r := c.pull("orders", q, offset, 256)).status == PullStatus.FOUND:
                bodies += [m.body for m in r.messages]
                offset = r.next_begin_offset
    return bodies


def test_a_failover_drill_with_security(tmp_path: Path, realm: Realm) -> None:
    master, slave = pair(tmp_path, realm, group=True)  # a restarted master probes the group
    env = {"REPLOG_KEY": realm.curve("admin")["key"],
           "REPLOG_SERVER_KEY": realm.curve("admin")["server_key"]}
    with brokers(master, slave):
        wait_until(lambda: master.status()["slaves"], 20, "the slave at the master")
        sent = [r.commit_log_offset for r in send([master.address], realm, 100, "first")]
        os.kill(master.pid, signal.SIGKILL)
        assert master.proc is not None
        master.proc.wait(10)
        app = {"REPLOG_KEY": realm.curve("app")["key"], "REPLOG_SERVER_KEY": env[
            "REPLOG_SERVER_KEY"]}
        code, doc = run_cli("promote", "-s", slave.address, "--role", "ASYNC_MASTER", env=app)
        assert code == 1 and doc["error"] == "NO_PERMISSION"  # not an admin account
        code, doc = run_cli("promote", "-s", slave.address, "--role", "ASYNC_MASTER", env=env)
        assert code == 0 and doc["role"] == "ASYNC_MASTER", doc
        second = send([master.address, slave.address], realm, 20, "second")
        assert len(sent) + len(second) == 120
        bodies = pull_all(slave.address, realm)
        assert sorted(bodies) == sorted([f"first-{i}".encode() for i in range(100)]
                                        + [f"second-{i}".encode() for i in range(20)])
        # the old master restarts as configured, probes the group with its key, finds the
        # newer master and replicates from it as a slave
        master.start()
        assert master.status()["role"] == "SLAVE"
        end = wait_converged(slave, master)
        assert_identical(slave, master, 0, end)



def test_no_replica_key_can_displace_a_member_or_claim_one_it_is_not(tmp_path: Path,
                                                                     realm: Realm) -> None:
    """Member 1 replicates with key "broker". Another replica key saying HELLO as member 1
    took its place and acked for it; a key whose account names its members (brokerIds) may
    be those only."""
    realm.write_acl([realm.account("admin", admin=True),
                     realm.account("broker", replica=True, brokerIds=[1]),
                     realm.account("replica2", replica=True),
                     realm.account("app", defaultTopicPerm="PUB|SUB", defaultGroupPerm="SUB")])
    master, slave = pair(tmp_path, realm)
    with brokers(master, slave):
        wait_until(lambda: [s["brokerId"] for s in master.status()["slaves"]] == [1], 20,
                   "member 1 replicating")
        ctx: zmq.Context[Any] = zmq.Context()
        try:
            hello = ha.Hello(session=2**40, broker_name="broker-a", broker_id=1,
                             max_phy_offset=0, slave_address="127.0.0.1:1", epochs=())
            usurper = realm.dealer(ctx, "replica2", master.port + 1)
            usurper.send_multipart(ha.encode(hello))
            assert received_bytes(usurper, QUIET_S) == 0
            # brokerIds [1]: "broker" may not be member 9
            stray = ha_dealer(ctx, realm, "broker", master.port + 1)
            assert received_bytes(stray, QUIET_S) == 0
        finally:
            ctx.destroy(linger=0)
        slaves = master.status()["slaves"]
        assert [(s["brokerId"], s["address"]) for s in slaves] == [(1, slave.address)]
        send([master.address], realm, 5, "still")  # SYNC: member 1 acks them
        log = master.log_path.read_text()
        assert "reasonKind=member_taken" in log and "reasonKind=not_this_member" in log


def test_with_the_acl_the_metrics_port_listens_on_loopback_unless_told(
        tmp_path: Path, realm: Realm) -> None:
    """aclEnable authenticates the client and HA ports; nothing authenticates a scrape, so the
    metrics port binds 127.0.0.1 unless metricsBindAddress says otherwise."""
    import socket

    port = free_port(4)
    master = BrokerProcess(tmp_path / "m", client_curve=realm.curve("admin"), listenPort=port,
                           metricsPort=port + 2, **realm.broker_fields())
    with brokers(master):
        log = master.log_path.read_text()
        assert "event=metrics_listening" in log and "bind=127.0.0.1" in log
        outside = next((ip for ip in _local_ipv4s() if not ip.startswith("127.")), None)
        if outside is not None:
            with socket.socket() as s:
                s.settimeout(2)
                assert s.connect_ex((outside, port + 2)) != 0


def _local_ipv4s() -> list[str]:
    import socket

    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None,
                                                                  socket.AF_INET)})
    except OSError:
        return []
