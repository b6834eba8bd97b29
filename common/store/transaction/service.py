"""A store's transactions: the half hook, the state of a transaction, and its end, decided once.

The state of a transaction is what its records say, found by its origin (``HALF_ORIGIN``,
indexed on every broker): an op record (and its ``OP_STATE``), or a commit without its op yet
(the end was cut short between the two writes). The look-up reads a memory of the ends
decided here lately, then the records not dispatched yet (past the confirmed offset), then
the index: in that order, as reput indexes a record before it counts it dispatched. No op
map is loaded or kept in order (RocketMQ's, whose load and backlog lost or stalled halves):
a state is one look-up, wherever and whenever its records were written.

A half sent twice (the client's retry after an answer lost to a failover: the first copy was
stored, and replicated) is a second half of the same transaction, with its own origin but the
same transaction id (its producer group and uniq key, set once by the client) and the same
body. A commit of either decides both: before writing the real message, the look-up also searches the real topic
for a commit of that id (by the uniq key, indexed; then the records not dispatched), and if
one is there the end writes only this half's op. A transaction committed is consumed once,
however many times its half was sent.

An end is decided under one lock: look up, then write the commit (if a commit, and none is
there) and the op. Once an op is written, a different end is refused and the same one is
answered without a write: a final state is final.

Ops are batched as RocketMQ 5 batches them (``transactionOpMsgMaxSize`` bytes of body, or
``transactionOpBatchInterval`` ms after the first, whichever comes first), but only a
commit's: the commit record already decides its transaction, so its op is a record of it, and
a crash that loses the batch loses nothing (the check-back finds the commit and writes the op
again). A rollback's op is its only record, so it is written with its END, which waits for it.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from common.core.message import PROPERTY_REAL_TOPIC, PROPERTY_UNIQ_KEY, MessageExt
from common.core.transaction import (
    CHECK_MAX_TOPIC,
    HALF_ORIGIN,
    HALF_TOPIC,
    OP_STATE,
    OP_TOPIC,
    PRODUCER_GROUP,
    SYSFLAG_TRANSACTION_MASK,
    TRANSACTION_COMMIT_TYPE,
    TransactionState,
)
from common.format import boundary
from common.store.reput import tail_records
from common.store.transaction import records
from common.store.transaction.hook import HalfHook

if TYPE_CHECKING:
    from common.store.extensions import StoreExtensions
    from common.store.index import IndexDispatcher
    from common.store.message_store import MessageStore, PendingPut

log = logging.getLogger("replog.transaction")

RECENT = 65_536  # ends remembered (the look-up's first stop; the index holds them all)
FIGURES = ("commits", "rollbacks", "repeated", "refused_conflicts", "ops_repaired", "fresh",
           "op_batches", "ops_dropped", "halves_sent_twice")
NEVER = 2**63  # no shortcut: every look-up reads the index
TAIL_KEPT = 4096  # ends read past the dispatched offset, kept until reput passed them
NOT_AN_END = (HALF_TOPIC, CHECK_MAX_TOPIC)  # records of a transaction that decide nothing
NO_HOST = ("0.0.0.0", 0)


@dataclass
class _OpBatch:
    """Commits whose op is not written yet: (origin, half queue offset), oldest first."""

    entries: list[tuple[int, int]] = field(default_factory=list)
    origins: set[int] = field(default_factory=set)
    since: float = 0.0  # monotonic time of the first
    body: int = 0  # the op body's length so far
    keys: int = 0  # its KEYS' length so far


class Decided(NamedTuple):
    """A transaction's state: ``state`` None if undecided; ``op`` whether its op is written."""

    state: TransactionState | None
    op: bool


class EndResult(NamedTuple):
    """``conflict``: the state already decided, when it differs from the end asked (nothing
    written). ``pending``: the last put made (None: nothing to write, the state was there)."""

    conflict: TransactionState | None
    pending: PendingPut | None


class TransactionStore:
    def __init__(self, store: MessageStore):
        self.store = store
        self.lock = threading.RLock()
        self._scanned = 0  # the records not dispatched are read from here on (``_in_tail``)
        self._tail: dict[int, tuple[Decided, int]] = {}  # origin -> (its end, record offset)
        self._tail_ids: dict[tuple[str, str], int] = {}  # commits there: id -> record offset
        self.hook = HalfHook(indexed=False)
        self._recent: collections.OrderedDict[int, Decided] = collections.OrderedDict()
        # a master's: a transaction whose half is at or past this offset, and not in _recent,
        # has no end (every end since is this store's own, remembered; see ``_Fresh``)
        self._fresh_from = NEVER
        self.stats: collections.Counter[str] = collections.Counter(dict.fromkeys(FIGURES, 0))
        cfg = store.cfg
        self.op_max_size = cfg.transactionOpMsgMaxSize
        self.op_interval_s = cfg.transactionOpBatchInterval / 1000
        self._batch = _OpBatch()
        self.batch_wake = threading.Event()  # a batch is waiting (the batcher's timer starts)

    def install(self, ext: StoreExtensions, index: IndexDispatcher | None) -> None:
        """Before every other put hook: a half is never delayed or timed."""
        self.hook = HalfHook(indexed=index is not None)
        ext.add_put_hook(self.hook)
        ext.add_cut_listener(self)
        ext.add_master_service("transaction-fresh", lambda: _Fresh(self))
        ext.add_master_service("transaction-op-batch", lambda: _OpBatcher(self))
        ext.watch(HALF_ORIGIN, OP_STATE)  # found in the records not dispatched yet
        if index is not None:
            index.index_property(HALF_ORIGIN)

    # ---- look-ups ---------------------------------------------------------------------------
    def half_at(self, offset: int) -> MessageExt | None:
        """The half message stored at ``offset`` (in the half topic, or one the check-back
        gave up, kept in the check-max topic), or None if no half starts there."""
        found = self.store.entry_message(offset)
        return found if found is not None and (records.is_half_record(found)
                                               or records.is_given_up(found)) else None

    def decided(self, half: MessageExt) -> Decided:
        origin = records.origin_of(half)
        with self.lock:
            known = self._recent.get(origin)
            if known is not None:
                return known
            if origin in self._batch.origins:  # its op will be written with the batch
                return Decided(TransactionState.COMMIT, True)
            if origin >= self._fresh_from:  # no one but this store ended it, and it did not
                self.stats["fresh"] += 1
                return self._committed_as(half)
            # the records not dispatched first, the index after: reput indexes a record
            # before it counts it dispatched, so one it dispatches meanwhile is in the index
            in_tail = self._in_tail(origin)
        key = HALF_ORIGIN + str(origin)
        real_topic = half.properties[PROPERTY_REAL_TOPIC]
        committed = False
        index = self.store.index
        if index is not None:  # every hit read (``IndexService.find``): others share the key
            entry = self.store.entry_message
            op = index.find(OP_TOPIC, key,
                            lambda at: self._op_state(entry(at), origin) is not None)
            if op is not None:
                state = self._op_state(entry(op), origin)
                if state is not None:
                    return Decided(state, True)
            committed = index.find(real_topic, key, lambda at: _is_commit_of(
                entry(at), real_topic, origin)) is not None
        if in_tail is not None and (in_tail.op or not committed):
            return in_tail
        if committed:
            return Decided(TransactionState.COMMIT, False)
        return self._committed_as(half)

    def _committed_as(self, half: MessageExt) -> Decided:
        """For a half whose own origin has no end: COMMIT (op not written) if another half of
        the same transaction (the same producer group and uniq key: the client sent it twice)
        was committed, in the index or in the records not dispatched; else undecided."""
        ident = transaction_id(half.properties)
        if ident is None:
            return Decided(None, False)
        real_topic = half.properties[PROPERTY_REAL_TOPIC]
        index = self.store.index
        entry = self.store.entry_message
        with self.lock:  # the records not dispatched before the index, as in ``decided``
            self._scan_tail()
            offset = self._tail_ids.get(ident)
        found = offset is not None and _is_commit_of_id(entry(offset), real_topic, ident,
                                                        half.body)
        if not found:  # the uniq key is any sender's to write: every hit is read
            found = index is not None and index.find(real_topic, ident[1], lambda at: (
                _is_commit_of_id(entry(at), real_topic, ident, half.body))) is not None
        if not found:
            return Decided(None, False)
        self.stats["halves_sent_twice"] += 1
        log.info("event=transaction_half_sent_twice origin=%d transactionId=%s: committed "
                 "by another half of it; this one gets its op only", records.origin_of(half),
                 ident[1])
        return Decided(TransactionState.COMMIT, False)

    def _in_tail(self, origin: int) -> Decided | None:
        """Under the lock: the end of ``origin`` among the records reput has not dispatched
        (so not indexed) yet. Read before the index, never after: a record reput dispatches
        between the two reads is then in one or the other."""
        self._scan_tail()
        found = self._tail.get(origin)
        return found[0] if found is not None else None

    def _scan_tail(self) -> None:
        """Under the lock: read the records not dispatched yet that were not read before. What
        was read is kept (ends by origin, commits by transaction id) until reput passed it."""
        store = self.store
        dispatched = store.dispatched_phy_offset
        start = max(self._scanned, dispatched)
        if start < store.commit_log.max_offset:
            for req in tail_records(store.commit_log, start, store.extensions):
                start = req.phy_offset + req.size
                if req.topic in NOT_AN_END:
                    continue
                text = req.properties.get(HALF_ORIGIN, "")
                if req.topic == OP_TOPIC:
                    state = _state(req.properties.get(OP_STATE))
                    if state is not None and not boundary.delivered_here(req.properties):
                        ended = records.key_origins(req.keys)
                        if text.isdigit():
                            ended.append(int(text))
                        for origin_ in ended:
                            self._tail[origin_] = (Decided(state, True), req.phy_offset)
                elif text.isdigit() and _is_commit_of(  # a commit, in its real topic
                        store.entry_message(req.phy_offset), req.topic, int(text)):
                    if int(text) not in self._tail:
                        self._tail[int(text)] = (Decided(TransactionState.COMMIT, False),
                                                 req.phy_offset)
                    ident = transaction_id(req.properties)
                    if ident is not None:
                        self._tail_ids.setdefault(ident, req.phy_offset)
            self._scanned = start
        if len(self._tail) + len(self._tail_ids) > TAIL_KEPT:  # reput indexed them meanwhile
            self._tail = {k: v for k, v in self._tail.items() if v[1] >= dispatched}
            self._tail_ids = {k: v for k, v in self._tail_ids.items() if v >= dispatched}

    @staticmethod
    def _op_state(msg: MessageExt | None, origin: int) -> TransactionState | None:
        if msg is None or msg.topic != OP_TOPIC or origin not in records.op_origins(msg) \
                or boundary.delivered_here(msg.properties):
            return None
        return _state(msg.properties.get(OP_STATE))

    # ---- the end ----------------------------------------------------------------------------
    def end(self, half: MessageExt, state: TransactionState,
            born_host: tuple[str, int]) -> EndResult:
        """Commit or roll back the transaction of ``half`` (any of its copies), once."""
        if state is TransactionState.UNKNOWN:
            raise ValueError("an end is a commit or a rollback")
        origin = records.origin_of(half)
        store = self.store
        with self.lock:
            decided = self.decided(half)
            if decided.state is not None and decided.state is not state:
                self.stats["refused_conflicts"] += 1
                return EndResult(decided.state, None)
            if decided.op:
                self.stats["repeated"] += 1
                return EndResult(None, None)
            if state is TransactionState.ROLLBACK:  # its op is its only record: now
                op = store.put_nowait(records.op([records.op_entry(half)], state), 0,
                                      born_host, int(time.time() * 1000))
                if op.result.ok:
                    self._remember(origin, Decided(state, True))
                    self.stats["rollbacks"] += 1
                return EndResult(None, op)
            pending: PendingPut | None = None
            if decided.state is None:
                message, queue_id = records.committed(half)
                pending = store.put_nowait(message, queue_id, born_host, half.born_timestamp)
                if not pending.result.ok:
                    return EndResult(None, pending)
                self.stats["commits"] += 1
            else:
                self.stats["ops_repaired"] += 1  # the commit was there, its op was not
            # the op waits in the batch; until it is written the commit decides
            self._remember(origin, Decided(state, True))
            flushed = self._batch_op(records.op_entry(half))
            return EndResult(None, pending if flushed is None else flushed)

    # ---- the op batch -----------------------------------------------------------------------
    def _batch_op(self, entry: tuple[int, int]) -> PendingPut | None:
        """Under the lock: add a commit's op to the batch; the batch's put if that filled it."""
        batch = self._batch
        if not batch.entries:
            batch.since = time.monotonic()
            self.batch_wake.set()
        batch.entries.append(entry)
        batch.origins.add(entry[0])
        batch.body += len(str(entry[1])) + 1
        batch.keys += len(HALF_ORIGIN) + len(str(entry[0])) + 1
        if batch.body >= self.op_max_size or batch.keys >= records.OP_KEYS_MAX:
            return self.flush_ops()
        return None

    def batch_due(self) -> float | None:
        """Seconds until the batch is due (<= 0: now), or None when it is empty."""
        with self.lock:
            if not self._batch.entries:
                return None
            return self._batch.since + self.op_interval_s - time.monotonic()

    def flush_ops(self) -> PendingPut | None:
        """Write the batched ops as one op record now (None: there were none). If the put
        fails, the commits stand and their ops are written again by the check-back."""
        with self.lock:
            batch, self._batch = self._batch, _OpBatch()
            if not batch.entries:
                return None
            pending = self.store.put_nowait(records.op(batch.entries, TransactionState.COMMIT),
                                            0, NO_HOST, int(time.time() * 1000))
            if not pending.result.ok:
                self.drop_ops(batch)
            else:
                self.stats["op_batches"] += 1
            return pending

    def drop_ops(self, batch: _OpBatch | None = None) -> None:
        """Forget batched ops that will not be written (this store stops being a master, or
        their put failed): the check-back meets their commits without an op and writes it."""
        with self.lock:
            if batch is None:
                batch, self._batch = self._batch, _OpBatch()
            for origin, _ in batch.entries:
                if origin in self._recent:
                    self._recent[origin] = Decided(TransactionState.COMMIT, False)
            if batch.entries:
                self.stats["ops_dropped"] += len(batch.entries)
                log.info("event=transaction_ops_dropped count=%d: their commits decide them; "
                         "the check-back writes their ops", len(batch.entries))

    def _remember(self, origin: int, decided: Decided) -> None:
        recent = self._recent
        recent[origin] = decided
        recent.move_to_end(origin)
        while len(recent) > RECENT:
            gone, _ = recent.popitem(last=False)
            # an origin past the forgotten one may have ends this store no longer remembers
            self._fresh_from = max(self._fresh_from, gone + 1)

    def forget(self) -> None:
        """What was decided here lately may be gone (the log was cut back): the look-ups
        find what stayed."""
        with self.lock:
            self._recent.clear()
            self._tail.clear()
            self._tail_ids.clear()
            self._scanned = 0
            self._fresh_from = NEVER

    def on_truncate(self, _phy_offset: int) -> None:
        self.forget()

    def on_reset(self, _phy_offset: int) -> None:
        self.forget()

    def status(self) -> dict[str, int]:
        return dict(sorted(self.stats.items()))


class _Fresh:
    """A master service (started when this store becomes master, stopped when it stops being
    one): from the log's end at its start, every end written to this store is its own, so a
    transaction whose half comes after that point and that it did not end has no end: no
    look-up needed. A slave replicates ends it did not decide, so the shortcut ends there."""

    def __init__(self, owner: TransactionStore):
        self.owner = owner

    def start(self) -> None:
        with self.owner.lock:
            self.owner._fresh_from = self.owner.store.commit_log.max_offset

    def shutdown(self) -> None:
        with self.owner.lock:
            self.owner._fresh_from = NEVER


class _OpBatcher:
    """A master service: writes the op batch ``transactionOpBatchInterval`` after its first
    op (RocketMQ's ``TransactionalOpBatchService``). Stopped (its master stepping down, the
    store shutting down, both when this store may no longer write), it drops what is left."""

    def __init__(self, owner: TransactionStore):
        self.owner = owner
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="transaction-op-batch",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        owner = self.owner
        while not self._stop.is_set():
            owner.batch_wake.clear()  # before looking: a batch begun after is not missed
            due = owner.batch_due()
            if due is None:
                owner.batch_wake.wait(1.0)
                continue
            if due > 0:
                self._stop.wait(due)
                continue
            try:
                owner.flush_ops()
            except Exception:  # a broken put must not end the batcher; the ops are redone
                log.exception("event=transaction_op_batch_failed")

    def shutdown(self) -> None:
        self._stop.set()
        self.owner.batch_wake.set()
        self._thread.join(timeout=10)
        self.owner.drop_ops()


def _state(text: str | None) -> TransactionState | None:
    try:
        state = TransactionState(text)
    except ValueError:
        return None
    return None if state is TransactionState.UNKNOWN else state


def transaction_id(properties: Mapping[str, str]) -> tuple[str, str] | None:
    """A transaction's identity across the halves the client sent for it: (producer group,
    uniq key), None when the half has no uniq key."""
    uniq = properties.get(PROPERTY_UNIQ_KEY)
    return (properties.get(PRODUCER_GROUP, ""), uniq) if uniq else None


def _is_commit_of_id(msg: MessageExt | None, topic: str, ident: tuple[str, str],
                     body: bytes) -> bool:
    """A commit of the transaction ``ident``: the same producer group and uniq key, and the
    same body (a half sent again carries the one it had; an application that reused an id
    for another message is not taken for a retry)."""
    return (msg is not None and msg.topic == topic and HALF_ORIGIN in msg.properties
            and msg.sys_flag & SYSFLAG_TRANSACTION_MASK == TRANSACTION_COMMIT_TYPE
            and transaction_id(msg.properties) == ident and msg.body == body)


def _is_commit_of(msg: MessageExt | None, topic: str, origin: int) -> bool:
    return (msg is not None and msg.topic == topic
            and msg.properties.get(HALF_ORIGIN) == str(origin)
            and msg.sys_flag & SYSFLAG_TRANSACTION_MASK == TRANSACTION_COMMIT_TYPE)
