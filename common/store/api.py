"""The store as the rest of the broker sees it: typed protocols, one per kind of user.

``MessageStore`` satisfies ``Store`` (checked under mypy below, and by the unit tests' fakes
in ``tests/helpers/``); nothing outside ``common/store/`` reaches into the store past these.
``docs/store-api.md`` lists the same members, and a unit test checks the two agree.

- ``ReadStore``: what every role serves reads, look-ups and status with (the processors,
  the metrics).
- ``WriteStore``: a master's puts, appended now and flushed later (``PendingPut``).
- ``ReplicationStore``: what the HA service streams from and the HA client replays into,
  with the fence that keeps a stopped client's late writes out, and the confirmed offset.
- ``Store``: all of it, with the lifecycle and the role switches (the broker, its role
  manager).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from common.core.message import Message, MessageExt
    from common.core.sql92 import Selector
    from common.core.subscription import Subscription
    from common.core.transaction import TransactionState
    from common.store.message_store import (
        AppendListener,
        GetResult,
        MessageStore,
        PendingPut,
        StoreStats,
    )
    from common.store.pop.records import Key
    from common.store.pop.service import Popped, Resolved
    from common.store.pop.state import Out
    from common.store.reput import ArrivalListener
    from common.store.transaction.service import Decided, EndResult


class ReadStore(Protocol):
    @property
    def min_phy_offset(self) -> int: ...

    @property
    def max_phy_offset(self) -> int: ...

    @property
    def flushed_phy_offset(self) -> int: ...

    @property
    def dispatched_phy_offset(self) -> int: ...

    def reput_end(self) -> int: ...  # consumers are served up to here (the confirmed offset)

    def get_message(self, group: str, topic: str, queue_id: int, queue_offset: int,
                    max_nums: int, tags_codes: set[int] | None = ..., max_bytes: int = ...,
                    tags: frozenset[str] | None = ...,
                    selector: Selector | None = ...) -> GetResult: ...

    def min_queue_offset(self, topic: str, queue_id: int) -> int: ...

    def max_queue_offset(self, topic: str, queue_id: int) -> int: ...

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int: ...

    def store_timestamp_of(self, topic: str, queue_id: int, queue_offset: int) -> int | None: ...

    def topic_queues(self) -> dict[str, int]: ...

    def query_by_key(self, topic: str, key: str, max_nums: int = ..., begin_ms: int = ...,
                     end_ms: int = ...) -> list[MessageExt]: ...

    def message_by_offset(self, phy_offset: int) -> MessageExt | None: ...

    def find_message(self, phy_offset: int) -> MessageExt: ...

    def message_by_msg_id(self, msg_id: str) -> MessageExt | None: ...

    def record_at(self, phy_offset: int) -> bytes | None: ...

    def log_checksum(self, from_offset: int, to_offset: int, max_bytes: int) -> str: ...

    def snapshot(self) -> StoreStats: ...

    def add_arrival_listener(self, listener: ArrivalListener, topic: str | None = None) -> None: ...

    def dispatch_inline(self) -> int: ...  # index this thread's appends now (request loops)

    def end_inline_dispatch(self) -> None: ...  # the calling thread ends

    # appends inside wake nobody and are indexed on the way out (a local call served inline)
    def dispatching_inline(self) -> AbstractContextManager[None]: ...


class Transactions(Protocol):
    """A store's transactions (``common/store/transaction/service.py``)."""

    def half_at(self, offset: int) -> MessageExt | None: ...

    def decided(self, half: MessageExt) -> Decided: ...

    def end(self, half: MessageExt, state: TransactionState,
            born_host: tuple[str, int]) -> EndResult: ...

    def status(self) -> dict[str, int]: ...


class Pop(Protocol):
    """A store's POP state (``common/store/pop/service.py``)."""

    def pop(self, key: Key, start: Callable[[], int], max_nums: int, invisible_ms: int,
            now_ms: int, fifo: bool = ..., sub: Subscription = ..., max_attempts: int = ...,
            born_host: tuple[str, int] = ...) -> Popped: ...

    def ack(self, key: Key, offset: int, handle: int, now_ms: int,
            born_host: tuple[str, int] = ..., kind: str = ...) -> Resolved: ...

    def ack_many(self, key: Key, entries: list[tuple[int, int]], now_ms: int,
                 born_host: tuple[str, int] = ...) -> tuple[list[tuple[int, str]],
                                                            PendingPut | None]: ...

    def change(self, key: Key, offset: int, handle: int, invisible_ms: int, now_ms: int,
               born_host: tuple[str, int] = ...) -> Resolved: ...

    def due_for_dlq(self, now_ms: int) -> list[tuple[Key, int, Out]]: ...

    def active(self, group: str, now_ms: int, within_ms: int = ...) -> bool: ...

    def next_deadline(self, keys: list[Key]) -> int | None: ...

    def figures(self, now_ms: int) -> dict[str, Any]: ...


class WriteStore(ReadStore, Protocol):
    @property
    def delay_levels_ms(self) -> list[int]: ...

    @property
    def transactions(self) -> Transactions: ...

    @property
    def pop(self) -> Pop: ...

    def put_nowait(self, msg: Message, queue_id: int, born_host: tuple[str, int] = ...,
                   born_timestamp: int = ...) -> PendingPut: ...

    def put_batch_nowait(self, topic: str, queue_id: int, msgs: Sequence[Message | bytes],
                         born_host: tuple[str, int] = ...,
                         born_timestamp: int = ...) -> PendingPut: ...


class ReplicationStore(Protocol):
    @property
    def min_phy_offset(self) -> int: ...

    @property
    def max_phy_offset(self) -> int: ...

    @property
    def confirm_phy_offset(self) -> int | None: ...

    def set_confirm_offset(self, confirm_phy_offset: int | None) -> None: ...

    def bound_confirm_offset(self) -> int: ...  # unbounded: bound at the log's end; the end

    def add_append_listener(self, listener: AppendListener) -> None: ...

    def read_committed(self, phy_offset: int, max_bytes: int) -> bytes: ...

    def open_replication(self) -> int: ...

    def fence_replication(self) -> int: ...

    def replication_guard(self, generation: int | None) -> AbstractContextManager[None]: ...

    def append_replicated(self, phy_offset: int, data: bytes | memoryview,
                          generation: int | None = ...) -> int: ...  # the log's new end

    def truncate_to(self, phy_offset: int, generation: int | None = ...) -> None: ...

    def reset_to(self, phy_offset: int, generation: int | None = ...) -> None: ...

    def dispatch_inline(self) -> int: ...

    def end_inline_dispatch(self) -> None: ...


class DelayProgress(Protocol):
    """Delay-level delivery's progress: what a slave copies from its master."""

    offsets: dict[int, int]
    path: Path


class Store(WriteStore, ReplicationStore, Protocol):
    # "" while this broker may write, else why not: delayed deliveries are writes
    delivery_gate: Callable[[], str] | None

    @property
    def store_id(self) -> str: ...

    @property
    def schedule(self) -> DelayProgress: ...

    def start(self) -> None: ...

    def shutdown(self) -> None: ...

    def become_master(self) -> None: ...

    def become_slave(self) -> None: ...

    def timer_status(self) -> dict[str, Any]: ...


def _conforms(store: MessageStore) -> Iterator[Store]:
    """Never called: mypy checks here that MessageStore is a Store."""
    yield store
