"""Transactions against plain sends, in one run; and how soon a dead producer's transactions
are decided by the check-back.

1. **rate**: ``Producer.send`` one at a time (the plain reference) and
   ``TransactionProducer.send_in_transaction`` one at a time (a half, an empty local
   transaction, one END_TRANSACTION: two round trips and three records), alternated
   ``ROUNDS`` times so that both see the same machine; the best round of each is reported,
   and the ratio (target: transactions at least 0.4x the plain sends).
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
COUNT = max(200, int(3000 * SCALE))
ROUNDS = 3
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


def transactions(tp: TransactionProducer, count: int) -> Figure:
    lat = []
    started = time.perf_counter()
    for _ in range(count):
        t0 = time.perf_counter()
        result = tp.send_in_transaction("bench-tx", BODY, lambda _h: TransactionState.COMMIT,
                                        queue_id=0)
        assert result.end_error is None, result.end_error
        lat.append((time.perf_counter() - t0) * 1000)
    return Figure("transaction", count, time.perf_counter() - started, lat, SIZE)


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
            transactions(tp, 100)
            plains, txs = [], []
            for _ in range(ROUNDS):
                plains.append(plain(p, COUNT))
                txs.append(transactions(tp, COUNT))
        best_plain = max(plains, key=lambda f: f.rate)
        best_tx = max(txs, key=lambda f: f.rate)
        print(best_plain.line())
        print(best_tx.line(best_plain))
        print(f"  rounds: plain {[round(f.rate) for f in plains]} msg/s, transactions "
              f"{[round(f.rate) for f in txs]} tx/s")
        ratio = best_tx.rate / best_plain.rate
        print(f"transactions / plain sends: {ratio:.2f}x (target >= {TARGET}x: "
              f"{'met' if ratio >= TARGET else 'MISSED'})")
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
