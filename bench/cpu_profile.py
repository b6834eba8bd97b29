"""Where the CPU of a put goes, by process, thread and layer: perf's view beside the transport's.

    .venv/bin/python bench/cpu_profile.py [--seconds 6] [--rounds 1] [--only sync batch ...]

Issue 24 asks, where a target is missed, for a profile that says where the remaining time is:
in libzmq, the kernel, the interpreter or our code. ``bench/cpu_per_message.py`` gives each
process's CPU per message; this script splits it. For each case it runs the replog put and then
its bare-transport reference (the same ones as ``bench/cpu_per_message.py``: the DEALER/ROUTER
echo, the packed echo, the 4-hop relay), one request in flight, each for ``--seconds`` while
``perf record -a -e cpu-clock`` samples every CPU at 4 kHz. Each sample is charged to its
process's role (client, broker / master / slave, or the reference's server processes), its
thread (the Python threads, or libzmq's I/O thread ``ZMQbg/IO``) and a layer by the code it
hit:

| layer     | what                                                                                |
|-----------|-------------------------------------------------------------------------------------|
| bytecode  | ``_PyEval_EvalFrameDefault``: the interpreter running Python code                    |
| runtime   | the rest of libpython: allocation, attribute and dict lookups, calls, frames, GC...  |
| zmq       | libzmq and pyzmq's compiled backend                                                  |
| kernel    | system calls, wake-ups, TCP over loopback, page faults                               |
| msgpack   | msgpack's C packer and unpacker                                                      |
| ours (C)  | replog's extensions (the record writer, reput's scan)                                |
| libc      | libc (memcpy, getpid, poll's wrapper...)                                             |
| other     | anything else (zlib's CRC, the vdso...)                                              |

Printed: microseconds of CPU per message in each cell, for replog and its reference, and the
difference; with ``--rounds N``, each cell's median over the rounds. The replog client runs with
``spin_us=0``, so that its CPU is work and not a wait spent spinning. The bytecode and runtime layers of a Python thread are the interpreter running
that process's Python code: in the references, pyzmq's sugar and the loop of a few lines; in
replog, our request path. ``py-spy`` splits them further by function (docs/benchmarks.md).

Needs ``perf`` (Debian's ``linux-perf``) and root or ``kernel.perf_event_paranoid`` <= -1;
without them the script says so and skips (status 0, as the Redis references are skipped
without ``redis-server``). The samples are wall-clock driven (``cpu-clock``):
they count CPU time, not cycles, so a cache-cold interpreter shows as more time, as it costs.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import _support
import zmq
from broker_put import _echo_server
from cpu_per_message import end, spawn
from replication import Broker, _relay_master, _relay_slave, group

from common.client import Producer
from common.core.errors import SendStatus

HZ = 4000
CASES = ("sync", "batch", "sync-single", "sync-batch")
LAYERS = ("bytecode", "runtime", "zmq", "kernel", "msgpack", "ours (C)", "libc", "other")
SAMPLE = re.compile(r"^\s*(.+?)\s+(\d+)/(\d+)\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$")


def layer_of(sym: str, dso: str) -> str:
    name = dso.rsplit("/", 1)[-1]
    if name.startswith("libpython"):
        return "bytecode" if sym == "_PyEval_EvalFrameDefault" else "runtime"
    if name.startswith(("libzmq", "_zmq.")):
        return "zmq"
    if "kernel" in name:
        return "kernel"
    if name.startswith("_cmsgpack"):
        return "msgpack"
    if name.startswith(("_record_writer", "_reput_scan")):
        return "ours (C)"
    if name.startswith(("libc.", "libc-")):
        return "libc"
    return "other"


@contextmanager
def perf_record(out: Path, seconds: float) -> Iterator[subprocess.Popen[bytes]]:
    """``perf record`` of every CPU for ``seconds``; yields the recorder (poll it to know when
    the window ends)."""
    proc = subprocess.Popen(
        ["perf", "record", "-e", "cpu-clock", "-F", str(HZ), "-a", "-o", str(out),
         "--", "sleep", str(seconds)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)  # perf's start-up, outside the window the loop measures
        yield proc
    finally:
        if proc.poll() is None:
            proc.wait(seconds + 30)


def charge(out: Path, roles: dict[int, str]) -> collections.Counter[tuple[str, str, str]]:
    """Samples of ``out`` per (role, thread kind, layer); processes not in ``roles`` dropped."""
    text = subprocess.run(["perf", "script", "-i", str(out), "-F", "comm,pid,tid,ip,sym,dso"],
                          capture_output=True, text=True, check=True).stdout
    counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m is None:
            continue
        comm, pid, _tid, sym, dso = m.groups()
        role = roles.get(int(pid))
        if role is None:
            continue
        thread = "zmq I/O" if comm.startswith("ZMQbg") else "python"
        counts[(role, thread, layer_of(sym, dso))] += 1
    return counts


def run_window(home: Path, name: str, step: Callable[[], None], per_step: int,
               roles: dict[int, str], seconds: float) -> dict[tuple[str, str, str], float]:
    """``step`` over and over while perf records; CPU us per message per cell."""
    for _ in range(200):
        step()
    out = home / f"{name}.perf"
    steps = 0
    with perf_record(out, seconds) as rec:
        t0 = time.perf_counter()
        while rec.poll() is None:
            step()
            steps += 1
        wall = time.perf_counter() - t0
    msgs = steps * per_step
    counts = charge(out, roles)
    out.unlink()
    print(f"  {name:<28} {msgs / wall:>9.0f} msg/s", flush=True)
    return {cell: n / HZ / msgs * 1e6 for cell, n in counts.items()}


def table(title: str, mine: dict[tuple[str, str, str], float],
          ref: dict[tuple[str, str, str], float], pairs: list[tuple[str, str]]) -> None:
    """One row per (replog role, reference role) and thread kind: each layer replog/ref."""
    print(f"\n{title}: CPU us per message, replog / reference (difference)")
    print(f"  {'process, thread':<24}" + "".join(f"{layer:>16}" for layer in LAYERS)
          + f"{'total':>18}")
    for role, ref_role in pairs:
        for thread in ("python", "zmq I/O"):
            a = [mine.get((role, thread, layer), 0.0) for layer in LAYERS]
            b = [ref.get((ref_role, thread, layer), 0.0) for layer in LAYERS]
            cells = "".join(f"{x:>7.1f} /{y:>6.1f} " for x, y in zip(a, b, strict=True))
            print(f"  {role + ', ' + thread:<24}{cells}{sum(a):>8.1f} /{sum(b):>7.1f}"
                  f" ({sum(a) - sum(b):+.1f})")


def echo_case(home: Path, name: str, size: int, bodies: int,
              seconds: float) -> dict[tuple[str, str, str], float]:
    port = _support.free_port()
    ready = multiprocessing.Event()
    server = spawn(_echo_server, port, ready)
    ctx = zmq.Context()
    try:
        ready.wait(10)
        sock = ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{port}")
        msg = [b"h" * 16, b"x" * (size * bodies)]

        def step() -> None:
            sock.send_multipart(msg)
            sock.recv_multipart()

        assert server.pid is not None
        return run_window(home, name, step, bodies, {os.getpid(): "client",
                                                     server.pid: "server"}, seconds)
    finally:
        ctx.destroy(0)
        server.kill()
        server.join()


def relay_case(home: Path, name: str, size: int, bodies: int,
               seconds: float) -> dict[tuple[str, str, str], float]:
    client_port, ha_port = _support.free_port(), _support.free_port()
    procs = [spawn(_relay_master, client_port, ha_port), spawn(_relay_slave, ha_port)]
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{client_port}")
        body = b"x" * (size * bodies)

        def step() -> None:
            sock.send_multipart([b"put", body])
            sock.recv_multipart()

        roles = {os.getpid(): "client", procs[0].pid or 0: "master", procs[1].pid or 0: "slave"}
        figures = run_window(home, name, step, bodies, roles, seconds)
        sock.send_multipart([b"stop", b""])
        sock.recv_multipart()
        return figures
    finally:
        ctx.destroy(0)
        end(procs)


def producer_step(p: Producer, size: int, bodies: int) -> Callable[[], None]:
    body = b"x" * size
    batch = [body] * bodies

    def single() -> None:
        r = p.send("bench", body, queue_id=0)
        assert r.status == SendStatus.SEND_OK, r.status

    def many() -> None:
        rs = p.send_batch("bench", batch, queue_id=0)
        assert rs[0].status == SendStatus.SEND_OK, rs[0].status

    return single if bodies == 1 else many


Cells = dict[tuple[str, str, str], float]
# case -> (title, replog cells, reference cells, (replog role, reference role) pairs)
Found = dict[str, tuple[str, Cells, Cells, list[tuple[str, str]]]]


def alone(home: Path, cases: list[str], seconds: float) -> Found:
    out: Found = {}
    broker = Broker(home / "alone", brokerRole="ASYNC_MASTER", flushDiskType="ASYNC_FLUSH").start()
    try:
        assert broker.proc is not None
        roles = {os.getpid(): "client", broker.proc.pid: "broker"}
        pairs = [("client", "client"), ("broker", "server")]
        # spin_us=0: the client's CPU is its work, not a wait spent spinning
        with Producer([broker.address], retries=0, spin_us=0) as p:
            if "sync" in cases:
                mine = run_window(home, "sync 128 B", producer_step(p, 128, 1), 1, roles, seconds)
                ref = echo_case(home, "  echo x1 128 B", 128, 1, seconds)
                out["sync"] = ("sync send, 128 B (reference: the echo)", mine, ref, pairs)
            if "batch" in cases:
                mine = run_window(home, "send_batch x64 128 B", producer_step(p, 128, 64), 64,
                                  roles, seconds)
                ref = echo_case(home, "  echo 64 packed 128 B", 128, 64, seconds)
                out["batch"] = ("send_batch x64, 128 B (reference: the packed echo)", mine, ref,
                                pairs)
    finally:
        broker.stop()
    return out


def replicated(home: Path, cases: list[str], seconds: float) -> Found:
    out: Found = {}
    if "sync-single" not in cases and "sync-batch" not in cases:
        return out
    master, slave = group(home / "sync", "SYNC_MASTER")
    try:
        assert master.proc is not None and slave.proc is not None
        roles = {os.getpid(): "client", master.proc.pid: "master", slave.proc.pid: "slave"}
        pairs = [("client", "client"), ("master", "master"), ("slave", "slave")]
        with Producer([master.address], retries=0, spin_us=0) as p:
            if "sync-single" in cases:
                mine = run_window(home, "SYNC single 1 KiB", producer_step(p, 1024, 1), 1,
                                  roles, seconds)
                ref = relay_case(home, "  relay 1 KiB", 1024, 1, seconds)
                out["sync-single"] = ("SYNC single, 1 KiB (reference: the 4-hop relay)", mine,
                                      ref, pairs)
            if "sync-batch" in cases:
                mine = run_window(home, "SYNC send_batch x64 1 KiB",
                                  producer_step(p, 1024, 64), 64, roles, seconds)
                ref = relay_case(home, "  relay 64 KiB frames", 1024, 64, seconds)
                title = "SYNC send_batch x64, 1 KiB (reference: the relay of 64-body frames)"
                out["sync-batch"] = (title, mine, ref, pairs)
    finally:
        slave.stop()
        master.stop()
    return out


def median_cells(rounds: list[Cells]) -> Cells:
    """Each cell's median over the rounds (a round without samples in a cell counts 0)."""
    cells = {cell for r in rounds for cell in r}
    return {cell: statistics.median(r.get(cell, 0.0) for r in rounds) for cell in cells}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="each window perf records")
    ap.add_argument("--only", nargs="*", choices=CASES, default=list(CASES))
    ap.add_argument("--rounds", type=int, default=1, help="each cell: the median of the rounds")
    args = ap.parse_args()
    if shutil.which("perf") is None:
        print("cpu_profile: skipped, perf is not installed (as root: apt-get install -y linux-perf)")
        return 0
    probe = subprocess.run(["perf", "record", "-e", "cpu-clock", "-a", "-o", "/dev/null",
                            "--", "true"], check=False, capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"cpu_profile: skipped, perf cannot sample every CPU here: "
              f"{probe.stderr.strip()[-300:]}")
        return 0
    home = Path(tempfile.mkdtemp(prefix="replog-cpu-profile-"))
    try:
        print(f"CPU per message by layer (perf, {HZ} Hz), {os.cpu_count()} CPUs, load "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        rounds: list[Found] = []
        for r in range(args.rounds):
            print(f"round {r + 1}", flush=True)
            found = alone(home / f"r{r}", args.only, args.seconds)
            found.update(replicated(home / f"r{r}", args.only, args.seconds))
            rounds.append(found)
        for case in args.only:
            title, _, _, pairs = rounds[0][case]
            if args.rounds > 1:
                title += f", medians of {args.rounds} rounds"
            table(title, median_cells([r[case][1] for r in rounds]),
                  median_cells([r[case][2] for r in rounds]), pairs)
        return 0
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
