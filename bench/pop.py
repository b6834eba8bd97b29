"""POP against offset pulls, in one run; and what 100k messages in flight cost.

1. **rate**: ``ROUNDS`` rounds taken in turn over fresh messages of one queue: a pull consumer
   reads 32 at a time (``Consumer.pull``) and commits its offset after each batch; a
   ``SimpleConsumer`` receives 32 at a time and acks each batch with one BATCH_ACK (RocketMQ
   5's ``ackMessage`` batched; the pull's offset commit is its counterpart). Median of the
   per-round ratios (target: at least 0.5x).
2. **100k in flight**: receive ``IN_FLIGHT`` messages (invisible time ``INVISIBLE_S``) without
   acking; the broker's RSS before and after; then how soon a waiting receive gets the first
   one back once its deadline passed (the revive lateness: the broker hands a due message
   out at the next POP, and wakes a waiting one at the deadline), how fast one consumer gets
   them all back (receive 32 + batch ack), and what one receive costs with that many out.

The broker (ASYNC_MASTER, ASYNC_FLUSH) runs in its own process. ``REPLOG_BENCH_SCALE`` (default
1.0) scales the counts.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _support
import psutil
from _support import Figure

from common.client import Consumer, Producer, SimpleConsumer

SCALE = float(os.environ.get("REPLOG_BENCH_SCALE", "1.0"))
PER_ROUND = max(640, int(6_400 * SCALE))
ROUNDS = 8
IN_FLIGHT = max(3_200, int(100_000 * SCALE))
INVISIBLE_S = 20
SIZE = 128
TARGET = 0.5
BODY = b"p" * SIZE


def fill(address: str, topic: str, count: int) -> None:
    with Producer([address]) as p:
        for start in range(0, count, 1000):
            p.send_batch(topic, [BODY] * min(1000, count - start), queue_id=0)


def pulls(c: Consumer, topic: str, offset: int, count: int) -> tuple[Figure, int]:
    lat, got = [], 0
    started = time.perf_counter()
    while got < count:
        t0 = time.perf_counter()
        r = c.pull(topic, 0, offset, 32)
        c.commit_offset(topic, 0, r.next_begin_offset)
        lat.append((time.perf_counter() - t0) * 1000)
        got += len(r.messages)
        offset = r.next_begin_offset
    return Figure("pull 32 + commit", got, time.perf_counter() - started, lat, SIZE), offset


def pops(c: SimpleConsumer, topic: str, count: int) -> Figure:
    lat, got = [], 0
    started = time.perf_counter()
    while got < count:
        t0 = time.perf_counter()
        batch = c.receive(topic, 32, 60_000, queue_id=0)
        failed = c.ack_batch(batch) if batch else []
        assert not failed, failed
        lat.append((time.perf_counter() - t0) * 1000)
        got += len(batch)
    return Figure("receive 32 + batch ack", got, time.perf_counter() - started, lat, SIZE)


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def in_flight(address: str, pid: int) -> None:
    fill(address, "bench-flight", IN_FLIGHT)
    with SimpleConsumer([address], "bench-flight") as c:
        before = rss_mib(pid)
        deadlines: dict[tuple[int, int], float] = {}
        started = time.perf_counter()
        while len(deadlines) < IN_FLIGHT:
            for r in c.receive("bench-flight", 32, INVISIBLE_S * 1000, queue_id=0):
                deadlines[(r.message.queue_id, r.message.queue_offset)] = \
                    time.time() + INVISIBLE_S
        took = time.perf_counter() - started
        after = rss_mib(pid)
        print(f"{IN_FLIGHT} in flight: received in {took:.1f} s; broker RSS {before:.0f} -> "
              f"{after:.0f} MiB ({(after - before) * 2**20 / IN_FLIGHT:.0f} B a message)")
        # a receive that waits is answered as the first deadline passes (the broker's long
        # poll wakes at it), then every message comes back as fast as they are asked for
        first_due = min(deadlines.values())
        batch = c.receive("bench-flight", 32, 600_000, queue_id=0, wait_ms=INVISIBLE_S * 2000)
        first_late = time.time() - first_due
        late, costs, handed = [], [], 0
        started = time.perf_counter()
        while True:
            now = time.time()
            late += [max(0.0, now - deadlines[(r.message.queue_id, r.message.queue_offset)])
                     for r in batch]
            handed += len(batch)
            if batch:
                c.ack_batch(batch)
            if handed >= IN_FLIGHT:
                break
            t0 = time.perf_counter()
            batch = c.receive("bench-flight", 32, 600_000, queue_id=0)
            costs.append((time.perf_counter() - t0) * 1000)
        took = time.perf_counter() - started
        late.sort()
        costs.sort()
        print(f"the first due message handed out {first_late * 1000:.0f} ms after its deadline "
              f"(a receive waiting for it); all {IN_FLIGHT} handed out again and acked in "
              f"{took:.1f} s ({IN_FLIGHT / took:.0f}/s, one consumer), each at most "
              f"{late[-1]:.1f} s after its deadline; one receive of 32 with up to {IN_FLIGHT} "
              f"out: p50 {statistics.median(costs):.2f} ms, "
              f"p99 {costs[int(len(costs) * 0.99) - 1]:.2f} ms")


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="replog-bench-pop-"))
    broker, address = _support.start_broker(
        home, brokerRole="ASYNC_MASTER", flushDiskType="ASYNC_FLUSH",
        mappedFileSizeCommitLog=256 * 1024 * 1024)
    print(f"POP benchmark, {os.cpu_count()} CPUs, {PER_ROUND} each x {ROUNDS} rounds, "
          f"{SIZE} B bodies, broker at {address}")
    try:
        fill(address, "bench-pull", PER_ROUND * (ROUNDS + 1))
        fill(address, "bench-pop", PER_ROUND * (ROUNDS + 1))
        with Consumer([address], group="bench-pull") as pc, \
                SimpleConsumer([address], "bench-pop") as sc:
            _, offset = pulls(pc, "bench-pull", 0, PER_ROUND // 4)  # warm both paths
            pops(sc, "bench-pop", PER_ROUND // 4)
            runs: dict[str, list[Figure]] = {"pull": [], "pop": []}
            for _ in range(ROUNDS):
                figure, offset = pulls(pc, "bench-pull", offset, PER_ROUND)
                runs["pull"].append(figure)
                runs["pop"].append(pops(sc, "bench-pop", PER_ROUND))
        merged = {k: Figure(v[0].name, sum(f.msgs for f in v), sum(f.seconds for f in v),
                            [x for f in v for x in f.latencies_ms], SIZE)
                  for k, v in runs.items()}
        print(merged["pull"].line())
        print(merged["pop"].line(merged["pull"]))
        ratios = sorted(p.rate / b.rate for p, b in zip(runs["pop"], runs["pull"], strict=True))
        ratio = statistics.median(ratios)
        print(f"receive+ack / pull+commit, median of {ROUNDS} neighbouring rounds: "
              f"{ratio:.2f}x (range {ratios[0]:.2f}-{ratios[-1]:.2f}; target >= {TARGET}x: "
              f"{'met' if ratio >= TARGET else 'MISSED'})")
        in_flight(address, broker.pid)
    finally:
        _support.stop(broker)
    return 0


if __name__ == "__main__":
    sys.exit(main())
