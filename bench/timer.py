"""Benchmark timer messages (issue 38): a million pending over a day, ten thousand due a second.

One store (``MessageStore``, in a child process, ASYNC_FLUSH, the index on as a broker has it):

1. **pending**: ``--pending`` messages (1,000,000) due at random times over the next day are
   put (the put rate), then the timer's enqueue is let go and timed until every one is on the
   wheel (the enqueue rate: reading the timer topic's queue, each record's properties, one
   TimerLog unit and one wheel slot each);
2. **memory**: RSS and its anonymous part before the timer holds anything and with all of them
   pending: the wheel is a fixed bytearray (2 x 604,800 slots x 32 B = 38.7 MB); a Python
   object per pending message would show as anonymous memory growing with their number;
3. **due**: ``--due-rate`` (10,000) messages a second come due for ``--due-seconds`` (20),
   put ahead of time; each body holds its due time. Lateness = ``TIMER_DEQUEUE_MS`` (when the
   dequeue put it into its real topic) minus that time, over every one; also counted: delivered
   once, none early, none missing;
4. **recovery**: the child is SIGKILLed once a checkpoint has passed; a new one opens the
   store and is timed until its timer holds every pending message again (CommitLog recovery,
   reput, the TimerLog cut and the slots mended, the enqueue caught up from the checkpoint).

Targets (issue 38): p99 lateness under timerPrecisionMs + 200 ms at 10k due/s; recovery under
10 s with 1M pending; RSS bounded by the wheel.

    .venv/bin/python bench/timer.py [--pending N] [--due-rate R] [--due-seconds S]
                                    [--precision MS] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.core.config import TIMER_WHEEL_TICKS, load_config
from common.core.errors import GetStatus
from common.core.message import Message
from common.core.timer import TIMER_DELIVER_MS, TIMER_DEQUEUE_MS
from common.store.message_store import MessageStore

FAR_TOPIC, DUE_TOPIC = "timer-far", "timer-due"
DUE = struct.Struct(">qq")  # due time, sequence number
BODY_PAD = b"x" * 48  # 64-byte bodies


def rss() -> tuple[float, float]:
    """(RSS, its anonymous part) of this process in MB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon"):
            fields[name] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["RssAnon"]


def open_store(home: Path, precision: int) -> MessageStore:
    cfg = load_config(env={}, storePathRootDir=str(home), mappedFileSizeCommitLog=1 << 30,
                      timerPrecisionMs=precision, timerFlushIntervalMs=1000,
                      maxIndexNum=8_000_000)
    return MessageStore(cfg)


def wait(cond: Any, timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout_s:
            raise SystemExit(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - start


def emit(**figures: Any) -> None:
    print(json.dumps(figures), flush=True)


def child_fill(home: Path, pending: int, due_rate: int, due_seconds: int, precision: int) -> None:
    store = open_store(home, precision)
    store.start()
    timer = store.timer
    rss0, anon0 = rss()
    timer.stop_enqueue = True
    rng = random.Random(38)
    now_ms = int(time.time() * 1000)
    started = time.monotonic()
    for _ in range(pending):
        due = now_ms + rng.randrange(900_000, 86_400_000)  # none due while this runs
        result = store.put(Message(FAR_TOPIC, DUE.pack(due, 0) + BODY_PAD,
                                   properties={TIMER_DELIVER_MS: str(due)}), 0)
        assert result.ok, result
    put_s = time.monotonic() - started
    store.reput.catch_up()
    timer.stop_enqueue = False
    enqueue_s = wait(lambda: timer.stats["enqueued"] >= pending, 600, "the enqueue")
    rss1, anon1 = rss()
    emit(phase="pending", pending=pending, put_rate=round(pending / put_s),
         enqueue_rate=round(pending / enqueue_s), enqueue_s=round(enqueue_s, 2),
         rss_mb_before=round(rss0, 1), rss_mb_pending=round(rss1, 1),
         anon_mb_before=round(anon0, 1), anon_mb_pending=round(anon1, 1),
         wheel_mb=round(2 * TIMER_WHEEL_TICKS * 32 / 1e6, 1))

    count = due_rate * due_seconds
    lead_s = count / 20_000 + 5  # time to put and enqueue them ahead of their window
    window_start = int(time.time() * 1000) + int(lead_s * 1000)
    dues = sorted(window_start + rng.randrange(due_seconds * 1000) for _ in range(count))
    for seq, due in enumerate(dues):
        assert store.put(Message(DUE_TOPIC, DUE.pack(due, seq) + BODY_PAD,
                                 properties={TIMER_DELIVER_MS: str(due)}), 0).ok
    ahead_ms = window_start - int(time.time() * 1000)
    wait(lambda: timer.stats["enqueued"] >= pending + count, 120, "the due ones enqueued")
    busy0 = time.process_time()
    wait(lambda: timer.stats["delivered"] >= count, due_seconds + lead_s + 120, "the deliveries")
    store.reput.catch_up()
    cpu_s = time.process_time() - busy0
    late: list[int] = []
    early, dupes, offset = 0, 0, 0
    seen: set[int] = set()
    while True:
        got = store.get_message("bench", DUE_TOPIC, 0, offset, 512)
        if got.status is not GetStatus.FOUND:
            break
        for msg in got.messages():
            due, seq = DUE.unpack_from(msg.body)
            dupes += seq in seen
            seen.add(seq)
            lateness = int(msg.properties[TIMER_DEQUEUE_MS]) - due
            early += lateness < 0
            late.append(lateness)
        offset = got.next_begin_offset
    late.sort()
    emit(phase="due", due_rate=due_rate, due_seconds=due_seconds, delivered=len(late),
         expected=count, missing=count - len(seen), duplicated=dupes, early=early,
         put_ahead_ms=ahead_ms,
         lateness_p50_ms=late[len(late) // 2], lateness_p99_ms=late[int(len(late) * 0.99)],
         lateness_max_ms=late[-1], dequeue_cpu_s=round(cpu_s, 2))
    flushes = timer.checkpoint.counter
    wait(lambda: timer.checkpoint.counter >= flushes + 2, 30, "a checkpoint")
    emit(phase="ready", checkpoint_queue_offset=timer.checkpoint.last_timer_queue_offset)
    time.sleep(3600)  # SIGKILLed here


def child_recover(home: Path, pending: int, precision: int) -> None:
    started = time.monotonic()
    store = open_store(home, precision)
    store.start()
    opened_s = time.monotonic() - started
    timer = store.timer

    def whole() -> bool:
        status = timer.status()
        return status["enqueueLag"] == 0 and status["pending"] == pending

    wait(whole, 120, "the timer to hold every pending message again")
    ready_s = time.monotonic() - started
    status = timer.status()
    rss1, anon1 = rss()
    report = store.recovery
    emit(phase="recovery", store_open_s=round(opened_s, 2), timer_ready_s=round(ready_s, 2),
         timer_recover_ms=status["recoverMs"], pending=status["pending"], rss_mb=round(rss1, 1),
         anon_mb=round(anon1, 1), commitlog_records_checked=getattr(report, "records", None))
    store.shutdown()


def run_child(args: argparse.Namespace, role: str, home: Path) -> subprocess.Popen[str]:
    cmd = [sys.executable, __file__, "--child", role, "--home", str(home),
           "--pending", str(args.pending), "--due-rate", str(args.due_rate),
           "--due-seconds", str(args.due_seconds), "--precision", str(args.precision)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pending", type=int, default=1_000_000)
    ap.add_argument("--due-rate", type=int, default=10_000)
    ap.add_argument("--due-seconds", type=int, default=20)
    ap.add_argument("--precision", type=int, default=1000)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--child", choices=["fill", "recover"])
    ap.add_argument("--home")
    args = ap.parse_args()
    if args.child == "fill":
        child_fill(Path(args.home), args.pending, args.due_rate, args.due_seconds, args.precision)
        return 0
    if args.child == "recover":
        child_recover(Path(args.home), args.pending, args.precision)
        return 0

    home = Path(tempfile.mkdtemp(prefix="replog-bench-timer-", dir=args.dir))
    figures: dict[str, dict[str, Any]] = {}
    print(f"timer benchmark, {os.cpu_count()} CPUs, timerPrecisionMs {args.precision}, "
          f"home {home}", flush=True)
    try:
        fill = run_child(args, "fill", home)
        assert fill.stdout is not None
        for line in fill.stdout:
            doc = json.loads(line)
            figures[doc["phase"]] = doc
            print(f"  {doc}", flush=True)
            if doc["phase"] == "ready":
                break
        fill.send_signal(signal.SIGKILL)
        fill.wait(30)
        if "ready" not in figures:
            print("the fill child ended early", file=sys.stderr)
            return 1
        recover = run_child(args, "recover", home)
        out, _ = recover.communicate(timeout=300)
        doc = json.loads(out.strip().splitlines()[-1])
        figures[doc["phase"]] = doc
        print(f"  {doc}", flush=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)

    p, d, r = figures["pending"], figures["due"], figures["recovery"]
    target_late = args.precision + 200
    print()
    print(f"enqueue      {p['pending']} pending: put {p['put_rate']} msg/s, enqueue "
          f"{p['enqueue_rate']} msg/s ({p['enqueue_s']} s)")
    print(f"memory       RSS {p['rss_mb_before']} -> {p['rss_mb_pending']} MB, anonymous "
          f"{p['anon_mb_before']} -> {p['anon_mb_pending']} MB with {p['pending']} pending "
          f"(the wheel: {p['wheel_mb']} MB)")
    print(f"due          {d['due_rate']}/s for {d['due_seconds']} s: delivered {d['delivered']} "
          f"of {d['expected']}, early {d['early']}, missing {d['missing']}, duplicated "
          f"{d['duplicated']}; lateness p50 "
          f"{d['lateness_p50_ms']} ms, p99 {d['lateness_p99_ms']} ms, max "
          f"{d['lateness_max_ms']} ms (target p99 < {target_late} ms: "
          f"{'met' if d['lateness_p99_ms'] < target_late else 'MISSED'}); dequeue process CPU "
          f"{d['dequeue_cpu_s']} s")
    print(f"recovery     after kill -9: store open {r['store_open_s']} s (of which the "
          f"timer's own: {r['timer_recover_ms']} ms), timer whole again {r['timer_ready_s']} s "
          f"with {r['pending']} pending (target < 10 s: "
          f"{'met' if r['timer_ready_s'] < 10 else 'MISSED'}); the CommitLog records checked: "
          f"{r['commitlog_records_checked']}")
    ok = d["early"] == 0 and d["missing"] == 0 and d["duplicated"] == 0 \
        and r["pending"] == p["pending"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
