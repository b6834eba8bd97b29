"""Delay levels (RocketMQ ``ScheduleMessageService``).

A message sent with delay level L (1-based, ``messageDelayLevel``) is stored in topic
``SCHEDULE_TOPIC_XXXX``, queue L-1, with REAL_TOPIC / REAL_QID / DELAY properties; its
ConsumeQueue tagsCode is the delivery time. A thread on the master walks each level's queue
and, when an entry is due, re-puts the message into its real topic and queue.

Delivery progress (next schedule queue offset per level) is persisted in
``config/delayOffset.json`` after every pass. To deliver exactly once even when the process
dies between a re-put and that write, each delivered message carries ``__SCHED_SRC`` (the
schedule record's CommitLog offset), which reput indexes; after a start the service asks the
index whether an entry was delivered already before delivering it again.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

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
from common.format.tables import parse_delay_offsets, read_table

if TYPE_CHECKING:
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


def born_host_of(msg: MessageExt) -> tuple[str, int]:
    """A stored message's BORNHOST as the store's put takes it (ip, port)."""
    ip, _, port = msg.born_host.rpartition(":")
    return ip, int(port or 0)


class ScheduleService:
    def __init__(self, store: MessageStore, levels_ms: list[int]):
        self._store = store
        self.levels_ms = levels_ms
        self.path = Path(store.root) / "config" / "delayOffset.json"
        self.offsets: dict[int, int] = self._load()
        self._verify_after_start = True
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.delivered = 0

    def _load(self) -> dict[int, int]:
        """The file's progress; a file of the wrong shape is a ValueError naming it (the
        broker does not start on it, as on the other tables of ``config/``)."""
        return parse_delay_offsets(read_table(self.path), str(self.path))

    def persist(self) -> None:
        data = json.dumps({"offsetTable": {str(k): v for k, v in sorted(self.offsets.items())}})
        write_atomically(self.path, data.encode())

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="replog-schedule", daemon=True)
        self._thread.start()

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
            if not self._deliver(phy):
                break
            offset = q_off + 1
        self.offsets[level] = offset
        return offset != start

    def _deliver(self, phy: int) -> bool:
        store = self._store
        held = store.message_by_offset(phy)
        if held is None or PROPERTY_REAL_TOPIC not in held.properties:
            log.error("event=schedule_skip offset=%d reason=unreadable_or_not_delayed", phy)
            return True
        msg, queue_id = to_real_message(held)
        if self._verify_after_start:
            if self._delivered_before(msg.topic, phy):
                return True
            self._verify_after_start = False
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
        for found in index.query(topic, key, 4, 0, 2**62):
            msg = self._store.message_by_offset(found)
            if msg is not None and msg.properties.get(SCHEDULE_SOURCE) == str(phy):
                return True
        return False

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=10)
        self.persist()
