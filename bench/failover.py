"""Automatic failover on ZooKeeper: failover time, and what controller mode costs puts.

1. Failover time: three brokers in controller mode (SYNC_MASTER) and a local ZooKeeper
   (``common/cli/zookeeper.py``, tickTime 500 ms); the master is SIGKILLed ``--kills`` times
   (20 by default) while a client sends one message at a time; each kill's figure is the time
   from the SIGKILL to the first SEND_OK the client gets from the new master (RocketMQ's and
   Kafka's "unavailability window"). Run with the default session timeout (10 s, kazoo's and
   RocketMQ's default) and a short one (``--short-ms``, 2000). The old master restarts after
   each kill and rejoins as a slave before the next one. Prints p50/p99/max, and the target
   p50 <= session timeout + 1 s.
2. Put throughput with controller mode on and off: SYNC groups of 2 and 3 brokers and an
   ASYNC master, ``send`` one at a time and ``send_batch`` of 64 (128 B), on against off in
   the same run, alternating, medians of ``--rounds`` (3). Target >= 0.95x: the put path makes
   no ZooKeeper call (the lease is a clock compare).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import _support

from common.cli.zookeeper import Ensemble, missing
from common.client import Admin, Producer
from common.core.errors import BrokerError, SendStatus

BODY = b"x" * 128
MASTER_ROLES = ("SYNC_MASTER", "ASYNC_MASTER")


class Group:
    def __init__(self, root: Path, size: int, role: str, controller: str | None,
                 session_ms: int = 10_000):
        self.homes = [root / f"b{i + 1}" for i in range(size)]
        self.addresses: list[str] = []
        self.procs: list[subprocess.Popen[bytes] | None] = []
        self.controller = controller
        ports = [_support.free_port(2) for _ in range(size)]
        for i, (home, port) in enumerate(zip(self.homes, ports, strict=True)):
            fields: dict[str, Any] = {"listenPort": port, "haListenPort": port + 1,
                                      "mappedFileSizeCommitLog": 256 * 1024 * 1024,
                                      "slaveTimeout": 3000}
            if controller:
                fields.update(enableControllerMode=True, controllerAddr=controller,
                              brokerId=i + 1, brokerRole=role,
                              controllerSessionTimeoutMs=session_ms,
                              controllerPollIntervalMs=1000)
            elif i == 0:
                fields.update(brokerRole=role, brokerId=0)
            else:
                fields.update(brokerRole="SLAVE", brokerId=i,
                              haMasterAddress=f"127.0.0.1:{ports[0] + 1}")
            _support.write_config(home, **fields)
            self.addresses.append(f"127.0.0.1:{port}")
        for home, address in zip(self.homes, self.addresses, strict=True):
            self.procs.append(_support.launch(home, address))

    def master_index(self, admin: Admin) -> int | None:
        for i, address in enumerate(self.addresses):
            if self.procs[i] is None or self.procs[i].poll() is not None:  # type: ignore[union-attr]
                continue
            try:
                s = admin.status(address)
            except BrokerError:
                continue
            ctl = s.get("controller") or {}
            serving = not ctl.get("enabled") or (
                ctl.get("isMaster") and ctl.get("leaseFresh")
                and len(ctl.get("syncStateSet") or []) == len(self.addresses))
            if s["role"] in MASTER_ROLES and serving:
                return i
        return None

    def wait_settled(self, timeout_s: float = 60.0) -> int:
        deadline = time.monotonic() + timeout_s
        with Admin(self.addresses, timeout_ms=1000, retries=0) as admin:
            while time.monotonic() < deadline:
                index = self.master_index(admin)
                if index is not None:
                    return index
                time.sleep(0.05)
        raise RuntimeError("the group did not settle")

    def kill(self, index: int) -> None:
        proc = self.procs[index]
        assert proc is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def restart(self, index: int) -> None:
        self.procs[index] = _support.launch(self.homes[index], self.addresses[index])

    def stop(self) -> None:
        for proc in self.procs:
            if proc is not None:
                _support.stop(proc)


def failover_times(root: Path, zk: Ensemble, kills: int, session_ms: int) -> list[float]:
    group = Group(root, 3, "SYNC_MASTER", f"{zk.hosts}/bench-{session_ms}", session_ms)
    times = []
    try:
        with Producer(group.addresses, timeout_ms=session_ms * 3) as producer:
            for _ in range(kills):
                master = group.wait_settled()
                assert producer.send("bench", BODY).status == SendStatus.SEND_OK
                group.kill(master)
                killed = time.monotonic()
                while True:
                    try:
                        if producer.send("bench", BODY).status == SendStatus.SEND_OK:
                            break
                    except BrokerError:
                        pass
                times.append(time.monotonic() - killed)
                group.restart(master)
                print(f"    kill {len(times)}: {times[-1]:.3f} s", flush=True)
    finally:
        group.stop()
    return times


def put_rate(addresses: list[str], batch: bool, seconds: float) -> float:
    with Producer(addresses, timeout_ms=10_000) as p:
        p.send("bench", BODY)  # discovery and route outside the timing
        sent = 0
        start = time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            if batch:
                rs = p.send_batch("bench", [BODY] * 64, queue_id=0)
                sent += len(rs)
            else:
                p.send("bench", BODY, queue_id=0)
                sent += 1
        return sent / (time.perf_counter() - start)


def throughput(root: Path, zk: Ensemble, rounds: int, seconds: float) -> None:
    print("\nput throughput, controller mode on vs off (128 B, medians of "
          f"{rounds} alternating rounds of {seconds:.0f} s)")
    # SYNC with 2 brokers: the same acks either way (the one slave); with 3, controller mode
    # waits for both slaves of its SyncStateSet, the plain group for the first of the two
    for role, size in (("SYNC_MASTER", 2), ("SYNC_MASTER", 3), ("ASYNC_MASTER", 1)):
        for batch in (False, True):
            figures: dict[bool, list[float]] = {True: [], False: []}
            for r in range(rounds):
                for on in (False, True) if r % 2 == 0 else (True, False):
                    home = root / f"tp-{role}-{batch}-{r}-{on}"
                    group = Group(home, size, role,
                                  f"{zk.hosts}/tp-{role}-{int(batch)}-{r}" if on else None)
                    try:
                        group.wait_settled()
                        figures[on].append(put_rate(group.addresses, batch, seconds))
                    finally:
                        group.stop()
                        shutil.rmtree(home, ignore_errors=True)
            off, on_ = statistics.median(figures[False]), statistics.median(figures[True])
            kind = "send_batch x64" if batch else "send, 1 in flight"
            print(f"  {role:<12} x{size} {kind:<18} off {off:>9.0f}/s  on {on_:>9.0f}/s  "
                  f"{on_ / off:.2f}x (target >= 0.95x)")


def report(name: str, session_ms: int, times: list[float]) -> None:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    p50 = statistics.median(ordered)
    target = session_ms / 1000 + 1
    print(f"  {name}: session {session_ms} ms, {len(times)} kills: p50 {p50:.3f} s, "
          f"p99 {p99:.3f} s, max {max(ordered):.3f} s (target p50 <= {target:.1f} s: "
          f"{'met' if p50 <= target else 'MISSED'})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--default-ms", type=int, default=10_000)
    parser.add_argument("--short-ms", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--only", choices=["failover", "throughput"])
    args = parser.parse_args()
    problem = missing()
    if problem:
        print(f"skipped: {problem}")
        return 0
    root = Path(tempfile.mkdtemp(prefix="replog-bench-failover-"))
    zk = Ensemble(root / "zk", 1, tick_ms=500).start()
    try:
        if args.only != "throughput":
            results = []
            for session_ms in (args.short_ms, args.default_ms):
                print(f"failover time, session timeout {session_ms} ms:", flush=True)
                results.append((session_ms, failover_times(root / f"fo-{session_ms}", zk,
                                                           args.kills, session_ms)))
            print("\nfailover time (SIGKILL of the SYNC master -> first SEND_OK at the client)")
            for session_ms, times in results:
                report("short" if session_ms == args.short_ms else "default", session_ms,
                       times)
        if args.only != "failover":
            throughput(root, zk, args.rounds, args.seconds)
    finally:
        zk.kill()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
