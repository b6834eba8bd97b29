"""The role manager: every change runs one sequence (stop, fence, become, epoch, start), the
running role is its own state (the configuration stays frozen), and a master that cannot
start leaves a slave following what it followed, with the epoch history it had."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from helpers.fake_store import FakeStore

from common.broker.role_manager import Role, RoleManager, RoleState
from common.core import ports
from common.core.config import BrokerConfig, load_config
from common.format.protocol import Request, Response
from common.ha import epochs, promotion

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Journal(FakeStore):
    def __init__(self, events: list[str]):
        super().__init__()
        self.events = events

    def fence_replication(self) -> int:
        self.events.append("fence")
        return super().fence_replication()

    def become_master(self) -> None:
        self.events.append("become master")
        super().become_master()

    def become_slave(self) -> None:
        self.events.append("become slave")
        super().become_slave()


class FakeRole:
    def __init__(self, state: RoleState, cfg: BrokerConfig, events: list[str],
                 fail_start: bool = False):
        self.state, self.cfg, self.events, self.fail_start = state, cfg, events, fail_start
        self.replication_stopped = True
        self.required: list[int] = []

    @property
    def name(self) -> str:
        return self.state.name

    def start(self) -> None:
        self.events.append(f"start {self.state.name} {self.state.master_ha_address}".strip())
        if self.fail_start:
            raise OSError("the HA port is taken")

    def stop(self) -> None:
        self.events.append(f"stop {self.state.name}")

    def refusal(self, req: Request) -> Response | None:
        return None

    def status_fields(self) -> dict[str, Any]:
        return {}

    def slave_acks(self) -> dict[int, int]:
        return {}

    def replicating(self) -> bool:
        return False

    def require_epoch(self, epoch: int) -> None:
        self.required.append(epoch)


@dataclasses.dataclass
class Setup:
    manager: RoleManager
    events: list[str]
    made: list[FakeRole]
    failing: set[str]  # role names whose start raises


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    cfg = load_config(None, (), env={}, brokerRole="SLAVE", brokerId=2,
                      haMasterAddress="10.0.0.1:10912", storePathRootDir=str(tmp_path),
                      listenPort=ports.free_port(), haListenPort=ports.free_port())
    events: list[str] = []
    made: list[FakeRole] = []
    failing: set[str] = set()

    def factory(state: RoleState) -> Role:
        made.append(FakeRole(state, state.view(cfg), events, state.name in failing))
        return made[-1]

    manager = RoleManager(cfg, Journal(events), factory,
                          on_master_store=lambda: events.append("route topics"))
    return Setup(manager, events, made, failing)


def test_promotion_runs_the_one_sequence_and_keeps_the_config_frozen(
        setup: Setup) -> None:
    manager, events, made = setup.manager, setup.events, setup.made
    cfg = manager.cfg
    manager.start(RoleState("SLAVE", 2, "10.0.0.1:10912"))
    manager.stop()  # let the HA port go: these tests bind nothing
    events.clear()
    manager.become_master("SYNC_MASTER", lambda h, end: epochs.append_epoch(h, 7, end))
    assert events == ["stop SLAVE", "fence", "become master", "route topics", "start SYNC_MASTER"]
    assert epochs.last_epoch(epochs.load(cfg.store_root)) == 7
    assert manager.state == RoleState("SYNC_MASTER", 2, "")
    assert made[-1].cfg.brokerRole == "SYNC_MASTER" and made[-1].cfg.haMasterAddress == ""
    assert (cfg.brokerRole, cfg.haMasterAddress) == ("SLAVE", "10.0.0.1:10912")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.brokerRole = "SYNC_MASTER"  # type: ignore[misc]


def test_a_master_follows_another_through_the_same_manager(
        setup: Setup) -> None:
    manager, events, made = setup.manager, setup.events, setup.made
    manager.become_master("ASYNC_MASTER", lambda h, end: epochs.append_epoch(h, 3, end))
    events.clear()
    manager.follow("10.0.0.9:10912", epoch=5)
    manager.stop()
    assert events[:3] == ["stop ASYNC_MASTER", "become slave", "start SLAVE 10.0.0.9:10912"]
    assert made[-1].required == [5]  # before its start: no byte from an older master
    assert manager.state == RoleState("SLAVE", 2, "10.0.0.9:10912")


def test_a_master_that_cannot_start_leaves_the_slave_it_was(
        setup: Setup) -> None:
    manager, events, made = setup.manager, setup.events, setup.made
    root = manager.cfg.store_root
    root.mkdir(parents=True, exist_ok=True)
    before = (epochs.EpochEntry(256, 0),)
    epochs.save(root, before)
    manager.start(RoleState("SLAVE", 2, "10.0.0.1:10912"))
    manager.stop()
    events.clear()
    setup.failing.add("SYNC_MASTER")
    with pytest.raises(OSError, match="HA port is taken"):
        manager.become_master(
            "SYNC_MASTER", lambda h, end: epochs.append_epoch(h, 513, end),
            record_term=lambda h: promotion.record(root, "SYNC_MASTER", 513, "SLAVE", ""))
    manager.stop()
    assert events[:6] == ["stop SLAVE", "fence", "become master", "route topics",
                          "start SYNC_MASTER", "stop SYNC_MASTER"]
    assert events[6:8] == ["become slave", "start SLAVE 10.0.0.1:10912"]
    assert epochs.load(root) == before  # the term that never began is gone
    assert not promotion.path_of(root).exists()
    assert manager.state == RoleState("SLAVE", 2, "10.0.0.1:10912")
    assert manager.role is made[-1] and made[-1].name == "SLAVE"


def test_a_store_that_cannot_become_a_masters_opens_no_term(
        setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    manager, events = setup.manager, setup.events
    root = manager.cfg.store_root
    root.mkdir(parents=True, exist_ok=True)
    epochs.save(root, (epochs.EpochEntry(256, 0),))

    def corrupt() -> None:
        raise OSError("a record past the flushed offset cannot be indexed")

    monkeypatch.setattr(manager.store, "become_master", corrupt)
    with pytest.raises(OSError, match="cannot be indexed"):
        manager.become_master("SYNC_MASTER", lambda h, end: epochs.append_epoch(h, 513, end))
    manager.stop()
    assert epochs.last_epoch(epochs.load(root)) == 256
    assert "start SYNC_MASTER" not in events and manager.state.name == "SLAVE"
