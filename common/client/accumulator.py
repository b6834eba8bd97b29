"""``send_async``'s accumulator: messages coalesced into SEND_BATCH requests, per lane.

Kept apart from the RPC layer (``common/client/transport.py``) as Kafka's producer keeps its
RecordAccumulator apart from the NetworkClient: the transport's I/O thread hands this the
entries other threads queued (``add``), asks it each pass for the batches that are ready
(``send_ready``) and tells it each batch's outcome; this decides what goes out and in what
order, and never touches a socket.

One lane per (topic, queue, broker group): messages wait there and go out as SEND_BATCH
requests, at most ``max_batches_in_flight`` per lane, each batch to the broker its first
message was routed to. A lane carrying *ordered* messages (a ``shard_key``: every message of a
key to one queue, in the order sent) has at most one batch in flight, and a batch of them
that fails and is retried keeps its place: its ordered messages go back to the front of the
lane (by their send sequence number) and the lane sends nothing else while any of them waits
for its retry (``Lane.out``), as Kafka's producer keeps per-partition order with retries
(max.in.flight 1, the retried batch re-enqueued first). A message whose retries run out is
failed, and the lane goes on with the next. Keyless lanes keep ``max_batches_in_flight``.

Threads: ``reserve``, ``release_one`` and the producer's calls run on any thread; everything
else on the transport's I/O thread.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from common.client.results import SendResult, pack_bodies, send_results
from common.core.errors import BrokerError, ResponseCode
from common.format.protocol import RequestCode, Response

# Answers meaning "stored, but no slave confirmed it": a reason to ask the group again who leads.
DEGRADED_CODES = frozenset({ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE})


@dataclasses.dataclass(eq=False, slots=True)
class AsyncItem:
    """One message waiting to be coalesced into a batch (its future is the caller's)."""

    address: str
    topic: str
    queue_id: int
    body: bytes
    meta: list[Any] | None
    future: concurrent.futures.Future[SendResult]
    enqueued: float
    fixed_queue: int | None = None  # the queue the caller asked for, if any
    attempt: int = 0
    on_error: Callable[[AsyncItem, BrokerError], None] | None = None  # runs on the I/O thread
    give_up: float = 0.0  # monotonic: when waiting for a master (NoMasterError) ends
    ordered: bool = False  # keep its order in its queue through retries (a shard_key)
    seq: int = 0  # send order of an ordered message (Accumulator.next_seq), from send_async
    counted: bool = False  # I/O thread: counted in its lane's ``ordered`` until settled
    broker_name: str = ""  # the broker group of its queue (one of several; "" for one group)
    fixed_broker: str | None = None  # the group the caller (or its key) chose, if any


@dataclasses.dataclass(eq=False)
class Lane:
    """One (topic, queue, group) lane of ``send_async`` messages."""

    items: collections.deque[AsyncItem] = dataclasses.field(default_factory=collections.deque)
    in_flight: int = 0
    ordered: int = 0  # ordered messages queued, in flight or out, not settled yet
    out: set[int] = dataclasses.field(default_factory=set)  # seqs of ordered ones being retried
    last_seq: int = 0  # the highest seq of an ordered message ever queued here

    def limit(self, max_batches: int) -> int:
        """Batches allowed in flight now: none while an ordered message waits for its retry,
        one while the lane carries ordered messages."""
        if self.out:
            return 0
        return 1 if self.ordered else max_batches


@dataclasses.dataclass(frozen=True)
class Out:
    """An ordered message that could not be routed yet: its lane waits for it."""

    item: AsyncItem


@dataclasses.dataclass(frozen=True)
class Settled:
    """An ordered message failed for good outside the I/O thread: its lane goes on."""

    item: AsyncItem


Entry = AsyncItem | Out | Settled
LaneKey = tuple[str, int, str]


class Network(Protocol):
    """What the accumulator needs of the transport (``Transport`` implements it)."""

    def submit(self, entry: Entry) -> None: ...  # any thread -> the I/O thread's ``add``

    # I/O thread: send a request; ``done`` gets the Response or a BrokerError, on that thread
    def start_request(self, address: str, code: RequestCode, fields: dict[str, Any],
                      bodies: list[bytes], timeout_ms: int,
                      done: Callable[[Response | BrokerError], None]) -> None: ...

    def closing(self) -> bool: ...  # closed, or its I/O thread died: nothing is retried

    def degraded(self, address: str) -> None: ...  # a stored-but-unconfirmed answer came


class Accumulator:
    def __init__(self, network: Network, batch_size: int = 64, batch_bytes: int = 1024 * 1024,
                 linger_ms: float = 0.0, max_batches_in_flight: int = 2,
                 max_in_flight: int = 65_536, batch_timeout_ms: int = 10_000):
        self._network = network
        self._batch_size = batch_size
        self._batch_bytes = batch_bytes
        self._linger_s = linger_ms / 1000.0
        self._max_batches = max_batches_in_flight
        self._batch_timeout_ms = batch_timeout_ms
        self._lanes: dict[LaneKey, Lane] = {}
        self._ready: set[LaneKey] = set()
        self._seqs = itertools.count(1)  # send order of ordered messages (atomic under the GIL)
        self._max_pending = max_in_flight
        self._pending_items = 0
        self._pending_lock = threading.Lock()
        self._pending_freed = threading.Condition(self._pending_lock)

    # ---- any thread ---------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Messages handed to send_async and not settled yet."""
        return self._pending_items

    def reserve(self, timeout_ms: int) -> None:
        """Take a pending-message slot for a send_async (blocks while too many messages are
        pending, at most ``timeout_ms``); ``requeue`` hands the message over, and the slot is
        freed when its future is settled."""
        with self._pending_lock:
            if self._pending_items >= self._max_pending:
                limit = time.monotonic() + timeout_ms / 1000.0
                while self._pending_items >= self._max_pending:
                    left = limit - time.monotonic()
                    if left <= 0:
                        raise BrokerError(
                            ResponseCode.SYSTEM_BUSY, "client has too many sends pending", True
                        )
                    self._pending_freed.wait(left)
            self._pending_items += 1

    def requeue(self, item: AsyncItem) -> None:
        """A message goes to its lane (its pending slot is held)."""
        self._network.submit(item)

    def next_seq(self) -> int:
        """The send sequence number of an ordered message (taken in send order)."""
        return next(self._seqs)

    def hold_out(self, item: AsyncItem) -> None:
        """An ordered message that could not be routed yet (no master): its lane sends
        nothing sent after it until it comes back (``requeue``) or fails (``release_one``)."""
        self._network.submit(Out(item))

    def release_one(self, item: AsyncItem | None = None) -> None:
        """A message was failed outside the accumulator: free its slot and, when it is an
        ordered one, let its lane go on."""
        self._release_items(1)
        if item is not None and item.ordered:
            try:
                self._network.submit(Settled(item))
            except BrokerError:
                pass  # closed: no lane is served any more

    def _release_items(self, count: int) -> None:
        with self._pending_lock:
            self._pending_items -= count
            if self._pending_items < self._max_pending:
                self._pending_freed.notify_all()

    # ---- the I/O thread -----------------------------------------------------------------------
    def add(self, entry: Entry) -> None:
        if type(entry) is AsyncItem:  # the common one: its lane found inline (one call less)
            key = (entry.topic, entry.queue_id, entry.broker_name)
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = Lane()
            if entry.ordered:
                self._enqueue_ordered(lane, entry)
            else:
                lane.items.append(entry)
            self._ready.add(key)
        elif type(entry) is Out:
            _, lane = self._lane(entry.item)
            self._count(lane, entry.item)
            lane.out.add(entry.item.seq)
        else:  # Settled
            assert type(entry) is Settled
            key, lane = self._lane(entry.item)
            self._settle(lane, entry.item)
            self._ready.add(key)

    def next_due(self, deadline: float) -> float:
        """The earlier of ``deadline`` and the moment a lingering lane is due."""
        if self._linger_s > 0:
            for key in self._ready:
                lane = self._lanes[key]
                if lane.items and lane.in_flight < lane.limit(self._max_batches):
                    deadline = min(deadline, lane.items[0].enqueued + self._linger_s)
        return deadline

    def send_ready(self, now: float) -> None:
        for key in list(self._ready):
            lane = self._lanes[key]
            while lane.items and lane.in_flight < lane.limit(self._max_batches):
                full = len(lane.items) >= self._batch_size
                if not full and now - lane.items[0].enqueued < self._linger_s:
                    break
                self._send_batch(key, lane)
            if not lane.items:
                self._ready.discard(key)

    def fail(self, entry: Entry, err: BrokerError) -> None:
        """An entry that never reached ``add`` (the I/O thread ended): fail its message."""
        if isinstance(entry, AsyncItem):
            if not entry.future.done():
                entry.future.set_exception(err)
            self._release_items(1)

    def fail_all(self, err: BrokerError) -> None:
        """The I/O thread ends: every queued message fails with ``err``."""
        for lane in self._lanes.values():
            while lane.items:
                item = lane.items.popleft()
                if not item.future.done():
                    item.future.set_exception(err)
                self._release_items(1)

    def _lane(self, item: AsyncItem) -> tuple[LaneKey, Lane]:
        key = (item.topic, item.queue_id, item.broker_name)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane()
        return key, lane

    def _count(self, lane: Lane, item: AsyncItem) -> None:
        if not item.counted:
            item.counted = True
            lane.ordered += 1

    def _settle(self, lane: Lane, item: AsyncItem) -> None:
        """An ordered message is stored or failed for good: its lane stops waiting for it."""
        lane.out.discard(item.seq)
        if item.counted:
            item.counted = False
            lane.ordered -= 1

    def _enqueue_ordered(self, lane: Lane, item: AsyncItem) -> None:
        """Into its lane by send order: a retried message goes before what was sent after
        it. The lane's queued messages follow it to the broker it was routed to now (the
        master, found again after a failover)."""
        self._count(lane, item)
        lane.out.discard(item.seq)
        items = lane.items
        if item.seq > lane.last_seq:  # a new one: after everything queued
            lane.last_seq = item.seq
            items.append(item)
        else:  # a retried one: before the first ordered message sent after it (keyless
            # messages, seq 0, keep no place in the order)
            at = next((i for i, queued in enumerate(items)
                       if queued.ordered and queued.seq > item.seq), len(items))
            items.insert(at, item)
        if items[0].address != item.address or items[-1].address != item.address:
            for queued in items:
                queued.address = item.address

    def _send_batch(self, key: LaneKey, lane: Lane) -> None:
        items: list[AsyncItem] = []
        size = 0
        address = lane.items[0].address  # one batch, one broker
        while lane.items and len(items) < self._batch_size:
            nxt = lane.items[0]
            if items and (size + len(nxt.body) > self._batch_bytes or nxt.address != address):
                break
            items.append(lane.items.popleft())
            size += len(nxt.body)
        topic, queue_id, _ = key
        fields: dict[str, Any] = {"topic": topic, "queueId": queue_id}
        metas = [i.meta for i in items]
        if metas.count(None) != len(metas):  # not a generator: a Python call a message
            fields["meta"] = metas
        lane.in_flight += 1
        self._network.start_request(
            address, RequestCode.SEND_BATCH, fields, pack_bodies(fields, [i.body for i in items]),
            self._batch_timeout_ms,
            lambda outcome: self._batch_done(key, lane, items, address, outcome))

    def _batch_done(self, key: LaneKey, lane: Lane, items: list[AsyncItem], address: str,
                    outcome: Response | BrokerError) -> None:
        lane.in_flight -= 1
        if lane.items:
            self._ready.add(key)
        try:
            if isinstance(outcome, BrokerError):
                raise outcome
            if outcome.code in DEGRADED_CODES:
                self._network.degraded(address)
            results = send_results(key[0], outcome, key[2])
            if len(results) != len(items):
                raise BrokerError(
                    ResponseCode.SYSTEM_ERROR,
                    f"broker answered {len(results)} offsets for {len(items)} messages",
                )
        except BrokerError as e:
            self._items_failed(lane, items, e)
            return
        self._release_items(len(items))
        for item, result in zip(items, results, strict=True):
            if item.ordered:
                self._settle(lane, item)
            item.future.set_result(result)

    def _items_failed(self, lane: Lane, items: list[AsyncItem], err: BrokerError) -> None:
        finished = 0
        closing = self._network.closing()
        for item in items:
            if item.on_error is None or closing:
                if item.ordered:
                    self._settle(lane, item)
                item.future.set_exception(err)
                finished += 1
            else:
                if item.ordered:  # its lane waits until it is back or failed for good
                    lane.out.add(item.seq)
                item.on_error(item, err)  # retries or fails it (and then calls release_one)
        self._release_items(finished)
