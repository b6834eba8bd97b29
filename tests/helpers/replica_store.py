"""An in-memory ``common.store.api.ReplicationStore`` for tests of the HA drivers (mypy checks
it in ``make lint``): the log is a bytearray, appends must land at its end, the fence is a
generation number. Subclass it to make one call fail or to record the order of calls."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from common.core.errors import ReplicationFencedError, StoreError
from common.store.api import ReplicationStore


class MemoryReplicaStore:
    def __init__(self, generation: int = 1) -> None:
        self.data = bytearray()
        self.min_phy_offset = 0
        self.confirm_phy_offset: int | None = None
        self.generation = generation  # what open_replication hands out
        self.fenced_at = 0  # generations up to this one may write nothing more
        self.append_listeners: list[Callable[[int], None]] = []
        self.lock = threading.Lock()

    @property
    def max_phy_offset(self) -> int:
        return self.min_phy_offset + len(self.data)

    def _check(self, generation: int | None) -> None:
        if generation is not None and generation <= self.fenced_at:
            raise ReplicationFencedError(f"generation {generation} is fenced")

    def open_replication(self) -> int:
        return self.generation

    def fence_replication(self) -> int:
        self.fenced_at = self.generation
        return self.generation

    @contextlib.contextmanager
    def replication_guard(self, generation: int | None) -> Iterator[None]:
        with self.lock:
            self._check(generation)
            yield

    def append_replicated(self, phy_offset: int, data: bytes | memoryview,
                          generation: int | None = None) -> int:
        with self.lock:
            self._check(generation)
            if phy_offset != self.max_phy_offset:
                raise StoreError(f"append at {phy_offset}, the log ends at {self.max_phy_offset}")
            self.data += data
            end = self.max_phy_offset
        for listener in self.append_listeners:
            listener(end)
        return end

    def truncate_to(self, phy_offset: int, generation: int | None = None) -> None:
        with self.lock:
            self._check(generation)
            del self.data[max(0, phy_offset - self.min_phy_offset):]

    def reset_to(self, phy_offset: int, generation: int | None = None) -> None:
        with self.lock:
            self._check(generation)
            self.data = bytearray()
            self.min_phy_offset = phy_offset

    def read_committed(self, phy_offset: int, max_bytes: int) -> bytes:
        start = phy_offset - self.min_phy_offset
        return bytes(self.data[start : start + max_bytes])

    def set_confirm_offset(self, confirm_phy_offset: int | None) -> None:
        self.confirm_phy_offset = confirm_phy_offset

    def bound_confirm_offset(self) -> int:
        end = self.max_phy_offset
        if self.confirm_phy_offset is None:
            self.confirm_phy_offset = end
        return end

    def add_append_listener(self, listener: Callable[[int], None]) -> None:
        self.append_listeners.append(listener)

    def dispatch_inline(self) -> int:
        return 0  # nothing indexes here

    def end_inline_dispatch(self) -> None:
        pass


def _conforms(store: MemoryReplicaStore) -> Iterator[ReplicationStore]:
    """Never called: mypy checks here that MemoryReplicaStore is a ReplicationStore."""
    yield store
