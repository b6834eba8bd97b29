"""The record writer in C against the Python one: the same bytes, the same refusals.

``common/format/record_writer.py`` holds the Python writer (the reference) and picks the C one
when the extension is built. These tests hold the two to each other on random records, check
that a refusal writes nothing in either, and run a CommitLog on each writer to the same bytes on
disk, so the pure-Python path stays tested wherever the extension is built.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.core.message import Message
from common.format import record, record_writer
from common.store import commit_log as commit_log_module
from common.store.commit_log import CommitLog
from common.store.consume_queue import CQ_ENTRY

pytestmark = pytest.mark.unit

native = pytest.importorskip("common.format._record_writer",
                             reason="the C record writer is not built here")

SHARED: dict[str, Any] = {"base": 1 << 40, "queue_id": 3, "queue_offset": 77,
                          "born": 1_700_000_000_123, "born_ip": b"\x0a\x00\x00\x07",
                          "born_port": 40001, "ts": 1_700_000_000_456,
                          "store_ip": b"\x7f\x00\x00\x01", "store_port": 10911}


def _tail(topic: bytes, props: bytes, crc_len: int) -> bytes:
    placeholder = record.PROP_CRC_PLACEHOLDER if crc_len else b""
    return bytes([len(topic)]) + topic + (len(props) + crc_len).to_bytes(2, "big") + props \
        + placeholder


def _items(bodies: list[bytes], props: list[bytes], flags: list[int], crc_len: int,
           topic: bytes = b"orders") -> list[tuple]:
    out: list[tuple] = []
    for i, (body, p) in enumerate(zip(bodies, props, strict=True)):
        tail = _tail(topic, p, crc_len)
        item = (record.HEADER.size + len(body) + len(tail), zlib.crc32(body) & 0x7FFFFFFF,
                flags[i % len(flags)], body, tail, i % 3, (i % 2) * 4)
        # every third, a transaction's commit: its half's offset in PREPAREDTRANSACTIONOFFSET
        out.append(item + ((1 << 40) + i,) if i % 3 == 2 else item)
    return out


def _both(write: Callable[..., Any], py_write: Callable[..., Any], size: int, pos: int,
          *args: Any) -> tuple[bytearray, Any]:
    bufs, results = [], []
    for fn in (write, py_write):
        buf = bytearray(b"\xee" * size)
        results.append(fn(buf, pos, *args))
        bufs.append(buf)
    assert bufs[0] == bufs[1]
    assert results[0] == results[1]
    return bufs[0], results[0]


@settings(max_examples=150, deadline=None)
@given(bodies=st.lists(st.binary(max_size=300), min_size=1, max_size=12),
       props=st.lists(st.binary(max_size=40).filter(lambda b: b"\x00" not in b), min_size=12,
                      max_size=12),
       flags=st.lists(st.integers(-(1 << 31), (1 << 31) - 1), min_size=1, max_size=4),
       crc_len=st.sampled_from([0, record.PROP_CRC_LEN]),
       pos=st.integers(0, 64))
def test_items_are_written_byte_for_byte_as_the_python_writer_writes_them(
        bodies: list[bytes], props: list[bytes], flags: list[int], crc_len: int,
        pos: int) -> None:
    props = [p if i % 2 else b"" for i, p in enumerate(props[: len(bodies)])]
    items = _items(bodies, props, flags, crc_len)
    plain_tail_len = len(_tail(b"orders", b"", crc_len))
    total = sum(i[0] for i in items)
    buf, (entries, plain, cq) = _both(native.write_items, record_writer.py_write_items,
                                  pos + total + 16, pos, items, *SHARED.values(), crc_len,
                                  plain_tail_len)
    assert plain == all(not p for p in props)
    assert cq == b"".join(CQ_ENTRY.pack(*e) for e in entries)  # what reput appends as is
    assert buf[:pos] == b"\xee" * pos and buf[pos + total:] == b"\xee" * 16
    at = pos
    for i, (phy, size, zero) in enumerate(entries):
        assert (phy, size, zero) == (SHARED["base"] + at, items[i][0], 0)
        assert record.check(buf, at, len(buf), SHARED["base"] + at,
                            require_prop_crc=bool(crc_len)).size == size
        msg = record.decode_message(buf, at)
        assert (msg.body, msg.queue_offset, msg.queue_id) == (bodies[i], 77 + i, 3)
        at += size


@settings(max_examples=100, deadline=None)
@given(bodies=st.lists(st.binary(max_size=2000), min_size=1, max_size=70),
       crc_len=st.sampled_from([0, record.PROP_CRC_LEN]))
def test_plain_bodies_are_written_as_the_python_writer_writes_them(bodies: list[bytes],
                                                                   crc_len: int) -> None:
    tail = _tail(b"t", b"", crc_len)
    total = sum(record.HEADER.size + len(b) + len(tail) for b in bodies)
    buf, (entries, cq) = _both(native.write_bodies, record_writer.py_write_bodies, total, 0,
                               bodies, tail, *SHARED.values(), crc_len)
    assert cq == b"".join(CQ_ENTRY.pack(*e) for e in entries)
    assert [size for _, size, _ in entries] == [record.HEADER.size + len(b) + len(tail)
                                                for b in bodies]
    at = 0
    for body in bodies:
        assert record.decode_message(buf, at).body == body
        checked = record.check(buf, at, len(buf), require_prop_crc=bool(crc_len))
        assert checked.size > 0, checked.reason
        at += checked.size


@pytest.mark.parametrize("writer", ["c", "python"])
@pytest.mark.parametrize("case", ["short buffer", "size mismatch", "not bytes", "bad crc_len",
                                  "bad host", "int out of range"])
def test_a_refused_write_leaves_the_buffer_as_it_was(writer: str, case: str) -> None:
    write: Any = native.write_items if writer == "c" else record_writer.py_write_items
    items = _items([b"a" * 10, b"b" * 20], [b"", b""], [0], record.PROP_CRC_LEN)
    shared = dict(SHARED)
    crc_len = record.PROP_CRC_LEN
    size = sum(i[0] for i in items)
    if case == "short buffer":
        size -= 1
    elif case == "size mismatch":
        items[1] = (items[1][0] + 1, *items[1][1:])
    elif case == "not bytes":
        items[1] = (*items[1][:3], "text", *items[1][4:])
    elif case == "bad crc_len":
        crc_len = 7
    elif case == "bad host":
        shared["store_ip"] = b"\x7f\x00\x01"
    else:
        items[1] = (*items[1][:2], 1 << 31, *items[1][3:])
    buf = bytearray(b"\xee" * (size + 200))
    before = bytes(buf)
    with pytest.raises((ValueError, TypeError, OverflowError, record.struct.error)):
        write(buf, 200 if case == "short buffer" else 0, items, *shared.values(), crc_len, 0)
    assert bytes(buf) == before


def _fill(log: CommitLog) -> None:
    for i in range(40):
        log.put(Message("orders", f"m{i}".encode() * (i + 1), tags=f"t{i % 3}", keys=f"k{i}",
                        flag=i), i % 4, born_port=5000 + i, born_timestamp=1_700_000_000_000 + i)
        log.put_batch("orders", i % 4, [b"x" * (i * 53 % 1500) for _ in range(i % 9 + 1)],
                      born_timestamp=1_700_000_000_500 + i)
        log.put_batch("orders", 1, [Message("orders", f"y{i}".encode(), keys=f"kb{i}"), b"z" * i],
                      born_timestamp=1_700_000_000_900 + i)


@pytest.mark.parametrize("crc", [True, False])
def test_a_commit_log_writes_the_same_bytes_on_either_writer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crc: bool) -> None:
    monkeypatch.setattr(commit_log_module, "now_ms", lambda: 1_700_000_001_000)
    images = []
    for name, items, bodies in (("c", native.write_items, native.write_bodies),
                                ("python", record_writer.py_write_items,
                                 record_writer.py_write_bodies)):
        monkeypatch.setattr(record_writer, "write_items", items)
        monkeypatch.setattr(record_writer, "write_bodies", bodies)
        log = CommitLog(tmp_path / name, 64 * 1024, max_message_size=4096, append_prop_crc=crc)
        log.load()
        try:
            _fill(log)  # rolls over to a third 64 KiB segment
            assert log.max_offset > 2 * 64 * 1024, log.max_offset
            records = [(phy, bytes(raw)) for phy, raw in log.iter_records(0, log.max_offset)]
            assert len(records) == 40 * 2 + sum(i % 9 + 1 for i in range(40)) + 40
            for phy, raw in records:
                assert record.check(raw, 0, len(raw), phy, require_prop_crc=crc).size == len(raw)
        finally:
            log.shutdown()
        segments = sorted(p for p in (tmp_path / name).rglob("*") if p.is_file())
        assert len(segments) == 3
        images.append(b"".join(p.read_bytes() for p in segments))
    assert images[0] == images[1]


@pytest.mark.parametrize("writer", ["c", "python"])
@pytest.mark.parametrize("case", ["short buffer", "not bytes", "short tail"])
def test_a_refused_plain_write_leaves_the_buffer_as_it_was(writer: str, case: str) -> None:
    write: Any = native.write_bodies if writer == "c" else record_writer.py_write_bodies
    crc_len = record.PROP_CRC_LEN
    tail = _tail(b"t", b"", crc_len)
    bodies: list[Any] = [b"a" * 10, b"b" * 20, b"c" * 30]
    room = sum(record.HEADER.size + len(b) + len(tail) for b in bodies)
    if case == "short buffer":
        room -= 1
    elif case == "not bytes":
        bodies[2] = bytearray(b"c" * 30)
    else:
        tail = tail[:5]
    buf = bytearray(b"\xee" * room)
    with pytest.raises((ValueError, TypeError)):
        write(buf, 0, bodies, tail, *SHARED.values(), crc_len)
    assert buf == bytearray(b"\xee" * room)
