"""The client wire protocol: pure encode/decode functions over ZeroMQ multipart frames.

A request or a response is one ZeroMQ multipart message (the ROUTER's routing identity, which
ZeroMQ adds and strips, is not part of it)::

    frame 0        msgpack header (below)
    frame 1..n     raw bodies: message bodies on a send, raw CommitLog records on a pull/query
                   answer. Bodies travel as bytes and are never re-encoded.

A SEND_BATCH may instead carry all its bodies back to back in one frame, with their lengths in
the ``sizes`` field (one ZeroMQ frame costs the sender and the receiver a library call each, and
a batch of 64 would be 65 frames); the broker cuts the frame at those lengths.

    request header  = [version, request_code, opaque, fields]
    response header = [version, response_code, opaque, remark, fields]

| element   | msgpack type | meaning                                                        |
|-----------|--------------|----------------------------------------------------------------|
| version   | int          | ``PROTOCOL_VERSION``; anything else -> VERSION_NOT_SUPPORTED   |
| code      | int          | ``RequestCode`` / ``common.core.errors.ResponseCode``               |
| opaque    | int >= 0     | the client's request id, echoed in the response (pipelining)   |
| remark    | str          | a human reason on a response ("" on success)                   |
| fields    | map str->..  | per-code named fields, checked against ``SCHEMAS``              |

Every length and count that comes off the wire is checked against ``Limits`` (from the broker's
config: ``maxFrameBytes``, ``maxMessageSize``, ``maxBatchCount``) before anything is allocated
from it: the total size and frame count first, then the header's size, then msgpack's own
``max_*_len`` limits while unpacking (no ext types, strict str map keys), then the nesting depth
of the result and the schema of the fields. A frame that fails raises ``ProtocolError`` (code
BAD_REQUEST, or MESSAGE_ILLEGAL for an oversized body, REQUEST_CODE_NOT_SUPPORTED,
VERSION_NOT_SUPPORTED) naming the field and the reason; the server answers it with that code.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import msgpack

from common.core import accel
from common.core.errors import ResponseCode
from common.core.message import (
    CLIENT_SYSFLAGS,
    MAX_INFLATED_BYTES,
    PROPERTY_UNIQ_KEY,
    SYSFLAG_COMPRESSED,
    MessageExt,
    inflate_body,
)
from common.format import boundary, record

PROTOCOL_VERSION = 1
MAX_HEADER_BYTES = 1024 * 1024  # never more than the frame limit either
MAX_STR_BYTES = 64 * 1024  # any one string in a header (properties strings are <= 32767)
MAX_MAP_ENTRIES = 256  # fields of a header, entries of a properties map
MAX_DEPTH = 5  # header -> fields -> meta list -> one meta entry -> its properties map
MAX_PULL_NUMS = 1024
MAX_POP_NUMS = 32  # RocketMQ's ceiling for one POP
MAX_QUEUE_ID = boundary.MAX_QUEUE_ID
MAX_QUEUE_NUMS = 1024
MAX_OFFSET = (1 << 63) - 1
# LOG_CHECKSUM hashes at most this many bytes per request (the broker reads and hashes them
# off its I/O thread: a bounded piece of work); Admin.log_checksum asks longer ranges in pieces.
LOG_CHECKSUM_MAX_BYTES = 16 * 1024 * 1024
MAX_INT32 = (1 << 31) - 1
MAX_GROUP_LENGTH = 255
MAX_KEYS_LENGTH = 4096
MAX_TAGS_LENGTH = 255
MAX_SUBSCRIPTION_LENGTH = 4096  # a subscription expression (a SQL92 one is parsed up to this)
UNKNOWN_OPAQUE = -1  # in a response to a frame whose opaque could not be read

TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+\Z")  # RocketMQ's valid topic/group characters


class RequestCode(enum.IntEnum):
    """Request codes; numbers follow RocketMQ's ``RequestCode`` where it has one."""

    SEND = 10
    PULL = 11
    QUERY_BY_KEY = 12
    FETCH_OFFSET = 14
    COMMIT_OFFSET = 15
    CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21  # topics.json, as a body frame (a slave syncs it)
    STATUS = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29  # first queue offset stored at or after a time
    GET_MAX_OFFSET = 30  # a queue's max offset (where the next message will go)
    GET_MIN_OFFSET = 31  # a queue's min offset (the oldest message still held)
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200  # make or change a consumer group's config
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201  # subscriptionGroup.json, a body frame (slaves sync)
    GET_CONSUMER_CONNECTION_LIST = 203  # a consumer group's live members (admin)
    GET_PRODUCER_CONNECTION_LIST = 204  # a producer group's live producers (admin)
    DELETE_SUBSCRIPTIONGROUP = 207  # forget a consumer group's config (and its offsets)
    GET_CLIENT_RUNNING_INFO = 307  # broker -> client: its running figures (RocketMQ's 307 asks
    # a consumer; replog asks any client that heartbeats)
    TOPIC_ROUTE = 105  # RocketMQ GET_ROUTEINFO_BY_TOPIC: a topic's queue count
    CLUSTER_INFO = 106  # RocketMQ GET_BROKER_CLUSTER_INFO: every group, its brokers and topics
    QUERY_BY_OFFSET = 33
    QUERY_BY_MSG_ID = 34
    CONSUMER_SEND_MSG_BACK = 36  # a consumer failed a message: store it again for a retry or DLQ
    END_TRANSACTION = 37  # commit or roll back a transaction's half message
    CHECK_TRANSACTION_STATE = 39  # broker -> client: what became of this half's transaction
    GET_ALL_CONSUMER_OFFSET = 43  # consumerOffset.json, as a body frame (a slave syncs it)
    GET_ALL_DELAY_OFFSET = 45  # delayOffset.json, as a body frame (a slave syncs it)
    GET_BROKER_CLUSTER_ACL_INFO = 52  # the ACL in force: version, digest, accounts (admin)
    SEND_BATCH = 320
    RECALL_MESSAGE = 370  # cancel a timer message not delivered yet, by its recall handle
    PROMOTE = 1001  # replog: turn a slave into its group's master
    CONSUMER_HEARTBEAT = 1002  # replog: a group consumer is alive (or leaves); -> members
    LOG_CHECKSUM = 1003  # replog: sha256 of a CommitLog range (replicas compared remotely)
    CLEAR_ELECTION_FAULT = 1004  # replog: a member that failed to take over may stand again
    PRODUCER_HEARTBEAT = 1005  # replog (RocketMQ's HEART_BEAT for producers): alive, or leaves
    QUERY_GIVEN_UP_TRANSACTIONS = 1006  # replog: halves past transactionCheckMax (admin)
    POP_MESSAGE = 200050  # RocketMQ 5: hand messages out to one consumer, hidden for a while
    ACK_MESSAGE = 200051  # RocketMQ 5: a popped message is done, by its receipt handle
    CHANGE_MESSAGE_INVISIBLETIME = 200053  # RocketMQ 5: hide a popped message longer
    BATCH_ACK_MESSAGE = 200151  # RocketMQ 5: many popped messages done, one request




class ProtocolError(Exception):
    """A frame that cannot be served; ``code`` is what the server answers with."""

    def __init__(
        self,
        field: str,
        reason: str,
        code: ResponseCode = ResponseCode.BAD_REQUEST,
        opaque: int = UNKNOWN_OPAQUE,
    ):
        self.field = field
        self.reason = reason
        self.code = code
        self.opaque = opaque
        super().__init__(f"{field}: {reason}")

    @property
    def remark(self) -> str:
        return f"bad field {self.field!r}: {self.reason}"


@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds applied to every frame read off the wire."""

    max_frame_bytes: int = 8 * 1024 * 1024  # all frames of one message together
    max_body_bytes: int = 4 * 1024 * 1024  # one message body
    max_batch_count: int = 4096  # bodies in one request
    max_topic_length: int = 127
    max_suspend_ms: int = 30_000  # long-polling wait a client may ask for

    @property
    def max_header_bytes(self) -> int:
        return min(MAX_HEADER_BYTES, self.max_frame_bytes)

    @classmethod
    def from_config(cls, cfg: Any) -> Limits:
        return cls(
            max_frame_bytes=cfg.maxFrameBytes,
            max_body_bytes=cfg.maxMessageSize,
            max_batch_count=cfg.maxBatchCount,
            max_topic_length=min(cfg.maxTopicLength, record.MAX_TOPIC_BYTES),
            max_suspend_ms=cfg.longPollingMaxMs,
        )

    def for_responses(self) -> Limits:
        """Client-side limits: a pull answer holds many whole records."""
        size = max(self.max_frame_bytes, 64 * 1024 * 1024)
        return dataclasses.replace(
            self,
            max_frame_bytes=size,
            max_body_bytes=size,
            max_batch_count=max(self.max_batch_count, MAX_PULL_NUMS * 32),
        )


class Request(NamedTuple):
    code: RequestCode
    opaque: int
    fields: dict[str, Any]
    bodies: list[bytes]
    # not on the wire: the sender's (ip, port) as the broker saw its connection, set by the
    # request server on writes (the stored BORNHOST); ("0.0.0.0", 0) when unknown
    born_host: tuple[str, int] = ("0.0.0.0", 0)


class Response(NamedTuple):
    code: ResponseCode
    opaque: int
    remark: str
    fields: dict[str, Any]
    bodies: list[bytes]

    @property
    def ok(self) -> bool:
        return self.code == ResponseCode.SUCCESS


# ---- field schemas --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Field:
    """One named header field: its kind, whether it is required and its bounds."""

    # int, str, text (a str bound for a record: no property separator), topic, group, props,
    # meta, sizes, role, sysflag
    kind: str
    required: bool = False
    lo: int = 0
    hi: int = MAX_INT32
    default: Any = None


_TOPIC = Field("topic", required=True)
_QUEUE = Field("int", required=True, lo=0, hi=MAX_QUEUE_ID)
_TAGS = Field("text", hi=MAX_TAGS_LENGTH)
_KEYS = Field("keys", hi=MAX_KEYS_LENGTH)
_GROUP = Field("group")
_BORN = Field("int", lo=0, hi=MAX_OFFSET, default=0)

# ---- the request table: one row per code ------------------------------------------------------

READ, WRITE = "read", "write"
TO_BROKER, TO_CLIENT = "to_broker", "to_client"  # who serves a code


@dataclasses.dataclass(frozen=True)
class Permission:
    """What an account needs for a request, as data (``common/format/acl.py`` checks it).

    ``topic``: PUB, SUB or PUB|SUB (either: a route, asked by producers and consumers alike) on
    the field ``topic``; ``group``: SUB on the field ``group`` (none named: the account's
    defaultGroupPerm decides); ``origin_topic``: SUB on ``originTopic``; ``admin``: an admin
    account; ``config``: admin or replica (the tables a slave copies); ``found``: SUB on the
    topic of what a look-up finds (the server checks it once found); ``anyone``: any enabled
    account."""

    topic: str = ""
    group: bool = False
    origin_topic: bool = False
    admin: bool = False
    config: bool = False
    found: bool = False
    anyone: bool = False


@dataclasses.dataclass(frozen=True)
class RequestSpec:
    """Everything the broker knows of a request code but its processor
    (``common/broker/processors/``): its fields, who may send it, whether it writes (a master
    only; a slave refuses it), whether its SUCCESS promises a stored message (a controller-mode
    master checks its lease once more before that answer leaves), whether its ``topic`` names a
    client topic (a system topic is refused), whether it is served past the in-flight cap, and
    how many body frames it carries. ``peer``: its processor is told the connection's address
    (``Request.born_host``; every write is). ``served_by`` TO_CLIENT: a request the broker
    sends to a client on its connection (the client serves it; a broker refuses it from a
    client)."""

    fields: Mapping[str, Field]
    permission: Permission
    kind: str = READ
    acked: bool = False
    names_topic: bool = False
    always_served: bool = False
    bodies: tuple[int, int | None] = (0, 0)
    peer: bool = False
    served_by: str = TO_BROKER


_PUB, _SUB, _EITHER = Permission(topic="PUB"), Permission(topic="SUB"), Permission(topic="PUB|SUB")
_ADMIN, _CONFIG, _ANYONE = Permission(admin=True), Permission(config=True), Permission(anyone=True)
_TOPIC_AND_GROUP = Permission(topic="SUB", group=True)
_TOPIC_QUEUE = {"topic": _TOPIC, "queueId": _QUEUE}

SPECS: dict[RequestCode, RequestSpec] = {
    RequestCode.SEND: RequestSpec({
        "topic": _TOPIC,
        "queueId": _QUEUE,
        "tags": _TAGS,
        "keys": _KEYS,
        "properties": Field("props"),
        "flag": Field("int", lo=-MAX_INT32 - 1, hi=MAX_INT32, default=0),
        "delayLevel": Field("int", lo=0, hi=64, default=0),
        "bornTimestamp": _BORN,
        "sysFlag": Field("sysflag", default=0),  # SYSFLAG bits a producer may set: COMPRESSED
    }, _PUB, kind=WRITE, acked=True, names_topic=True, bodies=(1, 1)),
    RequestCode.SEND_BATCH: RequestSpec({
        "topic": _TOPIC,
        "queueId": _QUEUE,
        "meta": Field("meta"),
        "sizes": Field("sizes"),  # bodies packed in one frame: each one's length, in order
        "bornTimestamp": _BORN,
    }, _PUB, kind=WRITE, acked=True, names_topic=True, bodies=(1, None)),
    RequestCode.RECALL_MESSAGE: RequestSpec({
        "topic": _TOPIC,
        "recallHandle": Field("str", required=True, lo=1, hi=1024),
        "producerGroup": _GROUP,
    }, _PUB, kind=WRITE, acked=True, names_topic=True),
    RequestCode.PULL: RequestSpec({
        "topic": _TOPIC,
        "queueId": _QUEUE,
        "queueOffset": Field("int", required=True, lo=0, hi=MAX_OFFSET),
        "maxNums": Field("int", lo=1, hi=MAX_PULL_NUMS, default=32),
        "group": _GROUP,
        "tags": Field("str", hi=MAX_KEYS_LENGTH),
        "suspendMs": Field("int", lo=0, hi=MAX_INT32, default=0),
        # RocketMQ's subscription: TAG (``A || B``; ``tags`` says the same) or SQL92
        "expressionType": Field("str", hi=16),
        "subscription": Field("str", hi=MAX_SUBSCRIPTION_LENGTH),
    }, _TOPIC_AND_GROUP, names_topic=True),
    RequestCode.QUERY_BY_KEY: RequestSpec({
        "topic": _TOPIC,
        "key": Field("str", required=True, lo=1, hi=MAX_KEYS_LENGTH),
        "maxNums": Field("int", lo=1, hi=MAX_PULL_NUMS, default=32),
        "beginMs": Field("int", lo=0, hi=MAX_OFFSET, default=0),
        "endMs": Field("int", lo=0, hi=MAX_OFFSET, default=MAX_OFFSET),
    }, _SUB, names_topic=True),
    RequestCode.QUERY_BY_MSG_ID: RequestSpec(
        {"msgId": Field("str", required=True, lo=32, hi=32)}, Permission(found=True)),
    RequestCode.QUERY_BY_OFFSET: RequestSpec(
        {"phyOffset": Field("int", required=True, lo=0, hi=MAX_OFFSET)}, Permission(found=True)),
    RequestCode.STATUS: RequestSpec({}, _ANYONE, always_served=True),
    # routes over the cluster (brokers, groups, topics' queue counts): what every client needs
    # to send at all, like STATUS; what it may then do is checked per request
    RequestCode.CLUSTER_INFO: RequestSpec({}, _ANYONE, always_served=True),
    RequestCode.GET_ALL_TOPIC_CONFIG: RequestSpec({}, _CONFIG),
    RequestCode.GET_ALL_CONSUMER_OFFSET: RequestSpec({}, _CONFIG),
    RequestCode.GET_ALL_DELAY_OFFSET: RequestSpec({}, _CONFIG),
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: RequestSpec({}, _CONFIG),
    # RocketMQ's SubscriptionGroupConfig, the fields replog acts on (``replog groups
    # --create``); to the master, which writes subscriptionGroup.json
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: RequestSpec({
        "groupName": Field("group", required=True),
        "consumeEnable": Field("int", lo=0, hi=1, default=1),
        "consumeMessageOrderly": Field("int", lo=0, hi=1, default=0),
        "retryMaxTimes": Field("int", lo=0, hi=10_000, default=16),
    }, _ADMIN, kind=WRITE),
    RequestCode.DELETE_SUBSCRIPTIONGROUP: RequestSpec({
        "groupName": Field("group", required=True),
        "cleanOffset": Field("int", lo=0, hi=1, default=0),  # 1: its committed offsets too
    }, _ADMIN, kind=WRITE),
    RequestCode.GET_BROKER_CLUSTER_ACL_INFO: RequestSpec({}, _ADMIN),
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: RequestSpec({
        **_TOPIC_QUEUE, "timestamp": Field("int", required=True, lo=0, hi=MAX_OFFSET),
    }, _SUB, names_topic=True),
    RequestCode.GET_MAX_OFFSET: RequestSpec(_TOPIC_QUEUE, _SUB, names_topic=True),
    RequestCode.GET_MIN_OFFSET: RequestSpec(_TOPIC_QUEUE, _SUB, names_topic=True),
    RequestCode.TOPIC_ROUTE: RequestSpec({"topic": _TOPIC}, _EITHER),
    RequestCode.COMMIT_OFFSET: RequestSpec({
        "group": Field("group", required=True),
        **_TOPIC_QUEUE,
        "queueOffset": Field("int", required=True, lo=0, hi=MAX_OFFSET),
        # a GroupConsumer's id: the commit is refused unless it owns the queue (fencing)
        "clientId": Field("str", hi=255),
    }, _TOPIC_AND_GROUP, names_topic=True),
    RequestCode.FETCH_OFFSET: RequestSpec({"group": Field("group", required=True), **_TOPIC_QUEUE},
                                          _TOPIC_AND_GROUP, names_topic=True),
    RequestCode.CREATE_TOPIC: RequestSpec({
        "topic": _TOPIC,
        "queueNums": Field("int", required=True, lo=1, hi=MAX_QUEUE_NUMS),
        # RocketMQ 5's topic attributes (``message.type``: NORMAL, FIFO, ...); given, they
        # replace the topic's
        "attributes": Field("props"),
    }, _ADMIN, kind=WRITE, names_topic=True),
    # a consumer failed a message: store it again for a retry or the DLQ. RocketMQ checks SUB
    # on the group's retry topic only; the origin topic too, or an account could copy any
    # record (by offset) into its own retry topic and read it there
    RequestCode.CONSUMER_SEND_MSG_BACK: RequestSpec({
        "group": Field("group", required=True),
        "offset": Field("int", required=True, lo=0, hi=MAX_OFFSET),  # the record's CommitLog offset
        "originTopic": _TOPIC,  # the topic the consumer read it as (RocketMQ's originTopic)
        "originMsgId": Field("text", hi=64),  # the copy's ORIGIN_MESSAGE_ID
        # 0: the broker's choice (3 + reconsume times); -1: straight to the DLQ
        "delayLevel": Field("int", lo=-1, hi=64, default=0),
        # -1: the group's retryMaxTimes (subscriptionGroup.json; 16 unless configured)
        "maxReconsumeTimes": Field("int", lo=-1, hi=10_000, default=-1),
    }, Permission(group=True, origin_topic=True), kind=WRITE, acked=True),
    RequestCode.PROMOTE: RequestSpec({"role": Field("role", default="SYNC_MASTER")}, _ADMIN),
    RequestCode.CLEAR_ELECTION_FAULT: RequestSpec({}, _ADMIN),
    # the bytes of the log, whatever topic they hold: an operator's or a drill's check
    RequestCode.LOG_CHECKSUM: RequestSpec({
        "fromOffset": Field("int", required=True, lo=0, hi=MAX_OFFSET),
        "toOffset": Field("int", required=True, lo=0, hi=MAX_OFFSET),
    }, _ADMIN),
    RequestCode.CONSUMER_HEARTBEAT: RequestSpec({
        "group": Field("group", required=True),
        "clientId": Field("str", required=True, lo=1, hi=255),
        "sessionTimeoutMs": Field("int", lo=100, hi=3_600_000, default=10_000),
        "leave": Field("int", lo=0, hi=1, default=0),
    }, Permission(group=True)),
    # a producer is alive (or leaves): the broker may send it requests on this connection (a
    # transaction check-back). SUB on the group, as a consumer's: an account may only take the
    # requests of groups it may use
    RequestCode.PRODUCER_HEARTBEAT: RequestSpec({
        "group": Field("group", required=True),
        "clientId": Field("str", required=True, lo=1, hi=255),
        "leave": Field("int", lo=0, hi=1, default=0),
    }, Permission(group=True), peer=True),
    RequestCode.GET_CONSUMER_CONNECTION_LIST: RequestSpec({
        "group": Field("group", required=True),
    }, _ADMIN),
    RequestCode.GET_PRODUCER_CONNECTION_LIST: RequestSpec({
        "group": Field("group", required=True),
        "runningInfo": Field("int", lo=0, hi=1, default=0),  # 1: ask each producer its figures
    }, _ADMIN),
    RequestCode.GET_CLIENT_RUNNING_INFO: RequestSpec({}, _ADMIN, served_by=TO_CLIENT),
    # POP (RocketMQ 5's PopMessageRequestHeader): written (a revive record) by the master,
    # answered once that record is durable; SUB on the topic and the group, as a pull's
    RequestCode.POP_MESSAGE: RequestSpec({
        "topic": _TOPIC,
        "group": Field("group", required=True),
        "queueId": Field("int", lo=-1, hi=MAX_QUEUE_ID, default=-1),  # -1: every queue
        "maxNums": Field("int", lo=1, hi=MAX_POP_NUMS, default=MAX_POP_NUMS),
        "invisibleTime": Field("int", required=True, lo=0, hi=MAX_INT32),
        "pollTime": Field("int", lo=0, hi=MAX_INT32, default=0),
        "initMode": Field("int", lo=0, hi=1, default=0),  # a new group: 0 the oldest, 1 new only
        # FIFO: a message group's in order (also when the group is consumeMessageOrderly)
        "order": Field("int", lo=0, hi=1, default=0),
        # -1: the group's retryMaxTimes (subscriptionGroup.json; 16 unless configured)
        "maxReconsumeTimes": Field("int", lo=-1, hi=1000, default=-1),
        "expressionType": Field("str", hi=16),
        "subscription": Field("str", hi=MAX_SUBSCRIPTION_LENGTH),
    }, _TOPIC_AND_GROUP, kind=WRITE, acked=True, names_topic=True),
    RequestCode.ACK_MESSAGE: RequestSpec({
        "topic": _TOPIC,
        "group": Field("group", required=True),
        "receiptHandle": Field("str", required=True, lo=1, hi=1024),
    }, _TOPIC_AND_GROUP, kind=WRITE, acked=True, names_topic=True),
    # the receipt handles are the body frames, one each
    RequestCode.BATCH_ACK_MESSAGE: RequestSpec({
        "topic": _TOPIC,
        "group": Field("group", required=True),
    }, _TOPIC_AND_GROUP, kind=WRITE, acked=True, names_topic=True, bodies=(1, None)),
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: RequestSpec({
        "topic": _TOPIC,
        "group": Field("group", required=True),
        "receiptHandle": Field("str", required=True, lo=1, hi=1024),
        "invisibleTime": Field("int", required=True, lo=0, hi=MAX_INT32),
    }, _TOPIC_AND_GROUP, kind=WRITE, acked=True, names_topic=True),
    # the halves the check-back gave up (TRANS_CHECK_MAX_TIME_TOPIC, queue 0), from a queue
    # offset: records of every topic's transactions, so an operator's
    RequestCode.QUERY_GIVEN_UP_TRANSACTIONS: RequestSpec({
        "fromOffset": Field("int", lo=0, hi=MAX_OFFSET, default=0),
        "maxNums": Field("int", lo=1, hi=MAX_PULL_NUMS, default=32),
    }, _ADMIN),
    # RocketMQ's EndTransactionRequestHeader; ``topic`` (the half's real topic, as RocketMQ
    # 5's header has it) is what PUB is checked on
    RequestCode.END_TRANSACTION: RequestSpec({
        "topic": _TOPIC,
        "producerGroup": Field("group", required=True),
        "tranStateTableOffset": Field("int", lo=0, hi=MAX_OFFSET, default=0),
        "commitLogOffset": Field("int", required=True, lo=0, hi=MAX_OFFSET),
        "commitOrRollback": Field("int", required=True, lo=0, hi=0xC),  # 0x8, 0xC (0: unknown)
        "fromTransactionCheck": Field("int", lo=0, hi=1, default=0),
        "msgId": Field("str", hi=255),
        "transactionId": Field("str", hi=255),
    }, _PUB, kind=WRITE, acked=True, names_topic=True),
    # the check-back: the half (a record) in the body; the producer answers ``state``
    RequestCode.CHECK_TRANSACTION_STATE: RequestSpec({
        "topic": _TOPIC,
        "producerGroup": Field("group", required=True),
        "tranStateTableOffset": Field("int", lo=0, hi=MAX_OFFSET, default=0),
        "commitLogOffset": Field("int", required=True, lo=0, hi=MAX_OFFSET),
        "msgId": Field("str", hi=255),
        "transactionId": Field("str", hi=255),
    }, _ADMIN, bodies=(1, 1), served_by=TO_CLIENT),
}
assert set(SPECS) == set(RequestCode), "every request code has its row in SPECS"

# derived from SPECS (the codec, the server and the ACL read these)
SCHEMAS: dict[RequestCode, Mapping[str, Field]] = {c: s.fields for c, s in SPECS.items()}
BODY_COUNTS: dict[RequestCode, tuple[int, int | None]] = {c: s.bodies for c, s in SPECS.items()}
WRITE_CODES = frozenset(c for c, s in SPECS.items() if s.kind == WRITE)

# One SEND_BATCH meta entry, in order; the last, sysFlag, may be left out (then 0).
META_ITEMS = ("tags", "keys", "properties", "flag", "sysFlag")


# ---- encoding -------------------------------------------------------------------------------

# A header is a msgpack fixarray: 4 elements for a request, 5 for a response. Both ends of a
# connection may send requests (the broker asks a client), so each tells them apart by this.
_REQUEST_MARK, _RESPONSE_MARK = 0x94, 0x95
REQUEST_MARK, RESPONSE_MARK = bytes((_REQUEST_MARK,)), bytes((_RESPONSE_MARK,))  # a header's 1st byte


def is_request(frames: Sequence[bytes]) -> bool:
    return bool(frames) and frames[0][:1] == REQUEST_MARK


def is_response(frames: Sequence[bytes]) -> bool:
    return bool(frames) and frames[0][:1] == RESPONSE_MARK



def encode_request(
    code: int, opaque: int, fields: Mapping[str, Any] | None = None, bodies: Sequence[bytes] = ()
) -> list[bytes]:
    """A request's frames: ``[header, *bodies]``. Where the C codec is built, this name is
    its encode_request (the end of this module), held to ``_encode_request_py`` by tests."""
    return _encode_request_py(code, opaque, fields, bodies)


def _encode_request_py(code: int, opaque: int, fields: Mapping[str, Any] | None = None,
                       bodies: Sequence[bytes] = ()) -> list[bytes]:
    header = msgpack.packb([PROTOCOL_VERSION, int(code), opaque, dict(fields or {})])
    return [header, *bodies]


def encode_response(
    code: int,
    opaque: int,
    remark: str = "",
    fields: Mapping[str, Any] | None = None,
    bodies: Sequence[bytes] = (),
) -> list[bytes]:
    """An answer's frames; as ``encode_request``, the C codec's where built."""
    return _encode_response_py(code, opaque, remark, fields, bodies)


def _encode_response_py(code: int, opaque: int, remark: str = "",
                        fields: Mapping[str, Any] | None = None,
                        bodies: Sequence[bytes] = ()) -> list[bytes]:
    header = msgpack.packb([PROTOCOL_VERSION, int(code), opaque, remark, dict(fields or {})])
    return [header, *bodies]


def error_response(err: ProtocolError) -> list[bytes]:
    return encode_response(err.code, err.opaque, err.remark, {"field": err.field})


# ---- decoding -------------------------------------------------------------------------------


def decode_request(frames: Sequence[bytes], limits: Limits) -> Request:
    """Check and decode a request; raises ProtocolError naming the field and reason.

    The nesting depth is looked at only when some check fails: a header that passes the
    schema is at most ``MAX_DEPTH`` deep by construction (every field's type is checked,
    properties hold only strings), and one that is deeper is refused for its depth first.

    Where the C codec is built (``_codec.c``) a plain request is decoded there; anything it does
    not take for plain comes here, the reference, which accepts it the same way or says why not
    (from the header the codec unpacked, when it got that far: its envelope and unpack are
    these, so the header is the one ``_unpack_header`` would make).
    """
    if _native is not None:
        out = _native.decode_request(frames, limits)
        if type(out) is Request:
            return out  # type: ignore[no-any-return]
        if out is not None:
            return _checked_request(out, frames, limits)
    return _decode_request_py(frames, limits)


def _decode_request_py(frames: Sequence[bytes], limits: Limits) -> Request:
    _check_envelope(frames, limits, limits.max_batch_count + 1)
    return _checked_request(_unpack_header(frames[0], limits, check_depth=False), frames, limits)


def _checked_request(header: Any, frames: Sequence[bytes], limits: Limits) -> Request:
    try:
        return _decode_request(header, frames, limits)
    except ProtocolError:
        if _depth_exceeds(header, MAX_DEPTH):
            raise ProtocolError("header", f"nesting deeper than {MAX_DEPTH}") from None
        raise


def _decode_request(header: Any, frames: Sequence[bytes], limits: Limits) -> Request:
    if type(header) is not list or len(header) != 4:
        raise ProtocolError("header", "must be an array [version, code, opaque, fields]")
    version, code, opaque, fields = header
    opaque_ok = type(opaque) is int and 0 <= opaque <= MAX_OFFSET
    if not opaque_ok:
        raise ProtocolError("opaque", "must be an int in [0, 2^63)")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            "version", f"{version!r} not supported (speak {PROTOCOL_VERSION})",
            ResponseCode.VERSION_NOT_SUPPORTED, opaque,
        )
    req_code = _REQUEST_CODES.get(code) if type(code) is int else None
    if req_code is None:
        raise ProtocolError(
            "code", f"unknown request code {code!r}", ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
            opaque,
        )
    try:
        checked = _check_fields(SCHEMAS[req_code], fields, limits)
        sizes = checked.pop("sizes", None) if req_code == RequestCode.SEND_BATCH else None
        if sizes is not None:
            bodies = _split_bodies(frames[1:], sizes)
        else:
            bodies = _check_bodies(req_code, frames[1:], limits)
        if req_code == RequestCode.SEND_BATCH:
            _check_meta_count(checked.get("meta"), len(bodies))
    except ProtocolError as e:
        e.opaque = opaque
        raise
    return Request(req_code, opaque, checked, bodies)


def decode_response(frames: Sequence[bytes], limits: Limits) -> Response:
    """Check and decode a response (the client side); raises ProtocolError. As
    ``decode_request``: plain answers in C where built, the rest here."""
    if _native is not None:
        out = _native.decode_response(frames, limits)
        if type(out) is Response:
            return out  # type: ignore[no-any-return]
        if out is not None:
            return _checked_response(_checked_depth(out), frames)
    return _decode_response_py(frames, limits)


def _decode_response_py(frames: Sequence[bytes], limits: Limits) -> Response:
    _check_envelope(frames, limits, limits.max_batch_count + 1)
    return _checked_response(_unpack_header(frames[0], limits), frames)


def _checked_response(header: Any, frames: Sequence[bytes]) -> Response:
    if type(header) is not list or len(header) != 5:
        raise ProtocolError("header", "must be an array [version, code, opaque, remark, fields]")
    version, code, opaque, remark, fields = header
    if version != PROTOCOL_VERSION:
        raise ProtocolError("version", f"{version!r} not supported")
    resp_code = _RESPONSE_CODES.get(code) if type(code) is int else None
    if resp_code is None:
        raise ProtocolError("code", f"unknown response code {code!r}")
    if type(opaque) is not int or opaque < UNKNOWN_OPAQUE:
        raise ProtocolError("opaque", "must be an int >= -1")
    if type(remark) is not str:
        raise ProtocolError("remark", "must be a string")
    if type(fields) is not dict:
        raise ProtocolError("fields", "must be a map")
    return Response(resp_code, opaque, remark, fields, list(frames[1:]))


_REQUEST_CODES: dict[int, RequestCode] = {int(c): c for c in RequestCode}
_RESPONSE_CODES: dict[int, ResponseCode] = {int(c): c for c in ResponseCode}

# The C codec's view of the field kinds (``_codec.c``): the kinds it checks itself; any other
# (meta, sizes) sends the request to the Python path.
_NATIVE_KINDS = {"int": 0, "str": 1, "topic": 2, "group": 3, "props": 4, "sysflag": 5, "role": 6,
                 "text": 7, "keys": 8}
_NATIVE_OTHER = 9


def _native_tables() -> dict[str, Any]:
    """What ``_codec.configure`` takes: each request code's schema as kinds and bounds, in the
    order ``_check_fields`` applies them, and the types and constants of this module."""
    schemas = {}
    for code, spec in SPECS.items():
        fields = {name: (_NATIVE_KINDS.get(f.kind, _NATIVE_OTHER), f.lo, f.hi)
                  for name, f in spec.fields.items()}
        compiled = _compiled(spec.fields)
        lo, hi = spec.bodies
        schemas[int(code)] = (fields, compiled.required, compiled.defaults, lo,
                              -1 if hi is None else hi)
    return {
        "schemas": schemas,
        "request_codes": _REQUEST_CODES,
        "response_codes": _RESPONSE_CODES,
        "request_type": Request,
        "response_type": Response,
        "born_host_default": Request._field_defaults["born_host"],
        "unpackb": msgpack.unpackb,
        "packer_type": msgpack.Packer,  # packb is Packer().pack, in Python
        "unpack_kwargs_of": _unpack_kwargs,
        "protocol_version": PROTOCOL_VERSION,
        "max_offset": MAX_OFFSET,
        "max_group_length": MAX_GROUP_LENGTH,
        "max_properties_bytes": record.MAX_PROPERTIES_BYTES,
        "client_sysflags": CLIENT_SYSFLAGS,
        "unknown_opaque": UNKNOWN_OPAQUE,
        "broker_only": boundary.BROKER_ONLY_KEY_STARTS,
        "uniq_key": PROPERTY_UNIQ_KEY,
    }



def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_envelope(frames: Sequence[bytes], limits: Limits, max_frames: int) -> None:
    if not frames:
        raise ProtocolError("frames", "empty message")
    if len(frames) > max_frames:
        raise ProtocolError("frames", f"{len(frames)} frames, at most {max_frames}")
    total = sum(map(len, frames))
    if total > limits.max_frame_bytes:
        raise ProtocolError("frames", f"{total} bytes, at most {limits.max_frame_bytes}")
    if not frames[0]:
        raise ProtocolError("header", "empty header frame")
    if len(frames[0]) > limits.max_header_bytes:
        raise ProtocolError("header", f"{len(frames[0])} bytes, at most {limits.max_header_bytes}")


_UNPACK_KWARGS: dict[int, dict[str, Any]] = {}
_INT_ONLY = {int}


def _unpack_kwargs(max_batch_count: int) -> dict[str, Any]:
    kwargs = _UNPACK_KWARGS.get(max_batch_count)
    if kwargs is None:
        kwargs = {
            "max_str_len": MAX_STR_BYTES,
            "max_bin_len": 0,
            "max_array_len": max_batch_count + 8,
            "max_map_len": MAX_MAP_ENTRIES,
            "max_ext_len": 0,
            "strict_map_key": True,
            "use_list": True,
        }
        if len(_UNPACK_KWARGS) < 64:
            _UNPACK_KWARGS[max_batch_count] = kwargs
    return kwargs


def _unpack_header(raw: bytes, limits: Limits, check_depth: bool = True) -> Any:
    kwargs = _unpack_kwargs(limits.max_batch_count)
    try:
        value = msgpack.unpackb(raw, raw=False, **kwargs)
    except UnicodeDecodeError:
        raise ProtocolError(_find_bad_utf8(raw, kwargs), "not valid UTF-8") from None
    except msgpack.StackError:
        raise ProtocolError("header", "nesting too deep") from None
    except msgpack.ExtraData:
        raise ProtocolError("header", "trailing bytes after the msgpack header") from None
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise ProtocolError("header", f"malformed msgpack: {e}") from None
    return _checked_depth(value) if check_depth else value


def _checked_depth(value: Any) -> Any:
    if _may_nest(value) and _depth_exceeds(value, MAX_DEPTH):
        raise ProtocolError("header", f"nesting deeper than {MAX_DEPTH}")
    return value


def _may_nest(header: Any) -> bool:
    """False for a ``[.., {name: scalar or [scalars]}]`` header (the usual answer): depth <= 3."""
    if type(header) is not list:
        return isinstance(header, dict)
    for item in header:
        if type(item) is dict:
            for value in item.values():
                if type(value) is list:
                    kinds = set(map(type, value))  # msgpack makes exact lists and dicts
                    if list in kinds or dict in kinds:
                        return True
                elif isinstance(value, list | dict):
                    return True
        elif isinstance(item, list):
            return True
    return False


def _find_bad_utf8(raw: bytes, kwargs: dict[str, Any]) -> str:
    """Name the field holding invalid UTF-8 (slow path: re-read with bytes for strings)."""
    try:
        value = msgpack.unpackb(raw, raw=True, **{**kwargs, "strict_map_key": False})
    except (ValueError, TypeError, msgpack.UnpackException):
        return "header"
    if isinstance(value, list) and len(value) >= 4 and isinstance(value[-1], dict):
        for key, item in value[-1].items():
            name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
            if _has_bad_utf8(key) or _has_bad_utf8(item):
                return name
    return "header"


def _has_bad_utf8(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bytes):
            try:
                item.decode("utf-8")
            except UnicodeDecodeError:
                return True
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
    return False


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Iterative depth check: True when containers nest deeper than ``limit``."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list | dict):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


@dataclasses.dataclass(frozen=True)
class _Compiled:
    """A schema prepared for checking: its names, what is required, the defaults."""

    names: frozenset[str]
    required: tuple[str, ...]
    defaults: tuple[tuple[str, Any], ...]


_COMPILED: dict[int, tuple[Mapping[str, Field], _Compiled]] = {}


def _compiled(schema: Mapping[str, Field]) -> _Compiled:
    """The prepared form of ``schema`` (cached for the schemas of ``SCHEMAS``)."""
    cached = _COMPILED.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    found = _Compiled(
        frozenset(schema),
        tuple(name for name, spec in schema.items() if spec.required),
        tuple((n, s.default) for n, s in schema.items() if s.default is not None),
    )
    if any(schema is known for known in SCHEMAS.values()):
        _COMPILED[id(schema)] = (schema, found)
    return found


def _check_fields(schema: Mapping[str, Field], fields: Any, limits: Limits) -> dict[str, Any]:
    if type(fields) is not dict:
        raise ProtocolError("fields", "must be a map of name -> value")
    compiled = _compiled(schema)
    if not compiled.names.issuperset(fields):
        name = next(n for n in fields if n not in compiled.names)
        raise ProtocolError(str(name)[:64], "unknown field for this request")
    for name in compiled.required:
        if fields.get(name) is None:
            raise ProtocolError(name, "required")
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if value is not None:
            out[name] = _check_value(name, schema[name], value, limits)
    for name, default in compiled.defaults:
        if name not in out:
            out[name] = default
    return out


def _check_value(name: str, spec: Field, value: Any, limits: Limits) -> Any:
    kind = spec.kind
    if kind == "int":
        if type(value) is not int:
            raise ProtocolError(name, f"expected int, got {type(value).__name__}")
        if not spec.lo <= value <= spec.hi:
            raise ProtocolError(name, f"{value} outside [{spec.lo}, {spec.hi}]")
        return value
    if kind == "str":
        return _check_str(name, value, spec.lo, spec.hi)
    if kind == "text":
        return _check_ruled(name, value, spec.lo, spec.hi, boundary.text_refusal)
    if kind == "keys":
        return _check_ruled(name, value, spec.lo, spec.hi, boundary.keys_refusal)
    if kind == "topic":
        return _check_name(name, value, limits.max_topic_length)
    if kind == "group":
        return _check_name(name, value, MAX_GROUP_LENGTH)
    if kind == "props":
        return _check_props(name, value)
    if kind == "meta":
        return _check_meta(name, value, limits)
    if kind == "sizes":
        return _check_sizes(name, value, limits)
    if kind == "sysflag":
        return _check_sys_flag(name, value)
    if kind == "role":
        if value not in ("SYNC_MASTER", "ASYNC_MASTER"):
            raise ProtocolError(name, "must be SYNC_MASTER or ASYNC_MASTER")
        return value
    raise AssertionError(f"unknown field kind {kind}")


def _check_str(name: str, value: Any, lo: int, hi: int) -> str:
    if not isinstance(value, str):
        raise ProtocolError(name, f"expected str, got {type(value).__name__}")
    size = len(value.encode("utf-8"))
    if not lo <= size <= hi:
        raise ProtocolError(name, f"{size} bytes, must be in [{lo}, {hi}]")
    return value


def _check_ruled(name: str, value: Any, lo: int, hi: int,
                 rule: Callable[[str], str | None]) -> str:
    """A string bound for a record, held to a boundary rule (``text_refusal``: tags and
    other text; ``keys_refusal``: a message's KEYS, each an index key of its own)."""
    text = _check_str(name, value, lo, hi)
    why = rule(text)
    if why is not None:
        raise ProtocolError(name, why)
    return text


_GOOD_NAMES: dict[str, int] = {}  # topic and group names already checked -> their UTF-8 size
MAX_GOOD_NAMES = 4096


def _check_name(name: str, value: Any, max_length: int) -> str:
    if type(value) is str:
        size = _GOOD_NAMES.get(value)
        if size is not None and size <= max_length:
            return value
    text = _check_str(name, value, 1, max_length)
    if not TOPIC_PATTERN.match(text):
        raise ProtocolError(name, "may only hold letters, digits, '%', '|', '_' and '-'")
    if len(_GOOD_NAMES) >= MAX_GOOD_NAMES:
        _GOOD_NAMES.clear()
    _GOOD_NAMES[text] = len(text.encode("utf-8"))
    return text


def _check_props(name: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ProtocolError(name, f"expected map, got {type(value).__name__}")
    size = 0
    for key, item in value.items():
        if not isinstance(item, str) or not key:
            raise ProtocolError(name, "entries must be non-empty str -> str")
        if boundary.has_separator(key) or boundary.has_separator(item):
            raise ProtocolError(name, f"names and values {boundary.SEPARATOR_REASON}")
        size += len(key) + len(item) + 2
    why = boundary.uniq_key_refusal(value)
    if why is not None:
        raise ProtocolError(name, why)
    if size > record.MAX_PROPERTIES_BYTES:
        raise ProtocolError(name, f"{size} bytes of properties, at most {record.MAX_PROPERTIES_BYTES}")
    return value


def _check_meta(name: str, value: Any, limits: Limits) -> list[tuple[Any, ...]]:
    """SEND_BATCH ``meta``: one ``[tags, keys, properties, flag(, sysFlag)]`` (or nil) per body."""
    if not isinstance(value, list):
        raise ProtocolError(name, f"expected array, got {type(value).__name__}")
    if len(value) > limits.max_batch_count:
        raise ProtocolError(name, f"{len(value)} entries, at most {limits.max_batch_count}")
    out: list[tuple[Any, ...]] = []
    for i, entry in enumerate(value):
        where = f"{name}[{i}]"
        if entry is None:
            out.append((None, None, {}, 0, 0))
            continue
        if not isinstance(entry, list) or not 4 <= len(entry) <= len(META_ITEMS):
            raise ProtocolError(where, "must be [tags, keys, properties, flag(, sysFlag)] or nil")
        tags, keys, props, flag = entry[:4]
        out.append(
            (
                None if tags is None else _check_ruled(where + ".tags", tags, 0, MAX_TAGS_LENGTH,
                                                      boundary.text_refusal),
                None if keys is None else _check_ruled(where + ".keys", keys, 0, MAX_KEYS_LENGTH,
                                                      boundary.keys_refusal),
                {} if props is None else _check_props(where + ".properties", props),
                _check_flag(where + ".flag", flag),
                _check_sys_flag(where + ".sysFlag", entry[4] if len(entry) > 4 else None,
                                SYSFLAG_COMPRESSED),  # a batch holds no half message
            )
        )
    return out


def _check_flag(name: str, value: Any) -> int:
    if value is None:
        return 0
    if not _is_int(value) or not -MAX_INT32 - 1 <= value <= MAX_INT32:
        raise ProtocolError(name, "must be an int32")
    return int(value)


def _check_sys_flag(name: str, value: Any, allowed: int = CLIENT_SYSFLAGS) -> int:
    """Only the SYSFLAG bits a producer sets (COMPRESSED, TRANSACTION_PREPARED on a half
    message; a batch's entries COMPRESSED only); the others (commit, rollback, IPv6 hosts,
    batch) are the broker's to set."""
    if value is None:
        return 0
    if not _is_int(value) or value & ~allowed or value < 0:
        names = "COMPRESSED" if allowed == SYSFLAG_COMPRESSED else \
            "COMPRESSED, TRANSACTION_PREPARED"
        raise ProtocolError(name, f"must be 0 or a mix of {allowed:#x} ({names})")
    return int(value)


def _check_bodies(code: RequestCode, bodies: Sequence[bytes], limits: Limits) -> list[bytes]:
    lo, hi = BODY_COUNTS.get(code, (0, 0))
    hi = limits.max_batch_count if hi is None else hi
    if not lo <= len(bodies) <= hi:
        raise ProtocolError("bodies", f"{len(bodies)} body frames, expected {lo}..{hi}")
    if not bodies or max(map(len, bodies)) <= limits.max_body_bytes:
        return list(bodies)
    for i, body in enumerate(bodies):
        if len(body) > limits.max_body_bytes:
            raise ProtocolError(
                f"bodies[{i}]",
                f"{len(body)} bytes, maxMessageSize is {limits.max_body_bytes}",
                ResponseCode.MESSAGE_ILLEGAL,
            )
    return list(bodies)


def _check_sizes(name: str, value: Any, limits: Limits) -> list[int]:
    """SEND_BATCH ``sizes``: 1..max_batch_count body lengths, each within maxMessageSize."""
    if type(value) is not list:
        raise ProtocolError(name, f"expected array, got {type(value).__name__}")
    if not 1 <= len(value) <= limits.max_batch_count:
        raise ProtocolError(name, f"{len(value)} entries, must be in [1, {limits.max_batch_count}]")
    if set(map(type, value)) != _INT_ONLY:  # exact ints: a bool is not a size
        raise ProtocolError(name, "entries must be ints")
    if min(value) < 0:
        raise ProtocolError(name, "entries must be >= 0")
    if max(value) <= limits.max_body_bytes:
        return value
    for i, size in enumerate(value):
        if size > limits.max_body_bytes:
            raise ProtocolError(
                f"bodies[{i}]",
                f"{size} bytes, maxMessageSize is {limits.max_body_bytes}",
                ResponseCode.MESSAGE_ILLEGAL,
            )
    return value


def _split_bodies(frames: Sequence[bytes], sizes: list[int]) -> list[bytes]:
    """The one body frame of a packed SEND_BATCH, cut at ``sizes``."""
    if len(frames) != 1:
        raise ProtocolError("bodies", f"{len(frames)} body frames with sizes, expected 1")
    packed = frames[0]
    if sum(sizes) != len(packed):
        raise ProtocolError("sizes", f"add up to {sum(sizes)} bytes, the frame holds {len(packed)}")
    ends = list(itertools.accumulate(sizes))
    return [packed[start:end] for start, end in zip([0, *ends], ends)]


def _check_meta_count(meta: list[Any] | None, bodies: int) -> None:
    if meta is not None and len(meta) != bodies:
        raise ProtocolError("meta", f"{len(meta)} entries for {bodies} bodies")


# ---- messages in responses ------------------------------------------------------------------


# the field a ProtocolError of ``decode_record`` names when the record is whole but its body,
# flagged COMPRESSED by its producer, does not inflate: the producer's fault, not the log's
BODY_FIELD = "record.body"


def decode_record(raw: bytes, max_inflated_bytes: int = MAX_INFLATED_BYTES) -> MessageExt:
    """A whole CommitLog record (a pull or query answer's body frame) -> MessageExt.

    The record is checked (magic, sizes, body CRC) before it is trusted; a bad one raises
    ProtocolError naming the reason. A COMPRESSED body is inflated (RocketMQ's
    ``MessageDecoder.decode(..., deCompressBody=true)``), at most to ``max_inflated_bytes``;
    one that does not inflate, or inflates past that, is a bad record too.
    """
    checked = record.check(raw, 0, len(raw))
    if checked.size <= 0 or checked.size != len(raw):
        raise ProtocolError("record", checked.reason or f"{checked.size} != {len(raw)} bytes")
    topic_at = record.HEADER.size + record.HEADER.unpack_from(raw)[-1]
    topic = raw[topic_at + 1 : topic_at + 1 + raw[topic_at]]
    try:
        topic.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("record.topic", "not valid UTF-8") from None
    msg = record.decode_message(raw)
    if msg.sys_flag & SYSFLAG_COMPRESSED:
        try:
            msg.body = inflate_body(msg.body, max_inflated_bytes, msg.sys_flag)
        except ValueError as e:
            raise ProtocolError(BODY_FIELD, str(e)) from None
    return msg


# last: the tables it takes are all defined above
_native = accel.load("common.format._codec")
if _native is not None:
    _native.configure(_native_tables())
    encode_request = _native.encode_request  # the same frames, in one C call
    encode_response = _native.encode_response
