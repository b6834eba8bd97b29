"""Benchmark the IndexFile and the ConsumeQueue.

Prints: index build rate (keys/s, two keys per message: UNIQ_KEY + one KEYS entry), query
latency p50/p99 for a key among N keys (RocketMQ's default 5M slots / 20M entries file, sparse
on disk), and ConsumeQueue ``entries(q, 32)`` lookups/s over a queue of N entries.

    .venv/bin/python bench/store_index.py [--keys 1000000] [--queries 20000] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.store.consume_queue import ConsumeQueue
from common.store.index import IndexService

TOPIC = "BenchTopic"
T0 = 1_700_000_000_000


def percentile(sorted_ns: list[int], p: float) -> float:
    """The p-th percentile in microseconds (nearest rank)."""
    rank = min(len(sorted_ns) - 1, max(0, round(p / 100 * len(sorted_ns)) - 1))
    return sorted_ns[rank] / 1000


def bench_index(root: Path, keys: int, queries: int, slots: int, index_num: int) -> None:
    svc = IndexService(root, slots, index_num)
    svc.load(True, 0)
    try:
        messages = keys // 2
        uniq = [f"7F0000010C1818B4AAC2{i:012X}" for i in range(messages)]
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(messages):
            svc.build(TOPIC, [uniq[i], f"order-{i}"], 200 * i, T0 + i // 10)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        print(f"index build: {2 * messages:,} keys in {elapsed:.2f} s = "
              f"{2 * messages / elapsed:,.0f} keys/s wall, {2 * messages / cpu:,.0f} keys/s "
              f"per CPU second ({len(svc.files)} file(s), {slots:,} slots)")
        rng = random.Random(7)
        hits = _time_queries(svc, [uniq[rng.randrange(messages)] for _ in range(queries)])
        misses = _time_queries(svc, [f"absent-{i}" for i in range(queries)])
        for label, ns in (("hit", hits), ("miss", misses)):
            print(f"index query ({label}) among {2 * messages:,} keys: "
                  f"p50 {percentile(ns, 50):.1f} us, p99 {percentile(ns, 99):.1f} us, "
                  f"max {ns[-1] / 1000:.1f} us")
    finally:
        svc.destroy()


def _time_queries(svc: IndexService, keys: list[str]) -> list[int]:
    out = []
    clock = time.perf_counter_ns
    for key in keys:
        t = clock()
        found = svc.query(TOPIC, key, 32, 0, 2**62)
        out.append(clock() - t)
        if key.startswith("7F") and not found:
            raise SystemExit(f"key {key} not found")
    out.sort()
    return out


def bench_cq(root: Path, entries: int, lookups: int) -> None:
    cq = ConsumeQueue(root, TOPIC, 0, 300_000 * 20)
    cq.load()
    try:
        start = time.perf_counter()
        for i in range(entries):
            cq.put(i, 200 * i, 200, i & 0xFFFF)
        elapsed = time.perf_counter() - start
        print(f"cq put: {entries:,} entries in {elapsed:.2f} s = {entries / elapsed:,.0f} puts/s")
        rng = random.Random(11)
        offsets = [rng.randrange(entries - 32) for _ in range(lookups)]
        start, cpu = time.perf_counter(), time.process_time()
        for q in offsets:
            cq.entries(q, 32)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        print(f"cq entries(q, 32) over {entries:,} entries: {lookups / elapsed:,.0f} lookups/s "
              f"wall, {lookups / cpu:,.0f} per CPU second")
    finally:
        cq.destroy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=20_000)
    ap.add_argument("--slots", type=int, default=5_000_000, help="maxHashSlotNum")
    ap.add_argument("--index-num", type=int, default=20_000_000, help="maxIndexNum")
    ap.add_argument("--cq-entries", type=int, default=1_000_000)
    ap.add_argument("--dir", type=Path, default=None, help="where to put the files")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="replog-bench-") as tmp:
        bench_index(Path(tmp), args.keys, args.queries, args.slots, args.index_num)
        bench_cq(Path(tmp), args.cq_entries, args.queries)


if __name__ == "__main__":
    main()
