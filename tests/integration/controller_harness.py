"""Controller-mode groups for tests: a local ZooKeeper (``common/cli/zookeeper.py``), brokers
with ``enableControllerMode``, and waits (with deadlines) for the group to settle.

Without ZooKeeper installed these tests skip, saying what to install; with
``REPLOG_REQUIRE_ZOOKEEPER=1`` (``.ci/run`` sets it) a missing ZooKeeper fails them instead, so
CI cannot pass them by skipping.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from replication_harness import wait_for

from common.cli import zookeeper
from common.cli.zookeeper import Ensemble

REQUIRE_ENV = "REPLOG_REQUIRE_ZOOKEEPER"
MASTER_ROLES = ("SYNC_MASTER", "ASYNC_MASTER")
SESSION_MS = 3000  # short sessions keep failovers (and tests) short; tickTime 250 allows them
CONTROLLER_FIELDS: dict[str, Any] = {
    "enableControllerMode": True,
    "controllerSessionTimeoutMs": SESSION_MS,
    "controllerPollIntervalMs": 500,
    "haMaxTimeSlaveNotCatchup": 3000,
    "slaveTimeout": 1000,
    "haSendHeartbeatInterval": 200,
    "haHousekeepingInterval": 2000,
}


def need_zookeeper() -> None:
    problem = zookeeper.missing()
    if not problem:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {problem}")
    pytest.skip(problem)


@contextlib.contextmanager
def running_zookeeper(directory: Path, size: int = 1, tick_ms: int = 250) -> Iterator[Ensemble]:
    """A fresh ensemble, killed by pid on the way out whatever happened."""
    need_zookeeper()
    ensemble = Ensemble(directory, size, tick_ms)
    try:
        ensemble.start()
        yield ensemble
    finally:
        ensemble.kill()


def controller_fields(controller_addr: str, member_id: int, role: str = "SYNC_MASTER",
                      **extra: Any) -> dict[str, Any]:
    """A member's config: ``controller_addr`` is hosts[/chroot] (one chroot per test)."""
    return {**CONTROLLER_FIELDS, "controllerAddr": controller_addr, "brokerId": member_id,
            "brokerRole": role, **extra}


def chroot() -> str:
    return "/t-" + uuid.uuid4().hex[:12]


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
