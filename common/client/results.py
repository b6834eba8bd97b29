"""What a client call ends in: SendResult and PullResult built from a broker's answer, and the
client-side errors (no answer in time, a lost connection, no master)."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from common.core import accel
from common.core.errors import (
    BrokerError,
    CorruptMessageError,
    PullStatus,
    ResponseCode,
    SendStatus,
)
from common.core.message import MessageExt
from common.format import record
from common.format.protocol import (
    ProtocolError,
    Response,
    decode_record,
)

SEND_CODES = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}
PULL_CODES = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}
# Answers after which the cached master is no longer trusted.
# Answers meaning "stored, but no slave confirmed it": a reason to ask the group again who leads.


class ClientTimeoutError(BrokerError):
    """No answer within the deadline: the outcome of a write is unknown (retriable)."""

    def __init__(self, address: str, timeout_ms: int):
        super().__init__(
            ResponseCode.SYSTEM_ERROR, f"no answer from {address} within {timeout_ms} ms", True
        )
        self.address = address


class ConnectionLostError(ClientTimeoutError):
    """The connection a request went out on dropped before its answer came: no answer can come
    any more (libzmq discards what an IMMEDIATE socket's dropped connection held), so the call
    ends now rather than at its deadline. The outcome of a write is unknown (retriable)."""

    def __init__(self, address: str):
        BrokerError.__init__(
            self,
            ResponseCode.SYSTEM_ERROR,
            f"connection to {address} lost before the answer came (outcome unknown)",
            True,
        )
        self.address = address


class HandshakeError(BrokerError):
    """The CURVE handshake with ``address`` failed. Refused by the broker's ZAP (its ACL does not
    admit this client's key, or the account is disabled or not allowed from here):
    NO_PERMISSION, not retriable. Cut or garbled (the broker's key is not the pinned
    ``server_key``, or it runs without CURVE): SYSTEM_ERROR, retriable (also what a broker
    stopping mid-handshake looks like)."""

    def __init__(self, address: str, refused: bool, detail: str):
        if refused:
            super().__init__(
                ResponseCode.NO_PERMISSION,
                f"{address} refused this client's key at the CURVE handshake ({detail}): the "
                "broker's ACL holds no enabled account with it (or not from this address)",
                False,
            )
        else:
            super().__init__(
                ResponseCode.SYSTEM_ERROR,
                f"CURVE handshake with {address} failed ({detail}): is server_key that "
                "broker's public key, and does it run with aclEnable?",
                True,
            )
        self.address = address


class NoMasterError(BrokerError):
    """No broker of the group answers as master (SERVICE_NOT_AVAILABLE, retriable). While a
    master restarts or a slave is being promoted, sends wait for one up to their ``timeout_ms``
    without using up their retries (as Kafka's producer waits for a partition leader)."""

    def __init__(self, servers: Sequence[str], broker_name: str = "", detail: str = ""):
        where = f" in broker group {broker_name}" if broker_name else ""
        super().__init__(
            ResponseCode.SERVICE_NOT_AVAILABLE,
            f"no master answers{where} among {', '.join(servers)}"
            + (f" ({detail})" if detail else ""), True
        )
        self.servers = list(servers)
        self.broker_name = broker_name


# ---- results --------------------------------------------------------------------------------


class SendResult(NamedTuple):
    """One message's outcome (immutable; a tuple, so that a batch of them is cheap to make)."""

    status: SendStatus
    msg_id: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    topic: str = ""
    broker_name: str = ""  # the broker group that stored it: its queue is (broker_name, queue_id)
    recall_handle: str = ""  # a timer message's: Producer.recall cancels it with this

    def to_json(self) -> dict[str, Any]:
        out = {
            "status": self.status.value,
            "msgId": self.msg_id,
            "queueId": self.queue_id,
            "queueOffset": self.queue_offset,
            "commitLogOffset": self.commit_log_offset,
            "brokerName": self.broker_name,
        }
        if self.recall_handle:
            out["recallHandle"] = self.recall_handle
        return out


@dataclasses.dataclass(frozen=True)
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt]

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "nextBeginOffset": self.next_begin_offset,
            "minOffset": self.min_offset,
            "maxOffset": self.max_offset,
            "messages": [m.to_json() for m in self.messages],
        }


# Where the C codec is built, a send answer's SendResults are made there (``send_results`` in
# ``_codec.c``), one call for the whole batch; ``_send_results`` is the Python reference
# (tests/unit/client/test_client_results.py runs both).
_native_results = getattr(accel.load("common.format._codec"), "send_results", None)


def send_results(topic: str, resp: Response, broker_name: str = "") -> list[SendResult]:
    """A SEND / SEND_BATCH answer -> one SendResult per message (raises if refused).

    The answer carries the store host's msgId prefix (``storeHost``) and each record's CommitLog
    offset (``offsets``, or ``commitLogOffset`` alone for one record); each msgId is that prefix
    and the offset in 16 hex digits (RocketMQ's offsetMsgId).
    """
    status = SEND_CODES.get(resp.code)
    if status is None:
        raise BrokerError(resp.code, resp.remark)
    fields = resp.fields
    prefix = fields.get("storeHost")
    first_phy = fields.get("commitLogOffset")
    offsets = fields.get("offsets") or ([first_phy] if first_phy is not None else [])
    if type(prefix) is not str or len(prefix) != 16:
        raise BrokerError(ResponseCode.SYSTEM_ERROR, f"malformed send answer {fields!r:.200}")
    queue_id = int(fields.get("queueId", -1))
    first = int(fields.get("queueOffset", -1))
    handle = fields.get("recallHandle") or ""
    if type(handle) is not str:
        raise BrokerError(ResponseCode.SYSTEM_ERROR, f"malformed send answer {fields!r:.200}")
    if _native_results is not None and prefix.isascii():
        try:
            return _native_results(SendResult, status, prefix, offsets, queue_id, first, topic,
                                   broker_name, handle)
        except (ValueError, TypeError, OverflowError):
            pass  # anything unusual (a bad offset, a huge queue offset): the reference decides
    return _send_results(status, prefix, offsets, queue_id, first, topic, broker_name, handle,
                         fields)


def _send_results(status: SendStatus, prefix: str, offsets: list[Any], queue_id: int,
                  first: int, topic: str, broker_name: str, handle: str,
                  fields: dict[str, Any]) -> list[SendResult]:
    """``send_results``' loop in Python: the reference the C one (``_codec.send_results``) is
    held to, and what runs where the extension is not built."""
    if (not set(map(type, offsets)) <= {int}
            or not 0 <= min(offsets, default=0) <= max(offsets, default=0) < 1 << 63):
        raise BrokerError(ResponseCode.SYSTEM_ERROR, f"malformed send answer {fields!r:.200}")
    make = tuple.__new__  # SendResult's fields in order, without its Python-level __new__
    cls = SendResult
    if len(offsets) < 8:
        ids = [f"{prefix}{phy:016X}" for phy in offsets]
    else:  # one hex conversion for the whole batch, cut in 16 digits per id
        digits = struct.pack(f">{len(offsets)}Q", *offsets).hex().upper()
        ids = [prefix + digits[i : i + 16] for i in range(0, len(digits), 16)]
    return [
        make(cls, (status, msg_id, queue_id, first + i, phy, topic, broker_name, handle))
        for i, (msg_id, phy) in enumerate(zip(ids, offsets, strict=True))
    ]


def pack_bodies(fields: dict[str, Any], bodies: list[bytes]) -> list[bytes]:
    """A SEND_BATCH's bodies back to back in one frame, their lengths in ``fields["sizes"]``
    (one frame instead of one per message: each frame costs a library call on both sides)."""
    fields["sizes"] = [len(b) for b in bodies]
    return [b"".join(bodies)]


def pull_result(resp: Response, broker_name: str = "") -> PullResult:
    """A PULL answer -> PullResult. A record that fails its checks (here: the CRCs; on the
    broker: where the queue entry leads) ends the messages before it; when it is the first,
    CorruptMessageError names its queue offset, so a consumer can decide to skip it."""
    f = resp.fields
    status = PULL_CODES.get(resp.code)
    if status is None:
        if "corruptQueueOffset" in f:
            raise CorruptMessageError(int(f["corruptQueueOffset"]),
                                      int(f.get("corruptCommitLogOffset", -1)), resp.remark)
        raise BrokerError(resp.code, resp.remark)
    messages = []
    next_begin = int(f.get("nextBeginOffset", 0))
    for raw in resp.bodies:
        try:
            messages.append(decode_record(raw))
        except ProtocolError as e:
            queue_offset, phy = (
                _RECORD_OFFSETS.unpack_from(raw, record.POS_QUEUE_OFFSET)
                if len(raw) >= record.POS_PHY_OFFSET + 8 else (-1, -1))
            if not messages:
                raise CorruptMessageError(queue_offset, phy, e.reason) from None
            next_begin = messages[-1].queue_offset + 1  # the next pull meets it first
            break
    if broker_name:
        for m in messages:
            m.broker_name = broker_name
    return PullResult(
        status,
        next_begin,
        int(f.get("minOffset", 0)),
        int(f.get("maxOffset", 0)),
        messages,
    )


_RECORD_OFFSETS = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET (adjacent)
