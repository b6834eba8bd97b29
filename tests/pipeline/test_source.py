"""``spark.read.format("replog")`` against the store's own record-by-record reader."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from reference import expected_rows, normalise

from common.format import record
from common.pipeline import register
from common.pipeline.layout import list_segments

pytestmark = pytest.mark.spark


def rows_of(df) -> list[dict[str, object]]:
    return [normalise(r.asDict(recursive=True)) for r in df.orderBy("commitLogOffset").collect()]


@pytest.fixture(scope="module")
def expected(store) -> list[dict[str, object]]:
    return expected_rows(store.root)


def test_every_record_every_field_one_partition_per_segment(spark, store, expected) -> None:
    df = spark.read.format("replog").load(store.path)
    end = expected[-1]["commitLogOffset"] + expected[-1]["storeSize"]
    holding = [s for s in list_segments(store.root) if s.base < end]
    assert df.rdd.getNumPartitions() == len(holding) >= 5
    assert rows_of(df) == expected


def test_segments_split_at_record_boundaries(spark, store, expected) -> None:
    df = (spark.read.format("replog").option("maxPartitionBytes", 16 * 1024)
          .schema("commitLogOffset bigint, storeSize int").load(store.path))
    assert df.rdd.getNumPartitions() > 3 * len(list_segments(store.root))
    got = [(r.commitLogOffset, r.storeSize) for r in df.orderBy("commitLogOffset").collect()]
    assert got == [(e["commitLogOffset"], e["storeSize"]) for e in expected]


def test_topic_and_queue_filters_are_pushed_down(spark, store, expected) -> None:
    """Asked for with the option (the discovered format's default is off, see the next test)."""
    df = spark.read.format("replog").option("pushFilters", "true").load(store.path)
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
    df = spark.read.format("replog").schema("keys string, commitLogOffset bigint, bodyBytes binary")
    rows = df.load(store.path).orderBy("commitLogOffset").collect()
    assert [tuple(r) for r in rows] == [
        (e["keys"], e["commitLogOffset"], e["bodyBytes"]) for e in expected]
    with pytest.raises(Exception, match="no column 'nope'"):
        spark.read.format("replog").schema("nope int").load(store.path).collect()
    with pytest.raises(Exception, match="column 'body' is string, not binary; the raw bytes"):
        spark.read.format("replog").schema("body binary").load(store.path).collect()


def test_body_is_utf8_text_or_null_beside_its_base64(spark, store, expected) -> None:
    """docs/contract.md §3 and §7: the DataFrame's body is the message JSON's body."""
    df = spark.read.format("replog").schema(
        "commitLogOffset bigint, body string, bodyBase64 string").load(store.path)
    rows = [tuple(r) for r in df.orderBy("commitLogOffset").collect()]
    assert rows == [(e["commitLogOffset"], e["body"], e["bodyBase64"]) for e in expected]
    texts = [e["body"] for e in expected]
    assert any(t is None for t in texts) and any(t and not t.isascii() for t in texts)


def flip_byte(root: Path, phy_offset: int) -> None:
    seg = next(s for s in list_segments(root) if s.base <= phy_offset < s.end)
    with open(seg.path, "r+b") as f:
        f.seek(phy_offset - seg.base)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x40]))


@pytest.mark.parametrize(("where", "why"), [
    (record.HEADER.size, "body CRC"),  # first body byte
    (record.POS_STORE_TIMESTAMP + 7, "whole-record CRC"),  # a header field
])
def test_verify_crc_fails_the_read_on_a_damaged_record(spark, store, expected, tmp_path,
                                                       where, why) -> None:
    copy = store.copy(tmp_path / "damaged")
    victim = next(e for e in expected[700:] if e["bodyBytes"])
    flip_byte(copy.root, victim["commitLogOffset"] + where)
    df = spark.read.format("replog").schema("commitLogOffset bigint").load(copy.path)
    assert df.count() == len(expected)
    with pytest.raises(Exception, match=f"corrupt record at offset {victim['commitLogOffset']}"
                                        f".*{why}"):
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


def test_a_stock_session_reads_without_the_pushdown_conf(spark, store) -> None:
    """Spark refuses a reader with pushFilters while its conf is off (the default): the format
    Spark discovers reads there, filtering in Spark; register() brings pushdown back."""
    from common.pipeline import PUSHDOWN_CONF
    from common.pipeline.source import ReplogDataSource

    spark.conf.set(PUSHDOWN_CONF, "false")
    try:
        spark.dataSource.register(ReplogDataSource)
        df = spark.read.format("replog").load(store.path)
        assert df.count() == len(store.written)
        topic = store.written[0].topic
        expected = sum(1 for m in store.written if m.topic == topic)
        assert df.where(f"topic = '{topic}'").count() == expected
    finally:
        register(spark)
    assert spark.conf.get(PUSHDOWN_CONF) == "true"
    assert spark.read.format("replog").load(store.path).count() == len(store.written)


def test_explicit_registration_and_empty_results(spark, store) -> None:
    register(spark)
    df = spark.read.format("replog").option("topics", "no-such-topic").load(store.path)
    assert df.count() == 0
    assert spark.read.format("replog").load(store.path).where("topic = 'x'").count() == 0


def test_reading_a_live_store_sees_a_whole_prefix(spark, tmp_path) -> None:
    """A store being written to while Spark reads it: the read gets a prefix of whole, valid
    records ending at the checkpoint's flushed offset, never a torn one."""
    import threading
    import time

    from common.core.config import load_config
    from common.core.message import Message
    from common.store.checkpoint import read_checkpoint
    from common.store.message_store import MessageStore

    cfg = load_config(None, (), env={}, storePathRootDir=str(tmp_path / "live"),
                      mappedFileSizeCommitLog=64 * 1024, flushIntervalConsumeQueue=50)
    live = MessageStore(cfg)
    live.start()
    stop = threading.Event()

    def keep_writing() -> None:
        i = 0
        while not stop.wait(0.0005):  # paced: the store grows while Spark plans and reads
            live.put(Message("live", f"m{i}".encode() * 20, tags="T"), i % 2)
            i += 1

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        deadline = time.monotonic() + 30
        while read_checkpoint(cfg.store_root).get("physicFlushedOffset", 0) < 100_000:
            assert time.monotonic() < deadline, "the live store never checkpointed 100 kB"
            time.sleep(0.02)
        rows = (spark.read.format("replog").option("verifyCrc", "true")
                .schema("commitLogOffset bigint, storeSize int, bodyBytes binary")
                .load(str(cfg.store_root)).orderBy("commitLogOffset").collect())
        flushed_after = read_checkpoint(cfg.store_root)["physicFlushedOffset"]
    finally:
        stop.set()
        writer.join(10)
        live.shutdown()
    assert rows[0].commitLogOffset == 0
    ends = [r.commitLogOffset + r.storeSize for r in rows]
    segment = 64 * 1024
    for row, prev_end in zip(rows[1:], ends, strict=False):  # contiguous, BLANK tails skipped
        assert row.commitLogOffset == prev_end or (
            row.commitLogOffset % segment == 0 and row.commitLogOffset - prev_end < segment)
    assert 100_000 <= ends[-1] <= flushed_after
    assert all(bytes(r.bodyBytes).startswith(b"m") for r in rows)
