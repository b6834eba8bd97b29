"""Messages as users see them: Message (to send), MessageExt (as stored), properties, msgId.

Properties travel and rest as RocketMQ's string ``name\\x01value\\x02...`` (UTF-8). The msgId is
RocketMQ's offsetMsgId: store host IPv4 (4 bytes) + store port (int) + CommitLog offset (long),
upper-case hex, 32 characters.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import socket
import struct
import zlib
from typing import Any

NAME_VALUE_SEP = "\x01"
PROPERTY_SEP = "\x02"

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT = "WAIT"
PROPERTY_DELAY = "DELAY"
PROPERTY_UNIQ_KEY = "UNIQ_CLIENT_MESSAGE_ID_KEYIDX"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"  # a sent-back copy: the topic the message first went to
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"  # a sent-back copy: the first copy's msgId
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"  # the key that chose the message's queue (RocketMQ 5)
SCHEDULE_SOURCE = "__SCHED_SRC"  # property naming the schedule record a delivery came from
KEY_SEPARATOR = " "

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# Topics only the broker writes (RocketMQ's TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET and its
# rmq_sys_ prefix): their records belong to other topics (REAL_TOPIC), so a client that could
# send to one, or pull one, would pass by those topics' ACL.
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
SYSTEM_TOPICS = frozenset({SCHEDULE_TOPIC, "RMQ_SYS_TRANS_HALF_TOPIC",
                           "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC"})
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"

# SYSFLAG bits (RocketMQ ``MessageSysFlag``) a producer may set; the rest are the broker's.
SYSFLAG_COMPRESSED = 0x1  # BODY is zlib-deflated (RocketMQ 4.x producers: bodies >= 4 KiB)
SYSFLAG_TRANSACTION_PREPARED = 0x4  # a half message (with TRAN_MSG=true): stored as NOT type
CLIENT_SYSFLAGS = SYSFLAG_COMPRESSED | SYSFLAG_TRANSACTION_PREPARED
DEFAULT_COMPRESS_OVER_BYTES = 4096  # RocketMQ's compressMsgBodyOverHowmuch
DEFAULT_COMPRESS_LEVEL = 5  # RocketMQ's zipCompressLevel
MAX_INFLATED_BYTES = 64 * 1024 * 1024  # a compressed body inflating past this is refused


ENTROPY_SAMPLE_BYTES = 512  # the start of a body looked at before deflating it
INCOMPRESSIBLE_DISTINCT = 170  # more distinct byte values than this in the sample: skip it


def compress_body(body: bytes, level: int = DEFAULT_COMPRESS_LEVEL) -> bytes | None:
    """RocketMQ's ``UtilAll.compress``: the body deflated in zlib format (what Java's
    ``Deflater`` writes and its ``InflaterInputStream`` reads), or None when that does not
    make it smaller (an incompressible body is kept as it is, flag unset).

    A body that is already compressed or encrypted is not deflated at all: the first 512 bytes
    of random bytes hold about 221 distinct byte values, of a deflate stream about 190, where
    text, JSON, base64, UTF-8 in any script or most binary records hold fewer than 100 (the
    cut is 170). Counting them costs ~5 us; deflating 16 KiB of random bytes only to throw the
    result away costs ~200 us here."""
    if len(set(body[:ENTROPY_SAMPLE_BYTES])) > INCOMPRESSIBLE_DISTINCT:
        return None
    packed = zlib.compress(body, level)
    return packed if len(packed) < len(body) else None


# RocketMQ 5 names the codec of a COMPRESSED body in SYSFLAG bits 8-10 (0: 4.x, always zlib).
COMPRESSION_TYPE_SHIFT = 8
COMPRESSION_TYPES = {0: "ZLIB", 1: "LZ4", 2: "ZSTD", 3: "ZLIB"}


def inflate_body(body: bytes | memoryview, max_bytes: int = MAX_INFLATED_BYTES,
                 sys_flag: int = SYSFLAG_COMPRESSED) -> bytes:
    """A COMPRESSED record's body as its producer sent it. Bounded: a body that would inflate
    past ``max_bytes`` (a zip bomb, or a corrupt stream) raises ValueError, as does one that is
    not a whole zlib stream; nothing larger than ``max_bytes`` is ever allocated. A record
    of RocketMQ 5 compressed with LZ4 or ZSTD (``sys_flag`` says which) raises ValueError
    naming the codec: replog reads zlib only."""
    kind = (sys_flag >> COMPRESSION_TYPE_SHIFT) & 0x7
    if COMPRESSION_TYPES.get(kind) != "ZLIB":
        name = COMPRESSION_TYPES.get(kind, f"type {kind}")
        raise ValueError(f"body compressed with {name} (SYSFLAG {sys_flag:#x}): replog inflates "
                         "zlib only (RocketMQ 4.x, and 5.x with compressType ZLIB)")
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(body, max_bytes)
    except zlib.error as e:
        raise ValueError(f"compressed body does not inflate: {e}") from None
    if inflater.unconsumed_tail:
        raise ValueError(f"compressed body inflates past {max_bytes} bytes")
    if not inflater.eof:
        raise ValueError("compressed body is a truncated zlib stream")
    return out


def retry_topic(group: str) -> str:
    """A consumer group's retry topic (RocketMQ ``MixAll.getRetryTopic``)."""
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    """A consumer group's dead-letter topic (RocketMQ ``MixAll.getDLQTopic``)."""
    return DLQ_PREFIX + group

_MSG_ID = struct.Struct(">4siq")
assert _MSG_ID.size == 16


def encode_properties(props: dict[str, str]) -> bytes:
    """RocketMQ ``messageProperties2String``: every entry ends with \\x02 (trailing one too).

    ValueError for a separator in a name or a value: it would add properties of its own (the
    entry paths refuse it first, ``common/format/boundary.py``; this is the last line)."""
    if not props:
        return b""
    parts = []
    for name, value in props.items():
        if value is None:
            continue
        parts.append(f"{name}{NAME_VALUE_SEP}{value}{PROPERTY_SEP}")
    text = "".join(parts)
    if text.count(NAME_VALUE_SEP) != len(parts) or text.count(PROPERTY_SEP) != len(parts):
        bad = next(n for n, v in props.items() if v is not None
                   and (NAME_VALUE_SEP in f"{n}{v}" or PROPERTY_SEP in f"{n}{v}"))
        raise ValueError(f"property {bad[:64]!r}: a name or value holds \\x01 or \\x02 "
                         "(the property separators)")
    return text.encode("utf-8")


def decode_properties(raw: bytes | memoryview) -> dict[str, str]:
    """Inverse of encode_properties; tolerant of a missing trailing separator."""
    if not raw:
        return {}
    text = bytes(raw).decode("utf-8", errors="replace")
    props: dict[str, str] = {}
    for item in text.split(PROPERTY_SEP):
        if not item:
            continue
        name, sep, value = item.partition(NAME_VALUE_SEP)
        if sep:
            props[name] = value
    return props


def java_hash(text: str) -> int:
    """Java ``String.hashCode()`` (32-bit signed) over UTF-16 code units; stable across runs."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


@functools.lru_cache(maxsize=65536)
def tags_code(tags: str | None) -> int:
    """ConsumeQueue tagsCode for a TAGS property (0 when absent); tag values are few: cached."""
    return java_hash(tags) if tags else 0


def host_bytes(ip: str) -> bytes:
    """IPv4 text to 4 bytes; anything unparsable becomes 0.0.0.0 (v1 records are IPv4)."""
    try:
        return socket.inet_aton(ip)
    except OSError:
        return b"\x00\x00\x00\x00"


def encode_msg_id(store_ip: bytes, store_port: int, phy_offset: int) -> str:
    return _MSG_ID.pack(store_ip, store_port, phy_offset).hex().upper()


def decode_msg_id(msg_id: str) -> tuple[str, int, int]:
    """msgId -> (store ip, store port, CommitLog offset); ValueError if it is not one."""
    if len(msg_id) != 32:
        raise ValueError(f"msgId must be 32 hex characters, got {len(msg_id)}")
    raw = bytes.fromhex(msg_id)
    ip, port, phy_offset = _MSG_ID.unpack(raw)
    return socket.inet_ntoa(ip), port, phy_offset


@dataclasses.dataclass
class Message:
    """A message to send."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: str | list[str] | None = None
    properties: dict[str, str] = dataclasses.field(default_factory=dict)
    flag: int = 0
    delay_level: int = 0
    reconsume_times: int = 0  # RECONSUMETIMES: how often a consumer sent it back (retries)
    sys_flag: int = 0  # SYSFLAG bits the record carries: SYSFLAG_COMPRESSED (body deflated)
    # PREPAREDTRANSACTIONOFFSET: a transaction's commit names its half message's offset
    prepared_transaction_offset: int = 0

    def all_properties(self) -> dict[str, str]:
        props = dict(self.properties)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        if self.keys:
            keys = self.keys if isinstance(self.keys, str) else KEY_SEPARATOR.join(self.keys)
            props[PROPERTY_KEYS] = keys
        if self.delay_level > 0:
            props[PROPERTY_DELAY] = str(self.delay_level)
        return props


@dataclasses.dataclass
class MessageExt:
    """A stored message, decoded from its CommitLog record.

    ``body`` is the record's BODY as stored. The clients (``common.format.protocol.decode_record``)
    inflate a COMPRESSED one, so users see what the producer sent; ``sys_flag``, ``body_crc``
    and ``store_size`` still describe the stored record."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_size: int
    body: bytes
    properties: dict[str, str]
    flag: int = 0
    sys_flag: int = 0
    body_crc: int = 0
    born_timestamp: int = 0
    born_host: str = ""
    store_timestamp: int = 0
    store_host: str = ""
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    msg_id: str = ""
    broker_name: str = ""  # the broker group it was read from (RocketMQ's MessageExt brokerName)

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(PROPERTY_KEYS)

    def key_list(self) -> list[str]:
        keys = self.keys
        return [k for k in keys.split(KEY_SEPARATOR) if k] if keys else []

    def to_json(self) -> dict[str, Any]:
        """The contract's JSON shape of a message (section 3)."""
        return {
            "topic": self.topic,
            "queueId": self.queue_id,
            "queueOffset": self.queue_offset,
            "commitLogOffset": self.commit_log_offset,
            "msgId": self.msg_id,
            "bornTimestamp": self.born_timestamp,
            "storeTimestamp": self.store_timestamp,
            "tags": self.tags,
            "keys": self.keys,
            "properties": self.properties,
            "body": body_str(self.body),
            "bodyBase64": base64.b64encode(self.body).decode("ascii"),
            "brokerName": self.broker_name,
        }


def body_str(body: bytes) -> str | None:
    """A body as section 3's ``body``: its UTF-8 text, or None when it is not valid UTF-8."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None


def is_system_topic(topic: str) -> bool:
    """A topic only the broker writes (``SYSTEM_TOPICS``, or one under ``rmq_sys_``)."""
    return topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)


def subscribed_tags(expression: str | None) -> frozenset[str] | None:
    """RocketMQ's tag subscription ``"A || B"`` -> its tags; ``*`` or empty -> None (every
    message). The broker filters by their hash codes, then by the tag itself (two tags can
    share a hash); the client checks the tag again, as RocketMQ's clients do."""
    if not expression or expression.strip() in ("", "*"):
        return None
    return frozenset(t.strip() for t in expression.split("||") if t.strip())
