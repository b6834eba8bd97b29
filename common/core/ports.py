"""Free TCP ports for the servers that tests, benchmarks and ``replog zookeeper`` start.

A port found free by binding port 0 comes from the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 here), the range the kernel also
hands every outgoing connection of every process on the machine. Between the check and the
server's own bind, any ``connect`` (a ZooKeeper client, a ZeroMQ peer, a test beside) can take
it: a loaded run saw a benchmark's broker fail with "haListenPort 49362 is in use". So ports are
picked at random *below* the ephemeral range, where only an explicit bind can take them, and
checked on both the wildcard and the loopback address (a broker's HA port binds 0.0.0.0).
"""

from __future__ import annotations

import random
import socket
import threading
import time
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20000  # below this, ports other services commonly listen on
_rng = random.SystemRandom()
HANDED_OUT_S = 60.0  # a port handed out is not handed out again by this process for this long
_handed: dict[int, float] = {}  # port -> when it was handed out (monotonic)
_lock = threading.Lock()


def unassigned_range() -> tuple[int, int]:
    """[low, high): ports the kernel does not give to outgoing connections."""
    try:
        first, last = (int(x) for x in EPHEMERAL_RANGE_FILE.read_text().split()[:2])
    except (OSError, ValueError):
        first, last = 32768, 60999
    if first > LOWEST + 1000:
        return LOWEST, first
    return last + 1, 65536  # an unusual setting: an ephemeral range at the bottom


def free_port(span: int = 1) -> int:
    """A port p with p..p+span-1 all free right now, outside the ephemeral range, and none of
    them handed out by this process in the last ``HANDED_OUT_S``: a test that makes several
    brokers before starting any (a group of brokers, each p, p+1 for client and HA) would
    otherwise be given overlapping spans now and then (nothing is bound yet to tell), and one
    broker fails to bind (seen in a CI run: one member's HA port was another's client port)."""
    if span < 1:
        raise ValueError(f"span must be >= 1, not {span}")
    low, high = unassigned_range()
    if high - low <= span:
        raise RuntimeError(f"no room for {span} ports in {low}-{high - 1}")
    for _ in range(200):
        port = _rng.randrange(low, high - span + 1)
        with _lock:
            now = time.monotonic()
            for old in [p for p, at in _handed.items() if now - at > HANDED_OUT_S]:
                del _handed[old]
            if any(port + i in _handed for i in range(span)):
                continue
            if all(is_free(port + i) for i in range(span)):
                for i in range(span):
                    _handed[port + i] = now
                return port
    raise RuntimeError(f"no {span} free consecutive ports in {low}-{high - 1}")


def is_free(port: int) -> bool:
    """Nothing is bound to ``port`` on 0.0.0.0 or 127.0.0.1 (TCP)."""
    for host in ("0.0.0.0", "127.0.0.1"):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True
