"""A store's POP state (``state.py``), kept from the revive topic's records (``records.py``).

* **Every replica** applies the revive records in log order (a record dispatcher: reput hands
  them over as it indexes them), so a slave holds what its master handed out, acked and
  changed, and a promoted slave serves POP from there: acks are not lost (no flood of
  redeliveries) and redelivery counts go on.
* **A master** writes a record for each POP (``ck``), ACK (``ack``), change of invisible time
  (``chg``) and DLQ move (``dlq``), under the lock, and applies it at once (its ConsumeQueue
  offset is known at the append): the dispatch of a record already applied is skipped. The
  caller answers the client once the record is as durable as a SEND would be (SYNC_MASTER:
  replicated), so what a client was told survives a failover.
* **Checkpoint** (``config/popcheck``, every second when something changed, and at shutdown):
  the state and where it stands in the log. A start loads it and applies the revive records
  after it; a log cut below it (a member rejoining), or a recovered log that ends before it (a
  power loss took bytes the checkpoint had counted), rebuilds from the revive topic's first
  record.
* **A new master** applies every revive record its log holds before it hands anything out
  (``apply_tail``): in controller mode its reput has not dispatched the old master's last
  records yet (they wait for the confirmed offset), and the old master answered them. Records
  it has that the old master never answered are applied too: a hand-out is then counted that
  the consumer never saw (its count runs one ahead), an ack done that the consumer repeats.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import msgpack

from common.core.files import write_atomically
from common.core.message import PROPERTY_SHARDING_KEY
from common.core.pop import POP_RECORD, revive_topic
from common.core.subscription import EVERYTHING, Subscription
from common.format.record import parse, record_properties
from common.store.pop import records
from common.store.pop.records import Key, PopRecord
from common.store.pop.state import (
    Candidate,
    Out,
    QueueState,
    apply_change,
    apply_checkpoint,
    apply_resolve,
    choose,
)
from common.store.reput import tail_records

if TYPE_CHECKING:
    from common.store.extensions import DispatchRequest, StoreExtensions
    from common.store.message_store import MessageStore, PendingPut

log = logging.getLogger("replog.pop")

CHECKPOINT_INTERVAL_S = 1.0
FIGURES = ("popped", "redelivered", "acked", "acks_stale", "changed", "dlq", "skipped_records",
           "expired")
EXPIRED_PER_RECORD = 1024  # offsets one record resolves as gone (the rest: at the next POP)


class Popped(NamedTuple):
    """What a POP handed out: raw records, each one's times handed out and its handle (the
    ck record's CommitLog offset), its deadline; ``pending`` the ck record's put (None when
    nothing was handed out)."""

    records: list[bytes]
    offsets: list[int]
    attempts: list[int]
    handle: int
    deadline_ms: int
    pending: PendingPut | None
    next_offset: int


class Resolved(NamedTuple):
    """An ACK or a change: ``error`` (why nothing was done) or the put made (None: nothing to
    write, the message was resolved already); ``handle`` a change's new handle."""

    error: str
    pending: PendingPut | None
    handle: int = 0


GROUP_FIGURES = ("inFlight", "due", "redelivered", "backlog")


class PopStore:
    def __init__(self, store: MessageStore):
        self.store = store
        self.topic = revive_topic(store.cfg.brokerClusterName)
        self.lock = threading.RLock()
        self.queues: dict[Key, QueueState] = {}
        self.max_attempts: dict[Key, int] = {}
        self.applied_cq = 0  # the revive queue offset of the next record to apply
        self.applied_end = 0  # the CommitLog offset past the last record applied
        self.ready = False
        self._tail_applied = False  # a master applied every revive record of its log
        self.dirty = False
        self.path: Path = store.root / "config" / "popcheck"
        self.stats: dict[str, int] = dict.fromkeys(FIGURES, 0)
        self.last_pop: dict[str, int] = {}  # group -> when it last popped here (ms)
        self.redelivered: dict[str, int] = {}  # group -> hand-outs again, by this master
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def install(self, ext: StoreExtensions) -> None:
        ext.add_dispatcher(self)
        ext.add_cut_listener(self)
        ext.add_service("pop", self)
        ext.add_master_service("pop-tail", lambda: _TailApplied(self))

    def apply_tail(self) -> None:
        """Under the lock: apply the revive records of the log not applied yet (a master's,
        before its first operation: what reput has not dispatched)."""
        if not self._tail_applied:
            self._catch_up(self.applied_end)
            self._tail_applied = True

    # ---- applying records ---------------------------------------------------------------
    name = "pop"
    watches: tuple[str, ...] = (POP_RECORD,)

    def dispatch(self, req: DispatchRequest) -> None:
        if req.topic != self.topic:
            return
        with self.lock:
            if not self.ready or req.queue_offset < self.applied_cq:
                return
            self._apply_at(req.phy_offset, req.size, req.queue_offset)

    def _apply_at(self, phy: int, size: int, queue_offset: int) -> None:
        raw = self.store.commit_log.read_record(phy, size)
        rec = records.decode(_body(raw)) if raw is not None else None
        if rec is None:
            self.stats["skipped_records"] += 1
            log.warning("event=pop_record_unreadable offset=%d", phy)
        elif raw is None or not records.written_here(rec, record_properties(raw)):
            self.stats["skipped_records"] += 1  # a record of this topic the POP did not write
            log.warning("event=pop_record_not_ours offset=%d kind=%s", phy, rec.kind)
        else:
            self._apply(rec, phy)
        self.applied_cq = queue_offset + 1
        self.applied_end = max(self.applied_end, phy + size)
        self.dirty = True

    def _apply(self, rec: PopRecord, phy: int) -> None:
        state = self.queues.setdefault(rec.key, QueueState())
        if rec.kind == records.CK:
            if not rec.offsets and rec.next_after <= state.next:
                return
            apply_checkpoint(state, phy, rec.offsets, rec.attempts,
                             rec.groups or [None] * len(rec.offsets), rec.deadline_ms,
                             rec.next_after, rec.max_attempts)
            if rec.max_attempts:
                self.max_attempts[rec.key] = rec.max_attempts
        elif rec.kind in (records.ACK, records.DLQ):
            apply_resolve(state, rec.offsets, rec.handles)
        elif rec.kind == records.CHANGE:
            apply_change(state, rec.offsets[0], rec.handles[0], phy, rec.deadline_ms)

    # ---- a master's operations ----------------------------------------------------------
    def state(self, key: Key) -> QueueState | None:
        with self.lock:
            return self.queues.get(key)

    def pop(self, key: Key, start: Callable[[], int], max_nums: int, invisible_ms: int,
            now_ms: int, fifo: bool = False, sub: Subscription = EVERYTHING,
            max_attempts: int = 17, born_host: tuple[str, int] = ("0.0.0.0", 0)) -> Popped:
        """Hand out up to ``max_nums`` messages of ``key``'s queue: due ones again first, then
        new ones matching ``sub``. ``start``: where a group that never popped this queue
        begins (its committed offset, or its init mode's)."""
        _, topic, queue_id = key
        store = self.store
        with self.lock:
            self.apply_tail()
            self.last_pop[key[0]] = now_ms
            state = self.queues.get(key)
            if state is None:
                state = self.queues[key] = QueueState(next=start())
            limit = max_attempts
            fresh, scanned = self._fresh(key, state.next, max_nums, sub, fifo)
            again, new = choose(state, now_ms, max_nums, fresh, fifo, limit)
            kept = {off: self._record_of(topic, queue_id, off) for off in again}
            if None in kept.values() and self._expire(key, state, now_ms, born_host):
                again, new = choose(state, now_ms, max_nums, fresh, fifo, limit)
                kept = {off: kept[off] if off in kept else self._record_of(topic, queue_id, off)
                        for off in again}
            if len(new) < len(fresh):  # full, or (FIFO) a group blocked: go on from there
                scanned = new[-1].offset + 1 if new else state.next
            groups_of = {c.offset: c.group for c in new}
            chosen: list[int] = []
            raws: list[bytes] = []
            for off in again:
                raw = kept[off]
                if raw is not None:  # gone with its segment: nothing to hand out
                    chosen.append(off)
                    raws.append(raw)
            for c in new:
                chosen.append(c.offset)
                raws.append(c.raw)
            groups = [state.out[o].group if o in state.out else groups_of.get(o)
                      for o in chosen]
            attempts = [state.out[o].attempts + 1 if o in state.out else 1 for o in chosen]
            next_after = max(state.next, scanned)
            if not chosen:
                state.next = next_after  # nothing matched up to there: not written, a
                return Popped([], [], [], 0, 0, None, state.next)  # replica rescans it
            deadline = now_ms + invisible_ms
            rec = records.ck(key, chosen, attempts, groups, deadline, next_after, limit)
            pending = store.put_nowait(rec.message(self.topic), 0, born_host, now_ms)
            if not pending.result.ok:
                return Popped([], [], [], 0, 0, pending, state.next)
            phy = pending.result.phy_offset
            apply_checkpoint(state, phy, chosen, attempts, groups, deadline, next_after, limit)
            self.max_attempts[key] = limit
            self._applied(pending)
            again_count = sum(1 for a in attempts if a > 1)
            self.stats["popped"] += len(chosen)
            self.stats["redelivered"] += again_count
            self.redelivered[key[0]] = self.redelivered.get(key[0], 0) + again_count
        return Popped(raws, chosen, attempts, phy, deadline, pending, state.next)

    def _expire(self, key: Key, state: QueueState, now_ms: int,
                born_host: tuple[str, int]) -> bool:
        """Resolve the offsets out below the queue's min offset (retention deleted their
        records): never handed out again, each held a POP's slot, or its message group, for
        good. One ``ack`` record, so every replica resolves them too; whether any were."""
        _, topic, queue_id = key
        low = self.store.min_queue_offset(topic, queue_id)
        gone = sorted(off for off in state.out if off < low)[:EXPIRED_PER_RECORD]
        if not gone:
            return False
        rec = records.resolve(records.ACK, key, gone, [state.out[o].handle for o in gone])
        pending = self.store.put_nowait(rec.message(self.topic), 0, born_host, now_ms)
        if not pending.result.ok:
            return False
        apply_resolve(state, rec.offsets, rec.handles)
        self._applied(pending)
        self.stats["expired"] += len(gone)
        log.warning("event=pop_expired group=%s topic=%s queue=%d offsets=%d below=%d: "
                    "deleted by retention while out, resolved", key[0], topic, queue_id,
                    len(gone), low)
        return True

    def _fresh(self, key: Key, start: int, max_nums: int, sub: Subscription,
               fifo: bool) -> tuple[list[Candidate], int]:
        """The queue's messages from ``start`` (or its min offset, if retention deleted
        what was there) that match ``sub`` (at most ``max_nums``), and the offset the read
        stopped at."""
        _, topic, queue_id = key
        start = max(start, self.store.min_queue_offset(topic, queue_id))
        got = self.store.get_message(key[0], topic, queue_id, start, max_nums, sub.codes,
                                     tags=sub.tags, selector=sub.selector)
        out = []
        for raw in got.records:
            offset, group = _header_of(raw, fifo)
            out.append(Candidate(offset, group, raw))
        return out, max(start, got.next_begin_offset)

    def _record_of(self, topic: str, queue_id: int, offset: int) -> bytes | None:
        got = self.store.get_message("", topic, queue_id, offset, 1)
        return got.records[0] if got.records else None

    def _applied(self, pending: PendingPut) -> None:
        result = pending.result
        self.applied_cq = max(self.applied_cq, result.queue_offset + 1)
        self.applied_end = max(self.applied_end, result.end_phy_offset)
        self.dirty = True

    def ack(self, key: Key, offset: int, handle: int, now_ms: int,
            born_host: tuple[str, int] = ("0.0.0.0", 0), kind: str = records.ACK) -> Resolved:
        with self.lock:
            self.apply_tail()
            state = self.queues.get(key)
            error = _check_handle(state, key, offset, handle, kind)
            if error is not None:
                if error == "":
                    return Resolved("", None)  # resolved already: nothing to do
                self.stats["acks_stale"] += 1
                return Resolved(error, None)
            assert state is not None
            rec = records.resolve(kind, key, [offset], [handle])
            pending = self.store.put_nowait(rec.message(self.topic), 0, born_host, now_ms)
            if pending.result.ok:
                apply_resolve(state, [offset], [handle])
                self._applied(pending)
                self.stats["dlq" if kind == records.DLQ else "acked"] += 1
            return Resolved("", pending)

    def ack_many(self, key: Key, entries: list[tuple[int, int]], now_ms: int,
                 born_host: tuple[str, int] = ("0.0.0.0", 0)) -> tuple[list[tuple[int, str]],
                                                                   PendingPut | None]:
        """Ack several (offset, handle) of one queue with one record: ((the index in
        ``entries`` and why) of each one that could not be, the put made; None: nothing to
        write)."""
        with self.lock:
            self.apply_tail()
            state = self.queues.get(key)
            errors: list[tuple[int, str]] = []
            good = []
            for i, (offset, handle) in enumerate(entries):
                error = _check_handle(state, key, offset, handle, records.ACK)
                if error is None:
                    good.append((offset, handle))
                elif error:
                    errors.append((i, error))
            self.stats["acks_stale"] += len(errors)
            if not good or state is None:
                return errors, None
            rec = records.resolve(records.ACK, key, [o for o, _ in good], [h for _, h in good])
            pending = self.store.put_nowait(rec.message(self.topic), 0, born_host, now_ms)
            if pending.result.ok:
                apply_resolve(state, rec.offsets, rec.handles)
                self._applied(pending)
                self.stats["acked"] += len(good)
            return errors, pending

    def change(self, key: Key, offset: int, handle: int, invisible_ms: int, now_ms: int,
               born_host: tuple[str, int] = ("0.0.0.0", 0)) -> Resolved:
        with self.lock:
            self.apply_tail()
            state = self.queues.get(key)
            error = _check_handle(state, key, offset, handle, records.CHANGE)
            if error is not None:
                self.stats["acks_stale"] += 1
                return Resolved(error or (f"offset {offset} of {key[1]} queue {key[2]} was "
                                          "acked already: nothing to change"), None)
            assert state is not None
            deadline = now_ms + invisible_ms
            rec = records.change(key, offset, handle, deadline)
            pending = self.store.put_nowait(rec.message(self.topic), 0, born_host, now_ms)
            if not pending.result.ok:
                return Resolved("", pending)
            phy = pending.result.phy_offset
            apply_change(state, offset, handle, phy, deadline)
            self._applied(pending)
            self.stats["changed"] += 1
            return Resolved("", pending, phy)

    def due_for_dlq(self, now_ms: int) -> list[tuple[Key, int, Out]]:
        """Offsets whose deadline passed that were handed out as many times as allowed."""
        with self.lock:
            found = []
            for key, state in self.queues.items():
                for off in sorted(state.maxed):
                    o = state.out.get(off)
                    if o is not None and o.deadline_ms <= now_ms:
                        found.append((key, off, Out(o.deadline_ms, o.attempts, o.handle,
                                                    o.group)))
            return found

    def next_deadline(self, keys: list[Key]) -> int | None:
        """The earliest deadline of what ``keys`` hold out (ms since the epoch)."""
        with self.lock:
            found = [d for d in (self.queues[k].next_deadline() for k in keys
                                 if k in self.queues) if d is not None]
            return min(found) if found else None

    def active(self, group: str, now_ms: int, within_ms: int = 60_000) -> bool:
        """Whether ``group`` consumes by POP here: it popped within ``within_ms``, or holds
        messages out."""
        with self.lock:
            if now_ms - self.last_pop.get(group, -within_ms - 1) <= within_ms:
                return True
            return any(s.out for k, s in self.queues.items() if k[0] == group)

    def figures(self, now_ms: int) -> dict[str, Any]:
        """The counters, totals, and per group: in flight, due again, redelivered, and
        backlog (messages of the queues it popped not handed out yet: its lag, with what it
        holds out)."""
        with self.lock:
            groups: dict[str, dict[str, int]] = {}
            nexts = []
            for (group, topic, queue_id), s in self.queues.items():
                g = groups.setdefault(group, dict.fromkeys(GROUP_FIGURES, 0))
                flying = s.in_flight(now_ms)
                g["inFlight"] += flying
                g["due"] += len(s.out) - flying
                nexts.append((g, topic, queue_id, s.next))
            for group, n in self.redelivered.items():
                groups.setdefault(group, dict.fromkeys(GROUP_FIGURES, 0))
                groups[group]["redelivered"] = n
            figures = {**self.stats, "queues": len(self.queues),
                       "inFlight": sum(g["inFlight"] for g in groups.values()),
                       "due": sum(g["due"] for g in groups.values()), "groups": groups}
        # the queues' ends are read outside the lock (the reput thread takes it after them)
        for g, topic, queue_id, next_offset in nexts:
            g["backlog"] += max(0, self.store.max_queue_offset(topic, queue_id) - next_offset)
        return figures

    # ---- the store service: load, checkpoint, cuts --------------------------------------
    def start(self) -> None:
        with self.lock:
            self._load()
            log_end = self.store.commit_log.max_offset
            if self.applied_end > log_end:
                # the checkpoint covers records the recovered log lost (written before they
                # were flushed, then a power loss): rebuild from what the log holds
                log.warning("event=popcheck_ahead_of_log checkpoint_end=%d log_end=%d: "
                            "rebuilt from the revive topic", self.applied_end, log_end)
                self.queues.clear()
                self.max_attempts.clear()
                self._start_of_topic()
            self._catch_up(self.applied_end)
            self.ready = True
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="replog-pop-checkpoint",
                                        daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.save()

    def _run(self) -> None:
        while not self._stop.wait(CHECKPOINT_INTERVAL_S):
            try:
                self.save()
            except OSError:
                log.exception("event=pop_checkpoint_failed")

    def save(self) -> None:
        with self.lock:
            if not self.dirty or not self.ready:
                return
            doc = {"v": 1, "cq": self.applied_cq, "end": self.applied_end,
                   "queues": [[list(k), s.next, [[off, o.deadline_ms, o.attempts, o.handle,
                                                  o.group] for off, o in s.out.items()],
                               self.max_attempts.get(k, 0)]
                              for k, s in self.queues.items()]}
            self.dirty = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, msgpack.packb(doc))

    def _load(self) -> None:
        self.queues.clear()
        self.max_attempts.clear()
        self.applied_cq = self.applied_end = 0
        try:
            doc: Any = msgpack.unpackb(self.path.read_bytes(), strict_map_key=False)
            for key, nxt, outs, limit in doc["queues"]:
                k = (str(key[0]), str(key[1]), int(key[2]))
                state = self.queues[k] = QueueState(int(nxt))
                for o in outs:
                    out = Out(int(o[1]), int(o[2]), int(o[3]), o[4])
                    state.put(int(o[0]), out)
                    if limit and out.attempts >= int(limit):
                        state.maxed.add(int(o[0]))
                if limit:
                    self.max_attempts[k] = int(limit)
            self.applied_cq, self.applied_end = int(doc["cq"]), int(doc["end"])
        except FileNotFoundError:
            self._start_of_topic()
        except (ValueError, KeyError, TypeError, IndexError, msgpack.UnpackException) as e:
            log.error("event=popcheck_unreadable path=%s error=%r: rebuilt from the revive "
                      "topic", self.path, e)
            self.queues.clear()
            self.max_attempts.clear()
            self._start_of_topic()

    def _start_of_topic(self) -> None:
        """Rebuild from the first revive record the log still holds."""
        store = self.store
        cq = store.cq_store.get(self.topic, 0)
        self.applied_cq, self.applied_end = 0, store.commit_log.min_offset
        if cq is None:
            return
        first = cq.min_queue_offset
        entries = cq.entries(first, 1)
        if entries:
            self.applied_cq, self.applied_end = first, entries[0][1]

    def _catch_up(self, start: int) -> None:
        """Apply the revive records in the log from ``start``, by the revive queue (what
        reput indexed), then past it (what it has not yet)."""
        store = self.store
        cq = store.cq_store.get(self.topic, 0)
        if cq is not None:
            offset = max(self.applied_cq, cq.min_queue_offset)
            while offset < cq.max_queue_offset:
                entries = cq.entries(offset, 1024)
                if not entries:
                    break
                for q_off, phy, size, _code in entries:
                    if phy >= start or q_off >= self.applied_cq:
                        self._apply_at(phy, size, q_off)
                    offset = q_off + 1
        for req in tail_records(store.commit_log, max(start, store.dispatched_phy_offset),
                                store.extensions):
            if req.topic == self.topic and req.queue_offset >= self.applied_cq:
                self._apply_at(req.phy_offset, req.size, req.queue_offset)

    def on_truncate(self, phy_offset: int) -> None:
        with self.lock:
            self._tail_applied = False
            if self.applied_end <= phy_offset:
                return  # nothing applied was cut
            self.queues.clear()
            self.max_attempts.clear()
            try:
                self._load()
            except OSError:
                pass
            if self.applied_end > phy_offset:
                self.queues.clear()
                self.max_attempts.clear()
                self._start_of_topic()
            self._catch_up(self.applied_end)
            self.dirty = True

    def on_reset(self, phy_offset: int) -> None:
        with self.lock:
            self._tail_applied = False
            self.queues.clear()
            self.max_attempts.clear()
            self.applied_cq, self.applied_end = 0, phy_offset
            self.dirty = True


class _TailApplied:
    """A master service: a new master applies its log's revive records as it starts (and on
    its first operation, if the service had not started then); one stepping down forgets it
    did (what it applies next comes by dispatch, and again when it is master next)."""

    def __init__(self, owner: PopStore):
        self.owner = owner

    def start(self) -> None:
        with self.owner.lock:
            self.owner._tail_applied = False
            self.owner.apply_tail()

    def shutdown(self) -> None:
        with self.owner.lock:
            self.owner._tail_applied = False


def _check_handle(state: QueueState | None, key: Key, offset: int, handle: int,
                  kind: str) -> str | None:
    """None: the handle is the offset's newest; "": resolved already (an ACK is then done);
    else why it cannot be used."""
    where = f"offset {offset} of {key[1]} queue {key[2]} for group {key[0]}"
    if state is None or offset >= state.next:
        return f"{where} was never handed out by this broker"
    o = state.out.get(offset)
    if o is None:
        return ""
    if o.handle != handle:
        return (f"the receipt handle of {where} is not its newest (it was handed out again, "
                f"or its invisible time changed, since): use the newest one")
    return None


def _body(raw: bytes) -> bytes:
    return bytes(parse(raw).body)


def _header_of(raw: bytes, fifo: bool) -> tuple[int, str | None]:
    """(queue offset, message group if ``fifo``) of a whole record."""
    offset = parse(raw).header.queue_offset
    return offset, record_properties(raw).get(PROPERTY_SHARDING_KEY) if fifo else None
