"""HA replication frames: pure encode/decode, no sockets.

Transport: ZeroMQ multipart, slave DEALER -> master ROUTER (the ROUTER's identity frame is the
driver's business and never reaches these functions). Every message is one msgpack *header*
frame, a list whose first element is the frame type; a DATA message adds exactly one raw frame
holding CommitLog bytes, which are passed through untouched (never re-encoded, never copied here).

Every header carries the slave's ``session``: a number the slave picks for each HELLO and the
master echoes in every frame of that handshake, so a frame from an older handshake is
recognised and ignored (ZeroMQ reconnects silently; a stale reply must never truncate a log).

| type | name        | direction      | header fields after the type                              | raw |
|------|-------------|----------------|-----------------------------------------------------------|-----|
|  1   | HELLO       | slave->master  | version, session, broker_name, broker_id, max_phy_offset, | no  |
|      |             |                | slave_address, epochs [[epoch, start_phy_offset], ...]    |     |
|  2   | HELLO_REPLY | master->slave  | session, epoch, min_phy_offset, max_phy_offset,           | no  |
|      |             |                | start_phy_offset, epochs [[epoch, start_phy_offset], ...],|     |
|      |             |                | master_address (its client host:port; optional)           |     |
|  3   | DATA        | master->slave  | session, epoch, epoch_start_phy_offset, phy_offset,       | yes |
|      |             |                | length (== len(raw), 1..haTransferBatchSize),             |     |
|      |             |                | confirm_offset (optional; -1: none)                       |     |
|  4   | ACK         | slave->master  | session, ack_offset (the slave's max offset; heartbeat),  | no  |
|      |             |                | epoch (the newest the slave knows; optional, 0: unknown)  |     |
|  5   | HEARTBEAT   | master->slave  | session, epoch, max_phy_offset, sent_phy_offset,          | no  |
|      |             |                | confirm_offset (optional; -1: none)                       |     |
|  6   | ERROR       | either         | session, code (ResponseCode), phy_offset (-1: none),      | no  |
|      |             |                | reason (UTF-8)                                            |     |

``start_phy_offset`` in HELLO_REPLY is where streaming starts; when it is below the slave's max
the slave first truncates its log there (the point where the epoch histories stop agreeing).
``master_address`` in HELLO_REPLY is where the master serves clients (``brokerIP1:listenPort``),
which a slave reports as its ``masterAddress`` (RocketMQ's ``masterAddr``; the HA address it
connects to is its ``haMasterAddress``). A reply without it (six fields, as before the field
was added) decodes with ``""``.
``epoch`` in ACK is the newest epoch the slave knows, from its epoch file or from the controller
(``docs/operations.md``, automatic failover): a master of an older epoch that reads it knows it
has been replaced and stops acknowledging writes. An ACK of two fields (before the field was
added) decodes with 0.
``confirm_offset`` in DATA and HEARTBEAT is the master's confirmed offset (RocketMQ 5's
``confirmOffset``): in controller mode, what every member of the SyncStateSet holds. A slave
serves consumers nothing past it (``MessageStore.set_confirm_offset``), so a read from a slave
never returns a record that a failover to another member could drop. -1 (a master without
the controller, or a frame without the field): nothing is held back.
``sent_phy_offset`` in HEARTBEAT is how far the master has streamed in this session: a slave
holding less knows bytes were lost and asks again. ERROR with OFFSET_OUT_OF_RANGE carries in
``phy_offset`` the master's min offset (slave too far behind) or the truncate point.

Every length and count read off the wire is checked against ``Limits`` before anything is
allocated (msgpack's own ``max_*_len`` guards plus a header-size cap); any malformed frame
raises ``HAProtocolError`` with a reason and nothing else.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import msgpack

from common.core import accel
from common.core.config import HA_MAX_TRANSFER_BATCH, BrokerConfig
from common.core.errors import ResponseCode
from common.ha.epochs import EpochEntry, EpochHistory

PROTOCOL_VERSION = 1
MAX_OFFSET = (1 << 63) - 1
MAX_SESSION = (1 << 64) - 1
NO_OFFSET = -1
_MAX_EPOCH = (1 << 31) - 1
MAX_REASON_BYTES = 1024  # an encoded ERROR reason is cut to this


class HAProtocolError(ValueError):
    """A frame that cannot be decoded or breaks a limit; the reason says which field and why."""


class FrameType(enum.IntEnum):
    HELLO = 1
    HELLO_REPLY = 2
    DATA = 3
    ACK = 4
    HEARTBEAT = 5
    ERROR = 6


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """Bounds applied while decoding (TigerStyle: bound everything read off the wire)."""

    max_data_bytes: int = 32 * 1024
    max_epochs: int = 1000
    max_text_bytes: int = 256
    max_reason_bytes: int = MAX_REASON_BYTES

    @classmethod
    def from_config(cls, cfg: BrokerConfig) -> Limits:
        """A slave accepts DATA frames up to ``HA_MAX_TRANSFER_BATCH`` (its master's
        ``haTransferBatchSize`` may differ from its own), never less than its own setting."""
        return cls(max_data_bytes=max(cfg.haTransferBatchSize, HA_MAX_TRANSFER_BATCH))

    @property
    def max_header_bytes(self) -> int:
        # HELLO is the largest header: epochs (<= 19 bytes each) plus two strings and ints.
        return 64 + self.max_epochs * 19 + 2 * self.max_text_bytes + self.max_reason_bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Hello:
    session: int
    broker_name: str
    broker_id: int
    max_phy_offset: int
    slave_address: str
    epochs: EpochHistory
    version: int = PROTOCOL_VERSION


@dataclasses.dataclass(frozen=True, slots=True)
class HelloReply:
    session: int
    epoch: int
    min_phy_offset: int
    max_phy_offset: int
    start_phy_offset: int
    epochs: EpochHistory
    master_address: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Data:
    """A DATA frame; ``data`` is the raw ZeroMQ frame (bytes or memoryview), not a copy."""

    session: int
    epoch: int
    epoch_start_phy_offset: int
    phy_offset: int
    data: bytes | memoryview
    confirm_offset: int = NO_OFFSET

    @property
    def end_phy_offset(self) -> int:
        return self.phy_offset + len(self.data)


@dataclasses.dataclass(frozen=True, slots=True)
class Ack:
    session: int
    ack_offset: int
    epoch: int = 0  # the newest epoch the slave knows (0: not said)


@dataclasses.dataclass(frozen=True, slots=True)
class Heartbeat:
    session: int
    epoch: int
    max_phy_offset: int
    sent_phy_offset: int
    confirm_offset: int = NO_OFFSET


@dataclasses.dataclass(frozen=True, slots=True)
class Error:
    session: int
    code: ResponseCode
    phy_offset: int
    reason: str


Frame: TypeAlias = Hello | HelloReply | Data | Ack | Heartbeat | Error


# ---- encoding --------------------------------------------------------------------------------
def _pack(items: list[Any]) -> bytes:
    return msgpack.packb(items, use_bin_type=True)


def _epochs_out(epochs: EpochHistory) -> list[list[int]]:
    return [[e.epoch, e.start_phy_offset] for e in epochs]


def encode(frame: Frame) -> list[bytes | memoryview]:
    """The multipart frames for one message (DATA: header plus the untouched raw bytes)."""
    if isinstance(frame, Data):
        return encode_data(
            frame.session, frame.epoch, frame.epoch_start_phy_offset, frame.phy_offset, frame.data,
            frame.confirm_offset,
        )
    return [encode_header(frame)]


def encode_header(frame: Hello | HelloReply | Ack | Heartbeat | Error) -> bytes:
    """The single header frame of a message without raw bytes."""
    if isinstance(frame, Hello):
        return _pack([FrameType.HELLO, frame.version, frame.session, frame.broker_name,
                      frame.broker_id, frame.max_phy_offset, frame.slave_address,
                      _epochs_out(frame.epochs)])
    if isinstance(frame, HelloReply):
        return _pack([FrameType.HELLO_REPLY, frame.session, frame.epoch, frame.min_phy_offset,
                      frame.max_phy_offset, frame.start_phy_offset, _epochs_out(frame.epochs),
                      frame.master_address])
    if isinstance(frame, Ack):
        return _pack([FrameType.ACK, frame.session, frame.ack_offset, frame.epoch])
    if isinstance(frame, Heartbeat):
        return _pack([FrameType.HEARTBEAT, frame.session, frame.epoch, frame.max_phy_offset,
                      frame.sent_phy_offset, frame.confirm_offset])
    reason = frame.reason.encode("utf-8")[:MAX_REASON_BYTES].decode("utf-8", "ignore")
    return _pack([FrameType.ERROR, frame.session, int(frame.code), frame.phy_offset, reason])


def encode_ack(session: int, ack_offset: int, epoch: int) -> bytes:
    """An ACK's one frame, as ``encode_header(Ack(session, ack_offset, epoch))`` makes it (a
    slave sends one per DATA it stored); the C codec's where built."""
    return _pack([FrameType.ACK, session, ack_offset, epoch])


def encode_data(
    session: int, epoch: int, epoch_start_phy_offset: int, phy_offset: int,
    data: bytes | memoryview, confirm_offset: int = NO_OFFSET,
) -> list[bytes | memoryview]:
    """DATA header plus ``data`` itself as the second frame (zero copies here). Where the C
    codec is built, this name is its encode_data (the end of this module)."""
    return _encode_data_py(session, epoch, epoch_start_phy_offset, phy_offset, data,
                           confirm_offset)


def _encode_data_py(
    session: int, epoch: int, epoch_start_phy_offset: int, phy_offset: int,
    data: bytes | memoryview, confirm_offset: int = NO_OFFSET,
) -> list[bytes | memoryview]:
    header = _pack([FrameType.DATA, session, epoch, epoch_start_phy_offset, phy_offset, len(data),
                    confirm_offset])
    return [header, data]


# ---- decoding --------------------------------------------------------------------------------
def decode(frames: Sequence[bytes | memoryview], limits: Limits) -> Frame:
    """One message from its multipart frames; raises HAProtocolError on anything malformed.

    Where the C codec is built (``_ha_codec.c``), a plain DATA or ACK is decoded there; any
    other frame, and anything it does not take for plain, comes here, the reference."""
    if _native is not None:
        frame = _native.decode(frames, limits)
        if frame is not None:
            return frame  # type: ignore[no-any-return]
    return _decode_py(frames, limits)


def _decode_py(frames: Sequence[bytes | memoryview], limits: Limits) -> Frame:
    if not frames:
        raise HAProtocolError("empty message: no header frame")
    items = _unpack_header(frames[0], limits)
    kind = _frame_type(items[0])
    want_frames = 2 if kind is FrameType.DATA else 1
    if len(frames) != want_frames:
        raise HAProtocolError(f"{kind.name}: expected {want_frames} frame(s), got {len(frames)}")
    fields = items[1:]
    if kind is FrameType.DATA:
        return _decode_data(fields, frames[1], limits)
    return _DECODERS[kind](fields, limits)


def _unpack_header(raw: bytes | memoryview, limits: Limits) -> list[Any]:
    if len(raw) > limits.max_header_bytes:
        raise HAProtocolError(f"header of {len(raw)} bytes exceeds {limits.max_header_bytes}")
    try:
        items = msgpack.unpackb(raw, **_unpack_kwargs(limits))
    except (ValueError, TypeError) as e:  # msgpack's errors (incl. ExtraData, StackError)
        raise HAProtocolError(f"undecodable header: {type(e).__name__}: {e}") from None
    if not isinstance(items, list) or not items:
        raise HAProtocolError(f"header must be a non-empty list, got {type(items).__name__}")
    return items


def _unpack_kwargs(limits: Limits) -> dict[str, Any]:
    """msgpack's bounds for a header under ``limits`` (the C codec reads them once per Limits)."""
    return {"raw": False, "use_list": True, "strict_map_key": True,
            "max_str_len": max(limits.max_text_bytes, limits.max_reason_bytes),
            "max_bin_len": 0, "max_array_len": max(limits.max_epochs, 8), "max_map_len": 0,
            "max_ext_len": 0}


def _frame_type(value: Any) -> FrameType:
    if not _is_int(value):
        raise HAProtocolError(f"frame type must be an int, got {type(value).__name__}")
    try:
        return FrameType(value)
    except ValueError:
        raise HAProtocolError(f"unknown frame type {value}") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fields(kind: FrameType, fields: list[Any], names: tuple[str, ...]) -> dict[str, Any]:
    if len(fields) != len(names):
        raise HAProtocolError(f"{kind.name}: expected {len(names)} fields, got {len(fields)}")
    return dict(zip(names, fields, strict=True))


def _int(kind: FrameType, name: str, value: Any, low: int = 0, high: int = MAX_OFFSET) -> int:
    if not _is_int(value):
        raise HAProtocolError(f"{kind.name}.{name}: expected int, got {type(value).__name__}")
    if not low <= value <= high:
        raise HAProtocolError(f"{kind.name}.{name}: {value} outside [{low}, {high}]")
    return int(value)


def _text(kind: FrameType, name: str, value: Any, max_bytes: int) -> str:
    if not isinstance(value, str):
        raise HAProtocolError(f"{kind.name}.{name}: expected str, got {type(value).__name__}")
    if len(value.encode("utf-8")) > max_bytes:
        raise HAProtocolError(f"{kind.name}.{name}: longer than {max_bytes} bytes")
    return value


def _epochs(kind: FrameType, value: Any, limits: Limits) -> EpochHistory:
    if not isinstance(value, list):
        raise HAProtocolError(f"{kind.name}.epochs: expected list, got {type(value).__name__}")
    if len(value) > limits.max_epochs:
        raise HAProtocolError(f"{kind.name}.epochs: {len(value)} entries > {limits.max_epochs}")
    out: list[EpochEntry] = []
    for pair in value:
        if not isinstance(pair, list) or len(pair) != 2:
            raise HAProtocolError(f"{kind.name}.epochs: each entry must be [epoch, start]")
        entry = EpochEntry(_int(kind, "epoch", pair[0], 1, _MAX_EPOCH),
                           _int(kind, "start_phy_offset", pair[1]))
        if out and (entry.epoch <= out[-1].epoch
                    or entry.start_phy_offset < out[-1].start_phy_offset):
            raise HAProtocolError(f"{kind.name}.epochs: entries not increasing at {entry}")
        out.append(entry)
    return tuple(out)


def _decode_hello(fields: list[Any], limits: Limits) -> Hello:
    k = FrameType.HELLO
    f = _fields(k, fields, ("version", "session", "broker_name", "broker_id", "max_phy_offset",
                            "slave_address", "epochs"))
    return Hello(
        version=_int(k, "version", f["version"], 0, 0xFFFF),
        session=_int(k, "session", f["session"], 0, MAX_SESSION),
        broker_name=_text(k, "broker_name", f["broker_name"], limits.max_text_bytes),
        broker_id=_int(k, "broker_id", f["broker_id"], 0, 0xFFFF_FFFF),
        max_phy_offset=_int(k, "max_phy_offset", f["max_phy_offset"]),
        slave_address=_text(k, "slave_address", f["slave_address"], limits.max_text_bytes),
        epochs=_epochs(k, f["epochs"], limits),
    )


def _decode_hello_reply(fields: list[Any], limits: Limits) -> HelloReply:
    k = FrameType.HELLO_REPLY
    names: tuple[str, ...] = ("session", "epoch", "min_phy_offset", "max_phy_offset",
                              "start_phy_offset", "epochs")
    if len(fields) == len(names) + 1:  # with master_address
        names += ("master_address",)
    elif len(fields) != len(names):
        raise HAProtocolError(f"{k.name}: expected 6 or 7 fields, got {len(fields)}")
    f = _fields(k, fields, names)
    reply = HelloReply(
        session=_int(k, "session", f["session"], 0, MAX_SESSION),
        epoch=_int(k, "epoch", f["epoch"], 1, _MAX_EPOCH),
        min_phy_offset=_int(k, "min_phy_offset", f["min_phy_offset"]),
        max_phy_offset=_int(k, "max_phy_offset", f["max_phy_offset"]),
        start_phy_offset=_int(k, "start_phy_offset", f["start_phy_offset"]),
        epochs=_epochs(k, f["epochs"], limits),
        master_address=_text(k, "master_address", f.get("master_address", ""),
                             limits.max_text_bytes),
    )
    if not reply.min_phy_offset <= reply.start_phy_offset <= reply.max_phy_offset:
        raise HAProtocolError(f"HELLO_REPLY: start {reply.start_phy_offset} outside "
                              f"[{reply.min_phy_offset}, {reply.max_phy_offset}]")
    if not reply.epochs or reply.epochs[-1].epoch != reply.epoch:
        raise HAProtocolError("HELLO_REPLY: epochs must end with the master's epoch")
    return reply


def _decode_data(fields: list[Any], raw: bytes | memoryview, limits: Limits) -> Data:
    k = FrameType.DATA
    names: tuple[str, ...] = ("session", "epoch", "epoch_start_phy_offset", "phy_offset", "length")
    if len(fields) == len(names) + 1:  # with the master's confirmed offset
        names += ("confirm_offset",)
    elif len(fields) != len(names):
        raise HAProtocolError(f"{k.name}: expected 5 or 6 fields, got {len(fields)}")
    f = _fields(k, fields, names)
    length = _int(k, "length", f["length"], 1, limits.max_data_bytes)
    if len(raw) != length:
        raise HAProtocolError(f"DATA: header says {length} bytes, raw frame has {len(raw)}")
    data = Data(
        session=_int(k, "session", f["session"], 0, MAX_SESSION),
        epoch=_int(k, "epoch", f["epoch"], 1, _MAX_EPOCH),
        epoch_start_phy_offset=_int(k, "epoch_start_phy_offset", f["epoch_start_phy_offset"]),
        phy_offset=_int(k, "phy_offset", f["phy_offset"], 0, MAX_OFFSET - length),
        data=raw,
        confirm_offset=_int(k, "confirm_offset", f.get("confirm_offset", NO_OFFSET), NO_OFFSET),
    )
    if data.epoch_start_phy_offset > data.phy_offset:
        raise HAProtocolError(f"DATA: epoch {data.epoch} starts at {data.epoch_start_phy_offset}"
                              f", after the batch offset {data.phy_offset}")
    return data


def _decode_ack(fields: list[Any], limits: Limits) -> Ack:
    k = FrameType.ACK
    names: tuple[str, ...] = ("session", "ack_offset")
    if len(fields) == len(names) + 1:  # with the slave's epoch
        names += ("epoch",)
    elif len(fields) != len(names):
        raise HAProtocolError(f"{k.name}: expected 2 or 3 fields, got {len(fields)}")
    f = _fields(k, fields, names)
    return Ack(session=_int(k, "session", f["session"], 0, MAX_SESSION),
               ack_offset=_int(k, "ack_offset", f["ack_offset"]),
               epoch=_int(k, "epoch", f.get("epoch", 0), 0, _MAX_EPOCH))


def _decode_heartbeat(fields: list[Any], limits: Limits) -> Heartbeat:
    k = FrameType.HEARTBEAT
    names: tuple[str, ...] = ("session", "epoch", "max_phy_offset", "sent_phy_offset")
    if len(fields) == len(names) + 1:  # with the master's confirmed offset
        names += ("confirm_offset",)
    elif len(fields) != len(names):
        raise HAProtocolError(f"{k.name}: expected 4 or 5 fields, got {len(fields)}")
    f = _fields(k, fields, names)
    beat = Heartbeat(
        session=_int(k, "session", f["session"], 0, MAX_SESSION),
        epoch=_int(k, "epoch", f["epoch"], 1, _MAX_EPOCH),
        max_phy_offset=_int(k, "max_phy_offset", f["max_phy_offset"]),
        sent_phy_offset=_int(k, "sent_phy_offset", f["sent_phy_offset"]),
        confirm_offset=_int(k, "confirm_offset", f.get("confirm_offset", NO_OFFSET), NO_OFFSET),
    )
    if beat.sent_phy_offset > beat.max_phy_offset:
        raise HAProtocolError("HEARTBEAT: sent_phy_offset beyond max_phy_offset")
    return beat


def _decode_error(fields: list[Any], limits: Limits) -> Error:
    k = FrameType.ERROR
    f = _fields(k, fields, ("session", "code", "phy_offset", "reason"))
    code = _int(k, "code", f["code"], 0, 0xFFFF)
    try:
        response_code = ResponseCode(code)
    except ValueError:
        raise HAProtocolError(f"ERROR.code: unknown response code {code}") from None
    return Error(
        session=_int(k, "session", f["session"], 0, MAX_SESSION),
        code=response_code,
        phy_offset=_int(k, "phy_offset", f["phy_offset"], NO_OFFSET),
        reason=_text(k, "reason", f["reason"], limits.max_reason_bytes),
    )


_DECODERS: dict[FrameType, Callable[[list[Any], Limits], Frame]] = {
    FrameType.HELLO: _decode_hello,
    FrameType.HELLO_REPLY: _decode_hello_reply,
    FrameType.ACK: _decode_ack,
    FrameType.HEARTBEAT: _decode_heartbeat,
    FrameType.ERROR: _decode_error,
}


def _native_tables() -> dict[str, Any]:
    """What ``_ha_codec.configure`` takes: the frame types it decodes, their classes, the
    bounds of this module and msgpack's functions."""
    return {"data_type": Data, "ack_type": Ack, "unpackb": msgpack.unpackb,
            "unpack_kwargs_of": _unpack_kwargs, "packer_type": msgpack.Packer,
            "data_code": int(FrameType.DATA), "ack_code": int(FrameType.ACK),
            "type_data": int(FrameType.DATA),
            "type_ack": int(FrameType.ACK), "max_offset": MAX_OFFSET, "max_epoch": _MAX_EPOCH,
            "max_session": MAX_SESSION, "no_offset": NO_OFFSET}


# last: the tables it takes are all defined above
_native = accel.load("common.ha._ha_codec")
if _native is not None:
    _native.configure(_native_tables())
    encode_data = _native.encode_data  # the same frames, in one C call
    encode_ack = _native.encode_ack
