"""``replog drill``: a failover drill against a controller-mode group (docs/drills.md
"replog drill"; docs/operations.md "Run a cluster with Docker").

    --backend process   starts a local group like ``replog cluster up`` (a ZooKeeper child
                        and brokers in controller mode) in a fresh directory, and kills,
                        restarts and pauses its master by signal
    --backend docker    drives the running compose project's containers through the Docker
                        SDK: kills, restarts, pauses and network partitions

The scenario, checks and JSON report are ``common.drill.scenario``'s, the same for both.
Exit status 0 when the drill passed, 1 when it failed or could not run, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.table import Table

from common.cli.cluster import ChildBroker, LocalCluster, running_cluster
from common.cli.output import EXIT_FAILED, EXIT_OK, UsageError, emit_json, err, out
from common.drill import scenario
from common.drill.backends import Backend, DrillError
from common.drill.backends.process import ProcessBackend

DRILL_SETTINGS = {"transactionCheckInterval": 1000, "transactionTimeOut": 2000}
DEFAULT_FAULTS = {"process": "kill=5,pause=1,restart=1",
                  "docker": "kill=5,partition-zk=1,partition-slaves=1,pause=1"}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("drill", help="a failover drill: load, faults on the master, checks")
    p.add_argument("--backend", choices=["process", "docker"], default="process")
    p.add_argument("--faults", help="FAULT=N,... of kill, restart, pause, partition-zk, "
                   "partition-slaves, partition-both (default: process "
                   f"{DEFAULT_FAULTS['process']}; docker {DEFAULT_FAULTS['docker']})")
    p.add_argument("--producers", type=int, default=3)
    p.add_argument("--rate", type=float, default=50.0, help="puts/s per producer")
    p.add_argument("--size", type=int, default=512, help="payload bytes per message")
    p.add_argument("--transactions", type=int, default=1, metavar="N",
                   help="producers running transactions beside the plain ones, checked: "
                   "rolled back never consumed, committed never lost (0: none)")
    p.add_argument("--seed", type=int, help="replays the fault order and the pauses "
                   "(default: DRILL_SEED or random)")
    p.add_argument("--settle-timeout", type=float, default=90.0, metavar="S",
                   help="an election, rejoin or catch-up taking longer fails the drill")
    p.add_argument("--history", help="the history file (kept when the drill fails)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON document")
    g = p.add_argument_group("docker backend")
    g.add_argument("--project", default="replog", help="the compose project (default "
                   "%(default)s: compose/docker-compose.yml's name)")
    g.add_argument("--group", default="broker-a", help="the broker group (brokerName)")
    g = p.add_argument_group("process backend")
    g.add_argument("--dir", help="a new or empty directory for the group (default: a "
                   "temporary one, removed when the drill passes)")
    g.add_argument("--slaves", type=int, default=2)
    g.add_argument("--mode", choices=["sync", "async"], default="sync")
    g.add_argument("--base-port", type=int, default=12911)
    g.add_argument("--session-ms", type=int, default=4000)


class _ClusterBroker:
    """A ``LocalCluster`` child as the process backend sees it."""

    def __init__(self, cluster: LocalCluster, child: ChildBroker, member_id: int):
        self._cluster = cluster
        self._child = child
        self._member_id = member_id

    @property
    def name(self) -> str:
        return self._child.name

    @property
    def member_id(self) -> int:
        return self._member_id

    @property
    def address(self) -> str:
        return self._child.address

    @property
    def process(self) -> Any:
        return self._child.process

    def start(self) -> None:
        self._cluster.start_child(self._child)


def cmd_drill(args: argparse.Namespace) -> int:
    try:
        counts = scenario.parse_faults(args.faults or DEFAULT_FAULTS[args.backend])
    except ValueError as e:
        raise UsageError(f"--faults: {e}") from None
    if args.backend == "process":  # before a group is started for nothing
        for fault in counts:
            reason = ProcessBackend([]).unsupported(fault)
            if reason:
                raise UsageError(f"--faults {fault}: {reason}")
    seed = args.seed if args.seed is not None else scenario.default_seed()
    order = scenario.fault_order(counts, scenario.random.Random(seed))
    history = Path(args.history) if args.history else Path(tempfile.gettempdir()) / (
        f"replog-drill-{args.backend}-{seed}-history.jsonl")
    try:
        options = scenario.Options(order, args.producers, args.rate, args.size, seed,
                                   args.settle_timeout, history, f"{args.backend}-failover",
                                   transactions=args.transactions)
    except ValueError as e:
        raise UsageError(str(e)) from None
    say = (lambda _: None) if args.json else (lambda line: err.print(f"[drill] {line}"))
    say(f"seed {seed}, history {history}")
    outcome: dict[str, bool] = {"passed": False}  # the process backend keeps a failed group
    try:
        with _backend(args, outcome) as backend:
            report = scenario.run(backend, options, say)
            outcome["passed"] = report["verdict"] == "pass"
    except DrillError as e:
        err.print(f"replog drill: {e}")
        return EXIT_FAILED
    except AssertionError as e:  # a wait ran out: the group did not settle
        err.print(f"replog drill: failed: {e}; history kept at {history}")
        return EXIT_FAILED
    _print(args, report)
    return EXIT_OK if report["verdict"] == "pass" else EXIT_FAILED


@contextlib.contextmanager
def _backend(args: argparse.Namespace, outcome: dict[str, bool]) -> Iterator[Backend]:
    if args.backend == "docker":
        from common.drill.backends.docker import DockerBackend

        yield DockerBackend(args.project, args.group)
        return
    if args.slaves < 1 or not 1 <= args.base_port <= 65535 - 10 * args.slaves - 100:
        raise UsageError("--slaves must be >= 1 and the ports must fit below 65536")
    if args.dir:
        directory = Path(args.dir)
        if directory.exists() and any(directory.iterdir()):
            raise UsageError(f"--dir {directory} is not empty: a drill starts a fresh group")
        keep = True
    else:
        directory = Path(tempfile.mkdtemp(prefix="replog-drill-"))
        keep = False
    # the check-back every second, of halves 2 s old: a transaction whose END a fault lost is
    # decided within the drill (RocketMQ's defaults, 30 s and 6 s, are for production)
    cluster = LocalCluster(directory, args.slaves, args.mode, args.base_port, controller=True,
                           session_ms=args.session_ms, settings=DRILL_SETTINGS)
    try:
        with running_cluster(cluster):
            brokers = [_ClusterBroker(cluster, c, i + 1) for i, c in enumerate(cluster.children)]
            yield ProcessBackend(brokers)
    finally:
        if not keep and outcome["passed"]:
            shutil.rmtree(directory, ignore_errors=True)
        elif not keep:
            err.print(f"replog drill: the group's files are kept under {directory}")


def _print(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if args.json:
        emit_json(report)
        return
    table = Table(title=f"replog drill ({report.get('backend')}, {report.get('mode')}, seed "
                        f"{report.get('seed')})")
    for col in ("t (s)", "fault", "broker", "elected", "master after", "epoch", "rto (s)",
                "took (s)"):
        table.add_column(col)
    for f in report["faults"]:
        table.add_row(f"{f['t']:.1f}", f["status"], f["node"], f.get("elected", ""),
                      f["master_after"], f"{f['epoch_before']} -> {f['epoch_after']}",
                      str(f.get("rto_s")), str(f["took_s"]))
    out.print(table)
    out.print(scenario.summary_line(report))
    for problem in report["problems"]:
        out.print(f"problem: {problem}")
    if report.get("history"):
        out.print(f"history kept at {report['history']}")
    passed = report["verdict"] == "pass"
    out.print(f"{int(passed)} passed, {int(not passed)} failed  "
              f"({time.strftime('%H:%M:%S')}, {report['wall_s']} s)")
