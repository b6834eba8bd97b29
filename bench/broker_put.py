"""Put throughput and latency: replog client -> broker over tcp://127.0.0.1, beside references.

Measured for 128 B and 1 KiB bodies, in one run:

| case      | replog                               | reference                                 |
|-----------|--------------------------------------|-------------------------------------------|
| sync      | ``Producer.send``, 1 in flight       | pyzmq DEALER/ROUTER echo, 1 in flight;    |
|           |                                      | Redis XADD one at a time                  |
| async64   | ``Producer.send_async``, 64 in flight| echo, 64 in flight; Redis XADD pipelined 64|
|           | (keyless: the producer's own sticky  |                                           |
|           | queue choice, as Kafka's producer)   |                                           |
| async64k  | the same with ``shard_key`` (16 keys | echo, 64 in flight                        |
|           | over the topic's queues: one batch   |                                           |
|           | in flight per queue, for key order)  |                                           |
| batch64   | ``Producer.send_batch`` of 64        | echo of one 64-body frame (the bodies     |
|           |                                      | travel packed, as SEND_BATCH sends them); |
|           |                                      | Redis pipe 64                             |

The broker (ASYNC_MASTER, ASYNC_FLUSH), the echo server and ``redis-server`` (Debian's, started
here on a free port with persistence off) each run in their own process. Prints msgs/s, MB/s,
p50/p99 latency per figure and the ratio to each reference. ``REPLOG_BENCH_SCALE`` (default 1.0)
scales the message counts.
"""

from __future__ import annotations

import collections
import concurrent.futures
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import _support
import zmq
from _support import Figure

from common.client import Producer, SendResult

SCALE = float(os.environ.get("REPLOG_BENCH_SCALE", "1.0"))
SIZES = (128, 1024)
WINDOW = 64
BATCH = 64


def n(count: int) -> int:
    return max(BATCH, int(count * SCALE))


def start_broker(home: Path) -> tuple[subprocess.Popen[bytes], str]:
    return _support.start_broker(home, brokerRole="ASYNC_MASTER", flushDiskType="ASYNC_FLUSH",
                                 mappedFileSizeCommitLog=256 * 1024 * 1024)


def replog_sync(p: Producer, size: int, count: int) -> Figure:
    body = b"x" * size
    lat = []
    start = time.perf_counter()
    for _ in range(count):
        t = time.perf_counter()
        p.send("bench", body, queue_id=0)
        lat.append((time.perf_counter() - t) * 1000)
    return Figure("sync", count, time.perf_counter() - start, lat, size)


def replog_async(p: Producer, size: int, count: int) -> Figure:
    """``send_async`` with at most WINDOW sends outstanding, the way a pipelining caller keeps
    a window: when it is full, wait for the oldest. Latencies come from done-callbacks."""
    body = b"x" * size
    clock = time.perf_counter
    lat: list[float] = []
    window: collections.deque[concurrent.futures.Future[SendResult]] = collections.deque()
    start = clock()
    for _ in range(count):
        if len(window) >= WINDOW:
            window.popleft().result(120)  # raises the send's error, if any
        t0 = clock()
        fut = p.send_async("bench", body)  # the producer picks queues (sticky)
        fut.add_done_callback(lambda _f, t0=t0: lat.append((clock() - t0) * 1000))
        window.append(fut)
    for fut in window:
        fut.result(120)
    return Figure("async64", count, clock() - start, lat, size)


def replog_async_keyed(p: Producer, size: int, count: int, keys: int = 16) -> Figure:
    """``replog_async`` with a ``shard_key`` per message (``keys`` keys in turn): a queue
    carrying keyed messages has one batch in flight, so that a retry keeps their order."""
    body = b"x" * size
    clock = time.perf_counter
    lat: list[float] = []
    window: collections.deque[concurrent.futures.Future[SendResult]] = collections.deque()
    names = [f"key-{i}" for i in range(keys)]
    start = clock()
    for i in range(count):
        if len(window) >= WINDOW:
            window.popleft().result(120)
        t0 = clock()
        fut = p.send_async("bench-keyed", body, shard_key=names[i % keys])
        fut.add_done_callback(lambda _f, t0=t0: lat.append((clock() - t0) * 1000))
        window.append(fut)
    for fut in window:
        fut.result(120)
    return Figure("async64k", count, clock() - start, lat, size)


def replog_batch(p: Producer, size: int, count: int) -> Figure:
    bodies = [b"x" * size] * BATCH
    lat = []
    start = time.perf_counter()
    for _ in range(count // BATCH):
        t = time.perf_counter()
        p.send_batch("bench", bodies, queue_id=0)
        lat.append((time.perf_counter() - t) * 1000)
    return Figure("batch64", count // BATCH * BATCH, time.perf_counter() - start, lat, size)


# ---- bare pyzmq echo ------------------------------------------------------------------------------


def _echo_server(port: int, ready: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(f"tcp://127.0.0.1:{port}")
    ready.set()
    while True:
        sock.send_multipart(sock.recv_multipart())  # runs until the benchmark kills it


def echo_run(
    address: str, size: int, count: int, window: int, bodies_per_msg: int, name: str
) -> Figure:
    """Requests of one header frame and one frame of ``bodies_per_msg`` bodies back to back
    (the shape of SEND and SEND_BATCH on the wire), ``window`` in flight."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(f"tcp://{address}")
    msg = [b"h" * 16, b"x" * (size * bodies_per_msg)]
    sent_at: list[float] = []
    lat = []
    requests = count // bodies_per_msg
    start = time.perf_counter()
    inflight = received = sent = 0
    while received < requests:
        while inflight < window and sent < requests:
            sock.send_multipart(msg)
            sent_at.append(time.perf_counter())
            sent += 1
            inflight += 1
        sock.recv_multipart()
        lat.append((time.perf_counter() - sent_at[received]) * 1000)
        received += 1
        inflight -= 1
    seconds = time.perf_counter() - start
    sock.close(linger=0)
    ctx.term()
    return Figure(name, requests * bodies_per_msg, seconds, lat, size)


# ---- redis ----------------------------------------------------------------------------------------


def start_redis(home: Path) -> tuple[subprocess.Popen[bytes] | None, int]:
    port = _support.free_port()
    proc = _support.start_redis(home, port)
    return proc, port if proc is not None else 0


def redis_run(port: int, size: int, count: int, pipeline: int) -> Figure:
    import redis

    client = redis.Redis(port=port)
    body = b"x" * size
    lat = []
    start = time.perf_counter()
    if pipeline == 1:
        for _ in range(count):
            t = time.perf_counter()
            client.xadd("bench", {"b": body})
            lat.append((time.perf_counter() - t) * 1000)
    else:
        for _ in range(count // pipeline):
            t = time.perf_counter()
            pipe = client.pipeline(transaction=False)
            for _ in range(pipeline):
                pipe.xadd("bench", {"b": body})
            pipe.execute()
            lat.append((time.perf_counter() - t) * 1000)
    seconds = time.perf_counter() - start
    client.delete("bench")
    client.close()
    return Figure(f"redis xadd x{pipeline}", count // pipeline * pipeline, seconds, lat, size)


# ---- report ---------------------------------------------------------------------------------------


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="replog-bench-"))
    children: list[Callable[[], None]] = []
    try:
        broker, address = start_broker(home)
        children.append(lambda: _support.stop(broker))
        echo_port = _support.free_port()
        ready = multiprocessing.Event()
        echo = multiprocessing.Process(target=_echo_server, args=(echo_port, ready), daemon=True)
        echo.start()
        children.append(lambda: (echo.kill(), echo.join(5)))
        ready.wait(10)
        redis_proc, redis_port = start_redis(home)
        if redis_proc is not None:
            children.append(lambda: _support.stop(redis_proc))
        print(f"replog put benchmark (broker {address}, scale {SCALE}, {os.cpu_count()} CPUs)")
        with Producer([address]) as p:
            p.send("bench", b"warm-up", queue_id=0)
            for size in SIZES:
                run_size(p, size, echo_port, redis_port)
        return 0
    finally:
        for stop in reversed(children):
            stop()
        shutil.rmtree(home, ignore_errors=True)


def run_size(p: Producer, size: int, echo_port: int, redis_port: int) -> None:
    echo_addr = f"127.0.0.1:{echo_port}"
    print(f"\nbody {size} B")
    sync = replog_sync(p, size, n(5000))
    asy = replog_async(p, size, n(50_000))
    keyed = replog_async_keyed(p, size, n(50_000))
    batch = replog_batch(p, size, n(200_000))
    echo1 = echo_run(echo_addr, size, n(5000), 1, 1, "echo x1")
    echo64 = echo_run(echo_addr, size, n(50_000), WINDOW, 1, "echo 64 in flight")
    echob = echo_run(echo_addr, size, n(200_000), 1, BATCH, "echo 64 bodies packed")
    r1 = r64 = None
    if redis_port:
        r1 = redis_run(redis_port, size, n(5000), 1)
        r64 = redis_run(redis_port, size, n(50_000), BATCH)
    for f, refs in ((sync, (echo1, r1)), (asy, (echo64, r64)), (keyed, (echo64,)),
                    (batch, (echob, r64))):
        print(f.line())
        for ref in refs:
            if ref is not None:
                print("    vs" + ref.line()[1:] + f"   ratio {f.rate / ref.rate:.2f}x")
    if r1 is None:
        print("  (redis-server not installed: Redis references skipped)")
    print(f"  acceptance (issue 24), body {size} B: each ratio within this run")
    for f, bare, bare_target, red, red_target in (
        (sync, echo1, 0.9, r1, 1.0),
        (asy, echo64, 0.9, r64, 1.0),
        (batch, echob, 0.6, r64, 3.0),
    ):
        print("    " + _support.acceptance_row(f, bare, bare_target, red, red_target))
    print(f"    sync send p99 {sync.pct(0.99):.3f} ms (target < 2 ms): "
          f"{'met' if sync.pct(0.99) < 2.0 else 'MISSED'}")


if __name__ == "__main__":
    sys.exit(main())
