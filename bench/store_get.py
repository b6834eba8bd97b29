"""Benchmark store reads (issue 3's Benchmark section).

Prints, measured in this run:

1. ``get_message`` of 32 messages of 128 B from a ConsumeQueue at random queue offsets:
   calls/s and messages/s (raw records, and decoded with ``GetResult.messages()``);
   target >= 200k msgs/s;
2. index query latency for a key among 1M keys (RocketMQ's default 5M-slot / 20M-entry index
   file): ``IndexService.query`` alone and ``MessageStore.query_by_key`` (which also reads and
   checks the record); target p99 < 1 ms;
3. reput lag: put-to-visible in the ConsumeQueue (time from the start of ``put`` until reput
   reports the queue offset through an arrival listener), p50/p99, at full put speed and paced
   at 20k and 5k msgs/s; target median < 5 ms;
4. ``offset_by_time`` (search by store time) in one queue of the index run's store.

    .venv/bin/python bench/store_get.py [--keys 1000000] [--seconds 2] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import bisect
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.core.config import load_config
from common.core.errors import GetStatus, PutStatus
from common.core.message import Message
from common.store.message_store import MessageStore

TOPIC = "BenchTopic"


def fmt(rate: float) -> str:
    return f"{rate / 1e6:.2f}M" if rate >= 1e6 else f"{rate / 1e3:.1f}k"


def pct(sorted_values: list[float], p: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(p / 100 * len(sorted_values)))]


def make_store(root: Path, **kw: Any) -> MessageStore:
    fields: dict[str, Any] = {"storePathRootDir": str(root), "messageIndexEnable": False}
    fields.update(kw)
    store = MessageStore(load_config(env={}, **fields))
    store.start()
    return store


def bench_get(root: Path, count: int, seconds: float) -> None:
    store = make_store(root / "get")
    try:
        msgs = [Message(TOPIC, os.urandom(128)) for _ in range(256)]
        for _ in range(count // 256):
            assert store.put_batch(TOPIC, 0, msgs).status is PutStatus.PUT_OK
        assert store.wait_dispatched(store.max_phy_offset, timeout_s=120)
        top = store.max_queue_offset(TOPIC, 0) - 32
        rng = random.Random(1)
        for decode in (False, True):
            calls = got = 0
            start = time.perf_counter()
            deadline = start + seconds
            while time.perf_counter() < deadline:
                for _ in range(100):
                    g = store.get_message("g", TOPIC, 0, rng.randrange(top), 32)
                    got += len(g.messages()) if decode else len(g.records)
                calls += 100
            elapsed = time.perf_counter() - start
            assert g.status is GetStatus.FOUND and got == 32 * calls
            label = "decoded (MessageExt)" if decode else "raw records"
            print(f"get_message(32) of 128 B, {label:<20}: {fmt(calls / elapsed)} calls/s = "
                  f"{fmt(got / elapsed)} msgs/s (target >= 200k)")
    finally:
        store.shutdown()


def bench_index(root: Path, keys: int, queries: int) -> None:
    store = make_store(root / "index", messageIndexEnable=True)  # 5M slots, 20M entries
    try:
        batch = 256
        t0 = time.perf_counter()
        for first in range(0, keys, batch):
            msgs = [Message(TOPIC, b"x" * 16, keys=f"key-{i}") for i in range(first, first + batch)]
            assert store.put_batch(TOPIC, first // batch % 4, msgs).status is PutStatus.PUT_OK
        assert store.wait_dispatched(store.max_phy_offset, timeout_s=600)
        build = time.perf_counter() - t0
        assert store.index is not None
        print(f"index: {keys:,} messages with one key each put and indexed in {build:.1f} s "
              f"({fmt(keys / build)} keys/s)")
        rng = random.Random(2)
        wanted = [f"key-{rng.randrange(keys)}" for _ in range(queries)]
        for label, fn in (("IndexService.query", lambda k: store.index.query(  # type: ignore[union-attr]
                              TOPIC, k, 32, 0, 2**62)),
                          ("MessageStore.query_by_key", lambda k: store.query_by_key(TOPIC, k))):
            lat = []
            for key in wanted:
                t = time.perf_counter_ns()
                found = fn(key)
                lat.append((time.perf_counter_ns() - t) / 1000)
                assert found, key
            lat.sort()
            print(f"{label:<26} hit among {keys:,} keys: p50 {pct(lat, 50):.1f} us, "
                  f"p99 {pct(lat, 99):.1f} us, max {lat[-1]:.0f} us (target p99 < 1000 us)")
        bench_search_by_time(store, queries)
    finally:
        store.shutdown()


def bench_search_by_time(store: MessageStore, queries: int) -> None:
    """``offset_by_time`` (RocketMQ searchOffset) at random times within queue 0's span."""
    n = store.max_queue_offset(TOPIC, 0)
    first = store.get_message("g", TOPIC, 0, 0, 1).messages()[0].store_timestamp
    last = store.get_message("g", TOPIC, 0, n - 1, 1).messages()[0].store_timestamp
    rng = random.Random(3)
    lat = []
    for _ in range(queries):
        ts = rng.randint(first, last)
        t = time.perf_counter_ns()
        offset = store.offset_by_time(TOPIC, 0, ts)
        lat.append((time.perf_counter_ns() - t) / 1000)
        assert 0 <= offset < n
    lat.sort()
    print(f"{'offset_by_time':<26} in a queue of {n:,} ({last - first} ms of store times): "
          f"p50 {pct(lat, 50):.1f} us, p99 {pct(lat, 99):.1f} us")


def bench_reput_lag(root: Path, seconds: float, rate: float | None, inline: int = 0) -> None:
    """``inline``: call ``dispatch_inline`` after every ``inline`` puts (the broker's request
    loop does so after each burst), else only the reput thread dispatches."""
    store = make_store(root / f"lag-{rate}-{inline}", messageIndexEnable=True, maxHashSlotNum=100_000,
                       maxIndexNum=2_000_000)
    arrivals: list[tuple[int, int]] = []  # (max queue offset, ns) for queue 0
    lock = threading.Lock()

    def on_arrival(topic: str, queue_id: int, max_queue_offset: int) -> None:
        if queue_id == 0:
            t = time.perf_counter_ns()
            with lock:
                arrivals.append((max_queue_offset, t))

    store.add_arrival_listener(on_arrival)
    try:
        starts: list[int] = []
        msg = Message(TOPIC, os.urandom(128), tags="TagA", keys="k")
        begin = time.perf_counter()
        n = 0
        while time.perf_counter() - begin < seconds:
            if rate is not None:
                wait = begin + n / rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)  # pacing; releases the GIL like a server waiting on I/O
            t = time.perf_counter_ns()
            r = store.put(msg, 0)
            assert r.status is PutStatus.PUT_OK and r.queue_offset == n
            starts.append(t)
            n += 1
            if inline and n % inline == 0:
                store.dispatch_inline()
        assert store.wait_dispatched(store.max_phy_offset, timeout_s=60)
        with lock:
            marks = sorted(arrivals)
        offsets = [m for m, _ in marks]
        times = [t for _, t in marks]
        # the earliest report covering each offset (reports arrive with growing offsets)
        lags = []
        for q, t_put in enumerate(starts):
            i = bisect.bisect_right(offsets, q)
            lags.append((min(times[i:]) - t_put) / 1e6 if i < len(times) else float("nan"))
        lags.sort()
        label = "full speed" if rate is None else f"paced {fmt(rate)} msgs/s"
        label += f", inline/{inline}" if inline else ", reput thread"
        print(f"{label:<34} ({fmt(n / seconds):>6} msgs/s): p50 {pct(lags, 50):.2f} ms, p99 {pct(lags, 99):.2f} ms, "
              f"max {lags[-1]:.1f} ms")
    finally:
        store.shutdown()


def main() -> None:
    # SIGTERM (a stopped make bench) unwinds like Ctrl-C: the temporary stores are removed
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=20_000)
    ap.add_argument("--messages", type=int, default=200_000, help="queue length for gets")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--dir", default=None, help="scratch directory (a real disk)")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-get-", dir=args.dir))
    try:
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, dir {base}")
        bench_get(base, args.messages, args.seconds)
        bench_index(base, args.keys, args.queries)
        print("reput lag: put -> visible in the ConsumeQueue (target median < 5 ms)")
        for rate in (None, 20000.0, 5000.0):
            bench_reput_lag(base, args.seconds, rate)
        bench_reput_lag(base, args.seconds, None, inline=32)
        bench_reput_lag(base, args.seconds, None, inline=1)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
