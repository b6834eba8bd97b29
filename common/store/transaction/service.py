"""A store's transactions: the half hook, the state of a transaction, and its end, decided once.

The state of a transaction is what its records say, found by its origin (``HALF_ORIGIN``,
indexed on every broker): an op record (and its ``OP_STATE``), or a commit without its op yet
(the end was cut short between the two writes). The look-up reads the index, then the records
not dispatched yet (past the confirmed offset), and first a memory of the ends decided here
lately. No op map is loaded or kept in order (RocketMQ's, whose load and backlog lost or
stalled halves): a state is one look-up, wherever and whenever its records were written.

An end is decided under one lock: look up, then write the commit (if a commit, and none is
there) and the op. Once an op is written, a different end is refused and the same one is
answered without a write: a final state is final.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, NamedTuple

from common.core.message import PROPERTY_REAL_TOPIC, MessageExt
from common.core.transaction import (
    CHECK_MAX_TOPIC,
    HALF_ORIGIN,
    HALF_TOPIC,
    OP_STATE,
    OP_TOPIC,
    SYSFLAG_TRANSACTION_MASK,
    TRANSACTION_COMMIT_TYPE,
    TransactionState,
)
from common.store.reput import tail_records
from common.store.transaction import records
from common.store.transaction.hook import HalfHook

if TYPE_CHECKING:
    from common.store.extensions import StoreExtensions
    from common.store.index import IndexDispatcher
    from common.store.message_store import MessageStore, PendingPut

log = logging.getLogger("replog.transaction")

RECENT = 65_536  # ends remembered (the look-up's first stop; the index holds them all)
FIGURES = ("commits", "rollbacks", "repeated", "refused_conflicts", "ops_repaired", "fresh")
NEVER = 2**63  # no shortcut: every look-up reads the index
TAIL_KEPT = 4096  # ends read past the dispatched offset, kept until reput passed them
NOT_AN_END = (HALF_TOPIC, CHECK_MAX_TOPIC)  # records of a transaction that decide nothing


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
        self.hook = HalfHook(indexed=False)
        self._recent: collections.OrderedDict[int, Decided] = collections.OrderedDict()
        # a master's: a transaction whose half is at or past this offset, and not in _recent,
        # has no end (every end since is this store's own, remembered; see ``_Fresh``)
        self._fresh_from = NEVER
        self.stats: collections.Counter[str] = collections.Counter(dict.fromkeys(FIGURES, 0))

    def install(self, ext: StoreExtensions, index: IndexDispatcher | None) -> None:
        """Before every other put hook: a half is never delayed or timed."""
        self.hook = HalfHook(indexed=index is not None)
        ext.add_put_hook(self.hook)
        ext.add_cut_listener(self)
        ext.add_master_service("transaction-fresh", lambda: _Fresh(self))
        ext.watch(HALF_ORIGIN)  # found in the records not dispatched yet
        if index is not None:
            index.index_property(HALF_ORIGIN)

    # ---- look-ups ---------------------------------------------------------------------------
    def half_at(self, offset: int) -> MessageExt | None:
        """The half message stored at ``offset``, or None if no half starts there."""
        found = self.store.entry_message(offset)
        return found if found is not None and records.is_half_record(found) else None

    def decided(self, half: MessageExt) -> Decided:
        origin = records.origin_of(half)
        with self.lock:
            known = self._recent.get(origin)
            if known is not None:
                return known
            if origin >= self._fresh_from:  # no one but this store ended it, and it did not
                self.stats["fresh"] += 1
                return Decided(None, False)
        key = HALF_ORIGIN + str(origin)
        real_topic = half.properties[PROPERTY_REAL_TOPIC]
        committed = False
        index = self.store.index
        if index is not None:
            for offset in index.query(OP_TOPIC, key, 16, 0, 2**62):
                state = self._op_state(self.store.entry_message(offset), origin)
                if state is not None:
                    return Decided(state, True)
            for offset in index.query(real_topic, key, 16, 0, 2**62):
                if _is_commit_of(self.store.entry_message(offset), real_topic, origin):
                    committed = True
                    break
        with self.lock:
            in_tail = self._in_tail(origin)
        if in_tail is not None and (in_tail.op or not committed):
            return in_tail
        return Decided(TransactionState.COMMIT if committed else None, False)

    def _in_tail(self, origin: int) -> Decided | None:
        """Under the lock: the end of ``origin`` among the records reput has not dispatched
        (so not indexed) yet. Each record is read once: what was read is kept, by origin,
        until reput has passed it."""
        store = self.store
        dispatched = store.dispatched_phy_offset
        start = max(self._scanned, dispatched)
        if start < store.commit_log.max_offset:
            for req in tail_records(store.commit_log, start, store.extensions):
                start = req.phy_offset + req.size
                text = req.properties.get(HALF_ORIGIN, "")
                if not text.isdigit() or req.topic in NOT_AN_END:
                    continue
                if req.topic == OP_TOPIC:
                    state = _state(req.properties.get(OP_STATE))
                    if state is not None:
                        self._tail[int(text)] = (Decided(state, True), req.phy_offset)
                elif int(text) not in self._tail:  # a commit (in its real topic)
                    self._tail[int(text)] = (Decided(TransactionState.COMMIT, False),
                                             req.phy_offset)
            self._scanned = start
        if len(self._tail) > TAIL_KEPT:  # reput indexed them meanwhile: the index has them
            self._tail = {k: v for k, v in self._tail.items() if v[1] >= dispatched}
        found = self._tail.get(origin)
        return found[0] if found is not None else None

    @staticmethod
    def _op_state(msg: MessageExt | None, origin: int) -> TransactionState | None:
        if msg is None or msg.topic != OP_TOPIC or msg.properties.get(HALF_ORIGIN) != str(origin):
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
            if decided.state is None and state is TransactionState.COMMIT:
                message, queue_id = records.committed(half)
                pending = store.put_nowait(message, queue_id, born_host, half.born_timestamp)
                if not pending.result.ok:
                    return EndResult(None, pending)
                self._remember(origin, Decided(state, False))  # until its op is written
            pending = store.put_nowait(records.op(half, state), 0, born_host,
                                       int(time.time() * 1000))
            if pending.result.ok:
                self._remember(origin, Decided(state, True))
                self.stats["commits" if state is TransactionState.COMMIT else "rollbacks"] += 1
                if decided.state is not None:
                    self.stats["ops_repaired"] += 1  # the commit was there, its op was not
            return EndResult(None, pending)

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


def _state(text: str | None) -> TransactionState | None:
    try:
        state = TransactionState(text)
    except ValueError:
        return None
    return None if state is TransactionState.UNKNOWN else state


def _is_commit_of(msg: MessageExt | None, topic: str, origin: int) -> bool:
    return (msg is not None and msg.topic == topic
            and msg.properties.get(HALF_ORIGIN) == str(origin)
            and msg.sys_flag & SYSFLAG_TRANSACTION_MASK == TRANSACTION_COMMIT_TYPE)
