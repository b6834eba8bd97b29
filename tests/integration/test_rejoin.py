"""docs/contract.md §6: a broker that restarts into a group whose master has a newer epoch joins
as a slave, truncates what only it holds past the divergence point, and catches up; a promoted
slave restarted from its unchanged YAML is still the master."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from broker_harness import BrokerProcess, brokers, free_port
from replication_harness import SEGMENT_BYTES, assert_identical, wait_converged, wait_for

from common.client import Admin, Producer
from common.core.errors import SendStatus

pytestmark = pytest.mark.integration


@pytest.mark.timeout(180)
def test_old_master_restarting_into_a_newer_epoch_rejoins_as_slave(tmp_path: Path) -> None:
    port = free_port()
    slave = BrokerProcess(tmp_path / "slave", brokerRole="SLAVE", brokerId=1,
                          haMasterAddress=f"127.0.0.1:{port + 1}", groupServers=f"127.0.0.1:{port}",
                          mappedFileSizeCommitLog=SEGMENT_BYTES)
    master = BrokerProcess(tmp_path / "master", brokerRole="ASYNC_MASTER", listenPort=port,
                           groupServers=slave.address, mappedFileSizeCommitLog=SEGMENT_BYTES)
    with brokers(master, slave):
        with Producer([master.address], retries=0) as p:
            for i in range(50):
                assert p.send("t", f"shared-{i}".encode(), queue_id=0).status == SendStatus.SEND_OK
        shared = wait_converged(master, slave)
        # the slave stops hearing; the master goes on alone (ASYNC: acknowledged at once)
        os.kill(slave.pid, signal.SIGSTOP)
        with Producer([master.address], retries=0) as p:
            for i in range(20):
                assert p.send("t", f"alone-{i}".encode() * 20, queue_id=0).status == SendStatus.SEND_OK
        alone_end = master.status()["maxPhyOffset"]
        assert alone_end > shared
        old_epoch = master.status()["epoch"]
        os.kill(master.pid, signal.SIGKILL)
        assert master.proc is not None
        master.proc.wait(10)
        os.kill(slave.pid, signal.SIGCONT)
        with Admin([slave.address]) as admin:
            admin.promote(slave.address, role="ASYNC_MASTER")
        new_epoch = slave.status()["epoch"]
        assert new_epoch > old_epoch
        with Producer([slave.address], retries=0) as p:
            for i in range(10):
                assert p.send("t", f"new-{i}".encode(), queue_id=0).status == SendStatus.SEND_OK

        master.start()  # the same configuration: brokerRole ASYNC_MASTER
        status = master.status()
        assert status["role"] == "SLAVE" and status["brokerId"] not in (0, 1), status
        assert status["haMasterAddress"] == slave.status()["haAddress"]
        wait_for(lambda: master.status()["masterAddress"] == slave.address, 20,
                 "the new master's client address, from its HELLO_REPLY")
        # byte-identical to the new master: what only the old master held past the divergence
        # point (the "alone" records) was cut, and the new master's records replaced it
        end = wait_converged(slave, master)
        assert_identical(slave, master, 0, end)
        wait_for(lambda: master.status()["epoch"] == new_epoch, 20, "the new epoch recorded")
        with Producer([slave.address, master.address], retries=0) as p:
            assert p.send("t", b"after", queue_id=0).status == SendStatus.SEND_OK
        wait_converged(slave, master)
        # restarted again, it holds the new master's epoch itself: still that master's slave
        assert master.terminate() == 0
        master.start()
        assert master.status()["role"] == "SLAVE"
        with Producer([slave.address], retries=0) as p:
            assert p.send("t", b"later", queue_id=0).status == SendStatus.SEND_OK
        end = wait_converged(slave, master)
        assert_identical(slave, master, 0, end)
        # the promoted broker restarts from its own YAML (still brokerRole SLAVE of the old
        # master, now its slave): it resumes the promotion, in its epoch, and keeps its slave
        assert slave.terminate() == 0
        slave.start()
        status = slave.status()
        assert (status["role"], status["epoch"]) == ("ASYNC_MASTER", new_epoch), status
        with Producer([master.address, slave.address], retries=0) as p:
            assert p.send("t", b"after the restart", queue_id=0).status == SendStatus.SEND_OK
        end = wait_converged(slave, master)
        assert_identical(slave, master, 0, end)
        assert master.status()["role"] == "SLAVE"


@pytest.mark.timeout(120)
def test_a_master_with_no_newer_peer_starts_as_configured(tmp_path: Path) -> None:
    """Peers that do not answer, or answer with an older epoch, leave the role as configured."""
    silent = f"127.0.0.1:{free_port()}"  # nothing listens there
    master = BrokerProcess(tmp_path / "m", brokerRole="ASYNC_MASTER", groupServers=silent)
    with brokers(master):
        assert master.status()["role"] == "ASYNC_MASTER"
