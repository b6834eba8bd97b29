"""``spark.read.format("replog")`` against the store's own record-by-record reader."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from reference import expected_rows, normalise

from common.pipeline import register
from common.pipeline.layout import list_segments
from common.store import record

pytestmark = pytest.mark.spark


def rows_of(df) -> list[dict[str, object]]:
    return [normalise(r.asDict(recursive=True)) for r in df.orderBy("commitLogOffset").collect()]


@pytest.fixture(scope="module")
def expected(store) -> list[dict[str, object]]:
    return expected_rows(store.root)


def test_every_record_every_field_one_partition_per_segment(spark, store, expected) -> None:
    df = spark.read.format("replog").load(store.path)
    assert df.rdd.getNumPartitions() == len(list_segments(store.root)) >= 5
    assert rows_of(df) == expected


def test_segments_split_at_record_boundaries(spark, store, expected) -> None:
    df = (spark.read.format("replog").option("maxPartitionBytes", 16 * 1024)
          .schema("commitLogOffset bigint, storeSize int").load(store.path))
    assert df.rdd.getNumPartitions() > 3 * len(list_segments(store.root))
    got = [(r.commitLogOffset, r.storeSize) for r in df.orderBy("commitLogOffset").collect()]
    assert got == [(e["commitLogOffset"], e["storeSize"]) for e in expected]


def test_topic_and_queue_filters_are_pushed_down(spark, store, expected) -> None:
    df = spark.read.format("replog").load(store.path)
    query = df.where("topic = 'orders' and queueId in (1, 3)")
    plan = query._jdf.queryExecution().executedPlan().toString()
    assert "Filter isnotnull(topic" in plan  # what Spark keeps; the rest went to the reader
    assert "= orders" not in plan and " IN (" not in plan
    want = [e for e in expected if e["topic"] == "orders" and e["queueId"] in (1, 3)]
    assert rows_of(query) == want and want
    both = df.where(df.topic.isin("audit", "clicks")).select("commitLogOffset")
    assert sorted(r[0] for r in both.collect()) == [
        e["commitLogOffset"] for e in expected if e["topic"] != "orders"]


def test_offset_filters_and_options(spark, store, expected) -> None:
    lo, hi = expected[100]["commitLogOffset"], expected[900]["commitLogOffset"]
    df = spark.read.format("replog").schema("commitLogOffset bigint").load(store.path)
    got = [r[0] for r in df.where(f"commitLogOffset >= {lo} and commitLogOffset < {hi}")
           .orderBy("commitLogOffset").collect()]
    assert got == [e["commitLogOffset"] for e in expected[100:900]]
    # Options: a start in the middle of a record keeps the records starting after it.
    opt = (spark.read.format("replog").option("startOffset", lo + 1).option("endOffset", hi)
           .option("topics", "audit, clicks").schema("commitLogOffset bigint").load(store.path))
    got = sorted(r[0] for r in opt.collect())
    assert got == [e["commitLogOffset"] for e in expected[101:900] if e["topic"] != "orders"]


def test_a_user_schema_selects_and_orders_columns(spark, store, expected) -> None:
    df = spark.read.format("replog").schema("keys string, commitLogOffset bigint, body binary")
    rows = df.load(store.path).orderBy("commitLogOffset").collect()
    assert [tuple(r) for r in rows] == [
        (e["keys"], e["commitLogOffset"], e["body"]) for e in expected]
    with pytest.raises(Exception, match="no column 'nope'"):
        spark.read.format("replog").schema("nope int").load(store.path).collect()


def flip_body_byte(root: Path, phy_offset: int) -> None:
    seg = next(s for s in list_segments(root) if s.base <= phy_offset < s.end)
    with open(seg.path, "r+b") as f:
        f.seek(phy_offset - seg.base + record.HEADER.size)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x40]))


def test_verify_crc_fails_the_read_on_a_damaged_body(spark, store, expected, tmp_path) -> None:
    copy = store.copy(tmp_path / "damaged")
    victim = next(e for e in expected[700:] if e["body"])
    flip_body_byte(copy.root, victim["commitLogOffset"])
    df = spark.read.format("replog").schema("commitLogOffset bigint").load(copy.path)
    assert df.count() == len(expected)
    with pytest.raises(Exception, match=f"corrupt record at offset {victim['commitLogOffset']}"):
        spark.read.format("replog").option("verifyCrc", "true").load(copy.path).count()


def test_a_live_store_is_read_up_to_its_flushed_offset(spark, store, expected, tmp_path) -> None:
    copy = store.copy(tmp_path / "live")
    flushed = expected[1000]["commitLogOffset"]
    (copy.root / "checkpoint").write_bytes(struct.pack(">qqqqq", 0, 0, 0, flushed, 0).ljust(4096, b"\0"))
    df = spark.read.format("replog").schema("commitLogOffset bigint").load(copy.path)
    assert sorted(r[0] for r in df.collect()) == [e["commitLogOffset"] for e in expected[:1000]]


DISCOVER = """
import io
from pyspark.serializers import read_int
from pyspark.sql.worker.lookup_data_sources import _main
out = io.BytesIO()
_main(io.BytesIO(), out)
out.seek(0)
for _ in range(read_int(out)):
    print(out.read(read_int(out)).decode())
    out.read(read_int(out))
"""


def test_spark_discovers_the_format_without_registration(tmp_path) -> None:
    """Spark's own look-up (run by its Python workers) finds ``pyspark_replog``."""
    from common.pipeline.session import prepare_environment

    prepare_environment()  # the environment the JVM hands to its Python workers
    found = subprocess.run([sys.executable, "-c", DISCOVER], cwd=tmp_path, env=dict(os.environ),
                           capture_output=True, text=True, timeout=60, check=True)
    assert "replog" in found.stdout.split()


def test_explicit_registration_and_empty_results(spark, store) -> None:
    register(spark)
    df = spark.read.format("replog").option("topics", "no-such-topic").load(store.path)
    assert df.count() == 0
    assert spark.read.format("replog").load(store.path).where("topic = 'x'").count() == 0
