"""Fuzz record parsing: ``record.check`` and the readers of a checked record
(``common/format/record.py``), ``protocol.decode_record``, and a POP answer's records made
into gRPC messages in C (``common/proxy/_received.c``) against the Python path
(``decode_record`` then ``convert.incoming``). The seeds are real records made by the
CommitLog's record writer; the harness may repair a mutated record's CRCs so the fuzzer gets
past them. ``check`` never raises; a record it passes is read within its bytes; the C and
Python answers are the same messages, or the Python path refuses.

Input: a flags byte (repair which CRCs; the check's options), then the record.
Run: ``python fuzz/record_parse.py -max_total_time=600``.
"""

from __future__ import annotations

import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from fuzz._harness import Reader, instrumented, run

with instrumented(__name__):
    from common.core.errors import BrokerError, ResponseCode
    from common.format import record
    from common.format.protocol import ProtocolError, Response, decode_record
    from common.proxy import convert

NAME = "record_parse"


def repair(buf: bytearray, body_crc: bool, prop_crc: bool) -> None:
    """Make a mutated record's body CRC and whole-record CRC right again, where its lengths
    let them be found."""
    if len(buf) < record.FIXED_BYTES:
        return
    body_len = int.from_bytes(buf[84:88], "big", signed=True)
    if body_crc and 0 <= body_len <= len(buf) - record.FIXED_BYTES:
        crc = zlib.crc32(buf[88:88 + body_len]) & 0x7FFFFFFF
        buf[8:12] = crc.to_bytes(4, "big")
    total = int.from_bytes(buf[0:4], "big", signed=True)
    if prop_crc and record.FIXED_BYTES + record.PROP_CRC_LEN <= total <= len(buf) \
            and record.has_prop_crc(buf, 0, total):
        record.seal(buf, 0, total)


def _read_checked(buf: bytes, size: int) -> None:
    """What the store and clients read of a record ``check`` passed: within its bytes."""
    parsed = record.parse(buf, 0)
    end = record.HEADER.size + len(parsed.body) + 1 + len(parsed.topic) + 2 + len(parsed.props)
    assert end == size, (end, size)
    record.decode_message(buf, 0)
    record.record_tags(buf, 0)
    record.record_properties(buf, 0)


def _received(raw: bytes, handle: str, attempts: int) -> None:
    """The C answer of a POP record against the Python path's."""
    resp = Response(ResponseCode.SUCCESS, 1, "", {"handles": [handle],
                                                  "reconsumeTimes": [attempts]}, [raw])
    native: Any = convert._native
    try:
        fast = [m.SerializeToString(deterministic=True) for m in convert.received(resp)]
    except BrokerError as e:
        fast = [("refused", e.code, str(e))]
    convert._native = None
    try:
        slow = [m.SerializeToString(deterministic=True) for m in convert.received(resp)]
    except BrokerError as e:
        slow = [("refused", e.code, str(e))]
    finally:
        convert._native = native
    if fast != slow:  # the same message may serialize its map in another order: parse both
        parse = convert.rpc.ReceiveMessageResponse.FromString
        assert not isinstance(slow[0], tuple) and not isinstance(fast[0], tuple), (fast, slow)
        assert [parse(m) for m in fast] == [parse(m) for m in slow], (raw, fast, slow)


def one_input(data: bytes) -> None:
    r = Reader(data)
    flags = r.byte()
    buf = bytearray(r.rest())
    repair(buf, body_crc=bool(flags & 1), prop_crc=bool(flags & 2))
    raw = bytes(buf)
    expect = None
    if flags & 16 and len(raw) >= 36:
        expect = int.from_bytes(raw[28:36], "big", signed=True)
    checked = record.check(raw, 0, len(raw), expect_phy_offset=expect,
                           verify_crc=not flags & 4, require_prop_crc=bool(flags & 8))
    assert checked.size >= -1 and (checked.size > 0 or checked.reason or checked.size == 0)
    if checked.size > 0:
        assert checked.size <= len(raw)
        _read_checked(raw, checked.size)
    try:
        decode_record(raw)
    except ProtocolError as e:
        assert e.field.startswith("record"), e.field
    handle = "rp1 b t 0 0 0 0 30000" if flags & 32 else ""
    _received(raw, handle, (2**31 - 1) if flags & 64 else flags & 7)


def real_records() -> list[bytes]:
    """Records the CommitLog writes (CRCs, properties, batches), each whole."""
    from common.core.message import PROPERTY_UNIQ_KEY, Message
    from common.store.commit_log import CommitLog

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        log = CommitLog(Path(tmp) / "commitlog", 64 * 1024, max_message_size=4096)
        log.load()
        try:
            puts = [
                (Message("orders", b"hello"), 0),
                (Message("orders", b"x" * 300, tags="TagA", keys="k1 k2"), 1),
                (Message("payments-eu", b"", properties={"color": "blue", "\u00e9": "\u65e5"}),
                 2),
                (Message("orders", b"b", tags="\U0001f642x",
                         properties={PROPERTY_UNIQ_KEY: "7F0000010001"}), 0),
                (Message("%RETRY%g", b"retry", keys=["a", "b"], properties={"DELAY": "3"}), 0),
                (Message("t", zlib.compress(b"z" * 200), properties={"WATCHED": "1"}), 3),
            ]
            for msg, queue_id in puts:
                assert log.put(msg, queue_id).ok
            assert log.put_batch("orders", 1, [b"one", b"two"]).ok
            end = log.max_offset
            raw = log.read(0, end)
        finally:
            log.shutdown()
    pos = 0
    while pos < len(raw):
        size = int.from_bytes(raw[pos:pos + 4], "big")
        out.append(raw[pos:pos + size])
        pos += size
    return out


def seeds() -> list[bytes]:
    out = []
    for i, raw in enumerate(real_records()):
        out.append(bytes([3 | (i % 2) * 32]) + raw)
        out.append(bytes([0]) + raw[: len(raw) // 2])
    compressed = bytearray(real_records()[-3])
    compressed[36:40] = (record.HEADER.unpack_from(compressed)[7] | 1).to_bytes(4, "big")
    out.append(bytes([3]) + bytes(compressed))
    out.append(bytes([0]) + record.blank(8))
    return out


if __name__ == "__main__":
    run(NAME, one_input)
