"""Real broker processes: CLI (--json) and client round trips, batch, long polling, restarts."""

from __future__ import annotations

import base64
import concurrent.futures
import datetime
import time
from pathlib import Path

import pytest
from broker_harness import BrokerProcess, brokers, run_cli
from replication_harness import wait_for
from time_bounds import tier

from common.client import Admin, Consumer, Producer
from common.core.errors import BrokerError, PullStatus, ResponseCode, SendStatus
from common.core.message import Message

pytestmark = pytest.mark.integration

SUSPEND_MS = 20_000  # the long poll's suspend: an answer by the arrival comes well before it


@pytest.mark.timeout(120)
def test_cli_send_pull_query_status(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "b", defaultTopicQueueNums=2)
    with brokers(b):
        s = ["-s", b.address]
        rc, sent = run_cli(
            "send",
            *s,
            "-t",
            "orders",
            "-b",
            "hello",
            "--tags",
            "TagA",
            "--keys",
            "order-42",
            "--queue",
            "1",
        )
        assert rc == 0 and sent["status"] == "SEND_OK" and sent["queueId"] == 1
        assert set(sent) == {"status", "msgId", "queueId", "queueOffset", "commitLogOffset",
                             "brokerName"}
        assert sent["brokerName"] == "broker-a"  # the group that stored it (its queue's group)
        rc, many = run_cli(
            "send", *s, "-t", "orders", "--count", "5", "--size", "16", "--queue", "0"
        )
        assert rc == 0 and [m["queueOffset"] for m in many] == [0, 1, 2, 3, 4]
        rc, pulled = run_cli("pull", *s, "-t", "orders", "-q", "1", "-o", "0", "-n", "10")
        assert rc == 0 and pulled["status"] == "FOUND" and pulled["nextBeginOffset"] == 1
        msg = pulled["messages"][0]
        assert (msg["body"], msg["tags"], msg["keys"], msg["msgId"]) == (
            "hello",
            "TagA",
            "order-42",
            sent["msgId"],
        )
        assert base64.b64decode(msg["bodyBase64"]) == b"hello"
        assert msg["brokerName"] == "broker-a"
        for field in (
            "topic",
            "queueId",
            "queueOffset",
            "commitLogOffset",
            "bornTimestamp",
            "storeTimestamp",
            "properties",
        ):
            assert field in msg
        rc, found = run_cli("query", *s, "--topic", "orders", "--key", "order-42")
        assert rc == 0 and [m["msgId"] for m in found["messages"]] == [sent["msgId"]]
        rc, found = run_cli("query", *s, "--msg-id", sent["msgId"])
        assert rc == 0 and found["messages"][0]["body"] == "hello"
        rc, found = run_cli("query", *s, "--offset", str(sent["commitLogOffset"]))
        assert rc == 0 and found["messages"][0]["commitLogOffset"] == sent["commitLogOffset"]
        rc, status = run_cli("status", *s)
        assert rc == 0 and status["role"] == "ASYNC_MASTER" and status["maxPhyOffset"] > 0
        for key in (
            "brokerName",
            "brokerId",
            "epoch",
            "minPhyOffset",
            "flushedPhyOffset",
            "masterAddress",
            "slaves",
        ):
            assert key in status
        rc, _ = run_cli("query", *s, "--msg-id", "nothex")
        assert rc == 1
        rc, _ = run_cli("send", *s, "-t", "orders")  # no body source: bad usage
        assert rc == 2
        for bad in ("badserver", "host:", ","):  # a malformed -s is bad usage too
            rc, _ = run_cli("status", "-s", bad)
            assert rc == 2, bad


@pytest.mark.timeout(120)
# the parked pull is answered by the arrival, not by its suspend running out (the PR tier);
# within a few ms of it (the perf tier: 250 ms)
@pytest.mark.parametrize("wake_bound_s", tier(SUSPEND_MS / 1000 / 2, 0.25))
def test_client_batch_async_and_long_poll(tmp_path: Path, wake_bound_s: float) -> None:
    b = BrokerProcess(tmp_path / "b")
    with brokers(b), Producer([b.address]) as p, Consumer([b.address], group="g") as c:
        rs = p.send_batch("batch", [f"m{i}".encode() for i in range(64)], queue_id=0)
        assert [r.queue_offset for r in rs] == list(range(64))
        assert all(r.status == SendStatus.SEND_OK for r in rs)
        futures = [p.send_async("batch", b"async", queue_id=1) for _ in range(500)]
        assert [f.result(30).queue_offset for f in futures] == list(range(500))
        pr = c.pull("batch", 0, 0, 100)
        assert [m.body for m in pr.messages] == [f"m{i}".encode() for i in range(64)]

        # long polling: a parked pull returns within a few ms of the new message
        pool = concurrent.futures.ThreadPoolExecutor(1)
        try:
            waiting = pool.submit(c.pull, "batch", 0, 64, 32, SUSPEND_MS)
            deadline = time.monotonic() + 10
            while b.status()["longPolls"] < 1:
                assert time.monotonic() < deadline, "pull never parked"
            sent_at = time.monotonic()
            p.send("batch", b"late", queue_id=0)
            pr = waiting.result(SUSPEND_MS / 1000 + 10)
            latency_s = time.monotonic() - sent_at
        finally:
            pool.shutdown()
        assert pr.status == PullStatus.FOUND and [m.body for m in pr.messages] == [b"late"]
        print(f"long poll answered {latency_s * 1000:.1f} ms after the send")
        assert latency_s < wake_bound_s, \
            f"long poll answered {latency_s * 1000:.1f} ms after the send"


@pytest.mark.timeout(180)
def test_sigterm_clean_restart_keeps_offsets_and_messages(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "b", flushDiskType="SYNC_FLUSH")
    try:
        b.start()
        with Producer([b.address]) as p, Consumer([b.address], group="billing") as c:
            sent = [p.send("keep", f"v{i}".encode(), queue_id=0) for i in range(20)]
            c.commit_offset("keep", 0, 12)
        assert (b.store_root / "abort").exists()
        assert b.terminate() == 0
        assert not (b.store_root / "abort").exists(), "clean shutdown must remove the abort file"
        offsets = (b.store_root / "config" / "consumerOffset.json").read_text()
        assert "keep@billing" in offsets
        b.start()
        with Consumer([b.address], group="billing") as c:
            assert c.fetch_offset("keep", 0) == 12
            pr = c.pull("keep", 0, 0, 32)
        assert [m.msg_id for m in pr.messages] == [r.msg_id for r in sent]
        assert b.status()["maxPhyOffset"] == sent[-1].commit_log_offset + pr.messages[-1].store_size
        assert b.terminate() == 0
    finally:
        b.close()


def _master_and_slave(tmp_path: Path, **fields: object) -> tuple[BrokerProcess, BrokerProcess]:
    master = BrokerProcess(tmp_path / "m", **fields)
    slave = BrokerProcess(
        tmp_path / "s",
        brokerRole="SLAVE",
        brokerId=1,
        haMasterAddress=f"127.0.0.1:{master.port + 1}",
        **fields,
    )
    return master, slave


@pytest.mark.timeout(120)
def test_status_and_discovery_across_group(tmp_path: Path) -> None:
    master, slave = _master_and_slave(tmp_path)
    with brokers(slave, master):
        # given the slave first, the client still writes to the master
        with Producer([slave.address, master.address]) as p:
            r = p.send("disc", b"x")
        assert r.status == SendStatus.SEND_OK
        with Admin([slave.address]) as a:
            # the slave learns its master's client address from the HA handshake, which may
            # still be under way (an ASYNC master answers before any slave has connected):
            # wait until the slave holds the message, which it can only after that handshake
            st = wait_for(
                lambda: (s := a.status(slave.address))["maxPhyOffset"] >= r.commit_log_offset + 1
                and s,
                20,
                "the slave to replicate the message",
            )
        assert st["role"] == "SLAVE" and st["brokerId"] == 1
        assert st["masterAddress"] == master.address
        assert st["haMasterAddress"] == f"127.0.0.1:{master.port + 1}"


def _wait_found(c: Consumer, topic: str, deadline_s: float, count: int = 1) -> list[bytes]:
    """The bodies in the topic's queue 0 once at least ``count`` are delivered (messages due
    a few ms apart are delivered by separate passes of the schedule service)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        pr = c.pull(topic, queue_id=0, offset=0, max_nums=32)
        if pr.status == PullStatus.FOUND and len(pr.messages) >= count:
            return [m.body for m in pr.messages]
        time.sleep(0.05)
    raise AssertionError(f"{count} not delivered to {topic} within {deadline_s} s")


@pytest.mark.timeout(120)
def test_delay_levels_through_client_cli_and_property(tmp_path: Path) -> None:
    """A delayed send is held for its level's time, whichever way the level travels: the
    client's delay_level, the CLI's --delay-level (one message and --count), or only the DELAY
    property as a RocketMQ 4.x client sets it. A batch cannot hold delayed messages."""
    b = BrokerProcess(tmp_path / "b", defaultTopicQueueNums=1, messageDelayLevel="1s 2s")
    with brokers(b), Producer([b.address]) as p, Consumer([b.address], group="g") as c:
        started = time.monotonic()
        r = p.send("viaclient", b"a", delay_level=1)
        assert r.status == SendStatus.SEND_OK
        p.send("viaprop", b"b", properties={"DELAY": "1"})
        rc, sent = run_cli("send", "-s", b.address, "-t", "viacli", "-b", "c", "--delay-level", "1")
        assert rc == 0 and sent["status"] == "SEND_OK"
        rc, many = run_cli("send", "-s", b.address, "-t", "viacount", "--count", "3", "--size",
                           "8", "--delay-level", "1")
        assert rc == 0 and [m["status"] for m in many] == ["SEND_OK"] * 3
        assert _wait_found(c, "viaclient", 15) == [b"a"]
        assert time.monotonic() - started >= 0.9  # level 1 is 1 s
        assert _wait_found(c, "viaprop", 15) == [b"b"]
        assert _wait_found(c, "viacli", 15) == [b"c"]
        assert len(_wait_found(c, "viacount", 15, count=3)) == 3
        # each was held its level's time: stored (delivered) 1 s or more after it was born,
        # whatever the time the sends took (the CLI's two processes take over a second on a
        # loaded machine: a pull right after them could find the first delivered already)
        for topic in ("viaclient", "viaprop", "viacli", "viacount"):
            for m in c.pull(topic, queue_id=0, offset=0, max_nums=32).messages:
                assert m.store_timestamp - m.born_timestamp >= 1000, (topic, m)
        with pytest.raises(BrokerError) as refused:
            p.send_batch("viaclient", [Message("viaclient", b"x", delay_level=1)])
        assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL
        with pytest.raises(BrokerError) as refused:
            p.send("viaprop", b"y", properties={"DELAY": "soon"})
        assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL and "DELAY" in refused.value.remark
        with pytest.raises(BrokerError):
            p.send_async("viaprop", b"z", properties={"DELAY": "1"})


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.mark.timeout(120)
def test_offsets_by_time_lag_and_reset_through_client_and_cli(tmp_path: Path) -> None:
    master, slave = _master_and_slave(tmp_path, defaultTopicQueueNums=2)
    with brokers(master, slave):
        with Producer([master.address]) as p:
            before = [p.send("when", b"old%d" % i, queue_id=0) for i in range(5)]
            # every message stored so far has a store time below `cut`, every later one not:
            # the broker and this test read the same clock (a wait on the clock, not a sleep)
            cut = _now_ms() + 1
            while _now_ms() <= cut:
                time.sleep(0.001)
            after = [p.send("when", b"new%d" % i, queue_id=0) for i in range(3)]
        assert all(r.status == SendStatus.SEND_OK for r in before + after)

        with Consumer([master.address], group="ops") as c:
            assert c.queue_nums("when") == 2
            assert (c.min_offset("when", 0), c.max_offset("when", 0)) == (0, 8)
            assert c.search_offset("when", 0, cut) == 5
            assert c.search_offset("when", 0, 0) == 0
            assert c.search_offset("when", 0, _now_ms() + 60_000) == 8
            assert c.search_offset("when", 1, cut) == 0  # an empty queue
            with pytest.raises(BrokerError) as e:
                c.queue_nums("never-sent")
            assert e.value.code == ResponseCode.TOPIC_NOT_EXIST
        # a slave answers the same (its queues are built from the same bytes)
        with Consumer([master.address], read_from=slave.address) as c:
            wait_for(lambda: c.max_offset("when", 0) == 8, 20, "the slave to hold queue 0")
            assert c.search_offset("when", 0, cut) == 5

        s = ["-s", master.address]
        rc, doc = run_cli("offsets", *s, "-t", "when")
        assert rc == 0 and doc["queues"] == [
            {"queueId": 0, "minOffset": 0, "maxOffset": 8},
            {"queueId": 1, "minOffset": 0, "maxOffset": 0},
        ]
        iso = (
            datetime.datetime.fromtimestamp(cut // 1000, datetime.UTC)
            + datetime.timedelta(milliseconds=cut % 1000)
        ).isoformat(timespec="milliseconds")
        for when in (str(cut), iso):
            rc, doc = run_cli("offsets", *s, "-t", "when", "-q", "0", "--time", when)
            assert rc == 0 and doc["timestamp"] == cut
            assert doc["queues"] == [
                {"queueId": 0, "minOffset": 0, "maxOffset": 8, "offsetAtTime": 5}
            ]
        # a group's lag, then a reset to the time: the group's next pull starts there
        rc, doc = run_cli("offsets", *s, "-t", "when", "-q", "0", "--group", "billing")
        assert rc == 0 and doc["queues"][0]["committedOffset"] == -1
        assert doc["queues"][0]["lag"] == 8
        rc, doc = run_cli(
            "offsets", *s, "-t", "when", "--group", "billing", "--time", str(cut), "--reset"
        )
        assert rc == 0 and doc["reset"] is True
        assert [(q["previousOffset"], q["committedOffset"], q["lag"]) for q in doc["queues"]] == [
            (-1, 5, 3),
            (-1, 0, 0),
        ]
        rc, pulled = run_cli("pull", *s, "-t", "when", "-q", "0", "--group", "billing")
        assert rc == 0 and [m["body"] for m in pulled["messages"]] == ["new0", "new1", "new2"]
        # bad usage changes nothing: exit 2, the committed offsets stay
        for bad in (["--time", "yesterday-ish"], ["--reset", "--time", str(cut)], ["--reset"]):
            rc, doc = run_cli("offsets", *s, "-t", "when", *bad)
            assert rc == 2 and doc is None, bad
        rc, doc = run_cli("offsets", *s, "-t", "when", "-q", "0", "--group", "billing")
        assert doc["queues"][0]["committedOffset"] == 5
        rc, doc = run_cli("offsets", *s, "-t", "never-sent")
        assert rc == 1 and doc["error"] == "TOPIC_NOT_EXIST"


@pytest.mark.timeout(120)
def test_large_bodies_are_stored_compressed_and_read_back_whole(tmp_path: Path) -> None:
    """Bodies of 4 KiB and more travel and rest deflated (SYSFLAG COMPRESSED, RocketMQ's
    compressMsgBodyOverHowmuch) through send, send_batch, send_async and the CLI; every reader
    (pull, query, the CLI) gets the bodies back as sent, and small bodies are left alone."""
    from common.core.message import SYSFLAG_COMPRESSED
    from common.format import record

    b = BrokerProcess(tmp_path / "b", defaultTopicQueueNums=1)
    big = b"".join(b"order %06d shipped to warehouse 7;" % i for i in range(600))  # ~21 KiB
    (tmp_path / "big.txt").write_bytes(big)
    with brokers(b), Producer([b.address]) as p, Consumer([b.address]) as c:
        sent = [p.send("orders", big, tags="T", keys="k-big")]
        sent += p.send_batch("orders", [b"small", big, Message("orders", big, tags="U")])
        sent.append(p.send_async("orders", big).result(30))
        rc, cli_sent = run_cli("send", "-s", b.address, "-t", "orders", "--file",
                               str(tmp_path / "big.txt"))
        rc, cli_plain = run_cli("send", "-s", b.address, "-t", "orders", "--file",
                                str(tmp_path / "big.txt"), "--compress-over", "0")
        assert rc == 0
        offsets = [r.commit_log_offset for r in sent]
        offsets += [cli_sent["commitLogOffset"], cli_plain["commitLogOffset"]]
        segment = (b.store_root / "commitlog" / f"{0:020d}").read_bytes()
        heads = [record.Header._make(record.HEADER.unpack_from(segment, phy)) for phy in offsets]
        assert [h.sys_flag & SYSFLAG_COMPRESSED for h in heads] == [1, 0, 1, 1, 1, 1, 0]
        assert all(h.body_len < len(big) // 5 for h in heads if h.sys_flag)
        assert heads[-1].body_len == len(big)
        pulled = c.pull("orders", 0, 0, 32)
        assert [m.body for m in pulled.messages] == [big, b"small", big, big, big, big, big]
        assert [m.tags for m in pulled.messages][:4] == ["T", None, None, "U"]
        assert Admin([b.address]).query_by_key("orders", "k-big")[0].body == big
        rc, out = run_cli("pull", "-s", b.address, "-t", "orders", "-q", "0", "-o", "5")
        assert rc == 0 and out["messages"][0]["body"] == big.decode()
        assert base64.b64decode(out["messages"][0]["bodyBase64"]) == big
