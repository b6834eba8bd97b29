"""Writes small, valid store directories byte by byte, without the broker: for decoder tests
that need records the store would never write (forged headers inside bodies, odd properties).

Segments hold records made by ``common.format.record.encode``, a BLANK record pads each full
segment, files are full-size and named by their 20-digit start offset, and ConsumeQueue files
get one 20-byte entry per record, exactly as the broker lays them out.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

from common.core.message import encode_properties, host_bytes, tags_code
from common.format import record

CQ_ENTRY = struct.Struct(">qiq")
assert CQ_ENTRY.size == 20


@dataclasses.dataclass
class Written:
    """What the generator put where: enough for an independent expectation."""

    topic: str
    queue_id: int
    queue_offset: int
    phy_offset: int
    size: int
    body: bytes
    props: dict[str, str]
    born_ms: int
    store_ms: int


class StoreWriter:
    """Appends records to ``root/commitlog`` and ``root/consumequeue`` like a broker would."""

    def __init__(self, root: Path, segment_bytes: int = 64 * 1024, cq_entries: int = 1000):
        self.root = Path(root)
        self.segment_bytes = segment_bytes
        self.cq_bytes = cq_entries * CQ_ENTRY.size
        self.log_dir = self.root / "commitlog"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.phy_offset = 0
        self.queue_offsets: dict[tuple[str, int], int] = {}
        self.written: list[Written] = []

    def _segment(self, start: int) -> Path:
        path = self.log_dir / f"{start:020d}"
        if not path.exists():
            with open(path, "wb") as f:
                f.truncate(self.segment_bytes)
        return path

    def _write(self, path: Path, pos: int, data: bytes | bytearray) -> None:
        with open(path, "r+b") as f:
            f.seek(pos)
            f.write(data)

    def put(
        self,
        topic: str,
        body: bytes,
        queue_id: int = 0,
        tags: str | None = None,
        keys: str | None = None,
        extra: dict[str, str] | None = None,
        born_ms: int = 1_700_000_000_000,
        store_ms: int | None = None,
        sys_flag: int = 0,
    ) -> Written:
        props = dict(extra or {})
        if tags is not None:
            props["TAGS"] = tags
        if keys is not None:
            props["KEYS"] = keys
        store_ms = born_ms + 3 if store_ms is None else store_ms
        qkey = (topic, queue_id)
        queue_offset = self.queue_offsets.get(qkey, 0)
        rec = record.encode(
            topic.encode(), body, encode_properties(props), queue_id, queue_offset,
            born_timestamp=born_ms, store_timestamp=store_ms, sys_flag=sys_flag,
            born_ip=host_bytes("10.0.0.7"), born_port=5555,
            store_ip=host_bytes("127.0.0.1"), store_port=10911,
        )
        seg_start = self.phy_offset - self.phy_offset % self.segment_bytes
        pos = self.phy_offset - seg_start
        if pos + len(rec) + record.END_FILE_MIN_BLANK > self.segment_bytes:
            left = self.segment_bytes - pos
            self._write(self._segment(seg_start), pos, record.blank(left))
            self.phy_offset = seg_start + self.segment_bytes
            seg_start, pos = self.phy_offset, 0
        record.patch(rec, 0, queue_offset, self.phy_offset, store_ms)
        self._write(self._segment(seg_start), pos, rec)
        self._append_cq(topic, queue_id, queue_offset, self.phy_offset, len(rec), tags)
        w = Written(topic, queue_id, queue_offset, self.phy_offset, len(rec), body, props,
                    born_ms, store_ms)
        self.written.append(w)
        self.queue_offsets[qkey] = queue_offset + 1
        self.phy_offset += len(rec)
        return w

    def _append_cq(self, topic: str, queue_id: int, queue_offset: int, phy: int, size: int,
                   tags: str | None) -> None:
        qdir = self.root / "consumequeue" / topic / str(queue_id)
        qdir.mkdir(parents=True, exist_ok=True)
        byte_pos = queue_offset * CQ_ENTRY.size
        start = byte_pos - byte_pos % self.cq_bytes
        path = qdir / f"{start:020d}"
        if not path.exists():
            with open(path, "wb") as f:
                f.truncate(self.cq_bytes)
        self._write(path, byte_pos - start, CQ_ENTRY.pack(phy, size, tags_code(tags)))
