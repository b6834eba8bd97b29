"""What hostile, unauthenticated clients cost a broker: its memory, threads and descriptors, and
an ordinary client's send latency, at rest and under load.

One broker (ASYNC_MASTER, ASYNC_FLUSH, its own process, with ``grpcServerPort``) holds a
topic of 64 incompressible 32 KiB messages, so a PULL of 32 is answered with 1 MiB. At rest:
its RSS (VmRSS and RssAnon), threads and descriptors, and the latency of ``SENDS`` plain
sends, one at a time, by a ``Producer``. Then, all at once and kept up while it is measured:

* ``NON_READERS`` clients that pipeline PULLs on a plain socket and never read an answer
  (each reconnects when the broker closes it);
* ``IDLE`` idle connections (libzmq DEALERs, which answer the broker's heartbeat);
* ``GROUPS`` gRPC calls (ChangeInvisibleDuration), each naming a new consumer group.

It prints the loaded figures, the deltas and the ratio of the latencies, against the targets
of the hostile-client budget: RSS under +300 MB, threads under +40, latency within 2x.
Not a test: the figures vary with the machine; docs/benchmarks.md keeps runs.

    python bench/hostile_load.py
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

# bench/grpc.py must not answer for "grpc" (this script's directory is first on the path)
_HERE = sys.path.pop(0) if sys.path and Path(sys.path[0]).resolve() == Path(__file__).parent \
    else None
import grpc
import zmq
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

if _HERE is not None:
    sys.path.insert(0, _HERE)
import _support

from common.client import Producer
from common.core.errors import BrokerError
from common.format import zmtp
from common.format.protocol import RequestCode, encode_request

MB = 1_000_000
NON_READERS = int(os.environ.get("REPLOG_BENCH_NON_READERS", "4"))
IDLE = int(os.environ.get("REPLOG_BENCH_IDLE_CONNECTIONS", "1000"))
GROUPS = int(os.environ.get("REPLOG_BENCH_GROUP_NAMES", "500"))
SENDS = int(os.environ.get("REPLOG_BENCH_SENDS", "300"))
LOAD_S = float(os.environ.get("REPLOG_BENCH_LOAD_S", "12"))  # load kept up this long at least
# 1: the topic's bodies compress (a PULL's answer is small: the clients cost CPU, not memory)
COMPRESSIBLE = os.environ.get("REPLOG_BENCH_COMPRESSIBLE", "") == "1"
PULLS_A_WRITE = 1000  # pipelined PULLs a non-reader writes at once (about 100 KB)


def proc_figures(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon (bytes), threads and descriptors of process ``pid``."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            out[key] = int(value.split()[0]) * 1024
        elif key == "Threads":
            out[key] = int(value)
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


FAILED: list[str] = []  # sends that failed (counted with the time they took to fail)


def send_latencies_ms(producer: Producer, n: int) -> list[float]:
    got = []
    for _ in range(n):
        started = time.perf_counter()
        try:
            producer.send("ordinary", b"o" * 100)
        except BrokerError as e:
            FAILED.append(str(e)[:100])
        got.append((time.perf_counter() - started) * 1000)
    return got


class NonReaders:
    """Clients that pipeline PULLs of 1 MiB answers and never read; each reconnects when the
    broker closes it, until ``stop``."""

    def __init__(self, address: str, count: int):
        host, port = address.rsplit(":", 1)
        self.target = (host, int(port))
        self.pulls = b"".join(zmtp.encode(encode_request(
            RequestCode.PULL, i, {"topic": "big", "queueId": 0, "queueOffset": 0,
                                  "maxNums": 32, "group": "hostile", "suspendMs": 0}, []))
            for i in range(PULLS_A_WRITE))
        self.connections = 0
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(1.0)
            try:
                sock.connect(self.target)
                self.connections += 1
                sock.sendall(zmtp.GREETING + zmtp.ready(b"DEALER"))
                while not self.stopping.is_set():
                    try:
                        sock.sendall(self.pulls)
                    except TimeoutError:
                        continue  # the broker reads no more: keep the connection, and try
            except OSError:
                self.stopping.wait(0.1)  # closed by the broker: connect again
            finally:
                sock.close()

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(5)


def idle_connections(ctx: zmq.Context[zmq.Socket[bytes]], address: str,
                     count: int) -> list[zmq.Socket[bytes]]:
    socks = []
    for _ in range(count):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"tcp://{address}")
        socks.append(s)
    return socks


def group_names(grpc_port: int, count: int) -> int:
    """``count`` gRPC calls, each naming a new consumer group; how many were answered."""
    answered = 0
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        for i in range(count):
            request = rpc.ChangeInvisibleDurationRequest(
                group=pb.Resource(name=f"hostile-{i}"), topic=pb.Resource(name="big"),
                receipt_handle="not-a-handle", message_id="x")
            request.invisible_duration.seconds = 30
            try:
                stub.ChangeInvisibleDuration(request, timeout=10)
                answered += 1
            except grpc.RpcError:
                pass
    return answered


def line(name: str, rest: float, loaded: float, unit: str, scale: float = 1.0) -> str:
    return (f"  {name:<22} {rest / scale:>10.1f} {loaded / scale:>10.1f} "
            f"{(loaded - rest) / scale:>+10.1f} {unit}")


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="replog-bench-hostile-"))
    grpc_port = _support.free_port()
    broker, address = _support.start_broker(
        home, brokerRole="ASYNC_MASTER", flushDiskType="ASYNC_FLUSH",
        grpcServerPort=grpc_port, mappedFileSizeCommitLog=64 * 1024 * 1024)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context(io_threads=1)
    non_readers: NonReaders | None = None
    idle: list[zmq.Socket[bytes]] = []
    try:
        with Producer([address]) as producer:
            for _ in range(64):  # incompressible: a PULL of 32 is 1 MiB on the wire
                body = b"c" * (32 * 1024) if COMPRESSIBLE else os.urandom(32 * 1024)
                producer.send("big", body, queue_id=0)
            send_latencies_ms(producer, 50)  # warm: routes, connections, the topic made
            time.sleep(1.0)
            rest = proc_figures(broker.pid)
            rest_ms = send_latencies_ms(producer, SENDS)

            started = time.monotonic()
            non_readers = NonReaders(address, NON_READERS)
            idle = idle_connections(ctx, address, IDLE)
            answered = group_names(grpc_port, GROUPS)
            peak = proc_figures(broker.pid)
            loaded_ms: list[float] = []
            while time.monotonic() - started < LOAD_S or len(loaded_ms) < SENDS:
                loaded_ms += send_latencies_ms(producer, 20)
                now = proc_figures(broker.pid)
                peak = {k: max(v, now[k]) for k, v in peak.items()}
            status = _support_status(address)
            elapsed = time.monotonic() - started
    finally:
        if non_readers is not None:
            non_readers.stop()
        for s in idle:
            s.close()
        ctx.term()
        _support.stop(broker)

    rest_p50, loaded_p50 = statistics.median(rest_ms), statistics.median(loaded_ms)
    ratio = loaded_p50 / rest_p50
    rss = peak["VmRSS"] - rest["VmRSS"]
    threads = peak["Threads"] - rest["Threads"]
    print(f"hostile load on one broker ({os.cpu_count()} CPUs, {elapsed:.0f} s): "
          f"{NON_READERS} clients pipelining PULLs that never read "
          f"({non_readers.connections if non_readers else 0} connections made), {IDLE} idle "
          f"connections, {GROUPS} gRPC group names ({answered} answered)")
    print(f"  {'':<22} {'at rest':>10} {'peak':>10} {'delta':>10}")
    print(line("RSS (VmRSS)", rest["VmRSS"], peak["VmRSS"], "MB", MB))
    print(line("RSS (RssAnon)", rest["RssAnon"], peak["RssAnon"], "MB", MB))
    print(line("threads", rest["Threads"], peak["Threads"], ""))
    print(line("descriptors", rest["fds"], peak["fds"], ""))
    print(f"  send latency p50 {rest_p50:.3f} ms at rest, {loaded_p50:.3f} ms loaded "
          f"(ratio {ratio:.2f}); p99 {_pct(rest_ms, 0.99):.3f} / {_pct(loaded_ms, 0.99):.3f} ms")
    if FAILED:
        print(f"  {len(FAILED)} sends failed, e.g. {FAILED[0]}")
    print("  port: " + ", ".join(f"{k} {v}" for k, v in sorted(status.items())
                                 if k.startswith("client") and isinstance(v, int)))
    verdict = {"RSS < +300 MB": rss < 300 * MB, "threads < +40": threads < 40,
               "latency <= 2x": ratio <= 2.0}
    print("  targets: " + ", ".join(f"{k} {'met' if ok else 'MISSED'}"
                                   for k, ok in verdict.items()))
    return 0


def _support_status(address: str) -> dict[str, object]:
    from common.client import Admin

    try:
        with Admin([address], timeout_ms=5000) as admin:
            return dict(admin.status(address))
    except BrokerError:
        return {}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


if __name__ == "__main__":
    sys.exit(main())
