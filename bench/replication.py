"""Replication figures: catch-up rate, SYNC vs ASYNC puts, SYNC latency, slave lag, beside references.

    .venv/bin/python bench/replication.py [--catchup-mib 1024] [--count 20000] [--lag-seconds 10]

1. Catch-up: an ASYNC master is filled with ``--catchup-mib`` MiB, then an empty slave starts;
   MB/s from the slave's first byte to holding the master's max, beside a bare pyzmq PUSH/PULL
   of 32 KiB frames between two processes, same byte count, in the same run (target >= 50%).
   A second reference, measured once the master is filled and before the slave starts (its
   files are kept, so the slave gets no memory it freed): the same PUSH/PULL whose receiver also
   ``pwrite``s every frame into new 256 MiB files. That is the least any replica that keeps
   the bytes must do, and on this VM it is bound by memory the guest has not touched lately:
   a page cache page the kernel hands out for the first time costs the hypervisor a fault
   (the balloon driver's free page reporting gives freed memory back), ~0.4-0.5 GB/s against
   ~2.4 GB/s for memory just freed. The plain PUSH/PULL reuses one buffer and never pays it.
2. Put throughput, 1 KiB bodies, SYNC_MASTER + slave vs ASYNC_MASTER + slave: 1, 16 and 64
   sends in flight (``send`` / ``send_async``) and ``send_batch`` of 64 (target: SYNC >= 70% of
   ASYNC at 64 in flight).
3. SYNC put latency p50/p99 at 16 in flight (target p99 < 5 ms).
4. Slave lag under ASYNC load paced at 80% of the ASYNC 64-in-flight maximum for
   ``--lag-seconds``: the master's ``lagBytes`` for the slave sampled every 20 ms (p50/p99/max).
5. The transport's floor: the four hops of a SYNC put (client -> master -> slave -> master ->
   client) in bare pyzmq with no work, one request in flight, a 1 KiB frame and a 64 KiB one.
6. Redis (Debian ``redis-server``) master + replica started here: XADD then ``WAIT 1 1000`` one
   at a time, and 64 pipelined XADDs then one WAIT 1 (issue 24: our SYNC single sends reported
   against the first, our SYNC ``send_batch`` of 64 >= 2x the second).
``--rounds N`` runs only issue 43's two SYNC rows against Redis (6.), in N interleaved rounds
of short legs, and prints each round's ratios and their medians (targets 0.7x and 1.5x).

7. The acceptance rows of issue 24, each ratio from this run: SYNC single >= 0.8x the bare
   relay (5.), SYNC ``send_batch`` of 64 >= 0.6x the bare relay of 64-body frames and >= 2x
   Redis, catch-up >= 50% of bare PUSH/PULL. ``--body`` sets the put figures' body size
   (default 1024; issue 24's table is at 128).

Every broker runs in its own process (``python -m common.cli broker``) with its own directory
under a temp dir that is removed at the end; children are stopped by pid.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _support
import zmq
from _support import Figure

from common.client import Admin, Producer
from common.core.errors import SendStatus

BODY = 1024
FRAME = 32 * 1024
SEGMENT = 256 * 1024 * 1024  # the benchmark brokers' mappedFileSizeCommitLog
REPORTING_S = 5.0  # freed memory is reported to the hypervisor after ~2 s (page_reporting)
WIDTH = 28  # name column of the report
WAKES: list[str] = []  # put_figures: how the SYNC master's replica waits were woken


class Broker:
    def __init__(self, home: Path, **fields: Any):
        self.port = _support.free_port(2)
        self.home = home
        _support.write_config(home, listenPort=self.port, haListenPort=self.port + 1,
                              mappedFileSizeCommitLog=SEGMENT, **fields)
        self.address = f"127.0.0.1:{self.port}"
        self.ha_address = f"127.0.0.1:{self.port + 1}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.admin = Admin([self.address], timeout_ms=5000, retries=0)

    def start(self) -> Broker:
        self.proc = _support.launch(self.home, self.address)
        return self

    def status(self) -> dict[str, Any]:
        return self.admin.status(self.address)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.admin.close()


def wait_until(cond: Any, timeout_s: float, what: str, step_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(step_s)


def group(home: Path, role: str, **fields: Any) -> tuple[Broker, Broker]:
    master = Broker(home / "master", brokerRole=role, **fields).start()
    slave = Broker(
        home / "slave", brokerRole="SLAVE", brokerId=1, haMasterAddress=master.ha_address, **fields
    ).start()
    wait_until(lambda: any(s["inSync"] for s in master.status()["slaves"]), 20, "slave in sync")
    return master, slave


# ---- 1. catch-up ------------------------------------------------------------------------------
def catch_up(
    home: Path, total_bytes: int, before_slave: Callable[[], object] = lambda: None, **ha: Any
) -> float | None:
    """MB/s of an empty slave catching up, timed from its first reported offset; None when it
    was (nearly) done before it could first be asked (too little data to time). ``before_slave``
    runs once the master is filled and its pages are written back."""
    master = Broker(home / "cu-master", brokerRole="ASYNC_MASTER", **ha).start()
    slave = Broker(
        home / "cu-slave", brokerRole="SLAVE", brokerId=1, haMasterAddress=master.ha_address, **ha
    )
    try:
        body = os.urandom(16 * 1024)
        with Producer([master.address], retries=0, timeout_ms=30_000) as p:
            while master.status()["maxPhyOffset"] < total_bytes:
                for _ in range(32):
                    p.send_batch("fill", [body] * 64, queue_id=0)
        end = master.status()["maxPhyOffset"]
        os.sync()  # the fill's dirty pages written back: the slave does not wait on them
        before_slave()
        os.sync()
        slave.start()
        first_offset, first_t = 0, 0.0
        while True:
            now = time.perf_counter()
            offset = slave.status()["maxPhyOffset"]
            if offset > 0 and first_t == 0.0:
                first_offset, first_t = offset, now
            if offset >= end:
                break
            time.sleep(0.01)
        seconds = now - first_t
        if seconds <= 0 or end - first_offset < total_bytes // 4:
            return None
        return (end - first_offset) / seconds / 1e6
    finally:
        slave.stop()
        master.stop()


def _pull_side(port: int, total: int, out: Any, store: str | None) -> None:
    """Receive ``total`` bytes; with ``store``, also ``pwrite`` them into fresh 256 MiB files
    there, as a replica that keeps what it receives must (page cache pages it has never held)."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.PULL)
    s.bind(f"tcp://127.0.0.1:{port}")
    fd, written = -1, 0
    s.recv()
    t0 = time.perf_counter()
    while written < total:
        frame = s.recv(copy=False)
        if store is not None:
            if written % SEGMENT == 0:
                if fd >= 0:
                    os.close(fd)
                fd = os.open(os.path.join(store, f"{written:020d}"), os.O_RDWR | os.O_CREAT, 0o644)
                os.ftruncate(fd, SEGMENT)
            os.pwrite(fd, frame.buffer, written % SEGMENT)
        written += len(frame)
    out.put(time.perf_counter() - t0)
    if fd >= 0:
        os.close(fd)
    s.close(0)
    ctx.term()


def push_pull(total_bytes: int, store: Path | None = None) -> float:
    """MB/s of a bare pyzmq PUSH/PULL of 32 KiB frames between two processes; with ``store``,
    the receiver also writes them to new files in that directory (left there: freeing the
    pages would hand warm memory to whatever runs next)."""
    port = _support.free_port(1)
    out: multiprocessing.Queue[float] = multiprocessing.Queue()
    frames = total_bytes // FRAME
    if store is not None:
        store.mkdir(parents=True, exist_ok=True)
    receiver = multiprocessing.Process(
        target=_pull_side, args=(port, frames * FRAME, out, None if store is None else str(store))
    )
    receiver.start()
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.connect(f"tcp://127.0.0.1:{port}")
    s.send(b"go")
    frame = os.urandom(FRAME)
    for _ in range(frames):
        s.send(frame)
    seconds = out.get(timeout=600)
    receiver.join(10)
    s.close(0)
    ctx.term()
    return frames * FRAME / seconds / 1e6


# ---- 2./3. puts -------------------------------------------------------------------------------
def sends(p: Producer, count: int, name: str) -> Figure:
    body = b"x" * BODY
    lat = []
    t0 = time.perf_counter()
    for _ in range(count):
        t = time.perf_counter()
        r = p.send("bench", body, queue_id=0)
        lat.append((time.perf_counter() - t) * 1000)
        assert r.status == SendStatus.SEND_OK, r.status
    return Figure(name, count, time.perf_counter() - t0, lat, BODY)


def in_flight(p: Producer, count: int, window: int, name: str, rate: float = 0.0) -> Figure:
    """``count`` send_async with at most ``window`` outstanding; paced to ``rate``/s if set."""
    body = b"x" * BODY
    slots = threading.BoundedSemaphore(window)
    lat: list[float] = []
    bad: list[Any] = []
    done = threading.Event()
    left = [count]
    lock = threading.Lock()

    def finished(t: float, f: Any) -> None:
        lat.append((time.perf_counter() - t) * 1000)
        exc = f.exception()
        if exc is not None or f.result().status != SendStatus.SEND_OK:
            bad.append(exc or f.result().status)
        slots.release()
        with lock:
            left[0] -= 1
            if left[0] == 0:
                done.set()

    t0 = time.perf_counter()
    for i in range(count):
        if rate > 0:
            due = t0 + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        slots.acquire()
        t = time.perf_counter()
        p.send_async("bench", body, queue_id=i % 4).add_done_callback(lambda f, t=t: finished(t, f))
    done.wait(300)
    if bad:
        raise RuntimeError(f"{name}: {len(bad)} sends not SEND_OK, e.g. {bad[0]}")
    return Figure(name, count, time.perf_counter() - t0, lat, BODY)


def batches(p: Producer, count: int, name: str) -> Figure:
    bodies = [b"x" * BODY] * 64
    lat = []
    t0 = time.perf_counter()
    for _ in range(count // 64):
        t = time.perf_counter()
        rs = p.send_batch("bench", bodies, queue_id=0)
        lat.append((time.perf_counter() - t) * 1000)
        assert rs[0].status == SendStatus.SEND_OK, rs[0].status
    return Figure(name, count // 64 * 64, time.perf_counter() - t0, lat, BODY)


def put_figures(home: Path, role: str, count: int) -> dict[str, Figure]:
    tag = "SYNC" if role == "SYNC_MASTER" else "ASYNC"
    master, slave = group(home / tag.lower(), role)
    try:
        with Producer([master.address], retries=0) as p:
            in_flight(p, min(count, 2000), 16, "warm-up")
            figs = {
                "1": sends(p, count // 4, f"{tag} 1 in flight"),
                "16": in_flight(p, count, 16, f"{tag} 16 in flight"),
                "64": in_flight(p, count, 64, f"{tag} 64 in flight"),
                "batch": batches(p, count * 2, f"{tag} send_batch x64"),
            }
        st = master.status()
        if role == "SYNC_MASTER":  # who woke the replica waits: the I/O thread, or a hand-off
            WAKES.append(f"    SYNC master: replica waits woken {st.get('wakesInline', 0)} times "
                         f"on the I/O thread (an HA ack read there), {st.get('wakesPosted', 0)} "
                         "through the mailbox from another thread")
        return figs
    finally:
        slave.stop()
        master.stop()


# ---- 4. lag -----------------------------------------------------------------------------------
def lag_under_load(home: Path, rate: float, seconds: float) -> tuple[list[int], Figure]:
    master, slave = group(home / "lag", "ASYNC_MASTER")
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        with Admin([master.address], timeout_ms=5000, retries=0) as admin:
            while not stop.wait(0.02):
                slaves = admin.status(master.address)["slaves"]
                if slaves:
                    samples.append(int(slaves[0]["lagBytes"]))

    sampler = threading.Thread(target=sample)
    try:
        with Producer([master.address], retries=0) as p:
            sampler.start()
            fig = in_flight(p, int(rate * seconds), 64, "ASYNC paced load", rate=rate)
        return samples, fig
    finally:
        stop.set()
        if sampler.is_alive():
            sampler.join(10)
        slave.stop()
        master.stop()


# ---- 5. the transport's floor: a bare relay ---------------------------------------------------
def _relay_master(client_port: int, ha_port: int) -> None:
    """Client ROUTER and HA ROUTER polled by one thread, as the broker's I/O thread does: each
    request goes to the slave at once, each ack answers the oldest request. No work at all."""
    ctx = zmq.Context()
    front, ha = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    front.bind(f"tcp://127.0.0.1:{client_port}")
    ha.bind(f"tcp://127.0.0.1:{ha_port}")
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    poller.register(ha, zmq.POLLIN)
    slave = ha.recv_multipart()[0]  # its hello
    waiting: list[bytes] = []
    while True:
        events = dict(poller.poll())
        if front in events:
            client, kind, body = front.recv_multipart()
            if kind == b"stop":
                front.send_multipart([client, b"stopped"])
                break
            waiting.append(client)
            ha.send_multipart([slave, b"data", body])
        if ha in events:
            ha.recv_multipart()
            front.send_multipart([waiting.pop(0), b"ok"])
    ha.send_multipart([slave, b"stop", b""])
    ctx.destroy(0)


def _relay_slave(ha_port: int) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(f"tcp://127.0.0.1:{ha_port}")
    s.send(b"hello")
    while s.recv_multipart()[0] != b"stop":
        s.send_multipart([b"ack", b"\0" * 8])
    ctx.destroy(0)


def relay(count: int, body_bytes: int, msgs_per_request: int, name: str) -> Figure:
    """A SYNC put's four hops with nothing else: client -> master -> slave -> master -> client,
    one request in flight, bare pyzmq, three processes (``msgs_per_request`` x ``body_bytes``
    in one frame for a batch)."""
    client_port, ha_port = _support.free_port(1), _support.free_port(1)
    procs = [multiprocessing.Process(target=_relay_master, args=(client_port, ha_port)),
             multiprocessing.Process(target=_relay_slave, args=(ha_port,))]
    for proc in procs:
        proc.start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{client_port}")
    body = b"x" * (body_bytes * msgs_per_request)
    try:
        for _ in range(200):
            sock.send_multipart([b"put", body])
            sock.recv_multipart()
        lat = []
        t0 = time.perf_counter()
        for _ in range(count):
            t = time.perf_counter()
            sock.send_multipart([b"put", body])
            sock.recv_multipart()
            lat.append((time.perf_counter() - t) * 1000)
        seconds = time.perf_counter() - t0
        sock.send_multipart([b"stop", b""])
        sock.recv_multipart()
    finally:
        ctx.destroy(0)
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return Figure(name, count * msgs_per_request, seconds, lat, body_bytes)


# ---- 6. redis ---------------------------------------------------------------------------------
@contextlib.contextmanager
def redis_pair(home: Path) -> Iterator[Any]:
    """A Redis master and its replica, linked: the master's client (None: no redis-server)."""
    if shutil.which("redis-server") is None:
        yield None
        return
    import redis

    mport, rport = _support.free_port(1), _support.free_port(1)
    started = [_support.start_redis(home / "redis-m", mport),
               _support.start_redis(home / "redis-r", rport, mport)]
    procs = [p for p in started if p is not None]
    try:
        if len(procs) < 2:
            yield None
            return
        client = redis.Redis(port=mport)
        wait_until(
            lambda: (
                _redis_up(client) and client.info("replication").get("connected_slaves", 0) >= 1
            ),
            20,
            "redis replica",
        )
        replica = redis.Redis(port=rport)
        wait_until(
            lambda: replica.info("replication").get("master_link_status") == "up",
            20,
            "redis replica link",
        )
        replica.close()
        yield client
        client.close()
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def redis_single(client: Any, count: int) -> Figure:
    """XADD then ``WAIT 1 1000``, one at a time."""
    body = b"x" * BODY
    lat = []
    t0 = time.perf_counter()
    for _ in range(count):
        t = time.perf_counter()
        client.xadd("bench", {"b": body})
        assert client.wait(1, 1000) >= 1
        lat.append((time.perf_counter() - t) * 1000)
    return Figure("redis XADD+WAIT 1", count, time.perf_counter() - t0, lat, BODY)


def redis_batch(client: Any, count: int) -> Figure:
    """64 pipelined XADDs, then one ``WAIT 1 1000``."""
    body = b"x" * BODY
    lat = []
    t0 = time.perf_counter()
    for _ in range(count // 64):
        t = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        for _ in range(64):
            pipe.xadd("bench", {"b": body})
        pipe.execute()
        assert client.wait(1, 1000) >= 1
        lat.append((time.perf_counter() - t) * 1000)
    return Figure("redis XADD x64+WAIT 1", count // 64 * 64, time.perf_counter() - t0, lat, BODY)


def redis_figures(home: Path, count: int) -> dict[str, Figure] | None:
    with redis_pair(home) as client:
        if client is None:
            return None
        return {"1": redis_single(client, count // 4), "batch": redis_batch(client, count * 2)}


def sync_rounds(home: Path, rounds: int, count: int) -> int:
    """Issue 43's two SYNC_MASTER rows in interleaved short legs (a slow spell of the VM hits
    both sides of a round): a SYNC single send against Redis XADD + WAIT 1 (target >= 0.7x)
    and a SYNC ``send_batch`` of 64 against 64 pipelined XADDs + WAIT 1 (target >= 1.5x);
    each round's ratio, and their median."""
    master, slave = group(home / "rounds", "SYNC_MASTER")
    ratios: dict[str, list[float]] = {"1": [], "batch": []}
    try:
        with redis_pair(home) as client, Producer([master.address], retries=0) as p:
            if client is None:
                print("redis-server not installed: no rounds")
                return 1
            sends(p, 500, "warm-up")
            redis_single(client, 200)
            for i in range(rounds):
                one = sends(p, count // 4, "SYNC 1 in flight")
                r_one = redis_single(client, count // 4)
                batch = batches(p, count * 2, "SYNC send_batch x64")
                r_batch = redis_batch(client, count * 2)
                ratios["1"].append(one.rate / r_one.rate)
                ratios["batch"].append(batch.rate / r_batch.rate)
                print(f"  round {i + 1}: SYNC 1 {one.rate:.0f}/s vs {r_one.rate:.0f}/s "
                      f"{ratios['1'][-1]:.2f}x; SYNC batch x64 {batch.rate:.0f}/s vs "
                      f"{r_batch.rate:.0f}/s {ratios['batch'][-1]:.2f}x", flush=True)
    finally:
        slave.stop()
        master.stop()
    print(f"issue 43, bodies {BODY} B, medians of {rounds} interleaved rounds:")
    for key, name, target in (("1", "SYNC 1 in flight vs XADD+WAIT 1", 0.7),
                              ("batch", "SYNC send_batch x64 vs XADD x64+WAIT 1", 1.5)):
        median = statistics.median(ratios[key])
        print(f"    {name:40s} {median:.2f}x  [{min(ratios[key]):.2f}-{max(ratios[key]):.2f}]"
              f"  (target >= {target}x: {'met' if median >= target else 'MISSED'})")
    return 0


def _redis_up(client: Any) -> bool:
    import redis

    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


# ---- main -------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--catchup-mib", type=int, default=1024)
    ap.add_argument("--count", type=int, default=20_000, help="sends per in-flight figure")
    ap.add_argument("--lag-seconds", type=float, default=10.0)
    ap.add_argument("--ha-batch-kib", type=int, default=128, help="haTransferBatchSize (catch-up)")
    ap.add_argument("--ha-window-mib", type=int, default=4, help="haWindowBytes (catch-up)")
    ap.add_argument("--only-catchup", action="store_true")
    ap.add_argument("--body", type=int, default=1024, help="body bytes of the put figures")
    ap.add_argument("--rounds", type=int, default=0, help="only issue 43's two SYNC rows "
                    "against Redis, in this many interleaved rounds of --count sends")
    args = ap.parse_args()
    global BODY
    BODY = args.body
    home = Path(tempfile.mkdtemp(prefix="replog-bench-repl-"))
    if args.rounds:
        try:
            return sync_rounds(home, args.rounds, args.count)
        finally:
            shutil.rmtree(home, ignore_errors=True)
    try:
        total = args.catchup_mib * 1024 * 1024
        print(f"replication benchmark, {os.cpu_count()} CPUs, bodies {BODY} B, home {home}")
        zmq_rate = push_pull(total)
        ha = {
            "haTransferBatchSize": args.ha_batch_kib * 1024,
            "haWindowBytes": args.ha_window_mib * 1024 * 1024,
        }
        store_rates: list[float] = []  # measured between the fill and the slave (docstring)

        def store_reference() -> None:
            store_rates.append(push_pull(total, home / "pull-store"))
            shutil.rmtree(home / "pull-store")
            time.sleep(REPORTING_S)

        rate = catch_up(home, total, store_reference, **ha)
        store_rate = store_rates[0]
        figure = (
            f"{rate:.0f} MB/s; ratio {rate / zmq_rate:.0%} of"
            if rate is not None
            else "not measured (caught up before it could first be asked: use a larger "
            "--catchup-mib); compare with"
        )
        print(
            f"(1) catch-up of an empty slave over {args.catchup_mib} MiB "
            f"(haTransferBatchSize {args.ha_batch_kib} KiB, haWindowBytes "
            f"{args.ha_window_mib} MiB): {figure} bare pyzmq PUSH/PULL 32 KiB frames "
            f"{zmq_rate:.0f} MB/s (target >= 50%)"
        )
        beside = f"{rate / store_rate:.0%} of" if rate is not None else "compare with"
        print(
            f"    {beside} the same PUSH/PULL whose receiver also pwrites the frames into new "
            f"files ({store_rate:.0f} MB/s): the least a replica that keeps the bytes does"
        )
        catch_up_row = (
            f"slave catch-up {rate:.0f} MB/s | {rate / zmq_rate:.0%} of bare PUSH/PULL "
            f"{zmq_rate:.0f} MB/s (target >= 50%: {'met' if rate >= 0.5 * zmq_rate else 'MISSED'})"
            if rate is not None else "slave catch-up not measured")
        if args.only_catchup:
            print("acceptance (issue 24): " + catch_up_row)
            return 0
        sync = put_figures(home, "SYNC_MASTER", args.count)
        asyn = put_figures(home, "ASYNC_MASTER", args.count)
        print("(2) put throughput, 1 KiB bodies, master + 1 slave")
        for key in ("1", "16", "64", "batch"):
            print(asyn[key].line(width=WIDTH))
            print(sync[key].line(asyn[key], WIDTH))
        ratio = sync["64"].rate / asyn["64"].rate
        print(f"    SYNC/ASYNC at 64 in flight: {ratio:.0%} (target >= 70%)")
        for line in WAKES:
            print(line)
        print(
            f"(3) SYNC latency at 16 in flight: p50 {sync['16'].pct(0.5):.3f} ms, "
            f"p99 {sync['16'].pct(0.99):.3f} ms (target p99 < 5 ms)"
        )
        target = 0.8 * asyn["64"].rate
        samples, load = lag_under_load(home, target, args.lag_seconds)
        s = sorted(samples) or [0]
        print(
            f"(4) slave lag under ASYNC load paced at {target:.0f} msg/s "
            f"(achieved {load.rate:.0f}/s, {len(samples)} samples): "
            f"p50 {s[len(s) // 2]} B, p99 {s[min(len(s) - 1, int(0.99 * len(s)))]} B, "
            f"max {s[-1]} B"
        )
        bare = {"1": relay(args.count // 4, BODY, 1, f"bare relay {BODY} B"),
                "batch": relay(args.count // 32, BODY, 64, f"bare relay 64 x {BODY} B")}
        print("(5) a SYNC put's four hops in bare pyzmq, no work (client -> master -> slave "
              "-> master -> client, 1 in flight)")
        for key in ("1", "batch"):
            print(bare[key].line(width=WIDTH))
            print(sync[key].line(bare[key], WIDTH))
        redis = redis_figures(home, args.count)
        if redis is None:
            print("(6) redis-server not installed: no reference")
        else:
            print("(6) Redis master + replica")
            print(redis["1"].line(width=WIDTH))
            print(redis["batch"].line(width=WIDTH))
            print(sync["1"].line(redis["1"], WIDTH) + "  (reported)")
            print(sync["batch"].line(redis["batch"], WIDTH) + "  (target >= 2x)")
            for key, target in (("1", 1.0), ("batch", 2.0)):
                reach = bare[key].rate / redis[key].rate
                print(f"    the bare relay is {reach:.2f}x {redis[key].name} ("
                      f"{target}x is {'within' if reach >= target else 'beyond'} the transport)")
        red = redis or {}
        print(f"acceptance (issue 24), bodies {BODY} B: each ratio within this run")
        print("    " + _support.acceptance_row(sync["1"], bare["1"], 0.8, red.get("1"), None))
        print("    " + _support.acceptance_row(sync["batch"], bare["batch"], 0.6,
                                                red.get("batch"), 2.0))
        print("    " + catch_up_row)
        return 0
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
