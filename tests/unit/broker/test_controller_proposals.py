"""The controller always answers the HA service's SyncStateSet proposal, and never says "not
committed" about a set ZooKeeper holds.

The HA service proposes one change at a time and waits for the answer (``master/ha_service.py``:
``_proposing``). A ZooKeeper call that failed inside the compare-and-set (a time-out under load)
used to drop the proposal unanswered: that master's set never changed again (a loaded run waited
30 s for a slave to join, in vain). The proposal is now kept and tried again after the group is
read again; found committed by then, it is answered committed."""

from __future__ import annotations

from typing import Any

import pytest

from common.broker.controller import Controller, _Proposal
from common.core.config import load_config
from common.ha import controller_core as cc
from common.ha.controller_core import GroupState

pytestmark = pytest.mark.unit

ME = 1
JOIN = cc.SetChange(members=frozenset({1, 2}), removed=frozenset(), added=frozenset({2}),
                    reason="caught up")


class ZooKeeperTimeout(Exception):
    """Stands for kazoo's time-out of a call (any exception out of a ZooKeeper call)."""


@pytest.fixture
def controller() -> Controller:
    cfg = load_config(env={}, enableControllerMode=True, brokerId=ME, brokerRole="SYNC_MASTER",
                      controllerAddr="zk1:2181/replog")
    c = Controller(cfg, broker=None)  # type: ignore[arg-type]  # no broker: no pass runs here
    c.state = GroupState(ME, 1, "127.0.0.1:10911", "127.0.0.1:10912", frozenset({ME}), 3)
    c._mastered = (0x1234, 1)
    return c


def propose(c: Controller, based_on: int = 3) -> list[tuple[bool, Any]]:
    answers: list[tuple[bool, Any]] = []
    c._proposal = _Proposal(JOIN, based_on, lambda ok, state: answers.append((ok, state)))
    return answers


def test_a_failed_call_keeps_the_proposal_and_a_committed_one_is_answered_so(
        controller: Controller, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = propose(controller)
    proposal = controller._proposal

    def timed_out(new: GroupState) -> bool:
        raise ZooKeeperTimeout("set timed out")

    monkeypatch.setattr(controller, "_cas_state", timed_out)
    with pytest.raises(ZooKeeperTimeout):  # _run logs the pass and reads the group again
        controller._carry_out_proposal()
    assert answers == [] and controller._proposal is proposal  # kept, not dropped unanswered
    # the next pass read the group: the set did reach ZooKeeper
    assert controller.state is not None
    controller.state = controller.state.with_sync_state_set({1, 2})
    monkeypatch.setattr(controller, "_cas_state", lambda new: pytest.fail("set again"))
    controller._carry_out_proposal()
    assert answers == [(True, controller.state)] and controller._proposal is None
    assert controller.stats.sss_changes == 1


def test_a_failed_call_that_changed_nothing_is_tried_again(
        controller: Controller, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = propose(controller)
    calls: list[GroupState] = []

    def flaky(new: GroupState) -> bool:
        calls.append(new)
        if len(calls) == 1:
            raise ZooKeeperTimeout("set timed out")
        controller.state = new
        return True

    monkeypatch.setattr(controller, "_cas_state", flaky)
    with pytest.raises(ZooKeeperTimeout):
        controller._carry_out_proposal()
    controller._carry_out_proposal()  # the group read again: still epoch 3, so set it now
    assert len(calls) == 2 and calls[1].sync_state_set == {1, 2}
    assert calls[1].sync_state_set_epoch == 4 and answers == [(True, calls[1])]


def test_a_proposal_on_a_stale_set_or_after_losing_mastership_is_refused(
        controller: Controller, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller, "_cas_state", lambda new: pytest.fail("no set to write"))
    answers = propose(controller, based_on=2)  # the set moved on since (epoch 3, not {1, 2})
    controller._carry_out_proposal()
    assert answers == [(False, controller.state)]
    answers = propose(controller)
    controller._mastered = None  # the session was lost meanwhile
    controller._carry_out_proposal()
    assert answers == [(False, controller.state)] and controller._proposal is None
    assert controller.stats.sss_change_failures == 2
