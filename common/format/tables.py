"""The shapes of a broker's tables under ``<storePathRootDir>/config/``: parse, check, write.

RocketMQ's file names and JSON shapes; every write is atomic (temp file, fsync, rename, fsync of
the directory):

| file                | shape                                                                |
|---------------------|----------------------------------------------------------------------|
| topics.json         | ``{"topicConfigTable": {topic: {"topicName", "readQueueNums",        |
|                     | "writeQueueNums", "perm"}}, "dataVersion": {"timestamp", "counter"}}`` |
| consumerOffset.json | ``{"offsetTable": {"topic@group": {"<queueId>": queueOffset}}}``       |
| delayOffset.json    | ``{"offsetTable": {"<level>": scheduleQueueOffset}}`` (the store's)    |
| subscriptionGroup.json | ``{"subscriptionGroupTable": {group: {"groupName", "consumeEnable", |
|                     | "consumeMessageOrderly", "retryMaxTimes"}}, "dataVersion": {...}}``  |

The same documents travel from a master to its slaves (``slave/config_sync.py``, RocketMQ's
SlaveSynchronize), so a promoted slave knows its group's topics and where each consumer group
stands. A file or a document of the wrong shape is refused whole with a ValueError naming where
it came from and what is wrong: at start-up the broker does not start (the file is left as it
is), from a master the document is ignored and the table keeps what it had.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from common.core.files import write_atomically
from common.format.protocol import MAX_QUEUE_NUMS

TOPICS_FILE = "topics.json"
OFFSETS_FILE = "consumerOffset.json"
DELAY_OFFSETS_FILE = "delayOffset.json"
GROUPS_FILE = "subscriptionGroup.json"
DEFAULT_RETRY_MAX_TIMES = 16  # RocketMQ's SubscriptionGroupConfig.retryMaxTimes
MAX_RETRY_MAX_TIMES = 10_000
MAX_CONFIG_FILE_BYTES = 64 * 1024 * 1024
PERM_READ = 4  # RocketMQ's PermName: the topic's queues serve reads
PERM_WRITE = 2  # ... and take writes
PERM_READ_WRITE = PERM_READ | PERM_WRITE  # 6, every topic replog makes


def atomic_write_json(path: Path, value: Any) -> None:
    """Write JSON so that a crash leaves either the old or the new file, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json_bytes(value))


def json_bytes(value: Any) -> bytes:
    return json.dumps(value, indent=2, sort_keys=True).encode("utf-8")


def read_json(path: Path) -> Any:
    """The file's JSON, or None when absent; a torn or oversized file raises ValueError."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(raw) > MAX_CONFIG_FILE_BYTES:
        raise ValueError(f"{path} is larger than {MAX_CONFIG_FILE_BYTES} bytes")
    return loads(raw, str(path))


def read_table(path: Path) -> Any:
    """A table file's JSON; ``{}`` when the file does not exist (a null or a list in it is
    not an empty table: the shape checks refuse it)."""
    doc = read_json(path)
    return {} if doc is None and not path.exists() else doc


def loads(raw: bytes, source: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError alike
        raise ValueError(f"{source} is not valid JSON ({e}); restore or remove it") from None


# ---- shapes -----------------------------------------------------------------------------------


def _mapping(value: Any, source: str, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(  # noqa: TRY004 - a bad file or document, reported as ValueError
            f"{source}: {what} must be a JSON object, not {type(value).__name__}"
        )
    return value


def _int(value: Any, source: str, what: str, lo: int, hi: int = 2**63 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{source}: {what} must be an integer in [{lo}, {hi}], not {value!r}")
    return value


def _key_int(key: str, source: str, what: str) -> int:
    if not key.isdigit():
        raise ValueError(f"{source}: {what} {key!r} is not a non-negative integer")
    return int(key)


def parse_topics(doc: Any, source: str) -> tuple[dict[str, int], int]:
    """topics.json -> (topic -> queue count, dataVersion counter)."""
    doc = _mapping(doc, source, "the document")
    table = _mapping(doc.get("topicConfigTable", {}), source, "topicConfigTable")
    queues = {}
    for name, entry in table.items():
        entry = _mapping(entry, source, f"topic {name!r}")
        queues[name] = _int(entry.get("writeQueueNums", 0), source,
                            f"topic {name!r} writeQueueNums", 0, MAX_QUEUE_NUMS)
    version = _mapping(doc.get("dataVersion", {}), source, "dataVersion")
    return queues, _int(version.get("counter", 0), source, "dataVersion.counter", 0)


def parse_topic_perms(doc: Any, source: str) -> dict[str, int]:
    """topics.json -> topic -> ``perm`` (RocketMQ's PermName bits; 6 when the entry has none).
    replog writes 6 for every topic; a table made by RocketMQ may say otherwise, and routes
    carry what it says."""
    table = _mapping(_mapping(doc, source, "the document").get("topicConfigTable", {}), source,
                     "topicConfigTable")
    return {name: _int(_mapping(entry, source, f"topic {name!r}").get("perm", PERM_READ_WRITE),
                       source, f"topic {name!r} perm", 0, 7)
            for name, entry in table.items()}


def parse_topic_attributes(doc: Any, source: str) -> dict[str, dict[str, str]]:
    """topics.json -> topic -> its ``attributes`` (RocketMQ 5's TopicConfig: e.g.
    ``message.type``), for the topics that have any."""
    table = _mapping(_mapping(doc, source, "the document").get("topicConfigTable", {}), source,
                     "topicConfigTable")
    out: dict[str, dict[str, str]] = {}
    for name, entry in table.items():
        attrs = _mapping(_mapping(entry, source, f"topic {name!r}").get("attributes") or {},
                         source, f"topic {name!r} attributes")
        if attrs:
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in attrs.items()):
                raise ValueError(f"{source}: topic {name!r} attributes must map text to text")
            out[name] = dict(attrs)
    return out


@dataclasses.dataclass(frozen=True)
class GroupConfig:
    """One consumer group's entry of subscriptionGroup.json (RocketMQ's SubscriptionGroupConfig,
    the fields replog acts on; a file written by RocketMQ may hold more, which are ignored)."""

    group_name: str
    consume_enable: bool = True  # False: its PULLs and POPs are refused (NO_PERMISSION)
    consume_message_orderly: bool = False  # FIFO: POP hands out a queue's messages in order
    retry_max_times: int = DEFAULT_RETRY_MAX_TIMES  # a message's deliveries before its DLQ, - 1

    def to_json(self) -> dict[str, Any]:
        return {"groupName": self.group_name, "consumeEnable": self.consume_enable,
                "consumeMessageOrderly": self.consume_message_orderly,
                "retryMaxTimes": self.retry_max_times}


def _bool(value: Any, source: str, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(  # noqa: TRY004 - a bad file or document, reported as ValueError
            f"{source}: {what} must be true or false, not {value!r}")
    return value


def parse_groups(doc: Any, source: str) -> tuple[dict[str, GroupConfig], int]:
    """subscriptionGroup.json -> (group -> its config, dataVersion counter)."""
    doc = _mapping(doc, source, "the document")
    table = _mapping(doc.get("subscriptionGroupTable", {}), source, "subscriptionGroupTable")
    out: dict[str, GroupConfig] = {}
    for name, entry in table.items():
        entry = _mapping(entry, source, f"group {name!r}")
        if entry.get("groupName", name) != name:
            raise ValueError(f"{source}: group {name!r} has groupName "
                             f"{entry.get('groupName')!r}")
        out[name] = GroupConfig(
            name,
            _bool(entry.get("consumeEnable", True), source, f"group {name!r} consumeEnable"),
            _bool(entry.get("consumeMessageOrderly", False), source,
                  f"group {name!r} consumeMessageOrderly"),
            _int(entry.get("retryMaxTimes", DEFAULT_RETRY_MAX_TIMES), source,
                 f"group {name!r} retryMaxTimes", 0, MAX_RETRY_MAX_TIMES))
    version = _mapping(doc.get("dataVersion", {}), source, "dataVersion")
    return out, _int(version.get("counter", 0), source, "dataVersion.counter", 0)


def parse_offsets(doc: Any, source: str) -> dict[str, dict[int, int]]:
    """consumerOffset.json (and delayOffset.json's inner table) -> key -> queue -> offset."""
    table = _mapping(_mapping(doc, source, "the document").get("offsetTable", {}), source,
                     "offsetTable")
    out: dict[str, dict[int, int]] = {}
    for key, queues in table.items():
        queues = _mapping(queues, source, f"offsetTable[{key!r}]")
        out[key] = {
            _key_int(q, source, f"{key!r} queue id"): _int(o, source, f"{key!r} queue {q}", -1)
            for q, o in queues.items()
        }
    return out


def parse_delay_offsets(doc: Any, source: str) -> dict[int, int]:
    """delayOffset.json -> level -> next schedule queue offset."""
    table = _mapping(_mapping(doc, source, "the document").get("offsetTable", {}), source,
                     "offsetTable")
    return {_key_int(k, source, "delay level"): _int(v, source, f"delay level {k}", 0)
            for k, v in table.items()}


def delay_offsets_bytes(offsets: dict[int, int]) -> bytes:
    return json_bytes({"offsetTable": {str(k): v for k, v in sorted(offsets.items())}})


def replace_delay_offsets(path: Path, raw: bytes, source: str) -> bool:
    """Write a master's delayOffset.json over ``path`` (a slave's: its schedule service is not
    running and reads the file when promoted); ValueError, nothing written, if malformed."""
    offsets = parse_delay_offsets(loads(raw, source), source)
    try:
        current = parse_delay_offsets(read_table(path), str(path))
    except ValueError:
        current = None  # ours is unreadable: the master's replaces it
    if offsets == current:
        return False
    atomic_write_json(path, {"offsetTable": {str(k): v for k, v in sorted(offsets.items())}})
    return True
