"""A controller-mode broker group seen through its brokers' status answers: the one master
every answering broker agrees on, and waits (with deadlines) for the group to settle.

A status is ``None`` for a broker that did not answer (killed, paused, cut off).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from common.drill.workload import wait_for

MASTER_ROLES = ("SYNC_MASTER", "ASYNC_MASTER")


def master_of(statuses: Sequence[dict[str, Any] | None]) -> int | None:
    """The index of the one broker every answering broker agrees is the serving master."""
    serving = [i for i, s in enumerate(statuses)
               if s is not None and s["role"] in MASTER_ROLES
               and s["controller"]["isMaster"] and s["controller"]["leaseFresh"]]
    if len(serving) != 1:
        return None
    master = statuses[serving[0]]
    assert master is not None
    member = master["controller"]["memberId"]
    for s in statuses:
        if s is not None and s["controller"]["masterId"] != member:
            return None
    return serving[0]


def wait_master(status_of: Callable[[], Sequence[dict[str, Any] | None]], timeout_s: float = 30.0,
                followers: int | None = None) -> tuple[int, list[dict[str, Any] | None]]:
    """Wait until one serving master is agreed on and ``followers`` slaves replicate from it
    (None: every other answering broker); (its index, the statuses)."""

    def settled() -> tuple[int, list[dict[str, Any] | None]] | None:
        statuses = list(status_of())
        index = master_of(statuses)
        if index is None:
            return None
        master = statuses[index]
        assert master is not None
        slaves = [s for i, s in enumerate(statuses) if s is not None and i != index]
        following = [s for s in slaves if s["role"] == "SLAVE"
                     and s["haMasterAddress"] == master["haAddress"]]
        want = len(slaves) if followers is None else followers
        return (index, statuses) if len(following) >= want else None

    return wait_for(settled, timeout_s, "an elected master and its followers", step_s=0.05)


def wait_sync_state_set(status_of: Callable[[], dict[str, Any]], members: set[int],
                        timeout_s: float = 30.0) -> dict[str, Any]:
    """Wait until the master's committed SyncStateSet is ``members``."""

    def done() -> dict[str, Any] | None:
        s = status_of()
        return s if set(s["controller"]["syncStateSet"]) == members else None

    return wait_for(done, timeout_s, f"SyncStateSet {sorted(members)}", step_s=0.05)
