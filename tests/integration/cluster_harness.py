"""Several broker groups of one cluster on one ZooKeeper, for tests and drills: real broker
processes in controller mode (``controller_harness``), one ``brokerName`` per group, killed by
pid on the way out whatever happened.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from broker_harness import BrokerProcess
from controller_harness import controller_fields, wait_master
from replication_harness import wait_for

from common.client import Admin
from common.core.errors import BrokerError

CLUSTER = "c"


def group_name(index: int) -> str:
    return f"broker-{chr(ord('a') + index)}"


class Groups:
    """``groups`` broker groups of ``size`` brokers each (member ids 1..size), all in
    controller mode on ``controller`` (hosts/chroot) under one ``brokerClusterName``."""

    def __init__(self, tmp: Path, controller: str, groups: int = 2, size: int = 2,
                 role: str = "SYNC_MASTER",
                 group_fields: Mapping[str, Mapping[str, Any]] | None = None, **fields: Any):
        """``fields``: every broker's config; ``group_fields``: a group's own, over them."""
        self.tmp = tmp
        self.controller = controller
        self.role = role
        self.fields = fields
        self.group_fields = {name: dict(f) for name, f in (group_fields or {}).items()}
        self.size = size
        self.groups: dict[str, list[BrokerProcess]] = {}
        for g in range(groups):
            self.add(group_name(g), start=False)

    def add(self, name: str, start: bool = True) -> list[BrokerProcess]:
        """A group's brokers (started with ``start``: a group added to a running cluster)."""
        procs = [BrokerProcess(self.tmp / f"{name}-{i + 1}", brokerName=name,
                               brokerClusterName=CLUSTER,
                               **controller_fields(self.controller, i + 1, self.role,
                                                   **{**self.fields,
                                                      **self.group_fields.get(name, {})}))
                 for i in range(self.size)]
        self.groups[name] = procs
        if start:
            for p in procs:
                p.start()
        return procs

    def __enter__(self) -> Self:
        try:
            for procs in self.groups.values():
                for p in procs:
                    p.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for procs in self.groups.values():
            for p in procs:
                if p.proc is not None and p.proc.poll() is None:
                    os.kill(p.pid, signal.SIGCONT)  # a stopped process dies on SIGKILL too
                p.close()

    @property
    def servers(self) -> list[str]:
        return [p.address for procs in self.groups.values() for p in procs]

    def statuses(self, name: str) -> list[dict[str, Any] | None]:
        out: list[dict[str, Any] | None] = []
        for p in self.groups[name]:
            if p.proc is None or p.proc.poll() is not None:
                out.append(None)
                continue
            try:
                with Admin([p.address], timeout_ms=1000, retries=0) as a:
                    out.append(a.status(p.address))
            except BrokerError:
                out.append(None)
        return out

    def master(self, name: str, timeout_s: float = 30.0) -> BrokerProcess:
        """The group's elected master, once its live brokers follow it."""
        index, _ = wait_master(lambda: self.statuses(name), timeout_s)
        return self.groups[name][index]

    def masters(self, timeout_s: float = 30.0) -> dict[str, BrokerProcess]:
        return {name: self.master(name, timeout_s) for name in self.groups}

    def wait_in_sync(self, name: str, timeout_s: float = 30.0) -> None:
        """Until the group's SyncStateSet holds every live member (SYNC puts are answered)."""
        master = self.master(name, timeout_s)

        def full() -> bool:
            ctl = master.status()["controller"]
            live = [p for p in self.groups[name] if p.proc is not None and p.proc.poll() is None]
            return len(ctl["syncStateSet"]) == len(live)

        wait_for(full, timeout_s, f"{name}'s SyncStateSet to hold every member", step_s=0.05)

    def wait_route(self, topic: str, layout: dict[str, int], timeout_s: float = 10.0) -> None:
        """Until every live broker answers CLUSTER_INFO with ``topic`` laid out as ``layout``."""

        def seen() -> bool:
            live = [p.address for procs in self.groups.values() for p in procs
                    if p.proc is not None and p.proc.poll() is None]
            for address in live:
                try:
                    with Admin([address], timeout_ms=1000, retries=0) as a:
                        doc = a.cluster_info(address)
                except BrokerError:
                    return False
                got = {g["brokerName"]: g["topics"].get(topic) for g in doc["groups"]
                       if topic in g["topics"]}
                if got != layout:
                    return False
            return True

        wait_for(seen, timeout_s, f"every broker's route of {topic} to be {layout}", step_s=0.1)
