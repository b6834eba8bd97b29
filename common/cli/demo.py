"""``make run``: a local broker group plus a small demo workload, then a clean stop.

Runs what ``replog cluster up --base-port 10911`` runs (3 brokers, sync mode, a local ZooKeeper
and the controller; without ZooKeeper installed, 1 master + 2 slaves as ``--no-controller``)
under ``run/demo``, then sends, batch-sends, pulls, queries and shows the status, printing each
step. With the controller it then kills the master (SIGKILL), prints how long until a new
master answered a send, and restarts the old master, which rejoins as a slave.
The cluster keeps running for ``REPLOG_DEMO_DURATION`` seconds (default 20; try
``replog status -s 127.0.0.1:10911`` meanwhile) and is stopped on time or on Ctrl-C.
Environment: ``REPLOG_DEMO_DIR`` (default run/demo), ``REPLOG_DEMO_SLAVES`` (default 2),
``REPLOG_DEMO_MODE`` (sync | async, default sync), ``REPLOG_DEMO_BASE_PORT`` (default 10911),
``REPLOG_DEMO_SECURE=1``: CURVE and an ACL, as ``replog cluster up --secure`` (keys and
acl.yml under the demo's directory; the workload runs as its admin account).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from common.cli import zookeeper
from common.cli.cluster import LocalCluster, running_cluster
from common.client import Admin, Consumer, Producer
from common.core.errors import BrokerError

console = Console(highlight=False)


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        console.print(f"ignoring {name}: not an integer")
        return default


def wait_for_master(cluster: LocalCluster, servers: list[str]) -> None:
    started = time.monotonic()
    with Admin(servers, timeout_ms=2000, retries=0, **cluster.client_curve()) as admin:
        while time.monotonic() - started < 30:
            master = cluster.master(admin)
            if master is not None:
                sss = admin.status(master.address)["controller"]["syncStateSet"]
                if len(sss) == len(cluster.children):
                    console.print(f"controller elected {master.name} ({master.address}); "
                                  f"SyncStateSet {sss} after {time.monotonic() - started:.2f} s")
                    return
            time.sleep(0.1)


def workload(servers: list[str], **curve: Any) -> None:
    """``curve``: the clients' ``key``/``server_key`` (a secure cluster)."""
    with Admin(servers, timeout_ms=5000, **curve) as a:
        master = a.master_address()
    with Producer(servers, **curve) as p:
        r = p.send("demo-orders", b"order 42: 3 apples", tags="TagA", keys="order-42")
        console.print(
            f"[bold]send[/] -> {r.status.value} msgId={r.msg_id} queue={r.queue_id} "
            f"queueOffset={r.queue_offset} commitLogOffset={r.commit_log_offset}"
        )
        rs = p.send_batch(
            "demo-orders", [f"batch item {i}".encode() for i in range(8)], queue_id=r.queue_id
        )
        console.print(
            f"[bold]send_batch[/] of {len(rs)} -> {rs[0].status.value}, queue offsets "
            f"{rs[0].queue_offset}..{rs[-1].queue_offset}"
        )
        futures = [p.send_async("demo-orders", f"async {i}".encode()) for i in range(200)]
        statuses = {f.result(30).status.value for f in futures}
        console.print(f"[bold]send_async[/] x200 -> {sorted(statuses)}")
    with Consumer(servers, group="demo-billing", **curve) as c:
        pr = c.pull("demo-orders", queue_id=r.queue_id, offset=0, max_nums=4)
        console.print(
            f"[bold]pull[/] queue {r.queue_id} -> {pr.status.value}, "
            f"{len(pr.messages)} messages, next offset {pr.next_begin_offset}"
        )
        for m in pr.messages:
            console.print(f"    {m.queue_offset}: {m.body.decode(errors='replace')}")
        c.commit_offset("demo-orders", r.queue_id, pr.next_begin_offset)
        console.print(
            f"[bold]commit_offset[/] -> group demo-billing at "
            f"{c.fetch_offset('demo-orders', r.queue_id)}"
        )
    with Admin(servers, **curve) as a:
        found = a.query_by_key("demo-orders", "order-42", address=master)
        console.print(f"[bold]query[/] key order-42 -> {[m.msg_id for m in found]}")
        by_id = a.query_by_msg_id(r.msg_id, address=master)
        console.print(f"[bold]query[/] msgId -> {by_id.body.decode() if by_id else None}")
        for address in servers:
            s = a.status(address)
            console.print(
                f"[bold]status[/] {address}: role={s['role']} epoch={s['epoch']} "
                f"maxPhyOffset={s['maxPhyOffset']} flushed={s['flushedPhyOffset']} "
                f"putTps={s['putTps']:.1f}"
            )


def failover(cluster: LocalCluster, servers: list[str]) -> None:
    """Kill the master with SIGKILL, time the first SEND_OK after it, restart the old master
    and show it rejoin as a slave: the controller does it all (no `replog promote`)."""
    curve = cluster.client_curve()
    with Admin(servers, timeout_ms=2000, retries=0, **curve) as admin:
        master = cluster.master(admin)
        if master is None or master.process is None:
            console.print("[red]no master to kill[/]")
            return
        console.print(f"[bold]failover[/] SIGKILL of the master {master.name} "
                      f"({master.address}, pid {master.process.pid}) ...")
        os.kill(master.process.pid, signal.SIGKILL)
        master.process.wait(10)
        killed = time.monotonic()
        with Producer(servers, timeout_ms=30_000, **curve) as p:
            r = p.send("demo-orders", b"after the failover")
        took = time.monotonic() - killed
        new = cluster.master(admin)
        console.print(f"    new master {new.name if new else '?'} answered {r.status.value} "
                      f"{took:.2f} s after the kill (session timeout "
                      f"{cluster.session_ms / 1000:.1f} s)")
        cluster.start_child(master)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                s = admin.status(master.address)
            except BrokerError:
                time.sleep(0.2)
                continue
            if s["role"] == "SLAVE" and s.get("replication", {}).get("haState") == "TRANSFER":
                console.print(f"    {master.name} restarted and rejoined as a SLAVE of "
                              f"{s['masterAddress']} at epoch {s['epoch']}")
                return
            time.sleep(0.2)
        console.print(f"[red]    {master.name} did not rejoin within 30 s[/]")


def main() -> int:
    duration = float(os.environ.get("REPLOG_DEMO_DURATION", "20"))
    problem = zookeeper.missing()
    if problem:
        console.print(f"[yellow]{problem}[/]")
    cluster = LocalCluster(
        Path(os.environ.get("REPLOG_DEMO_DIR", "run/demo")),
        slaves=_env_int("REPLOG_DEMO_SLAVES", 2),
        mode=os.environ.get("REPLOG_DEMO_MODE", "sync"),
        base_port=_env_int("REPLOG_DEMO_BASE_PORT", 10911),
        controller=not problem,
        secure=os.environ.get("REPLOG_DEMO_SECURE", "") not in ("", "0"),
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    console.print(f"starting {len(cluster.children)} brokers under {cluster.directory} ...")
    try:
        with running_cluster(c := cluster):
            servers = [child.address for child in c.children]
            for child in c.children:
                pid = child.process.pid if child.process else "?"
                console.print(f"  {child.name:<9} {child.role:<12} {child.address}  pid {pid}")
            if c.secure:
                console.print(f"  CURVE and ACL on: {c.acl_path}, keys under {c.keys_dir}")
            try:
                if cluster.controller:
                    wait_for_master(cluster, servers)
                workload(servers, **c.client_curve())
                if cluster.controller:
                    failover(cluster, servers)
            except BrokerError as e:
                console.print(f"[red]demo step refused: {e}[/]")
            console.print(f"cluster running for {duration:.0f} s: replog status -s {servers[0]}")
            deadline = time.monotonic() + duration
            while not stop.wait(max(0.0, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    break
            console.print("stopping the cluster ...")
    except RuntimeError as e:
        console.print(f"[red]cluster failed to start: {e}[/]")
        return 1
    console.print("cluster stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
