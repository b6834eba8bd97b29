"""N client processes, one message in flight each: replog against Redis and NATS JetStream.

    .venv/bin/python bench/concurrency.py [--seconds 3] [--rounds 3] [--clients 1 4 16]
                                          [--size 128]

Issue 43 asks, at N=1, a sync send of at least 0.9x Redis ``XADD`` and 1.2x JetStream, and at
N=16 at least 0.8x Redis. For each N, in turn within each round:

| system  | server                                            | each client process            |
|---------|---------------------------------------------------|--------------------------------|
| replog  | a broker (ASYNC_MASTER, ASYNC_FLUSH)               | ``Producer.send``, one by one  |
| redis   | Debian's ``redis-server``, persistence off         | ``XADD`` (redis-py), one by one|
| nats    | Debian's ``nats-server -js``, a stream of file     | ``js.publish`` (nats-py), each |
|         | storage, one replica (R1), on the subject used     | awaited before the next        |

The client processes start, import and connect, and once every one is ready they send for
``--seconds``, from the same moment, and report how many they sent; the figure is the sum over the processes of messages per second, and the server's
CPU per message (``/proc``: every thread of the server process, over the same span). Redis
keeps nothing on disk here and JetStream writes its file without an fsync per message: both
answer from memory, as replog's ASYNC_FLUSH does. Rounds take the systems in turn; the
median of each figure over the rounds is printed, with replog's ratios to the others (both
measured in the same round).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _support

from common.client import Producer

CLK_TCK = os.sysconf("SC_CLK_TCK")
STREAM, SUBJECT = "BENCH", "bench.messages"
TOPIC = "concurrency"
TARGETS = {1: {"redis": 0.9, "nats": 1.2}, 16: {"redis": 0.8}}


def cpu_s(pid: int) -> float:
    """utime + stime of every thread of ``pid`` so far, in seconds."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


# ---- one client process: connect, wait for the go, send one at a time until the stop ------
Go = Callable[[], float]  # says ready, waits for every process: the stop time


def _replog_client(address: str, body: bytes, go: Go) -> int:
    with Producer([address]) as producer:
        producer.send(TOPIC, body)  # connected, the route known
        stop = go()
        n = 0
        while time.time() < stop:
            producer.send(TOPIC, body)
            n += 1
    return n


def _redis_client(port: int, body: bytes, go: Go) -> int:
    import redis

    client = redis.Redis(port=port)
    client.xadd("bench", {"b": body}, maxlen=100_000, approximate=True)
    stop = go()
    n = 0
    while time.time() < stop:
        client.xadd("bench", {"b": body}, maxlen=100_000, approximate=True)
        n += 1
    client.close()
    return n


def _nats_client(port: int, body: bytes, go: Go) -> int:
    import nats

    async def run() -> int:
        nc = await nats.connect(f"nats://127.0.0.1:{port}")
        js = nc.jetstream()
        await js.publish(SUBJECT, body)
        stop = go()  # blocks the loop: nothing else runs on it meanwhile
        n = 0
        while time.time() < stop:
            await js.publish(SUBJECT, body)
            n += 1
        await nc.close()
        return n

    return asyncio.run(run())


CLIENTS: dict[str, Callable[..., int]] = {"replog": _replog_client, "redis": _redis_client,
                                          "nats": _nats_client}


def _child(kind: str, target: str | int, body: bytes, ready: Any, go: Any, span: Any,
           out: Any) -> None:
    def wait_go() -> float:
        ready.put(1)
        go.wait()
        start, stop = span[0], span[1]
        while time.time() < start:  # every process begins at the same moment
            time.sleep(0.0002)
        return float(stop)

    out.put(CLIENTS[kind](target, body, wait_go))


def run_clients(kind: str, target: str | int, server_pid: int, clients: int, seconds: float,
                size: int) -> tuple[float, float]:
    """(messages per second over every client, server CPU microseconds per message). The
    processes start, import and connect first; the span begins once all are ready."""
    ctx = multiprocessing.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    go = ctx.Event()
    span = ctx.Array("d", 2)
    procs = [ctx.Process(target=_child,
                         args=(kind, target, os.urandom(size), ready, go, span, out))
             for _ in range(clients)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    start = time.time() + 0.2
    stop = start + seconds
    span[0], span[1] = start, stop
    go.set()
    time.sleep(max(0.0, start - time.time()))
    cpu0 = cpu_s(server_pid)
    time.sleep(max(0.0, stop - time.time()))
    cpu1 = cpu_s(server_pid)
    sent = sum(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
    return sent / seconds, (cpu1 - cpu0) / max(sent, 1) * 1e6


# ---- the servers --------------------------------------------------------------------------
def start_nats(home: Path) -> tuple[subprocess.Popen[bytes], int] | None:
    """``nats-server -js`` with its store in ``home`` and the stream made (R1, file storage);
    None when nats-server or nats-py is missing."""
    binary = shutil.which("nats-server") or ("/usr/sbin/nats-server"
                                              if Path("/usr/sbin/nats-server").exists() else None)
    try:
        import nats
    except ImportError:
        return None
    if binary is None:
        return None
    port = _support.free_port()
    home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([binary, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(home)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def not_up_yet(_error: Exception) -> None:
        """nats-py's error callback (the default prints each refused connection)."""

    async def make_stream() -> None:
        deadline = time.monotonic() + 10
        while True:
            try:
                nc = await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=1,
                                        max_reconnect_attempts=0, error_cb=not_up_yet)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
        js = nc.jetstream()
        await js.add_stream(name=STREAM, subjects=[SUBJECT], storage="file", num_replicas=1,
                            max_msgs=1_000_000)
        await nc.close()

    try:
        asyncio.run(make_stream())
    except Exception:  # noqa: BLE001 - any failure to set it up: the rows are skipped, said so
        _support.stop(proc)
        return None
    return proc, port


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--size", type=int, default=128)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="replog-concurrency-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        broker, address = _support.start_broker(tmp / "replog", brokerRole="ASYNC_MASTER",
                                                flushDiskType="ASYNC_FLUSH")
        procs.append(broker)
        systems: dict[str, tuple[str | int, int]] = {"replog": (address, broker.pid)}
        redis_port = _support.free_port()
        redis = _support.start_redis(tmp / "redis", redis_port)
        if redis is not None:
            procs.append(redis)
            systems["redis"] = (redis_port, redis.pid)
        else:
            print("redis-server is not installed: the Redis rows are skipped")
        started = start_nats(tmp / "nats")
        if started is not None:
            procs.append(started[0])
            systems["nats"] = (started[1], started[0].pid)
        else:
            print("nats-server or nats-py is missing: the JetStream rows are skipped")
        print(f"{args.rounds} rounds x {args.seconds:.0f} s per figure, {args.size} B bodies, "
              f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; one message in flight "
              "per client process")
        for n in args.clients:
            rates: dict[str, list[float]] = {k: [] for k in systems}
            cpus: dict[str, list[float]] = {k: [] for k in systems}
            ratios: dict[str, list[float]] = {k: [] for k in systems if k != "replog"}
            for _ in range(args.rounds):
                this: dict[str, float] = {}
                for kind, (where, pid) in systems.items():
                    rate, cpu = run_clients(kind, where, pid, n, args.seconds, args.size)
                    rates[kind].append(rate)
                    cpus[kind].append(cpu)
                    this[kind] = rate
                for other, values in ratios.items():
                    values.append(this["replog"] / this[other] if this[other] else 0.0)
            print(f"N={n}:")
            for kind in systems:
                print(f"  {kind:<7} {statistics.median(rates[kind]):>9.0f} msg/s   server CPU "
                      f"{statistics.median(cpus[kind]):>6.1f} us/msg   rounds "
                      f"{[round(r) for r in rates[kind]]}")
            for other, values in ratios.items():
                target = TARGETS.get(n, {}).get(other)
                ratio = statistics.median(values)
                verdict = "" if target is None else \
                    f" (target >= {target}x: {'met' if ratio >= target else 'MISSED'})"
                print(f"  replog / {other}: {ratio:.2f}x, median of the rounds' ratios"
                      f"{verdict}")
    finally:
        for p in procs:
            _support.stop(p)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
