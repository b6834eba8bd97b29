"""The controller's compare-and-set on a real ZooKeeper (docs/guarantees.md, "Controller"): a
write that an earlier try already applied (its call timed out here, the request went through)
meets a version conflict when tried again, and is still reported as what it is, committed. A
SyncStateSet join answered "not committed" while ZooKeeper holds it leaves the master counting
acks against a set that is not the one an election would use."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import chroot, running_zookeeper
from kazoo.client import KazooClient

from common.broker.controller import Controller, _Proposal
from common.core.config import load_config
from common.ha import controller_core as cc
from common.ha.controller_core import GroupState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

JOIN = cc.SetChange(members=frozenset({1, 2}), removed=frozenset(), added=frozenset({2}),
                    reason="caught up")


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    """A controller whose ZooKeeper calls go to a real ensemble; no thread of its own runs
    (each test makes its calls itself)."""
    with running_zookeeper(tmp_path / "zk") as zk:
        root = chroot()
        maker = KazooClient(hosts=zk.hosts)
        maker.start(10)
        maker.ensure_path(root)
        maker.stop()
        maker.close()
        cfg = load_config(env={}, enableControllerMode=True, brokerId=1,
                          brokerRole="SYNC_MASTER", controllerAddr=zk.hosts + root)
        c = Controller(cfg, broker=None)  # type: ignore[arg-type]
        client = KazooClient(hosts=c.hosts)
        client.start(10)
        c._zk = client
        c._session = client.client_id
        try:
            yield c
        finally:
            client.stop()
            client.close()


def _apply_elsewhere(c: Controller, state: GroupState, version: int) -> None:
    """The earlier try of a write, arriving at ZooKeeper after its call gave up here."""
    other = KazooClient(hosts=c.hosts)
    other.start(10)
    try:
        other.set(c.state_path, state.to_bytes(), version=version)
    finally:
        other.stop()
        other.close()


def test_a_retried_compare_and_set_that_already_applied_is_committed(
        controller: Controller) -> None:
    first = GroupState(1, 257, "127.0.0.1:10911", "127.0.0.1:10912", frozenset({1}), 1)
    assert controller._cas_state(first)  # creates the state znode
    joined = first.with_sync_state_set({1, 2})
    _apply_elsewhere(controller, joined, controller._state_version)
    assert controller._cas_state(joined)  # BadVersion: it is this very write
    conflicting = joined.with_sync_state_set({1, 3})
    stale_version = controller._state_version
    _apply_elsewhere(controller, joined.with_sync_state_set({1}), stale_version)
    controller._state_version = stale_version
    assert not controller._cas_state(conflicting)  # a real conflict is still refused
    assert controller.state == joined.with_sync_state_set({1})


def test_a_join_committed_by_an_earlier_try_is_answered_committed(
        controller: Controller) -> None:
    first = GroupState(1, 257, "127.0.0.1:10911", "127.0.0.1:10912", frozenset({1}), 1)
    assert controller._cas_state(first)
    controller._mastered = (controller._session[0], 257)  # type: ignore[index]
    stale = controller.state
    version = controller._state_version
    _apply_elsewhere(controller, first.with_sync_state_set({1, 2}), version)
    controller.state, controller._state_version = stale, version  # read before it applied
    answers: list[tuple[bool, Any]] = []
    controller._proposal = _Proposal(JOIN, 1, lambda ok, state: answers.append((ok, state)))
    controller._carry_out_proposal()
    assert [ok for ok, _ in answers] == [True]
    assert controller.state is not None and controller.state.sync_state_set == {1, 2}
