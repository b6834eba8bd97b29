"""What the benchmark scripts share: free ports and broker processes that answer."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from common.cli.cluster import broker_env
from common.client import Admin
from common.core import ports
from common.core.config import dump_yaml, load_config
from common.core.errors import BrokerError


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


# A benchmark stopped with SIGTERM (`timeout`, a killed `make bench`) unwinds like Ctrl-C:
# its finally blocks stop the brokers and ZooKeeper servers it started, not orphan them.
if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    """SIGTERM (a broker drains and flushes), then SIGKILL if it has not ended in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def free_port(span: int = 1) -> int:
    """A port p with p..p+span-1 free right now, below the kernel's ephemeral range
    (``common.core.ports``: a benchmark beside a test run lost its HA port to an outgoing
    connection when it took one from port 0)."""
    return ports.free_port(span)


def write_config(home: Path, **fields: Any) -> Path:
    """``home/broker.yaml`` from typed fields (validated like any broker config)."""
    home.mkdir(parents=True, exist_ok=True)
    fields.setdefault("storePathRootDir", str(home / "store"))
    path = home / "broker.yaml"
    path.write_text(dump_yaml(load_config(None, (), env={}, **fields)))
    return path


def launch(home: Path, address: str, timeout_s: float = 30.0,
           curve: dict[str, Any] | None = None) -> subprocess.Popen[bytes]:
    """Run ``replog broker -c home/broker.yaml`` (log in home/broker.log) until it answers
    (``curve``: the key/server_key to ask with, for a broker with aclEnable)."""
    with open(home / "broker.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "common.cli", "broker", "-c", str(home / "broker.yaml")],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=broker_env(),
        )
    deadline = time.monotonic() + timeout_s
    with Admin([address], timeout_ms=500, retries=0, **(curve or {})) as admin:
        while True:
            try:
                admin.status(address)
                return proc
            except BrokerError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError((home / "broker.log").read_text()[-3000:]) from None


def start_broker(home: Path, **fields: Any) -> tuple[subprocess.Popen[bytes], str]:
    """A broker on fresh ports (client and HA) with ``fields``; returns it and its address."""
    port = free_port(2)
    write_config(home, listenPort=port, haListenPort=port + 1, **fields)
    address = f"127.0.0.1:{port}"
    return launch(home, address), address


def start_redis(home: Path, port: int, replica_of: int = 0) -> subprocess.Popen[bytes] | None:
    """Debian's ``redis-server`` on ``port``, persistence off (a replica of ``replica_of`` if
    given), once it answers PING; None when it is not installed or does not come up."""
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    args = [binary, "--port", str(port), "--save", "", "--appendonly", "no",
            "--dir", str(home), "--bind", "127.0.0.1"]
    if replica_of:
        args += ["--replicaof", "127.0.0.1", str(replica_of)]
    home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    try:
        while True:
            try:
                client.ping()
                return proc
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait(10)
                    return None
                time.sleep(0.02)
    finally:
        client.close()


@dataclass
class Figure:
    """``msgs`` messages of ``size`` bytes in ``seconds``, with per-request latencies."""

    name: str
    msgs: int
    seconds: float
    latencies_ms: list[float]
    size: int

    @property
    def rate(self) -> float:
        return self.msgs / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_s(self) -> float:
        return self.rate * self.size / 1e6

    def pct(self, q: float) -> float:
        values = sorted(self.latencies_ms)
        return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0

    def line(self, ref: Figure | None = None, width: int = 18) -> str:
        """One report line; with ``ref``, the ratio of the rates."""
        text = (
            f"  {self.name:<{width}} {self.rate:>10.0f} msg/s {self.mb_s:>8.2f} MB/s "
            f"p50 {self.pct(0.5):>7.3f} ms p99 {self.pct(0.99):>7.3f} ms"
        )
        if ref is not None and ref.rate > 0:
            text += f"   {self.rate / ref.rate:>5.2f}x {ref.name}"
        return text


def ratio_text(figure: Figure, ref: Figure | None, target: float | None) -> str:
    """``0.93x echo x1 (target >= 0.9x: met)``; ``target`` None: reported only."""
    if ref is None or ref.rate <= 0:
        return "no reference"
    ratio = figure.rate / ref.rate
    if target is None:
        return f"{ratio:.2f}x {ref.name} (reported)"
    verdict = "met" if ratio >= target else "MISSED"
    return f"{ratio:.2f}x {ref.name} (target >= {target}x: {verdict})"


def acceptance_row(figure: Figure, bare: Figure | None, bare_target: float | None,
                   other: Figure | None, other_target: float | None) -> str:
    """One acceptance row: the figure, its ratio to the bare-transport reference and to the
    other reference (Redis), both measured in the same run."""
    return (f"{figure.name:<22} {figure.rate:>9.0f} msg/s | "
            f"{ratio_text(figure, bare, bare_target)} | "
            f"{ratio_text(figure, other, other_target)}")


class OtherLoad:
    """The CPU the rest of the machine used while a benchmark ran: the machine's busy time
    (``/proc/stat``, the hypervisor's steal included) less this process's and its children's
    (those ended and waited for: read ``cpus`` once they are). A ratio of two figures measured
    side by side cancels the machine's speed, not a neighbour that takes a core from one leg
    and not the other."""

    def __init__(self) -> None:
        self._start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float]:
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (
                int(x) for x in f.readline().split()[1:9])
        busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
        t = os.times()
        return busy, t.user + t.system + t.children_user + t.children_system, time.monotonic()

    def cpus(self) -> float:
        """The others' CPUs on average since this was made (0.0 to the machine's count)."""
        busy, own, now = self._sample()
        busy0, own0, then = self._start
        return max(0.0, (busy - busy0) - (own - own0)) / max(now - then, 1e-6)


def cpu_model() -> str:
    """The machine, as the gate keeps it beside its ratios: the CPU model and count."""
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model} x{os.cpu_count()}"
