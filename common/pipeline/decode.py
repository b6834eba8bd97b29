"""Vectorised decoding of CommitLog bytes (numpy gathers + Arrow) into Arrow record batches.

The record layout, its magic codes and the header ``struct`` come from
``common.format.record``; this module only reads them, many records at a time:

1. ``walk`` finds the chain of whole, structurally valid records in a buffer without a Python
   loop per record. Every record carries its own CommitLog offset (PHYSICALOFFSET), so a
   position ``p`` holding the v1 magic *and* ``PHYSICALOFFSET == base + p`` is a candidate;
   when the candidates chain perfectly (each ends where the next starts) they are the records.
   A body that happens to contain a forged header breaks the perfect chain, and then the chain
   is followed link by link from the first record, which visits only true records.
2. ``decode`` turns record positions into the requested columns. Variable-length fields
   (body, topic, property keys and values) are described as Arrow *views* into the buffer and
   cast to plain binary/string arrays, so the bytes are copied once, by Arrow, in C++.
"""

from __future__ import annotations

import binascii
import dataclasses
import re
import socket
import struct
from collections.abc import Iterable
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.lib.stride_tricks import sliding_window_view

from common.core.message import (
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    SYSFLAG_COMPRESSED,
    body_str,
    inflate_body,
    tags_code,
)
from common.format import record
from common.format.record import FIXED_BYTES, HEADER, MAGIC_V1

from .schema import COLUMN_NAMES, arrow_schema


def _field_layout() -> dict[str, tuple[int, int]]:
    """(byte offset, width) of each ``record.Header`` field inside ``record.HEADER``."""
    tokens = re.findall(r"\d*[a-zA-Z]", HEADER.format[1:])
    layout: dict[str, tuple[int, int]] = {}
    pos = 0
    for name, token in zip(record.Header._fields, tokens, strict=True):
        width = struct.calcsize(">" + token)
        layout[name] = (pos, width)
        pos += width
    assert pos == HEADER.size
    return layout


LAYOUT = _field_layout()
OFF = {name: offset for name, (offset, _) in LAYOUT.items()}
assert OFF["queue_offset"] == record.POS_QUEUE_OFFSET
assert OFF["phy_offset"] == record.POS_PHY_OFFSET
assert OFF["store_timestamp"] == record.POS_STORE_TIMESTAMP
assert OFF["body_len"] == record.POS_BODY_LENGTH
assert OFF["store_port"] == OFF["store_ip"] + 4 and OFF["born_port"] == OFF["born_ip"] + 4

HEADER_DTYPE = np.dtype({
    "names": [n for n in LAYOUT if n not in ("born_ip", "store_ip")],
    "formats": [
        ">i8" if w == 8 else ">i4" for n, (_, w) in LAYOUT.items() if n not in ("born_ip", "store_ip")
    ],
    "offsets": [o for n, (o, _) in LAYOUT.items() if n not in ("born_ip", "store_ip")],
    "itemsize": HEADER.size,
})
_MAGIC_BYTES = np.frombuffer(struct.pack(">I", MAGIC_V1), dtype=np.uint8)
_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_BIG_ENDIAN = {2: ">u2", 4: ">i4", 8: ">i8"}
_INLINE_MAX = 12  # Arrow binary views keep values of up to 12 bytes inline
_MAX_BUFFER = 2**31 - 1  # view offsets are int32
_CRC_NAME = np.frombuffer(record.PROP_CRC_NAME.encode(), dtype=np.uint8)
_NAME_VALUE_SEP = 1
_PROPERTY_SEP = 2


def gather(buf: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """``buf[p : p + width]`` for each position, as an (n, width) array (positions must fit)."""
    if pos.size == 0 or buf.size < width:
        return np.zeros((pos.size, width), dtype=np.uint8)
    return sliding_window_view(buf, width)[pos]


def be_ints(buf: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Big-endian integers of ``width`` bytes at each position, as native int64 (u2: unsigned)."""
    raw = gather(buf, pos, width)
    return raw.view(np.dtype(_BIG_ENDIAN[width])).ravel().astype(np.int64)


# ----------------------------------------------------------------------------------------- walk


@dataclasses.dataclass(frozen=True)
class Walk:
    """The whole valid records found from the start of a buffer.

    ``stop`` says why the walk ended at ``end``: ``"end"`` (the buffer ended exactly after a
    record), ``"blank"`` (a BLANK record pads the rest of the segment) or ``"invalid"``
    (``reason`` says what is wrong with the bytes at ``end``).
    """

    starts: np.ndarray
    sizes: np.ndarray
    end: int
    stop: str
    reason: str = ""


def walk(buf: np.ndarray, phy_base: int, verify_crc: bool = False) -> Walk:
    """Chain of records from ``buf[0]``, which is the byte at CommitLog offset ``phy_base``."""
    cand, sizes = _candidates(buf, phy_base)
    cand, sizes = _chain(cand, sizes)
    bad, reason = _first_malformed(buf, cand, sizes)
    if verify_crc:
        bad_crc, why = _first_crc_mismatch(buf, cand[:bad], sizes[:bad])
        if bad_crc < bad:
            bad, reason = bad_crc, why
    if bad < cand.size:
        return Walk(cand[:bad], sizes[:bad], int(cand[bad]), "invalid", reason)
    end = int(cand[-1] + sizes[-1]) if cand.size else 0
    if end == buf.size:
        return Walk(cand, sizes, end, "end")
    tail = record.check(buf.data, end, buf.size, expect_phy_offset=phy_base + end)
    if tail.size == 0:
        return Walk(cand, sizes, end, "blank")
    if tail.size > 0:  # a valid record every candidate filter missed: cannot happen
        raise AssertionError(f"record at {phy_base + end} escaped the candidate scan")
    return Walk(cand, sizes, end, "invalid", tail.reason)


def _candidates(buf: np.ndarray, phy_base: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions holding the v1 magic, their own offset and a size that fits the buffer."""
    last = buf.size - FIXED_BYTES
    if last < 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    cand = np.flatnonzero(buf[4 : last + 5] == _MAGIC_BYTES[0])
    for k in range(1, 4):
        cand = cand[buf[cand + 4 + k] == _MAGIC_BYTES[k]]
    cand = cand[be_ints(buf, cand + OFF["phy_offset"], 8) == cand + phy_base]
    sizes = be_ints(buf, cand, 4)
    fits = (sizes >= FIXED_BYTES) & (sizes <= buf.size - cand)
    return cand[fits], sizes[fits]


def _chain(cand: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The candidates reachable from position 0 by following sizes."""
    if cand.size == 0 or cand[0] != 0:
        return cand[:0], sizes[:0]
    nxt = cand + sizes
    if np.array_equal(cand[1:], nxt[:-1]):
        return cand, sizes
    j = np.minimum(np.searchsorted(cand, nxt), cand.size - 1)
    link = np.where(cand[j] == nxt, j, -1).tolist()
    chain: list[int] = []
    i = 0
    while i >= 0:
        chain.append(i)
        i = link[i]
    idx = np.asarray(chain, dtype=np.int64)
    return cand[idx], sizes[idx]


def _first_malformed(buf: np.ndarray, cand: np.ndarray, sizes: np.ndarray) -> tuple[int, str]:
    """Index of the first record whose length fields disagree with its size, else len."""
    if cand.size == 0:
        return 0, ""
    body_len = be_ints(buf, cand + OFF["body_len"], 4)
    ok = (body_len >= 0) & (body_len <= sizes - FIXED_BYTES)
    topic_pos = cand + HEADER.size + np.where(ok, body_len, 0)
    topic_len = buf[topic_pos].astype(np.int64)
    ok &= HEADER.size + body_len + 1 + topic_len + 2 <= sizes
    props_pos = np.where(ok, topic_pos + 1 + topic_len, cand)
    props_len = be_ints(buf, props_pos, 2)
    ok &= FIXED_BYTES + body_len + topic_len + props_len == sizes
    bad = np.flatnonzero(~ok)
    if bad.size == 0:
        return cand.size, ""
    first = int(bad[0])
    why = record.check(buf.data, int(cand[first]), buf.size, verify_crc=False)
    return first, why.reason or "length fields disagree with TOTALSIZE"


def _first_crc_mismatch(buf: np.ndarray, cand: np.ndarray, sizes: np.ndarray) -> tuple[int, str]:
    """Index of the first record failing the store's own check with CRCs (body CRC and, when
    the record carries one, the whole-record CRC), and why; else len(cand)."""
    view = buf.data
    for i, (p, n) in enumerate(zip(cand.tolist(), sizes.tolist(), strict=True)):
        checked = record.check(view, p, p + n, verify_crc=True)
        if checked.size <= 0:
            return i, checked.reason
    return cand.size, ""


# --------------------------------------------------------------------------------------- decode


class Records:
    """Field arrays of the records at ``pos`` in ``buf``, computed on first use."""

    def __init__(self, buf: np.ndarray, pos: np.ndarray):
        if buf.size > _MAX_BUFFER:
            raise ValueError(f"buffer of {buf.size} bytes is larger than 2 GiB")
        self.buf = buf
        self.pos = pos.astype(np.int64, copy=False)

    def __len__(self) -> int:
        return int(self.pos.size)

    def select(self, which: np.ndarray | slice) -> Records:
        """The records picked by a boolean mask or a slice."""
        return Records(self.buf, self.pos[which])

    @cached_property
    def header(self) -> np.ndarray:
        """The 88-byte headers as a structured array of big-endian fields."""
        return gather(self.buf, self.pos, HEADER.size).view(HEADER_DTYPE).ravel()

    def int_field(self, name: str) -> np.ndarray:
        return self.header[name].astype(np.int64)

    @cached_property
    def body_len(self) -> np.ndarray:
        return self.int_field("body_len")

    @cached_property
    def topic_pos(self) -> np.ndarray:
        """Position of the topic's first byte (after its 1-byte length)."""
        return self.pos + HEADER.size + self.body_len + 1

    @cached_property
    def topic_len(self) -> np.ndarray:
        return self.buf[self.topic_pos - 1].astype(np.int64)

    @cached_property
    def props_pos(self) -> np.ndarray:
        """Position of the properties' first byte (after their 2-byte length)."""
        return self.topic_pos + self.topic_len + 2

    @cached_property
    def props_len(self) -> np.ndarray:
        return be_ints(self.buf, self.props_pos - 2, 2)

    def topic_in(self, topics: Iterable[str]) -> np.ndarray:
        """Mask of the records whose topic is one of ``topics`` (byte comparison)."""
        mask = np.zeros(len(self), dtype=bool)
        for topic in topics:
            raw = np.frombuffer(topic.encode("utf-8"), dtype=np.uint8)
            same_len = np.flatnonzero(self.topic_len == raw.size)
            if raw.size:
                got = self.buf[self.topic_pos[same_len, None] + np.arange(raw.size)]
                same_len = same_len[(got == raw).all(axis=1)]
            mask[same_len] = True
        return mask


def view_array(
    buf: np.ndarray, data: pa.Buffer, pos: np.ndarray, lens: np.ndarray, target: pa.DataType
) -> pa.Array:
    """``target`` (binary or string) array of ``buf[pos[i]:pos[i]+lens[i]]``, copied by Arrow."""
    n = int(pos.size)
    views = np.zeros((n, 16), dtype=np.uint8)
    views[:, 0:4] = lens.astype("<i4").view(np.uint8).reshape(n, 4)
    short = lens <= _INLINE_MAX
    if short.any():
        spos, slen = pos[short], lens[short]
        inline = _gather_padded(buf, spos, _INLINE_MAX)
        inline[np.arange(_INLINE_MAX) >= slen[:, None]] = 0
        views[short, 4:16] = inline
    long_ = ~short
    if long_.any():
        lpos = pos[long_]
        views[long_, 4:8] = gather(buf, lpos, 4)
        views[long_, 12:16] = lpos.astype("<i4").view(np.uint8).reshape(-1, 4)
    view_type = pa.binary_view() if target == pa.binary() else pa.string_view()
    arr = pa.Array.from_buffers(view_type, n, [None, pa.py_buffer(views), data])
    out = arr.cast(target)
    if target == pa.string():
        out = _valid_utf8(out)
    return out


def _gather_padded(buf: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Like ``gather`` but positions may be closer than ``width`` to the end (zeros beyond)."""
    fits = pos <= buf.size - width
    if fits.all():
        return gather(buf, pos, width)
    out = np.zeros((pos.size, width), dtype=np.uint8)
    out[fits] = gather(buf, pos[fits], width)
    idx = pos[~fits, None] + np.arange(width)
    out[~fits] = np.where(idx < buf.size, buf[np.minimum(idx, buf.size - 1)], 0)
    return out


def _valid_utf8(arr: pa.Array) -> pa.Array:
    """``arr`` unchanged when it is valid UTF-8, else decoded in Python with replacement."""
    try:
        arr.validate(full=True)
        return arr
    except pa.ArrowInvalid:
        raw = arr.cast(pa.binary()).to_pylist()
        return pa.array([None if b is None else b.decode("utf-8", "replace") for b in raw])


@dataclasses.dataclass
class Properties:
    """The properties of n records as a flat list of (record, key, value) entries."""

    record: np.ndarray  # int64 record index of each entry, ascending
    keys: pa.Array  # string
    values: pa.Array  # string
    count: int  # number of records

    def as_map(self) -> pa.Array:
        counts = np.bincount(self.record, minlength=self.count)
        offsets = np.zeros(self.count + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        return pa.MapArray.from_arrays(pa.array(offsets), self.keys, self.values)

    def lookup(self, name: str) -> pa.Array:
        """Value of property ``name`` per record (null when absent; the last one wins)."""
        hits = np.flatnonzero(pc.equal(self.keys, name).to_numpy(zero_copy_only=False))
        idx = np.full(self.count, -1, dtype=np.int64)
        idx[self.record[hits]] = hits
        return self.values.take(pa.array(idx, mask=idx < 0))


def split_properties(recs: Records) -> Properties:
    """Parse ``name\\x01value\\x02`` lists the way the store's reader does
    (``common.core.message.decode_properties``, minus the whole-record CRC entry)."""
    n = len(recs)
    raw = view_array(recs.buf, pa.py_buffer(recs.buf), recs.props_pos, recs.props_len, pa.binary())
    offsets = np.frombuffer(raw.buffers()[1], dtype=np.int32)[: n + 1].astype(np.int64)
    if offsets[-1] == 0:  # no record has properties
        empty = pa.array([], type=pa.string())
        return Properties(np.zeros(0, dtype=np.int64), empty, empty, n)
    data = np.frombuffer(raw.buffers()[2], dtype=np.uint8)[: offsets[-1]]
    seps = np.flatnonzero(data == _PROPERTY_SEP)
    ends_of_records = offsets[1:]
    lengths = np.diff(offsets)
    unterminated = (lengths > 0) & (data[np.maximum(ends_of_records - 1, 0)] != _PROPERTY_SEP)
    ends = np.concatenate([seps, ends_of_records[unterminated]])
    rec = np.concatenate(
        [np.searchsorted(ends_of_records, seps, side="right"), np.flatnonzero(unterminated)]
    )
    order = np.lexsort((ends, rec))
    ends, rec = ends[order], rec[order]
    starts = np.empty_like(ends)
    if ends.size:
        starts[0] = offsets[rec[0]]
        same = rec[1:] == rec[:-1]
        starts[1:] = np.where(same, ends[:-1] + 1, offsets[rec[1:]])
    names = np.flatnonzero(data == _NAME_VALUE_SEP)
    j = np.searchsorted(names, starts)
    has_sep = j < names.size
    sep_at = names[np.minimum(j, names.size - 1)] if names.size else np.zeros_like(starts)
    keep = has_sep & (sep_at < ends) & ~_is_name(data, starts, sep_at, _CRC_NAME)
    starts, ends, sep_at, rec = starts[keep], ends[keep], sep_at[keep], rec[keep]
    pa_data = pa.py_buffer(data)
    keys = view_array(data, pa_data, starts, sep_at - starts, pa.string())
    values = view_array(data, pa_data, sep_at + 1, ends - sep_at - 1, pa.string())
    return Properties(rec.astype(np.int64), keys, values, n)


def _is_name(data: np.ndarray, starts: np.ndarray, seps: np.ndarray, name: np.ndarray
             ) -> np.ndarray:
    """Mask of the entries whose name (``data[start:sep]``) is exactly ``name``."""
    mask = (seps - starts) == name.size
    idx = np.flatnonzero(mask)
    if idx.size:
        mask[idx] = (gather(data, starts[idx], name.size) == name).all(axis=1)
    return mask


def host_strings(recs: Records, name: str) -> pa.Array:
    """``ip:port`` of the ``born``/``store`` host, formatted once per distinct host."""
    keys = gather(recs.buf, recs.pos + OFF[f"{name}_ip"], 8).view(">u8").ravel()
    uniq, inverse = np.unique(keys, return_inverse=True)
    texts = []
    for key in uniq.tolist():
        b = int(key).to_bytes(8, "big")
        texts.append(f"{socket.inet_ntoa(b[:4])}:{int.from_bytes(b[4:], 'big', signed=True)}")
    indices = pa.array(inverse.ravel().astype(np.int32))
    return pa.DictionaryArray.from_arrays(indices, pa.array(texts, pa.string())).dictionary_decode()


def msg_ids(recs: Records) -> pa.Array:
    """RocketMQ offsetMsgId: hex of store ip(4) + store port(4) + CommitLog offset(8)."""
    n = len(recs)
    raw = np.empty((n, 16), dtype=np.uint8)
    raw[:, :8] = gather(recs.buf, recs.pos + OFF["store_ip"], 8)
    raw[:, 8:] = gather(recs.buf, recs.pos + OFF["phy_offset"], 8)
    text = np.empty((n, 32), dtype=np.uint8)
    text[:, 0::2] = _HEX[raw >> 4]
    text[:, 1::2] = _HEX[raw & 0x0F]
    offsets = np.arange(0, 32 * (n + 1), 32, dtype=np.int32)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(text.ravel())]
    )


def tags_codes(tags: pa.Array) -> pa.Array:
    """ConsumeQueue tagsCode of each TAGS value (Java String.hashCode, 0 when absent),
    computed once per distinct value."""
    encoded = tags.dictionary_encode()
    codes = np.array([tags_code(t) for t in encoded.dictionary.to_pylist()] + [0], dtype=np.int64)
    indices = encoded.indices.fill_null(len(encoded.dictionary)).to_numpy()
    return pa.array(codes[indices], type=pa.int64())


def _timestamps(ms: np.ndarray) -> pa.Array:
    return pa.array(ms * 1000, type=pa.timestamp("us", tz="UTC"))


_INT_COLUMNS = {
    "queueId": ("queue_id", pa.int32()),
    "queueOffset": ("queue_offset", pa.int64()),
    "commitLogOffset": ("phy_offset", pa.int64()),
    "sysFlag": ("sys_flag", pa.int32()),
    "bodyCrc": ("body_crc", pa.int32()),
    "storeSize": ("total_size", pa.int32()),
    "flag": ("flag", pa.int32()),
    "reconsumeTimes": ("reconsume_times", pa.int32()),
    "preparedTransactionOffset": ("prepared_tx_offset", pa.int64()),
}


BODY_COLUMNS = frozenset({"body", "bodyBase64", "bodyBytes"})


def body_bytes(recs: Records) -> pa.Array:
    """Every record's body as its producer sent it (binary): the BODY bytes, inflated where
    the record's SYSFLAG says COMPRESSED (as a RocketMQ consumer gets it). A compressed body
    that does not inflate raises ValueError naming its CommitLog offset."""
    raw = view_array(recs.buf, pa.py_buffer(recs.buf), recs.pos + HEADER.size, recs.body_len,
                     pa.binary())
    sys_flags = recs.int_field("sys_flag")
    compressed = np.flatnonzero(sys_flags & SYSFLAG_COMPRESSED)
    if compressed.size == 0:
        return raw
    bodies = raw.to_pylist()
    phy = recs.int_field("phy_offset")
    for i in compressed.tolist():
        try:
            bodies[i] = inflate_body(bodies[i], sys_flag=int(sys_flags[i]))
        except ValueError as e:
            raise ValueError(f"record at CommitLog offset {int(phy[i])}: {e}") from None
    return pa.array(bodies, type=pa.binary())


def body_text(raw: pa.Array) -> pa.Array:
    """Section 3's ``body``: each body as UTF-8 text, null where it is not valid UTF-8."""
    try:
        return raw.cast(pa.string())  # Arrow checks the UTF-8 of the whole array at once
    except pa.ArrowInvalid:
        return pa.array([body_str(b) for b in raw.to_pylist()], type=pa.string())


_PADS = pa.array([b"", b"\0\0", b"\0"], type=pa.binary())  # by length % 3: to whole groups


def base64_strings(raw: pa.Array) -> pa.Array:
    """Section 3's ``bodyBase64`` of each body, in one pass over all of them.

    Each body is padded with zeros to a multiple of 3 bytes (Arrow's element-wise join), so
    the base64 of the concatenation is the concatenation of the bodies' base64 (one C call);
    then the characters that encode padding become ``=``, as base64 pads."""
    n = len(raw)
    if n == 0:
        return pa.array([], type=pa.string())
    lens = np.diff(_offsets(raw))
    rem = (lens % 3).astype(np.int8)
    padded = pc.binary_join_element_wise(raw, _PADS.take(pa.array(rem)), b"")
    offsets = _offsets(padded)
    data = memoryview(padded.buffers()[2])[offsets[0]: offsets[-1]]  # type: ignore[index]
    enc = np.frombuffer(bytearray(binascii.b2a_base64(data, newline=False)), dtype=np.uint8)
    out = np.zeros(n + 1, dtype=np.int64)
    np.cumsum((lens + 2) // 3 * 4, out=out[1:])
    if out[-1] >= 2**31:
        raise ValueError(f"{n} bodies give {out[-1]} bytes of base64: over Arrow's 2 GiB string")
    ends = out[1:]
    enc[ends[rem != 0] - 1] = ord("=")
    enc[ends[rem == 1] - 2] = ord("=")
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(out.astype(np.int32)), pa.py_buffer(enc)])


def _offsets(arr: pa.Array) -> np.ndarray:
    """The n + 1 value offsets of a binary array (int32), of its own slice."""
    return np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset: arr.offset + len(arr) + 1]


def column(
    recs: Records, name: str, props: Properties | None, body: pa.Array | None = None
) -> pa.Array:
    """One output column; ``props`` must be given for properties, tags and keys; ``body``
    (``body_bytes(recs)``) saves decoding the bodies again for each body column."""
    if name in _INT_COLUMNS:
        field, typ = _INT_COLUMNS[name]
        return pa.array(recs.int_field(field).astype(typ.to_pandas_dtype()), type=typ)
    if name == "topic":
        data = pa.py_buffer(recs.buf)
        return view_array(recs.buf, data, recs.topic_pos, recs.topic_len, pa.string())
    if name in BODY_COLUMNS:
        raw = body if body is not None else body_bytes(recs)
        if name == "bodyBytes":
            return raw
        return body_text(raw) if name == "body" else base64_strings(raw)
    if name == "msgId":
        return msg_ids(recs)
    if name == "bornTimestamp":
        return _timestamps(recs.int_field("born_timestamp"))
    if name == "storeTimestamp":
        return _timestamps(recs.int_field("store_timestamp"))
    if name in ("bornHost", "storeHost"):
        return host_strings(recs, name[: -len("Host")])
    assert props is not None
    if name == "properties":
        return props.as_map()
    if name == "tags":
        return props.lookup(PROPERTY_TAGS)
    if name == "keys":
        return props.lookup(PROPERTY_KEYS)
    if name == "tagsCode":
        return tags_codes(props.lookup(PROPERTY_TAGS))
    raise ValueError(f"unknown column {name!r}")


_NEEDS_PROPS = frozenset({"properties", "tags", "keys", "tagsCode"})


def decode(recs: Records, names: tuple[str, ...] = COLUMN_NAMES,
           broker_name: str = "") -> pa.RecordBatch:
    """A record batch with the columns ``names`` (Spark's Arrow schema for them);
    ``brokerName`` is ``broker_name`` on every row (the group the store belongs to)."""
    schema = arrow_schema(names)
    if len(recs) == 0:
        return _empty(schema)
    props = split_properties(recs) if _NEEDS_PROPS.intersection(names) else None
    body = body_bytes(recs) if BODY_COLUMNS.intersection(names) else None
    arrays = [constant_strings(broker_name, len(recs)) if name == "brokerName"
              else column(recs, name, props, body) for name in names]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def constant_strings(value: str, n: int) -> pa.Array:
    """``n`` copies of one string, built from its bytes once (offsets step by its length)."""
    raw = value.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.tobytes()),
                                                  pa.py_buffer(raw * n)])


def _empty(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)
