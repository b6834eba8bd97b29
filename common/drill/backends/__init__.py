"""Fault primitives of the drills: one backend per way of running a broker group.

A ``Backend`` knows the group's brokers (``DrillNode``: a name, its member id, the client
address this process reaches it at, and the listenPort its msgIds carry) and injects faults on
one of them. Everything else (load, waits, checks, the report) is ``common.drill.scenario``,
the same for every backend.

    process  local broker processes (``replog cluster up``'s group): SIGKILL, SIGTERM and a
             restart, SIGSTOP/SIGCONT. No partitions: its brokers share 127.0.0.1.
    docker   the compose project's containers through the Docker SDK: docker kill, restart,
             docker pause, and ``docker network disconnect``/``connect`` of the master from
             ZooKeeper's network, from its slaves' network, or both.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

# Fault kinds, as ``replog drill --faults`` names them.
KILL = "kill"  # SIGKILL the master; start it again once another is elected
RESTART = "restart"  # SIGTERM the master (it leaves the group at once), start it again
PAUSE = "pause"  # freeze the master for twice the session timeout (a zombie), then thaw it
PARTITION_ZK = "partition-zk"  # cut the master from ZooKeeper until another is elected
PARTITION_SLAVES = "partition-slaves"  # cut the master from its slaves for two sessions
PARTITION_BOTH = "partition-both"  # both cuts at once, until another is elected
FAULTS = (KILL, RESTART, PAUSE, PARTITION_ZK, PARTITION_SLAVES, PARTITION_BOTH)
ZOOKEEPER_SIDE = "zookeeper"
SLAVES_SIDE = "slaves"


class DrillError(RuntimeError):
    """A drill that cannot run as asked (no engine, no such project, a missing package); the
    message says what to do."""


@dataclasses.dataclass(frozen=True)
class DrillNode:
    """One broker of the group under test."""

    name: str
    member_id: int  # brokerId: its member id in controller mode
    address: str  # client address, as this process reaches it
    listen_port: int  # listenPort: the port in the STOREHOST (so the msgIds) of its records

    def stored(self, handler: str) -> bool:
        """Whether a record whose msgId names ``handler`` (ip:port) was stored by this broker
        (its port: the brokers of a group listen on distinct ports, in containers too)."""
        return handler.rpartition(":")[2] == str(self.listen_port)


class Backend(Protocol):
    """What a scenario asks of a backend. Every call returns once the fault is in effect."""

    name: str

    def nodes(self) -> list[DrillNode]: ...

    def unsupported(self, fault: str) -> str: ...  # "" if it can inject ``fault``, else why

    def kill(self, node: DrillNode) -> None: ...  # SIGKILL; returns once it is dead

    def start(self, node: DrillNode) -> None: ...  # start a killed broker again

    def restart(self, node: DrillNode) -> None: ...  # SIGTERM, its exit, a start

    def pause(self, node: DrillNode) -> None: ...

    def resume(self, node: DrillNode) -> None: ...

    def partition(self, node: DrillNode, side: str) -> None: ...  # ZOOKEEPER_SIDE, SLAVES_SIDE

    def heal(self, node: DrillNode, side: str) -> None: ...

    def heal_all(self) -> None: ...  # undo every fault still in effect (a run's finally)

    def describe(self) -> dict[str, Any]: ...  # for the report
