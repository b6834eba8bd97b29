"""Fuzz reput's record scan in C (``common/store/_reput_scan.c``) on random and mutated runs
of records, against a model of it in Python written from its contract (reput.py's loop reads
each record the same way): the same runs, position, count, store time and first dispatch.
Every record it takes is read within its own bytes; it stops at whatever it does not take.
The buffer handed to it is followed by 64 KiB of filler, so a read past the records lands in
bytes the harness owns and shows as a mismatch, not as a crash.

Input: a flags byte (markers, rule topics, repair), max records, start position, then the
records (seeds: runs of real records made by the CommitLog's writer).
Run: ``python fuzz/reput_scan.py -max_total_time=600``.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from fuzz._harness import Reader, instrumented, run, tolerated

with instrumented(__name__):
    from common.core import accel
    from common.core.message import (
        KEY_SEPARATOR,
        PROPERTY_KEYS,
        PROPERTY_TAGS,
        PROPERTY_UNIQ_KEY,
        decode_properties,
        tags_code,
    )
    from common.format import record

NAME = "reput_scan"
FILLER = 64 * 1024 + 64  # past any length a record's fields can claim
MARKERS = ((), (b"KEYS\x01", b"UNIQ_KEY\x01"), (b"TAGS\x01",), (b"",),
           (b"WATCHED\x01", b"KEYS\x01", b"TAGS\x01", b"UNIQ_KEY\x01"))
RULES = ((), (b"orders",), (b"t", b"payments-eu"))
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
scan_module: Any = accel.load("common.store._reput_scan")
if scan_module is not None:
    scan_module.configure(PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY)


def _first(props_raw: bytes, ts: int) -> tuple[Any, ...]:
    """What dispatch_request hands the dispatchers for a marked record (no tags-code rule)."""
    props = decode_properties(props_raw)
    code = tags_code(props.get(PROPERTY_TAGS))
    keys = [k for k in props.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k]
    if PROPERTY_UNIQ_KEY in props:
        keys.append(props[PROPERTY_UNIQ_KEY])
    return (code, ts, tuple(keys), props)


def model(buf: bytes, pos: int, limit: int, file_size: int, max_records: int, base: int,
          markers: tuple[bytes, ...], rules: tuple[bytes, ...],
          strict: bool) -> tuple[Any, ...]:
    """The scan's contract in Python. ``strict``: a record whose properties length runs past
    it stops the scan before the CRC entry is taken off that length, else after (either
    keeps every read within the record)."""
    limit, file_size = min(limit, len(buf)), min(file_size, len(buf))
    runs: list[list[Any]] = []
    count, last_ts, first = 0, 0, None
    while pos >= 0 and pos + 8 <= limit and count < max_records:
        total = _I32.unpack_from(buf, pos)[0]
        if (_U32.unpack_from(buf, pos + 4)[0] != record.MAGIC_V1 or total < record.FIXED_BYTES
                or pos + total > file_size or pos + total > limit):
            break
        r = buf[pos:pos + total]
        body_len = _I32.unpack_from(r, 84)[0]
        if body_len < 0 or body_len > total - record.FIXED_BYTES:
            break
        p = 88 + body_len
        topic_end = p + 1 + r[p]
        if topic_end + 2 > total:
            break
        if record.layout_error(r, 0, total, body_len) is not None:
            break  # the lengths must add up to the record (record.layout_error)
        user_props = r[topic_end] << 8 | r[topic_end + 1]
        if strict and topic_end + 2 + user_props > total:
            break
        if user_props >= record.PROP_CRC_LEN and record.has_prop_crc(r, 0, total):
            user_props -= record.PROP_CRC_LEN
        if topic_end + 2 + user_props > total:
            break
        code = 0
        raw_props = r[topic_end + 2:topic_end + 2 + user_props]
        if user_props and any(m in raw_props for m in markers):
            if count > 0 or r[p + 1:topic_end] in rules:
                break
            ts = _I64.unpack_from(r, 56)[0]
            first = _first(raw_props, ts)
            code = first[0]
        topic, queue_id = r[p + 1:topic_end], _I32.unpack_from(r, 12)[0]
        queue_offset = _I64.unpack_from(r, 20)[0]
        run_ = runs[-1] if runs else None
        if (run_ is None or run_[0] != topic or run_[1] != queue_id
                or run_[2] + len(run_[3]) != queue_offset):
            run_ = [topic, queue_id, queue_offset, []]
            runs.append(run_)
        run_[3].append((base + pos, total, code))
        last_ts = _I64.unpack_from(r, 56)[0]
        pos += total
        count += 1
    return (runs, pos, count, last_ts, first)


def one_input(data: bytes) -> None:
    r = Reader(data)
    flags = r.byte()
    max_records = 1 + r.byte() % 16
    start = r.int(2)
    records = r.rest()
    markers = MARKERS[flags % len(MARKERS)]
    rules = RULES[(flags >> 3) % len(RULES)]
    limit = len(records) - (flags >> 5) * 7 if flags & 0x80 else len(records)
    file_size = len(records) if flags & 0x40 or not records else len(records) - 1
    start = start % (len(records) + 1)
    base = 1 << 30
    buf = records + bytes(range(256)) * (FILLER // 256)
    if scan_module is None:
        return
    got = scan_module.scan(buf, start, limit, file_size, max_records, base, markers, rules)
    got = (got[0], got[1], got[2], got[3], got[4])
    expected = [model(buf, start, limit, file_size, max_records, base, markers, rules, strict)
                for strict in (True, False)]
    got_cmp = ([[bytes(t), q, o, list(e)] for t, q, o, e in got[0]], *got[1:])
    if got_cmp in expected:
        return
    loose = expected[1]
    if loose[1] < got[1] and tolerated("reput-props-bounds"):
        return  # the C scan took a record whose properties run past it (read past it)
    raise AssertionError(f"C scan {got_cmp!r} != model {expected[0]!r}")


def seeds() -> list[bytes]:
    from fuzz.record_parse import real_records

    recs = real_records()
    out = [bytes([0, 15, 0, 0]) + b"".join(recs)]
    for i, raw in enumerate(recs):
        out.append(bytes([i % 5 | (i % 3) << 3 | 0x40, 4, 0, 0]) + raw + recs[(i + 1) % len(recs)])
    # a record whose properties length claims more than it holds (a corrupt log)
    bad = bytearray(recs[1])
    body_len = int.from_bytes(bad[84:88], "big")
    at = 88 + body_len + 1 + bad[88 + body_len]
    bad[at:at + 2] = (0xFFFF).to_bytes(2, "big")
    out.append(bytes([1 | 0x40, 4, 0, 0]) + bytes(bad))
    return out


if __name__ == "__main__":
    import atheris

    model = atheris.instrument_func(model)  # its branches are the C scan's: feedback for it
    run(NAME, one_input)
