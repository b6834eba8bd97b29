"""The drill harness (docs/drills.md): history, workload, faults, checker, final heal and compare.

* ``History``: JSON lines ``{t, proc, op: put|get|fault, type: invoke|ok|fail|info, msg_id,
  queue, offset, status}`` (plus a few extra fields: ``handler`` = the broker that stored a put,
  from its msgId; ``phy`` = its CommitLog offset). ``t`` is seconds since the run began
  (monotonic). The file is kept when a run fails (its path is printed), deleted otherwise.
* Bodies: ``<msg_id>|<crc32 hex>|<payload>``; ``msg_id`` = producer id + sequence; the CRC covers
  the id and the payload, so a read proves it got exactly what was sent.
* Put status mapping: SEND_OK -> ok; FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE,
  FLUSH_DISK_TIMEOUT, client timeout, connection lost, anything unknown -> info; an explicit
  refusal before the append (SERVICE_NOT_AVAILABLE, MESSAGE_ILLEGAL, TOPIC_NOT_EXIST,
  BAD_REQUEST) -> fail.
* ``check_total_queue``: Jepsen's total-queue over the history and the final drain: lost (ok,
  never in the final drain), unexpected (read, never attempted), duplicated, recovered (info
  found), failed-but-read (a "fail" that is on the log: a lie to the producer), corrupt bodies.
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
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Self

from broker_harness import BrokerProcess, free_port, run_cli
from controller_harness import controller_fields, wait_master
from replication_harness import Relay, commitlog_digest, stop_process, wait_for

from common.client import ClientTimeoutError, Consumer, NoMasterError, Producer
from common.core.errors import BrokerError, PullStatus, ResponseCode, SendStatus
from common.core.message import decode_msg_id

RESULTS: list[dict[str, Any]] = []  # one per drill run; conftest prints them at the end
CURRENT_TEST = ""  # the pytest node id of the running drill (set by conftest)

TOPIC = "drill"
QUEUES = 4
CLIENT_TIMEOUT_MS = 3000  # > slaveTimeout, so FLUSH_SLAVE_TIMEOUT reaches the producer
SEGMENT_BYTES = 1024 * 1024
BROKER_DEFAULTS: dict[str, Any] = {
    "mappedFileSizeCommitLog": SEGMENT_BYTES,
    "slaveTimeout": 1000,
    "haHousekeepingInterval": 2000,
    "haSendHeartbeatInterval": 200,
    "haTransferBatchSize": 32 * 1024,
}
FAIL_CODES = frozenset(
    {
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.MESSAGE_ILLEGAL,
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.BAD_REQUEST,
    }
)


# ---- history ----------------------------------------------------------------------------------
class History:
    """Thread-safe JSON-lines history, also kept in memory for the checker."""

    def __init__(self, path: Path):
        self.path = path
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.events: list[dict[str, Any]] = []

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 4)

    def add(self, proc: str, op: str, type_: str, **fields: Any) -> dict[str, Any]:
        event = {"t": self.now(), "proc": proc, "op": op, "type": type_, **fields}
        with self._lock:
            self.events.append(event)
            if not self._file.closed:
                self._file.write(json.dumps(event, sort_keys=True) + "\n")
        return event

    def fault(self, what: str, **fields: Any) -> dict[str, Any]:
        return self.add("nemesis", "fault", "info", status=what, **fields)

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()


# ---- bodies -----------------------------------------------------------------------------------
def make_body(msg_id: str, size: int, rng: random.Random) -> bytes:
    payload = rng.randbytes(max(0, size))
    crc = zlib.crc32(msg_id.encode() + payload)
    return f"{msg_id}|{crc:08x}|".encode() + payload


def parse_body(body: bytes) -> tuple[str, bool]:
    """(msg_id, crc ok); ('?', False) for a body that is not a drill body."""
    try:
        head, crc_text, payload = body.split(b"|", 2)
        msg_id = head.decode()
        return msg_id, zlib.crc32(head + payload) == int(crc_text, 16)
    except ValueError:
        return "?", False


def handler_of(msg_id: str) -> str:
    """``ip:port`` of the broker that stored a message (from RocketMQ's msgId)."""
    try:
        ip, port, _ = decode_msg_id(msg_id)
    except ValueError:
        return "?"
    return f"{ip}:{port}"


def classify(outcome: Any) -> tuple[str, str, dict[str, Any]]:
    """A send's result or exception -> (history type, status, extra fields)."""
    if isinstance(outcome, BaseException):
        if isinstance(outcome, ClientTimeoutError):
            return "info", "CLIENT_TIMEOUT", {"address": outcome.address}
        if isinstance(outcome, BrokerError):
            kind = "fail" if outcome.code in FAIL_CODES else "info"
            return kind, outcome.code.name, {"remark": outcome.remark[:200]}
        return "info", type(outcome).__name__, {"remark": str(outcome)[:200]}
    kind = "ok" if outcome.status == SendStatus.SEND_OK else "info"
    extra = {
        "queue": outcome.queue_id,
        "offset": outcome.queue_offset,
        "phy": outcome.commit_log_offset,
        "handler": handler_of(outcome.msg_id),
    }
    if outcome.broker_name:
        extra["group"] = outcome.broker_name
    return kind, outcome.status.value, extra


# ---- workload ---------------------------------------------------------------------------------
class Worker(threading.Thread):
    def __init__(self, name: str):
        super().__init__(name=name, daemon=True)
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def stop(self) -> None:
        self.stop_event.set()

    def run(self) -> None:
        try:
            self.body()
        except BaseException as e:  # noqa: BLE001 - reported by Drill.finish
            self.error = e

    def body(self) -> None:
        raise NotImplementedError


class ProducerWorker(Worker):
    """Sends ``rate`` puts per second through the client (master discovery, no retries: every
    put is one history operation)."""

    def __init__(
        self,
        history: History,
        servers: list[str],
        producer_id: str,
        rate: float,
        size: int = 512,
        seed: int = 0,
        fixed_queue: int | None = None,
        group: str | None = None,
        keyless: bool = False,
        groups_of: dict[str, str] | None = None,
    ):
        """``group``: every put goes to that broker group (queues in turn); ``keyless``: the
        client picks the queue over every group (no ``queue_id``); ``groups_of`` maps broker
        addresses to their group, so a failed keyless put names the group it went to."""
        super().__init__(producer_id)
        self.history = history
        self.servers = servers
        self.producer_id = producer_id
        self.interval = 1.0 / rate
        self.size = size
        self.rng = random.Random(f"{seed}-{producer_id}")
        self.fixed_queue = fixed_queue
        self.group = group
        self.keyless = keyless
        self.groups_of = groups_of or {}
        self.sent = 0

    def body(self) -> None:
        with Producer(self.servers, timeout_ms=CLIENT_TIMEOUT_MS, retries=0) as producer:
            seq = 0
            next_at = time.monotonic()
            while not self.stop_event.is_set():
                seq += 1
                msg_id = f"{self.producer_id}-{seq}"
                queue = None if self.keyless else (
                    self.fixed_queue if self.fixed_queue is not None else seq % QUEUES)
                body = make_body(msg_id, self.size, self.rng)
                where = {"group": self.group} if self.group else {}
                self.history.add(self.producer_id, "put", "invoke", msg_id=msg_id, queue=queue,
                                 **where)
                try:
                    outcome: Any = producer.send(TOPIC, body, keys=msg_id, queue_id=queue,
                                                 broker_name=self.group)
                except Exception as e:  # noqa: BLE001 - classified
                    outcome = e
                kind, status, extra = classify(outcome)
                extra.setdefault("queue", queue)
                if self.group:
                    extra.setdefault("group", self.group)
                elif isinstance(outcome, BaseException):
                    extra.setdefault("group", self._group_of_error(outcome))
                self.history.add(
                    self.producer_id, "put", kind, msg_id=msg_id, status=status, **extra
                )
                self.sent += 1
                next_at = max(next_at + self.interval, time.monotonic() - 1.0)
                self.stop_event.wait(max(0.0, next_at - time.monotonic()))

    def _group_of_error(self, e: BaseException) -> str:
        """The group a failed keyless put went to ("?" when the error does not say)."""
        if isinstance(e, NoMasterError) and e.broker_name:
            return e.broker_name
        address = getattr(e, "address", None)
        return self.groups_of.get(address, "?") if isinstance(address, str) else "?"


class ConsumerWorker(Worker):
    """Reads every queue from the current master throughout (offsets kept per queue); with
    ``groups``, every queue of every broker group."""

    def __init__(self, history: History, servers: list[str], name: str = "consumer",
                 groups: list[str] | None = None):
        super().__init__(name)
        self.history = history
        self.servers = servers
        self.groups = groups
        self.corrupt = 0

    def body(self) -> None:
        queues: list[tuple[str | None, int]] = [
            (g, q) for g in (self.groups or [None]) for q in range(QUEUES)]
        offsets = dict.fromkeys(queues, 0)
        with Consumer(self.servers, group="drill", timeout_ms=CLIENT_TIMEOUT_MS, retries=0) as c:
            while not self.stop_event.is_set():
                found = False
                for g, q in queues:
                    where = {"group": g} if g else {}
                    try:
                        pr = c.pull(TOPIC, q, offsets[(g, q)], max_nums=64, broker_name=g)
                    except Exception as e:  # noqa: BLE001 - recorded; reads go on
                        self.history.add(self.name, "get", "fail", queue=q, status=repr(e)[:120],
                                         **where)
                        continue
                    if pr.status == PullStatus.FOUND:
                        found = True
                        for m in pr.messages:
                            msg_id, ok = parse_body(m.body)
                            if not ok:
                                self.corrupt += 1
                            self.history.add(
                                self.name,
                                "get",
                                "ok",
                                msg_id=msg_id,
                                queue=q,
                                offset=m.queue_offset,
                                status="FOUND" if ok else "CORRUPT",
                                **where,
                            )
                    if pr.status in (PullStatus.FOUND, PullStatus.OFFSET_ILLEGAL):
                        offsets[(g, q)] = pr.next_begin_offset
                if not found:
                    self.stop_event.wait(0.05)  # polling period at the end of the queues


def burst(
    history: History,
    servers: list[str],
    proc: str,
    count: int,
    size: int,
    rng: random.Random,
    batch: int = 32,
) -> list[dict[str, Any]]:
    """``count`` puts as SEND_BATCH requests of ``batch`` (one queue each, queues in turn); every
    message is its own history operation. Returns the completion events."""
    done: list[dict[str, Any]] = []
    with Producer(servers, timeout_ms=CLIENT_TIMEOUT_MS, retries=0) as producer:
        seq = 0
        while seq < count:
            queue = (seq // batch) % QUEUES
            ids = [f"{proc}-{seq + i + 1}" for i in range(min(batch, count - seq))]
            seq += len(ids)
            for m in ids:
                history.add(proc, "put", "invoke", msg_id=m, queue=queue)
            try:
                outcomes: list[Any] = producer.send_batch(
                    TOPIC, [make_body(m, size, rng) for m in ids], queue_id=queue
                )
            except Exception as e:  # noqa: BLE001 - classified
                outcomes = [e] * len(ids)
            for m, outcome in zip(ids, outcomes, strict=True):
                kind, status, extra = classify(outcome)
                if not isinstance(outcome, BaseException):
                    extra["handler"] = handler_of(outcome.msg_id)
                extra.setdefault("queue", queue)
                done.append(history.add(proc, "put", kind, msg_id=m, status=status, **extra))
    return done


def drain(address: str, servers: Iterable[str]) -> dict[Any, list[tuple[int, str, bool]]]:
    """Every message of every queue read from ``address``: queue -> [(offset, msg_id, crc ok)]."""
    out: dict[Any, list[tuple[int, str, bool]]] = {}
    with Consumer(list(servers), group="drain", timeout_ms=10_000, read_from=address) as c:
        for q in range(QUEUES):
            rows: list[tuple[int, str, bool]] = []
            offset = 0
            while True:
                pr = c.pull(TOPIC, q, offset, max_nums=256)
                if pr.status != PullStatus.FOUND:
                    break
                for m in pr.messages:
                    msg_id, ok = parse_body(m.body)
                    rows.append((m.queue_offset, msg_id, ok))
                offset = pr.next_begin_offset
            out[q] = rows
    return out


# ---- the checker ------------------------------------------------------------------------------
def check_total_queue(
    events: list[dict[str, Any]], final: dict[Any, list[tuple[int, str, bool]]]
) -> dict[str, Any]:
    """Total-queue figures from the history and the final drain of the master."""
    outcome: dict[str, str] = {}
    attempted: set[str] = set()
    read: set[str] = set()
    corrupt = 0
    for e in events:
        if e["op"] == "put":
            if e["type"] == "invoke":
                attempted.add(e["msg_id"])
            else:
                outcome[e["msg_id"]] = e["type"]
        elif e["op"] == "get" and e["type"] == "ok":
            read.add(e["msg_id"])
            corrupt += e.get("status") == "CORRUPT"
    final_ids: Counter[str] = Counter()
    gaps = 0
    for rows in final.values():
        expected = rows[0][0] if rows else 0
        for offset, msg_id, ok in rows:
            final_ids[msg_id] += 1
            corrupt += not ok
            gaps += offset != expected
            expected = offset + 1
    read |= set(final_ids)
    ok_ids = {m for m, t in outcome.items() if t == "ok"}
    info_ids = {m for m, t in outcome.items() if t == "info"}
    fail_ids = {m for m, t in outcome.items() if t == "fail"}
    lost = sorted(ok_ids - set(final_ids))
    unexpected = sorted(read - attempted)
    failed_read = sorted(fail_ids & read)
    return {
        "attempted": len(attempted),
        "ok": len(ok_ids),
        "fail": len(fail_ids),
        "info": len(info_ids),
        "lost": len(lost),
        "unexpected": len(unexpected),
        "duplicated": sum(n - 1 for n in final_ids.values() if n > 1),
        "recovered": len(info_ids & set(final_ids)),
        "failed_but_read": len(failed_read),
        "corrupt": corrupt,
        "queue_gaps": gaps,
        "final_messages": sum(final_ids.values()),
        "lost_ids": lost[:20],
        "lost_ids_all": lost,
        "unexpected_ids": unexpected[:20],
        "failed_read_ids": failed_read[:20],
    }


def ok_puts(history: History) -> int:
    """How many puts have had SEND_OK so far."""
    return sum(1 for e in history.events if e["op"] == "put" and e["type"] == "ok")


def wait_more_puts(history: History, n: int, timeout_s: float = 20.0) -> None:
    """Until ``n`` more puts have SEND_OK (the workload is really running)."""
    start = ok_puts(history)
    wait_for(lambda: ok_puts(history) >= start + n, timeout_s, f"{n} more SEND_OK puts",
             step_s=0.05)


def put_latencies_ms(
    events: list[dict[str, Any]], t0: float, t1: float = float("inf")
) -> list[float]:
    """Sorted latencies (ms) of the puts invoked in [t0, t1) that got SEND_OK."""
    invoked: dict[str, float] = {}
    out = []
    for e in events:
        if e["op"] != "put":
            continue
        if e["type"] == "invoke":
            invoked[e["msg_id"]] = e["t"]
        elif e["type"] == "ok":
            t = invoked.get(e["msg_id"])
            if t is not None and t0 <= t < t1:
                out.append((e["t"] - t) * 1000)
    return sorted(out)


def rto_after(events: list[dict[str, Any]], t_fault: float) -> float | None:
    """Seconds from a fault to the first SEND_OK invoked after it (None: none)."""
    invoked: dict[str, float] = {}
    for e in events:
        if e["op"] != "put":
            continue
        if e["type"] == "invoke":
            invoked[e["msg_id"]] = e["t"]
        elif e["type"] == "ok" and invoked.get(e["msg_id"], -1.0) >= t_fault:
            return round(e["t"] - t_fault, 3)
    return None


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
        if loss_allowed is not None:  # e.g. ASYNC: acked bytes the promoted slave never had
            allowed = [m for m in summary.pop("lost_ids_all") if loss_allowed(m)]
            summary["lost_allowed"] = len(allowed)
            summary["lost"] -= len(allowed)
            summary["lost_ids"] = [m for m in summary["lost_ids"] if m not in set(allowed)]
        summary.pop("lost_ids_all", None)
        summary["final_ids"] = final
        problems = []
        for key in ("lost", "unexpected", "failed_but_read", "corrupt", "queue_gaps"):
            if summary[key]:
                problems.append(f"{key}={summary[key]}")
        if not logs["identical"]:
            problems.append(f"replica CommitLogs differ in {logs['range']}")
        if not replica_drains_equal:
            problems.append("replicas serve different messages")
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
