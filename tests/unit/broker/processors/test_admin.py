"""Admin codes (processors/admin.py) over real sockets on the in-memory store: promotion,
the HA port a slave holds, a failed promotion undone, a promotion resumed after a restart or
ended by a newer epoch or an edited YAML."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.brokers import addr

from common.broker.broker import Broker
from common.client import Admin, Producer
from common.core.errors import (
    BrokerError,
    ResponseCode,
    SendStatus,
)
from common.ha import epochs as ep
from common.ha import promotion

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_promote_slave_then_writes_succeed(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(brokerRole="SLAVE", brokerId=1, haMasterAddress="127.0.0.1:1")
    with Admin([addr(broker)]) as a:
        status = a.promote(addr(broker), role="ASYNC_MASTER")
    assert status["role"] == "ASYNC_MASTER" and status["epoch"] == 256 + 1  # next_epoch(0, id 1)
    # the term's first offset, as the epoch file has it (maxPhyOffset may count later writes)
    assert ep.load(broker.cfg.store_root)[-1] == (status["epoch"], status["epochStartOffset"])
    assert broker.store.promotions == 1  # the store continued its queue offsets
    with Producer([addr(broker)]) as p:
        assert p.send("t", b"x").status == SendStatus.SEND_OK


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            s.listen(1)
            return True
        except OSError:
            return False


def test_a_slave_holds_its_ha_port_until_promoted(make_broker: Callable[..., Broker]) -> None:
    """Nothing can take a slave's haListenPort meanwhile (a drill's promotion once found it
    taken); the promoted master's HA service binds it, and shutdown frees it."""
    broker = make_broker(brokerRole="SLAVE", brokerId=1, haMasterAddress="127.0.0.1:1")
    port = broker.cfg.ha_port
    assert not _bindable(port)
    with Admin([addr(broker)]) as a:
        assert a.promote(addr(broker), role="ASYNC_MASTER")["role"] == "ASYNC_MASTER"
    assert not _bindable(port)  # now the HA service's ROUTER
    broker.shutdown()
    assert _bindable(port)


def test_a_failed_promotion_leaves_a_replicating_slave(
    make_broker: Callable[..., Broker], tmp_path: Path
) -> None:
    """A master role that cannot start (here: its HA service) undoes the promotion: the answer
    says so, the broker is a SLAVE with a new HA client, holds its HA port again, its epoch
    history is what it was and writes are still refused; a later promotion succeeds."""
    broker = make_broker(brokerRole="SLAVE", brokerId=1, haMasterAddress="127.0.0.1:1")
    port, root = broker.cfg.ha_port, broker.cfg.store_root
    history = (ep.EpochEntry(256, 0),)  # a term it replicated from its old master
    root.mkdir(parents=True, exist_ok=True)
    ep.save(root, history)
    old_role = broker.role
    assert old_role is not None and old_role.ha_client.running
    real_factory = broker.role_factory

    class FailingMaster:
        name = "SYNC_MASTER"

        def __init__(self) -> None:
            self.stopped = False

        def start(self) -> None:
            raise OSError(98, "Address already in use (as if another process took the port)")

        def stop(self) -> None:
            self.stopped = True

    failing = FailingMaster()
    broker.role_factory = lambda state, b: real_factory(state, b) if state.name == "SLAVE" else failing
    with Admin([addr(broker)], retries=0) as a, pytest.raises(BrokerError) as e:
        a.promote(addr(broker), role="SYNC_MASTER")
    assert e.value.code == ResponseCode.SYSTEM_ERROR
    assert "still a SLAVE" in e.value.remark and "Address already in use" in e.value.remark
    assert failing.stopped
    role = broker.role
    assert role is not None and role is not old_role and role.name == "SLAVE"
    assert role.ha_client.running and not old_role.ha_client.running
    assert not _bindable(port)  # held again
    assert ep.load(root) == history and broker.store.promotions == 1 and broker.store.demotions == 2
    assert not promotion.path_of(root).exists()  # no master term for a restart to resume
    with Producer([addr(broker)], retries=0) as p:
        p._cluster._master = addr(broker)
        with pytest.raises(BrokerError) as refused:
            p.send("t", b"x", queue_id=0)
    assert refused.value.code == ResponseCode.SERVICE_NOT_AVAILABLE and broker.store.phy == 0
    broker.role_factory = real_factory
    with Admin([addr(broker)]) as a:
        status = a.promote(addr(broker), role="ASYNC_MASTER")
    epoch = ep.next_epoch(256, 1)  # the same as the failed attempt would have opened
    assert status["role"] == "ASYNC_MASTER" and status["epoch"] == epoch
    assert ep.last_epoch(ep.load(root)) == epoch


def test_a_slave_whose_ha_port_is_taken_refuses_to_start(
    make_broker: Callable[..., Broker],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"haListenPort {port} is in use"):
            make_broker(brokerRole="SLAVE", brokerId=1, haMasterAddress="127.0.0.1:1",
                        haListenPort=port)


def _restart(make_broker: Callable[..., Broker], broker: Broker, **fields: Any) -> Broker:
    """The same store directory and YAML (plus ``fields``), new ports: a restart."""
    root = broker.cfg.store_root
    broker.shutdown()
    base = {"brokerRole": "SLAVE", "brokerId": 1, "haMasterAddress": "127.0.0.1:1",
            "groupServers": broker.cfg.groupServers}
    return make_broker(**{**base, **fields, "storePathRootDir": str(root)})


def _promoted(make_broker: Callable[..., Broker], peer: Broker | None) -> tuple[Broker, int]:
    """A slave (with ``peer`` as its groupServers) promoted to ASYNC_MASTER, and its epoch."""
    broker = make_broker(brokerRole="SLAVE", brokerId=1, haMasterAddress="127.0.0.1:1",
                         groupServers=addr(peer) if peer is not None else "")
    with Admin([addr(broker)]) as a:
        return broker, a.promote(addr(broker), role="ASYNC_MASTER")["epoch"]


def _slave_peer(make_broker: Callable[..., Broker]) -> Broker:
    return make_broker(brokerRole="SLAVE", brokerId=2, haMasterAddress="127.0.0.1:1")


def test_a_promotion_survives_a_restart_from_the_unchanged_yaml(
    make_broker: Callable[..., Broker],
) -> None:
    """The YAML still says SLAVE of the old master; restarted, the promoted broker asks its
    group (a slave answers), is the master it became, in the epoch its promotion opened (not a
    new one), and takes writes."""
    broker, epoch = _promoted(make_broker, _slave_peer(make_broker))
    record = promotion.load(broker.cfg.store_root)
    assert record is not None and (record.role, record.epoch) == ("ASYNC_MASTER", epoch)
    assert (record.configured_role, record.configured_master) == ("SLAVE", "127.0.0.1:1")
    for _ in range(2):  # and again: resuming does not spend the record
        broker = _restart(make_broker, broker)
        status = broker.status()
        assert (status["role"], status["epoch"]) == ("ASYNC_MASTER", epoch), status
        with Producer([addr(broker)], retries=0) as p:
            assert p.send("t", b"x").status == SendStatus.SEND_OK


def test_a_promotion_replaced_by_a_newer_one_is_not_resumed(
    make_broker: Callable[..., Broker], tmp_path: Path
) -> None:
    """While it was down, another broker was promoted (a newer epoch): with groupServers the
    restarted broker finds that master and joins it as a slave; without, it starts as its YAML
    says. Never a second master."""
    peer_root = tmp_path / "newer"
    peer_root.mkdir()
    newer = make_broker(brokerRole="ASYNC_MASTER", storePathRootDir=str(peer_root))
    broker, epoch = _promoted(make_broker, newer)
    newer.shutdown()
    ep.save(peer_root, (ep.EpochEntry(ep.next_epoch(epoch, 0), 0),))  # promoted after it
    newer = make_broker(brokerRole="ASYNC_MASTER", storePathRootDir=str(peer_root))
    broker = _restart(make_broker, broker, groupServers=addr(newer))
    status = broker.status()
    assert status["role"] == "SLAVE" and status["haMasterAddress"] == newer.status()["haAddress"]
    assert not promotion.path_of(broker.cfg.store_root).exists()  # spent
    broker, _ = _promoted(make_broker, None)
    broker = _restart(make_broker, broker)  # no groupServers
    assert broker.status()["role"] == "SLAVE"
    assert promotion.load(broker.cfg.store_root) is not None  # kept: still the YAML's to end


def test_an_edited_yaml_or_a_newer_epoch_ends_a_recorded_promotion(
    make_broker: Callable[..., Broker],
) -> None:
    broker, epoch = _promoted(make_broker, _slave_peer(make_broker))
    root = broker.cfg.store_root
    # the operator pointed the file at another master: the file decides
    broker = _restart(make_broker, broker, haMasterAddress="127.0.0.1:2")
    assert broker.status()["role"] == "SLAVE"
    # the unchanged file again, but the store has since copied a newer master's epoch
    broker.shutdown()
    ep.save(root, (*ep.load(root), ep.EpochEntry(epoch + 1, 0)))
    broker = _restart(make_broker, broker)
    assert broker.status()["role"] == "SLAVE"


def test_an_unreadable_promotion_record_starts_the_broker_as_configured(
    make_broker: Callable[..., Broker],
) -> None:
    broker, _ = _promoted(make_broker, _slave_peer(make_broker))
    path = promotion.path_of(broker.cfg.store_root)
    broker.shutdown()
    path.write_bytes(b'{"brokerRole": "ASYNC_MASTER", "epoch": "seven"')  # torn
    broker = _restart(make_broker, broker)
    assert broker.status()["role"] == "SLAVE"  # never a second master by accident
    with Admin([addr(broker)]) as a:
        assert a.status(addr(broker))["role"] == "SLAVE"  # and it serves
