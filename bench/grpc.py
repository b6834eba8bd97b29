"""RocketMQ 5's gRPC protocol: sends and receives per second over gRPC, against replog's own
protocol and against the transport's bare gRPC echo, in one run (issue 41: at least 0.7x of
the echo).

* **grpc**: a broker (ASYNC_MASTER, ASYNC_FLUSH, its own process) with ``grpcServerPort``;
  raw ``MessagingService`` stubs (the official client's generated modules) call SendMessage,
  and ReceiveMessage (32) + AckMessage (the 32 handles in one request).
* **proxy**: the same calls to ``replog proxy`` in a process of its own over that broker
  (RocketMQ's Cluster mode: the front end does not share the broker's interpreter).
* **replog**: the same broker through replog's own clients: ``Producer.send``, and
  ``SimpleConsumer.receive`` (32) + ``ack_batch``.
* **floor** (sends only): replog's gRPC front end (``common/proxy``, its own process) whose
  producer answers every send at once, with no broker behind it: the most any path to the
  store could reach, beside the echo.
* **echo**: a gRPC server of the same stack (grpc.aio, in its own process) whose SendMessage
  answers OK at once and whose ReceiveMessage streams 32 canned messages: what gRPC in Python
  costs with nothing behind it.

Each figure with 1 call in flight and with ``THREADS`` callers; rounds taken in turn, the
median of the per-round ratios reported. ``REPLOG_BENCH_SCALE`` scales the counts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# this file is bench/grpc.py: while the package is imported, its own directory (first on the
# path of a script) must not answer for "grpc"
_HERE = sys.path.pop(0) if sys.path and Path(sys.path[0]).resolve() == Path(__file__).parent \
    else None
import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc

if _HERE is not None:
    sys.path.insert(0, _HERE)
import _support
from _support import Figure

from common.client import Admin, Producer, SimpleConsumer

SCALE = float(os.environ.get("REPLOG_BENCH_SCALE", "1.0"))
SENDS = max(400, int(3_000 * SCALE))
RECEIVES = max(640, int(6_400 * SCALE))
ROUNDS = 3
THREADS = 8
SIZE = 128
TARGET = 0.7
BODY = b"g" * SIZE


# ---- the echo server (``python bench/grpc.py --echo PORT``) --------------------------------
class Echo(service_pb2_grpc.MessagingServiceServicer):
    async def SendMessage(self, request: rpc.SendMessageRequest, context: object) -> object:
        return rpc.SendMessageResponse(status=pb.Status(code=pb.OK), entries=[
            rpc.SendResultEntry(status=pb.Status(code=pb.OK),
                                message_id=m.system_properties.message_id)
            for m in request.messages])

    async def ReceiveMessage(self, request: rpc.ReceiveMessageRequest,
                             context: object) -> object:
        for i in range(request.batch_size):
            yield rpc.ReceiveMessageResponse(message=pb.Message(
                topic=request.message_queue.topic, body=BODY,
                system_properties=pb.SystemProperties(message_id=str(i),
                                                      receipt_handle=f"h{i}")))
        yield rpc.ReceiveMessageResponse(status=pb.Status(code=pb.OK))

    async def AckMessage(self, request: rpc.AckMessageRequest, context: object) -> object:
        return rpc.AckMessageResponse(status=pb.Status(code=pb.OK), entries=[
            rpc.AckMessageResultEntry(receipt_handle=e.receipt_handle,
                                      status=pb.Status(code=pb.OK)) for e in request.entries])


async def serve_echo(port: int) -> None:
    server = grpc.aio.server()
    service_pb2_grpc.add_MessagingServiceServicer_to_server(Echo(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def serve_floor(port: int, servers: list[str]) -> None:
    """replog's front end with a producer that answers at once (``--floor PORT SERVERS``)."""
    import concurrent.futures as cf

    import common.proxy.server as server_module
    from common.client.results import SendResult
    from common.core.errors import SendStatus
    from common.proxy.service import MessagingService

    class Instant:
        def send_async(self, topic: str, body: bytes, **_args: object) -> cf.Future[SendResult]:
            done: cf.Future[SendResult] = cf.Future()
            done.set_result(SendResult(SendStatus.SEND_OK, "", 0, 0, 0, topic, "bench"))
            return done

        def close(self) -> None:
            pass

    class Floor(MessagingService):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            self.producer.close()
            self.producer = Instant()  # type: ignore[assignment]

    server_module.MessagingService = Floor  # type: ignore[misc]
    proxy = server_module.GrpcProxy(servers, "127.0.0.1", port, 4 * 1024 * 1024)
    proxy.start()
    print("ready", flush=True)
    try:
        sys.stdin.read()  # until the benchmark ends (kills it, or closes our stdin)
    finally:
        proxy.stop()


# ---- callers --------------------------------------------------------------------------------
def grpc_send(stub: service_pb2_grpc.MessagingServiceStub, topic: str) -> Callable[[int], int]:
    def one(i: int) -> int:
        msg = pb.Message(topic=pb.Resource(name=topic), body=BODY, system_properties=pb.
                         SystemProperties(message_id=f"bench-{i}", message_type=pb.NORMAL,
                                          body_encoding=pb.IDENTITY))
        resp = stub.SendMessage(rpc.SendMessageRequest(messages=[msg]), timeout=10)
        assert resp.status.code == pb.OK, resp.status
        return 1
    return one


def grpc_receive(stub: service_pb2_grpc.MessagingServiceStub, topic: str,
                 broker: str) -> Callable[[int], int]:
    def one(_i: int) -> int:
        req = rpc.ReceiveMessageRequest(
            group=pb.Resource(name="bench-grpc"), batch_size=32,
            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic),
                                          broker=pb.Broker(name=broker)))
        req.invisible_duration.seconds = 60
        handles = [r.message.system_properties.receipt_handle
                   for r in stub.ReceiveMessage(req, timeout=10) if r.HasField("message")]
        if handles:
            ack = stub.AckMessage(rpc.AckMessageRequest(
                group=pb.Resource(name="bench-grpc"), topic=pb.Resource(name=topic),
                entries=[rpc.AckMessageEntry(receipt_handle=h) for h in handles]), timeout=10)
            assert ack.status.code == pb.OK, ack.status
        return len(handles)
    return one


def replog_send(p: Producer, topic: str) -> Callable[[int], int]:
    def one(_i: int) -> int:
        p.send(topic, BODY)
        return 1
    return one


def replog_receive(c: SimpleConsumer, topic: str) -> Callable[[int], int]:
    def one(_i: int) -> int:
        got = c.receive(topic, 32, 60_000)
        if got:
            assert not c.ack_batch(got)
        return len(got)
    return one


def run(name: str, call: Callable[[int], int], count: int, threads: int) -> Figure:
    """``call`` until ``count`` messages, from ``threads`` callers; latency per call."""
    done, lat = 0, []
    started = time.perf_counter()
    if threads == 1:
        i = 0
        while done < count:
            t0 = time.perf_counter()
            done += call(i)
            lat.append((time.perf_counter() - t0) * 1000)
            i += 1
    else:
        def worker(k: int) -> tuple[int, list[float]]:
            n, mine, i = 0, [], k
            while n < count // threads:
                t0 = time.perf_counter()
                n += call(i)
                mine.append((time.perf_counter() - t0) * 1000)
                i += threads
            return n, mine

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            for n, mine in pool.map(worker, range(threads)):
                done += n
                lat += mine
    return Figure(f"{name} x{threads}", done, time.perf_counter() - started, lat, SIZE)


def fill(address: str, topic: str, count: int) -> None:
    with Producer([address]) as p:
        for start in range(0, count, 1000):
            p.send_batch(topic, [BODY] * min(1000, count - start), queue_id=0)


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="replog-bench-grpc-"))
    grpc_port, echo_port = _support.free_port(), _support.free_port()
    broker, address = _support.start_broker(
        home, brokerRole="ASYNC_MASTER", flushDiskType="ASYNC_FLUSH", brokerName="bench",
        grpcServerPort=grpc_port, mappedFileSizeCommitLog=256 * 1024 * 1024)
    echo = subprocess.Popen([sys.executable, __file__, "--echo", str(echo_port)],
                            stdout=subprocess.PIPE, cwd=_support.REPO, env=_support.broker_env())
    floor_port = _support.free_port()
    floor = subprocess.Popen([sys.executable, __file__, "--floor", str(floor_port), address],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=_support.REPO,
                             env=_support.broker_env())
    proxy_port = _support.free_port()
    proxy = subprocess.Popen([sys.executable, "-m", "common.cli", "proxy", "-s", address,
                              "--grpc-port", str(proxy_port), "--json"],
                             stdout=subprocess.PIPE, cwd=_support.REPO, env=_support.broker_env())
    try:
        assert echo.stdout is not None and echo.stdout.readline().strip() == b"ready"
        assert proxy.stdout is not None and str(proxy_port).encode() in proxy.stdout.readline()
        assert floor.stdout is not None and floor.stdout.readline().strip() == b"ready"
        print(f"gRPC benchmark, {os.cpu_count()} CPUs, {SENDS} sends and {RECEIVES} receives "
              f"per round x {ROUNDS} rounds, {SIZE} B bodies; broker at {address}, its gRPC "
              f"port {grpc_port}, the echo at {echo_port}")
        with Admin([address]) as admin:
            for topic in ("bench-send", "bench-grpc", "bench-own"):
                admin.create_topic(topic, 1)
        total = RECEIVES * ROUNDS * 4 + RECEIVES
        fill(address, "bench-grpc", total)
        fill(address, "bench-own", total)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch, \
                grpc.insecure_channel(f"127.0.0.1:{echo_port}") as ech, \
                grpc.insecure_channel(f"127.0.0.1:{proxy_port}") as pch, \
                grpc.insecure_channel(f"127.0.0.1:{floor_port}") as fch, \
                Producer([address]) as producer, \
                SimpleConsumer([address], "bench-own") as consumer:
            stub = service_pb2_grpc.MessagingServiceStub(ch)
            echo_stub = service_pb2_grpc.MessagingServiceStub(ech)
            proxy_stub = service_pb2_grpc.MessagingServiceStub(pch)
            callers = {
                "send": {"echo": grpc_send(echo_stub, "bench-send"),
                         "floor": grpc_send(service_pb2_grpc.MessagingServiceStub(fch),
                                            "bench-send"),
                         "grpc": grpc_send(stub, "bench-send"),
                         "proxy": grpc_send(proxy_stub, "bench-send"),
                         "replog": replog_send(producer, "bench-send")},
                "receive+ack": {"echo": grpc_receive(echo_stub, "bench-grpc", "bench"),
                                "grpc": grpc_receive(stub, "bench-grpc", "bench"),
                                "proxy": grpc_receive(proxy_stub, "bench-grpc", "bench"),
                                "replog": replog_receive(consumer, "bench-own")},
            }
            for kind, by in callers.items():  # warm every path
                for call in by.values():
                    run(kind, call, 64, 1)
            for kind, by in callers.items():
                count = SENDS if kind == "send" else RECEIVES
                for threads in (1, THREADS):
                    rounds: dict[str, list[Figure]] = {k: [] for k in by}
                    for _ in range(ROUNDS):
                        for name, call in by.items():
                            rounds[name].append(run(f"{kind} {name}", call, count, threads))
                    merged = {k: Figure(v[0].name, sum(f.msgs for f in v),
                                        sum(f.seconds for f in v),
                                        [x for f in v for x in f.latencies_ms], SIZE)
                              for k, v in rounds.items()}
                    print(f"{kind}, {threads} caller(s):")
                    print(merged["echo"].line(width=22))
                    print(merged["grpc"].line(merged["echo"], width=22))
                    print(merged["proxy"].line(merged["echo"], width=22))
                    print(merged["replog"].line(merged["echo"], width=22))
                    if "floor" in merged:
                        print(merged["floor"].line(merged["echo"], width=22))
                        alone = statistics.median(f.rate / e.rate for f, e in zip(
                            rounds["floor"], rounds["echo"], strict=True))
                        print(f"  the front end alone (no broker) / echo, median of {ROUNDS} "
                              f"rounds: {alone:.2f}x: the most a path to the store could reach")
                    ratios = sorted(g.rate / e.rate for g, e in
                                    zip(rounds["grpc"], rounds["echo"], strict=True))
                    ratio = statistics.median(ratios)
                    own = statistics.median(g.rate / r.rate for g, r in
                                            zip(rounds["grpc"], rounds["replog"], strict=True))
                    apart = statistics.median(g.rate / e.rate for g, e in
                                              zip(rounds["proxy"], rounds["echo"], strict=True))
                    print(f"  gRPC / echo, median of {ROUNDS} rounds: in the broker {ratio:.2f}x, "
                          f"replog proxy {apart:.2f}x (target >= {TARGET}x: in the broker "
                          f"{'met' if ratio >= TARGET else 'MISSED'}, replog proxy "
                          f"{'met' if apart >= TARGET else 'MISSED'}); in the broker / "
                          f"replog's protocol: {own:.2f}x")
    finally:
        for child in (echo, proxy, floor):
            child.kill()
            child.wait(10)
        _support.stop(broker)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--echo":
        asyncio.run(serve_echo(int(sys.argv[2])))
        sys.exit(0)
    if len(sys.argv) == 4 and sys.argv[1] == "--floor":
        serve_floor(int(sys.argv[2]), [sys.argv[3]])
        sys.exit(0)
    sys.exit(main())
