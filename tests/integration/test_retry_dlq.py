"""Consumer retries and dead letters against real brokers (RocketMQ's RECONSUME_LATER): a message
a GroupConsumer fails comes back through %RETRY%<group> after its delay, under its own topic,
with its reconsume count; after max_reconsume_times it lands in %DLQ%<group>; what succeeded is
committed, and the group's offsets say so after a restart. Under SYNC_MASTER the copy is on the
slave before the send-back answers."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_harness import REPO, BrokerProcess, _child_env, brokers, free_port, run_cli
from replication_harness import stop_process, wait_for

from common.client import Admin, Consumer, Producer
from common.client.group_consumer import GroupConsumer
from common.core.errors import BrokerError, PullStatus, ResponseCode, SendStatus
from common.core.message import MessageExt

pytestmark = pytest.mark.integration

LEVELS = "1s 1s 1s 1s"  # every retry is due after 1 s (level 3 + n is capped at the last)


@contextlib.contextmanager
def broker_with_topic_o(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker (every delay level 1 s) with topic o of one queue."""
    b = BrokerProcess(tmp_path / "b", messageDelayLevel=LEVELS)
    with brokers(b):
        with Admin([b.address]) as admin:
            admin.create_topic("o", 1)
        yield b


def consume(address: str, handle, until, timeout_s: float = 30.0, **kw: object) -> None:
    """Poll group "gc" of topic "o" until ``until()``; ``handle(consumer, msg)`` per message."""
    with GroupConsumer([address], "gc", ["o"], heartbeat_ms=200, start="earliest",
                       max_reconsume_times=2, **kw) as c:
        deadline = time.monotonic() + timeout_s
        while not until():
            assert time.monotonic() < deadline, "the messages did not all come back in time"
            for msg in c.poll(timeout_ms=200):
                handle(c, msg)


@pytest.mark.timeout(120)
def test_failed_messages_come_back_then_go_to_the_dlq(tmp_path: Path) -> None:
    with broker_with_topic_o(tmp_path) as b:
        with GroupConsumer([b.address], "gc", ["o"], heartbeat_ms=200) as c:
            # its first heartbeat made the retry topic: it reads that before any retry
            assert set(c.assignment()) == set()  # applied by the first poll
            c.poll(timeout_ms=0)
            assert set(c.assignment()) == {("o", 0), ("%RETRY%gc", 0)}
        with Producer([b.address]) as p:
            for body in (b"ok", b"flaky", b"poison"):
                p.send("o", body, tags="T", keys=body.decode(), queue_id=0)
        seen: list[tuple[bytes, str, int]] = []
        copies: list[str] = []

        def handle(c: GroupConsumer, msg: MessageExt) -> None:
            seen.append((msg.body, msg.topic, msg.reconsume_times))
            if msg.body == b"poison" or (msg.body == b"flaky" and msg.reconsume_times == 0):
                r = c.reconsume_later(msg)
                assert r.status == SendStatus.SEND_OK
                copies.append(r.topic)

        consume(b.address, handle, lambda: len(copies) == 4)
        assert Counter(body for body, _, _ in seen) == {b"ok": 1, b"flaky": 2, b"poison": 3}
        assert all(topic == "o" for _, topic, _ in seen)  # retries come back under their topic
        assert sorted(n for body, _, n in seen if body == b"poison") == [0, 1, 2]
        assert copies.count("%DLQ%gc") == 1 and copies[-1] == "%DLQ%gc"

        with Consumer([b.address], group="gc") as c:
            dead = c.pull("%DLQ%gc", 0, 0, 32)
            assert dead.status == PullStatus.FOUND
            (letter,) = dead.messages
            assert letter.body == b"poison" and letter.reconsume_times == 3
            assert letter.properties["RETRY_TOPIC"] == "o" and letter.tags == "T"
            assert letter.keys == "poison"
            with Admin([b.address]) as admin:
                first = admin.query_by_key("o", "poison")
            assert [m.msg_id for m in first] == [letter.properties["ORIGIN_MESSAGE_ID"]]
            # everything the group read is committed: the original queue and the retry queue
            wait_for(lambda: c.fetch_offset("%RETRY%gc", 0) == 3, 10, "retry queue committed")
            assert c.fetch_offset("o", 0) == 3
            assert c.queue_nums("%RETRY%gc") == 1 and c.queue_nums("%DLQ%gc") == 1
        assert b.status()["deadLetters"] == {"gc": 1}
        # the DLQ is an ordinary topic for the CLI
        rc, doc = run_cli("pull", "-s", b.address, "-t", "%DLQ%gc", "-q", "0")
        assert rc == 0 and [m["body"] for m in doc["messages"]] == ["poison"]

        # a member that comes later finds nothing left: the group committed all of it
        assert b.terminate() == 0
        b.start()
        again: list[bytes] = []
        with GroupConsumer([b.address], "gc", ["o"], heartbeat_ms=200) as c:
            deadline = time.monotonic() + 10
            while len(c.assignment()) < 2:  # the assignment is applied by poll
                assert time.monotonic() < deadline, "the queues were not assigned"
                again += [m.body for m in c.poll(timeout_ms=200)]
            for _ in range(3):
                again += [m.body for m in c.poll(timeout_ms=300)]
            assert set(c.assignment()) == {("o", 0), ("%RETRY%gc", 0)}
        assert again == []


@pytest.mark.timeout(60)
def test_send_back_refusals_change_nothing(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "b", messageDelayLevel=LEVELS)
    with brokers(b):
        with Producer([b.address]) as p:
            sent = p.send("o", b"m", queue_id=0)
        with Consumer([b.address], group="gc") as c:
            (msg,) = c.pull("o", 0, 0, 1).messages
            before = b.status()["maxPhyOffset"]
            wrong = MessageExt(**{**msg.__dict__, "commit_log_offset": sent.commit_log_offset + 3})
            with pytest.raises(BrokerError, match="no message starts at commitLogOffset") as e:
                c.send_back(wrong)
            assert e.value.code == ResponseCode.MESSAGE_ILLEGAL and not e.value.retriable
            other = MessageExt(**{**msg.__dict__, "topic": "payments"})
            with pytest.raises(BrokerError, match="is a message of topic o, not of payments"):
                c.send_back(other)
            with pytest.raises(BrokerError, match="delay_level 65"):
                c.send_back(msg, delay_level=65)
            assert b.status()["maxPhyOffset"] == before
            r = c.send_back(msg, delay_level=-1)  # straight to the DLQ
            assert r.topic == "%DLQ%gc" and r.status == SendStatus.SEND_OK
            # readable once reput has indexed it: soon after the SEND_OK, not necessarily
            # by the next request (a flaky immediate pull, seen on a loaded run)
            dead = wait_for(lambda: c.pull("%DLQ%gc", 0, 0, 8).messages, 10,
                            "the dead letter readable")
            assert dead[0].body == b"m"
        wait_for(lambda: b.status()["deadLetters"] == {"gc": 1}, 10, "the dead letter counted")
        human = subprocess.run([sys.executable, "-m", "common.cli", "status", "-s", b.address],
                               cwd=REPO, env=_child_env(), capture_output=True, timeout=60,
                               check=True).stdout.decode()
        assert "consumer groups" in human and re.search(r"gc\W+0\W+1", human), human


@pytest.mark.timeout(120)
def test_sync_master_answers_a_send_back_once_the_slave_holds_the_copy(tmp_path: Path) -> None:
    port = free_port(3)
    master = BrokerProcess(tmp_path / "m", brokerRole="SYNC_MASTER", listenPort=port,
                           haListenPort=port + 1, messageDelayLevel=LEVELS)
    slave = BrokerProcess(tmp_path / "s", brokerRole="SLAVE", brokerId=1,
                          haMasterAddress=f"127.0.0.1:{port + 1}", messageDelayLevel=LEVELS)
    with brokers(master, slave):
        wait_for(lambda: any(s["inSync"] for s in master.status()["slaves"]), 20, "slave in sync")
        with Producer([master.address]) as p:
            p.send("o", b"m", queue_id=0)
        with Consumer([master.address], group="gc") as c:
            (msg,) = c.pull("o", 0, 0, 1).messages
            r = c.send_back(msg, delay_level=-1)
        assert r.status == SendStatus.SEND_OK and r.topic == "%DLQ%gc"
        with Consumer([slave.address], group="gc", read_from=slave.address) as c:
            (letter,) = c.pull("%DLQ%gc", 0, 0, 1).messages  # the slave has it already
        assert letter.body == b"m" and letter.commit_log_offset == r.commit_log_offset
        stop_process(slave.pid)
        try:
            with Consumer([master.address], group="gc") as c:
                r = c.send_back(msg, delay_level=-1)
            # stored, but no slave acked it: the caller must not commit past the original
            assert r.status == SendStatus.FLUSH_SLAVE_TIMEOUT
        finally:
            os.kill(slave.pid, signal.SIGCONT)


@pytest.mark.timeout(180)
def test_retries_stored_on_a_sync_master_survive_its_death(tmp_path: Path) -> None:
    """Send-backs acknowledged by a SYNC_MASTER wait in the delay topic when the master is
    SIGKILLed; the promoted slave's delay service delivers every one of them to the group."""
    port = free_port(3)
    levels = "4s 4s 4s 4s"  # not due before the kill (ten SYNC send-backs take ms)
    master = BrokerProcess(tmp_path / "m", brokerRole="SYNC_MASTER", listenPort=port,
                           haListenPort=port + 1, messageDelayLevel=levels)
    slave = BrokerProcess(tmp_path / "s", brokerRole="SLAVE", brokerId=1,
                          haMasterAddress=f"127.0.0.1:{port + 1}", messageDelayLevel=levels,
                          slaveConfigSyncIntervalMs=200)
    with brokers(master, slave):
        wait_for(lambda: any(s["inSync"] for s in master.status()["slaves"]), 20, "slave in sync")
        with Admin([master.address]) as admin:
            admin.create_topic("o", 1)
        bodies = {b"m%d" % i for i in range(10)}
        with Producer([master.address]) as p:
            for body in sorted(bodies):
                assert p.send("o", body, queue_id=0).status == SendStatus.SEND_OK
        came_back: set[bytes] = set()
        with GroupConsumer([master.address, slave.address], "gc", ["o"], heartbeat_ms=200,
                           start="earliest", timeout_ms=3000) as c:

            def fail_first_deliveries() -> None:
                for msg in c.poll(timeout_ms=200):
                    if msg.reconsume_times == 0:
                        assert c.reconsume_later(msg).status == SendStatus.SEND_OK
                        sent_back.add(msg.body)
                    else:
                        assert msg.reconsume_times == 1 and msg.topic == "o"
                        came_back.add(msg.body)

            sent_back: set[bytes] = set()
            wait_for(lambda: fail_first_deliveries() or sent_back == bodies, 20, "10 send-backs")
            assert not came_back  # none due yet: all ten wait in the delay topic
            os.kill(master.pid, signal.SIGKILL)
            assert master.proc is not None
            master.proc.wait(10)
            with Admin([slave.address]) as admin:
                assert admin.promote(slave.address, role="ASYNC_MASTER")["role"] == "ASYNC_MASTER"

            def poll_on() -> bool:
                try:
                    fail_first_deliveries()  # an original may come again: its commit was lost
                except BrokerError:
                    pass  # the client is finding the new master
                return came_back == bodies

            wait_for(poll_on, 60, "every retry from the new master")


@pytest.mark.timeout(120)
def test_dead_letters_are_listed_and_redriven_to_their_group_only(tmp_path: Path) -> None:
    with broker_with_topic_o(tmp_path) as b:
        rc, doc = run_cli("dlq", "-s", b.address, "--group", "gc")
        assert rc == 0 and doc["messages"] == [] and doc["resent"] == 0  # no DLQ yet
        with Producer([b.address]) as p:
            first = [p.send("o", body, keys=body.decode(), queue_id=0) for body in (b"a", b"b")]
        given_up: list[bytes] = []

        def give_up(c: GroupConsumer, msg: MessageExt) -> None:
            assert c.reconsume_later(msg).topic == "%DLQ%gc"  # no retries allowed
            given_up.append(msg.body)

        with GroupConsumer([b.address], "gc", ["o"], heartbeat_ms=200, start="earliest",
                           max_reconsume_times=0) as c:
            deadline = time.monotonic() + 30
            while len(given_up) < 2:
                assert time.monotonic() < deadline
                for msg in c.poll(timeout_ms=200):
                    give_up(c, msg)
        rc, doc = run_cli("dlq", "-s", b.address, "--group", "gc")
        assert rc == 0 and doc["fromOffset"] == 0 and doc["maxOffset"] == 2
        assert [(m["body"], m["originTopic"], m["reconsumeTimes"]) for m in doc["messages"]] == [
            ("a", "o", 1), ("b", "o", 1)]
        rc, doc = run_cli("dlq", "-s", b.address, "--group", "gc", "--resend")
        assert rc == 0 and doc["resent"] == 2
        rc, doc = run_cli("dlq", "-s", b.address, "--group", "gc", "--resend")
        assert rc == 0 and doc["resent"] == 0 and doc["fromOffset"] == 2  # nothing twice
        assert run_cli("dlq", "-s", b.address, "--group", "gc", "-n", "0")[0] == 2

        got: list[MessageExt] = []
        with GroupConsumer([b.address], "gc", ["o"], heartbeat_ms=200) as c:
            deadline = time.monotonic() + 30
            while len(got) < 2:
                assert time.monotonic() < deadline, "the re-driven letters did not come"
                got += c.poll(timeout_ms=200)
        assert [(m.body, m.topic, m.reconsume_times, m.keys) for m in got] == [
            (b"a", "o", 0, "a"), (b"b", "o", 0, "b")]
        assert [m.properties["ORIGIN_MESSAGE_ID"] for m in got] == [r.msg_id for r in first]
        with Consumer([b.address], group="other") as c:  # the topic itself got nothing new
            assert c.max_offset("o", 0) == 2
