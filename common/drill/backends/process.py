"""The process backend: faults on local broker processes by signal (``replog drill --backend
process`` runs it on a ``replog cluster up`` group it starts itself).

The group's processes are handed in (``ProcessBroker``); this module starts none of its own,
so it stays in the drill layer (core, format, client). No partitions: the brokers and
ZooKeeper share 127.0.0.1, there is no network between them to cut.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from common.drill.backends import PARTITION_BOTH, PARTITION_SLAVES, PARTITION_ZK, DrillNode
from common.drill.workload import wait_for

STOP_TIMEOUT_S = 30.0  # a SIGTERMed broker drains and exits within this, or is SIGKILLed


class ProcessBroker(Protocol):
    """A broker process of the group: ``process`` is None before its first start."""

    @property
    def name(self) -> str: ...

    @property
    def member_id(self) -> int: ...

    @property
    def address(self) -> str: ...  # 127.0.0.1:listenPort

    @property
    def process(self) -> subprocess.Popen[bytes] | None: ...

    def start(self) -> None: ...  # (re)start it from its unchanged config


class ProcessBackend:
    name = "process"

    def __init__(self, brokers: Sequence[ProcessBroker]):
        self._brokers = {b.name: b for b in brokers}
        self._paused: set[str] = set()
        self._down: set[str] = set()

    def nodes(self) -> list[DrillNode]:
        return [DrillNode(b.name, b.member_id, b.address, int(b.address.rpartition(":")[2]))
                for b in self._brokers.values()]

    def unsupported(self, fault: str) -> str:
        if fault in (PARTITION_ZK, PARTITION_SLAVES, PARTITION_BOTH):
            return ("the process backend cannot partition: its brokers and ZooKeeper share "
                    "127.0.0.1 (run the compose cluster and use --backend docker)")
        return ""

    def _process(self, node: DrillNode) -> subprocess.Popen[bytes]:
        proc = self._brokers[node.name].process
        if proc is None or proc.poll() is not None:
            raise RuntimeError(f"{node.name} is not running")
        return proc

    def kill(self, node: DrillNode) -> None:
        proc = self._process(node)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        self._down.add(node.name)

    def start(self, node: DrillNode) -> None:
        self._brokers[node.name].start()
        self._down.discard(node.name)

    def restart(self, node: DrillNode) -> None:
        proc = self._process(node)
        proc.send_signal(signal.SIGTERM)
        self._down.add(node.name)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        self.start(node)

    def pause(self, node: DrillNode) -> None:
        pid = self._process(node).pid
        os.kill(pid, signal.SIGSTOP)
        self._paused.add(node.name)
        # kill() returns before the signal reached threads running on another CPU
        wait_for(lambda: all_threads_stopped(pid), 5.0, f"pid {pid} to stop", step_s=0.001)

    def resume(self, node: DrillNode) -> None:
        os.kill(self._process(node).pid, signal.SIGCONT)
        self._paused.discard(node.name)

    def partition(self, node: DrillNode, side: str) -> None:
        raise RuntimeError(self.unsupported(PARTITION_ZK))

    def heal(self, node: DrillNode, side: str) -> None:
        raise RuntimeError(self.unsupported(PARTITION_ZK))

    def heal_all(self) -> None:
        for name in sorted(self._paused):
            proc = self._brokers[name].process
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
        self._paused.clear()
        for name in sorted(self._down):
            broker = self._brokers[name]
            if broker.process is None or broker.process.poll() is not None:
                broker.start()
        self._down.clear()

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name,
                "pids": {b.name: b.process.pid if b.process else None
                         for b in self._brokers.values()}}


def all_threads_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (SIGSTOP takes effect thread by thread)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:
            continue  # the thread exited
        if stat[stat.rindex(")") + 2] not in "tT":
            return False
    return True
