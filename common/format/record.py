"""The CommitLog record, byte for byte as Apache RocketMQ 4.x writes it (v1, IPv4 hosts).

All integers big-endian. Fixed part = 88 bytes, then body, a 1-byte topic length, the topic, a
2-byte properties length and the properties: 91 bytes + body + topic + properties.

| off | field                      | size | notes                                    |
|-----|----------------------------|------|------------------------------------------|
|   0 | TOTALSIZE                  | 4    | whole record, this field included        |
|   4 | MAGICCODE                  | 4    | 0xDAA320A7 (v1); BLANK 0xCBD43194        |
|   8 | BODYCRC                    | 4    | crc32(body) & 0x7FFFFFFF                 |
|  12 | QUEUEID                    | 4    |                                          |
|  16 | FLAG                       | 4    | user flag                                |
|  20 | QUEUEOFFSET                | 8    | index in the ConsumeQueue                |
|  28 | PHYSICALOFFSET             | 8    | this record's CommitLog offset           |
|  36 | SYSFLAG                    | 4    |                                          |
|  40 | BORNTIMESTAMP              | 8    | ms                                       |
|  48 | BORNHOST                   | 8    | IPv4 (4) + port (4)                      |
|  56 | STORETIMESTAMP             | 8    | ms, set under the put lock               |
|  64 | STOREHOSTADDRESS           | 8    | IPv4 (4) + port (4)                      |
|  72 | RECONSUMETIMES             | 4    |                                          |
|  76 | PREPAREDTRANSACTIONOFFSET  | 8    |                                          |
|  84 | BODY length                | 4    | then the body                            |
|     | TOPIC length + TOPIC       | 1+t  | UTF-8                                    |
|     | PROPERTIES length + PROPS  | 2+p  | ``name\\x01value\\x02`` UTF-8            |

Whole-record CRC (RocketMQ 5 ``enabledAppendPropCRC``; on by default in replog): the
properties end with a reserved 20-byte entry ``__CRC32#\x01`` + 10 ASCII digits (least
significant first) + ``\x02``, the crc32 & 0x7FFFFFFF of the whole record except those 20 bytes.
The body CRC alone misses a flipped bit in the header, topic or properties; this does not.

At a segment's end, when a record plus 8 bytes no longer fits, a BLANK record of 8 bytes
(TOTALSIZE = bytes left in the segment, MAGIC = BLANK) pads the rest of the segment.
"""

from __future__ import annotations

import socket
import struct
import zlib
from typing import NamedTuple

from common.core.errors import CorruptionError
from common.core.message import MessageExt, decode_properties, encode_msg_id

MAGIC_V1 = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
END_FILE_MIN_BLANK = 8
MAX_TOPIC_BYTES = 127
MAX_PROPERTIES_BYTES = 32767
RECORD_SLACK_BYTES = 64 * 1024  # whole record may exceed maxMessageSize by this much

HEADER = struct.Struct(">iIiiiqqiq4siq4siiqi")
assert HEADER.size == 88
FIXED_BYTES = HEADER.size + 1 + 2
assert FIXED_BYTES == 91

BLANK = struct.Struct(">iI")
assert BLANK.size == END_FILE_MIN_BLANK

# Field positions patched inside the put lock (pre-encoded records).
POS_QUEUE_OFFSET = 20
POS_PHY_OFFSET = 28
POS_STORE_TIMESTAMP = 56
POS_BODY_LENGTH = 84
HEAD_PREFIX = struct.Struct(">iI")  # TOTALSIZE, MAGIC
PATCH_QOFF = struct.Struct(">qq")  # QUEUEOFFSET, PHYSICALOFFSET (adjacent)
PATCH_STORE_TS = struct.Struct(">q")
assert POS_QUEUE_OFFSET + PATCH_QOFF.size == 36


PROP_CRC_LEN = 20
PROP_CRC_PREFIX = b"__CRC32#\x01"
PROP_CRC_NAME = "__CRC32#"
PROP_CRC_PLACEHOLDER = PROP_CRC_PREFIX + b"0" * 10 + b"\x02"
assert len(PROP_CRC_PLACEHOLDER) == PROP_CRC_LEN


def crc_digits(crc: int) -> bytes:
    """10 ASCII digits, least significant first (RocketMQ MessageDecoder.createCrc32)."""
    return (b"%010d" % crc)[::-1]


def crc_entry(crc: int) -> bytes:
    """The 20-byte properties entry holding the whole-record CRC ``crc``."""
    return PROP_CRC_PREFIX + crc_digits(crc) + b"\x02"


def seal(buf: bytearray | memoryview, pos: int, size: int) -> None:
    """Write the whole-record CRC into the reserved tail of the record at ``pos``."""
    end = pos + size - PROP_CRC_LEN
    buf[end : end + PROP_CRC_LEN] = crc_entry(zlib.crc32(buf[pos:end]) & 0x7FFFFFFF)


def has_prop_crc(buf: bytes | bytearray | memoryview, pos: int, total: int) -> bool:
    end = pos + total
    return (buf[end - PROP_CRC_LEN : end - 11] == PROP_CRC_PREFIX and buf[end - 1] == 2)


def prop_crc_ok(buf: bytes | bytearray | memoryview, pos: int, total: int) -> bool:
    end = pos + total
    crc = zlib.crc32(buf[pos : end - PROP_CRC_LEN]) & 0x7FFFFFFF
    return bytes(buf[end - 11 : end - 1]) == crc_digits(crc)


def body_crc(body: bytes | memoryview) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


def record_size(body_len: int, topic_len: int, props_len: int) -> int:
    return FIXED_BYTES + body_len + topic_len + props_len


def layout_error(buf: bytes | bytearray | memoryview, pos: int, total: int,
                 body_len: int) -> str | None:
    """Why the length fields of the record at ``pos`` (``total`` bytes, in ``buf``) do not
    add up to ``total``, or None; reads nothing past the record."""
    if body_len < 0 or HEADER.size + body_len + 3 > total:
        return f"body length {body_len} does not fit in record of {total}"
    p = pos + HEADER.size + body_len
    topic_len = buf[p]
    if HEADER.size + body_len + 1 + topic_len + 2 > total:
        return f"topic length {topic_len} does not fit"
    q = p + 1 + topic_len
    props_len = (buf[q] << 8) | buf[q + 1]
    if record_size(body_len, topic_len, props_len) != total:
        return f"size {total} != computed {record_size(body_len, topic_len, props_len)}"
    return None


class Header(NamedTuple):
    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    phy_offset: int
    sys_flag: int
    born_timestamp: int
    born_ip: bytes
    born_port: int
    store_timestamp: int
    store_ip: bytes
    store_port: int
    reconsume_times: int
    prepared_tx_offset: int
    body_len: int


def encode(
    topic: bytes,
    body: bytes,
    props: bytes,
    queue_id: int,
    queue_offset: int = 0,
    phy_offset: int = 0,
    *,
    flag: int = 0,
    sys_flag: int = 0,
    born_timestamp: int = 0,
    born_ip: bytes = b"\x7f\x00\x00\x01",
    born_port: int = 0,
    store_timestamp: int = 0,
    store_ip: bytes = b"\x7f\x00\x00\x01",
    store_port: int = 0,
    reconsume_times: int = 0,
    prepared_tx_offset: int = 0,
    crc: int | None = None,
) -> bytearray:
    """One whole record. Queue offset, physical offset and store time can be patched later."""
    size = record_size(len(body), len(topic), len(props))
    out = bytearray(size)
    HEADER.pack_into(
        out,
        0,
        size,
        MAGIC_V1,
        body_crc(body) if crc is None else crc,
        queue_id,
        flag,
        queue_offset,
        phy_offset,
        sys_flag,
        born_timestamp,
        born_ip,
        born_port,
        store_timestamp,
        store_ip,
        store_port,
        reconsume_times,
        prepared_tx_offset,
        len(body),
    )
    pos = HEADER.size
    out[pos : pos + len(body)] = body
    pos += len(body)
    out[pos] = len(topic)
    out[pos + 1 : pos + 1 + len(topic)] = topic
    pos += 1 + len(topic)
    out[pos : pos + 2] = len(props).to_bytes(2, "big")
    out[pos + 2 :] = props
    return out


def patch(buf: bytearray | memoryview, pos: int, queue_offset: int, phy_offset: int, store_ts: int) -> None:
    """Fill the fields only known under the put lock."""
    PATCH_QOFF.pack_into(buf, pos + POS_QUEUE_OFFSET, queue_offset, phy_offset)
    PATCH_STORE_TS.pack_into(buf, pos + POS_STORE_TIMESTAMP, store_ts)


def encode_batch(
    topic: bytes,
    bodies: list[bytes],
    props_list: list[bytes],
    flags: list[int],
    queue_id: int,
    *,
    born_timestamp: int,
    born_ip: bytes,
    born_port: int,
    store_ip: bytes,
    store_port: int,
) -> tuple[bytearray, list[int]]:
    """Many records of one queue in one buffer, and each record's position in it."""
    topic_len = len(topic)
    sizes = [FIXED_BYTES + len(b) + topic_len + len(p) for b, p in zip(bodies, props_list, strict=True)]
    out = bytearray(sum(sizes))
    positions = []
    pos = 0
    pack = HEADER.pack_into
    crc32 = zlib.crc32
    topic_part = bytes([topic_len]) + topic
    for body, props, flag, size in zip(bodies, props_list, flags, sizes, strict=True):
        positions.append(pos)
        pack(out, pos, size, MAGIC_V1, crc32(body) & 0x7FFFFFFF, queue_id, flag, 0, 0, 0,
             born_timestamp, born_ip, born_port, 0, store_ip, store_port, 0, 0, len(body))
        p = pos + HEADER.size
        out[p : p + len(body)] = body
        p += len(body)
        out[p : p + 1 + topic_len] = topic_part
        p += 1 + topic_len
        out[p : p + 2] = len(props).to_bytes(2, "big")
        out[p + 2 : p + 2 + len(props)] = props
        pos += size
    return out, positions


def patch_batch(buf: bytearray, positions: list[int] | tuple[int, ...], first_queue_offset: int,
                phy_offset: int, store_ts: int) -> None:
    """patch() for every record of a batch: dense queue offsets, physical offsets by position."""
    pack_q = PATCH_QOFF.pack_into
    pack_ts = PATCH_STORE_TS.pack_into
    queue_offset = first_queue_offset
    for pos in positions:
        pack_q(buf, pos + POS_QUEUE_OFFSET, queue_offset, phy_offset + pos)
        pack_ts(buf, pos + POS_STORE_TIMESTAMP, store_ts)
        queue_offset += 1


def blank(size: int) -> bytes:
    return BLANK.pack(size, BLANK_MAGIC)


class Parsed(NamedTuple):
    """A validated record's variable parts, as views into the buffer it was read from."""

    header: Header
    body: memoryview
    topic: memoryview
    props: memoryview


def parse(buf: bytes | bytearray | memoryview, pos: int = 0) -> Parsed:
    """Split a record that is known to be whole (no checks beyond structure)."""
    view = memoryview(buf)
    header = Header._make(HEADER.unpack_from(view, pos))
    p = pos + HEADER.size
    body = view[p : p + header.body_len]
    p += header.body_len
    topic_len = view[p]
    topic = view[p + 1 : p + 1 + topic_len]
    p += 1 + topic_len
    props_len = int.from_bytes(view[p : p + 2], "big")
    props = view[p + 2 : p + 2 + props_len]
    return Parsed(header, body, topic, props)


_TAGS_PREFIX = b"TAGS\x01"


def record_tags(buf: bytes | bytearray | memoryview, pos: int = 0) -> str | None:
    """The TAGS property of a whole record (None without one), read from its properties
    without decoding the rest."""
    props = bytes(parse(buf, pos).props)
    start = 0 if props.startswith(_TAGS_PREFIX) else props.find(b"\x02" + _TAGS_PREFIX) + 1
    if start == 0 and not props.startswith(_TAGS_PREFIX):
        return None
    start += len(_TAGS_PREFIX)
    end = props.find(b"\x02", start)
    return props[start : end if end >= 0 else len(props)].decode("utf-8", "replace")


def record_properties(buf: bytes | bytearray | memoryview, pos: int = 0) -> dict[str, str]:
    """The user properties of a whole record (TAGS, KEYS, UNIQ_KEY and the producer's own;
    not the record CRC): what a SQL92 selector is evaluated over."""
    props = decode_properties(parse(buf, pos).props)
    props.pop(PROP_CRC_NAME, None)
    return props


class Check(NamedTuple):
    """Result of checking the bytes at a position: size > 0 record, 0 blank, -1 invalid."""

    size: int
    reason: str = ""


def check(
    buf: bytes | bytearray | memoryview,
    pos: int,
    end: int,
    expect_phy_offset: int | None = None,
    verify_crc: bool = True,
    require_prop_crc: bool = False,
) -> Check:
    """Validate the record at ``pos`` within ``buf[:end]`` (RocketMQ checkMessageAndReturnSize).

    Checks magic, that the declared size fits and equals the size recomputed from the length
    fields, that PHYSICALOFFSET equals ``expect_phy_offset`` and (optionally) the body CRC and
    the whole-record CRC; ``require_prop_crc`` refuses a record without one.
    """
    left = end - pos
    if left < END_FILE_MIN_BLANK:
        return Check(-1, f"only {left} bytes left, a record header needs 8")
    total, magic = HEAD_PREFIX.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        if total != left:
            return Check(-1, f"blank record claims {total} bytes but {left} remain in the segment")
        return Check(0)
    if magic != MAGIC_V1:
        return Check(-1, f"bad magic 0x{magic:08X}")
    if total < FIXED_BYTES or total > left:
        return Check(-1, f"size {total} outside [{FIXED_BYTES}, {left}]")
    view = memoryview(buf)
    header = Header._make(HEADER.unpack_from(view, pos))
    body_len = header.body_len
    bad = layout_error(view, pos, total, body_len)
    if bad is not None:
        return Check(-1, bad)
    topic_len = view[pos + HEADER.size + body_len]
    props_len = total - record_size(body_len, topic_len, 0)  # the lengths add up
    if expect_phy_offset is not None and header.phy_offset != expect_phy_offset:
        return Check(-1, f"PHYSICALOFFSET {header.phy_offset} != position {expect_phy_offset}")
    if verify_crc:
        start = pos + HEADER.size
        crc = body_crc(view[start : start + body_len])
        if crc != header.body_crc:
            return Check(-1, f"body CRC {crc} != stored {header.body_crc}")
        sealed = props_len >= PROP_CRC_LEN and has_prop_crc(view, pos, total)
        if sealed and not prop_crc_ok(view, pos, total):
            return Check(-1, "whole-record CRC mismatch (header, topic or properties changed)")
        if require_prop_crc and not sealed:
            return Check(-1, "whole-record CRC missing (torn inside the properties?)")
    return Check(total)


def require_valid(buf: bytes | bytearray | memoryview, pos: int, phy_offset: int) -> int:
    """Size of the valid record at ``pos`` (0 for a blank) or raise CorruptionError."""
    result = check(buf, pos, len(buf), expect_phy_offset=phy_offset)
    if result.size < 0:
        raise CorruptionError(phy_offset, result.reason)
    return result.size


def ip_text(raw: bytes) -> str:
    return socket.inet_ntoa(raw)


def decode_message(raw: bytes | bytearray | memoryview, pos: int = 0) -> MessageExt:
    """A whole record -> MessageExt (copies body and strings; the record CRC is not a property)."""
    p = parse(raw, pos)
    h = p.header
    props = decode_properties(p.props)
    props.pop(PROP_CRC_NAME, None)
    return MessageExt(
        topic=bytes(p.topic).decode("utf-8", errors="replace"),
        queue_id=h.queue_id,
        queue_offset=h.queue_offset,
        commit_log_offset=h.phy_offset,
        store_size=h.total_size,
        body=bytes(p.body),
        properties=props,
        flag=h.flag,
        sys_flag=h.sys_flag,
        body_crc=h.body_crc,
        born_timestamp=h.born_timestamp,
        born_host=f"{ip_text(h.born_ip)}:{h.born_port}",
        store_timestamp=h.store_timestamp,
        store_host=f"{ip_text(h.store_ip)}:{h.store_port}",
        reconsume_times=h.reconsume_times,
        prepared_transaction_offset=h.prepared_tx_offset,
        msg_id=encode_msg_id(h.store_ip, h.store_port, h.phy_offset),
    )
