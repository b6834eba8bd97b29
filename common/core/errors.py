"""Status codes and the one exception clients see.

Expected outcomes are enum values (RocketMQ's PutMessageStatus, GetMessageStatus, ResponseCode);
bugs and corruption raise. A refused operation reaches a client as ``BrokerError`` carrying the
response ``code``, a human ``remark`` and whether retrying may help (``retriable``).
"""

from __future__ import annotations

import enum


class PutStatus(enum.Enum):
    """Outcome of a store put (RocketMQ ``PutMessageStatus``)."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGE_CACHE_BUSY = "OS_PAGE_CACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    WHEEL_TIMER_FLOW_CONTROL = "WHEEL_TIMER_FLOW_CONTROL"  # the tick is full: send later
    WHEEL_TIMER_MSG_ILLEGAL = "WHEEL_TIMER_MSG_ILLEGAL"  # a time too far, or not a time
    WHEEL_TIMER_NOT_ENABLE = "WHEEL_TIMER_NOT_ENABLE"  # timerWheelEnable is off

    # members are singletons compared by identity: hashed by it too, in C (Enum's own
    # __hash__ is a Python call, on every put's status look-up)
    __hash__ = object.__hash__

    @property
    def stored(self) -> bool:
        """True when the message is in the CommitLog (possibly not yet flushed or replicated)."""
        return self in _STORED


_STORED = frozenset(
    {
        PutStatus.PUT_OK,
        PutStatus.FLUSH_DISK_TIMEOUT,
        PutStatus.FLUSH_SLAVE_TIMEOUT,
        PutStatus.SLAVE_NOT_AVAILABLE,
    }
)


class GetStatus(enum.Enum):
    """Outcome of a store read (RocketMQ ``GetMessageStatus``)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    CORRUPT_RECORD = "CORRUPT_RECORD"  # replog: the entry's record fails its checks


class SendStatus(enum.StrEnum):
    """What a client's send returns (RocketMQ ``SendStatus``). A ``str`` too, so that
    ``result.status == "SEND_OK"`` holds as the contract's names read."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


class PullStatus(enum.StrEnum):
    """What a client's pull returns (RocketMQ ``PullStatus``); a ``str`` too, like SendStatus."""

    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


class ResponseCode(enum.IntEnum):
    """Wire response codes; names and numbers follow RocketMQ's ``ResponseCode``."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    BAD_REQUEST = 4  # replog: a malformed frame or field (RocketMQ closes the channel instead)
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23  # a subscription expression (SQL92) that cannot be read
    SUBSCRIPTION_GROUP_NOT_EXIST = 26  # a group not in subscriptionGroup.json, none auto-made
    OFFSET_OUT_OF_RANGE = 40  # replog: HA peer asked for bytes the master does not hold
    STALE_EPOCH = 41  # replog: a request carried an epoch older than the broker's
    CONSUMER_NOT_ONLINE = 206  # a group member committing for a queue the group gave away


# Codes a client may retry, possibly after re-discovering the master.
RETRIABLE_CODES = frozenset(
    {
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.STALE_EPOCH,
    }
)


class BrokerError(Exception):
    """A refused or failed operation, raised by the broker's answer or by the client itself.

    A producer's send that fails names where it went: ``address`` (the broker that refused it,
    or did not answer) and ``broker_name`` (its group), as RocketMQ's MQBrokerException names the
    broker address; "" / None when the error came before any broker was chosen."""

    address: str | None = None
    broker_name: str = ""

    def __init__(self, code: ResponseCode | str, remark: str, retriable: bool | None = None):
        if isinstance(code, str):
            code = ResponseCode[code]
        self.code = code
        self.remark = remark
        self.retriable = code in RETRIABLE_CODES if retriable is None else retriable
        super().__init__(f"{code.name}: {remark}")


class CorruptMessageError(BrokerError):
    """A pull met a record that fails its checks at ``queue_offset`` (CommitLog offset
    ``commit_log_offset``): nothing at or after it came back. Not retriable; a consumer that
    accepts the loss of that one message pulls on from ``queue_offset + 1``."""

    def __init__(self, queue_offset: int, commit_log_offset: int, reason: str):
        self.queue_offset = queue_offset
        self.commit_log_offset = commit_log_offset
        super().__init__(
            ResponseCode.SYSTEM_ERROR,
            f"corrupt record at queue offset {queue_offset} (commitLogOffset "
            f"{commit_log_offset}): {reason}; pull from {queue_offset + 1} to skip it",
            retriable=False,
        )


class ConfigError(ValueError):
    """A broker configuration that cannot be used; the message names the key."""


class StoreError(Exception):
    """The store cannot do what was asked (corrupt file, gap, wrong size); never swallowed."""


class ReplicationFencedError(StoreError):
    """A replicated write (append, truncation, epoch file) from an HA client whose term is
    over: the broker was promoted, or a newer client replicates now (fence generation)."""


class CorruptionError(StoreError):
    """Bytes on disk or from a peer that fail a check (magic, size, CRC, offset)."""

    def __init__(self, phy_offset: int, reason: str):
        self.phy_offset = phy_offset
        self.reason = reason
        super().__init__(f"corrupt record at offset {phy_offset}: {reason}")
