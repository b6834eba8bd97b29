"""The consumer groups' configs, ``config/subscriptionGroup.json`` (RocketMQ's
SubscriptionGroupManager).

A group is made by UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (``replog groups --create``), or on its
first PULL or POP when ``autoCreateSubscriptionGroup`` is on (the default, RocketMQ's): a master
writes the new entry; a slave, whose table is its master's copy (``slave/config_sync.py``),
answers with the defaults and writes nothing. With the key off, a group not in the table is
refused (SUBSCRIPTION_GROUP_NOT_EXIST). What a group's entry decides:

* ``consumeEnable`` false: its PULLs and POPs are refused (NO_PERMISSION), the way an operator
  stops a group without touching its clients;
* ``consumeMessageOrderly`` (the group's FIFO attribute): its POPs hand out each queue's
  messages in order, one message group's next only after the previous is acked or dead, whatever
  the consumer asked;
* ``retryMaxTimes``: how many times a message is handed out again (a POP's revive, a
  send-back's retry) before the group's DLQ, unless the consumer's request names its own.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from common.format.tables import (
    GROUPS_FILE,
    GroupConfig,
    atomic_write_json,
    json_bytes,
    loads,
    parse_groups,
    read_table,
)


class SubscriptionGroupTable:
    """Group -> GroupConfig, persisted in ``config/subscriptionGroup.json``; thread-safe."""

    def __init__(self, config_dir: Path, auto_create: bool = True):
        self.path = config_dir / GROUPS_FILE
        self.auto_create = auto_create
        self._lock = threading.Lock()
        self._groups, self._counter = parse_groups(read_table(self.path), str(self.path))

    def get(self, group: str) -> GroupConfig | None:
        return self._groups.get(group)

    def find(self, group: str, persist: bool) -> GroupConfig | None:
        """The group's config; one not in the table is made with the defaults when
        ``autoCreateSubscriptionGroup`` is on (written only if ``persist``: a master), else
        None."""
        config = self._groups.get(group)
        if config is not None or not self.auto_create:
            return config
        if not persist:
            return GroupConfig(group)
        with self._lock:
            if group not in self._groups:
                self._groups[group] = GroupConfig(group)
                self._write()
            return self._groups[group]

    def update(self, config: GroupConfig) -> GroupConfig | None:
        """Make or change a group (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP); the config it had."""
        with self._lock:
            before = self._groups.get(config.group_name)
            if before != config:
                self._groups[config.group_name] = config
                self._write()
            return before

    def delete(self, group: str) -> GroupConfig | None:
        """Forget a group (DELETE_SUBSCRIPTIONGROUP); the config it had, None if none."""
        with self._lock:
            before = self._groups.pop(group, None)
            if before is not None:
                self._write()
            return before

    def groups(self) -> dict[str, GroupConfig]:
        with self._lock:
            return dict(self._groups)

    def to_bytes(self) -> bytes:
        """The table as subscriptionGroup.json holds it (what a slave asks for)."""
        with self._lock:
            return json_bytes(self._to_json())

    def replace(self, raw: bytes, source: str) -> bool:
        """Take a master's subscriptionGroup.json whole (ValueError, nothing changed, if it is
        malformed); True if the table changed (then it is written)."""
        groups, counter = parse_groups(loads(raw, source), source)
        with self._lock:
            if groups == self._groups:
                return False
            self._groups, self._counter = groups, max(counter, self._counter)
            atomic_write_json(self.path, self._to_json())
            return True

    def _write(self) -> None:
        self._counter += 1
        atomic_write_json(self.path, self._to_json())

    def _to_json(self) -> dict[str, Any]:
        table = {name: config.to_json() for name, config in sorted(self._groups.items())}
        version = {"timestamp": int(time.time() * 1000), "counter": self._counter}
        return {"subscriptionGroupTable": table, "dataVersion": version}
