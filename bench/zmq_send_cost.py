"""What one ZeroMQ send and one wait cost on this machine, in the bare echo (no replog code).

    .venv/bin/python bench/zmq_send_cost.py [--count 5000] [--rounds 3]

A DEALER client and the ROUTER echo server of ``bench/broker_put.py`` (a separate process),
one request in flight, 128 B and 8 KiB bodies. For each it prints the round trip, the client's
CPU per round trip, and the wall and CPU time of ``send_multipart`` alone (``thread_time``
around the call): what libzmq's hand-off to its I/O thread (an eventfd write that wakes it)
and the kernel take per send, before any of our code runs. Then the client's ways to wait for
the answer, each with its CPU per round trip: a blocking recv, ``Socket.poll`` then recv (a
Poller built per wait), a Poller kept, and a blocking recv with RCVTIMEO (what
``Transport.call_sync`` does).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from collections.abc import Callable

import _support
import zmq
from broker_put import _echo_server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    port = _support.free_port()
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_echo_server, args=(port, ready), daemon=True)
    server.start()
    ready.wait(10)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{port}")
    try:
        send_cost(sock, args.count, args.rounds)
        wait_cost(sock, args.count, args.rounds)
    finally:
        ctx.destroy(0)
        server.kill()
        server.join()


def send_cost(sock: zmq.Socket[bytes], count: int, rounds: int) -> None:
    print("one send_multipart in the bare echo (medians of rounds)")
    for size in (128, 8192):
        msg = [b"h" * 16, b"x" * size]
        for _ in range(500):
            sock.send_multipart(msg)
            sock.recv_multipart()
        rows = []
        for _ in range(rounds):
            send_wall = send_cpu = 0.0
            wall, cpu = time.perf_counter(), time.thread_time()
            for _ in range(count):
                w, c = time.perf_counter(), time.thread_time()
                sock.send_multipart(msg)
                send_wall += time.perf_counter() - w
                send_cpu += time.thread_time() - c
                sock.recv_multipart()
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            rows.append((wall / count, cpu / count, send_wall / count, send_cpu / count))
        rt, client, sw, sc = (statistics.median(r[i] for r in rows) * 1e6 for i in range(4))
        print(f"  {size:>5} B: round trip {rt:6.1f} us, client CPU {client:5.1f} us; "
              f"the send alone: wall {sw:5.1f} us, CPU {sc:5.1f} us")


def wait_cost(sock: zmq.Socket[bytes], count: int, rounds: int) -> None:
    msg = [b"h" * 16, b"x" * 128]
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)

    def blocking() -> None:
        sock.send_multipart(msg)
        sock.recv_multipart()

    def socket_poll() -> None:
        sock.send_multipart(msg)
        while not sock.poll(100):
            pass
        sock.recv_multipart(zmq.NOBLOCK)

    def kept_poller() -> None:
        sock.send_multipart(msg)
        while not poller.poll(100):
            pass
        sock.recv_multipart(zmq.NOBLOCK)

    def rcvtimeo() -> None:
        sock.send_multipart(msg)
        while True:
            try:
                sock.recv_multipart()
                return
            except zmq.Again:
                pass

    ways: list[tuple[str, Callable[[], None]]] = [
        ("blocking recv", blocking), ("Socket.poll, recv", socket_poll),
        ("a kept Poller, recv", kept_poller), ("recv with RCVTIMEO", rcvtimeo)]
    print("waiting for the answer, 128 B (client CPU per round trip; rounds alternate ways)")
    cpu: dict[str, list[float]] = {name: [] for name, _ in ways}
    rate: dict[str, list[float]] = {name: [] for name, _ in ways}
    for _ in range(rounds):
        for name, fn in ways:
            sock.setsockopt(zmq.RCVTIMEO, 100 if fn is rcvtimeo else -1)
            wall, c = time.perf_counter(), time.process_time()
            for _ in range(count):
                fn()
            wall, c = time.perf_counter() - wall, time.process_time() - c
            cpu[name].append(c / count * 1e6)
            rate[name].append(count / wall)
    sock.setsockopt(zmq.RCVTIMEO, -1)
    for name, _ in ways:
        print(f"  {name:<22} {statistics.median(rate[name]):7.0f}/s   client CPU "
              f"{statistics.median(cpu[name]):6.1f} us")


if __name__ == "__main__":
    main()
