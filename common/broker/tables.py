"""A broker's tables under ``<storePathRootDir>/config/``: topics and consumer offsets.

The files' shapes, their checks and atomic writes are ``common/format/tables.py``; these
classes hold the tables in memory, thread-safe, and write them when they change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.format.tables import (
    OFFSETS_FILE,
    PERM_READ_WRITE,
    TOPICS_FILE,
    atomic_write_json,
    json_bytes,
    loads,
    parse_offsets,
    parse_topic_attributes,
    parse_topic_perms,
    parse_topics,
    read_table,
)

MESSAGE_TYPE = "message.type"  # RocketMQ 5's topic attribute: NORMAL, FIFO, DELAY, TRANSACTION
MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")


class TopicTableFull(ValueError):
    """A topic would not fit in the table (``TopicTable.admit`` says why)."""


class TopicTable:
    """Topic -> queue count, persisted in ``config/topics.json``; thread-safe."""

    def __init__(self, config_dir: Path):
        self.path = config_dir / TOPICS_FILE
        self._lock = threading.Lock()
        doc = read_table(self.path)
        self._queues, self._counter = parse_topics(doc, str(self.path))
        self._perms = parse_topic_perms(doc, str(self.path))  # kept as read; new topics 6
        self._attrs = parse_topic_attributes(doc, str(self.path))  # e.g. message.type
        self.on_change: Callable[[], None] | None = None  # after a topic is made or grown
        # (queues, perms) the table would hold -> "" if that may be, else why not: in
        # controller mode the table must fit in the znode its routes are published in
        self.admit: Callable[[dict[str, int], dict[str, int]], str] | None = None

    def merge_seen(self, seen: dict[str, int]) -> None:
        """Topics found in the store (e.g. replicated to a slave) but not configured, or
        configured with fewer queues: kept, written, and published like a created topic."""
        with self._lock:
            grown = {name: nums for name, nums in seen.items()
                     if nums > self._queues.get(name, 0)}
            if not grown:
                return
            self._queues.update(grown)
            self._counter += 1
            atomic_write_json(self.path, self._to_json())
        if self.on_change is not None:
            self.on_change()

    def queue_nums(self, topic: str) -> int:
        return self._queues.get(topic, 0)

    @property
    def version(self) -> int:
        """Grows with every change of the table (a topic made, grown, retyped, replaced)."""
        return self._counter

    def create(self, topic: str, queue_nums: int,
               attributes: dict[str, str] | None = None) -> None:
        """Make or grow ``topic``; ``attributes`` (when given) replace the ones it had."""
        with self._lock:
            same_attrs = attributes is None or attributes == self._attrs.get(topic, {})
            if self._queues.get(topic) == queue_nums and same_attrs:
                return
            if attributes is not None:
                if attributes:
                    self._attrs[topic] = dict(attributes)
                else:
                    self._attrs.pop(topic, None)
            if self.admit is not None:
                why = self.admit({**self._queues, topic: queue_nums}, self._perms)
                if why:
                    raise TopicTableFull(f"topic {topic} not created: {why}")
            self._queues[topic] = queue_nums
            self._counter += 1
            atomic_write_json(self.path, self._to_json())
        if self.on_change is not None:
            self.on_change()

    def topics(self) -> dict[str, int]:
        with self._lock:
            return dict(self._queues)

    def perms(self) -> dict[str, int]:
        """Topic -> RocketMQ ``perm`` (6, read|write, unless topics.json said otherwise)."""
        with self._lock:
            return {t: self._perms.get(t, PERM_READ_WRITE) for t in self._queues}

    def perm(self, topic: str) -> int:
        return self._perms.get(topic, PERM_READ_WRITE)

    def attributes(self, topic: str) -> dict[str, str]:
        return dict(self._attrs.get(topic, {}))

    def message_type(self, topic: str) -> str:
        """RocketMQ 5's ``message.type`` attribute ("" when the topic has none)."""
        return self._attrs.get(topic, {}).get(MESSAGE_TYPE, "")

    def to_bytes(self) -> bytes:
        """The table as topics.json holds it (what a slave asks for)."""
        with self._lock:
            return json_bytes(self._to_json())

    def replace(self, raw: bytes, source: str, seen: dict[str, int] | None = None) -> bool:
        """Take a master's topics.json (ValueError, nothing changed, if it is malformed); True
        if the table changed (then it is written). Topics this store holds messages of keep at
        least the queues ``seen`` in its ConsumeQueues."""
        doc = loads(raw, source)
        queues, counter = parse_topics(doc, source)
        perms = parse_topic_perms(doc, source)
        attrs = parse_topic_attributes(doc, source)
        for name, nums in (seen or {}).items():
            queues[name] = max(nums, queues.get(name, 0))
        with self._lock:
            if queues == self._queues and perms == self._perms and attrs == self._attrs:
                return False
            self._queues, self._counter = queues, max(counter, self._counter + 1)
            self._perms = perms
            self._attrs = attrs
            atomic_write_json(self.path, self._to_json())
            return True

    def _to_json(self) -> dict[str, Any]:
        table = {
            name: {
                "topicName": name,
                "readQueueNums": nums,
                "writeQueueNums": nums,
                "perm": self._perms.get(name, PERM_READ_WRITE),
                **({"attributes": dict(self._attrs[name])} if name in self._attrs else {}),
            }
            for name, nums in sorted(self._queues.items())
        }
        version = {"timestamp": int(time.time() * 1000), "counter": self._counter}
        return {"topicConfigTable": table, "dataVersion": version}


class ConsumerOffsetTable:
    """``topic@group`` -> queue id -> next offset to consume; persisted when changed."""

    def __init__(self, config_dir: Path):
        self.path = config_dir / OFFSETS_FILE
        self._lock = threading.Lock()
        self._table = parse_offsets(read_table(self.path), str(self.path))
        self._dirty = False

    def commit(self, group: str, topic: str, queue_id: int, queue_offset: int) -> None:
        with self._lock:
            self._table.setdefault(f"{topic}@{group}", {})[queue_id] = queue_offset
            self._dirty = True

    def fetch(self, group: str, topic: str, queue_id: int) -> int:
        with self._lock:
            return self._table.get(f"{topic}@{group}", {}).get(queue_id, -1)

    def remove_group(self, group: str) -> int:
        """Forget every offset ``group`` committed; how many (topic, queue) offsets went."""
        suffix = f"@{group}"
        with self._lock:
            keys = [k for k in self._table if k.endswith(suffix)]
            removed = sum(len(self._table.pop(k)) for k in keys)
            self._dirty = self._dirty or bool(keys)
            return removed

    def snapshot(self) -> dict[tuple[str, str], dict[int, int]]:
        """(group, topic) -> queue id -> committed offset: a copy, for metrics."""
        with self._lock:
            items = [(k, dict(v)) for k, v in self._table.items()]
        out = {}
        for key, queues in items:
            topic, _, group = key.rpartition("@")
            out[(group, topic)] = queues
        return out

    def to_bytes(self) -> bytes:
        """The table as consumerOffset.json holds it (what a slave asks for)."""
        with self._lock:
            return json_bytes(self._to_json())

    def replace(self, raw: bytes, source: str) -> bool:
        """Take a master's consumerOffset.json whole (ValueError, nothing changed, if it is
        malformed); True if the table changed (written by the next ``persist``)."""
        table = parse_offsets(loads(raw, source), source)
        with self._lock:
            if table == self._table:
                return False
            self._table = table
            self._dirty = True
            return True

    def persist(self, force: bool = False) -> bool:
        """Write the table if it changed since the last write; True if written."""
        with self._lock:
            if not (self._dirty or force):
                return False
            snapshot = self._to_json()
            self._dirty = False
        atomic_write_json(self.path, snapshot)
        return True

    def _to_json(self) -> dict[str, Any]:
        return {"offsetTable": {k: {str(q): o for q, o in v.items()}
                                for k, v in self._table.items()}}
