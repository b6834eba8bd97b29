"""The streaming source and the sink against a broker with CURVE and the ACL on: options
``key`` and ``serverKey`` (docs/security.md), and what the ACL refuses fails the query."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from broker_harness import BrokerProcess, brokers
from security_harness import Realm

from common.client import Producer
from common.core.errors import SendStatus
from common.pipeline.stream import StreamOptions, group_status, safe_end

pytestmark = [pytest.mark.spark, pytest.mark.integration]


@pytest.fixture(scope="module")
def realm(tmp_path_factory: pytest.TempPathFactory) -> Realm:
    r = Realm(tmp_path_factory.mktemp("realm"), ["reader", "writer", "outsider"])
    r.write_acl([
        r.account("admin", admin=True),
        r.account("writer", topicPerms=["sunk=PUB", "s1=PUB"]),
        # the stream source pulls as the group DEFAULT_CONSUMER
        r.account("reader", topicPerms=["s1=SUB", "sunk=SUB"], groupPerms=["DEFAULT_CONSUMER=SUB"]),
        r.account("outsider", defaultTopicPerm="SUB"),  # no group: pulls are refused
    ])
    return r


@pytest.fixture(scope="module")
def broker(realm: Realm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("secure-broker"), client_curve=realm.curve("admin"),
                      flushDiskType="SYNC_FLUSH", mappedFileSizeCommitLog=256 * 1024,
                      defaultTopicQueueNums=4, **realm.broker_fields())
    with brokers(b):
        yield b


def stream(spark, broker: BrokerProcess, realm: Realm, who: str, name: str):  # type: ignore[no-untyped-def]
    curve = realm.curve(who)
    df = (spark.readStream.format("replog").option("servers", broker.address)
          .option("topics", "s1").option("key", curve["key"])
          .option("serverKey", curve["server_key"])
          .schema("commitLogOffset bigint, bodyBytes binary").load())
    return df.writeStream.format("memory").queryName(name).trigger(availableNow=True).start()


def test_the_stream_source_reads_with_its_key(spark, broker, realm) -> None:
    sent = {}
    with Producer([broker.address], **realm.curve("writer")) as p:
        for i in range(120):
            r = p.send("s1", f"secure-{i}".encode(), queue_id=i % 4)
            assert r.status == SendStatus.SEND_OK
            sent[r.commit_log_offset] = f"secure-{i}".encode()
    curve = realm.curve("reader")
    servers = (broker.address,)
    status = group_status(servers, 3000, curve)
    assert safe_end(status) <= status["maxPhyOffset"]
    query = stream(spark, broker, realm, "reader", "secure_s1")
    try:
        query.awaitTermination(120)
    finally:
        query.stop()
    assert query.exception() is None
    rows = spark.sql("select * from secure_s1").collect()
    assert {r.commitLogOffset: bytes(r.bodyBytes) for r in rows} == sent


def test_the_stream_fails_for_an_account_the_acl_refuses(spark, broker, realm) -> None:
    with Producer([broker.address], **realm.curve("writer")) as p:
        assert p.send("s1", b"for nobody", queue_id=0).status == SendStatus.SEND_OK
    query = stream(spark, broker, realm, "outsider", "refused_s1")
    try:
        with pytest.raises(Exception, match="NO_PERMISSION: outsider has no permission to SUB "
                                            "Group:DEFAULT_CONSUMER"):
            query.awaitTermination(120)
    finally:
        query.stop()


def test_the_sink_writes_with_its_key(spark, broker, realm) -> None:
    from common.client import Consumer

    curve = realm.curve("writer")
    df = spark.range(0, 40, numPartitions=2).selectExpr("cast(id as string) as body")
    (df.write.format("replog").option("servers", broker.address).option("topic", "sunk")
     .option("key", curve["key"]).option("serverKey", curve["server_key"])
     .mode("append").save())
    with Consumer([broker.address], **realm.curve("reader")) as c:
        bodies = [m.body for q in range(4) for m in c.pull("sunk", q, 0, 64).messages]
    assert sorted(int(b) for b in bodies) == list(range(40))


def test_curve_options_come_in_pairs() -> None:
    base = {"servers": "127.0.0.1:1", "topics": "t"}
    with pytest.raises(ValueError, match="serverKey"):
        StreamOptions.parse({**base, "key": "/k.key_secret"})
    opts = StreamOptions.parse({**base, "key": "/k.key_secret", "serverKey": "/b.key"})
    assert opts.curve() == {"key": "/k.key_secret", "server_key": "/b.key"}
