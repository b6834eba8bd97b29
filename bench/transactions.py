"""Transactions against plain sends, in one run; and how soon a dead producer's transactions
are decided by the check-back.

1. **rate**: ``Producer.send`` one at a time (the plain reference) and
   ``TransactionProducer.send_in_transaction`` one at a time (a half, an empty local
   transaction, one END_TRANSACTION: three records), its end awaited (two round trips) and
   sent oneway (``wait_end=False``, RocketMQ's ``endTransactionOneway``), in ``ROUNDS`` short
   rounds taken in turn, so that each ratio compares neighbours on this noisy machine; the
   median of the per-round ratios is the figure (target: at least 0.4x).
2. **check-back latency**: a child process sends ``HALVES`` halves and is SIGKILLed before any
   end; a live producer of the same group answers COMMIT to every check. Timed from the kill
   to each message being readable: it is ``transactionTimeOut`` after the half's birth plus up
   to one ``transactionCheckInterval`` (both set to 1000 ms here; RocketMQ's defaults, 6 s and
   30 s, give 6 to 36 s) plus the check's round trip.

The broker (ASYNC_MASTER, ASYNC_FLUSH) runs in its own process. ``REPLOG_BENCH_SCALE``
(default 1.0) scales the counts.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _support
from _support import Figure

from common.client import Consumer, Producer, TransactionProducer, TransactionState

SCALE = float(os.environ.get("REPLOG_BENCH_SCALE", "1.0"))
COUNT = max(100, int(500 * SCALE))
ROUNDS = 12
HALVES = 50
SIZE = 128
INTERVAL_MS = 1000
TIMEOUT_MS = 1000
TARGET = 0.4
BODY = b"t" * SIZE


def plain(p: Producer, count: int) -> Figure:
    lat = []
    started = time.perf_counter()
    for _ in range(count):
        t0 = time.perf_counter()
        p.send("bench-plain", BODY, queue_id=0)
        lat.append((time.perf_counter() - t0) * 1000)
    return Figure("plain send", count, time.perf_counter() - started, lat, SIZE)


def transactions(tp: TransactionProducer, count: int, wait_end: bool) -> Figure:
    lat = []
    started = time.perf_counter()
    for _ in range(count):
        t0 = time.perf_counter()
        result = tp.send_in_transaction("bench-tx", BODY, lambda _h: TransactionState.COMMIT,
                                        queue_id=0, wait_end=wait_end)
        assert result.end_error is None, result.end_error
        lat.append((time.perf_counter() - t0) * 1000)
    name = "transaction" if wait_end else "transaction, oneway end"
    return Figure(name, count, time.perf_counter() - started, lat, SIZE)


def merged(figures: list[Figure]) -> Figure:
    return Figure(figures[0].name, sum(f.msgs for f in figures),
                  sum(f.seconds for f in figures),
                  [x for f in figures for x in f.latencies_ms], SIZE)


def child(address: str) -> None:
    """Send the halves, say so, and wait to be killed."""
    with TransactionProducer([address], "bench-group",
                             lambda _h: TransactionState.UNKNOWN) as tp:
        for i in range(HALVES):
            tp.send_half("bench-dead", b"%d" % i, queue_id=0)
        print("sent", flush=True)
        time.sleep(3600)


def check_back(address: str) -> list[float]:
    proc = subprocess.Popen([sys.executable, __file__, "--child", address],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "sent"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    killed = time.monotonic()
    seen: dict[bytes, float] = {}
    with TransactionProducer([address], "bench-group", lambda _h: TransactionState.COMMIT,
                             heartbeat_ms=200), Consumer([address], group="bench") as c:
        deadline = killed + 60
        while len(seen) < HALVES and time.monotonic() < deadline:
            for m in c.pull("bench-dead", 0, 0, 256).messages:
                seen.setdefault(m.body, time.monotonic() - killed)
            time.sleep(0.01)
    assert len(seen) == HALVES, f"{len(seen)} of {HALVES} decided within 60 s"
    return sorted(seen.values())


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return 0
    home = Path(tempfile.mkdtemp(prefix="replog-bench-tx-"))
    broker, address = _support.start_broker(
        home, brokerRole="ASYNC_MASTER", flushDiskType="ASYNC_FLUSH",
        mappedFileSizeCommitLog=256 * 1024 * 1024, transactionCheckInterval=INTERVAL_MS,
        transactionTimeOut=TIMEOUT_MS)
    print(f"transactions benchmark, {os.cpu_count()} CPUs, {COUNT} each x {ROUNDS} rounds, "
          f"{SIZE} B bodies, broker at {address}")
    try:
        with Producer([address]) as p, TransactionProducer(
                [address], "bench-tx-group", lambda _h: TransactionState.COMMIT) as tp:
            plain(p, 100)  # warm both paths
            transactions(tp, 100, True)
            runs: dict[str, list[Figure]] = {"plain": [], "awaited": [], "oneway": []}
            for _ in range(ROUNDS):
                runs["plain"].append(plain(p, COUNT))
                runs["awaited"].append(transactions(tp, COUNT, True))
                runs["oneway"].append(transactions(tp, COUNT, False))
        base = merged(runs["plain"])
        print(base.line())
        for kind in ("awaited", "oneway"):
            print(merged(runs[kind]).line(base))
            ratios = sorted(t.rate / b.rate for t, b in zip(runs[kind], runs["plain"],
                                                           strict=True))
            ratio = statistics.median(ratios)
            print(f"transactions ({kind} end) / plain sends, median of {ROUNDS} neighbouring "
                  f"rounds: {ratio:.2f}x (range {ratios[0]:.2f}-{ratios[-1]:.2f}; target >= "
                  f"{TARGET}x: {'met' if ratio >= TARGET else 'MISSED'})")
        waits = check_back(address)
        print(f"check-back after a producer's SIGKILL, {HALVES} halves, transactionTimeOut "
              f"{TIMEOUT_MS} ms, transactionCheckInterval {INTERVAL_MS} ms: decided after "
              f"min {waits[0]:.2f} s, median {statistics.median(waits):.2f} s, "
              f"max {waits[-1]:.2f} s")
    finally:
        _support.stop(broker)
    return 0


if __name__ == "__main__":
    sys.exit(main())
