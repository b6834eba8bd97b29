"""An in-memory store that satisfies ``common.store.api.Store`` (mypy checks it in ``make
lint``): RocketMQ records kept in a list (``common.format.record``), so the request server,
the roles and the clients can be tested apart from the storage engine. Arrival notices come
from a separate thread, like the real reput's."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from common.core.errors import GetStatus, PutStatus
from common.core.message import (
    Message,
    MessageExt,
    decode_msg_id,
    encode_properties,
    host_bytes,
    tags_code,
)
from common.core.sql92 import Selector
from common.core.subscription import EVERYTHING, Subscription
from common.core.transaction import TransactionState
from common.format import record
from common.format.protocol import decode_record
from common.store.api import Store
from common.store.commit_log import PutResult
from common.store.flush import done_future
from common.store.message_store import GetResult, PendingPut, StoreStats
from common.store.pop.records import Key
from common.store.pop.service import Popped, Resolved
from common.store.pop.state import Out
from common.store.transaction.service import Decided, EndResult

STORE_PORT = 10911


class FakeDelayProgress:
    def __init__(self) -> None:
        self.offsets: dict[int, int] = {}
        self.path = Path("/nonexistent/delayOffset.json")


class FakeTransactions:
    """No half messages here (a FakeStore runs no put hooks): every END finds none."""

    def half_at(self, offset: int) -> MessageExt | None:
        return None

    def decided(self, half: MessageExt) -> Decided:
        return Decided(None, False)

    def end(self, half: MessageExt, state: TransactionState,
            born_host: tuple[str, int]) -> EndResult:
        raise LookupError("the fake store holds no half message")

    def status(self) -> dict[str, int]:
        return {}


class FakePop:
    """No POP here: nothing is ever handed out, so nothing is acked or due."""

    def pop(self, key: Key, start: Callable[[], int], max_nums: int, invisible_ms: int,
            now_ms: int, fifo: bool = False, sub: Subscription = EVERYTHING,
            max_attempts: int = 17, born_host: tuple[str, int] = ("0.0.0.0", 0)) -> Popped:
        return Popped([], [], [], 0, 0, None, start())

    def ack(self, key: Key, offset: int, handle: int, now_ms: int,
            born_host: tuple[str, int] = ("0.0.0.0", 0), kind: str = "ack") -> Resolved:
        return Resolved("the fake store hands nothing out", None)

    def ack_many(self, key: Key, entries: list[tuple[int, int]], now_ms: int,
                 born_host: tuple[str, int] = ("0.0.0.0", 0)) -> tuple[list[tuple[int, str]],
                                                                   PendingPut | None]:
        return [(i, "the fake store hands nothing out") for i in range(len(entries))], None

    def change(self, key: Key, offset: int, handle: int, invisible_ms: int, now_ms: int,
               born_host: tuple[str, int] = ("0.0.0.0", 0)) -> Resolved:
        return Resolved("the fake store hands nothing out", None)

    def due_for_dlq(self, now_ms: int) -> list[tuple[Key, int, Out]]:
        return []

    def active(self, group: str, now_ms: int, within_ms: int = 60_000) -> bool:
        return False

    def next_deadline(self, keys: list[Key]) -> int | None:
        return None

    def figures(self, now_ms: int) -> dict[str, Any]:
        return {}


class FakeStore:
    """In-memory records; arrival notices come from a separate 'reput' thread like the real one."""

    def __init__(self) -> None:
        self.log: list[bytes] = []
        self.phy = 0
        self.queues: dict[tuple[str, int], list[int]] = {}
        self.by_phy: dict[int, bytes] = {}
        self.listeners: list[Callable[[str, int, int], None]] = []
        self.append_listeners: list[Callable[[int], None]] = []
        self.promotions = 0
        self.demotions = 0
        self.fenced = False
        self.lock = threading.Lock()
        self.started = self.stopped = False
        self.min_phy_offset = 0
        self.flushed_phy_offset = 0
        self.dispatched_phy_offset = 0
        self.confirm_phy_offset: int | None = None
        self.store_id = "fake-store"
        self.delivery_gate: Callable[[], str] | None = None
        self.schedule = FakeDelayProgress()
        self.transactions = FakeTransactions()
        self.pop = FakePop()
        self.delay_levels_ms = [1000, 5000, 10000]
        self.inline_dispatches = 0

    @property
    def max_phy_offset(self) -> int:
        return self.phy

    def reput_end(self) -> int:
        return self.phy  # no controller here: nothing is held back

    def timer_status(self) -> dict[str, Any]:
        return {"enabled": False}

    # ---- lifecycle and roles ------------------------------------------------------------------
    def start(self) -> None:
        self.started = True

    def shutdown(self) -> None:
        self.stopped = True

    def become_master(self) -> None:
        self.promotions += 1  # the real store rebuilds its queue offsets from its ConsumeQueues

    def become_slave(self) -> None:
        self.demotions += 1  # a failed promotion, or a start as a slave

    def snapshot(self) -> StoreStats:
        n = len(self.by_phy)
        return StoreStats(
            min_phy_offset=0, max_phy_offset=self.phy, flushed_phy_offset=self.phy,
            dispatched_phy_offset=self.phy, confirm_phy_offset=self.phy, flush_lag_bytes=0,
            reput_lag_bytes=0, segments=1, consume_queues=len(self.queues), puts=n,
            put_failures=0, dispatched_records=n, deleted_segments=0,
            segments_pending_delete=0, segment_close_failures=0, segments_held_too_long=0,
            writeable=True, last_recovery="")

    def topic_queues(self) -> dict[str, int]:
        return {}

    def add_arrival_listener(self, cb: Callable[[str, int, int], None],
                             topic: str | None = None) -> None:
        if topic is None:
            self.listeners.append(cb)
        else:  # as the store: that topic's arrivals only
            self.listeners.append(lambda t, q, o: cb(t, q, o) if t == topic else None)

    def dispatch_inline(self) -> int:
        self.inline_dispatches += 1  # the fake's puts are visible at once
        return 0

    def end_inline_dispatch(self) -> None:
        pass

    @contextlib.contextmanager
    def dispatching_inline(self) -> Iterator[None]:
        yield
        self.inline_dispatches += 1

    # ---- replication ----------------------------------------------------------------------------
    def fence_replication(self) -> int:
        self.fenced = True  # a promotion: no replicated write from now on
        return 0

    def open_replication(self) -> int:
        self.fenced = False  # an HA client starts (nothing here replicates)
        return 0

    @contextlib.contextmanager
    def replication_guard(self, generation: int | None) -> Iterator[None]:
        with self.lock:
            yield

    def append_replicated(self, phy_offset: int, data: bytes | memoryview,
                          generation: int | None = None) -> int:
        raise NotImplementedError("the fake store takes no replicated bytes")

    def truncate_to(self, phy_offset: int, generation: int | None = None) -> None:
        raise NotImplementedError("the fake store is never truncated")

    def reset_to(self, phy_offset: int, generation: int | None = None) -> None:
        raise NotImplementedError("the fake store is never reset")

    def set_confirm_offset(self, confirm_phy_offset: int | None) -> None:
        self.confirm_phy_offset = confirm_phy_offset

    def bound_confirm_offset(self) -> int:
        if self.confirm_phy_offset is None:
            self.confirm_phy_offset = self.phy
        return self.phy

    def add_append_listener(self, cb: Callable[[int], None]) -> None:
        self.append_listeners.append(cb)  # the master's HA service registers; no slave here

    def read_committed(self, phy_offset: int, max_bytes: int) -> bytes:
        return b"".join(self.log)[phy_offset : phy_offset + max_bytes]

    def log_checksum(self, from_offset: int, to_offset: int, max_bytes: int) -> str:
        import hashlib

        return hashlib.sha256(b"".join(self.log)[from_offset:to_offset]).hexdigest()

    # ---- puts -------------------------------------------------------------------------------------
    def _append(self, msg: Message, queue_id: int) -> tuple[int, int, int]:
        entries = self.queues.setdefault((msg.topic, queue_id), [])
        raw = record.encode(
            msg.topic.encode(),
            msg.body,
            encode_properties(msg.all_properties()),
            queue_id,
            len(entries),
            self.phy,
            flag=msg.flag,
            store_port=STORE_PORT,
        )
        phy, qoff = self.phy, len(entries)
        self.by_phy[phy] = bytes(raw)
        self.log.append(bytes(raw))  # the CommitLog bytes, in order (what the HA service reads)
        entries.append(phy)
        self.phy += len(raw)
        return phy, qoff, len(raw)

    def put_batch_nowait(self, topic: str, queue_id: int, msgs: Sequence[Message | bytes],
                         born_host: tuple[str, int] = ("127.0.0.1", 0),
                         born_timestamp: int = 0) -> PendingPut:
        messages = [m if isinstance(m, Message) else Message(topic, m) for m in msgs]
        with self.lock:
            placed = [self._append(m, queue_id) for m in messages]
        first_phy, first_q, _ = placed[0]
        result = PutResult(
            status=PutStatus.PUT_OK,
            phy_offset=first_phy,
            wrote_bytes=sum(p[2] for p in placed),
            queue_id=queue_id,
            queue_offset=first_q,
            msg_count=len(placed),
            record_offsets=tuple(p[0] for p in placed) if len(placed) > 1 else (),
            store_ip=host_bytes("127.0.0.1"),
            store_port=STORE_PORT,
        )
        self.flushed_phy_offset = self.dispatched_phy_offset = self.phy
        max_offset = len(self.queues[(topic, queue_id)])
        for cb in self.listeners:  # like reput: from another thread
            threading.Thread(target=cb, args=(topic, queue_id, max_offset)).start()
        return PendingPut(result, done_future(PutStatus.PUT_OK))

    def put_nowait(self, msg: Message, queue_id: int,
                   born_host: tuple[str, int] = ("127.0.0.1", 0),
                   born_timestamp: int = 0) -> PendingPut:
        return self.put_batch_nowait(msg.topic, queue_id, [msg], born_host, born_timestamp)

    # ---- reads ------------------------------------------------------------------------------------
    def max_queue_offset(self, topic: str, queue_id: int) -> int:
        return len(self.queues.get((topic, queue_id), []))

    def min_queue_offset(self, topic: str, queue_id: int) -> int:
        return 0  # nothing is ever deleted here

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return 0

    def store_timestamp_of(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        entries = self.queues.get((topic, queue_id), [])
        if not 0 <= queue_offset < len(entries):
            return None
        return decode_record(self.by_phy[entries[queue_offset]]).store_timestamp

    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        queue_offset: int,
        max_nums: int,
        tags_codes: set[int] | None = None,
        max_bytes: int = 0,
        tags: frozenset[str] | None = None,  # not checked: a store that trusts the hash
        selector: Selector | None = None,
    ) -> GetResult:
        entries = self.queues.get((topic, queue_id))
        if entries is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        if queue_offset >= len(entries):
            status = (
                GetStatus.OFFSET_OVERFLOW_ONE
                if queue_offset == len(entries)
                else GetStatus.OFFSET_OVERFLOW_BADLY
            )
            return GetResult(status, len(entries), 0, len(entries))
        chosen = entries[queue_offset : queue_offset + max_nums]
        recs = [self.by_phy[p] for p in chosen]
        if tags_codes is not None:
            recs = [r for r in recs if tags_code(decode_record(r).tags) in tags_codes]
        if selector is not None:
            recs = [r for r in recs if selector.matches(decode_record(r).properties)]
        return GetResult(GetStatus.FOUND if recs else GetStatus.NO_MATCHED_MESSAGE,
                         queue_offset + len(chosen), 0, len(entries), recs)

    def record_at(self, phy_offset: int) -> bytes | None:
        return self.by_phy.get(phy_offset)

    def message_by_offset(self, phy_offset: int) -> MessageExt | None:
        raw = self.by_phy.get(phy_offset)
        return decode_record(raw) if raw else None

    def find_message(self, phy_offset: int) -> MessageExt:
        found = self.message_by_offset(phy_offset)
        if found is None:
            raise LookupError(f"no message starts at offset {phy_offset}")
        return found

    def message_by_msg_id(self, msg_id: str) -> MessageExt | None:
        return self.message_by_offset(decode_msg_id(msg_id)[2])

    def query_by_key(self, topic: str, key: str, max_nums: int = 32, begin_ms: int = 0,
                     end_ms: int = 2**62) -> list[MessageExt]:
        found = [decode_record(r) for r in self.by_phy.values()]
        return [m for m in found if m.topic == topic and key in m.key_list()][:max_nums]


def _conforms(store: FakeStore) -> Iterator[Store]:
    """Never called: mypy checks here that FakeStore is a Store."""
    yield store
