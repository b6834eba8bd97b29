"""Benchmark store puts (issue 2's Benchmark section, and issue 3's reput ratio).

Prints, all measured in this run on this machine:

1. raw ceiling: the same records (header, body CRC, body, topic, properties) struct-packed
   straight into a fresh mmap'd segment with no store logic;
2. ``MessageStore.put`` and ``put_batch(64)`` of 128 B, 1 KiB and 16 KiB bodies from one
   thread, under ASYNC_FLUSH and SYNC_FLUSH, as msgs/s and MB/s (MB = 10^6 body bytes) and as
   a fraction of the raw ceiling. This is issue 2's scope, the storage engine before indexing:
   the reput thread is stopped (section 5 measures puts with reput running);
3. SYNC_FLUSH with 16 putting threads vs 1 (group commit);
4. segment-roll stall: put latency across segment rolls with the AllocateService
   (pre-allocation) vs inline creation, with and without ``warmMapedFileEnable``
   (CommitLog alone, so that no other thread adds noise);
5. put throughput with reput running (MessageStore) vs the CommitLog alone (issue 3).

    .venv/bin/python bench/store_put.py [--seconds 1.5] [--dir /tmp] [--only-reput]
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import signal
import statistics
import struct
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.core.config import load_config
from common.core.errors import PutStatus
from common.core.message import Message, encode_properties
from common.store.allocate import AllocateService
from common.store.commit_log import CommitLog
from common.store.message_store import MessageStore

TOPIC = "BenchTopic"
SIZES = (128, 1024, 16 * 1024)
SEGMENT = 1 << 30
HEADER = struct.Struct(">iIiiiqqiq4siq4siiqi")
assert HEADER.size == 88


def fmt(rate: float) -> str:
    return f"{rate / 1e6:.2f}M" if rate >= 1e6 else f"{rate / 1e3:.1f}k"


def make_store(root: Path, **kw: Any) -> MessageStore:
    fields: dict[str, Any] = {"storePathRootDir": str(root), "mappedFileSizeCommitLog": SEGMENT,
                                  "maxHashSlotNum": 1000, "maxIndexNum": 100_000,
                                  "messageIndexEnable": False}
    fields.update(kw)
    store = MessageStore(load_config(env={}, **fields))
    store.start()
    return store


def message(size: int) -> Message:
    return Message(TOPIC, os.urandom(size))


# ---- 1. raw ceiling ---------------------------------------------------------------------------
def raw_ceiling(root: Path, size: int, seconds: float) -> float:
    """Records/s packing the store's exact records into a fresh mmap (no store logic)."""
    body = os.urandom(size)
    topic_b = TOPIC.encode()
    props = encode_properties({})
    tail = bytes([len(topic_b)]) + topic_b + len(props).to_bytes(2, "big") + props
    total = 88 + len(body) + len(tail)
    path = root / "raw"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, SEGMENT)
    mm = mmap.mmap(fd, SEGMENT)
    os.close(fd)
    view = memoryview(mm)
    pack = HEADER.pack_into
    ip = b"\x7f\x00\x00\x01"
    n = 0
    pos = 0
    limit = SEGMENT - total
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()
    while pos < limit:
        for _ in range(256):
            pack(view, pos, total, 0xDAA320A7, zlib.crc32(body) & 0x7FFFFFFF, 0, 0, n, pos, 0,
                 1, ip, 0, 2, ip, 10911, 0, 0, len(body))
            p = pos + 88
            view[p : p + len(body)] = body
            view[p + len(body) : pos + total] = tail
            pos += total
            n += 1
            if pos >= limit:
                break
        if time.perf_counter() > deadline:
            break
    elapsed = time.perf_counter() - start
    view.release()
    mm.close()
    path.unlink()
    return n / elapsed


# ---- 2. store puts -------------------------------------------------------------------------------
def put_rate(root: Path, size: int, batch: int, flush: str, seconds: float,
             record_crc: bool = True) -> float:
    store = make_store(root, flushDiskType=flush, enabledAppendPropCRC=record_crc,
                       forceVerifyPropCRC=record_crc)
    store.reput.shutdown()  # issue 2's engine: CommitLog, flush, allocation; no indexing
    try:
        msgs = [message(size) for _ in range(max(batch, 1))]
        n = 0
        start = time.perf_counter()
        deadline = start + seconds
        if batch == 0:
            msg = msgs[0]
            while True:
                for _ in range(64):
                    r = store.put(msg, 0)
                n += 64
                if time.perf_counter() > deadline:
                    break
        else:
            while True:
                r = store.put_batch(TOPIC, 0, msgs)
                n += batch
                if time.perf_counter() > deadline:
                    break
        elapsed = time.perf_counter() - start
        assert r.status is PutStatus.PUT_OK, r
        return n / elapsed
    finally:
        store.shutdown()
        shutil.rmtree(root / "store", ignore_errors=True)


# ---- 3. group commit ------------------------------------------------------------------------------
def sync_threads(root: Path, threads: int, seconds: float) -> float:
    store = make_store(root, flushDiskType="SYNC_FLUSH")
    counts = [0] * threads
    stop = threading.Event()
    msg = message(128)

    def worker(k: int) -> None:
        while not stop.is_set():
            r = store.put(msg, k % 4)
            assert r.status is PutStatus.PUT_OK, r
            counts[k] += 1

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    try:
        start = time.perf_counter()
        for t in pool:
            t.start()
        time.sleep(seconds)  # the measurement window itself
        stop.set()
        for t in pool:
            t.join(timeout=30)
        return sum(counts) / (time.perf_counter() - start)
    finally:
        stop.set()
        store.shutdown()
        shutil.rmtree(root / "store", ignore_errors=True)


# ---- 4. segment-roll stall ------------------------------------------------------------------------
def roll_stall(root: Path, prealloc: bool, warm: bool, rolls: int,
               seg: int) -> dict[str, float]:
    d = root / "roll"
    alloc = AllocateService(d / "commitlog", seg, warm=warm, sync_warm=False)
    if prealloc:
        alloc.start()  # otherwise every segment is created (and warmed) inline by the put
    cl = CommitLog(d, seg, max_message_size=4 << 20, allocate=alloc)
    cl.load()
    msg = message(128)
    lat: list[int] = []
    roll_lat: list[int] = []
    try:
        # Pre-fault the first segment and let the allocator prepare the next ones.
        cl.put(msg, 0)
        deadline = time.monotonic() + 10
        while prealloc and len(alloc._ready) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        clock = time.perf_counter_ns
        segments = len(cl.queue.files)
        while len(cl.queue.files) < segments + rolls:
            before = len(cl.queue.files)
            t0 = clock()
            cl.put(msg, 0)
            dt = clock() - t0
            lat.append(dt)
            if len(cl.queue.files) != before:
                roll_lat.append(dt)
    finally:
        cl.shutdown()
        alloc.shutdown()
        shutil.rmtree(d, ignore_errors=True)
    lat.sort()

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p / 100 * len(lat)))] / 1000

    return {"p50": pct(50), "p99": pct(99), "p99.99": pct(99.99), "max": lat[-1] / 1000,
            "roll_median": statistics.median(roll_lat) / 1000, "roll_max": max(roll_lat) / 1000,
            "puts": len(lat), "hits": alloc.hits, "misses": alloc.misses}


# ---- 5. reput on vs off ----------------------------------------------------------------------------
def commit_log_only_rate(root: Path, batch: int, seconds: float) -> float:
    d = root / "cl"
    alloc = AllocateService(d / "commitlog", SEGMENT)
    alloc.start()
    cl = CommitLog(d, SEGMENT, max_message_size=4 << 20, allocate=alloc)
    cl.load()
    msgs = [message(128) for _ in range(max(batch, 1))]
    try:
        n = 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            if batch:
                cl.put_batch(TOPIC, 0, msgs)
                n += batch
            else:
                for _ in range(64):
                    cl.put(msgs[0], 0)
                n += 64
            if time.perf_counter() > deadline:
                break
        return n / (time.perf_counter() - start)
    finally:
        cl.shutdown()
        alloc.shutdown()
        shutil.rmtree(d, ignore_errors=True)


def with_reput_rate(root: Path, batch: int, seconds: float,
                    inline: bool = False) -> tuple[float, float]:
    """(put rate, rate counting until reput has dispatched everything). ``inline``: the putting
    thread calls ``dispatch_inline`` after every 64 messages, as the request loop does."""
    store = make_store(root, messageIndexEnable=True, maxHashSlotNum=100_000,
                       maxIndexNum=4_000_000)
    msgs = [message(128) for _ in range(max(batch, 1))]
    try:
        n = 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            if batch:
                store.put_batch(TOPIC, 0, msgs)
                n += batch
            else:
                for _ in range(64):
                    store.put(msgs[0], 0)
                n += 64
            if inline:
                store.dispatch_inline()
            if time.perf_counter() > deadline:
                break
        put_elapsed = time.perf_counter() - start
        assert store.wait_dispatched(store.max_phy_offset, timeout_s=120)
        return n / put_elapsed, n / (time.perf_counter() - start)
    finally:
        store.shutdown()
        shutil.rmtree(root / "store", ignore_errors=True)


def main() -> None:
    # SIGTERM (a stopped make bench) unwinds like Ctrl-C: the temporary stores are removed
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=1.5, help="time per throughput case")
    ap.add_argument("--dir", default=None, help="scratch directory (a real disk)")
    ap.add_argument("--only-reput", action="store_true",
                    help="only section 5: puts with reput vs the CommitLog alone")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-put-", dir=args.dir))
    sec = args.seconds
    try:
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, segment {SEGMENT >> 20} "
              f"MiB, {sec:.1f} s per case, dir {base}")
        if args.only_reput:
            reput_section(base, sec)
            return
        print("\n== puts, one thread (raw = records packed into a fresh mmap, no store logic)")
        print("   rows without '4.x' also write the whole-record CRC property (20 bytes + crc32)")
        print(f"{'body':>6} {'mode':<22} {'msgs/s':>9} {'MB/s':>8} {'% raw':>6}")
        for size in SIZES:
            rows = []
            raw_before = raw_ceiling(base, size, sec)
            for flush in ("ASYNC_FLUSH", "SYNC_FLUSH"):
                for batch in (0, 64):
                    rate = put_rate(base / "store-root", size, batch, flush, sec)
                    rows.append((f"{'put' if batch == 0 else 'put_batch(64)'} {flush[:4]}", rate))
            # the exact 4.x layout (no whole-record CRC property), the same bytes as the raw rows
            for batch in (0, 64):
                rate = put_rate(base / "store-root", size, batch, "ASYNC_FLUSH", sec, False)
                rows.append((f"{'put' if batch == 0 else 'put_batch(64)'} ASYN 4.x", rate))
            raw = max(raw_before, raw_ceiling(base, size, sec))  # best of before/after
            print(f"{size:>6} {'raw ceiling (best of 2)':<22} {fmt(raw):>9} "
                  f"{raw * size / 1e6:>8.1f} {100:>5.0f}%")
            for mode, rate in rows:
                print(f"{size:>6} {mode:<22} {fmt(rate):>9} {rate * size / 1e6:>8.1f} "
                      f"{100 * rate / raw:>5.1f}%")

        print("\n== SYNC_FLUSH, 128 B put, concurrent threads (group commit)")
        one = sync_threads(base / "store-root", 1, sec)
        sixteen = sync_threads(base / "store-root", 16, sec)
        print(f"1 thread: {fmt(one)} msgs/s; 16 threads: {fmt(sixteen)} msgs/s; "
              f"ratio {sixteen / one:.1f}x (target >= 5x)")

        print("\n== segment-roll stall, 128 B put, CommitLog alone, 4 MiB segments, 12 rolls")
        print(f"{'segments':<26} {'p50 us':>7} {'p99 us':>7} {'p99.99':>8} {'max us':>8} "
              f"{'roll med':>9} {'roll max':>9}  allocator hits/misses")
        for warm in (True, False):
            for prealloc in (True, False):
                r = roll_stall(base, prealloc, warm, 12, 4 << 20)
                label = f"{'preallocated' if prealloc else 'inline'}, {'warm' if warm else 'no warm'}"
                print(f"{label:<26} {r['p50']:>7.1f} {r['p99']:>7.1f} {r['p99.99']:>8.0f} "
                      f"{r['max']:>8.0f} {r['roll_median']:>9.0f} {r['roll_max']:>9.0f}  "
                      f"{r['hits']}/{r['misses']}")

        reput_section(base, sec)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def reput_section(base: Path, sec: float, pairs: int = 3) -> None:
    """Section 5: 128 B puts with reput running (MessageStore) vs the CommitLog alone.

    Rates on this VM drift by tens of percent from one second to the next, so the two sides
    of a ratio are measured back to back, ``pairs`` times alternating, and the ratio is the
    median of the pairs' ratios (each pair's is printed too)."""
    print("\n== 128 B puts with reput (MessageStore, ASYNC, index on) vs CommitLog alone "
          f"({pairs} alternating pairs per row; ratio: median of the pairs')")
    for batch in (0, 64):
        name = "put" if batch == 0 else "put_batch(64)"
        for inline in (False, True):
            alone, with_reput, with_catch_up = [], [], []
            for _ in range(pairs):
                alone.append(commit_log_only_rate(base, batch, sec))
                put_rate_, catch_up_rate = with_reput_rate(base / "store-root", batch, sec,
                                                           inline)
                with_reput.append(put_rate_)
                with_catch_up.append(catch_up_rate)
            ratios = [w / a for w, a in zip(with_reput, alone, strict=True)]
            until = [c / a for c, a in zip(with_catch_up, alone, strict=True)]
            how = "inline every 64" if inline else "reput thread"
            print(f"{name:<14} CommitLog alone {fmt(statistics.median(alone))} msgs/s, with reput "
                  f"({how:<15}) {fmt(statistics.median(with_reput))} msgs/s (ratio "
                  f"{statistics.median(ratios):.2f}, target >= 0.8; pairs "
                  f"{', '.join(f'{r:.2f}' for r in ratios)}); counting until dispatched "
                  f"{statistics.median(until):.2f}")

if __name__ == "__main__":
    main()
