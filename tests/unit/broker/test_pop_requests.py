"""POP over real sockets (issue 40): SimpleConsumer against a broker on a real store. Consumers
of one group share a topic's messages; an unacked one comes back with its count raised, and
after maxReconsumeTimes goes to the group's DLQ; a change of invisible time and a stale handle;
long polling; FIFO; a filter; and what a slave and bad requests are answered."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.brokers import addr, wait_for

from common.broker.broker import Broker
from common.client import Consumer, Producer, PushConsumer, SimpleConsumer
from common.core.errors import BrokerError, ResponseCode
from common.core.message import dlq_topic
from common.format.protocol import RequestCode

pytestmark = [pytest.mark.unit, pytest.mark.timeout(90)]

INVISIBLE = 1_000  # the shortest invisible time a POP may ask for
POP_BROKER = {"real_store": True, "brokerName": "pb", "enablePropertyFilter": True}


def send(broker: Broker, n: int, topic: str = "t", **kw: Any) -> None:
    with Producer([addr(broker)]) as p:
        for i in range(n):
            p.send(topic, b"m%d" % i, queue_id=0, **kw)


def test_consumers_of_a_group_share_the_messages_and_acked_ones_never_come_back(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(**POP_BROKER)
    send(broker, 6)
    with SimpleConsumer([addr(broker)], "g") as a, SimpleConsumer([addr(broker)], "g") as b:
        first = a.receive("t", 4, INVISIBLE)
        second = b.receive("t", 4, INVISIBLE)
        assert [r.message.body for r in first] == [b"m0", b"m1", b"m2", b"m3"]
        assert [r.message.body for r in second] == [b"m4", b"m5"]
        assert all(r.message.reconsume_times == 0 for r in first + second)
        for r in first + second[:1]:
            a.ack(r)
        assert a.receive("t", 32, INVISIBLE) == []  # m5 is in flight
        # m5 comes back once its invisible time passed, to whoever asks, counted
        again = wait_for(lambda: a.receive("t", 32, INVISIBLE), "m5 again", timeout_s=10)
        assert [(r.message.body, r.message.reconsume_times) for r in again] == [(b"m5", 1)]
        with pytest.raises(BrokerError) as stale:  # b's handle is spent
            b.ack(second[1])
        assert stale.value.code == ResponseCode.MESSAGE_ILLEGAL and "newest" in stale.value.remark
        a.ack(again[0])
        a.ack(again[0])  # acked already: fine
    with SimpleConsumer([addr(broker)], "other") as c:  # another group reads everything
        assert len(c.receive("t", 32, INVISIBLE)) == 6


def test_a_receives_answer_is_the_brokers_with_its_records_unread(
        make_broker: Callable[..., Broker]) -> None:
    """``receive_answer``: the POP answer as the broker gave it (what the gRPC front end makes
    its messages from), the records, handles and counts lined up; None when nothing came."""
    from common.format.protocol import decode_record

    broker = make_broker(**POP_BROKER)
    send(broker, 3)
    with SimpleConsumer([addr(broker)], "g") as c:
        resp = c.receive_answer("t", 4, INVISIBLE)
        assert resp is not None and resp.code == ResponseCode.SUCCESS
        assert [decode_record(raw).body for raw in resp.bodies] == [b"m0", b"m1", b"m2"]
        assert len(resp.fields["handles"]) == len(resp.fields["reconsumeTimes"]) == 3
        assert c.receive_answer("t", 4, INVISIBLE) is None  # all three in flight
        assert not c.ack_batch(resp.fields["handles"])


def test_a_batch_ack_acks_many_and_names_the_handles_it_could_not_use(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(**POP_BROKER)
    send(broker, 5)
    with SimpleConsumer([addr(broker)], "g") as c:
        first = c.receive("t", 5, INVISIBLE)
        assert c.ack_batch(first[:3]) == []
        c.ack(first[3])
        failed = c.ack_batch([first[3], first[4], "rp1 pb t 0 77 0 0 1000"])
        assert [why for _, why in failed] == [failed[0][1]] and "never" in failed[0][1]
        assert failed[0][0] == "rp1 pb t 0 77 0 0 1000"  # the handle that failed, named
        assert c.receive("t", 5, INVISIBLE, wait_ms=1500) == []  # all five acked


def test_after_max_reconsume_times_a_message_goes_to_the_dlq(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(**POP_BROKER)
    send(broker, 1)
    counts = []
    with SimpleConsumer([addr(broker)], "g") as c:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = c.receive("t", 1, INVISIBLE, wait_ms=1500, max_reconsume_times=2)
            counts += [r.message.reconsume_times for r in got]
            if len(counts) == 3:
                break
        assert counts == [0, 1, 2]  # handed out 3 times: then the DLQ, never a 4th
        with Consumer([addr(broker)], group="x") as reader:
            dead = wait_for(lambda: reader.pull(dlq_topic("g"), 0, 0, 8).messages,
                            "the DLQ copy", timeout_s=10)
        assert [m.body for m in dead] == [b"m0"] and dead[0].reconsume_times == 3  # as a send-back
        assert dead[0].properties["RETRY_TOPIC"] == "t"
        assert c.receive("t", 1, INVISIBLE, wait_ms=1500) == []


def test_changing_the_invisible_time_keeps_a_message_hidden_and_spends_the_old_handle(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(**POP_BROKER)
    send(broker, 1)
    with SimpleConsumer([addr(broker)], "g") as c:
        [r] = c.receive("t", 1, INVISIBLE)
        newer = c.change_invisible_duration(r, 60_000)
        time.sleep(INVISIBLE / 1000 + 0.3)
        assert c.receive("t", 1, INVISIBLE) == []  # still hidden
        with pytest.raises(BrokerError):
            c.ack(r)
        c.ack(newer)
        with pytest.raises(BrokerError) as bad:
            c.change_invisible_duration(newer, 10)  # below the floor
        assert bad.value.code == ResponseCode.BAD_REQUEST


def test_a_receive_waits_for_a_message_to_arrive(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(**POP_BROKER)
    send(broker, 1)
    with SimpleConsumer([addr(broker)], "g") as c:
        c.ack(c.receive("t", 1, INVISIBLE)[0])
        threading.Timer(0.5, send, (broker, 1)).start()
        started = time.monotonic()
        got = c.receive("t", 1, INVISIBLE, wait_ms=5_000)
        took = time.monotonic() - started
        assert [r.message.body for r in got] == [b"m0"] and 0.3 < took < 4
        started = time.monotonic()
        assert c.receive("t", 1, INVISIBLE, wait_ms=600) == []
        assert time.monotonic() - started >= 0.5


def test_fifo_keeps_each_message_groups_order(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(**POP_BROKER)
    with Producer([addr(broker)]) as p:
        for i in range(3):
            for group in ("A", "B"):
                p.send("f", f"{group}{i}".encode(), shard_key=group)
    seen: dict[str, list[bytes]] = {"A": [], "B": []}
    with SimpleConsumer([addr(broker)], "g") as c:
        deadline = time.monotonic() + 20
        while sum(len(v) for v in seen.values()) < 6 and time.monotonic() < deadline:
            got = c.receive("f", 32, INVISIBLE, wait_ms=500, fifo=True)
            held = {chr(r.message.body[0]) for r in got}
            assert len(held) == len(got)  # one message of a group at a time
            for r in got:
                seen[chr(r.message.body[0])].append(r.message.body)
                c.ack(r)
    assert seen == {"A": [b"A0", b"A1", b"A2"], "B": [b"B0", b"B1", b"B2"]}


def test_a_filtered_receive_gets_only_what_matches(make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(**POP_BROKER)
    with Producer([addr(broker)]) as p:
        for i in range(6):
            p.send("s", b"%d" % i, queue_id=0, tags="even" if i % 2 == 0 else "odd",
                   properties={"n": str(i)})
    with SimpleConsumer([addr(broker)], "g1") as c:
        assert [r.message.body for r in c.receive("s", 32, INVISIBLE, tags="odd")] == \
            [b"1", b"3", b"5"]
    with SimpleConsumer([addr(broker)], "g2") as c:
        assert [r.message.body for r in c.receive("s", 32, INVISIBLE, sql="n >= 4")] == \
            [b"4", b"5"]


def test_a_receive_with_a_sql92_filter_nested_too_deep_is_refused_as_unreadable(
        make_broker: Callable[..., Broker]) -> None:
    """Not a broker fault (SYSTEM_ERROR, retried): the expression cannot be used."""
    broker = make_broker(**POP_BROKER)
    send(broker, 1)
    with SimpleConsumer([addr(broker)], "g", retries=0) as c:
        for deep in ("(" * 1000 + "n = 1" + ")" * 1000, "NOT " * 1000 + "n = 1"):
            with pytest.raises(BrokerError) as e:
                c.receive("t", 1, INVISIBLE, sql=deep)
            assert e.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
            assert "deep" in e.value.remark
        assert len(c.receive("t", 1, INVISIBLE, sql="NOT " * 64 + "n IS NULL")) == 1


def test_bad_requests_are_refused_and_the_broker_serves_on(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(**POP_BROKER)
    send(broker, 1)
    with SimpleConsumer([addr(broker)], "g", retries=0) as c:
        with pytest.raises(BrokerError) as e:
            c.receive("t", 1, 10)  # invisible time below the floor
        assert e.value.code == ResponseCode.BAD_REQUEST
        with pytest.raises(BrokerError) as e:
            c.receive("nope", 1, INVISIBLE)
        assert e.value.code == ResponseCode.TOPIC_NOT_EXIST
        with pytest.raises(BrokerError) as e:
            c.ack("not a handle")
        assert e.value.code == ResponseCode.BAD_REQUEST
        with pytest.raises(BrokerError) as e:
            c.ack("rp1 pb t 0 99 0 0 1000")  # never handed out
        assert e.value.code == ResponseCode.MESSAGE_ILLEGAL
        assert [r.message.body for r in c.receive("t", 1, INVISIBLE)] == [b"m0"]


def test_one_group_reads_one_way_pop_or_offsets(make_broker: Callable[..., Broker]) -> None:
    """A group that POPs refuses an offset-based member's heartbeat, and a group with live
    offset-based members refuses a POP: both would be handed the same messages."""
    broker = make_broker(**POP_BROKER)
    send(broker, 2)

    def heartbeat(c: Consumer, group: str) -> Any:
        return c._cluster.request(addr(broker), RequestCode.CONSUMER_HEARTBEAT,
                                  {"group": group, "clientId": "member-1"})

    with SimpleConsumer([addr(broker)], "popping", retries=0) as popper, \
            Consumer([addr(broker)], group="x", retries=0) as raw:
        assert len(popper.receive("t", 1, INVISIBLE)) == 1
        refused = heartbeat(raw, "popping")
        assert refused.code == ResponseCode.BAD_REQUEST and "by POP" in refused.remark
        assert heartbeat(raw, "pulling").code == ResponseCode.SUCCESS
    with SimpleConsumer([addr(broker)], "pulling", retries=0) as late:
        with pytest.raises(BrokerError) as e:
            late.receive("t", 1, INVISIBLE)
        assert e.value.code == ResponseCode.BAD_REQUEST and "by offset" in e.value.remark


def test_a_push_consumer_calls_its_listener_on_a_pool_and_retries_what_failed(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(**POP_BROKER)
    send(broker, 20)
    seen: list[tuple[bytes, int]] = []
    lock = threading.Lock()
    threads: set[str] = set()

    def listener(msg: Any) -> bool:
        with lock:
            seen.append((msg.body, msg.reconsume_times))
            threads.add(threading.current_thread().name)
        if msg.body == b"m7" and msg.reconsume_times == 0:
            raise RuntimeError("the first try of m7 fails")
        return not (msg.body == b"m3" and msg.reconsume_times < 2)  # m3: twice refused

    with PushConsumer([addr(broker)], "g", "t", listener, threads=3,
                      invisible_ms=INVISIBLE) as push:
        wait_for(lambda: push.consumed == 20, "every message consumed", timeout_s=30)
    bodies = sorted({b for b, _ in seen})
    assert bodies == sorted(b"m%d" % i for i in range(20))
    assert (b"m7", 1) in seen and (b"m3", 2) in seen and push.failed == 3
    assert len(threads) > 1  # a pool, not one thread


def test_replog_consume_pop_and_replog_groups_show_what_is_in_flight(
        make_broker: Callable[..., Broker], capsys: pytest.CaptureFixture[str]) -> None:
    from common.cli.main import main

    broker = make_broker(**POP_BROKER)
    send(broker, 4)
    server = addr(broker)
    assert main(["consume", "-s", server, "-t", "t", "--group", "cli", "--pop", "--from",
                 "earliest", "-n", "3", "--no-ack", "--invisible-ms", str(INVISIBLE), "--idle-s",
                 "2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["consumed"] == 3 and all(m["receiptHandle"] for m in got["messages"])
    assert main(["groups", "-s", server, "--group", "cli", "--json"]) == 0
    [group] = json.loads(capsys.readouterr().out)["groups"]
    assert group["pop"] == {"inFlight": 3, "due": 0, "redelivered": 0, "backlog": 1}
    time.sleep(INVISIBLE / 1000 + 0.2)  # the three come back, counted, and are acked now
    assert main(["consume", "-s", server, "-t", "t", "--group", "cli", "--pop", "-n", "4",
                 "--idle-s", "2", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)["messages"]
    assert sorted(m["reconsumeTimes"] for m in again) == [0, 1, 1, 1]
    assert main(["groups", "-s", server, "--group", "cli", "--json"]) == 0
    [group] = json.loads(capsys.readouterr().out)["groups"]
    assert group["pop"] == {"inFlight": 0, "due": 0, "redelivered": 3, "backlog": 0}
    with pytest.raises(SystemExit):
        main(["consume", "-s", server, "-t", "t", "--group", "cli", "--fifo"])


def test_a_fifo_topic_takes_only_messages_with_a_message_group(
        make_broker: Callable[..., Broker], capsys: pytest.CaptureFixture[str]) -> None:
    """RocketMQ 5's ``message.type=FIFO`` topic attribute: kept in topics.json (and so copied
    by slaves), and every message sent to the topic needs a message group."""
    from common.broker.tables import TopicTable
    from common.cli.main import main
    from common.client import Admin

    broker = make_broker(**POP_BROKER)
    server = addr(broker)
    assert main(["topics", "-s", server, "--create", "ff", "--queues", "2", "--attr",
                 "message.type=FIFO", "--json"]) == 0
    capsys.readouterr()
    with Admin([server], retries=0) as admin:
        with pytest.raises(BrokerError) as bad:
            admin.create_topic("fx", 2, attributes={"message.type": "ORDERLY"})
        assert bad.value.code == ResponseCode.BAD_REQUEST and "FIFO" in bad.value.remark
        with pytest.raises(BrokerError) as bad:
            admin.create_topic("fx", 2, attributes={"colour": "blue"})
        assert bad.value.code == ResponseCode.BAD_REQUEST
    with Producer([server], retries=0) as p:
        with pytest.raises(BrokerError) as refused:
            p.send("ff", b"no group", queue_id=0)
        assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL
        assert "message group" in refused.value.remark
        with pytest.raises(BrokerError):
            p.send_batch("ff", [b"a", b"b"], queue_id=0)
        assert p.send("ff", b"grouped", shard_key="order-1").status.value == "SEND_OK"
        assert p.send("t", b"a normal topic needs none", queue_id=0).status.value == "SEND_OK"
    table = TopicTable(broker.cfg.store_root / "config")
    assert table.message_type("ff") == "FIFO" and table.message_type("t") == ""
    copy = TopicTable(Path(str(broker.cfg.store_root)) / "copy")  # a slave takes the table
    assert copy.replace(table.to_bytes(), "master") and copy.message_type("ff") == "FIFO"


@pytest.mark.parametrize("how", ["of a DLQ topic", "too large to copy"])
def test_a_message_that_cannot_go_to_the_dlq_stops_no_other(
        make_broker: Callable[..., Broker], how: str) -> None:
    """A message handed out as often as allowed that cannot be copied to the DLQ (one read
    from a DLQ topic; one whose properties leave no room for the copy's) is given up, logged:
    the messages due after it still go to the DLQ, and its slot is freed."""
    from common.format.record import MAX_PROPERTIES_BYTES

    broker = make_broker(**POP_BROKER)
    topic = "%DLQ%x" if how == "of a DLQ topic" else "big"
    with Producer([addr(broker)]) as p:
        if how == "of a DLQ topic":
            p.send(topic, b"stuck", queue_id=0)
        else:  # the largest the store takes, less than a copy's RETRY_TOPIC and ORIGIN id
            for size in range(MAX_PROPERTIES_BYTES - 40, 0, -64):
                try:
                    p.send(topic, b"stuck", queue_id=0, properties={"fill": "x" * size})
                    break
                except BrokerError:
                    continue
        p.send("t", b"live", queue_id=0)
    with SimpleConsumer([addr(broker)], "g") as c:
        for name in (topic, "t"):  # handed out once each, the most allowed
            assert len(c.receive(name, 1, INVISIBLE, max_reconsume_times=0)) == 1
        with Consumer([addr(broker)], group="x") as reader:
            dead = wait_for(lambda: reader.pull(dlq_topic("g"), 0, 0, 8).messages,
                            "the DLQ copy of the message after the stuck one", timeout_s=15)
        assert [m.body for m in dead] == [b"live"]
        role = broker.role
        assert role is not None
        later = int(time.time() * 1000) + 60_000
        wait_for(lambda: not role.store.pop.due_for_dlq(later), "the stuck one's slot freed")
        assert role.pop_revive.given_up == 1


def test_a_compressed_body_that_does_not_inflate_keeps_no_other_message_from_a_consumer(
        make_broker: Callable[..., Broker]) -> None:
    """A producer may flag its body COMPRESSED and send anything: that record is left out of
    the receive (it comes back, then goes to the DLQ), the messages popped with it are handed
    on. The whole receive failed, every message in it handed out and none delivered, each
    time, until all of them were in the DLQ."""
    from common.client import Admin

    broker = make_broker(**POP_BROKER)
    send(broker, 1)
    with Admin([addr(broker)], retries=0) as admin:
        sent = admin._cluster.request(addr(broker), RequestCode.SEND, {
            "topic": "t", "queueId": 0, "sysFlag": 1}, [b"not a zlib stream"])
    assert sent.code == ResponseCode.SUCCESS
    with Producer([addr(broker)]) as p:
        p.send("t", b"after", queue_id=0)
    with SimpleConsumer([addr(broker)], "g") as c:
        got = c.receive("t", 8, INVISIBLE)
        assert [r.message.body for r in got] == [b"m0", b"after"]
