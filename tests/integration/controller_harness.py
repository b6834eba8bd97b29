"""Controller-mode groups for tests: a local ZooKeeper (``common/cli/zookeeper.py``), brokers
with ``enableControllerMode``, and waits (with deadlines) for the group to settle.

Without ZooKeeper installed these tests skip, saying what to install; with
``REPLOG_REQUIRE_ZOOKEEPER=1`` (``.ci/run`` sets it) a missing ZooKeeper fails them instead, so
CI cannot pass them by skipping.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest
from broker_harness import BrokerProcess

from common.cli import zookeeper
from common.cli.zookeeper import Ensemble
from common.client import Admin, Consumer
from common.core.errors import BrokerError
from common.core.message import MessageExt

# the group waits live in common.drill.group (the drills' package code); tests import them here
from common.drill.group import master_of, wait_master, wait_sync_state_set  # noqa: F401

REQUIRE_ENV = "REPLOG_REQUIRE_ZOOKEEPER"
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


class Group:
    """Brokers in controller mode, stopped by pid on the way out."""

    def __init__(self, tmp: Path, controller: str | list[str], size: int = 3,
                 role: str = "SYNC_MASTER", defaults: bool = False,
                 extra_env: dict[str, str] | None = None, **fields: Any):
        """``defaults``: every timing at its default (else the short failure detection of
        CONTROLLER_FIELDS, which keeps failovers, and tests, short). ``extra_env``: each
        broker process's environment on top of the harness's."""
        addrs = controller if isinstance(controller, list) else [controller] * size

        def config(i: int) -> dict[str, Any]:
            if defaults:
                return {"enableControllerMode": True, "controllerAddr": addrs[i],
                        "brokerId": i + 1, "brokerRole": role, **fields}
            return controller_fields(addrs[i], i + 1, role, **fields)

        self.procs = [BrokerProcess(tmp / f"b{i + 1}", extra_env=extra_env, **config(i))
                      for i in range(size)]

    def __enter__(self) -> Self:
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.proc is not None and p.proc.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
            p.close()

    def statuses(self) -> list[dict[str, Any] | None]:
        out: list[dict[str, Any] | None] = []
        for p in self.procs:
            if p.proc is None or p.proc.poll() is not None:
                out.append(None)
                continue
            try:
                with Admin([p.address], timeout_ms=1000, retries=0) as a:
                    out.append(a.status(p.address))
            except BrokerError:
                out.append(None)
        return out

    def master(self, timeout_s: float = 30.0) -> BrokerProcess:
        index, _ = wait_master(self.statuses, timeout_s)
        return self.procs[index]

    def kill_master(self, timeout_s: float = 30.0) -> float:
        """SIGKILL the master, wait for another member to be elected, and start the old one
        again (it rejoins as a slave); the seconds from the kill to the new master."""
        master = self.master(timeout_s)
        killed = time.monotonic()
        os.kill(master.pid, signal.SIGKILL)
        master.proc.wait(timeout_s)  # type: ignore[union-attr]
        new = self.master(timeout_s)
        took = time.monotonic() - killed
        assert new is not master
        master.start()
        return round(took, 2)

    @property
    def addresses(self) -> list[str]:
        return [p.address for p in self.procs]


def read_queue(addresses: list[str], topic: str, queue_id: int = 0) -> list[MessageExt]:
    """Every message of one queue, from its start (a drill's final count)."""
    out: list[MessageExt] = []
    offset = 0
    with Consumer(addresses, group="drill-check") as c:
        while True:
            got = c.pull(topic, queue_id, offset, 256)
            if not got.messages:
                return out
            out += got.messages
            offset = got.next_begin_offset
