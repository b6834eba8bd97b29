"""Who may lead a group, on a real ZooKeeper with in-process controllers (fake brokers) and
real broker processes (docs/guarantees.md, "Controller"):

* a member that failed to take over (its store could not become a master's) stands no more
  until an operator clears the fault, and the others elect among themselves: it ranked best,
  won, raised, resigned and won again, and the healthy members deferred to it for ever;
* a master whose member znode someone else deleted steps down and goes through an election
  again; and a broker at the same address with another store never deletes a live member's
  znode (a DNS alias, a recreated pod);
* a member whose disk was wiped or replaced is no candidate: elected, it made the others
  truncate what was acknowledged."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import Group, chroot, running_zookeeper, wait_sync_state_set
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionClosedError, NoNodeError
from replication_harness import wait_for

from common.broker.controller import FAULT_FILE, Controller
from common.client import Admin, Consumer, Producer
from common.core.config import load_config
from common.core.errors import SendStatus, StoreError
from common.ha import controller_core as cc
from common.ha.controller_core import GroupState, MemberRecord

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class FakeBroker:
    """What a controller needs of a broker; ``fails``: its store cannot become a master's."""

    def __init__(self, member: int, max_offset: int, store_id: str, fails: bool = False,
                 address: str | None = None):
        self.member, self.max_offset, self.store_id, self.fails = member, max_offset, store_id, fails
        self.address = address or f"127.0.0.1:{10000 + member}"
        self.role = "STARTING"
        self.epoch = 0
        self.takeovers = 0

    def local_record(self, incarnation: str) -> MemberRecord:
        return MemberRecord(self.member, self.address, f"127.0.0.1:{20000 + self.member}",
                            self.role, self.epoch, self.max_offset, self.max_offset,
                            incarnation=incarnation, store_id=self.store_id)

    def topic_table(self) -> dict[str, int]:
        return {}

    def topic_perms(self) -> dict[str, int]:
        return {}

    def act_as_master(self, state: GroupState) -> None:
        self.takeovers += 1
        if self.fails:
            raise StoreError("reput met a corrupt record at 4096: the store cannot take writes")
        self.role, self.epoch = "MASTER", state.master_epoch

    def act_as_slave(self, state: GroupState) -> None:
        self.role = "SLAVE"

    def stand_by(self, reason: str) -> None:
        pass

    def slave_acks(self) -> dict[int, int]:
        return {}


@pytest.fixture
def zk_root(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(hosts, chroot) of a fresh ensemble, the chroot made."""
    with running_zookeeper(tmp_path / "zk") as zk:
        root = chroot()
        maker = KazooClient(hosts=zk.hosts)
        maker.start(10)
        maker.ensure_path(root)
        maker.stop()
        maker.close()
        yield zk.hosts, root


@contextlib.contextmanager
def controllers(tmp_path: Path, hosts: str, root: str,
                brokers: list[FakeBroker]) -> Iterator[list[Controller]]:
    made: list[Controller] = []
    try:
        for b in brokers:
            made.append(start_controller(tmp_path, hosts, root, b))
        yield made
    finally:
        for c in made:
            c.stop()


def start_controller(tmp_path: Path, hosts: str, root: str, broker: FakeBroker) -> Controller:
    cfg = load_config(env={}, enableControllerMode=True, brokerId=broker.member,
                      brokerRole="SYNC_MASTER", controllerAddr=hosts + root,
                      controllerSessionTimeoutMs=3000, controllerPollIntervalMs=200,
                      storePathRootDir=str(tmp_path / f"store-{broker.store_id}"))
    c = Controller(cfg, broker)  # type: ignore[arg-type]
    c.start()
    return c


def seed_state(hosts: str, root: str, state: GroupState) -> None:
    zk = KazooClient(hosts=hosts + root)
    zk.start(10)
    try:
        zk.create("/replog/DefaultCluster/broker-a/state", state.to_bytes(), makepath=True)
    finally:
        zk.stop()
        zk.close()


def test_a_member_that_cannot_take_over_stops_standing_and_the_others_elect(
        tmp_path: Path, zk_root: tuple[str, str]) -> None:
    hosts, root = zk_root
    seed_state(hosts, root, GroupState(None, 513, "", "", frozenset({1, 2}), 4,
                                       {1: "disk-1", 2: "disk-2"}))
    broken = FakeBroker(1, 9000, "disk-1", fails=True)  # the longest log: it ranks best
    healthy = FakeBroker(2, 8000, "disk-2")
    with controllers(tmp_path, hosts, root, [broken]) as (c1,):
        wait_for(lambda: c1.fault, 20, "the failed takeover to be recorded")
        with controllers(tmp_path, hosts, root, [healthy]) as (c2,):
            wait_for(lambda: c2.is_master() and healthy.role == "MASTER", 20,
                     "the healthy member to be elected")
            assert broken.takeovers == 1 and broken.role != "MASTER"
            assert (tmp_path / "store-disk-1" / "config" / FAULT_FILE).exists()
    # a restart keeps it out of elections, its record says why, until an operator clears it
    again = FakeBroker(1, 9000, "disk-1")
    with controllers(tmp_path, hosts, root, [again]) as (c1,):
        assert c1.fault.startswith("failed to take over as master: StoreError")

        def published_fault() -> str | None:
            try:
                raw, _ = c1._zk.get(c1.member_path)
            except NoNodeError:
                return None  # not registered yet
            except ConnectionClosedError:
                # the controller's client is not connecting yet: kazoo starts in its CLOSED
                # state until its connection thread runs (start_async returned before that)
                return None
            return MemberRecord.from_bytes(raw).fault

        wait_for(published_fault, 20, "the restarted member to publish its fault")
        assert c1.clear_fault().startswith("failed to take over")
        wait_for(lambda: published_fault() == "", 20, "the cleared record")
        assert not (tmp_path / "store-disk-1" / "config" / FAULT_FILE).exists()


def test_a_master_whose_member_znode_is_deleted_steps_down_and_is_elected_again(
        tmp_path: Path, zk_root: tuple[str, str]) -> None:
    hosts, root = zk_root
    broker = FakeBroker(1, 100, "disk-1")
    with controllers(tmp_path, hosts, root, [broker]) as (c,):
        wait_for(lambda: c.is_master() and broker.role == "MASTER", 20, "the election")
        epoch = broker.epoch
        zk = KazooClient(hosts=hosts + root)
        zk.start(10)
        try:
            zk.delete(c.member_path)  # not its session: someone else, with no auth
        finally:
            zk.stop()
            zk.close()
        # it stopped (its lease and claim are gone) and won a new election, a new epoch
        wait_for(lambda: c.is_master() and broker.epoch > epoch, 20, "a new term")
        assert c.stats.elections_won == 2


def test_a_broker_at_the_same_address_with_another_store_leaves_a_live_node_alone(
        tmp_path: Path, zk_root: tuple[str, str]) -> None:
    hosts, root = zk_root
    live = FakeBroker(1, 100, "disk-1")
    stranger = FakeBroker(1, 0, "disk-9")  # the same id and address, another disk
    with controllers(tmp_path, hosts, root, [live]) as (c1,):
        wait_for(lambda: c1.is_master(), 20, "the election")
        owner = c1._zk.exists(c1.member_path).ephemeralOwner
        with controllers(tmp_path, hosts, root, [stranger]) as (c9,):
            wait_for(lambda: "registered by another broker" in c9.status()["lastError"], 20,
                     "the stranger to see the id taken")
            assert c1._zk.exists(c1.member_path).ephemeralOwner == owner
            assert c1.is_master()


@pytest.mark.timeout(180)
def test_a_member_whose_disk_was_wiped_is_not_elected_and_truncates_no_one(
        tmp_path: Path) -> None:
    with running_zookeeper(tmp_path / "zk") as zk, \
            Group(tmp_path, zk.hosts + chroot(), size=2, inSyncReplicas=1) as g:
        master = g.master()
        wait_sync_state_set(master.status, {1, 2})
        slave = next(p for p in g.procs if p is not master)
        with Producer([master.address], timeout_ms=5000, retries=0) as p:
            assert all(p.send("t", b"m%d" % i, queue_id=0).status == SendStatus.SEND_OK
                       for i in range(10))
        for proc in (slave, master):
            os.kill(proc.pid, signal.SIGKILL)
            proc.proc.wait(10)  # type: ignore[union-attr]
        shutil.rmtree(slave.store_root)  # a new disk: the same member id, nothing on it
        slave.start()

        def refused() -> Any:
            reason = (slave.status()["controller"] or {}).get("noMasterReason", "")
            return "another store" in reason and reason

        wait_for(refused, 30, "the wiped member to refuse to lead")
        assert slave.status()["role"] == "SLAVE"
        master.start()
        assert g.master(timeout_s=60) is master  # the replica that holds everything
        wait_for(lambda: slave.status()["maxPhyOffset"] == master.status()["maxPhyOffset"],
                 30, "the wiped member to copy the log again")
        with Consumer([master.address]) as c:
            assert [m.body for m in c.pull("t", 0, 0, 32).messages] == \
                [b"m%d" % i for i in range(10)]
        with Admin([master.address]) as admin:
            assert admin.status()["controller"]["fault"] == ""


def test_records_of_members_without_a_store_id_stay_readable() -> None:
    assert MemberRecord.from_bytes(FakeBroker(3, 1, "").local_record("i").to_bytes()).store_id == ""
    assert cc.MAX_FAULT_CHARS >= 256
