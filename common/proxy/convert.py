"""Between RocketMQ 5's gRPC messages (``rocketmq.grpc_protocol``) and replog's: a sent
message's parts, a topic's queues as a route, and replog's answers as gRPC statuses (as
RocketMQ's proxy maps its broker's response codes)."""

from __future__ import annotations

import base64
import dataclasses
import logging
import zlib
from collections.abc import Sequence
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from common.core import accel
from common.core.errors import BrokerError, ResponseCode, SendStatus
from common.core.message import (
    PROPERTY_KEYS,
    PROPERTY_SHARDING_KEY,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
)
from common.format import boundary
from common.format.protocol import BODY_FIELD, ProtocolError, Response, decode_record

log = logging.getLogger("replog.proxy")

MESSAGE_TYPES = {"NORMAL": pb.NORMAL, "FIFO": pb.FIFO, "DELAY": pb.DELAY,
                 "TRANSACTION": pb.TRANSACTION}
# a topic made without ``message.type`` (or MIXED, or auto-created) takes every type, so the
# official clients' type check passes whatever they send
EVERY_TYPE = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)

# replog's answer -> gRPC code (RocketMQ's proxy: ResponseCode -> apache.rocketmq.v2.Code)
CODES = {
    ResponseCode.TOPIC_NOT_EXIST: pb.TOPIC_NOT_FOUND,
    ResponseCode.NO_PERMISSION: pb.FORBIDDEN,
    ResponseCode.MESSAGE_ILLEGAL: pb.BAD_REQUEST,
    ResponseCode.BAD_REQUEST: pb.BAD_REQUEST,
    ResponseCode.SYSTEM_BUSY: pb.TOO_MANY_REQUESTS,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: pb.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: pb.ILLEGAL_FILTER_EXPRESSION,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: pb.NOT_IMPLEMENTED,
}
SEND_CODES = {
    SendStatus.SEND_OK: pb.OK,
    SendStatus.FLUSH_DISK_TIMEOUT: pb.MASTER_PERSISTENCE_TIMEOUT,
    SendStatus.FLUSH_SLAVE_TIMEOUT: pb.SLAVE_PERSISTENCE_TIMEOUT,
    SendStatus.SLAVE_NOT_AVAILABLE: pb.HA_NOT_AVAILABLE,
}


def status(code: int, message: str = "OK") -> pb.Status:
    return pb.Status(code=code, message=message)


def error_status(e: BrokerError) -> pb.Status:
    """A refusal: its gRPC code (INTERNAL_SERVER_ERROR for what the client may retry: no
    master now, a broker draining), replog's remark as the message."""
    return status(CODES.get(e.code, pb.INTERNAL_SERVER_ERROR), f"{e.code.name}: {e.remark}")


def handle_status(e: BrokerError) -> pb.Status:
    """An ack's or a change's refusal: a receipt handle that is not one, not the message's
    newest, or never handed out is INVALID_RECEIPT_HANDLE (RocketMQ's proxy's answer)."""
    if e.code in (ResponseCode.MESSAGE_ILLEGAL, ResponseCode.BAD_REQUEST):
        return status(pb.INVALID_RECEIPT_HANDLE, f"{e.code.name}: {e.remark}")
    return error_status(e)


def overall(entries: Sequence[Any]) -> pb.Status:
    """The status of a request of several entries: theirs when they agree, else
    MULTIPLE_RESULTS (the client reads each entry's)."""
    codes = {e.status.code for e in entries}
    if not entries:
        return status(pb.BAD_REQUEST, "no entry")
    if len(codes) == 1:
        return entries[0].status
    return status(pb.MULTIPLE_RESULTS, "the entries' results differ")


def permission(perm: int) -> int:
    """RocketMQ's PermName bits -> the route's Permission."""
    readable, writable = bool(perm & 4), bool(perm & 2)
    if readable and writable:
        return pb.READ_WRITE
    if readable:
        return pb.READ
    return pb.WRITE if writable else pb.NONE


def accepted_types(message_type: str) -> tuple[int, ...]:
    """A topic's ``message.type`` attribute -> the message types its queues take."""
    one = MESSAGE_TYPES.get(message_type)
    return EVERY_TYPE if one is None else (one,)


@dataclasses.dataclass
class Outgoing:
    """What replog's ``Producer.send`` takes, from one gRPC message."""

    topic: str
    body: bytes
    tags: str | None
    keys: list[str]
    properties: dict[str, str]
    shard_key: str | None
    deliver_at_ms: int | None
    message_type: int
    message_id: str

    def send_args(self) -> dict[str, Any]:
        return {"tags": self.tags, "keys": self.keys or None, "properties": self.properties,
                "shard_key": self.shard_key, "deliver_at": self.deliver_at_ms}


def outgoing(msg: pb.Message) -> Outgoing:
    """A gRPC message to send; ValueError (BAD_REQUEST to the client) for what replog cannot
    store as it was meant: a compressed body encoding it does not know, a property name it
    reserves, a property separator in a string bound for the record (``boundary.py``)."""
    sp = msg.system_properties
    if sp.body_encoding not in (pb.IDENTITY, pb.ENCODING_UNSPECIFIED):
        raise ValueError(f"body encoding {pb.Encoding.Name(sp.body_encoding)} is not "
                         "supported: send the body as it is (IDENTITY)")
    for name, texts in (("tag", (sp.tag,)), ("keys", sp.keys), ("message_group",
                        (sp.message_group,)), ("message_id", (sp.message_id,))):
        why = boundary.texts_refusal(texts)
        if why is not None:
            raise ValueError(f"system_properties.{name} {why}")
    # the index keys: none may be the broker's own (``boundary.key_refusal``)
    for name, key in (("keys", " ".join(sp.keys)), ("message_id", sp.message_id)):
        why = boundary.keys_refusal(key)
        if why is not None:
            raise ValueError(f"system_properties.{name} {why}")
    properties = dict(msg.user_properties)
    why = boundary.properties_refusal(properties)
    if why is not None:
        raise ValueError(f"user_properties: {why}")
    reserved = boundary.broker_only(properties)
    if reserved is not None:
        raise ValueError(f"user property {reserved} is set by the broker, not by a producer")
    if PROPERTY_UNIQ_KEY in properties:
        raise ValueError(f"user property {PROPERTY_UNIQ_KEY} is reserved (the message id)")
    if sp.message_id:
        properties[PROPERTY_UNIQ_KEY] = sp.message_id
    deliver_at = None
    if sp.HasField("delivery_timestamp"):
        ts = sp.delivery_timestamp
        deliver_at = ts.seconds * 1000 + ts.nanos // 1_000_000
    return Outgoing(topic=msg.topic.name, body=msg.body, tags=sp.tag or None,
                    keys=list(sp.keys), properties=properties,
                    shard_key=sp.message_group or None, deliver_at_ms=deliver_at,
                    message_type=sp.message_type, message_id=sp.message_id)


# replog's and RocketMQ's system properties: carried in SystemProperties or not at all, never
# among a received message's user properties (a client that sends a received message on keeps
# its user properties, and one only the broker sets would be refused)
SYSTEM_PROPERTIES = boundary.BROKER_ONLY_PROPERTIES | frozenset({
    PROPERTY_UNIQ_KEY, "KEYS", "TAGS", "WAIT", "DELAY", "REAL_TOPIC", "REAL_QID", "RETRY_TOPIC",
    "ORIGIN_MESSAGE_ID", "__SHARDINGKEY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC",
    "TIMER_DELAY_MS", "TRAN_MSG", "PGROUP", "CHECK_IMMUNITY_TIME_IN_SECONDS", "MSG_REGION",
    "TRACE_ON", "CLUSTER", "MAX_OFFSET", "MIN_OFFSET",
})


def ms(duration: Any) -> int:
    """A protobuf Duration -> milliseconds."""
    return int(duration.seconds) * 1000 + int(duration.nanos) // 1_000_000


def timestamp(ms_value: int) -> Any:
    from google.protobuf.timestamp_pb2 import Timestamp

    return Timestamp(seconds=ms_value // 1000, nanos=(ms_value % 1000) * 1_000_000)


def incoming(received: Any) -> pb.Message:
    """A message replog handed out by POP (``common.client.Received``) -> the gRPC message the
    official consumers read: ``message_of``'s, with the delivery attempt (hand-outs so far,
    this one included), the receipt handle, its queue and offset, and its message group."""
    msg = received.message
    group = msg.properties.get("__SHARDINGKEY")
    out = message_of(msg, msg.topic, pb.FIFO if group else pb.NORMAL)
    sp = out.system_properties
    sp.receipt_handle = received.receipt_handle
    sp.queue_id, sp.queue_offset = msg.queue_id, msg.queue_offset
    sp.delivery_attempt = msg.reconsume_times + 1
    if group:
        sp.message_group = group
    return out


def received(resp: Response) -> list[rpc.ReceiveMessageResponse]:
    """A POP answer (SUCCESS) -> the ReceiveMessageResponse of each message it hands out, in
    order: ``incoming``'s message for each, made in C from the record's bytes where built
    (``_received.c``; what it leaves, and everything without it, by ``decode_record`` and
    ``incoming``). BrokerError SYSTEM_ERROR for an answer whose parts do not line up or a record
    that fails its checks, as ``SimpleConsumer.receive`` refuses them; a whole record whose
    COMPRESSED body does not inflate (its producer's doing) is left out, as there."""
    handles = list(resp.fields.get("handles") or [])
    times = list(resp.fields.get("reconsumeTimes") or [])
    bodies = resp.bodies if isinstance(resp.bodies, list) else list(resp.bodies)
    if not len(handles) == len(times) == len(bodies):
        raise BrokerError(ResponseCode.SYSTEM_ERROR, "a POP answer whose handles, counts and "
                          "messages do not line up")
    made = (_native.encode_received(bodies, handles, times) if _native is not None
            else [None] * len(bodies))
    parse = rpc.ReceiveMessageResponse.FromString
    out = []
    for raw, handle, n, data in zip(bodies, handles, times, made, strict=True):
        if data is not None:
            out.append(parse(data))
            continue
        try:
            msg = decode_record(raw)
        except ProtocolError as e:
            if e.field == BODY_FIELD:  # one producer's body: the others are still handed on
                log.warning("event=pop_body_unreadable handle=%s reason=%s", handle, e.reason)
                continue  # not acked: it comes back, then goes to the DLQ
            raise BrokerError(ResponseCode.SYSTEM_ERROR, f"corrupt record in answer: {e}") \
                from None
        if not 0 <= int(n) < 2**31 - 1:  # its delivery attempt (n + 1) is an int32
            raise BrokerError(ResponseCode.SYSTEM_ERROR, f"a POP answer's count {n} is not one")
        msg.reconsume_times = int(n)
        out.append(rpc.ReceiveMessageResponse(message=incoming(_Received(msg, str(handle)))))
    return out


class _Received:
    """What ``incoming`` reads of a received message (``common.client.Received``'s fields)."""

    __slots__ = ("message", "receipt_handle")

    def __init__(self, message: Any, receipt_handle: str):
        self.message, self.receipt_handle = message, receipt_handle


def transaction_id(broker: str, topic: str, commit_log_offset: int, queue_offset: int,
                   msg_id: str, token: str) -> str:
    """What an END needs, in the id the client hands back (RocketMQ's proxy encodes its
    TransactionId the same way): no state is kept, so any proxy can end any transaction.
    ``token``: the broker's transaction id of the half, which the broker requires of an END
    (the rest is offsets, which anyone may guess)."""
    raw = f"v1 {broker} {topic} {commit_log_offset} {queue_offset} {msg_id} {token}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def parse_transaction_id(text: str) -> tuple[str, str, int, int, str, str]:
    """ValueError for what ``transaction_id`` did not make."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        v, broker, topic, clo, qo, msg_id, uniq = raw.split(" ")
        if v != "v1":
            raise ValueError(v)
        return broker, topic, int(clo), int(qo), msg_id, uniq
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"transaction id {text[:64]!r} is not one this front end made") \
            from e


def message_of(msg: Any, topic: str, message_type: int) -> pb.Message:
    """A stored message -> the gRPC message, under ``topic``: the id its producer gave it
    (else its msgId), its CRC32 body digest, tag, keys, times and hosts, and its user
    properties (replog's and RocketMQ's system properties left out).

    Its fields are set in place, not built as messages and copied in (a receive converts 32 of
    these on the front end's one event loop: 3.5 us a message against 7 us)."""
    props = msg.properties
    out = pb.Message(topic=pb.Resource(name=topic), body=msg.body,
                     user_properties={k: v for k, v in props.items()
                                      if k not in SYSTEM_PROPERTIES})
    sp = out.system_properties
    sp.message_id = props.get(PROPERTY_UNIQ_KEY) or msg.msg_id
    digest = sp.body_digest
    digest.type = pb.CRC32
    digest.checksum = format(zlib.crc32(msg.body), "08X")
    sp.body_encoding = pb.IDENTITY
    sp.message_type = message_type
    born, stored = msg.born_timestamp, msg.store_timestamp
    sp.born_timestamp.seconds, sp.born_timestamp.nanos = born // 1000, born % 1000 * 1_000_000
    sp.store_timestamp.seconds, sp.store_timestamp.nanos = (stored // 1000,
                                                            stored % 1000 * 1_000_000)
    sp.born_host = msg.born_host.rpartition(":")[0] or msg.born_host
    sp.store_host = msg.store_host
    if msg.tags:
        sp.tag = msg.tags
    keys = msg.key_list()
    if keys:
        sp.keys.extend(keys)
    return out


# a POP answer's records to gRPC bytes in C, where built (common/proxy/_received.c)
_native = accel.load("common.proxy._received")
if _native is not None:
    _native.configure(PROPERTY_UNIQ_KEY.encode(), PROPERTY_TAGS.encode(), PROPERTY_KEYS.encode(),
                      PROPERTY_SHARDING_KEY.encode(),
                      tuple(sorted(name.encode() for name in SYSTEM_PROPERTIES)))
