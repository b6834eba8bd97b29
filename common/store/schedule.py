"""Delay levels (RocketMQ ``ScheduleMessageService``).

A message sent with delay level L (1-based, ``messageDelayLevel``) is stored in topic
``SCHEDULE_TOPIC_XXXX``, queue L-1, with REAL_TOPIC / REAL_QID / DELAY properties; its
ConsumeQueue tagsCode is the delivery time. A thread on the master walks each level's queue
and, when an entry is due, re-puts the message into its real topic and queue.

Exactly once, by the log: each delivered message carries ``__SCHED_SRC`` (the schedule record's
CommitLog offset), which reput indexes on every broker, master or slave. A level's entries are
delivered in queue order, so what one log holds delivered is a prefix of the level's queue;
when the service starts (a start, a promotion, an election) it finds each level's first entry
that its own log holds no delivery of (the index, and the records past the confirmed offset
that reput has not indexed yet), by binary search, and goes on from there. Progress written in
``config/delayOffset.json`` (after every pass, and copied to slaves) is only where the search
looks first: a file ahead of the log (a slave elected with a log behind its copy) or behind it
(a crash between a delivery and the write) costs look-ups, never a skipped or second delivery.
Without ``messageIndexEnable`` the file is all there is: deliveries after its last write may
be made again after a crash.

Only a master whose writes are open delivers: ``gate`` (the broker's ``write_refusal``) says
why not otherwise (a controller lease that is not fresh, a lost election, a stand-by), and then
nothing is delivered. Deliveries reach consumers only once confirmed (``MessageStore``'s
confirmed offset), like any write; one lost with its master in a failover is delivered again
by the next master, whose log holds no delivery of it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.core.errors import PutStatus
from common.core.files import write_atomically
from common.core.message import (
    PROPERTY_DELAY,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    SCHEDULE_SOURCE,
    SCHEDULE_TOPIC,
    Message,
    MessageExt,
)
from common.format import boundary
from common.format.tables import parse_delay_offsets, read_table

if TYPE_CHECKING:
    from common.store.extensions import StoreExtensions
    from common.store.index import IndexDispatcher
    from common.store.message_store import MessageStore

log = logging.getLogger("replog.store")

MAX_PER_PASS = 1024
IDLE_WAIT_S = 0.05


def to_schedule_message(msg: Message, queue_id: int, levels: int) -> tuple[Message, int]:
    """The message as stored until due, and its schedule queue (level - 1)."""
    level = min(max(msg.delay_level, 1), levels)
    props = dict(msg.properties)
    props[PROPERTY_REAL_TOPIC] = msg.topic
    props[PROPERTY_REAL_QID] = str(queue_id)
    held = Message(SCHEDULE_TOPIC, msg.body, tags=msg.tags, keys=msg.keys, properties=props,
                   flag=msg.flag, delay_level=level, reconsume_times=msg.reconsume_times,
                   sys_flag=msg.sys_flag)
    return held, level - 1


def to_real_message(held: MessageExt) -> tuple[Message, int]:
    """The due message for its real topic and queue, marked with its schedule source."""
    props = dict(held.properties)
    topic = props.pop(PROPERTY_REAL_TOPIC)
    queue_id = int(props.pop(PROPERTY_REAL_QID, "0"))
    props.pop(PROPERTY_DELAY, None)
    tags = props.pop("TAGS", None)
    keys = props.pop("KEYS", None)
    props[SCHEDULE_SOURCE] = str(held.commit_log_offset)
    return Message(topic, held.body, tags=tags, keys=keys, properties=props, flag=held.flag,
                   reconsume_times=held.reconsume_times, sys_flag=held.sys_flag), queue_id


class DelayLevels:
    """Delay levels as store extensions (``common/store/extensions.py``): a put hook that
    stores a delayed message in the schedule topic, the schedule topic's tagsCode (the delivery
    time), the index of each delivery's source offset, and the delivering service, which only a
    master runs. ``service`` is the current one (idle on a slave: its offsets file is what a
    slave copies from its master)."""

    name = "delay-levels"
    triggers: frozenset[str] = frozenset()  # acts on a delay level, which every hook sees

    def __init__(self, store: MessageStore, levels_ms: list[int]):
        self._store = store
        self.levels_ms = levels_ms
        self.service = ScheduleService(store, levels_ms)

    def install(self, ext: StoreExtensions, index: IndexDispatcher | None) -> None:
        ext.add_put_hook(self)
        ext.add_tags_code_rule(SCHEDULE_TOPIC, self.tags_code, watches=(PROPERTY_DELAY,))
        ext.watch(SCHEDULE_SOURCE)  # resume_offsets reads it in the records not dispatched yet
        if index is not None:
            index.index_property(SCHEDULE_SOURCE)
        ext.add_master_service("schedule", self.new_service)

    def before_put(self, msg: Message, queue_id: int) -> tuple[Message, int] | None:
        if msg.delay_level > 0 and msg.topic != SCHEDULE_TOPIC:
            return to_schedule_message(msg, queue_id, len(self.levels_ms))
        return None

    def tags_code(self, props: Mapping[str, str], store_ts: int, tag_hash: int) -> int:
        """The delivery time: what the level's queue is walked by."""
        if PROPERTY_DELAY not in props:
            return tag_hash
        level = min(max(int(props[PROPERTY_DELAY]), 1), len(self.levels_ms))
        return store_ts + self.levels_ms[level - 1]

    def new_service(self) -> ScheduleService:
        self.service = ScheduleService(self._store, self.levels_ms, self._store.delivery_gate)
        return self.service


def born_host_of(msg: MessageExt) -> tuple[str, int]:
    """A stored message's BORNHOST as the store's put takes it (ip, port)."""
    ip, _, port = msg.born_host.rpartition(":")
    return ip, int(port or 0)


class ScheduleService:
    def __init__(self, store: MessageStore, levels_ms: list[int],
                 gate: Callable[[], str] | None = None):
        self._store = store
        self.levels_ms = levels_ms
        self.path = Path(store.root) / "config" / "delayOffset.json"
        self.offsets: dict[int, int] = self._load()  # where the start-up search looks first
        self.gate = gate  # "" while this broker may write; else why not (nothing delivered)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.delivered = 0
        self.gated = 0  # passes that delivered nothing because the gate was shut
        self.refused = 0  # held records skipped: their target is not one (boundary.py)

    def _load(self) -> dict[int, int]:
        """The file's progress; a file of the wrong shape is a ValueError naming it (the
        broker does not start on it, as on the other tables of ``config/``)."""
        return parse_delay_offsets(read_table(self.path), str(self.path))

    def persist(self) -> None:
        data = json.dumps({"offsetTable": {str(k): v for k, v in sorted(self.offsets.items())}})
        write_atomically(self.path, data.encode())

    def start(self) -> None:
        self.offsets = self.resume_offsets()
        self._thread = threading.Thread(target=self._run, name="replog-schedule", daemon=True)
        self._thread.start()

    # ---- where each level stands, by this store's own log -----------------------------------
    def resume_offsets(self) -> dict[int, int]:
        """Level -> its first entry this store's log holds no delivery of."""
        store = self._store
        pending = {int(req.properties[SCHEDULE_SOURCE]) for req in store.undispatched_records()
                   if SCHEDULE_SOURCE in req.properties}
        out: dict[int, int] = {}
        for level in range(1, len(self.levels_ms) + 1):
            cq = store.cq_store.get(SCHEDULE_TOPIC, level - 1)
            if cq is not None:
                out[level] = self._first_undelivered(cq, self.offsets.get(level, 0), pending)
        return out

    def _first_undelivered(self, cq: Any, hint: int, pending: set[int]) -> int:
        lo, hi = cq.min_queue_offset, cq.max_queue_offset
        hint = min(max(hint, lo), hi)
        if self._store.index is None:
            return hint  # no index: the file's word

        def delivered(queue_offset: int) -> bool:
            entry = cq.get(queue_offset)
            if entry is None:
                return True  # gone (retention): nothing to deliver
            phy = entry[0]
            return phy in pending or self._was_delivered(phy)

        if (hint == lo or delivered(hint - 1)) and (hint == hi or not delivered(hint)):
            return hint
        while lo < hi:  # deliveries are a prefix of the queue: the first one missing
            mid = (lo + hi) // 2
            if delivered(mid):
                lo = mid + 1
            else:
                hi = mid
        if lo != hint:
            log.warning("event=schedule_resumed_elsewhere queue=%d file_offset=%d "
                        "log_offset=%d", cq.queue_id, hint, lo)
        return lo

    def _was_delivered(self, phy: int) -> bool:
        held = self._store.entry_message(phy)
        if held is None or PROPERTY_REAL_TOPIC not in held.properties:
            return True  # unreadable: skipped when met, as if delivered
        return self._delivered_before(held.properties[PROPERTY_REAL_TOPIC], phy)

    def _run(self) -> None:
        while not self._stop.is_set():
            moved = False
            try:
                moved = self.deliver_due(int(time.time() * 1000))
            except Exception:
                log.exception("event=schedule_pass_failed")
            if moved:
                self.persist()
            self._stop.wait(IDLE_WAIT_S)

    def deliver_due(self, now_ms: int) -> bool:
        """One pass over every level; True when any progress was made."""
        moved = False
        for level in range(1, len(self.levels_ms) + 1):
            moved |= self._deliver_level(level, now_ms)
        return moved

    def _deliver_level(self, level: int, now_ms: int) -> bool:
        store = self._store
        cq = store.cq_store.get(SCHEDULE_TOPIC, level - 1)
        if cq is None:
            return False
        offset = max(self.offsets.get(level, 0), cq.min_queue_offset)
        start = offset
        for q_off, phy, _size, deliver_at in cq.entries(offset, MAX_PER_PASS):
            if deliver_at > now_ms:
                break
            if self.gate is not None and self.gate():
                self.gated += 1  # not a writable master now: nothing is delivered
                break
            if not self._deliver(phy):
                break
            offset = q_off + 1
        self.offsets[level] = offset
        return offset != start

    def _deliver(self, phy: int) -> bool:
        store = self._store
        held = store.entry_message(phy)
        if held is None or PROPERTY_REAL_TOPIC not in held.properties:
            log.error("event=schedule_skip offset=%d reason=unreadable_or_not_delayed", phy)
            return True
        why = boundary.delivery_refusal(held.properties[PROPERTY_REAL_TOPIC],
                                        held.properties.get(PROPERTY_REAL_QID, "0"))
        if why is not None:  # not a record this broker held: skipped, never retried
            self.refused += 1
            log.error("event=schedule_skip offset=%d reason=refused_target (%s)", phy, why)
            return True
        msg, queue_id = to_real_message(held)
        # delivered as RocketMQ's messageTimeup does: born time, born host and reconsume count
        # are the original's, the store time is now
        result = store.put(msg, queue_id, born_host_of(held), held.born_timestamp)
        if result.status is PutStatus.PUT_OK or result.status.stored:
            self.delivered += 1
            return True
        log.warning("event=schedule_put_failed offset=%d status=%s", phy, result.status.name)
        return False

    def _delivered_before(self, topic: str, phy: int) -> bool:
        index = self._store.index
        if index is None:
            return False
        key = SCHEDULE_SOURCE + str(phy)

        def delivers(found: int) -> bool:
            msg = self._store.entry_message(found)
            return msg is not None and msg.properties.get(SCHEDULE_SOURCE) == str(phy)

        # every hit read: a client's keys may share the key's hash, as many as it likes
        return index.find(topic, key, delivers) is not None

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=10)
        self.persist()
