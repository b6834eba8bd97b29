"""Reindex: rebuild ConsumeQueue entries from the CommitLog in parallel and compare them with
the broker's own files.

ConsumeQueue files (``consumequeue/<topic>/<queueId>/<20-digit byte offset>``) hold 20-byte
big-endian entries, entry ``i`` of a file being queue offset ``file_start / 20 + i``:

| off | field     | size |                                                          |
|-----|-----------|------|----------------------------------------------------------|
|   0 | offset    | 8    | CommitLog offset of the record                           |
|   8 | size      | 4    | record size (TOTALSIZE)                                  |
|  12 | tagsCode  | 8    | Java String.hashCode of TAGS (0 without tags)            |

An entry with size <= 0 ends a file's valid entries; size 0x7FFFFFFF marks a pre-blank
filler (RocketMQ ``fillPreBlank``) and is skipped. The CommitLog side comes from the replog
source: every record with ``(sysFlag & 0xC)`` not prepared/rolled back is dispatched, to its
QUEUEID at its QUEUEOFFSET. In ``SCHEDULE_TOPIC_XXXX`` the tagsCode is a delivery time, so only
offset and size are compared there.

Kinds of mismatch: ``differs`` (both have the queue offset, offset/size/tagsCode disagree),
``missing_in_consumequeue`` (a record has no entry), ``missing_in_commitlog`` (an entry points
to no record of the readable log). Entries below the first entry kept on disk (retention) and
entries pointing below the log's first offset are not mismatches; they are counted apart.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.core.message import SCHEDULE_TOPIC

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CQ_ENTRY = struct.Struct(">qiq")
assert CQ_ENTRY.size == 20
CQ_DTYPE = np.dtype([("offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
assert CQ_DTYPE.itemsize == CQ_ENTRY.size
PRE_BLANK_SIZE = 0x7FFFFFFF
TRANSACTION_MASK = 0xC
TRANSACTION_PREPARED = 0x4
TRANSACTION_ROLLBACK = 0xC
DEFAULT_CQ_FILE_BYTES = 300_000 * CQ_ENTRY.size
MAX_EXAMPLES = 20

ENTRY_SCHEMA = "topic string, queueId int, queueOffset bigint, offset bigint, size int, tagsCode bigint"
LOG_COLUMNS = (
    "topic string, queueId int, queueOffset bigint, commitLogOffset bigint, storeSize int, "
    "tagsCode bigint, sysFlag int"
)


def cq_files(store_dir: str | Path) -> list[tuple[str, int, str]]:
    """(topic, queueId, path) of every ConsumeQueue file of a store."""
    root = Path(store_dir) / "consumequeue"
    if not root.is_dir():
        return []
    out = []
    for topic_dir in sorted(root.iterdir()):
        if not topic_dir.is_dir():
            continue
        for queue_dir in sorted(topic_dir.iterdir()):
            if not (queue_dir.is_dir() and queue_dir.name.isdigit()):
                continue
            for f in sorted(queue_dir.iterdir()):
                if len(f.name) == 20 and f.name.isdigit():
                    out.append((topic_dir.name, int(queue_dir.name), str(f)))
    return out


def read_cq_file(topic: str, queue_id: int, path: str) -> Iterator[tuple[str, int, int, int, int, int]]:
    """The valid entries of one ConsumeQueue file as (topic, queueId, queueOffset, offset,
    size, tagsCode)."""
    entries = np.fromfile(path, dtype=CQ_DTYPE)
    ends = np.flatnonzero(entries["size"] <= 0)
    entries = entries[: ends[0]] if ends.size else entries
    first = int(os.path.basename(path)) // CQ_ENTRY.size
    keep = np.flatnonzero(entries["size"] != PRE_BLANK_SIZE)
    offsets = entries["offset"][keep].tolist()
    sizes = entries["size"][keep].tolist()
    codes = entries["tags_code"][keep].tolist()
    for i, off, size, code in zip(keep.tolist(), offsets, sizes, codes, strict=True):
        yield topic, queue_id, first + i, off, size, code


def _read_files(files: Iterable[tuple[str, int, str]]) -> Iterator[tuple[str, int, int, int, int, int]]:
    for topic, queue_id, path in files:
        yield from read_cq_file(topic, queue_id, path)


def on_disk_entries(spark: SparkSession, store_dir: str) -> DataFrame:
    """The broker's ConsumeQueue entries, read in parallel (one task per few files)."""
    files = cq_files(store_dir)
    if not files:
        return spark.createDataFrame([], ENTRY_SCHEMA)
    sc = spark.sparkContext
    rdd = sc.parallelize(files, max(1, min(len(files), sc.defaultParallelism * 4)))
    return spark.createDataFrame(rdd.mapPartitions(_read_files), ENTRY_SCHEMA)


def rebuilt_entries(spark: SparkSession, store_dir: str) -> DataFrame:
    """ConsumeQueue entries derived from the CommitLog, as the dispatcher would write them."""
    from pyspark.sql import functions as F

    log = spark.read.format("replog").schema(LOG_COLUMNS).load(store_dir)
    tx = F.col("sysFlag").bitwiseAND(TRANSACTION_MASK)
    return log.where((tx != TRANSACTION_PREPARED) & (tx != TRANSACTION_ROLLBACK)).select(
        "topic", "queueId", "queueOffset",
        F.col("commitLogOffset").alias("offset"), F.col("storeSize").alias("size"), "tagsCode",
    )


def compare(rebuilt: DataFrame, disk: DataFrame, log_start: int) -> DataFrame:
    """One row per queue offset that is not a plain match, with its ``kind``."""
    from pyspark.sql import functions as F

    first_on_disk = disk.groupBy("topic", "queueId").agg(F.min("queueOffset").alias("firstKept"))
    r = rebuilt.alias("r")
    d = disk.alias("d")
    keys = ["topic", "queueId", "queueOffset"]
    joined = r.join(d, keys, "full_outer").join(first_on_disk, ["topic", "queueId"], "left")
    same_tags = (F.col("topic") == SCHEDULE_TOPIC) | (F.col("r.tagsCode") == F.col("d.tagsCode"))
    kind = (
        F.when(F.col("r.offset").isNull() & (F.col("d.offset") < log_start), "below_log_start")
        .when(F.col("r.offset").isNull(), "missing_in_commitlog")
        .when(F.col("d.offset").isNull() & (F.col("queueOffset") < F.col("firstKept")), "trimmed")
        .when(F.col("d.offset").isNull(), "missing_in_consumequeue")
        .when((F.col("r.offset") != F.col("d.offset")) | (F.col("r.size") != F.col("d.size"))
              | ~same_tags, "differs")
        .otherwise("match")
    )
    return joined.select(
        *keys, kind.alias("kind"),
        F.col("r.offset").alias("logOffset"), F.col("d.offset").alias("cqOffset"),
        F.col("r.size").alias("logSize"), F.col("d.size").alias("cqSize"),
        F.col("r.tagsCode").alias("logTagsCode"), F.col("d.tagsCode").alias("cqTagsCode"),
    )


def run_reindex(spark: SparkSession, store_dir: str, write_dir: str | None = None,
                cq_file_bytes: int = DEFAULT_CQ_FILE_BYTES) -> dict[str, Any]:
    """Rebuild, compare, optionally write the rebuilt files under ``write_dir``; a report."""
    from .layout import list_segments

    segments = list_segments(store_dir)
    log_start = segments[0].base if segments else 0
    rebuilt = rebuilt_entries(spark, store_dir).cache()
    try:
        result = compare(rebuilt, on_disk_entries(spark, store_dir), log_start).cache()
        counts = {r["kind"]: r["count"] for r in result.groupBy("kind").count().collect()}
        bad = result.where(~result.kind.isin("match", "trimmed", "below_log_start"))
        examples = [r.asDict() for r in bad.orderBy("topic", "queueId", "queueOffset")
                    .limit(MAX_EXAMPLES).collect()]
        queues = rebuilt.select("topic", "queueId").distinct().count()
        if write_dir:
            write_consume_queues(rebuilt, write_dir, cq_file_bytes)
        total = rebuilt.count()
    finally:
        rebuilt.unpersist()
    mismatches = sum(v for k, v in counts.items() if k not in ("match", "trimmed", "below_log_start"))
    return {
        "storeDir": store_dir,
        "queues": queues,
        "entriesRebuilt": total,
        "byKind": dict(sorted(counts.items())),
        "mismatches": mismatches,
        "consistent": mismatches == 0,
        "examples": examples,
        "writtenTo": write_dir,
    }


def write_consume_queues(entries: DataFrame, out_dir: str, cq_file_bytes: int) -> None:
    """Write entries as ConsumeQueue files under ``out_dir/consumequeue`` (one task per queue)."""
    ordered = entries.repartition("topic", "queueId").sortWithinPartitions(
        "topic", "queueId", "queueOffset")
    ordered.foreachPartition(lambda rows: _write_rows(rows, out_dir, cq_file_bytes))


def _write_rows(rows: Iterable[Any], out_dir: str, cq_file_bytes: int) -> None:
    handles: dict[str, Any] = {}
    try:
        for row in rows:
            qdir = Path(out_dir) / "consumequeue" / row["topic"] / str(row["queueId"])
            byte_pos = row["queueOffset"] * CQ_ENTRY.size
            start = byte_pos - byte_pos % cq_file_bytes
            path = str(qdir / f"{start:020d}")
            f = handles.get(path)
            if f is None:
                qdir.mkdir(parents=True, exist_ok=True)
                f = open(path, "w+b")  # noqa: SIM115 (closed in finally)
                f.truncate(cq_file_bytes)
                handles[path] = f
            f.seek(byte_pos - start)
            f.write(CQ_ENTRY.pack(row["offset"], row["size"], row["tagsCode"]))
    finally:
        for f in handles.values():
            f.close()


def format_report(report: dict[str, Any]) -> str:
    lines = [
        (f"store {report['storeDir']}: {report['entriesRebuilt']} entries rebuilt over "
         f"{report['queues']} queues"),
        "by kind: " + ", ".join(f"{k}={v}" for k, v in report["byKind"].items()),
        (f"verdict {'CONSISTENT' if report['consistent'] else 'MISMATCHES'}"
         f" ({report['mismatches']} mismatching entries)"),
    ]
    for e in report["examples"]:
        lines.append(
            f"  {e['topic']}/{e['queueId']}@{e['queueOffset']}: {e['kind']} "
            f"log=({e['logOffset']},{e['logSize']},{e['logTagsCode']}) "
            f"cq=({e['cqOffset']},{e['cqSize']},{e['cqTagsCode']})"
        )
    if report["writtenTo"]:
        lines.append(f"rebuilt ConsumeQueue files written under {report['writtenTo']}")
    return "\n".join(lines)
