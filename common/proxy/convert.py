"""Between RocketMQ 5's gRPC messages (``rocketmq.grpc_protocol``) and replog's: a sent
message's parts, a topic's queues as a route, and replog's answers as gRPC statuses (as
RocketMQ's proxy maps its broker's response codes)."""

from __future__ import annotations

import dataclasses
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from common.core.errors import BrokerError, ResponseCode, SendStatus
from common.core.message import PROPERTY_UNIQ_KEY

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
    reserves."""
    sp = msg.system_properties
    if sp.body_encoding not in (pb.IDENTITY, pb.ENCODING_UNSPECIFIED):
        raise ValueError(f"body encoding {pb.Encoding.Name(sp.body_encoding)} is not "
                         "supported: send the body as it is (IDENTITY)")
    properties = dict(msg.user_properties)
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
