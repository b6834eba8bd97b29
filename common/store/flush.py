"""CommitLog flushing: group commit (SYNC_FLUSH) and a periodic flusher (ASYNC_FLUSH).

Group commit (RocketMQ ``GroupCommitService`` + ``FlushDiskWatcher``): every put that must be on
disk registers ``(end_offset, deadline)`` and gets a Future. The flush thread takes all waiting
requests at once, msyncs once to cover them all, and completes every covered Future with
PUT_OK. A watcher completes any request still waiting at its deadline with FLUSH_DISK_TIMEOUT,
so no caller waits longer than ``syncFlushTimeout`` even when the disk stalls.

The periodic flusher (``FlushRealTimeService``) flushes every ``flushIntervalCommitLog`` ms when
at least ``flushCommitLogLeastPages`` pages are dirty, and everything every
``flushCommitLogThoroughInterval`` ms.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError

from common.core.errors import PutStatus

log = logging.getLogger("replog.store")

FlushFn = Callable[[int], int]  # least_pages -> flushed offset


def _complete(future: Future[PutStatus], status: PutStatus) -> None:
    try:
        future.set_result(status)
    except InvalidStateError:
        pass  # the watcher or the flusher got there first


def done_future(status: PutStatus) -> Future[PutStatus]:
    f: Future[PutStatus] = Future()
    f.set_result(status)
    return f


# the ``flushed`` of a put with nothing to wait for (ASYNC_FLUSH), shared: a done Future never
# changes. ``flushed is FLUSHED`` tells a caller so without the Future's lock (three calls).
FLUSHED = done_future(PutStatus.PUT_OK)


class GroupCommitService:
    """Batches flush requests: one msync covers every put waiting when it starts."""

    WATCH_INTERVAL_S = 0.01

    def __init__(self, flush: FlushFn, timeout_ms: int):
        self._flush = flush
        self._timeout_s = timeout_ms / 1000
        self._requests: deque[tuple[int, float, Future[PutStatus]]] = deque()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="replog-group-commit", daemon=True)
        self.flushes = 0
        self.completed = 0

    def start(self) -> None:
        self._thread.start()

    def request(self, end_offset: int) -> Future[PutStatus]:
        future: Future[PutStatus] = Future()
        with self._cond:
            if self._stopped:
                _complete(future, PutStatus.SERVICE_NOT_AVAILABLE)
                return future
            self._requests.append((end_offset, time.monotonic() + self._timeout_s, future))
            self._cond.notify()
        return future

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._requests and not self._stopped:
                    self._cond.wait(self.WATCH_INTERVAL_S)
                stopping = self._stopped
                batch = list(self._requests)
            if batch:
                self._serve(batch)
            if stopping:
                self._drain()
                return

    def _serve(self, batch: list[tuple[int, float, Future[PutStatus]]]) -> None:
        flushed = self._flush(0)
        self.flushes += 1
        now = time.monotonic()
        with self._cond:
            keep: deque[tuple[int, float, Future[PutStatus]]] = deque()
            for req in self._requests:
                end, deadline, future = req
                if end <= flushed:
                    _complete(future, PutStatus.PUT_OK)
                    self.completed += 1
                elif now >= deadline:
                    _complete(future, PutStatus.FLUSH_DISK_TIMEOUT)
                else:
                    keep.append(req)
            self._requests = keep

    def _drain(self) -> None:
        flushed = self._flush(0)
        with self._cond:
            for end, _, future in self._requests:
                status = PutStatus.PUT_OK if end <= flushed else PutStatus.FLUSH_DISK_TIMEOUT
                _complete(future, status)
            self._requests.clear()

    def expire(self) -> None:
        """Complete overdue requests with FLUSH_DISK_TIMEOUT (called by the watcher)."""
        now = time.monotonic()
        with self._cond:
            for _, deadline, future in self._requests:
                if now >= deadline and not future.done():
                    _complete(future, PutStatus.FLUSH_DISK_TIMEOUT)

    def shutdown(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


class FlushWatcher:
    """Completes group-commit requests that pass their deadline while a flush is stuck."""

    def __init__(self, service: GroupCommitService):
        self._service = service
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replog-flush-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(GroupCommitService.WATCH_INTERVAL_S):
            self._service.expire()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


class PeriodicFlushService:
    """Flushes on a timer; also the final flush at shutdown."""

    def __init__(self, flush: FlushFn, interval_ms: int, least_pages: int, thorough_ms: int,
                 name: str = "replog-flush"):
        self._flush = flush
        self._interval_s = interval_ms / 1000
        self._least_pages = least_pages
        self._thorough_s = thorough_ms / 1000
        self._last_thorough = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            least = self._least_pages
            now = time.monotonic()
            if now - self._last_thorough >= self._thorough_s:
                least = 0
                self._last_thorough = now
            try:
                self._flush(least)
            except Exception:  # a failing disk must not kill the flusher silently
                log.exception("event=flush_failed")

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._flush(0)
