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
    HALF_ORIGIN,
    OP_STATE,
    OP_TOPIC,
    SYSFLAG_TRANSACTION_MASK,
    TRANSACTION_COMMIT_TYPE,
    TransactionState,
)
from common.store.transaction import records
from common.store.transaction.hook import HalfHook

if TYPE_CHECKING:
    from common.store.extensions import StoreExtensions
    from common.store.index import IndexDispatcher
    from common.store.message_store import MessageStore, PendingPut

log = logging.getLogger("replog.transaction")

RECENT = 65_536  # ends remembered (the look-up's first stop; the index holds them all)


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
        self.lock = threading.Lock()
        self.hook = HalfHook(indexed=False)
        self._recent: collections.OrderedDict[int, TransactionState] = \
            collections.OrderedDict()
        self.stats: collections.Counter[str] = collections.Counter()

    def install(self, ext: StoreExtensions, index: IndexDispatcher | None) -> None:
        """Before every other put hook: a half is never delayed or timed."""
        self.hook = HalfHook(indexed=index is not None)
        ext.add_put_hook(self.hook)
        ext.add_cut_listener(self)
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
        known = self._recent.get(origin)
        if known is not None:
            return Decided(known, True)
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
        for req in self.store.undispatched_records():
            if req.properties.get(HALF_ORIGIN) != str(origin):
                continue
            if req.topic == OP_TOPIC:
                state = _state(req.properties.get(OP_STATE))
                if state is not None:
                    return Decided(state, True)
            elif req.topic == real_topic:
                committed = True
        return Decided(TransactionState.COMMIT if committed else None, False)

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
            pending = store.put_nowait(records.op(half, state), 0, born_host,
                                       int(time.time() * 1000))
            if pending.result.ok:
                self._remember(origin, state)
                self.stats["commits" if state is TransactionState.COMMIT else "rollbacks"] += 1
                if decided.state is not None:
                    self.stats["ops_repaired"] += 1  # the commit was there, its op was not
            return EndResult(None, pending)

    def _remember(self, origin: int, state: TransactionState) -> None:
        recent = self._recent
        recent[origin] = state
        recent.move_to_end(origin)
        while len(recent) > RECENT:
            recent.popitem(last=False)

    def forget(self) -> None:
        """What was decided here lately may be gone (the log was cut back): the look-ups
        find what stayed."""
        with self.lock:
            self._recent.clear()

    def on_truncate(self, _phy_offset: int) -> None:
        self.forget()

    def on_reset(self, _phy_offset: int) -> None:
        self.forget()

    def status(self) -> dict[str, int]:
        return dict(sorted(self.stats.items()))


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
