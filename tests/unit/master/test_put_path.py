"""The master's native put path (master/put_path.py, common/format/_put_path.c) against the
Python path it stands in for: the same requests through each, into two stores, leave the same
CommitLog bytes, queue offsets, digests for reput and answers, byte for byte; every request
the native path does not take whole is left untouched for the Python path; and through a real
broker the two serve a mixed stream alike."""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from helpers.stores import make_store

from common.broker.broker import Broker
from common.broker.replies import Deferred
from common.broker.tables import MESSAGE_TYPE, TopicTable
from common.client import Admin, Consumer, Producer
from common.core import timer, transaction
from common.core.config import load_config
from common.core.errors import BrokerError, PutStatus, ResponseCode
from common.core.message import PROPERTY_SHARDING_KEY
from common.format import zmtp
from common.format.protocol import (
    PROTOCOL_VERSION,
    Limits,
    RequestCode,
    Response,
    decode_record,
    decode_request,
    encode_response,
)
from common.store import commit_log as commit_log_module
from common.store.message_store import MessageStore
from master import put_path
from master.group_transfer import GroupTransfer
from master.role import MasterRole

pytestmark = [
    pytest.mark.unit,
    pytest.mark.timeout(60),
    pytest.mark.skipif(not put_path.enabled(), reason="the native put path is not built"),
]

TS = 1_764_000_000_123
PEER = ("10.1.2.3", 40123)
IDENTITY = b"\x00\x00\x00\x00\x07"
TOPICS = {"orders": 4, "audit": 1, "fifo": 2}
ROOM = 1000  # requests the server has room for in flight


def send_frames(opaque: int, fields: dict[str, Any], body: bytes,
                code: int = RequestCode.SEND) -> list[bytes]:
    return [msgpack.packb([PROTOCOL_VERSION, int(code), opaque, fields]), body]


class Side:
    """A store, its topic table and an ASYNC_MASTER on it."""

    def __init__(self, root: Path, crc: bool, sync: bool = False):
        crc_keys = {"enabledAppendPropCRC": crc, "forceVerifyPropCRC": crc}
        self.store: MessageStore = make_store(root, mappedFileSizeCommitLog=64 * 1024,
                                              **crc_keys)
        self.cfg = load_config(None, (), env={}, storePathRootDir=str(root), **crc_keys)
        (root / "config").mkdir(exist_ok=True)
        self.topics = TopicTable(root / "config")
        for name, nums in TOPICS.items():
            self.topics.create(name, nums, {MESSAGE_TYPE: "FIFO"} if name == "fifo" else None)
        self.in_sync = 1
        self.clock = [100.0]
        self.waits = GroupTransfer(self.cfg, lambda: self.in_sync, lambda: self.clock[0]) \
            if sync else None
        self.role = MasterRole(self.cfg, self.store, self.topics,
                               "SYNC_MASTER" if sync else "ASYNC_MASTER", self.waits)
        path = self.role.put_path
        assert path is not None
        self.path: put_path.PutPath = path
        self.path.fixed_ts = TS
        self.limits = Limits()
        self.peers = {IDENTITY: PEER}
        cl = self.store.commit_log
        self.digest_log: list[Any] = []  # every digest left for reput, before reput takes it
        cl.digests = Recording(self.digest_log, maxlen=cl.digests.maxlen)

    def python(self, frames: list[bytes]) -> Any:
        """One request by the Python path (what the server's _serve does for a SEND): the
        answer's bytes, or (SYNC_MASTER) what the role holds."""
        req = decode_request(frames, self.limits)
        req = req._replace(born_host=PEER)
        resp = self.role.send(req) if req.code == RequestCode.SEND else self.role.send_batch(req)
        return wire(resp) if isinstance(resp, Response) else resp

    def native(self, burst: list[tuple[bytes, list[bytes]]]) -> tuple[list[bytes], int]:
        """The burst as the server serves it: runs by the native path, the rest by Python's;
        the answers in order, and how many the native path took."""
        answers: list[bytes] = []
        i, taken = 0, 0
        while i < len(burst):
            nxt, done, _messages = self.path.take(burst, i, self.peers, self.limits, ROOM)
            answers.extend(data for _identity, data in done)
            taken += len(done)
            assert len(done) == nxt - i
            i = nxt
            if i < len(burst):
                answers.append(self.python(burst[i][1]))
                i += 1
        return answers, taken

    def log_bytes(self) -> bytes:
        cl = self.store.commit_log
        return cl.read(cl.min_offset, cl.max_offset - cl.min_offset)

    def digests(self) -> list[Any]:
        return list(self.digest_log)

    def queues(self) -> dict[tuple[str, int], list[Any]]:
        """Every queue's entries once reput has dispatched the whole log."""
        assert self.store.wait_dispatched(self.store.max_phy_offset, 10)
        return {(topic, q): [(m.queue_offset, m.commit_log_offset, m.store_size)
                             for m in self.store.get_message("g", topic, q, 0, 1000).messages()]
                for topic, nums in TOPICS.items() for q in range(nums)}


class Recording(collections.deque):  # type: ignore[type-arg]
    """The CommitLog's digest deque, keeping a copy of every digest appended."""

    def __init__(self, log: list[Any], maxlen: int | None):
        super().__init__(maxlen=maxlen)
        self.log = log

    def append(self, item: Any) -> None:
        self.log.append(item)
        super().append(item)


def wire(resp: Response) -> bytes:
    return zmtp.encode(encode_response(resp.code, resp.opaque, resp.remark, resp.fields,
                                       resp.bodies))


@pytest.fixture
def sides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(commit_log_module, "now_ms", lambda: TS)
    made: list[Side] = []

    def make(name: str, crc: bool = True, sync: bool = False) -> Side:
        side = Side(tmp_path / name, crc, sync)
        made.append(side)
        return side

    yield make
    for side in made:
        side.store.shutdown()


def batch_frames(opaque: int, fields: dict[str, Any], bodies: list[bytes]) -> list[bytes]:
    fields = {**fields, "sizes": [len(b) for b in bodies]}
    return [msgpack.packb([PROTOCOL_VERSION, int(RequestCode.SEND_BATCH), opaque, fields]),
            b"".join(bodies)]


def random_send(rng: random.Random, opaque: int) -> list[bytes]:
    topic = rng.choice(["orders", "audit", "fifo"])
    if topic != "fifo" and rng.random() < 0.2:  # a batch: bodies alone, or with meta
        bodies = [rng.randbytes(rng.choice([0, 7, 128, 900])) for _ in range(rng.randrange(1, 9))]
        batch: dict[str, Any] = {"topic": topic, "queueId": rng.randrange(TOPICS[topic]),
                                 "bornTimestamp": TS - rng.randrange(10_000)}
        if rng.random() < 0.3:
            batch["meta"] = [["T", None, {"a": "1"}, 0] for _ in bodies]
        return batch_frames(opaque, batch, bodies)
    fields: dict[str, Any] = {"topic": topic, "queueId": rng.randrange(TOPICS[topic]),
                              "bornTimestamp": TS - rng.randrange(10_000)}
    if rng.random() < 0.4:
        fields["tags"] = rng.choice(["A", "", "tag-é", "x" * 50])
    if rng.random() < 0.3:
        fields["keys"] = rng.choice(["k1", "k1 k2", "ключ"])
    props = {}
    if rng.random() < 0.4 or topic == "fifo":
        for _ in range(rng.randrange(4)):
            props[rng.choice(["a", "b", "TAGS", "KEYS", "UNIQ_KEY", "名"])] = rng.choice(
                ["1", "", "värde", "v" * 300])
    if topic == "fifo":
        props[PROPERTY_SHARDING_KEY] = f"g{rng.randrange(3)}"
    if props:
        fields["properties"] = props
    if rng.random() < 0.2:
        fields["flag"] = rng.randrange(-2**31, 2**31)
    if rng.random() < 0.1:
        fields["sysFlag"] = 1  # COMPRESSED, as a producer may set it
    body = rng.randbytes(rng.choice([0, 1, 128, 1000, 3000]))
    return send_frames(opaque, fields, body)


@pytest.mark.parametrize("crc", [True, False])
def test_the_same_bytes_offsets_digests_and_answers(sides: Any, crc: bool) -> None:
    rng = random.Random(43 + crc)
    native, python = sides("native", crc), sides("python", crc)
    burst = [(IDENTITY, random_send(rng, opaque)) for opaque in range(300)]
    answers, taken = native.native(burst)
    expected = [python.python(frames) for _identity, frames in burst]
    assert taken > 250  # a segment's end goes to the Python path: it rolls the segment
    assert answers == expected
    assert native.log_bytes() == python.log_bytes()
    assert native.store.commit_log.topic_queue_table == python.store.commit_log.topic_queue_table
    assert native.digests() == python.digests() and native.digests()
    assert native.queues() == python.queues()
    assert native.store.commit_log.last_store_timestamp == TS
    assert native.store.puts == python.store.puts > 300  # batches hold several
    assert native.path.messages > native.path.taken  # batches taken natively too


def declined_requests() -> list[tuple[str, list[bytes]]]:
    base = {"topic": "orders", "queueId": 0, "bornTimestamp": TS}
    return [
        ("delay level", send_frames(1, {**base, "delayLevel": 2}, b"x")),
        ("delay property", send_frames(2, {**base, "properties": {"DELAY": "2"}}, b"x")),
        ("prepared", send_frames(3, {**base, "sysFlag": 4,
                                     "properties": {transaction.TRAN_MSG: "true"}}, b"x")),
        ("timer", send_frames(4, {**base, "properties": {timer.TIMER_DELAY_SEC: "5"}}, b"x")),
        ("broker only", send_frames(5, {**base, "properties": {timer.TIMER_OUT_MS: "5"}},
                                    b"x")),
        ("system topic", send_frames(6, {**base, "topic": "rmq_sys_wheel_timer"}, b"x")),
        ("unknown topic", send_frames(7, {**base, "topic": "nope"}, b"x")),
        ("queue past the topic's", send_frames(8, {**base, "queueId": 4}, b"x")),
        ("FIFO without a group", send_frames(9, {**base, "topic": "fifo"}, b"x")),
        ("another code", send_frames(10, {"topic": "orders", "queueId": 0, "offset": 0,
                                          "maxMsgNums": 1}, b"", RequestCode.PULL)[:1]),
        ("a response", [msgpack.packb([PROTOCOL_VERSION, 0, 11, "", {}])]),
        ("malformed", send_frames(12, {**base, "queueId": -1}, b"x")),
        ("body too large", send_frames(13, base, b"x" * (4 * 1024 * 1024 + 1))),
        ("properties too long", send_frames(14, {**base, "properties": {"p": "v" * 32760}},
                                            b"x")),
        ("batch with meta", batch_frames(15, {**base, "meta": [["T", None, None, 0]]}, [b"x"])),
        ("batch to a FIFO topic", batch_frames(16, {**base, "topic": "fifo"}, [b"x"])),
        ("batch past its sizes", [batch_frames(17, base, [b"xy"])[0], b"x"]),
        ("batch body too large", batch_frames(18, base, [b"x", b"y" * (4 * 1024 * 1024 + 1)])),
        ("batch past the segment", batch_frames(19, base, [b"z" * 40_000, b"z" * 40_000])),
        # a property separator would add properties of the sender's choosing
        ("tags with a separator", send_frames(20, {**base, "tags": "t\x02REAL_TOPIC\x01v"},
                                              b"x")),
        ("keys with a separator", send_frames(21, {**base, "keys": "k\x01"}, b"x")),
        ("batch tags with a separator", batch_frames(22, {**base, "meta": [
            ["t\x02__TIMER_TICK\x014102444800000", None, None, 0]]}, [b"x"])),
        # an index key of the broker's own would hide the record its look-up looks for
        ("keys a delivery mark", send_frames(23, {**base, "keys": "a __TIMER_SRC4096"}, b"x")),
        ("UNIQ_KEY a transaction's origin", send_frames(24, {**base, "properties": {
            "UNIQ_CLIENT_MESSAGE_ID_KEYIDX": "__TRAN_HALF0"}}, b"x")),
    ]


@pytest.mark.parametrize("name,frames", declined_requests(), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_what_the_native_path_leaves_to_python(sides: Any, name: str,
                                               frames: list[bytes]) -> None:
    side = sides("native")
    plain = (IDENTITY, send_frames(100, {"topic": "orders", "queueId": 1, "bornTimestamp": TS},
                                   b"plain"))
    before = side.log_bytes()
    burst = [(IDENTITY, frames), plain]
    assert side.path.take(burst, 0, side.peers, side.limits, ROOM) == (0, [], 0)
    assert side.log_bytes() == before and side.digests() == []
    # after a plain one, the run stops at it: the plain one taken, nothing of it changed
    nxt, answers, messages = side.path.take([plain, (IDENTITY, frames)], 0, side.peers,
                                            side.limits, ROOM)
    assert (nxt, len(answers), messages) == (1, 1, 1)
    assert side.store.commit_log.topic_queue_table == {("orders", 1): 1}


def test_a_request_that_is_not_a_put_costs_no_call(sides: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A pull between the puts of a burst is the Python path's at once: no lock, no C call."""
    side = sides("native")
    calls: list[Any] = []
    monkeypatch.setattr(put_path, "put_sends", lambda *args: calls.append(args))
    pull = send_frames(1, {"topic": "orders", "queueId": 0, "offset": 0, "maxMsgNums": 1}, b"",
                       RequestCode.PULL)[:1]
    assert side.path.take([(IDENTITY, pull)], 0, side.peers, side.limits, ROOM) == (0, [], 0)
    assert calls == [] and side.path.declined_errors == 0


def test_a_peer_without_an_address_is_left_to_python(sides: Any) -> None:
    side = sides("native")
    frames = send_frames(1, {"topic": "orders", "queueId": 0}, b"x")
    gone = [(b"\x00gone", frames)]
    assert side.path.take(gone, 0, side.peers, side.limits, ROOM) == (0, [], 0)


def test_the_clock_stamps_a_send_without_a_born_time(sides: Any) -> None:
    side = sides("native")
    side.path.fixed_ts = 0
    before = int(time.time() * 1000)
    frames = send_frames(1, {"topic": "audit", "queueId": 0}, b"now")
    nxt, _answers, _messages = side.path.take([(IDENTITY, frames)], 0, side.peers,
                                              side.limits, ROOM)
    after = int(time.time() * 1000)
    assert nxt == 1
    stored = decode_record(side.log_bytes())
    assert before <= stored.born_timestamp <= after
    assert before <= stored.store_timestamp <= after
    assert stored.born_host == f"{PEER[0]}:{PEER[1]}" and stored.body == b"now"


def test_a_new_topic_is_learnt_when_the_table_changes(sides: Any) -> None:
    side = sides("native")
    frames = send_frames(1, {"topic": "later", "queueId": 2, "bornTimestamp": TS}, b"x")
    assert side.path.take([(IDENTITY, frames)], 0, side.peers, side.limits, ROOM)[0] == 0
    side.topics.create("later", 3)
    assert side.path.take([(IDENTITY, frames)], 0, side.peers, side.limits, ROOM)[0] == 1
    side.topics.create("later", 3, {MESSAGE_TYPE: "FIFO"})  # now it needs a message group
    assert side.path.take([(IDENTITY, frames)], 0, side.peers, side.limits, ROOM)[0] == 0


def test_a_queue_table_replaced_by_an_equal_one_is_the_one_written(sides: Any) -> None:
    """A promotion rebuilds the CommitLog's queue table as a new dict, often equal to the old:
    the path must advance the table the CommitLog holds now, not the one it saw first."""
    side = sides("native")
    cl = side.store.commit_log
    first = send_frames(1, {"topic": "audit", "queueId": 0, "bornTimestamp": TS}, b"a")
    assert side.path.take([(IDENTITY, first)], 0, side.peers, side.limits, ROOM)[0] == 1
    old = cl.topic_queue_table
    cl.topic_queue_table = dict(old)  # equal, not the same
    second = send_frames(2, {"topic": "audit", "queueId": 0, "bornTimestamp": TS}, b"b")
    _nxt, answers, _messages = side.path.take([(IDENTITY, second)], 0, side.peers,
                                              side.limits, ROOM)
    assert cl.topic_queue_table == {("audit", 0): 2} and old == {("audit", 0): 1}
    assert msgpack.unpackb(answers[0][1][2:])[4]["queueOffset"] == 1


def test_a_store_that_refuses_writes_leaves_every_put_to_python(sides: Any) -> None:
    side = sides("native")
    side.store.commit_log.writeable = False
    frames = send_frames(1, {"topic": "audit", "queueId": 0, "bornTimestamp": TS}, b"x")
    one = [(IDENTITY, frames)]
    assert side.path.take(one, 0, side.peers, side.limits, ROOM) == (0, [], 0)


def test_a_master_with_async_flush_has_one(tmp_path: Path) -> None:
    store = make_store(tmp_path / "s")
    try:
        (tmp_path / "c").mkdir()
        topics = TopicTable(tmp_path / "c")
        cfg = load_config(None, (), env={}, storePathRootDir=str(tmp_path / "s"))
        assert MasterRole(cfg, store, topics, "ASYNC_MASTER").put_path is not None
        assert MasterRole(cfg, store, topics, "SYNC_MASTER").put_path is None  # no waits
        waits = GroupTransfer(cfg, lambda: 1)
        assert MasterRole(cfg, store, topics, "SYNC_MASTER", waits).put_path is not None
        sync_flush = load_config(None, (), env={}, storePathRootDir=str(tmp_path / "s"),
                                 flushDiskType="SYNC_FLUSH")
        assert MasterRole(sync_flush, store, topics, "ASYNC_MASTER").put_path is None
    finally:
        store.shutdown()


def test_answers_decode_as_send_ok(sides: Any) -> None:
    side = sides("native")
    frames = send_frames(9, {"topic": "orders", "queueId": 3, "bornTimestamp": TS}, b"x")
    _nxt, answers, _messages = side.path.take([(IDENTITY, frames)], 0, side.peers,
                                              side.limits, ROOM)
    raw = answers[0][1]  # one ZMTP frame, short and last: flags 0, its length, the header
    assert raw[0] == 0 and len(raw) == 2 + raw[1] and msgpack.unpackb(raw[2:]) == [
        PROTOCOL_VERSION, int(ResponseCode.SUCCESS), 9, "",
        {"queueId": 3, "queueOffset": 0, "commitLogOffset": 0,
         "storeHost": side.role.put_path._store_host},  # type: ignore[union-attr]
    ]


def test_a_broker_serves_plain_sends_natively_and_the_rest_in_python(
        make_broker: Callable[..., Broker]) -> None:
    broker = make_broker(real_store=True)
    address = f"127.0.0.1:{broker.cfg.listenPort}"
    with Admin([address]) as admin:
        admin.create_topic("mixed", 2)
    with Producer([address]) as producer, Consumer([address]) as consumer:
        sent = [producer.send("mixed", b"plain-%d" % i, tags="T" if i % 2 else None,
                              queue_id=i % 2) for i in range(40)]
        delayed = producer.send("mixed", b"later", delay_level=1, queue_id=0)
        with pytest.raises(BrokerError) as refused:
            producer.send("mixed", b"x", queue_id=0, properties={timer.TIMER_OUT_MS: "1"})
        assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL
        path = broker.roles.role.put_path  # type: ignore[union-attr]
        assert path is not None and path.taken >= 40
        assert delayed.status.name == "SEND_OK"
        got = consumer.pull("mixed", 1, 0, 64)
        assert [m.body for m in got.messages] == [b"plain-%d" % i for i in range(1, 40, 2)]
        assert all(m.tags == "T" for m in got.messages)
        assert [s.queue_offset for s in sent[1::2]] == list(range(20))
    assert broker.server.stats.put_msgs.total >= 41


def plain_sends(count: int) -> list[tuple[bytes, list[bytes]]]:
    return [(IDENTITY, send_frames(i, {"topic": "orders", "queueId": i % 4, "bornTimestamp": TS},
                                   b"m%d" % i)) for i in range(count)]


def test_a_sync_master_holds_a_run_until_its_slave_has_it(sides: Any) -> None:
    native, python = sides("native", sync=True), sides("python", sync=True)
    burst = plain_sends(5)
    nxt, held, messages = native.path.take(burst, 0, native.peers, native.limits, ROOM)
    assert (nxt, messages) == (5, 5) and isinstance(held, Deferred)
    expected = [python.python(frames) for _identity, frames in burst]
    assert native.log_bytes() == python.log_bytes()
    assert native.waits is not None and python.waits is not None
    assert native.waits.pending == 1 and python.waits.pending == 5  # a run waits as one put
    end = native.store.commit_log.max_offset
    native.waits.report_quorum(end - 1)  # short of the run's last byte: nothing answered
    assert native.waits.poll() == []
    native.waits.report_quorum(end)
    python.waits.report_quorum(end)
    (answer,) = native.waits.poll()
    assert answer[0] is held and held.run_messages == 5
    assert [raw for _identity, raw in held.run or ()] == [
        wire(resp) for _put, resp in python.waits.poll()] == [
        wire(put.reply(PutStatus.PUT_OK)) for put in expected]


@pytest.mark.parametrize("ending", ["timeout", "no slave"])
def test_a_sync_run_that_ends_otherwise_is_answered_as_the_python_path_answers(
        sides: Any, ending: str) -> None:
    native, python = sides("native", sync=True), sides("python", sync=True)
    burst = plain_sends(3)
    if ending == "no slave":
        native.in_sync = python.in_sync = 0
    _nxt, held, _messages = native.path.take(burst, 0, native.peers, native.limits, ROOM)
    expected = [python.python(frames) for _identity, frames in burst]
    assert native.waits is not None and python.waits is not None
    if ending == "timeout":
        assert isinstance(held, Deferred)
        native.clock[0] = python.clock[0] = 100.0 + native.cfg.slaveTimeout / 1000 + 1
        ((run, _resp),) = native.waits.poll()
        answers = run.run
        python_answers = [wire(resp) for _put, resp in python.waits.poll()]
    else:  # SLAVE_NOT_AVAILABLE at once: answers, nothing held
        answers = held
        python_answers = expected
    assert [raw for _identity, raw in answers] == python_answers
    status = msgpack.unpackb(python_answers[0][2:])[1]
    assert status == int(ResponseCode.FLUSH_SLAVE_TIMEOUT if ending == "timeout"
                         else ResponseCode.SLAVE_NOT_AVAILABLE)


def test_a_sync_run_takes_no_more_than_the_servers_room(sides: Any) -> None:
    side = sides("native", sync=True)
    nxt, held, messages = side.path.take(plain_sends(5), 0, side.peers, side.limits, 2)
    assert (nxt, messages) == (2, 2) and isinstance(held, Deferred) and len(held.run or ()) == 2
    assert side.path.take(plain_sends(5), 0, side.peers, side.limits, 0)[0] == 0


def test_a_local_call_send_is_taken_natively(make_broker: Callable[..., Broker]) -> None:
    """The gRPC front end's sends (local calls on the caller's thread) take the same path:
    the answer handed back as a Response, the record stamped with the local born host."""
    broker = make_broker(real_store=True)
    with Admin([f"127.0.0.1:{broker.cfg.listenPort}"]) as admin:
        admin.create_topic("local", 1)
    path = broker.roles.role.put_path  # type: ignore[union-attr]
    assert path is not None
    broker.server.local.born_host = ("10.9.8.7", 4321)
    answers: list[Any] = []
    for i in range(20):
        done = threading.Event()

        def answer(resp: Any, done: threading.Event = done) -> None:
            answers.append(resp)
            done.set()

        broker.server.local.call(lambda opaque, i=i: send_frames(
            opaque, {"topic": "local", "queueId": 0}, b"local-%d" % i), answer)
        assert done.wait(5)
    assert [a.code for a in answers] == [ResponseCode.SUCCESS] * 20
    assert [a.fields["queueOffset"] for a in answers] == list(range(20))
    assert path.taken == 20  # served on the caller's thread or, posted, on the loop's
    stored = broker.store.find_message(answers[-1].fields["commitLogOffset"])
    assert stored.body == b"local-19" and stored.born_host == "10.9.8.7:4321"
