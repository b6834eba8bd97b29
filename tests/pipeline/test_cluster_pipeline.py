"""Spark over a cluster of two broker groups on a real ZooKeeper (issue 25): the stream keeps
one CommitLog offset per group and delivers every record once across a restart, the sink
spreads its tasks over every group's queues, the batch source reads every group's store and
matches what the clients read (count and checksums), and ``replog pipeline audit`` compares
the replicas of every group."""

from __future__ import annotations

import json
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from cluster_harness import Groups
from controller_harness import chroot, running_zookeeper

from common.cli.zookeeper import Ensemble
from common.client import Admin, Consumer, Producer
from common.core.errors import PullStatus, SendStatus
from common.pipeline.stream import decode_offsets, group_status, safe_end

pytestmark = [pytest.mark.spark, pytest.mark.integration]

GROUPS = ("broker-a", "broker-b")
SETTLE_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Groups, Ensemble]]:
    tmp = tmp_path_factory.mktemp("cluster")
    with running_zookeeper(tmp / "zk") as zk, \
            Groups(tmp, zk.hosts + chroot(), groups=2, size=2, flushDiskType="SYNC_FLUSH",
                   mappedFileSizeCommitLog=256 * 1024) as groups:
        for name in GROUPS:
            groups.wait_in_sync(name)
        with Admin(groups.servers, timeout_ms=10_000) as admin:
            for topic in ("s1", "s2", "sunk"):
                admin.create_topic(topic, 2)
        for topic in ("s1", "s2", "sunk"):
            groups.wait_route(topic, {"broker-a": 2, "broker-b": 2})
        yield groups, zk


def produce(servers: list[str], topic: str, start: int, count: int) -> dict[tuple[str, int], bytes]:
    """``count`` keyless messages (over both groups): (group, CommitLog offset) -> body."""
    sent = {}
    with Producer(servers, timeout_ms=10_000) as p:
        for first in range(start, start + count, 10):
            bodies = [f"{topic}-{i}".encode() for i in range(first, min(first + 10, start + count))]
            for body, r in zip(bodies, p.send_batch(topic, bodies), strict=True):
                assert r.status == SendStatus.SEND_OK
                sent[(r.broker_name, r.commit_log_offset)] = body
    assert {g for g, _ in sent} == set(GROUPS)
    return sent


def settled(groups: Groups) -> None:
    """Every group's master has flushed, dispatched and had acknowledged all it holds."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    for name in GROUPS:
        servers = tuple(p.address for p in groups.groups[name])
        while True:
            status = group_status(servers, 3000)
            if safe_end(status) == int(status["maxPhyOffset"]):
                break
            assert time.monotonic() < deadline, f"{name} did not settle: {status}"
            time.sleep(0.02)


def run_available_now(spark: Any, servers: list[str], out: Path, checkpoint: Path) -> list[dict]:
    stream = (spark.readStream.format("replog").option("servers", servers[0])
              .option("topics", "s1,s2").option("maxBytesPerTrigger", 4 * 1024)
              .schema("brokerName string, topic string, commitLogOffset bigint, queueId int, "
                      "bodyBytes binary").load())
    query = (stream.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        query.awaitTermination(180)
    finally:
        query.stop()
    assert query.exception() is None
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def test_the_stream_keeps_an_offset_per_group_and_delivers_once_across_a_restart(
        spark, cluster, tmp_path) -> None:
    groups, _ = cluster
    servers = groups.servers
    sent = produce(servers, "s1", 0, 100) | produce(servers, "s2", 0, 100)
    settled(groups)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    first = run_available_now(spark, servers, out, checkpoint)
    assert len(first) > 1  # maxBytesPerTrigger (shared by the groups) cut the backlog
    end = first[-1]["sources"][0]["endOffset"]
    offsets = decode_offsets(end if isinstance(end, dict) else json.loads(end), [])
    assert set(offsets) == set(GROUPS)  # one CommitLog offset per group
    sent |= produce(servers, "s1", 100, 60) | produce(servers, "s2", 100, 60)
    settled(groups)
    second = run_available_now(spark, servers, out, checkpoint)  # from the checkpoint
    assert sum(p["numInputRows"] for p in second) == 120
    rows = spark.read.parquet(str(out)).collect()
    got = [(r.brokerName, r.commitLogOffset) for r in rows]
    assert len(got) == len(set(got)) == 320  # each record once
    assert {(r.brokerName, r.commitLogOffset): bytes(r.bodyBytes) for r in rows} == sent


def test_the_sink_spreads_its_tasks_over_every_group(spark, cluster) -> None:
    from pyspark.sql import functions as F

    groups, _ = cluster
    servers = groups.servers
    df = spark.range(0, 400, numPartitions=4).select(
        F.concat_ws(":", F.spark_partition_id(), F.col("id")).alias("body"))
    (df.write.format("replog").option("servers", ",".join(servers)).option("topic", "sunk")
     .option("batchSize", 16).mode("append").save())
    by_partition: dict[int, set[tuple[str, int]]] = {}
    ids = []
    with Consumer(servers, timeout_ms=10_000) as c:
        for mq in c.queues("sunk"):
            for m in pull_all(c, "sunk", mq.queue_id, mq.broker_name):
                part, row_id = map(int, m.body.decode().split(":"))
                by_partition.setdefault(part, set()).add((m.broker_name, m.queue_id))
                ids.append(row_id)
    assert sorted(ids) == list(range(400))
    with Consumer(servers, timeout_ms=10_000) as c:
        queues = [(q.broker_name, q.queue_id) for q in c.queues("sunk")]
    for part, where in by_partition.items():
        assert where == {queues[part % len(queues)]}  # one queue per task, like a producer
    assert {g for where in by_partition.values() for g, _ in where} == set(GROUPS)


def pull_all(c: Consumer, topic: str, queue_id: int, broker_name: str) -> list[Any]:
    msgs, offset = [], 0
    while True:
        r = c.pull(topic, queue_id, offset, 256, broker_name=broker_name)
        if r.status != PullStatus.FOUND:
            return msgs
        msgs += r.messages
        offset = r.next_begin_offset


def test_batch_reads_match_the_clients_and_audit_compares_every_group(
        spark, cluster, tmp_path) -> None:
    """Runs last: stops the brokers cleanly (the stores flushed and checkpointed), then reads
    the cluster directory with Spark and audits every group's replicas."""
    from common.pipeline.jobs import build_parser, run_job

    groups, _ = cluster
    servers = groups.servers
    produce(servers, "s1", 1000, 50)
    settled(groups)
    clients: dict[tuple[str, str, int, int], int] = {}
    with Consumer(servers, timeout_ms=10_000) as c:
        for topic in ("s1", "s2", "sunk"):
            for mq in c.queues(topic):
                for m in pull_all(c, topic, mq.queue_id, mq.broker_name):
                    clients[(m.broker_name, topic, m.queue_id, m.queue_offset)] = \
                        zlib.crc32(m.body)
    for procs in groups.groups.values():
        for p in procs:
            assert p.terminate() == 0
    df = spark.read.format("replog").option("clusterDir", str(groups.tmp)).load()
    spark_rows = {(r.brokerName, r.topic, r.queueId, r.queueOffset): zlib.crc32(bytes(r.bodyBytes))
                  for r in df.select("brokerName", "topic", "queueId", "queueOffset",
                                     "bodyBytes").collect()}
    assert df.count() == len(clients) == len(spark_rows)
    assert spark_rows == clients  # the same messages, byte for byte (checksums)
    args = build_parser().parse_args(["audit", "--cluster-dir", str(groups.tmp),
                                      "--require-identical"])
    assert run_job(spark, args) == 0
