"""Python calls per sync send, in the broker and in the client: the per-request cost without
the machine's noise.

    .venv/bin/python bench/calls_per_message.py [--count 2000] [--top 40] [--repo PATH]
                                                [--against PATH] [--sync] [--grpc]

CPU time per message (``bench/cpu_per_message.py``) swings by a third from one run to the next
on these VMs, more than a regression of a tenth that one commit adds. Function calls do not:
the request path of one checkout makes the same calls every run. So this is the instrument
for bisecting the per-request cost (issue 43) and for checking that a change to the put path
took calls out. It starts a broker of the checkout ``--repo`` (default: this one; ASYNC_MASTER,
ASYNC_FLUSH) with ``bench/calls_site/sitecustomize.py`` counting every call on every thread,
sends ``--count`` 128 B messages one at a time with that checkout's ``Producer`` (after 500
unmeasured; ``spin_us=0``: a spinning wait's calls follow the timing; a pause of ``PAUSE_S``
after each answer, so each request is a loop turn of its own, as the turns per message it
prints show), and prints calls per message: Python functions, and C functions called from
Python; each total is the broker's (every thread: the I/O thread's request path, reput, the
flush and the timers, so a background thread that grew shows too) and the client's (its
sending thread and its I/O thread). ``--against PATH`` measures a second checkout in the same
run and prints the functions whose calls per message differ most. ``--sync``: the broker is a
SYNC_MASTER with one slave, also counted (its HA thread's DATA, append, dispatch and ACK), so
each send is the four-hop round trip the SYNC rows time. ``--grpc``: the broker serves
RocketMQ 5's gRPC protocol (``grpcServerPort``, Local mode) and the sends are the official
client's ``SendMessage`` calls through its generated stubs, one at a time (issue 41's
``send x1`` row); the client's counts are then grpc's Python side. The counting slows the
broker several times; the rate it prints is not a figure of anything.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _support

HERE = Path(__file__).resolve().parent
SITE = HERE / "calls_site"

CLIENT = r"""
import json, os, sys, threading, time
sys.path.insert(0, os.environ["REPLOG_CALLS_SITE"])
import sitecustomize as counting  # the same counter, in this process
from common.client import Producer
address, count, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
threading.setprofile(counting._profile)
sys.setprofile(counting._profile)
os.environ["REPLOG_CALLS_OUT"] = out
# no spin: a spinning call reads ZMQ_EVENTS until the answer is there, as many times as the
# answer takes, so its calls would follow the machine's timing (the broker got fast enough
# that the client spins, and its count swung 32-39 between runs); blocked, it counts the same
producer = Producer([address], spin_us=0)
body = b"x" * 128
deadline = time.monotonic() + 60
while producer.send("calls", body).status.name != "SEND_OK":  # a SYNC_MASTER: its slave is in
    if time.monotonic() > deadline:
        raise SystemExit("no SEND_OK in 60 s")
    time.sleep(0.1)
for _ in range(500):
    producer.send("calls", body)
print("ready", flush=True)
sys.stdin.readline()
pause = float(os.environ["REPLOG_CALLS_PAUSE_S"])
counting._start()
began = time.monotonic()
for _ in range(count):
    producer.send("calls", body)
    time.sleep(pause)
elapsed = time.monotonic() - began
counting._stop()
sys.setprofile(None)
threading.setprofile(None)
print(f"done {elapsed}", flush=True)
producer.close()
"""

GRPC_CLIENT = r"""
import json, os, sys, threading, time
sys.path.insert(0, os.environ["REPLOG_CALLS_SITE"])
import sitecustomize as counting  # the same counter, in this process
import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol import service_pb2_grpc
address, count, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.environ["REPLOG_CALLS_OUT"] = out
stub = service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(address))
body = b"x" * 128


def send(i):
    msg = pb.Message(topic=pb.Resource(name="calls"), body=body, system_properties=pb.
                     SystemProperties(message_id=f"calls-{i}", message_type=pb.NORMAL,
                                      body_encoding=pb.IDENTITY))
    return stub.SendMessage(rpc.SendMessageRequest(messages=[msg]), timeout=10).status.code


deadline = time.monotonic() + 60
while True:
    try:
        if send(0) == pb.OK:
            break
    except grpc.RpcError:
        pass
    if time.monotonic() > deadline:
        raise SystemExit("no OK in 60 s")
    time.sleep(0.1)
for i in range(500):
    send(i)
print("ready", flush=True)
sys.stdin.readline()
threading.setprofile(counting._profile)
sys.setprofile(counting._profile)
pause = float(os.environ["REPLOG_CALLS_PAUSE_S"])
counting._start()
began = time.monotonic()
for i in range(count):
    send(i)
    time.sleep(pause)
elapsed = time.monotonic() - began
counting._stop()
sys.setprofile(None)
threading.setprofile(None)
print(f"done {elapsed}", flush=True)
"""

Counts = collections.Counter[tuple[str, str, str]]  # (thread, file, function)

# the client's pause after each answer: the broker's loop is back in its poll before the next
# request comes, so each request is a turn of its own. Unpaced, a request that arrives while
# the loop is still in its burst is read in the same turn, and how often that happens follows
# the machine's timing: the count of one checkout swung 65-80 a send between runs under load
PAUSE_S = 0.005


def _load(path: Path) -> Counts:
    counts: Counts = collections.Counter()
    for thread, where, name, n in json.loads(path.read_text()):
        counts[(thread, where, name)] += n
    return counts


def _dump(broker: subprocess.Popen[str] | subprocess.Popen[bytes], path: Path) -> Counts:
    """Stop the broker's counting; its counts, once written."""
    broker.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            counts = _load(path)
        except (FileNotFoundError, ValueError):  # not there yet, or not whole yet
            time.sleep(0.05)
            continue
        path.unlink()  # the next dump goes to the same path
        return counts
    raise RuntimeError(f"the broker wrote no counts to {path}")


def _start(repo: Path, home: Path, name: str, config: str) -> subprocess.Popen[bytes]:
    """A broker of ``repo`` counting its calls into ``home/<name>.json``."""
    (home / f"{name}.yaml").write_text(config)
    env = {**os.environ, "PYTHONPATH": f"{SITE}{os.pathsep}{repo}", "PYTHONHASHSEED": "0",
           "REPLOG_CALLS_OUT": str(home / f"{name}.json"), "REPLOG_CALLS_SITE": str(SITE)}
    with open(home / f"{name}.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "common.cli", "broker", "-c", str(home / f"{name}.yaml")],
            cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT)


def measure(repo: Path, count: int, sync: bool = False,
            grpc: bool = False) -> tuple[Counts, Counts, Counts | None]:
    """(broker's counts, client's counts, slave's counts or None) for ``count`` sync sends
    against ``repo`` (``sync``: a SYNC_MASTER and its slave; ``grpc``: over RocketMQ 5's gRPC
    protocol, served by the broker)."""
    with tempfile.TemporaryDirectory(prefix="replog-calls-") as tmp:
        home = Path(tmp)
        port = _support.free_port(5)
        broker = _start(repo, home, "broker",
                        f"listenPort: {port}\nhaListenPort: {port + 1}\n"
                        + (f"grpcServerPort: {port + 4}\n" if grpc else "") +
                        f"storePathRootDir: {home}/store\n"
                        f"brokerRole: {'SYNC_MASTER' if sync else 'ASYNC_MASTER'}\n"
                        "flushDiskType: ASYNC_FLUSH\nmappedFileSizeCommitLog: 16777216\n")
        slave = _start(repo, home, "slave",
                       f"listenPort: {port + 2}\nhaListenPort: {port + 3}\n"
                       f"storePathRootDir: {home}/slave-store\nbrokerRole: SLAVE\nbrokerId: 1\n"
                       f"haMasterAddress: 127.0.0.1:{port + 1}\nflushDiskType: ASYNC_FLUSH\n"
                       "mappedFileSizeCommitLog: 16777216\n") if sync else None
        procs = [broker] if slave is None else [broker, slave]
        env = {**os.environ, "PYTHONHASHSEED": "0", "REPLOG_CALLS_SITE": str(SITE),
               "REPLOG_CALLS_PAUSE_S": str(PAUSE_S)}
        client_env = {**env, "PYTHONPATH": str(repo)}
        client = subprocess.Popen(
            [sys.executable, "-c", GRPC_CLIENT if grpc else CLIENT,
             f"127.0.0.1:{port + 4 if grpc else port}", str(count),
             str(home / "client.json")],
            cwd=repo, env=client_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert client.stdin is not None and client.stdout is not None
            if client.stdout.readline().strip() != "ready":
                raise RuntimeError((home / "broker.log").read_text()[-3000:])
            for proc in procs:
                proc.send_signal(signal.SIGUSR1)
            time.sleep(0.2)
            client.stdin.write("\n")
            client.stdin.flush()
            done = client.stdout.readline().split()
            if not done or done[0] != "done":
                raise RuntimeError("the client did not finish")
            elapsed = float(done[1])
            busy = _dump(broker, home / "broker.json")
            slave_busy = _dump(slave, home / "slave.json") if slave is not None else None
            client.wait(30)
            # the broker's calls made by time, not by message (timers, idle loop turns): the
            # same span without traffic, taken off
            for proc in procs:
                proc.send_signal(signal.SIGUSR1)
            time.sleep(elapsed)
            busy.subtract(_dump(broker, home / "broker.json"))
            if slave is not None and slave_busy is not None:
                slave_busy.subtract(_dump(slave, home / "slave.json"))
            return busy, _load(home / "client.json"), slave_busy
        finally:
            if client.poll() is None:
                client.kill()
                client.wait(10)
            for proc in procs:
                _support.stop(proc)


def totals(counts: Counts, n: int) -> tuple[float, float]:
    py = sum(v for k, v in counts.items() if k[1] != "C")
    c = sum(v for k, v in counts.items() if k[1] == "C")
    return py / n, c / n


def turns(counts: Counts, n: int) -> float:
    """The request loop's turns per message (1.0 when each request is a turn of its own)."""
    return sum(v for (thread, _, name), v in counts.items()
               if thread == "replog-io" and name == "_poll_timeout_ms") / n


def by_thread(counts: Counts, n: int) -> list[tuple[str, float, float]]:
    """(thread, Python calls, C calls) per message, busiest first, those of 0.5 and more."""
    py: collections.Counter[str] = collections.Counter()
    c: collections.Counter[str] = collections.Counter()
    for (thread, where, _), v in counts.items():
        (c if where == "C" else py)[thread] += v
    return [(t, v / n, c[t] / n) for t, v in py.most_common() if v / n >= 0.5]


def by_function(counts: Counts) -> Counts:
    """The counts of every thread together, by (file, function)."""
    out: Counts = collections.Counter()
    for (_, where, name), v in counts.items():
        out[("", where, name)] += v
    return out


def report(label: str, broker: Counts, client: Counts, n: int,
           slave: Counts | None = None) -> None:
    whose = [("broker", broker), ("client", client)] + ([("slave", slave)] if slave else [])
    for who, counts in whose:
        py, c = totals(counts, n)
        print(f"{label} {who}: {py:.1f} Python calls and {c:.1f} C calls per message"
              + (f" ({turns(counts, n):.2f} loop turns)" if who != "client" else ""))
        for thread, tpy, tc in by_thread(counts, n):
            print(f"    {thread:<28} {tpy:7.1f} {tc:7.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--repo", type=Path, default=_support.REPO)
    ap.add_argument("--against", type=Path, default=None)
    ap.add_argument("--sync", action="store_true",
                    help="a SYNC_MASTER with one slave (counted too), not an ASYNC_MASTER alone")
    ap.add_argument("--grpc", action="store_true",
                    help="the official client's SendMessage to the broker's grpcServerPort")
    args = ap.parse_args()
    n = args.count
    broker, client, slave = measure(args.repo.resolve(), n, args.sync, args.grpc)
    print(f"{n} sync sends of 128 B, one in flight{' to a SYNC_MASTER and its slave' if slave else ''}; "
          "calls per message (Python, C), each process's total and its threads' (the brokers': "
          "less those of as long a span idle)")
    report(str(args.repo), broker, client, n, slave)
    funcs = by_function(broker)
    if args.top:
        whose = [("broker", funcs), ("client", by_function(client))]
        if slave is not None:
            whose.append(("slave", by_function(slave)))
        for who, counts in whose:
            print(f"{who}, the {args.top} Python functions called most per message:")
            python = [(k, v) for k, v in counts.items() if k[1] != "C"]
            for (_, where, name), v in sorted(python, key=lambda kv: -kv[1])[: args.top]:
                print(f"  {v / n:7.2f}  {where}:{name}")
    if args.against is not None:
        other, other_client, other_slave = measure(args.against.resolve(), n, args.sync, args.grpc)
        report(str(args.against), other, other_client, n, other_slave)
        theirs = by_function(other)
        print("broker functions whose calls per message differ most (this checkout, the other):")
        keys = set(funcs) | set(theirs)
        for k in sorted(keys, key=lambda k: -abs(funcs[k] - theirs[k]))[: args.top]:
            if abs(funcs[k] - theirs[k]) >= n * 0.5:
                print(f"  {funcs[k] / n:7.2f} {theirs[k] / n:7.2f}  {k[1]}:{k[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
