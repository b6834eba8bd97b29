"""The hand-off from other threads to the request server's I/O thread: completions, coalesced
arrival notices for long polls, commands; and the self-pipe the I/O thread polls."""

from __future__ import annotations

import collections
import os
import threading
from typing import Any

from common.core.errors import BrokerError, ResponseCode


class Mailbox:
    """Bounded hand-off to the I/O thread: completions, arrival notices, commands."""

    def __init__(self, capacity: int):
        self._capacity = capacity
        self._items: collections.deque[Any] = collections.deque()
        self._arrivals: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._armed = False
        self._closed = False

    def fileno(self) -> int:
        return self._r

    def post(self, item: Any) -> None:
        """Queue an item; raises BrokerError(SYSTEM_BUSY) past the capacity (a bug guard)."""
        with self._lock:
            if self._closed:
                return  # the loop has ended; nobody is left to answer
            if len(self._items) >= self._capacity:
                raise BrokerError(ResponseCode.SYSTEM_BUSY, "server mailbox full")
            self._items.append(item)
            self._wake_locked()

    def arrival(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Coalesced per queue: at most one pending notice per (topic, queue)."""
        with self._lock:
            key = (topic, queue_id)
            self._arrivals[key] = max(max_offset, self._arrivals.get(key, 0))
            self._wake_locked()

    def _wake_locked(self) -> None:
        if self._armed or self._closed:
            return  # closed: the descriptors may already belong to another file
        self._armed = True
        try:
            os.write(self._w, b"\x00")
        except (BlockingIOError, OSError):
            pass

    def take(self) -> tuple[list[Any], dict[tuple[str, int], int]]:
        with self._lock:  # writers hold the lock too: empty the pipe, then re-arm
            try:
                while os.read(self._r, 4096):
                    pass
            except BlockingIOError:
                pass
            self._armed = False
            items = list(self._items)
            self._items.clear()
            arrivals, self._arrivals = self._arrivals, {}
        return items, arrivals

    def close(self) -> list[Any]:
        """No more items are taken; returns those nobody took (for their owners to fail)."""
        with self._lock:
            self._closed = True
            left = list(self._items)
            self._items.clear()
            self._arrivals.clear()
        os.close(self._r)
        os.close(self._w)
        return left

