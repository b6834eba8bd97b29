"""What CURVE and the ACL cost (docs/security.md): plain against secure, interleaved in one run,
medians of ``--rounds`` (3) rounds, on a machine other people use.

    .venv/bin/python bench/security.py [--rounds 3] [--catchup-mib 128]

1. Client port, one ASYNC_MASTER (ASYNC_FLUSH) per mode, both running, measured in turns
   (each figure in 8 alternating chunks, so a slow spell of the machine hits both modes), for
   128 B, 1 KiB and 64 KiB bodies (random bytes, compression off): ``send`` one in flight,
   ``send_async`` 64 in flight, ``send_batch`` of 64. The secure producer is a non-admin
   account whose topic and group rules are checked on every request (target: batches with
   CURVE+ACL >= 0.8x plain).
2. SYNC replication: SYNC_MASTER + slave per mode, the same sizes: ``send_async`` 64 in flight
   (each answered once the slave acked it), and ``send`` one at a time.
3. Catch-up: an ASYNC master filled with ``--catchup-mib`` MiB of random 16 KiB bodies, then an
   empty slave: MB/s from its first byte to the master's max (target CURVE >= 0.7x plain).
4. The per-request check, in this process on the server's code path: the ZAP User-Id read from
   a frame that came over a real CURVE connection, its account in the ACL in force, the request
   code's rule (SEND and PULL), and the rule alone (target < 2 us).
5. New connections per second: connect, CURVE handshake (and ZAP), STATUS, close.

Every broker runs in its own process under a temp dir removed at the end; children are stopped
by pid. ``REPLOG_BENCH_SCALE`` (default 1.0) scales the message counts.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _support
import yaml
import zmq
from _support import Figure

from common.broker.security import Security, user_id
from common.client import Admin, Producer, SendResult
from common.core.config import load_config
from common.core.keys import load_public, load_secret, new_key_pair
from common.format.acl import rule_for
from common.format.protocol import RequestCode, encode_request

SCALE = float(os.environ.get("REPLOG_BENCH_SCALE", "1.0"))
SIZES = (128, 1024, 64 * 1024)
WINDOW = 64
BATCH = 64
SEGMENT = 256 * 1024 * 1024
TOPIC = "bench"
MODES = ("plain", "curve")
CHUNKS = 8  # turns each mode takes within one figure (see interleaved)


def n(count: int, size: int) -> int:
    """Messages for a figure: fewer for big bodies (about the same bytes)."""
    per = count if size <= 1024 else max(BATCH * 2, count // 16)
    return max(BATCH, int(per * SCALE) // BATCH * BATCH)


# ---- keys and brokers ---------------------------------------------------------------------------


class Realm:
    """The group's key pair, an admin, the benchmark's account, and the ACL file."""

    def __init__(self, root: Path):
        self.keys = root / "keys"
        for name in ("broker", "admin", "bench"):
            new_key_pair(self.keys, name)
        self.acl = root / "acl.yml"
        pub = {name: load_public(self.keys / f"{name}.key").public.decode()
               for name in ("broker", "admin", "bench")}
        self.acl.write_text(yaml.safe_dump({"accounts": [
            {"accessKey": "admin", "curvePublicKey": pub["admin"], "admin": True},
            {"accessKey": "broker", "curvePublicKey": pub["broker"], "replica": True},
            # an ordinary account: its rules are looked up on every request
            {"accessKey": "bench", "curvePublicKey": pub["bench"], "defaultTopicPerm": "DENY",
             "defaultGroupPerm": "DENY", "topicPerms": [f"{TOPIC}=PUB|SUB", "other=SUB"],
             "groupPerms": ["bench-group=SUB"]},
        ]}))

    def curve(self, name: str) -> dict[str, Any]:
        return {"key": str(self.keys / f"{name}.key_secret"),
                "server_key": str(self.keys / "broker.key")}

    def fields(self) -> dict[str, Any]:
        return {"aclEnable": True, "aclFile": str(self.acl),
                "curveSecretKeyFile": str(self.keys / "broker.key_secret")}


class Node:
    """One broker process, plain or secure."""

    def __init__(self, home: Path, realm: Realm | None, **fields: Any):
        self.port = _support.free_port(2)
        self.home = home
        self.curve = realm.curve("admin") if realm else {}
        _support.write_config(home, listenPort=self.port, haListenPort=self.port + 1,
                              mappedFileSizeCommitLog=SEGMENT,
                              **(realm.fields() if realm else {}), **fields)
        self.address = f"127.0.0.1:{self.port}"
        self.ha_address = f"127.0.0.1:{self.port + 1}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.admin = Admin([self.address], timeout_ms=5000, retries=0, **self.curve)

    def start(self) -> Node:
        self.proc = _support.launch(self.home, self.address, curve=self.curve)
        return self

    def status(self) -> dict[str, Any]:
        return self.admin.status(self.address)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None:
            _support.stop(self.proc)
        self.admin.close()


def wait_until(cond: Callable[[], Any], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


# ---- 1 and 2: puts -------------------------------------------------------------------------------


def sync_sends(p: Producer, size: int, count: int) -> Figure:
    body = os.urandom(size)
    lat = []
    start = time.perf_counter()
    for _ in range(count):
        t = time.perf_counter()
        p.send(TOPIC, body, queue_id=0)
        lat.append((time.perf_counter() - t) * 1000)
    return Figure("sync", count, time.perf_counter() - start, lat, size)


def async_sends(p: Producer, size: int, count: int) -> Figure:
    body = os.urandom(size)
    clock = time.perf_counter
    lat: list[float] = []
    window: collections.deque[concurrent.futures.Future[SendResult]] = collections.deque()
    start = clock()
    for _ in range(count):
        if len(window) >= WINDOW:
            window.popleft().result(120)
        t0 = clock()
        fut = p.send_async(TOPIC, body, queue_id=0)
        fut.add_done_callback(lambda _f, t0=t0: lat.append((clock() - t0) * 1000))
        window.append(fut)
    for fut in window:
        fut.result(120)
    return Figure("async64", count, clock() - start, lat, size)


def batch_sends(p: Producer, size: int, count: int) -> Figure:
    bodies = [os.urandom(size) for _ in range(BATCH)]
    lat = []
    start = time.perf_counter()
    for _ in range(count // BATCH):
        t = time.perf_counter()
        p.send_batch(TOPIC, bodies, queue_id=0)
        lat.append((time.perf_counter() - t) * 1000)
    return Figure("batch64", count, time.perf_counter() - start, lat, size)


def cpu_ns(pids: list[int]) -> int:
    """CPU time used so far by this process and by ``pids`` (every thread), in ns
    (``/proc/PID/task/*/schedstat``: not the 10 ms ticks of ``/proc/PID/stat``)."""
    total = time.process_time_ns()
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                pass  # a thread that ended
    return total


def interleaved(fn: Callable[[Producer, int, int], Figure], producers: dict[str, Producer],
                pids: dict[str, list[int]], size: int, count: int,
                cpu: dict[str, float]) -> dict[str, Figure]:
    """``fn`` for each mode in CHUNKS turns of count / CHUNKS messages, the order swapped at
    each turn (plain curve, curve plain, ...), summed per mode: on a shared machine a slow spell
    (another tenant, a segment's first-touch page faults, the work one burst leaves behind)
    falls on both modes alike. ``cpu[mode]``: CPU us per message of the client and brokers,
    which other tenants hardly change."""
    parts: dict[str, list[Figure]] = {mode: [] for mode in producers}
    used = dict.fromkeys(producers, 0)
    chunk = max(BATCH, count // CHUNKS // BATCH * BATCH)
    for turn in range(max(1, count // chunk)):
        order = list(producers) if turn % 2 == 0 else list(producers)[::-1]
        for mode in order:
            before = cpu_ns(pids[mode])
            parts[mode].append(fn(producers[mode], size, chunk))
            used[mode] += cpu_ns(pids[mode]) - before
    out = {}
    for mode, figs in parts.items():
        msgs = sum(f.msgs for f in figs)
        cpu[mode] = used[mode] / 1000 / msgs
        out[mode] = Figure(figs[0].name, msgs, sum(f.seconds for f in figs),
                           [x for f in figs for x in f.latencies_ms], size)
    return out


def producer(node: Node, realm: Realm, secure: bool) -> Producer:
    return Producer([node.address], retries=0, timeout_ms=60_000, compress_over_bytes=None,
                    **(realm.curve("bench") if secure else {}))


Results = dict[tuple[str, str, int, str], list[Figure]]  # (section, figure, size, mode)
CpuResults = dict[tuple[str, str, int, str], list[float]]  # the same -> CPU us per message


def client_port(home: Path, realm: Realm, rounds: int, results: Results,
                cpu_results: CpuResults) -> None:
    nodes = {mode: Node(home / f"put-{mode}", realm if mode == "curve" else None,
                        brokerRole="ASYNC_MASTER", flushDiskType="ASYNC_FLUSH").start()
             for mode in MODES}
    try:
        producers = {mode: producer(nodes[mode], realm, mode == "curve") for mode in MODES}
        for p in producers.values():
            p.send(TOPIC, b"warm", queue_id=0)
        for _ in range(rounds):
            for size in SIZES:
                for name, fn, count in (("sync", sync_sends, 3000), ("async64", async_sends,
                                        20_000), ("batch64", batch_sends, 32_000)):
                    cpu: dict[str, float] = {}
                    pids = {mode: [node.pid] for mode, node in nodes.items()}
                    figs = interleaved(fn, producers, pids, size, n(count, size), cpu)
                    for mode, fig in figs.items():
                        results.setdefault(("put", name, size, mode), []).append(fig)
                        cpu_results.setdefault(("put", name, size, mode), []).append(cpu[mode])
        for p in producers.values():
            p.close()
    finally:
        for node in nodes.values():
            node.stop()


def replication(home: Path, realm: Realm, rounds: int, results: Results,
                cpu_results: CpuResults) -> None:
    pairs = {}
    try:
        for mode in MODES:
            r = realm if mode == "curve" else None
            master = Node(home / f"sync-{mode}-m", r, brokerRole="SYNC_MASTER").start()
            slave = Node(home / f"sync-{mode}-s", r, brokerRole="SLAVE", brokerId=1,
                         haMasterAddress=master.ha_address).start()
            pairs[mode] = (master, slave)
            wait_until(lambda m=master: any(s["inSync"] for s in m.status()["slaves"]), 30,
                       f"the {mode} slave in sync")
        producers = {mode: producer(pairs[mode][0], realm, mode == "curve") for mode in MODES}
        for _ in range(rounds):
            for size in SIZES:
                for name, fn, count in (("sync", sync_sends, 2000), ("async64", async_sends,
                                                                       20_000)):
                    cpu: dict[str, float] = {}
                    pids = {mode: [pairs[mode][0].pid, pairs[mode][1].pid] for mode in MODES}
                    figs = interleaved(fn, producers, pids, size, n(count, size), cpu)
                    for mode, fig in figs.items():
                        results.setdefault(("SYNC repl", name, size, mode), []).append(fig)
                        cpu_results.setdefault(("SYNC repl", name, size, mode), []).append(
                            cpu[mode])
        for p in producers.values():
            p.close()
    finally:
        for master, slave in pairs.values():
            slave.stop()
            master.stop()


# ---- 3: catch-up ---------------------------------------------------------------------------------


def catch_up(home: Path, realm: Realm | None, total_bytes: int) -> float | None:
    """MB/s of an empty slave catching up from its first reported offset; None when it was
    (nearly) done before it could first be asked (too little to time)."""
    master = Node(home / "cu-master", realm, brokerRole="ASYNC_MASTER").start()
    slave = Node(home / "cu-slave", realm, brokerRole="SLAVE", brokerId=1,
                 haMasterAddress=master.ha_address)
    try:
        body = os.urandom(16 * 1024)
        curve = realm.curve("admin") if realm else {}
        with Producer([master.address], retries=0, timeout_ms=30_000, compress_over_bytes=None,
                      **curve) as p:
            while master.status()["maxPhyOffset"] < total_bytes:
                for _ in range(16):
                    p.send_batch("fill", [body] * 64, queue_id=0)
        end = master.status()["maxPhyOffset"]
        os.sync()
        slave.start()
        first_offset, first_t, now = 0, 0.0, 0.0
        while True:
            now = time.perf_counter()
            offset = slave.status()["maxPhyOffset"]
            if offset > 0 and first_t == 0.0:
                first_offset, first_t = offset, now
            if offset >= end:
                break
            time.sleep(0.01)
        if now <= first_t or end - first_offset < total_bytes // 4:
            return None
        return (end - first_offset) / (now - first_t) / 1e6
    finally:
        slave.stop()
        master.stop()
        shutil.rmtree(home / "cu-master", ignore_errors=True)
        shutil.rmtree(home / "cu-slave", ignore_errors=True)


# ---- 4: the per-request check ---------------------------------------------------------------------


def check_cost(home: Path, realm: Realm) -> dict[str, float]:
    """us per request of each step the secure server adds, on a real CURVE frame."""
    cfg = load_config(None, (), env={}, **realm.fields())
    security = Security.from_config(cfg)
    ctx: zmq.Context[Any] = zmq.Context()
    auth = security.start_authenticator(ctx)
    server = security.server_socket(ctx, zmq.ROUTER, "replog.client")
    client = ctx.socket(zmq.DEALER)
    try:
        security.bind(server, "tcp://127.0.0.1:0")
        pair = load_secret(realm.keys / "bench.key_secret")
        assert pair.secret is not None and security.own is not None
        client.curve_publickey, client.curve_secretkey = pair.public, pair.secret
        client.curve_serverkey = security.own.public
        client.connect(server.getsockopt(zmq.LAST_ENDPOINT).decode())
        client.send_multipart(encode_request(RequestCode.SEND, 1, {"topic": TOPIC}))
        assert server.poll(10_000)
        head = server.recv(copy=False)
        server.recv_multipart()
        send_fields = {"topic": TOPIC, "queueId": 0}
        pull_fields = {"topic": TOPIC, "queueId": 0, "queueOffset": 0, "group": "bench-group"}
        send_rule, pull_rule = rule_for(RequestCode.SEND), rule_for(RequestCode.PULL)

        def whole(rule: Callable[..., Any], fields: dict[str, Any]) -> Callable[[], Any]:
            def run() -> Any:  # what RequestServer._serve adds for a request
                found = security.account_of(user_id(head), head)
                return rule(found, fields)
            return run

        account = security.account_of(user_id(head), head)
        cases = {
            "User-Id + account + SEND rule": whole(send_rule, send_fields),
            "User-Id + account + PULL rule": whole(pull_rule, pull_fields),
            "SEND rule alone": lambda: send_rule(account, send_fields),
            "PULL rule alone": lambda: pull_rule(account, pull_fields),
        }
        out = {}
        for name, fn in cases.items():
            assert fn() is None  # allowed: the check's common path
            runs = timeit.repeat(fn, number=50_000, repeat=5)
            out[name] = min(runs) / 50_000 * 1e6
        return out
    finally:
        client.close(linger=0)
        server.close(linger=0)
        if auth is not None:
            auth.stop()
        ctx.term()


# ---- 5: new connections ------------------------------------------------------------------------


def handshakes(node: Node, realm: Realm, secure: bool, count: int) -> float:
    """Connections per second: connect, handshake, STATUS answered, close."""
    ctx: zmq.Context[Any] = zmq.Context()
    keys = None
    if secure:
        pair = load_secret(realm.keys / "bench.key_secret")
        keys = (pair.public, pair.secret, load_public(realm.keys / "broker.key").public)
    request = encode_request(RequestCode.STATUS, 1, {})
    start = time.perf_counter()
    try:
        for _ in range(count):
            s = ctx.socket(zmq.DEALER)
            s.linger = 0
            if keys is not None:
                s.curve_publickey, s.curve_secretkey, s.curve_serverkey = keys
            s.connect(f"tcp://{node.address}")
            s.send_multipart(request)
            if not s.poll(10_000):
                raise RuntimeError("no answer to STATUS")
            s.recv_multipart()
            s.close(linger=0)
        return count / (time.perf_counter() - start)
    finally:
        ctx.destroy(linger=0)


# ---- report ------------------------------------------------------------------------------------


def median_figure(figs: list[Figure]) -> Figure:
    return sorted(figs, key=lambda f: f.rate)[len(figs) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--catchup-mib", type=int, default=128)
    args = parser.parse_args()
    print(f"pyzmq {zmq.pyzmq_version()}, libzmq {zmq.zmq_version()}, CURVE "
          f"{zmq.has('curve')} (pyzmq's wheels bundle libsodium), {os.cpu_count()} CPUs, "
          f"rounds {args.rounds} (medians), REPLOG_BENCH_SCALE {SCALE}")
    home = Path(tempfile.mkdtemp(prefix="replog-bench-security-"))
    results: Results = {}
    verdicts = []
    try:
        realm = Realm(home / "realm")
        print("\n4. per-request check, on the server's path (us per request, best of 5):")
        costs = [check_cost(home, realm) for _ in range(args.rounds)]
        for name in costs[0]:
            value = statistics.median(c[name] for c in costs)
            print(f"  {name:<32} {value:6.3f} us")
            if name.startswith("User-Id + account + SEND"):
                verdicts.append(("check < 2 us per request", value < 2.0, f"{value:.3f} us"))

        cpu_results: CpuResults = {}
        client_port(home, realm, args.rounds, results, cpu_results)
        replication(home, realm, args.rounds, results, cpu_results)
        for section in ("put", "SYNC repl"):
            print(f"\n{'1. client port' if section == 'put' else '2. SYNC replication'} "
                  "(medians; ratio CURVE+ACL / plain; CPU us per message, client and "
                  "brokers):")
            for (sec, name, size, mode), figs in sorted(results.items(),
                                                        key=lambda kv: (kv[0][2], kv[0][1])):
                if sec != section or mode != "curve":
                    continue
                plain = median_figure(results[(sec, name, size, "plain")])
                curve = median_figure(figs)
                plain.name, curve.name = f"{name} {size}B plain", f"{name} {size}B curve"
                cpu_plain = statistics.median(cpu_results[(sec, name, size, "plain")])
                cpu_curve = statistics.median(cpu_results[(sec, name, size, "curve")])
                print(f"{plain.line(width=22)}   cpu {cpu_plain:7.1f} us")
                print(f"{curve.line(plain, width=22)}   cpu {cpu_curve:7.1f} us "
                      f"({cpu_curve / cpu_plain:.2f}x)")
                if section == "put" and name == "batch64":
                    ratio = curve.rate / plain.rate
                    verdicts.append((f"batch64 {size} B CURVE >= 0.8x plain", ratio >= 0.8,
                                     f"{ratio:.2f}x"))

        print(f"\n3. catch-up of {args.catchup_mib} MiB (MB/s per round):")
        rates: dict[str, list[float]] = {m: [] for m in MODES}
        for _ in range(args.rounds):
            for mode in MODES:
                rate = catch_up(home, realm if mode == "curve" else None,
                                args.catchup_mib * 1024 * 1024)
                if rate is not None:
                    rates[mode].append(rate)
        if all(rates.values()):
            for mode in MODES:
                print(f"  {mode:<6} {statistics.median(rates[mode]):8.1f} MB/s   "
                      f"{[round(r) for r in rates[mode]]}")
            ratio = statistics.median(rates["curve"]) / statistics.median(rates["plain"])
            verdicts.append(("catch-up CURVE >= 0.7x plain", ratio >= 0.7, f"{ratio:.2f}x"))
        else:
            print("  too little to time: raise --catchup-mib")

        print("\n5. new connections per second (connect, handshake, STATUS, close):")
        nodes = {m: Node(home / f"hs-{m}", realm if m == "curve" else None).start()
                 for m in MODES}
        try:
            for mode in MODES:
                per_s = statistics.median(handshakes(nodes[mode], realm, mode == "curve",
                                                     max(50, int(300 * SCALE)))
                                          for _ in range(args.rounds))
                print(f"  {mode:<6} {per_s:8.0f} /s")
        finally:
            for node in nodes.values():
                node.stop()

        print("\ntargets:")
        for what, ok, value in verdicts:
            print(f"  {'PASS' if ok else 'MISS'} {what}: {value}")
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
