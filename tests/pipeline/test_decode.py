"""The vectorised decoder against the store's own record-by-record decoding (no JVM needed)."""

from __future__ import annotations

import base64
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import expected_rows, normalise
from storegen import StoreWriter

from common.core.message import SYSFLAG_COMPRESSED, body_str, encode_properties, tags_code
from common.format import record
from common.pipeline.decode import Records, base64_strings, decode, walk
from common.pipeline.layout import list_segments, valid_end
from common.store.commit_log import to_message

pytestmark = pytest.mark.spark


def segment_bytes(path: str) -> np.ndarray:
    return np.fromfile(path, dtype=np.uint8)


def decode_store(root: Path) -> list[dict[str, object]]:
    rows = []
    for seg in list_segments(root):
        buf = segment_bytes(seg.path)
        found = walk(buf, seg.base, verify_crc=True)
        rows += [normalise(r) for r in decode(Records(buf, found.starts)).to_pylist()]
    return rows


def test_every_field_matches_the_stores_reader(store) -> None:
    expected = expected_rows(store.root)
    assert len(expected) == len(store.written)
    assert len(list_segments(store.root)) >= 5
    assert decode_store(store.root) == expected


def test_walk_reports_blank_end_and_invalid_tails(store) -> None:
    segments = list_segments(store.root)
    for seg in segments[:-1]:
        found = walk(segment_bytes(seg.path), seg.base)
        assert found.stop == "blank"
    last = segments[-1]
    found = walk(segment_bytes(last.path), last.base)
    assert found.stop == "invalid" and "magic" in found.reason
    assert last.base + found.end == valid_end(segments) == store.written[-1].phy_offset + store.written[-1].size
    part = segment_bytes(last.path)[: found.end]
    assert walk(part, last.base).stop == "end"


def test_a_forged_header_inside_a_body_is_not_a_record(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path, 64 * 1024)
    writer.put("t", b"first")
    # The next record's body starts at its offset + 88: put a complete valid record there,
    # claiming that very offset, so it passes the magic and self-offset checks.
    at = writer.phy_offset + record.HEADER.size
    forged = record.encode(b"t", b"inner", b"", 0, 0, at)
    writer.put("t", bytes(forged) + b"tail")
    writer.put("t", b"last")
    seg = list_segments(tmp_path)[0]
    found = walk(segment_bytes(seg.path), seg.base, verify_crc=True)
    bodies = [r["bodyBytes"]
              for r in decode(Records(segment_bytes(seg.path), found.starts)).to_pylist()]
    assert bodies == [b"first", bytes(forged) + b"tail", b"last"]


def test_compressed_bodies_are_read_as_their_producer_sent_them(tmp_path: Path) -> None:
    """Records with SYSFLAG COMPRESSED (a RocketMQ producer's bodies >= 4 KiB) come out
    inflated in every body column; a body that does not inflate names its offset."""
    text = b"".join(b"line %05d of a long text body\n" % i for i in range(400))
    writer = StoreWriter(tmp_path, 256 * 1024)
    writer.put("t", b"plain")
    writer.put("t", zlib.compress(text, 5), sys_flag=SYSFLAG_COMPRESSED)
    writer.put("t", zlib.compress(b"\xff\xfe" * 3000, 5), sys_flag=SYSFLAG_COMPRESSED)
    seg = list_segments(tmp_path)[0]
    buf = segment_bytes(seg.path)
    found = walk(buf, seg.base, verify_crc=True)
    rows = decode(Records(buf, found.starts)).to_pylist()
    assert [r["bodyBytes"] for r in rows] == [b"plain", text, b"\xff\xfe" * 3000]
    assert [r["body"] for r in rows] == ["plain", text.decode(), None]
    assert base64.b64decode(rows[2]["bodyBase64"]) == b"\xff\xfe" * 3000
    assert [r["sysFlag"] for r in rows] == [0, SYSFLAG_COMPRESSED, SYSFLAG_COMPRESSED]
    assert rows[1]["storeSize"] < len(text) // 4  # stored deflated
    bad = writer.put("t", b"\x78\x5e not a zlib stream", sys_flag=SYSFLAG_COMPRESSED)
    buf = segment_bytes(seg.path)
    found = walk(buf, seg.base, verify_crc=True)
    with pytest.raises(ValueError, match=f"CommitLog offset {bad.phy_offset}: .*inflate"):
        decode(Records(buf, found.starts))


def test_crc_check_stops_at_a_flipped_body_byte(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path, 64 * 1024)
    for i in range(5):
        writer.put("t", f"body-{i}".encode())
    victim = writer.written[3]
    seg = list_segments(tmp_path)[0]
    with open(seg.path, "r+b") as f:
        f.seek(victim.phy_offset + record.HEADER.size + 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x01]))
    buf = segment_bytes(seg.path)
    assert walk(buf, 0).starts.size == 5
    checked = walk(buf, 0, verify_crc=True)
    assert checked.starts.size == 3
    assert checked.end == victim.phy_offset and checked.stop == "invalid"
    assert "CRC" in checked.reason


def test_properties_edge_cases_match_decode_properties(tmp_path: Path) -> None:
    raws = [
        b"",
        encode_properties({"TAGS": "a", "KEYS": "k1 k2"}),
        b"TAGS\x01no-trailing-separator",
        b"novalue\x02\x02KEYS\x01x\x02",
        b"\x01empty-name\x02TAGS\x01t\x02",
        "ünï\x01çödé\x02".encode(),
        b"bad\x01\xff\xfe\x02",
        b"TAGS\x01first\x02TAGS\x01second\x02",
        b"a\x01b\x02__CRC32#\x010123456789\x02",
    ]
    seg_bytes = 64 * 1024
    (tmp_path / "commitlog").mkdir()
    buf = bytearray(seg_bytes)
    pos = 0
    for props in raws:
        rec = record.encode(b"topic", b"x", props, 1, 0, pos)
        buf[pos : pos + len(rec)] = rec
        pos += len(rec)
    arr = np.frombuffer(bytes(buf), dtype=np.uint8)
    found = walk(arr, 0)
    rows = decode(Records(arr, found.starts), ("properties", "tags", "keys", "tagsCode")).to_pylist()
    for raw, row in zip(raws, rows, strict=True):
        m = to_message(record.encode(b"topic", b"x", raw, 1))
        # Arrow keeps every entry; the last of a repeated name is what dict-based readers see.
        assert dict(row["properties"]) == m.properties
        assert (row["tags"], row["keys"], row["tagsCode"]) == (m.tags, m.keys, tags_code(m.tags))


def test_empty_selection_gives_an_empty_batch_with_the_schema(store) -> None:
    seg = list_segments(store.root)[0]
    buf = segment_bytes(seg.path)
    batch = decode(Records(buf, np.zeros(0, dtype=np.int64)), ("topic", "body"))
    assert batch.num_rows == 0 and batch.schema.names == ["topic", "body"]


@pytest.mark.parametrize("bodies", [
    [b"plain", "héllo ✓".encode(), b""],  # all UTF-8: Arrow's one check
    [b"plain", b"\xff\xfe", "héllo".encode(), b"", b"\xed\xa0\x80", b"a\x00b"],  # mixed
])
def test_body_columns_follow_the_message_json(tmp_path: Path, bodies: list[bytes]) -> None:
    """body: UTF-8 text or null (a lone surrogate is not UTF-8); bodyBase64 always; bodyBytes raw."""
    writer = StoreWriter(tmp_path, 64 * 1024)
    for body in bodies:
        writer.put("t", body)
    seg = list_segments(tmp_path)[0]
    found = walk(segment_bytes(seg.path), seg.base, verify_crc=True)
    rows = decode(Records(segment_bytes(seg.path), found.starts),
                  ("bodyBase64", "body", "bodyBytes")).to_pylist()
    want = [{"bodyBase64": base64.b64encode(b).decode(), "body": body_str(b), "bodyBytes": b}
            for b in bodies]
    assert rows == want
    assert [r["body"] is None for r in rows] == [
        b in (b"\xff\xfe", b"\xed\xa0\x80") for b in bodies]


@given(st.lists(st.binary(max_size=70), max_size=30), st.data())
@settings(max_examples=300, deadline=None)
def test_base64_of_all_bodies_at_once_is_each_bodys_base64(bodies: list[bytes], data) -> None:
    arr = pa.array(bodies, type=pa.binary())
    lo = data.draw(st.integers(0, len(bodies)))
    hi = data.draw(st.integers(lo, len(bodies)))
    for a, want in ((arr, bodies), (arr.slice(lo, hi - lo), bodies[lo:hi])):
        assert base64_strings(a).to_pylist() == [base64.b64encode(b).decode() for b in want]
