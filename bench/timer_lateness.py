"""How late a thread of ours wakes past its due time on this machine, now.

Every deadline in replog is a poll timeout (the request server's I/O thread, the HA service,
the client's I/O thread) or an Event wait. Four threads here do what they do: wait 10 ms on a
ZeroMQ poll or an Event, note how late they woke, for ``REPLOG_LATENESS_S`` seconds (30 by
default, times ``REPLOG_BENCH_SCALE``). Prints p50, p99, p99.9 and the maximum in ms. Run it
beside the test suite to calibrate ``tests/time_bounds.py``'s ``LOAD_MARGIN_S``: the time
bounds of the PR tier allow for the worst of it, with room.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import zmq

SCALE = float(os.environ.get("REPLOG_BENCH_SCALE", "1.0"))
DURATION_S = float(os.environ.get("REPLOG_LATENESS_S", "30")) * SCALE
STEP_S = 0.010


def _poll_waits(stop: threading.Event, out: list[float]) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.PULL)  # nothing ever arrives: every poll runs out
    sock.bind("inproc://lateness")
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    try:
        while not stop.is_set():
            due = time.monotonic() + STEP_S
            poller.poll(int(STEP_S * 1000))
            out.append(max(0.0, time.monotonic() - due))
    finally:
        sock.close(0)
        ctx.term()


def _event_waits(stop: threading.Event, out: list[float]) -> None:
    idle = threading.Event()
    while not stop.is_set():
        due = time.monotonic() + STEP_S
        idle.wait(STEP_S)
        out.append(max(0.0, time.monotonic() - due))


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def main() -> int:
    stop = threading.Event()
    samples: list[list[float]] = [[] for _ in range(4)]
    threads = [threading.Thread(target=_poll_waits, args=(stop, samples[0])),
               threading.Thread(target=_event_waits, args=(stop, samples[1])),
               threading.Thread(target=_event_waits, args=(stop, samples[2])),
               threading.Thread(target=_event_waits, args=(stop, samples[3]))]
    for t in threads:
        t.start()
    try:
        stop.wait(DURATION_S)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    late = sorted(v for s in samples for v in s)
    print(f"timer lateness over {DURATION_S:.0f} s, {len(late)} waits of {STEP_S * 1000:.0f} ms"
          f" ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}): p50 {_pct(late, 0.5):.2f} ms"
          f"  p99 {_pct(late, 0.99):.2f} ms  p99.9 {_pct(late, 0.999):.2f} ms"
          f"  max {late[-1] * 1000:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
