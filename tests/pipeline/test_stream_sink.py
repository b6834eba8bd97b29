"""The streaming source and the sink against a real broker process."""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from broker_harness import BrokerProcess, brokers

from common.client import Admin, Consumer, Producer
from common.core.errors import PullStatus, SendStatus
from common.core.message import MessageExt
from common.pipeline.stream import group_status, safe_end

pytestmark = [pytest.mark.spark, pytest.mark.integration]

SETTLE_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("broker"), flushDiskType="SYNC_FLUSH",
                      maxMessageSize=64 * 1024, mappedFileSizeCommitLog=256 * 1024,
                      defaultTopicQueueNums=4)
    with brokers(b):
        yield b


def settled(servers: str) -> int:
    """Wait (bounded) until everything appended is flushed, dispatched and acknowledged by the
    in-sync slaves; the safe end."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        status = group_status(tuple(servers.split(",")), 3000)
        end = safe_end(status)
        if end == int(status["maxPhyOffset"]):
            return end
        assert time.monotonic() < deadline, f"broker did not settle: {status}"
        time.sleep(0.02)


def produce(servers: str, topic: str, start: int, count: int) -> dict[int, bytes]:
    """``count`` messages in batches spread over the queues: CommitLog offset -> body."""
    sent = {}
    with Producer(servers.split(",")) as p:
        for first in range(start, start + count, 25):
            bodies = [f"{topic}-{i}".encode() for i in range(first, min(first + 25, start + count))]
            for body, r in zip(bodies, p.send_batch(topic, bodies, queue_id=first % 4), strict=True):
                assert r.status == SendStatus.SEND_OK
                sent[r.commit_log_offset] = body
    return sent


def run_available_now(spark, servers: str, out: Path, checkpoint: Path,
                      topics: str = "s1,s2") -> list[dict]:
    """One availableNow run of the stream into Parquet; the progress of each micro-batch."""
    stream = (spark.readStream.format("replog").option("servers", servers)
              .option("topics", topics).option("maxBytesPerTrigger", 8 * 1024)
              .schema("topic string, commitLogOffset bigint, queueId int, bodyBytes binary").load())
    query = (stream.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
    finally:
        query.stop()
    assert query.exception() is None
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def test_stream_delivers_each_record_once_across_a_restart(spark, broker, tmp_path) -> None:
    servers = broker.address
    sent = produce(servers, "s1", 0, 150) | produce(servers, "s2", 0, 150)
    settled(servers)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    first = run_available_now(spark, servers, out, checkpoint)
    assert len(first) > 1  # maxBytesPerTrigger cut the backlog into several micro-batches
    assert spark.read.parquet(str(out)).count() == 300

    sent |= produce(servers, "s1", 150, 100) | produce(servers, "s2", 150, 100)
    settled(servers)
    second = run_available_now(spark, servers, out, checkpoint)  # restart from the checkpoint
    assert sum(p["numInputRows"] for p in second) == 200
    rows = spark.read.parquet(str(out)).collect()
    assert len(rows) == 500
    assert {r.commitLogOffset: bytes(r.bodyBytes) for r in rows} == sent


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_stream_starts_at_a_timestamp(spark, broker, tmp_path) -> None:
    servers = broker.address
    produce(servers, "ts1", 0, 100)
    produce(servers, "ts2", 0, 50)
    # every record stored so far is older than `cut`, every later one not (the broker and this
    # test read one clock: a wait on the clock, not a sleep)
    cut = _now_ms() + 1
    while _now_ms() <= cut:
        time.sleep(0.001)
    later = produce(servers, "ts2", 50, 40) | produce(servers, "ts1", 100, 60)
    settled(servers)
    stream = (spark.readStream.format("replog").option("servers", servers)
              .option("topics", "ts1,ts2").option("startingTimestamp", str(cut))
              .schema("commitLogOffset bigint, bodyBytes binary").load())
    query = (stream.writeStream.format("memory").queryName("from_cut")
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
    finally:
        query.stop()
    assert query.exception() is None
    rows = spark.sql("select * from from_cut").collect()
    assert {r.commitLogOffset: bytes(r.bodyBytes) for r in rows} == later


def test_stream_options_are_checked() -> None:
    from common.pipeline.stream import StreamOptions

    base = {"servers": "127.0.0.1:1", "topics": "t"}
    assert StreamOptions.parse({**base, "startingTimestamp": "1700000000000"}).starting_ts == (
        1700000000000
    )
    for bad, match in (
        ({"startingTimestamp": "2026-11-22"}, "ms since the epoch"),
        ({"startingTimestamp": "5", "startingOffset": "earliest"}, "not both"),
        ({"startingOffset": "soon"}, "earliest, latest or an offset"),
    ):
        with pytest.raises(ValueError, match=match):
            StreamOptions.parse({**base, **bad})


def pull_all(broker: BrokerProcess, topic: str) -> list[MessageExt]:
    msgs = []
    with Consumer([broker.address]) as c:
        for q in range(4):
            offset = 0
            while True:
                r = c.pull(topic, q, offset, 256)
                if r.status != PullStatus.FOUND:
                    break
                msgs += r.messages
                offset = r.next_begin_offset
    return msgs


def test_sink_sends_rows_in_order_per_partition(spark, broker) -> None:
    from pyspark.sql import functions as F

    df = spark.range(0, 400, numPartitions=4).select(
        F.concat_ws(":", F.spark_partition_id(), F.col("id")).alias("body"),
        F.concat(F.lit("k"), F.col("id")).alias("keys"),
    )
    (df.write.format("replog").option("servers", broker.address).option("topic", "sunk")
     .option("batchSize", 16).mode("append").save())
    by_partition: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for m in pull_all(broker, "sunk"):
        part, row_id = map(int, m.body.decode().split(":"))
        assert m.keys == f"k{row_id}"
        by_partition[part].append((m.commit_log_offset, row_id, m.queue_id))
    assert sorted(i for rows in by_partition.values() for _, i, _ in rows) == list(range(400))
    assert len(by_partition) == 4
    for part, rows in by_partition.items():
        rows.sort()
        assert [i for _, i, _ in rows] == sorted(i for _, i, _ in rows)  # sent in row order
        assert {q for _, _, q in rows} == {part % 4}  # one queue per partition


def test_sink_fails_the_task_on_a_refused_send(spark, broker) -> None:
    """100 000 bytes are over the broker's maxMessageSize (64 KiB) as they are, not deflated:
    refused with compression off, stored compressed (and read back whole) with the default."""
    from pyspark.sql import functions as F

    df = spark.range(1).select(F.expr("repeat('x', 100000)").alias("body"))
    with pytest.raises(Exception, match="MESSAGE_ILLEGAL"):
        (df.write.format("replog").option("servers", broker.address).option("topic", "big")
         .option("compressOverBytes", "0").mode("append").save())
    df.write.format("replog").option("servers", broker.address).option("topic", "big").mode(
        "append").save()
    with Consumer([broker.address]) as c:
        found = [m for q in range(4) for m in c.pull("big", q, 0, 8).messages]
    assert [m.body for m in found] == [b"x" * 100000] and found[0].sys_flag & 1


def test_a_transactional_sink_delivers_each_partition_whole_or_not_at_all(spark, broker) -> None:
    """``transactional``: a task sends its rows as half messages and commits them at its end.
    The task of partition 1 fails after 5 of its rows were stored as halves (its UDF raises,
    and Spark ends the task's Python writer): none of its rows is ever consumed, as no one
    commits them; partition 0's task committed all of its rows."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    address = broker.address

    def body(i: int) -> str:
        if i == 25:  # partition 1 (local[2]: beside partition 0, whose end it waits for, so
            # that the job's failure cancels no task of partition 0 on its way)
            deadline = time.monotonic() + 30
            with Consumer([address]) as c:
                while time.monotonic() < deadline and sum(
                        len(c.pull("txsunk", q, 0, 64).messages) for q in range(4)) < 20:
                    time.sleep(0.05)
            raise RuntimeError("the task fails after five halves")
        return str(i)

    df = spark.range(0, 40, numPartitions=2).select(
        F.udf(body, StringType(), useArrow=False)(F.col("id")).alias("body"))
    with pytest.raises(Exception, match="five halves"):
        (df.write.format("replog").option("servers", broker.address).option("topic", "txsunk")
         .option("transactional", "true").mode("append").save())
    got = sorted(int(m.body) for m in pull_all(broker, "txsunk"))
    assert got == list(range(20))  # partition 0, whole; partition 1: nothing
    with Admin([broker.address]) as admin:  # partition 0's twenty, partition 1's none
        assert admin.status(broker.address)["transactions"]["commits"] == 20
    ok = spark.range(40, 60, numPartitions=2).select(F.col("id").cast("string").alias("body"))
    (ok.write.format("replog").option("servers", broker.address).option("topic", "txsunk")
     .option("transactional", "true").mode("append").save())
    got = sorted(int(m.body) for m in pull_all(broker, "txsunk"))
    assert got == list(range(20)) + list(range(40, 60))
    assert all(m.sys_flag & 0xC == 0x8 for m in pull_all(broker, "txsunk"))  # commits


def test_stream_to_stream_copies_a_topic(spark, broker, tmp_path) -> None:
    """Bodies that are not UTF-8 read as a null body; the sink takes their bodyBase64."""
    sent = produce(broker.address, "src", 0, 120)
    with Producer([broker.address]) as p:
        for body in (b"\xff\xfe\x00binary", bytes(range(256))):
            sent[p.send("src", body).commit_log_offset] = body
    settled(broker.address)
    stream = (spark.readStream.format("replog").option("servers", broker.address)
              .option("topics", "src").load().select("body", "bodyBase64", "tags", "keys"))
    query = (stream.writeStream.format("replog").option("servers", broker.address)
             .option("topic", "dst").option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
    finally:
        query.stop()
    assert query.exception() is None
    assert sorted(m.body for m in pull_all(broker, "dst")) == sorted(sent.values())


def wait_in_sync(master: BrokerProcess) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while not any(s.get("inSync") for s in master.status().get("slaves") or []):
        assert time.monotonic() < deadline, f"slave never in sync: {master.status()}"
        time.sleep(0.05)


def test_stream_follows_the_group_across_a_failover(spark, tmp_path) -> None:
    sizes = {"flushDiskType": "SYNC_FLUSH", "mappedFileSizeCommitLog": 256 * 1024,
             "defaultTopicQueueNums": 4}
    master = BrokerProcess(tmp_path / "m", brokerRole="SYNC_MASTER", **sizes)
    slave = BrokerProcess(tmp_path / "s", brokerRole="SLAVE", brokerId=1,
                          haMasterAddress=f"127.0.0.1:{master.port + 1}", **sizes)
    with brokers(master, slave):
        servers = f"{master.address},{slave.address}"
        wait_in_sync(master)
        sent = produce(servers, "f", 0, 150)
        settled(servers)
        out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
        run_available_now(spark, servers, out, checkpoint, topics="f")
        master.close()  # SIGKILL: the slave holds every acknowledged record
        with Admin([slave.address]) as admin:
            admin.promote(slave.address, role="ASYNC_MASTER")
        sent |= produce(servers, "f", 150, 100)
        settled(servers)
        run_available_now(spark, servers, out, checkpoint, topics="f")
    rows = spark.read.parquet(str(out)).collect()
    assert len(rows) == 250
    assert {r.commitLogOffset: bytes(r.bodyBytes) for r in rows} == sent
