"""The request server's figures for status and metrics: rates, latency percentiles, counts.

The I/O thread adds; the status processor and the metrics HTTP thread read. A reader copies
the buckets or values under the structure's lock and works on the copy, so a scrape never
iterates a deque the I/O thread is appending to ("deque mutated during iteration"); the lock
is held for the copy only (a few microseconds for 4096 latencies), never for the sort.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any


class RateMeter:
    """Events per second over the last ``window_s`` seconds (one bucket per second)."""

    def __init__(self, window_s: int = 10):
        self._window = window_s
        self._buckets: collections.deque[list[int]] = collections.deque(maxlen=window_s + 1)
        self._lock = threading.Lock()
        self.total = 0

    def add(self, count: int = 1, now: float | None = None) -> None:
        second = int(time.monotonic() if now is None else now)
        with self._lock:
            if not self._buckets or self._buckets[-1][0] != second:
                self._buckets.append([second, 0])
            self._buckets[-1][1] += count
            self.total += count

    def rate(self, now: float | None = None) -> float:
        second = int(time.monotonic() if now is None else now)
        with self._lock:
            buckets = [(s, c) for s, c in self._buckets]
        done = sum(c for s, c in buckets if second - self._window <= s < second)
        return done / self._window


class LatencyWindow:
    """The last ``size`` latencies (ms); percentiles computed on demand."""

    def __init__(self, size: int = 4096):
        self._values: collections.deque[float] = collections.deque(maxlen=size)
        # the deque's own append (a C call; atomic under the GIL, as ``copy`` below is)
        self.add: Callable[[float], None] = self._values.append

    def add_many(self, value: float, count: int) -> None:
        """``count`` requests served together, each taking ``value``."""
        self._values.extend(itertools.repeat(value, count))

    def percentile(self, q: float) -> float:
        values = list(self._values.copy())  # a snapshot taken in one C call, not iterated
        values.sort()
        if not values:
            return 0.0
        return values[min(len(values) - 1, int(q * len(values)))]


@dataclasses.dataclass
class ServerStats:
    put_msgs: RateMeter = dataclasses.field(default_factory=RateMeter)
    get_msgs: RateMeter = dataclasses.field(default_factory=RateMeter)
    put_latency: LatencyWindow = dataclasses.field(default_factory=LatencyWindow)
    get_latency: LatencyWindow = dataclasses.field(default_factory=LatencyWindow)
    requests: int = 0
    refused_busy: int = 0
    bad_requests: int = 0
    refused_permission: int = 0  # NO_PERMISSION answers (common/broker/security.py)
    inflight: int = 0
    long_polls: int = 0
    wakes_inline: int = 0  # owners woken on the I/O thread itself (e.g. by an HA ack)
    wakes_posted: int = 0  # owners woken from another thread, through the mailbox
    # SEND_OKs held by the reply gate until the controller lease was confirmed again
    answers_held_for_lease: int = 0

    def figures(self) -> dict[str, Any]:
        return {
            "putTps": self.put_msgs.rate(),
            "getTps": self.get_msgs.rate(),
            "putTotal": self.put_msgs.total,
            "getTotal": self.get_msgs.total,
            "putLatencyP50Ms": self.put_latency.percentile(0.50),
            "putLatencyP99Ms": self.put_latency.percentile(0.99),
            "getLatencyP50Ms": self.get_latency.percentile(0.50),
            "getLatencyP99Ms": self.get_latency.percentile(0.99),
            "requests": self.requests,
            "refusedBusy": self.refused_busy,
            "badRequests": self.bad_requests,
            "refusedPermission": self.refused_permission,
            "inflight": self.inflight,
            "longPolls": self.long_polls,
            "wakesInline": self.wakes_inline,
            "wakesPosted": self.wakes_posted,
            "answersHeldForLease": self.answers_held_for_lease,
        }

