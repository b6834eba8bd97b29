"""CPU per message on the put paths: client, master and slave, beside the bare transport.

    .venv/bin/python bench/cpu_per_message.py [--count 6000] [--rounds 1] [--only CASE ...]

Rates on this 2-vCPU VM swing with whatever else runs; the CPU each process spends per message
does not swing nearly as much, and on one request in flight it is what lies on the round trip's
path. So this is the instrument for work on the put path: for each case it runs the replog
figure and then the bare-transport reference of ``bench/broker_put.py`` / ``bench/replication.py``
with the same counts, and prints wall rate and CPU microseconds per message of each process
(``/proc/<pid>/stat`` utime + stime of every thread, libzmq's I/O threads included; the client
is this process, timed by ``time.process_time`` around the loop alone).

Cases (128 B bodies unless named):

| case        | replog                                   | reference                            |
|-------------|------------------------------------------|--------------------------------------|
| sync        | ``send``, ASYNC_MASTER alone             | DEALER/ROUTER echo (Python server)   |
| batch       | ``send_batch`` x64, ASYNC_MASTER alone   | echo of one 64-body frame            |
| sync-single | ``send`` 1 KiB, SYNC_MASTER + 1 slave    | the 4-hop relay, 1 KiB               |
| sync-batch  | ``send_batch`` x64 1 KiB, SYNC + slave   | the 4-hop relay of 64 KiB frames     |
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

import _support
import zmq
from broker_put import _echo_server
from replication import Broker, _relay_master, _relay_slave, group

from common.client import Producer
from common.core.errors import SendStatus

CLK_TCK = os.sysconf("SC_CLK_TCK")
CASES = ("sync", "batch", "sync-single", "sync-batch")


def cpu_s(pid: int) -> float:
    """utime + stime of every thread of ``pid`` so far, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Meter:
    """Wall time and CPU of this process (the client) and of the given server processes over
    one ``with`` block."""

    def __init__(self, pids: dict[str, int]):
        self.pids = pids
        self.cpu: dict[str, float] = {}
        self.seconds = 0.0

    def __enter__(self) -> Self:
        self._server0 = {name: cpu_s(pid) for name, pid in self.pids.items()}
        self._client0 = time.process_time()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0
        self.cpu = {"client": time.process_time() - self._client0}
        for name, pid in self.pids.items():
            self.cpu[name] = cpu_s(pid) - self._server0[name]


def report(name: str, msgs: int, meter: Meter) -> dict[str, float]:
    per = {k: v / msgs * 1e6 for k, v in meter.cpu.items()}
    per["total"] = sum(per.values())
    per["rate"] = msgs / meter.seconds
    parts = "  ".join(f"{k} {v:7.1f}" for k, v in per.items() if k not in ("total", "rate"))
    print(f"  {name:<26} {per['rate']:>9.0f} msg/s   CPU us/msg: {parts}  total {per['total']:7.1f}",
          flush=True)
    return per


def spawn(target: Callable[..., None], *args: object) -> multiprocessing.Process:
    proc = multiprocessing.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def end(procs: list[multiprocessing.Process]) -> None:
    for proc in procs:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()


# ---- references ---------------------------------------------------------------------------------
def echo_ref(size: int, count: int, bodies: int, name: str) -> dict[str, float]:
    port = _support.free_port()
    ready = multiprocessing.Event()
    server = spawn(_echo_server, port, ready)
    ready.wait(10)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{port}")
    msg = [b"h" * 16, b"x" * (size * bodies)]
    try:
        for _ in range(200):
            sock.send_multipart(msg)
            sock.recv_multipart()
        requests = count // bodies
        assert server.pid is not None
        with Meter({"server": server.pid}) as meter:
            for _ in range(requests):
                sock.send_multipart(msg)
                sock.recv_multipart()
        return report(name, requests * bodies, meter)
    finally:
        ctx.destroy(0)
        server.kill()
        server.join()


def relay_ref(size: int, count: int, bodies: int, name: str) -> dict[str, float]:
    client_port, ha_port = _support.free_port(), _support.free_port()
    procs = [spawn(_relay_master, client_port, ha_port), spawn(_relay_slave, ha_port)]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{client_port}")
    body = b"x" * (size * bodies)
    try:
        for _ in range(200):
            sock.send_multipart([b"put", body])
            sock.recv_multipart()
        requests = count // bodies
        pids = {"master": procs[0].pid or 0, "slave": procs[1].pid or 0}
        with Meter(pids) as meter:
            for _ in range(requests):
                sock.send_multipart([b"put", body])
                sock.recv_multipart()
        sock.send_multipart([b"stop", b""])
        sock.recv_multipart()
        return report(name, requests * bodies, meter)
    finally:
        ctx.destroy(0)
        end(procs)


# ---- replog -------------------------------------------------------------------------------------
def replog_run(p: Producer, pids: dict[str, int], size: int, count: int, bodies: int,
               name: str) -> dict[str, float]:
    body = b"x" * size
    batch = [body] * bodies
    for _ in range(200):  # warm-up
        p.send("bench", body, queue_id=0)
    requests = count // bodies
    with Meter(pids) as meter:
        if bodies == 1:
            for _ in range(requests):
                r = p.send("bench", body, queue_id=0)
                assert r.status == SendStatus.SEND_OK, r.status
        else:
            for _ in range(requests):
                rs = p.send_batch("bench", batch, queue_id=0)
                assert rs[0].status == SendStatus.SEND_OK, rs[0].status
    return report(name, requests * bodies, meter)


def alone_cases(home: Path, cases: list[str], count: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    broker = Broker(home / "alone", brokerRole="ASYNC_MASTER", flushDiskType="ASYNC_FLUSH").start()
    try:
        assert broker.proc is not None
        with Producer([broker.address], retries=0) as p:
            if "sync" in cases:
                out["sync"] = replog_run(p, {"broker": broker.proc.pid}, 128, count, 1,
                                         "sync 128 B")
                out["sync/ref"] = echo_ref(128, count, 1, "  echo x1 128 B")
            if "batch" in cases:
                out["batch"] = replog_run(p, {"broker": broker.proc.pid}, 128, count * 32, 64,
                                          "send_batch x64 128 B")
                out["batch/ref"] = echo_ref(128, count * 32, 64, "  echo 64 packed 128 B")
    finally:
        broker.stop()
    return out


def sync_cases(home: Path, cases: list[str], count: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    master, slave = group(home / "sync", "SYNC_MASTER")
    try:
        assert master.proc is not None and slave.proc is not None
        pids = {"master": master.proc.pid, "slave": slave.proc.pid}
        with Producer([master.address], retries=0) as p:
            if "sync-single" in cases:
                out["sync-single"] = replog_run(p, pids, 1024, count, 1, "SYNC single 1 KiB")
                out["sync-single/ref"] = relay_ref(1024, count, 1, "  relay 1 KiB")
            if "sync-batch" in cases:
                out["sync-batch"] = replog_run(p, pids, 1024, count * 16, 64,
                                               "SYNC send_batch x64 1 KiB")
                out["sync-batch/ref"] = relay_ref(1024, count * 16, 64, "  relay 64 KiB frames")
    finally:
        slave.stop()
        master.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=6000, help="single sends per figure "
                    "(batch figures send 32x / 16x as many messages)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--only", nargs="*", choices=CASES, default=list(CASES))
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="replog-cpu-"))
    rounds: list[dict[str, dict[str, float]]] = []
    try:
        print(f"CPU per message (us), {os.cpu_count()} CPUs, load "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        for r in range(args.rounds):
            print(f"round {r + 1}", flush=True)
            figures: dict[str, dict[str, float]] = {}
            figures.update(alone_cases(home / f"r{r}", args.only, args.count))
            figures.update(sync_cases(home / f"r{r}", args.only, args.count))
            rounds.append(figures)
        print("medians over rounds: replog total CPU / reference total CPU, rate ratio")
        for case in args.only:
            mine = statistics.median(f[case]["total"] for f in rounds)
            ref = statistics.median(f[case + "/ref"]["total"] for f in rounds)
            rate = statistics.median(f[case]["rate"] / f[case + "/ref"]["rate"] for f in rounds)
            print(f"  {case:<12} {mine:8.1f} us / {ref:8.1f} us = {mine / ref:5.2f}x CPU; "
                  f"rate {rate:5.2f}x the reference")
        return 0
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
