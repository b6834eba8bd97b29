"""The regression gate: the put path's key ratios against the ones kept in ``bench/ratios.json``.

Each row is a ratio measured within one run, against a reference that runs beside it on the
same machine (the bare transport, Redis), so the machine's speed of the day cancels out:

| row                    | replog                              | reference                         |
|------------------------|-------------------------------------|-----------------------------------|
| sync_vs_echo           | ``send``, 1 in flight, 128 B        | DEALER/ROUTER echo, 1 in flight   |
| sync_vs_redis          | the same                            | Redis ``XADD``, one at a time     |
| async64_vs_echo        | ``send_async``, 64 in flight        | echo, 64 in flight                |
| async64_vs_redis       | the same                            | ``XADD`` pipelined 64             |
| batch64_vs_redis       | ``send_batch`` x64                  | ``XADD`` pipelined 64             |
| sync_master_vs_relay   | SYNC_MASTER ``send``, 1 in flight,  | the bare four-hop relay           |
|                        | 1 KiB, master + 1 slave             | (``bench/replication.py``)        |
| sync_master_batch_vs_relay | SYNC_MASTER ``send_batch`` x64  | the relay of 64-body frames       |

Besides the ratios, the Python calls per sync send of the broker and of the client
(``bench/calls_per_message.py``: counted, not timed, the same every run within 1%) are kept
and may not grow by more than ``--calls-tolerance`` (5%): the per-request cost that lost a
third against Redis between 2026-11-24 and 11-27 added 20 calls per send, one commit at a
time, each within the rates' noise; counted, each would have shown.

Every row is measured ``--rounds`` times (default 9), in short legs, the replog figure and its reference back
to back in each round, and the median of the rounds' ratios is compared with the kept one: a
median more than ``--tolerance`` (15%) below it fails the gate (exit 1), unless the rounds'
upper quartile still reaches the kept ratio (this VM's spread: the medians of five runs of one
commit spanned 0.29-0.46 for a single send against the echo; a fall the quartile confirms is
a fall, a low median inside the spread is not). ``--update`` writes
this run's medians as the kept ratios, with the commit, the date and the machine. ``make
bench`` runs it; the note of every change to the put path reports its table.

A ratio cancels the machine's speed, not a neighbour that takes a core from one leg and not
the other, nor a change of machine: the ratios are not judged when the rest of the machine used
more than ``BUSY_CPUS`` while the gate ran (``_support.OtherLoad``), nor against ratios kept on
another CPU model. ``--against PATH`` judges this checkout against an earlier one's own gate
run in turn with it, here and now (``--pairs`` runs of each), instead of the kept file; with
``--update`` a passing run keeps its medians for this machine. The calls per send, counted,
are judged in every case.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import _support
import broker_put as bp
import calls_per_message as cpm
import replication as rp

from common.client import Producer

KEPT = Path(__file__).resolve().parent / "ratios.json"
SYNC_COUNT, ASYNC_COUNT, BATCH_COUNT = 2500, 20_000, 60_000  # per leg of a round
CALLS_COUNT = 1000  # sync sends counted
# the rest of the machine's CPUs (on average over the run) above which the ratios are not
# judged: a test run beside the gate (issue 36's loaded series) takes one to two
BUSY_CPUS = 0.25


def put_rows(rounds: int) -> dict[str, list[float]]:
    """The single-broker rows (ASYNC_MASTER), each round replog then its references."""
    home = Path(tempfile.mkdtemp(prefix="replog-gate-"))
    stops: list[Callable[[], None]] = []
    rows: dict[str, list[float]] = {k: [] for k in (
        "sync_vs_echo", "sync_vs_redis", "async64_vs_echo", "async64_vs_redis",
        "batch64_vs_redis")}
    try:
        broker, address = bp.start_broker(home)
        stops.append(lambda: _support.stop(broker))
        echo_port = _support.free_port()
        ready = multiprocessing.Event()
        echo = multiprocessing.Process(target=bp._echo_server, args=(echo_port, ready),
                                       daemon=True)
        echo.start()
        stops.append(lambda: (echo.kill(), echo.join(5)))
        ready.wait(10)
        redis_proc, redis_port = bp.start_redis(home)
        if redis_proc is not None:
            stops.append(lambda: _support.stop(redis_proc))
        echo_addr = f"127.0.0.1:{echo_port}"
        with Producer([address]) as p:
            bp.replog_sync(p, 128, 500)  # warm-up
            for _ in range(rounds):  # short legs, interleaved: a slow spell hits both sides
                sync = bp.replog_sync(p, 128, SYNC_COUNT)
                rows["sync_vs_echo"].append(sync.rate / bp.echo_run(
                    echo_addr, 128, SYNC_COUNT, 1, 1, "echo x1").rate)
                if redis_port:
                    rows["sync_vs_redis"].append(
                        sync.rate / bp.redis_run(redis_port, 128, SYNC_COUNT, 1).rate)
                asy = bp.replog_async(p, 128, ASYNC_COUNT)
                rows["async64_vs_echo"].append(asy.rate / bp.echo_run(
                    echo_addr, 128, ASYNC_COUNT, bp.WINDOW, 1, "echo 64").rate)
                batch = bp.replog_batch(p, 128, BATCH_COUNT)
                if redis_port:
                    r64 = bp.redis_run(redis_port, 128, ASYNC_COUNT, bp.BATCH).rate
                    rows["async64_vs_redis"].append(asy.rate / r64)
                    rows["batch64_vs_redis"].append(batch.rate / r64)
        return {k: v for k, v in rows.items() if v}
    finally:
        for stop in reversed(stops):
            stop()
        shutil.rmtree(home, ignore_errors=True)


def sync_master_rows(rounds: int) -> dict[str, list[float]]:
    """SYNC_MASTER with one slave, 1 KiB bodies, against the bare relay of the same hops."""
    home = Path(tempfile.mkdtemp(prefix="replog-gate-repl-"))
    rows: dict[str, list[float]] = {"sync_master_vs_relay": [],
                                    "sync_master_batch_vs_relay": []}
    master, slave = rp.group(home / "sync", "SYNC_MASTER")
    try:
        with Producer([master.address], retries=0) as p:
            rp.in_flight(p, 1000, 16, "warm-up")
            for _ in range(rounds):
                single = rp.sends(p, 1000, "SYNC 1 in flight")
                rows["sync_master_vs_relay"].append(
                    single.rate / rp.relay(1000, rp.BODY, 1, "relay").rate)
                batch = rp.batches(p, 10_000, "SYNC send_batch x64")
                rows["sync_master_batch_vs_relay"].append(
                    batch.rate / rp.relay(160, rp.BODY, 64, "relay x64").rate)
        return rows
    finally:
        slave.stop()
        master.stop()
        shutil.rmtree(home, ignore_errors=True)


def upper_quartile(values: list[float]) -> float:
    return statistics.quantiles(values, n=4)[2] if len(values) > 1 else values[0]


def commit(repo: Path = _support.REPO) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo,
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or "?"


Rows = dict[str, list[float]]  # a row's rounds
Calls = dict[str, float]  # Python calls per sync send


def count_calls(repo: Path) -> Calls:
    """The Python calls per sync send of ``repo``'s broker and client, counted by this
    checkout's instrument (so two checkouts are counted alike)."""
    broker_calls, client_calls, _ = cpm.measure(repo, CALLS_COUNT)
    return {"broker_calls_per_send": round(cpm.totals(broker_calls, CALLS_COUNT)[0], 1),
            "client_calls_per_send": round(cpm.totals(client_calls, CALLS_COUNT)[0], 1)}


def measure_here(rounds: int) -> tuple[Rows, Calls]:
    calls = count_calls(_support.REPO)
    return {**put_rows(rounds), **sync_master_rows(rounds)}, calls


ROW_LINE = re.compile(r"^\s+(\w+)\s+([\d.]+)\s+kept\s+\S+\s+\[([^\]]*)\]")


def measure_there(repo: Path, rounds: int) -> tuple[Rows, Calls]:
    """The rows of another checkout, by its own gate (its verdicts, against its own kept file,
    ignored): the same rows its code had, measured now on this machine; its calls counted by
    this checkout's instrument."""
    done = subprocess.run([sys.executable, str(repo / "bench" / "gate.py"), "--rounds",
                           str(rounds)], cwd=repo, capture_output=True, text=True,
                          check=False, timeout=1800)
    rows: Rows = {}
    for line in done.stdout.splitlines():
        if m := ROW_LINE.match(line):
            rows[m.group(1)] = [float(x) for x in m.group(3).split(",") if x.strip()]
    if not rows:
        raise RuntimeError(f"{repo}: its gate printed no rows (exit {done.returncode}):\n"
                           f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return rows, count_calls(repo)


def pooled(runs: list[Rows]) -> Rows:
    out: Rows = {}
    for run in runs:
        for name, values in run.items():
            out.setdefault(name, []).extend(values)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--tolerance", type=float, default=0.15,
                    help="how far below a kept ratio a median may fall")
    ap.add_argument("--calls-tolerance", type=float, default=0.05,
                    help="how far above a kept count of calls per send a count may rise")
    ap.add_argument("--against", type=Path, default=None,
                    help="a checkout of an earlier commit (its C extensions built): its rows "
                         "measured in this run, in turn with this checkout's, are the reference")
    ap.add_argument("--pairs", type=int, default=2,
                    help="with --against: how many runs of each, in turn")
    ap.add_argument("--update", action="store_true", help="keep this run's medians")
    args = ap.parse_args()
    others = _support.OtherLoad()
    kept = json.loads(KEPT.read_text()) if KEPT.exists() else {"ratios": {}}
    machine = _support.cpu_model()
    if args.against is None:
        rows, calls = measure_here(args.rounds)
        reference, ref_calls = kept["ratios"], kept.get("calls", {})
        whose = f"kept: {kept.get('commit', '-')} {kept.get('date', '')}"
        kept_on = kept.get("cpu")
        elsewhere = None if kept_on == machine else (
            f"the kept ratios are of another machine ({kept_on or 'not recorded'}; this one is "
            f"{machine}): judge in one run with --against a checkout of {kept.get('commit')}")
    else:
        theirs: list[tuple[Rows, Calls]] = []
        ours: list[tuple[Rows, Calls]] = []
        for _ in range(args.pairs):
            theirs.append(measure_there(args.against.resolve(), args.rounds))
            ours.append(measure_here(args.rounds))
        rows = pooled([r for r, _ in ours])
        calls = {k: round(statistics.median(c[k] for _, c in ours), 1) for k in ours[0][1]}
        reference = {k: round(statistics.median(v), 3)
                     for k, v in pooled([r for r, _ in theirs]).items()}
        ref_calls = {k: round(statistics.median(c[k] for _, c in theirs if k in c), 1)
                     for k in theirs[0][1]}
        whose = (f"the reference: {args.against} ({commit(args.against.resolve())}), "
                 f"{args.pairs} runs in turn with this checkout's, rounds pooled")
        elsewhere = None
    medians = {k: round(statistics.median(v), 3) for k, v in rows.items()}
    busy = others.cpus()
    print(f"regression gate ({args.rounds} rounds each, {machine}, commit {commit()}, the "
          f"rest of the machine {busy:.2f} CPUs); {whose}")
    unjudged: str | None = elsewhere
    if busy > BUSY_CPUS:
        unjudged = (f"the rest of the machine used {busy:.2f} CPUs on average (more than "
                    f"{BUSY_CPUS}): a neighbour takes a core from one leg and not the other, "
                    "so a ratio says nothing of the code")
    failed, judged = [], 0
    for name, median in medians.items():
        ref = reference.get(name)
        rounds = ", ".join(f"{r:.3f}" for r in rows[name])
        if ref is None:
            verdict = "new"
        elif unjudged:
            verdict = "not judged"
        elif median < ref * (1 - args.tolerance) and upper_quartile(rows[name]) < ref:
            verdict = f"FAILED: more than {args.tolerance:.0%} below"
            failed.append(name)
        elif median < ref * (1 - args.tolerance):
            verdict = "low median, upper quartile still at the kept ratio: noise"
        else:
            verdict = "ok"
        judged += verdict not in ("new", "not judged")
        print(f"  {name:<28} {median:>7.3f}  kept {ref if ref is not None else '-':>7}  "
              f"[{rounds}]  {verdict}")
    for name, count in calls.items():  # counted, not timed: judged whatever else runs
        ref = ref_calls.get(name)
        if ref is None:
            verdict = "new"
        elif count > ref * (1 + args.calls_tolerance):
            verdict = f"FAILED: more than {args.calls_tolerance:.0%} above"
            failed.append(name)
        else:
            verdict = "ok"
        judged += verdict != "new"
        print(f"  {name:<28} {count:>7.1f}  kept {ref if ref is not None else '-':>7}  "
              f"(Python calls per sync send, counted)  {verdict}")
    if unjudged:
        print(f"the ratio rows are not judged: {unjudged}")
    if args.update:
        if busy > BUSY_CPUS or failed:
            print("nothing kept: " + ("the machine was busy" if busy > BUSY_CPUS else
                                      "a row failed against its reference"))
            return 1
        KEPT.write_text(json.dumps({
            "commit": commit(), "date": datetime.datetime.now(datetime.UTC).strftime(
                "%Y-%m-%d %H:%M UTC"), "rounds": args.rounds, "cpu": machine,
            "machine": f"the rest of the machine {busy:.2f} CPUs"
                       + (f"; {whose}" if args.against else ""),
            "ratios": medians, "calls": calls,
            "calls_kept": f"{commit()}: this run's counts"}, indent=2) + "\n")
        print(f"kept in {KEPT}")
        return 0
    print(f"{judged - len(failed)} passed, {len(failed)} failed"
          + (f", {len(medians)} not judged" if unjudged else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
