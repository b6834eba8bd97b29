"""Helpers for the replication tests: a master/slave pair, CommitLog range digests, a TCP relay
that can cut the link, and waits with deadlines (never fixed sleeps).

``Relay`` sits between a slave and its master's HA port (the slave's ``haMasterAddress`` points
at the relay). Modes:

* ``forward``: bytes flow both ways;
* ``blackhole``: the sockets stay open and every byte read is dropped (a partition as the
  brokers see it: silence, no RST). A ZeroMQ stream with a hole in it cannot be resumed, so
  ``heal`` closes the connections that lost bytes (as a real TCP stream would eventually die)
  and forwards everything from then on, including the peers' reconnections.
"""

from __future__ import annotations

import hashlib
import os
import selectors
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, Self

from broker_harness import BrokerProcess, free_port

from common.drill.backends.process import all_threads_stopped
from common.drill.workload import wait_for

SEGMENT_BYTES = 1024 * 1024




def stop_process(pid: int, timeout_s: float = 5.0) -> None:
    """SIGSTOP ``pid`` and return only once every thread of it is stopped.

    kill() returns before the signal has reached threads running on another CPU; until then a
    "paused" slave can still read and ack a frame.
    """
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: all_threads_stopped(pid), timeout_s, f"pid {pid} to stop", step_s=0.001)



def commitlog_digest(store_root: Path, start: int, end: int, segment_bytes: int) -> str:
    """sha256 of CommitLog bytes [start, end) read from the segment files."""
    h = hashlib.sha256()
    pos = start
    while pos < end:
        base = pos - pos % segment_bytes
        path = store_root / "commitlog" / f"{base:020d}"
        n = min(end, base + segment_bytes) - pos
        with open(path, "rb") as f:
            f.seek(pos - base)
            chunk = f.read(n)
        assert len(chunk) == n, f"{path} holds {len(chunk)} of {n} bytes at {pos}"
        h.update(chunk)
        pos += n
    return h.hexdigest()


def master_and_slave(
    tmp: Path,
    master_role: str = "SYNC_MASTER",
    via: int | None = None,
    master_port: int | None = None,
    **common: Any,
) -> tuple[BrokerProcess, BrokerProcess]:
    """A master and one slave (not started); ``via`` = a relay port between them."""
    fields = {"mappedFileSizeCommitLog": SEGMENT_BYTES, **common}
    master = BrokerProcess(tmp / "master", brokerRole=master_role, listenPort=master_port, **fields)
    ha_port = via if via is not None else master.port + 1
    slave = BrokerProcess(
        tmp / "slave",
        brokerRole="SLAVE",
        brokerId=1,
        haMasterAddress=f"127.0.0.1:{ha_port}",
        **fields,
    )
    return master, slave


def slave_entry(master: BrokerProcess) -> dict[str, Any] | None:
    slaves = master.status()["slaves"]
    return slaves[0] if slaves else None


def wait_in_sync(master: BrokerProcess, timeout_s: float = 20.0) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        s = slave_entry(master)
        return s if s is not None and s["inSync"] else None

    return wait_for(ready, timeout_s, "a slave in sync at the master")


def wait_converged(master: BrokerProcess, slave: BrokerProcess, timeout_s: float = 30.0) -> int:
    """Wait until the slave holds the master's max offset; returns it."""

    def same() -> int | None:
        m = master.status()["maxPhyOffset"]
        return m if m > 0 and slave.status()["maxPhyOffset"] == m else None

    return wait_for(same, timeout_s, "the slave to reach the master's max offset")


def assert_identical(master: BrokerProcess, slave: BrokerProcess, start: int, end: int) -> None:
    seg = master.cfg.mappedFileSizeCommitLog
    assert commitlog_digest(master.store_root, start, end, seg) == commitlog_digest(
        slave.store_root, start, end, seg
    ), f"CommitLogs differ in [{start}, {end})"


class Relay:
    """A TCP relay 127.0.0.1:port -> target that can blackhole and heal (module docstring)."""

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.port = free_port(1)
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._peer: dict[socket.socket, socket.socket] = {}
        self._holed: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._blackhole = False
        self._heal = False
        self._stop = False
        self.dropped_bytes = 0
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)
        self._thread.start()

    def blackhole(self) -> None:
        with self._lock:
            self._blackhole = True

    def heal(self) -> None:
        with self._lock:
            self._blackhole = False
            self._heal = True

    def close(self) -> None:
        self._stop = True
        self._thread.join(5)
        for s in list(self._peer):
            s.close()
        self._listener.close()
        self._sel.close()

    def _run(self) -> None:
        while not self._stop:
            for key, _ in self._sel.select(0.05):
                if key.fileobj is self._listener:
                    self._accept()
                else:
                    self._pump(key.fileobj)  # type: ignore[arg-type]
            with self._lock:
                heal, self._heal = self._heal, False
            if heal:
                for s in list(self._holed):
                    self._drop_pair(s)
                self._holed.clear()

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        try:
            upstream = socket.create_connection(self.target, timeout=2)
        except OSError:
            client.close()
            return
        for s in (client, upstream):
            s.setblocking(True)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._peer[client], self._peer[upstream] = upstream, client
        self._sel.register(client, selectors.EVENT_READ, None)
        self._sel.register(upstream, selectors.EVENT_READ, None)

    def _pump(self, s: socket.socket) -> None:
        if s not in self._peer:
            return
        try:
            data = s.recv(256 * 1024)
        except OSError:
            data = b""
        if not data:
            self._drop_pair(s)
            return
        with self._lock:
            blackhole = self._blackhole
        if blackhole:
            self.dropped_bytes += len(data)
            self._holed.add(s)
            self._holed.add(self._peer[s])
            return
        try:
            self._peer[s].sendall(data)
        except OSError:
            self._drop_pair(s)

    def _drop_pair(self, s: socket.socket) -> None:
        other = self._peer.pop(s, None)
        for x in (s, other):
            if x is None:
                continue
            self._peer.pop(x, None)
            try:
                self._sel.unregister(x)
            except (KeyError, ValueError):
                pass
            x.close()


class StallWatch:
    """Notices this machine stalling: a thread asks to sleep 10 ms again and again and keeps
    every wake-up that came more than ``threshold_s`` late (a paused VM, a starved or paging
    process). A failed timing assertion says with it whether the machine stalled meanwhile."""

    def __init__(self, threshold_s: float = 0.5):
        self.threshold_s = threshold_s
        self.stalls: list[tuple[float, float]] = []  # (monotonic start, length in s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.01):
            now = time.monotonic()
            if now - last - 0.01 > self.threshold_s:
                self.stalls.append((last, now - last))
            last = now

    def since(self, t0: float) -> list[tuple[float, float]]:
        return [(round(t - t0, 3), round(length, 3)) for t, length in self.stalls if t >= t0 - 5]
