"""A failover scenario on a controller-mode group, the same for every backend
(docs/drills.md, the ``replog drill`` rows): load, faults on the master, heal, check, report.

The run:

1. Wait until the group has an elected master, every broker follows it and the SyncStateSet
   holds every member.
2. Start ``producers`` producers of ``rate`` puts/s and a consumer, all through the client
   given every broker's address (the client finds the master itself).
3. For each fault, in an order drawn from the seed: wait until the SyncStateSet is whole again
   and 20 more puts were acknowledged, wait 0.5-2 s, then hit the broker that is master now:

   * ``kill``: SIGKILL; wait until the others elect a master; start it; it rejoins as a slave.
   * ``restart``: SIGTERM (it leaves the group at once), start it; the group settles.
   * ``pause``: freeze it; wait until the others elect a master; thaw it at twice the session
     timeout after the freeze; it steps down and follows (a zombie never acknowledges again).
   * ``partition-zk`` / ``partition-both``: cut it from ZooKeeper (and from its slaves); wait
     until the others elect a master; heal; it follows the new master.
   * ``partition-slaves``: cut it from its slaves for two session timeouts (ZooKeeper still
     backs it: no election is expected, and its SYNC writes stop); heal; the group settles.

4. Stop the load, wait until every replica holds the same max offset, drain every queue from
   every replica, compare the replicas with the checksum each broker reports for the common
   range of their logs (``LOG_CHECKSUM``), and run the total-queue checker.

With ``transactions``, that many producers also run transactions throughout (their own topic,
``transactions.py``), decided COMMIT or ROLLBACK at random, some left to the check-back; at
the end they keep answering check-backs until every acknowledged half decided COMMIT is in the
master's drain (or the settle timeout plus two default check rounds pass), and the
transaction checker runs: rolled back and consumed, committed and lost, consumed before its
commit, and both must be 0.

Pass: lost = 0 (under ``ASYNC_MASTER``, except what the faulted master acknowledged and its
slaves never had, reported per fault), unexpected = 0, no failed put read, no corrupt body, no
gap in a queue, replicas byte-identical and serving the same messages, no acknowledgement from
a faulted master after another was elected. Reported: the failover time of each fault (the
fault to the first SEND_OK a client got for a put sent after it), p50 and max.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from common.client import Admin
from common.core.errors import BrokerError
from common.drill.backends import (
    FAULTS,
    KILL,
    PARTITION_BOTH,
    PARTITION_SLAVES,
    PARTITION_ZK,
    PAUSE,
    RESTART,
    SLAVES_SIDE,
    ZOOKEEPER_SIDE,
    Backend,
    DrillError,
    DrillNode,
)
from common.drill.checker import check_total_queue, judge, percentiles, rto_after
from common.drill.group import master_of, wait_master, wait_sync_state_set
from common.drill.history import CLIENT_TIMEOUT_MS, History
from common.drill.transactions import (
    TX_CONSUMER,
    TransactionWorker,
    check_transactions,
    committed_ids,
    tx_problems,
    tx_topic,
)
from common.drill.workload import (
    ConsumerWorker,
    ProducerWorker,
    Worker,
    drain,
    wait_for,
    wait_more_puts,
)

STATUS_TIMEOUT_MS = 1500  # a broker that does not answer STATUS in this long counts as down
CHECKSUM_TIMEOUT_MS = 30_000
ELECTING = (KILL, PAUSE, PARTITION_ZK, PARTITION_BOTH)  # faults after which another leads
FAILOVERS = (*ELECTING, RESTART)  # faults whose recovery time is a failover time
MAX_FAULTS = 1000
CHECK_BACK_WAIT_S = 2 * (6 + 30)  # two check rounds at RocketMQ's defaults (timeout, interval)


def parse_faults(text: str) -> dict[str, int]:
    """``kill=5,pause=1,partition-zk=1`` -> {fault: count}; ValueError naming what is wrong."""
    counts: dict[str, int] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        name, sep, number = item.partition("=")
        name = name.strip()
        if name not in FAULTS:
            raise ValueError(f"unknown fault {name!r}: one of {', '.join(FAULTS)}")
        try:
            count = int(number) if sep else 1
        except ValueError:
            raise ValueError(f"{item!r}: the count after '=' must be a whole number") from None
        if count < 0:
            raise ValueError(f"{item!r}: the count must be >= 0")
        counts[name] = counts.get(name, 0) + count
    total = sum(counts.values())
    if not 0 < total <= MAX_FAULTS:
        raise ValueError(f"give between 1 and {MAX_FAULTS} faults, e.g. kill=5,pause=1 "
                         f"(got {total})")
    return counts


def fault_order(counts: dict[str, int], rng: random.Random) -> list[str]:
    """Every fault ``counts`` asks for, in an order drawn from ``rng`` (replayable by seed)."""
    order = [name for name in FAULTS for _ in range(counts.get(name, 0))]
    rng.shuffle(order)
    return order


@dataclasses.dataclass
class Options:
    faults: list[str]  # in the order they run
    producers: int = 3
    rate: float = 50.0  # puts/s per producer (transactions/s per transaction producer)
    size: int = 512  # payload bytes per message
    seed: int = 0
    settle_timeout_s: float = 90.0  # an election, a rejoin or a catch-up takes at most this
    history_path: Path = Path("drill-history.jsonl")
    name: str = "drill"
    # a topic of its own, so a drill against a long-lived group (the compose cluster) never
    # reads an earlier run's messages
    topic: str = dataclasses.field(default_factory=lambda: time.strftime(
        "drill-%Y%m%d-%H%M%S-") + os.urandom(3).hex())
    transactions: int = 0  # producers running transactions beside the plain ones

    def __post_init__(self) -> None:
        if self.producers < 1 or not 0 < self.rate <= 10_000 or not 0 <= self.size <= 1 << 20:
            raise ValueError("producers >= 1, rate in (0, 10000] puts/s, size in 0..1 MiB")
        if not 0 <= self.transactions <= 64:
            raise ValueError("transactions: 0..64 transaction producers")


class Scenario:
    """One run of ``options`` against ``backend``; ``run`` returns the JSON report."""

    def __init__(self, backend: Backend, options: Options,
                 say: Callable[[str], None] = lambda _: None):
        self.backend = backend
        self.options = options
        self.say = say
        self.rng = random.Random(options.seed)
        self.nodes = backend.nodes()
        if len(self.nodes) < 2:
            raise DrillError(f"a failover drill needs a group of 2 brokers or more, found "
                             f"{len(self.nodes)}")
        for fault in set(options.faults):
            reason = backend.unsupported(fault)
            if reason:
                raise DrillError(f"{fault}: {reason}")
        self.history = History(options.history_path)
        self.admin = Admin([n.address for n in self.nodes], timeout_ms=STATUS_TIMEOUT_MS,
                           retries=0)
        self._pool = concurrent.futures.ThreadPoolExecutor(len(self.nodes), "drill-status")
        self.workers: list[Worker] = []
        self.faults: list[dict[str, Any]] = []
        self.problems: list[str] = []
        self.started = time.monotonic()
        self.session_ms = 0
        self.mode = ""

    # ---- the group ------------------------------------------------------------------------
    def status(self, node: DrillNode) -> dict[str, Any] | None:
        try:
            return self.admin.status(node.address)
        except BrokerError:
            return None

    def statuses(self, nodes: Iterable[DrillNode]) -> list[dict[str, Any] | None]:
        return list(self._pool.map(self.status, nodes))

    def wait_master(self, nodes: list[DrillNode]) -> DrillNode:
        """The broker every one of ``nodes`` that answers agrees is the master, once the
        others follow it."""
        index, statuses = wait_master(lambda: self.statuses(nodes),
                                      self.options.settle_timeout_s)
        master = statuses[index]
        assert master is not None
        self.session_ms = int(master["controller"].get("sessionMs") or self.session_ms)
        self.mode = str(master["role"])
        return nodes[index]

    def wait_whole(self, master: DrillNode) -> None:
        """Every member is in the master's SyncStateSet again (it caught up)."""
        def status() -> dict[str, Any]:
            s = self.status(master)
            return s if s is not None else {"controller": {"syncStateSet": []}}

        wait_sync_state_set(status, {n.member_id for n in self.nodes},
                            self.options.settle_timeout_s)

    def current_master(self) -> DrillNode | None:
        index = master_of(self.statuses(self.nodes))
        return None if index is None else self.nodes[index]

    # ---- the run --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        failed = True
        try:
            master = self.wait_master(self.nodes)
            self.wait_whole(master)
            self.say(f"group settled: master {master.name} ({self.mode}), session "
                     f"{self.session_ms} ms; faults: {', '.join(self.options.faults)}")
            self.start_load(str((self.status(master) or {}).get("brokerName") or "") or None)
            wait_more_puts(self.history, 30, self.options.settle_timeout_s)
            for i, fault in enumerate(self.options.faults):
                master = self.wait_master(self.nodes)  # whoever leads now is hit
                self.wait_whole(master)
                wait_more_puts(self.history, 20, self.options.settle_timeout_s)
                threading.Event().wait(self.rng.uniform(0.5, 2.0))
                record = self.inject(fault, master)
                master = self.nodes[[n.name for n in self.nodes].index(record["master_after"])]
                self.say(f"[{i + 1}/{len(self.options.faults)}] {fault} {record['node']}: "
                         f"master now {master.name} (epoch {record['epoch_after']}), took "
                         f"{record['took_s']} s")
            # writes flow again after the last fault too, whichever it was (a cut from the
            # slaves heals without an election: its first SEND_OK comes only after the heal)
            wait_more_puts(self.history, 20, self.options.settle_timeout_s)
            report = self.finish(master)
            failed = report["verdict"] != "pass"
            return report
        finally:
            for w in self.workers:
                w.stop()
                if isinstance(w, TransactionWorker):
                    w.release()
            self.backend.heal_all()
            for w in self.workers:
                w.join(CLIENT_TIMEOUT_MS / 1000 * 3 + 10)
            self._pool.shutdown(wait=True)
            self.admin.close()
            self.history.close()
            if not failed:
                self.history.path.unlink(missing_ok=True)

    def start_load(self, group: str | None = None) -> None:
        """Producers and a consumer on the drilled group: pinned to ``group`` (its
        ``brokerName``), so a cluster of several groups sends and reads only there, and a new
        topic is made there by its first send (queue ids alone would need a topic the routes
        already name)."""
        servers = [n.address for n in self.nodes]
        for i in range(self.options.producers):
            self.workers.append(ProducerWorker(self.history, servers, f"p{i}", self.options.rate,
                                               size=self.options.size, seed=self.options.seed,
                                               topic=self.options.topic, group=group))
        self.workers.append(ConsumerWorker(self.history, servers, topic=self.options.topic,
                                           groups=[group] if group else None))
        if self.options.transactions:
            topic = tx_topic(self.options.topic)
            for i in range(self.options.transactions):
                self.workers.append(TransactionWorker(
                    self.history, servers, f"t{i}", self.options.rate, topic,
                    size=self.options.size, seed=self.options.seed, group=group))
            self.workers.append(ConsumerWorker(self.history, servers, name=TX_CONSUMER,
                                               topic=topic, groups=[group] if group else None))
        for w in self.workers:
            w.start()

    def inject(self, fault: str, master: DrillNode) -> dict[str, Any]:
        """Hit ``master`` with ``fault``, heal it, wait until the group settles; the record."""
        others = [n for n in self.nodes if n is not master]
        epoch_before = self._epoch(master)
        record: dict[str, Any] = {"status": fault, "node": master.name,
                                  "epoch_before": epoch_before}
        t0 = time.monotonic()
        asked = self.history.now()

        def in_effect() -> None:
            """Record the fault once in effect. Its time is when it was asked for: the failover
            time runs from there to another broker's first SEND_OK (an engine's API call may
            take a second on a busy box; counting from its return would flatter the figure).
            A cut from the slaves elects nobody: its time is when the cut is in effect, since
            puts sent before it may rightly be acknowledged."""
            event = self.history.fault(fault, node=master.name, asked_t=asked)
            record["t"] = event["t"] if fault == PARTITION_SLAVES else asked

        if fault == KILL:
            self.backend.kill(master)
            in_effect()
            record["elected"] = self.wait_master(others).name
            self.backend.start(master)
        elif fault == RESTART:
            self.backend.restart(master)  # it left the group on SIGTERM, before it exited
            in_effect()
        elif fault == PAUSE:
            self.backend.pause(master)
            in_effect()
            record["elected"] = self.wait_master(others).name
            hold_s = 2 * self.session_ms / 1000 - (time.monotonic() - t0)
            threading.Event().wait(max(0.0, hold_s))
            self.backend.resume(master)
        elif fault in (PARTITION_ZK, PARTITION_BOTH):
            sides = [ZOOKEEPER_SIDE] + ([SLAVES_SIDE] if fault == PARTITION_BOTH else [])
            for side in sides:
                self.backend.partition(master, side)
            in_effect()
            record["elected"] = self.wait_master(others).name
            for side in sides:
                self.backend.heal(master, side)
        elif fault == PARTITION_SLAVES:
            self.backend.partition(master, SLAVES_SIDE)
            in_effect()
            threading.Event().wait(2 * self.session_ms / 1000)
            during = self.current_master()
            record["master_during"] = during.name if during is not None else None
            self.backend.heal(master, SLAVES_SIDE)
        else:
            raise ValueError(f"unknown fault {fault!r}")
        record["healed_t"] = self.history.fault(f"{fault}-healed", node=master.name)["t"]
        new = self.wait_master(self.nodes)
        record.update(master_after=new.name, epoch_after=self._epoch(new),
                      took_s=round(time.monotonic() - t0, 3))
        if fault in ELECTING and record["epoch_after"] <= epoch_before:
            self.problems.append(f"{fault} of {master.name}: no new epoch "
                                 f"({epoch_before} -> {record['epoch_after']})")
        self.faults.append(record)
        return record

    def _epoch(self, node: DrillNode) -> int:
        s = wait_for(lambda: self.status(node), self.options.settle_timeout_s,
                     f"{node.name} to answer STATUS", step_s=0.1)
        return int(s["epoch"])

    # ---- the check ------------------------------------------------------------------------
    def finish(self, master: DrillNode) -> dict[str, Any]:
        for w in self.workers:
            w.stop()
        tx_workers = [w for w in self.workers if isinstance(w, TransactionWorker)]
        self.join([w for w in self.workers if w not in tx_workers])
        servers = [n.address for n in self.nodes]
        tx_final = self.wait_check_back(master) if tx_workers else None
        for w in tx_workers:
            w.release()
        self.join(tx_workers)
        converged = self.wait_converged()
        topic = self.options.topic
        final = drain(master.address, servers, topic)
        drains_equal = all(drain(n.address, servers, topic) == final
                           for n in self.nodes if n is not master)
        if tx_final is not None:
            tx_final = drain(master.address, servers, tx_topic(topic))
            drains_equal = drains_equal and all(
                drain(n.address, servers, tx_topic(topic)) == tx_final
                for n in self.nodes if n is not master)
        checksums = self.compare_checksums(converged)
        events = self.history.events
        summary = check_total_queue([e for e in events if e["proc"] != TX_CONSUMER], final)
        windows = self.loss_windows()
        allowed = None
        if self.mode == "ASYNC_MASTER":
            allowed = {e["msg_id"] for e in events if e["op"] == "put" and e["type"] == "ok"
                       and any(w["node"].stored(e.get("handler", "?"))
                               and w["from"] < e["t"] <= w["to"] for w in windows)}
        lost_all = list(summary["lost_ids_all"])
        problems = judge(summary, logs_identical=checksums["identical"],
                         compared_range=checksums["range"], replica_drains_equal=drains_equal,
                         loss_allowed=None if allowed is None else allowed.__contains__)
        problems += self.problems + self.acks_after_takeover()
        if tx_final is not None:
            tx_figures = check_transactions(events, tx_final)
            tx_figures["check_backs_answered"] = sum(w.checks for w in tx_workers)
            summary["transactions"] = tx_figures
            problems += tx_problems(tx_figures)
        by_name = {n.name: n for n in self.nodes}
        for f in self.faults:
            # a failover ends with the first SEND_OK of another broker; a cut from the slaves
            # (no election) with the first SEND_OK at all
            others = None if f["status"] == PARTITION_SLAVES else _not_stored_by(by_name[f["node"]])
            f["rto_s"] = rto_after(events, f["t"], others)
        failovers = [f["rto_s"] for f in self.faults
                     if f["status"] in FAILOVERS and f["rto_s"] is not None]
        by_kind: dict[str, list[float]] = {}
        for f in self.faults:
            if f["rto_s"] is not None:
                by_kind.setdefault(f["status"], []).append(f["rto_s"])
        figures = percentiles(failovers)
        summary.update(
            drill=self.options.name,
            seed=self.options.seed,
            topic=self.options.topic,
            mode=self.mode,
            session_ms=self.session_ms,
            nodes=[dataclasses.asdict(n) for n in self.nodes],
            wall_s=round(time.monotonic() - self.started, 1),
            converged_max=converged,
            checksums=checksums,
            logs_identical=checksums["identical"],
            compared_range=checksums["range"],
            replica_drains_equal=drains_equal,
            faults=self.faults,
            failover_s=failovers,
            failover_p50_s=figures["p50"],
            failover_max_s=figures["max"],
            recovery_s_by_fault={k: percentiles(v) for k, v in sorted(by_kind.items())},
            loss_per_fault=self.loss_per_fault(windows, lost_all),
            **self.backend.describe(),
        )
        summary["problems"] = problems
        summary["verdict"] = "pass" if not problems else "fail"
        summary["history"] = None if not problems else str(self.history.path)
        return summary

    def join(self, workers: Sequence[Worker]) -> None:
        for w in workers:
            w.join(CLIENT_TIMEOUT_MS / 1000 * 3 + 10)
            if w.is_alive():
                self.problems.append(f"worker {w.name} did not stop")
            if w.error is not None:
                self.problems.append(f"worker {w.name}: {w.error!r}")

    def wait_check_back(self, master: DrillNode) -> dict[Any, list[tuple[int, str, bool]]]:
        """Until every acknowledged half decided COMMIT is in the master's drain (its END
        may have been lost to a fault: the check-back asks the still running producers), or
        the deadline; the last drain."""
        servers = [n.address for n in self.nodes]
        topic = tx_topic(self.options.topic)
        must = committed_ids(self.history.events)
        deadline = time.monotonic() + self.options.settle_timeout_s + CHECK_BACK_WAIT_S
        while True:
            got = drain(master.address, servers, topic)
            if must <= {m for rows in got.values() for _, m, _ in rows} \
                    or time.monotonic() > deadline:
                return got
            threading.Event().wait(0.5)

    def wait_converged(self) -> int:
        def same() -> int | None:
            statuses = self.statuses(self.nodes)
            if any(s is None for s in statuses):
                return None
            tops = {s["maxPhyOffset"] for s in statuses if s is not None}
            return tops.pop() if len(tops) == 1 else None

        return wait_for(same, self.options.settle_timeout_s,
                        "every replica to hold the same max offset", step_s=0.1)

    def compare_checksums(self, upto: int) -> dict[str, Any]:
        """LOG_CHECKSUM of the range every replica holds, up to ``upto`` (where they all
        converged: a master may write after, e.g. a batch of transaction ops, which its
        slaves may not hold yet), asked of each broker."""
        statuses = [s for s in self.statuses(self.nodes) if s is not None]
        if len(statuses) != len(self.nodes):
            return {"range": [0, 0], "identical": False, "by_node": {},
                    "error": "a broker did not answer STATUS"}
        lo = max(s["minPhyOffset"] for s in statuses)
        hi = min(min(s["maxPhyOffset"] for s in statuses), upto)
        # 16 MiB hashed per request: a busy broker may take longer than a STATUS wait
        with Admin([n.address for n in self.nodes], timeout_ms=CHECKSUM_TIMEOUT_MS,
                   retries=0) as admin:
            by_node = {n.name: admin.log_checksum(n.address, lo, hi) for n in self.nodes}
        return {"range": [lo, hi], "identical": len(set(by_node.values())) == 1,
                "by_node": by_node}

    def loss_windows(self) -> list[dict[str, Any]]:
        """Per fault: the broker hit and the time span in which what it acknowledged may be
        missing from its slaves (from the previous fault's heal to this one's; ASYNC only)."""
        out, last = [], 0.0
        by_name = {n.name: n for n in self.nodes}
        for f in self.faults:
            out.append({"node": by_name[f["node"]], "from": last, "to": f["healed_t"],
                        "fault": f})
            last = f["healed_t"]
        return out

    def loss_per_fault(self, windows: list[dict[str, Any]],
                       lost: list[str]) -> list[dict[str, Any]]:
        """Acknowledged messages missing at the end, by the fault whose window they fall in,
        with their CommitLog offsets on the faulted master (the loss window)."""
        acked = {e["msg_id"]: e for e in self.history.events
                 if e["op"] == "put" and e["type"] == "ok"}
        out = []
        for w in windows:
            mine = [acked[m] for m in lost if m in acked and w["node"].stored(
                acked[m].get("handler", "?")) and w["from"] < acked[m]["t"] <= w["to"]]
            phys = sorted(int(e["phy"]) for e in mine if "phy" in e)
            out.append({"t": w["fault"]["t"], "fault": w["fault"]["status"],
                        "node": w["node"].name, "lost_messages": len(mine),
                        "lost_phy_range": [phys[0], phys[-1]] if phys else None})
        return out

    def acks_after_takeover(self) -> list[str]:
        """A faulted master's SEND_OK answered after the master elected in its place gave its
        first SEND_OK: two masters acknowledging (never allowed, SYNC or ASYNC)."""
        by_name = {n.name: n for n in self.nodes}
        oks = [e for e in self.history.events if e["op"] == "put" and e["type"] == "ok"]
        problems = []
        for f in self.faults:
            if "elected" not in f:
                continue
            old, new = by_name[f["node"]], by_name[f["elected"]]
            first_new = next((e["t"] for e in oks if e["t"] >= f["t"]
                              and new.stored(e.get("handler", "?"))), None)
            if first_new is None:
                continue
            late = [e for e in oks if first_new < e["t"] < self._next_fault_t(f)
                    and old.stored(e.get("handler", "?"))]
            if late:
                problems.append(f"{f['status']} at t={f['t']}: {len(late)} SEND_OK from "
                                f"{old.name} after {new.name} took over (first {late[0]})")
        return problems

    def _next_fault_t(self, fault: dict[str, Any]) -> float:
        later = [f["t"] for f in self.faults if f["t"] > fault["t"]]
        return min(later) if later else float("inf")


def _not_stored_by(node: DrillNode) -> Callable[[str], bool]:
    return lambda handler: not node.stored(handler)


def run(backend: Backend, options: Options, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the scenario; the report (its history file is kept only when it failed)."""
    options.history_path.parent.mkdir(parents=True, exist_ok=True)
    return Scenario(backend, options, say).run()


def summary_line(report: dict[str, Any]) -> str:
    keys = ("attempted", "ok", "info", "fail", "lost", "unexpected", "duplicated",
            "failover_p50_s", "failover_max_s", "logs_identical", "verdict")
    line = {k: report.get(k) for k in keys}
    tx = report.get("transactions")
    if tx:
        line["transactions"] = {k: tx[k] for k in (
            "tx_attempted", "tx_committed", "tx_rolled_back", "tx_rolled_back_consumed",
            "tx_committed_lost", "tx_consumed_before_commit", "tx_both")}
    return json.dumps(line)


def default_seed() -> int:
    return int(os.environ.get("DRILL_SEED", "0") or 0) or int.from_bytes(os.urandom(4), "big")
