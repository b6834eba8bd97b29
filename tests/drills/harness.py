"""The process drill harness (docs/drills.md): brokers as real processes on free ports, faults
by signal and by relay, the final heal and byte comparison of the replicas' files.

The history, the workload and the checker are package code (``common/drill``: ``history``,
``workload``, ``checker``), shared with ``replog drill``; they are re-exported here under the
names the drills import.

* ``Drill``: a context manager owning every process, relay and worker of one run; ``finally``
  kills every broker by pid. ``finish`` drains every queue from every replica, byte-compares the
  replicas' CommitLogs over their common range, and records one JSON result (``RESULTS``).
* Several broker groups (``finish_groups``): a message's group is part of its queue's identity
  (``group`` in the history, ``(group, queue)`` in the drains), each group is drained, its
  replicas byte-compared among themselves, and lost / unexpected are also counted per group.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from broker_harness import BrokerProcess, free_port, run_cli
from controller_harness import controller_fields, wait_master
from replication_harness import Relay, commitlog_digest, stop_process, wait_for

from common.core.errors import BrokerError
from common.drill.checker import (  # noqa: F401 - re-exported for the drills
    check_total_queue,
    judge,
    put_latencies_ms,
    rto_after,
)
from common.drill.history import (  # noqa: F401 - re-exported for the drills
    CLIENT_TIMEOUT_MS,
    FAIL_CODES,
    QUEUES,
    TOPIC,
    History,
    classify,
    handler_of,
    make_body,
    parse_body,
)
from common.drill.workload import (  # noqa: F401 - re-exported for the drills
    ConsumerWorker,
    ProducerWorker,
    Worker,
    burst,
    drain,
    ok_puts,
    wait_more_puts,
)

RESULTS: list[dict[str, Any]] = []  # one per drill run; conftest prints them at the end
CURRENT_TEST = ""  # the pytest node id of the running drill (set by conftest)

SEGMENT_BYTES = 1024 * 1024
BROKER_DEFAULTS: dict[str, Any] = {
    "mappedFileSizeCommitLog": SEGMENT_BYTES,
    "slaveTimeout": 1000,
    "haHousekeepingInterval": 2000,
    "haSendHeartbeatInterval": 200,
    "haTransferBatchSize": 32 * 1024,
}


# ---- nodes and the run ------------------------------------------------------------------------
class Node:
    """One broker's home, client port and slave id across restarts in different roles."""

    def __init__(self, drill: Drill, name: str, slave_id: int, **fields: Any):
        self.drill = drill
        self.name = name
        self.home = drill.tmp / name
        self.port = free_port()
        self.slave_id = slave_id
        self.fields = {**BROKER_DEFAULTS, **fields}
        self.proc: BrokerProcess | None = None
        self.extra_env: dict[str, str] = {}  # e.g. a skewed wall clock (row 15)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ha_address(self) -> str:
        return f"127.0.0.1:{self.port + 1}"

    @property
    def store_root(self) -> Path:
        return self.home / "store"

    @property
    def pid(self) -> int:
        assert self.proc is not None and self.proc.proc is not None
        return self.proc.proc.pid

    def start_controlled(self, controller_addr: str, role: str = "SYNC_MASTER",
                         **extra: Any) -> None:
        """Start in controller mode: ZooKeeper picks the role; ``role`` is the mode it runs
        as master; the node's slave id is its member id."""
        fields = {**self.fields, **controller_fields(controller_addr, self.slave_id, role),
                  **extra}
        fields.pop("brokerRole")
        proc = BrokerProcess(self.home, self.extra_env, listenPort=self.port, brokerRole=role,
                             **fields)
        self.drill.procs.append(proc)
        self.proc = proc
        proc.start()
        self.drill.history.fault("start", node=self.name, role="controlled", pid=proc.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.proc is not None \
            and self.proc.proc.poll() is None

    def try_status(self) -> dict[str, Any] | None:
        if not self.alive():
            return None
        try:
            return self.status()
        except BrokerError:
            return None

    def start(self, role: str, master: Node | None = None, ha_address: str | None = None) -> None:
        fields = dict(self.fields)
        if role == "SLAVE":
            assert master is not None or ha_address is not None
            fields.update(brokerId=self.slave_id, haMasterAddress=ha_address or master.ha_address)  # type: ignore[union-attr]
        else:
            fields.update(brokerId=0, haMasterAddress="")
        proc = BrokerProcess(self.home, self.extra_env, listenPort=self.port, brokerRole=role,
                             **fields)
        self.drill.procs.append(proc)
        self.proc = proc
        proc.start()
        self.drill.history.fault("start", node=self.name, role=role, pid=proc.pid)

    def kill(self) -> None:
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        assert self.proc is not None and self.proc.proc is not None
        self.proc.proc.wait(10)
        self.drill.faults.append(self.drill.history.fault("kill", node=self.name, pid=pid))

    def pause(self) -> None:
        stop_process(self.pid)
        self.drill.faults.append(self.drill.history.fault("pause", node=self.name, pid=self.pid))

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.drill.faults.append(self.drill.history.fault("resume", node=self.name, pid=self.pid))

    def status(self) -> dict[str, Any]:
        assert self.proc is not None
        return self.proc.status()

    def log_text(self) -> str:
        return (self.home / "broker.log").read_text(errors="replace")


class Drill:
    """One run: nodes, workers, relays, history; kills everything in ``close``."""

    def __init__(self, name: str, tmp: Path, seed: int | None = None):
        self.name = name
        self.tmp = tmp
        self.seed = (
            seed
            if seed is not None
            else int(os.environ.get("DRILL_SEED", "0") or 0)
            or (int.from_bytes(os.urandom(4), "big"))
        )
        self.rng = random.Random(self.seed)
        self.history = History(tmp / f"{name}-history.jsonl")
        self.procs: list[BrokerProcess] = []
        self.relays: list[Relay] = []
        self.workers: list[Worker] = []
        self.started = time.monotonic()
        self.extra: dict[str, Any] = {}
        self.faults: list[dict[str, Any]] = []
        self.result: dict[str, Any] | None = None

    def __enter__(self) -> Self:
        print(f"[drill {self.name}] seed={self.seed} history={self.history.path}")
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close(failed=exc_type is not None)

    def node(self, name: str, slave_id: int, **fields: Any) -> Node:
        return Node(self, name, slave_id, **fields)

    def relay(self, target_port: int) -> Relay:
        relay = BudgetRelay(target_port)
        self.relays.append(relay)
        return relay

    def add_worker(self, worker: Worker) -> Worker:
        self.workers.append(worker)
        worker.start()
        return worker

    def stop_workers(self) -> None:
        for w in self.workers:
            w.stop()
        for w in self.workers:
            w.join(CLIENT_TIMEOUT_MS / 1000 * 3 + 10)
            assert not w.is_alive(), f"worker {w.name} did not stop"
        errors = [f"{w.name}: {w.error!r}" for w in self.workers if w.error is not None]
        assert not errors, errors

    def promote(self, node: Node, role: str = "SYNC_MASTER", cli: bool = False) -> dict[str, Any]:
        t = self.history.now()
        if cli:
            code, doc = run_cli("promote", "-s", node.address, "--role", role)
            assert code == 0 and doc is not None, (code, doc)
        else:
            from common.client import Admin

            with Admin([node.address], timeout_ms=15_000, retries=0) as admin:
                doc = admin.promote(node.address, role=role)
        fault = self.history.fault(
            "promote",
            node=node.name,
            epoch=doc.get("epoch"),
            maxPhyOffset=doc.get("maxPhyOffset"),
            took_s=round(self.history.now() - t, 3),
        )
        self.faults.append(fault)
        return doc

    def wait_controller_master(self, nodes: list[Node], timeout_s: float = 30.0) -> Node:
        """The node the controller elected, once the live ``nodes`` all follow it."""
        index, _ = wait_master(lambda: [n.try_status() for n in nodes], timeout_s)
        return nodes[index]

    def start_group(self, master: Node, role: str, *slaves: Node) -> None:
        """``master`` in ``role``, ``slaves`` replicating from it, at least one in sync."""
        master.start(role)
        for slave in slaves:
            slave.start("SLAVE", master=master)
        self.wait_slave_in_sync(master)

    def add_load(self, servers: list[str], producers: int, rate: float, size: int = 512,
                 consumer: bool = True) -> None:
        """``producers`` workers of ``rate`` puts/s each through the client, and a consumer."""
        for i in range(producers):
            self.add_worker(ProducerWorker(self.history, servers, f"p{i}", rate, size=size,
                                           seed=self.seed))
        if consumer:
            self.add_worker(ConsumerWorker(self.history, servers))

    def wait_slave_in_sync(self, master: Node, timeout_s: float = 30.0) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            for s in master.status()["slaves"]:
                if s["inSync"]:
                    return s
            return None

        return wait_for(ready, timeout_s, f"a slave in sync at {master.name}", step_s=0.05)

    def wait_converged(self, master: Node, slaves: list[Node], timeout_s: float = 60.0) -> int:
        def same() -> int | None:
            m = master.status()["maxPhyOffset"]
            return m if all(s.status()["maxPhyOffset"] == m for s in slaves) else None

        return wait_for(same, timeout_s, "the replicas to reach the master's max", step_s=0.05)

    def compare_logs(self, nodes: list[Node]) -> dict[str, Any]:
        """Byte comparison of every replica's CommitLog with the first's over the common range."""
        stats = [n.status() for n in nodes]
        lo = max(s["minPhyOffset"] for s in stats)
        hi = min(s["maxPhyOffset"] for s in stats)
        digests = {
            n.name: commitlog_digest(n.store_root, lo, hi, n.fields["mappedFileSizeCommitLog"])
            for n in nodes
        }
        identical = len(set(digests.values())) == 1
        return {"range": [lo, hi], "identical": identical}

    def finish(
        self,
        master: Node,
        replicas: list[Node],
        extra_checks: Callable[[dict[str, Any]], list[str]] | None = None,
        loss_allowed: Callable[[str], bool] | None = None,
    ) -> dict[str, Any]:
        """Stop the workload, converge, drain every queue from every replica, compare, check."""
        self.stop_workers()
        converged_at = self.wait_converged(master, replicas)
        servers = [master.address, *(r.address for r in replicas)]
        final = drain(master.address, servers)
        replica_drains_equal = all(drain(r.address, servers) == final for r in replicas)
        logs = self.compare_logs([master, *replicas])
        summary = check_total_queue(self.history.events, final)
        summary.update(
            drill=self.name,
            seed=self.seed,
            wall_s=round(time.monotonic() - self.started, 1),
            converged_max=converged_at,
            logs_identical=logs["identical"],
            compared_range=logs["range"],
            replica_drains_equal=replica_drains_equal,
            faults=[
                {k: f[k] for k in ("t", "status", "node", "epoch") if k in f}
                | {"rto_s": rto_after(self.history.events, f["t"])}
                for f in self.faults
            ],
            **self.extra,
        )
        # loss_allowed, e.g. ASYNC: acked bytes the promoted slave never had
        problems = judge(summary, logs_identical=logs["identical"],
                         compared_range=logs["range"],
                         replica_drains_equal=replica_drains_equal, loss_allowed=loss_allowed)
        summary["final_ids"] = final
        if extra_checks is not None:
            problems.extend(extra_checks(summary))
        summary.pop("final_ids")
        return self.record(summary, problems)

    def finish_groups(
        self,
        groups: dict[str, tuple[Node, list[Node]]],
        extra_checks: Callable[[dict[str, Any]], list[str]] | None = None,
    ) -> dict[str, Any]:
        """``finish`` over several broker groups: group -> (its master, its replicas). Each
        group converges, is drained from its master and from each replica (the same
        messages), and its replicas' CommitLogs are byte-compared; a queue is (group, id).
        The total-queue figures are given for the whole run and per group (a put's group is
        the one its result or invocation named)."""
        self.stop_workers()
        final: dict[Any, list[tuple[int, str, bool]]] = {}
        per_group: dict[str, dict[str, Any]] = {}
        for name, (master, replicas) in sorted(groups.items()):
            converged_at = self.wait_converged(master, replicas)
            servers = [master.address, *(r.address for r in replicas)]
            mine = drain(master.address, servers)
            equal = all(drain(r.address, servers) == mine for r in replicas)
            final.update({(name, q): rows for q, rows in mine.items()})
            logs = self.compare_logs([master, *replicas])
            per_group[name] = {"converged_max": converged_at, "logs_identical": logs["identical"],
                               "compared_range": logs["range"], "replica_drains_equal": equal,
                               "final_messages": sum(len(r) for r in mine.values())}
        summary = check_total_queue(self.history.events, final)
        put_group: dict[str, str] = {}
        for e in self.history.events:
            if e["op"] == "put" and e.get("group"):
                put_group.setdefault(e["msg_id"], e["group"])
        lost_ids = summary.pop("lost_ids_all")
        for name, figures in per_group.items():
            puts = [e for e in self.history.events if e["op"] == "put" and e["type"] != "invoke"
                    and put_group.get(e["msg_id"]) == name]
            figures.update(
                ok=sum(e["type"] == "ok" for e in puts), fail=sum(e["type"] == "fail" for e in puts),
                info=sum(e["type"] == "info" for e in puts),
                lost=sum(put_group.get(m) == name for m in lost_ids))
        misplaced = [m for (name, _), rows in final.items() for _, m, _ in rows
                     if put_group.get(m) not in (None, name)]
        summary.update(
            drill=self.name, seed=self.seed, wall_s=round(time.monotonic() - self.started, 1),
            groups=per_group, misplaced=len(misplaced),
            unattributed=sum(1 for e in self.history.events if e["op"] == "put"
                             and e["type"] != "invoke" and put_group.get(e["msg_id"]) in
                             (None, "?")),
            faults=[{k: f[k] for k in ("t", "status", "node", "epoch") if k in f}
                    | {"rto_s": rto_after(self.history.events, f["t"])} for f in self.faults],
            **self.extra)
        problems = [f"{key}={summary[key]}" for key in
                    ("lost", "unexpected", "failed_but_read", "corrupt", "queue_gaps",
                     "misplaced") if summary[key]]
        for name, figures in per_group.items():
            if figures["lost"]:
                problems.append(f"{name}: lost={figures['lost']}")
            if not figures["logs_identical"]:
                problems.append(f"{name}: replica CommitLogs differ in "
                                f"{figures['compared_range']}")
            if not figures["replica_drains_equal"]:
                problems.append(f"{name}: replicas serve different messages")
        if extra_checks is not None:
            problems.extend(extra_checks(summary))
        return self.record(summary, problems)

    def record(self, summary: dict[str, Any], problems: list[str]) -> dict[str, Any]:
        summary.setdefault("drill", self.name)
        summary.setdefault("seed", self.seed)
        summary.setdefault("wall_s", round(time.monotonic() - self.started, 1))
        summary["problems"] = problems
        summary["verdict"] = "pass" if not problems else "fail"
        self.result = summary
        return summary

    def close(self, failed: bool) -> None:
        for w in self.workers:
            w.stop()
        for p in self.procs:
            try:
                if p.proc is not None and p.proc.poll() is None:
                    os.kill(p.proc.pid, signal.SIGCONT)  # a stopped process dies on SIGKILL too
            except ProcessLookupError:
                pass
            p.close()
        for w in self.workers:
            w.join(CLIENT_TIMEOUT_MS / 1000 * 3 + 10)
        for r in self.relays:
            r.close()
        self.history.close()
        result = self.result or {
            "drill": self.name,
            "seed": self.seed,
            "verdict": "fail",
            "problems": ["the drill raised before its check"],
            "wall_s": round(time.monotonic() - self.started, 1),
        }
        if failed and result.get("verdict") == "pass":
            result = {**result, "verdict": "fail", "problems": ["the drill raised after its check"]}
        keep = result.get("verdict") != "pass"
        result["test"] = CURRENT_TEST
        result["history"] = str(self.history.path) if keep else None
        RESULTS.append(result)
        print(json.dumps(result, sort_keys=True))
        if keep:
            print(f"[drill {self.name}] history kept at {self.history.path}")
        else:
            self.history.path.unlink(missing_ok=True)


class BudgetRelay(Relay):
    """The integration relay plus a byte budget for the master->slave direction: once
    ``budget`` bytes went downstream, it blackholes (the slave got a little, then a partition)."""

    def __init__(self, target_port: int):
        super().__init__(target_port)
        self.budget: int | None = None
        self.forwarded_down = 0

    def _pump(self, s: Any) -> None:
        if self.budget is not None and s in self._peer:
            try:
                upstream = s.getpeername()[1] == self.target[1]
            except OSError:
                upstream = False
            if upstream and self.forwarded_down >= self.budget:
                self.blackhole()
            elif upstream:
                try:
                    data = s.recv(min(256 * 1024, max(1, self.budget - self.forwarded_down)))
                except OSError:
                    data = b""
                if not data:
                    self._drop_pair(s)
                    return
                self.forwarded_down += len(data)
                try:
                    self._peer[s].sendall(data)
                except OSError:
                    self._drop_pair(s)
                return
        super()._pump(s)
