"""GroupConsumer against a real broker: queues shared by the members of a group, taken over
when one leaves, offsets committed so a new member resumes where the group stood."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_harness import BrokerProcess, brokers, run_cli
from replication_harness import wait_for

from common.client import Admin, Consumer, Producer
from common.client.group_consumer import GroupConsumer
from common.core.message import MessageExt

pytestmark = pytest.mark.integration


class Member:
    """A GroupConsumer polled on its own thread, collecting bodies."""

    def __init__(self, address: str, **kw: object) -> None:
        self.consumer = GroupConsumer([address], "gc", ["g"], heartbeat_ms=200, **kw)
        self.got: list[bytes] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.got += [m.body for m in self.consumer.poll(timeout_ms=200)]
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.errors.append(e)

    def assignment(self) -> set[tuple[str, int]]:
        """Its queues of topic g (the group's retry topic, one queue, goes to one member too)."""
        return {q for q in self.consumer.assignment() if q[0] == "g"}

    def stop_polling(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def close(self) -> None:
        self.stop_polling()
        self.consumer.close()


@contextlib.contextmanager
def broker_with_topic(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker with topic g of 4 queues."""
    b = BrokerProcess(tmp_path / "b")
    with brokers(b):
        with Admin([b.address]) as admin:
            admin.create_topic("g", 4)
        yield b


def _send(address: str, first: int, count: int) -> list[bytes]:
    bodies = [b"m%04d" % i for i in range(first, first + count)]
    with Producer([address]) as p:
        for i, body in enumerate(bodies):
            p.send("g", body, queue_id=i % 4)
    return bodies


@pytest.mark.timeout(120)
def test_members_share_the_queues_take_over_and_resume(tmp_path: Path) -> None:
    with broker_with_topic(tmp_path) as b:
        one = Member(b.address, start="earliest")
        two = Member(b.address, start="earliest")
        try:
            all_queues = {("g", q) for q in range(4)}
            wait_for(lambda: one.assignment() | two.assignment() == all_queues
                     and not one.assignment() & two.assignment()
                     and len(one.assignment()) == 2, 20, "the two members to split the queues")
            assert b.status()["consumerGroups"] == {"gc": 2}
            sent = _send(b.address, 0, 200)
            wait_for(lambda: len(one.got) + len(two.got) >= 200, 30, "200 messages consumed")
            assert sorted(one.got + two.got) == sent  # each once: the split was stable
            assert one.got and two.got

            two.close()  # leaves at once: its queues move to `one`
            wait_for(lambda: one.assignment() == all_queues, 20, "one to take every queue")
            sent += _send(b.address, 200, 100)
            wait_for(lambda: set(one.got + two.got) >= set(sent), 30, "the rest consumed")
            assert not one.errors and not two.errors
        finally:
            one.close()
            two.close()
        # a new member of the group resumes at the group's committed offsets, not "latest"
        three = Member(b.address, start="earliest")
        try:
            wait_for(lambda: three.assignment() == all_queues, 20, "three to take the queues")
            sent_late = _send(b.address, 300, 8)
            wait_for(lambda: len(three.got) >= 8, 30, "the new messages")
            assert sorted(three.got) == sent_late  # nothing consumed before came again
        finally:
            three.close()


@pytest.mark.timeout(120)
def test_a_silent_member_loses_its_queues_after_its_session(tmp_path: Path) -> None:
    with broker_with_topic(tmp_path) as b:
        one = Member(b.address, start="earliest", session_timeout_ms=1500)
        two = Member(b.address, start="earliest", session_timeout_ms=1500)
        try:
            all_queues = {("g", q) for q in range(4)}
            wait_for(lambda: len(one.assignment()) == 2 and len(two.assignment()) == 2, 20,
                     "the two members to split the queues")
            sent = _send(b.address, 0, 40)
            wait_for(lambda: len(set(one.got + two.got)) >= 40, 30, "40 messages consumed")
            # `two` hangs: no poll, no heartbeat, no leave (as a process stopped dead)
            two.stop_polling()
            two.consumer._stop.set()
            two.consumer._thread.join(10)
            wait_for(lambda: one.assignment() == all_queues, 20,
                     "one to take every queue once two's session ran out")
            sent += _send(b.address, 40, 40)
            wait_for(lambda: set(one.got) >= set(sent[40:]), 30, "the new messages")
            assert set(one.got + two.got) == set(sent)  # at least once: nothing lost
            assert not one.errors and not two.errors
            # `two` wakes with its old positions: the master fences its commits
            one.stop_polling()
            one.consumer.commit()  # everything `one` consumed, committed
            with Consumer([b.address], group="gc") as c:
                before = [c.fetch_offset("g", q) for q in range(4)]
                stale = {q: 0 for q in two.consumer._positions if q[0] == "g"}
                assert stale  # it held queues of g when it hung
                two.consumer._positions.update(stale)
                two.consumer.commit()  # refused queue by queue, no exception
                assert [c.fetch_offset("g", q) for q in range(4)] == before
            # given up, not retried (the group's retry queue, if it held it, was at its commit:
            # nothing to send, nothing fenced)
            assert not [q for q in two.consumer._positions if q[0] == "g"]
        finally:
            one.close()
            two.close()


@pytest.mark.timeout(120)
def test_replog_consume_reads_as_a_group_member(tmp_path: Path) -> None:
    with broker_with_topic(tmp_path) as b:
        sent = _send(b.address, 0, 12)
        # -n stops inside a poll's worth: what it did not print is not committed either
        rc, doc = run_cli("consume", "-s", b.address, "-t", "g", "--group", "cli",
                          "--from", "earliest", "-n", "5", "--idle-s", "5")
        assert rc == 0 and doc["consumed"] == 5
        first = [m["body"].encode() for m in doc["messages"]]
        rc, doc = run_cli("consume", "-s", b.address, "-t", "g", "--group", "cli",
                          "--from", "earliest", "-n", "7", "--idle-s", "5")
        assert rc == 0 and doc["consumed"] == 7
        assert sorted(first + [m["body"].encode() for m in doc["messages"]]) == sent
        # the group committed them: a second run finds nothing new
        rc, doc = run_cli("consume", "-s", b.address, "-t", "g", "--group", "cli",
                          "--from", "earliest", "--idle-s", "1")
        assert rc == 0 and doc["consumed"] == 0


@pytest.mark.timeout(120)
def test_manual_commit_seek_and_rebalance_listeners(tmp_path: Path) -> None:
    """Kafka's controls: with auto_commit off nothing is committed until commit(); seek replays
    a queue; on_revoked / on_assigned name the queues a member gives up and takes."""
    with broker_with_topic(tmp_path) as b:
        sent = _send(b.address, 0, 20)
        events: list[tuple[str, str, list[tuple[str, int]]]] = []

        def listener(who: str, what: str):
            return lambda queues: events.append((who, what, sorted(queues)))

        def read_all(c: GroupConsumer, n: int) -> list[bytes]:
            got: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(got) < n:
                assert time.monotonic() < deadline, f"read {len(got)} of {n}"
                got += [m.body for m in c.poll(timeout_ms=200)]
            return got

        one = GroupConsumer([b.address], "gc", ["g"], heartbeat_ms=200, start="earliest",
                            auto_commit=False, on_assigned=listener("one", "assigned"),
                            on_revoked=listener("one", "revoked"))
        try:
            assert sorted(read_all(one, 20)) == sent
            g_queues = [("g", q) for q in range(4)]
            assert events == [("one", "assigned", sorted([*g_queues, ("%RETRY%gc", 0)]))]
            assert one.position("g", 1) == 5
            one.seek("g", 1, 2)  # replay queue 1 from its third message
            replay = read_all(one, 3)
            assert sorted(replay) == [s for i, s in enumerate(sent) if i % 4 == 1][2:]
            with pytest.raises(ValueError, match="not assigned"):
                one.seek("g", 9, 0)
            with Consumer([b.address], group="gc") as c:  # nothing committed yet
                assert [c.fetch_offset("g", q) for q in range(4)] == [-1] * 4
                one.commit()
                assert [c.fetch_offset("g", q) for q in range(4)] == [5] * 4

            two = GroupConsumer([b.address], "gc", ["g"], heartbeat_ms=200,
                                on_assigned=listener("two", "assigned"))
            try:
                deadline = time.monotonic() + 20
                def g_share(c: GroupConsumer) -> int:
                    return len([q for q in c.assignment() if q[0] == "g"])

                while g_share(one) > 2 or g_share(two) < 2:  # the retry queue: either one
                    assert time.monotonic() < deadline, "the members did not split the queues"
                    one.poll(timeout_ms=100)
                    two.poll(timeout_ms=100)
                given = set(one.assignment()) ^ {*g_queues, ("%RETRY%gc", 0)}
                assert ("one", "revoked", sorted(given)) in events
                assert ("two", "assigned", sorted(given)) in events
            finally:
                two.close()
        finally:
            one.close()
        with Consumer([b.address], group="gc") as c:  # close() committed nothing more
            assert [c.fetch_offset("g", q) for q in range(4)] == [5] * 4


def drain(consumer: GroupConsumer, want: int, timeout_s: float = 20.0) -> list[MessageExt]:
    got: list[MessageExt] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += consumer.poll(timeout_ms=200)
    return got


@pytest.mark.timeout(120)
def test_broadcasting_members_each_read_everything_and_keep_their_own_offsets(
        tmp_path: Path) -> None:
    """RocketMQ's BROADCASTING: two members of one group both get all 12 messages over the 4
    queues; each resumes from its own offsets file after a restart (the broker holds no
    offsets and no members for them); a failed message is not sent back."""
    files = [tmp_path / "a" / "offsets.json", tmp_path / "b" / "offsets.json"]
    with broker_with_topic(tmp_path) as b, Producer([b.address]) as p:
        members = [GroupConsumer([b.address], "bc", ["g"], start="earliest", heartbeat_ms=200,
                                 model="broadcasting", offsets_path=f) for f in files]
        try:
            for i in range(12):
                p.send("g", f"m{i}".encode(), queue_id=i % 4)
            for m in members:
                got = drain(m, 12)
                assert sorted(x.body for x in got) == sorted(f"m{i}".encode() for i in range(12))
                assert m.assignment() == [("g", q) for q in range(4)]
            with pytest.raises(ValueError, match="broadcasting"):
                members[1].reconsume_later(got[-1])
        finally:
            for m in members:
                m.close()
        with Consumer([b.address], group="bc") as c:
            assert [c.fetch_offset("g", q) for q in range(4)] == [-1, -1, -1, -1]
        with Admin([b.address]) as admin:
            assert "bc" not in admin.status()["consumerGroups"]
        for i in range(12, 16):
            p.send("g", f"m{i}".encode(), queue_id=i % 4)
        again = GroupConsumer([b.address], "bc", ["g"], model="broadcasting",
                              offsets_path=files[0])
        try:
            assert sorted(x.body for x in drain(again, 4)) == [b"m12", b"m13", b"m14", b"m15"]
            assert again.poll(timeout_ms=300) == []
        finally:
            again.close()
        rc, out = run_cli("consume", "-s", b.address, "-t", "g", "--group", "bc",
                          "--broadcasting", "--offsets-file", str(files[1]), "--idle-s", "2")
        assert rc == 0 and sorted(m["body"] for m in out["messages"]) == [
            "m12", "m13", "m14", "m15"]
        rc, _ = run_cli("consume", "-s", b.address, "-t", "g", "--group", "bc",
                        "--offsets-file", str(files[1]))
        assert rc == 2  # an offsets file without --broadcasting is bad usage
