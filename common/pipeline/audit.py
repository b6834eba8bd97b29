"""Audit: prove that a slave's CommitLog is a byte copy of its master's, or show where not.

1. Each store's extent: first offset and the end of its last whole valid record (the
   ``checkpoint``'s flushed offset is reported beside it).
2. The common range is cut into 1 MiB blocks at absolute offsets; Spark tasks hash each block
   of both stores (BLAKE2b) and keep the blocks whose hashes differ.
3. For the first differing blocks, both logs are walked record by record: the first differing
   byte, the records that differ and why (bytes, missing, invalid) are reported.

The *replicated prefix* is where the slave stops being a byte copy, in whole master records:
the start of the master record holding the first differing byte, or the common end when the
common range is identical. A store holding more than the other is reported as ahead, not as
divergent: that is lag (or an unacknowledged tail), which replication is meant to fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.format import record

from .decode import walk
from .layout import Segment, flushed_offset, list_segments, valid_end

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

BLOCK_BYTES = 1 << 20
MAX_BLOCKS_EXAMINED = 16
MAX_RECORD_DIFFS = 50
RECORD_READ_SLACK = 8 << 20  # read this far past a block to finish its last record


@dataclasses.dataclass(frozen=True)
class Extent:
    """What one store holds: log offsets ``[min_offset, end)``; ``flushed`` from checkpoint."""

    store_dir: str
    segments: tuple[Segment, ...]
    min_offset: int
    end: int
    flushed: int | None

    @classmethod
    def of(cls, store_dir: str | Path) -> Extent:
        segments = list_segments(store_dir)
        start = segments[0].base if segments else 0
        return cls(str(store_dir), tuple(segments), start, valid_end(segments),
                   flushed_offset(store_dir))

    def as_dict(self) -> dict[str, Any]:
        return {"storeDir": self.store_dir, "minOffset": self.min_offset, "end": self.end,
                "flushedOffset": self.flushed, "segments": len(self.segments)}


def read_range(segments: tuple[Segment, ...], lo: int, hi: int) -> np.ndarray:
    """Log bytes ``[lo, hi)`` across segment files (shorter if the files end first)."""
    parts = []
    for seg in segments:
        a, b = max(lo, seg.base), min(hi, seg.end)
        if a < b:
            parts.append(np.fromfile(seg.path, dtype=np.uint8, count=b - a, offset=a - seg.base))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)


def block_range(block: int, lo: int, hi: int) -> tuple[int, int]:
    return max(lo, block * BLOCK_BYTES), min(hi, (block + 1) * BLOCK_BYTES)


def block_digest(segments: tuple[Segment, ...], block: int, lo: int, hi: int) -> bytes:
    a, b = block_range(block, lo, hi)
    data = read_range(segments, a, b)
    h = hashlib.blake2b(digest_size=16)
    h.update((b - a).to_bytes(8, "big"))
    h.update(data.data)
    return h.digest()


def differing_blocks(
    master: tuple[Segment, ...], slave: tuple[Segment, ...], blocks: Iterable[int], lo: int, hi: int
) -> Iterator[int]:
    """The blocks whose hashes differ (runs on an executor, over one partition of blocks)."""
    for block in blocks:
        if block_digest(master, block, lo, hi) != block_digest(slave, block, lo, hi):
            yield block


@dataclasses.dataclass(frozen=True)
class RecordDiff:
    """A record offset where the two logs disagree."""

    offset: int
    kind: str  # "bytes" | "missing_on_slave" | "missing_on_master"
    master_size: int | None
    slave_size: int | None
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "kind": self.kind, "masterSize": self.master_size,
                "slaveSize": self.slave_size, "detail": self.detail}


@dataclasses.dataclass(frozen=True)
class BlockDiff:
    block: int
    first_byte: int  # first differing log offset in the block
    master_record: int  # start of the master record holding first_byte (-1: none)
    records: tuple[RecordDiff, ...]


def _records(segments: tuple[Segment, ...], lo: int, hi: int, end: int) -> tuple[dict[int, bytes], str]:
    """Records overlapping ``[lo, hi)`` (offset -> bytes) and a note if the walk broke there."""
    found: dict[int, bytes] = {}
    note = ""
    for seg in segments:
        if seg.end <= lo or seg.base >= hi or seg.base >= end:
            continue
        count = min(seg.size, end - seg.base, hi - seg.base + RECORD_READ_SLACK)
        buf = np.fromfile(seg.path, dtype=np.uint8, count=count)
        w = walk(buf, seg.base)
        overlap = (w.starts + seg.base < hi) & (w.starts + w.sizes + seg.base > lo)
        for pos, size in zip(w.starts[overlap].tolist(), w.sizes[overlap].tolist(), strict=True):
            found[seg.base + pos] = buf[pos : pos + size].tobytes()
        if w.stop == "invalid" and lo <= seg.base + w.end < hi:
            note = f"invalid record at {seg.base + w.end}: {w.reason}"
    return found, note


def compare_block(master: Extent, slave: Extent, block: int, lo: int, hi: int) -> BlockDiff:
    """Record-by-record comparison of one block whose hashes differ."""
    a, b = block_range(block, lo, hi)
    mbytes, sbytes = read_range(master.segments, a, b), read_range(slave.segments, a, b)
    n = min(mbytes.size, sbytes.size)
    diff = np.flatnonzero(mbytes[:n] != sbytes[:n])
    first = a + int(diff[0]) if diff.size else a + n
    mrec, mnote = _records(master.segments, a, b, master.end)
    srec, snote = _records(slave.segments, a, b, slave.end)
    holder = [off for off, raw in mrec.items() if off <= first < off + len(raw)]
    diffs = []
    for off in sorted(set(mrec) | set(srec)):
        m, s = mrec.get(off), srec.get(off)
        if m == s:
            continue
        if m is not None and s is not None:
            diffs.append(RecordDiff(off, "bytes", len(m), len(s), _explain(m, s, off)))
        elif m is not None:
            diffs.append(RecordDiff(off, "missing_on_slave", len(m), None, snote))
        elif s is not None:
            diffs.append(RecordDiff(off, "missing_on_master", None, len(s), mnote))
    return BlockDiff(block, first, holder[0] if holder else -1, tuple(diffs))


def _explain(m: bytes, s: bytes, offset: int) -> str:
    """Which field of a record differs, in words."""
    for name, raw in (("slave", s), ("master", m)):
        check = record.check(raw, 0, len(raw), expect_phy_offset=offset)
        if check.size < 0:
            return f"{name} record invalid: {check.reason}"
    if m[record.HEADER.size:] != s[record.HEADER.size:]:
        return "body/topic/properties differ"
    return "header fields differ"


@dataclasses.dataclass(frozen=True)
class AuditReport:
    master: Extent
    slave: Extent
    common_start: int
    common_end: int
    blocks_compared: int
    blocks_differing: int
    examined: tuple[BlockDiff, ...]

    @property
    def first_difference(self) -> int | None:
        return self.examined[0].first_byte if self.examined else None

    @property
    def divergent(self) -> bool:
        return self.blocks_differing > 0

    @property
    def replicated_prefix(self) -> int:
        if not self.examined:
            return self.common_end
        first = self.examined[0]
        return first.master_record if first.master_record >= 0 else first.first_byte

    @property
    def identical(self) -> bool:
        return not self.divergent and self.master.end == self.slave.end

    def as_dict(self) -> dict[str, Any]:
        records = [r.as_dict() for b in self.examined for r in b.records][:MAX_RECORD_DIFFS]
        return {
            "master": self.master.as_dict(),
            "slave": self.slave.as_dict(),
            "commonStart": self.common_start,
            "commonEnd": self.common_end,
            "blockBytes": BLOCK_BYTES,
            "blocksCompared": self.blocks_compared,
            "blocksDiffering": self.blocks_differing,
            "divergent": self.divergent,
            "identical": self.identical,
            "firstDifferentOffset": self.first_difference,
            "replicatedPrefix": self.replicated_prefix,
            "slaveBehindBytes": max(0, self.master.end - self.slave.end),
            "slaveAheadBytes": max(0, self.slave.end - self.master.end),
            "differingRecords": records,
        }


def run_audit(spark: SparkSession, master_dir: str, slave_dir: str,
              max_blocks: int = MAX_BLOCKS_EXAMINED) -> AuditReport:
    """Compare two store directories (the master's first)."""
    master, slave = Extent.of(master_dir), Extent.of(slave_dir)
    lo = max(master.min_offset, slave.min_offset)
    hi = max(lo, min(master.end, slave.end))
    blocks = list(range(lo // BLOCK_BYTES, -(-hi // BLOCK_BYTES))) if hi > lo else []
    bad: list[int] = []
    if blocks:
        sc = spark.sparkContext
        slices = max(1, min(len(blocks), sc.defaultParallelism * 4))
        msegs, ssegs = master.segments, slave.segments
        bad = sorted(
            sc.parallelize(blocks, slices)
            .mapPartitions(lambda it: differing_blocks(msegs, ssegs, it, lo, hi))
            .collect()
        )
    examined = []
    if bad:
        sc = spark.sparkContext
        chosen = bad[:max_blocks]
        examined = sc.parallelize(chosen, len(chosen)).map(
            lambda blk: compare_block(master, slave, blk, lo, hi)).collect()
        examined.sort(key=lambda d: d.first_byte)
    return AuditReport(master, slave, lo, hi, len(blocks), len(bad), tuple(examined))


def _extent_line(name: str, e: dict[str, Any]) -> str:
    return (f"{name:8s} {e['storeDir']}: [{e['minOffset']}, {e['end']}) "
            f"flushed={e['flushedOffset']}")


def format_report(report: AuditReport) -> str:
    """Human-readable summary, one fact per line."""
    d = report.as_dict()
    lines = [
        _extent_line("master", d["master"]),
        _extent_line("slave", d["slave"]),
        (f"compared [{d['commonStart']}, {d['commonEnd']}) in {d['blocksCompared']} blocks of "
         f"{BLOCK_BYTES} bytes; {d['blocksDiffering']} differ"),
        f"verdict  {'DIVERGENT' if d['divergent'] else 'IDENTICAL' if d['identical'] else 'PREFIX'}",
        f"replicated prefix {d['replicatedPrefix']}",
    ]
    if d["divergent"]:
        lines.append(f"first differing offset {d['firstDifferentOffset']}")
    if d["slaveBehindBytes"]:
        lines.append(f"slave is behind by {d['slaveBehindBytes']} bytes")
    if d["slaveAheadBytes"]:
        lines.append(f"slave holds {d['slaveAheadBytes']} bytes the master does not")
    for r in d["differingRecords"]:
        lines.append(f"  record {r['offset']}: {r['kind']} master={r['masterSize']} "
                     f"slave={r['slaveSize']} {r['detail']}")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class ClusterAudit:
    """Every broker group's replicas, each compared with its group's reference replica (the
    master's store, or the most complete one): a cluster's groups hold different logs, so
    only replicas of one group are compared. group -> (reference store, reports)."""

    groups: dict[str, tuple[str, tuple[AuditReport, ...]]]

    @property
    def divergent(self) -> bool:
        return any(r.divergent for _, reports in self.groups.values() for r in reports)

    @property
    def identical(self) -> bool:
        return all(r.identical for _, reports in self.groups.values() for r in reports)

    def as_dict(self) -> dict[str, Any]:
        return {"divergent": self.divergent, "identical": self.identical,
                "groups": [{"brokerName": name, "reference": reference,
                            "divergent": any(r.divergent for r in reports),
                            "identical": all(r.identical for r in reports),
                            "replicas": [r.as_dict() for r in reports]}
                           for name, (reference, reports) in sorted(self.groups.items())]}


def run_cluster_audit(spark: SparkSession, groups: dict[str, list[str]],
                      max_blocks: int = MAX_BLOCKS_EXAMINED) -> ClusterAudit:
    """``run_audit`` of every replica of every group against the group's first store (a group
    of one replica has nothing to compare and is listed with no report)."""
    out = {}
    for name, stores in sorted(groups.items()):
        reference, *others = stores
        out[name] = (reference, tuple(run_audit(spark, reference, other, max_blocks)
                                      for other in others))
    return ClusterAudit(out)


def format_cluster_report(audit: ClusterAudit) -> str:
    lines = []
    for name, (reference, reports) in sorted(audit.groups.items()):
        verdict = ("DIVERGENT" if any(r.divergent for r in reports) else
                   "IDENTICAL" if all(r.identical for r in reports) else "PREFIX")
        lines.append(f"group {name}: {verdict} ({len(reports)} replica(s) against "
                     f"{reference})")
        for report in reports:
            lines += ["  " + line for line in format_report(report).splitlines()]
    verdict = "DIVERGENT" if audit.divergent else "IDENTICAL" if audit.identical else "PREFIX"
    lines.append(f"cluster: {verdict}")
    return "\n".join(lines)
