"""Malformed replication streams from a test peer (docs/drills.md rows 10-11).

A fake *slave* (a DEALER speaking the HA protocol) against a real master: an ack beyond what
was sent drops the peer (RocketMQ #3015); asking for bytes past the master's max is answered
OFFSET_OUT_OF_RANGE explicitly (#3388); garbage is answered BAD_REQUEST; the master keeps
serving. A fake *master* (a ROUTER) against a real slave: gap, overlap, an epoch going
backwards, a wrong epoch start and a truncated frame are never appended; the slave asks again
from its own max; records cut anywhere between frames are appended (#9002).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from broker_harness import BrokerProcess, brokers, free_port
from helpers.memory import anon_rss
from helpers.zmq_sockets import bounded_socket
from replication_harness import commitlog_digest, wait_for

from common.client import Consumer, Producer, pull_result
from common.core.config import load_config
from common.core.errors import ResponseCode, SendStatus
from common.core.message import Message
from common.format.protocol import RequestCode
from common.ha.epochs import EpochEntry
from common.ha.protocol import (
    Ack,
    Error,
    Hello,
    HelloReply,
    Limits,
    decode,
    encode,
    encode_data,
    encode_header,
)
from common.store.message_store import MessageStore

pytestmark = pytest.mark.integration

LIMITS = Limits()
RECV_TIMEOUT_MS = 5000


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    c: zmq.Context[Any] = zmq.Context()
    try:
        yield c
    finally:
        c.destroy(linger=0)


def recv(sock: zmq.Socket[Any]) -> list[bytes]:
    assert sock.poll(RECV_TIMEOUT_MS), "no frame from the peer in time"
    return sock.recv_multipart()


# ---- a fake slave against a real master --------------------------------------------------------
def fake_slave(ctx: zmq.Context[Any], master: BrokerProcess) -> zmq.Socket[Any]:
    s = bounded_socket(ctx, zmq.DEALER)
    s.connect(f"tcp://127.0.0.1:{master.port + 1}")
    return s


def hello(session: int, max_phy_offset: int, epochs: tuple[EpochEntry, ...] = ()) -> bytes:
    return encode_header(Hello(session, "broker-a", 7, max_phy_offset, "fake:1", epochs))


@pytest.mark.timeout(60)
def test_master_drops_a_peer_acking_beyond_what_it_sent(tmp_path: Path, ctx: Any) -> None:
    master = BrokerProcess(tmp_path / "m", brokerRole="ASYNC_MASTER")
    with brokers(master):
        with Producer([master.address], retries=0) as p:
            assert p.send("t", b"x" * 100).status == SendStatus.SEND_OK
        peer = fake_slave(ctx, master)
        peer.send(hello(1, 0))
        reply = decode(recv(peer), LIMITS)
        assert isinstance(reply, HelloReply) and reply.start_phy_offset == 0
        wait_for(lambda: master.status()["slaves"], 5, "the fake slave to be listed")
        max_phy = master.status()["maxPhyOffset"]
        peer.send(encode_header(Ack(1, max_phy + 1_000_000)))
        while True:  # DATA frames of the handshake may come first
            frame = decode(recv(peer), LIMITS)
            if isinstance(frame, Error):
                break
        assert frame.code == ResponseCode.BAD_REQUEST and "impossible ack" in frame.reason
        wait_for(lambda: not master.status()["slaves"], 5, "the master to drop the peer")
        with Producer([master.address], retries=0) as p:
            assert p.send("t", b"still serving").status == SendStatus.SEND_OK


@pytest.mark.timeout(60)
def test_master_answers_out_of_range_explicitly(tmp_path: Path, ctx: Any) -> None:
    master = BrokerProcess(tmp_path / "m", brokerRole="ASYNC_MASTER")
    with brokers(master):
        with Producer([master.address], retries=0) as p:
            assert p.send("t", b"x" * 100).status == SendStatus.SEND_OK
        max_phy = master.status()["maxPhyOffset"]
        peer = fake_slave(ctx, master)
        peer.send(hello(5, max_phy + 4096, (EpochEntry(1, 0),)))  # ahead, same epoch
        frame = decode(recv(peer), LIMITS)
        assert isinstance(frame, Error) and frame.code == ResponseCode.OFFSET_OUT_OF_RANGE
        assert frame.session == 5 and frame.phy_offset == max_phy
        assert not master.status()["slaves"]


@pytest.mark.timeout(60)
def test_master_refuses_garbage_and_keeps_serving(tmp_path: Path, ctx: Any) -> None:
    master = BrokerProcess(tmp_path / "m", brokerRole="ASYNC_MASTER")
    with brokers(master):
        peer = fake_slave(ctx, master)
        for junk in (b"", b"\xc1", b"\x93\x04", hello(1, 0)[:-3], b"\x92\x01\x02"):
            peer.send(junk)
            frame = decode(recv(peer), LIMITS)
            assert isinstance(frame, Error) and frame.code == ResponseCode.BAD_REQUEST
        peer.send_multipart([hello(2, 0), b"extra frame"])
        frame = decode(recv(peer), LIMITS)
        assert isinstance(frame, Error) and frame.code == ResponseCode.BAD_REQUEST
        peer.send(hello(3, 0))  # and a valid handshake afterwards works
        assert isinstance(decode(recv(peer), LIMITS), HelloReply)
        with Producer([master.address], retries=0) as p:
            assert p.send("t", b"ok").status == SendStatus.SEND_OK


@pytest.mark.timeout(120)
def test_master_bounds_a_whole_message_before_keeping_it(tmp_path: Path, ctx: Any) -> None:
    """Issue 36 item 11 on the HA port: each frame was bounded (MAXMSGSIZE), their number not,
    and libzmq keeps a whole message before it can be read. 300 000 frames of 1 000 bytes
    (300 MB) in one message: read and dropped as they arrive, answered BAD_REQUEST, and the
    same connection is served on."""
    master = BrokerProcess(tmp_path / "m", brokerRole="ASYNC_MASTER")
    with brokers(master):
        before = anon_rss(master.pid)
        peer = fake_slave(ctx, master)
        peer.setsockopt(zmq.SNDTIMEO, 30_000)
        peer.send(hello(1, 0), zmq.SNDMORE)
        frame = b"f" * 1000
        peak = before
        for i in range(300_000):
            peer.send(frame, zmq.SNDMORE if i < 299_999 else 0)
            if i % 20_000 == 0:
                peak = max(peak, anon_rss(master.pid))
        deadline = time.monotonic() + 60
        while not peer.poll(20) and time.monotonic() < deadline:
            peak = max(peak, anon_rss(master.pid))
        assert peak - before < 64 * 1024 * 1024, (before, peak)
        error = decode(recv(peer), LIMITS)
        assert isinstance(error, Error) and error.code == ResponseCode.BAD_REQUEST, error
        assert "more than 2 frames" in error.reason
        peer.send(hello(2, 0))
        assert isinstance(decode(recv(peer), LIMITS), HelloReply)


# ---- a fake master against a real slave --------------------------------------------------------
@pytest.fixture
def log_bytes(tmp_path: Path) -> bytes:
    """Real CommitLog records (20 messages) written by a store of our own."""
    cfg = load_config(
        None,
        (),
        env={},
        storePathRootDir=str(tmp_path / "src"),
        mappedFileSizeCommitLog=1024 * 1024,
    )
    store = MessageStore(cfg)
    store.start()
    try:
        for i in range(20):
            store.put(Message("t", f"message-{i}".encode() * 10), 0)
        return store.read_committed(0, store.max_phy_offset)
    finally:
        store.shutdown()


class FakeMaster:
    def __init__(self, ctx: zmq.Context[Any]):
        self.port = free_port(1)
        self.sock = bounded_socket(ctx, zmq.ROUTER)
        self.sock.bind(f"tcp://127.0.0.1:{self.port}")
        self.peer = b""
        self.session = -1

    def expect_hello(self) -> Hello:
        """The next HELLO (acks before it are skipped); remembers its peer and session."""
        while True:
            peer, *frames = recv(self.sock)
            frame = decode(frames, LIMITS)
            if isinstance(frame, Hello):
                self.peer, self.session = peer, frame.session
                return frame

    def reply(self, epochs: tuple[EpochEntry, ...], max_phy: int, start: int) -> None:
        r = HelloReply(self.session, epochs[-1].epoch, 0, max_phy, start, epochs)
        self.sock.send_multipart([self.peer, *encode(r)])

    def data(self, epoch: EpochEntry, phy_offset: int, raw: bytes) -> None:
        frames = encode_data(self.session, epoch.epoch, epoch.start_phy_offset, phy_offset, raw)
        self.sock.send_multipart([self.peer, *frames])

    def expect_ack(self, ack_offset: int) -> None:
        while True:
            _peer, *frames = recv(self.sock)
            frame = decode(frames, LIMITS)
            if isinstance(frame, Ack) and frame.ack_offset == ack_offset:
                return


@pytest.mark.timeout(90)
def test_slave_never_appends_out_of_place(tmp_path: Path, ctx: Any, log_bytes: bytes) -> None:
    fake = FakeMaster(ctx)
    slave = BrokerProcess(
        tmp_path / "s",
        brokerRole="SLAVE",
        brokerId=1,
        haMasterAddress=f"127.0.0.1:{fake.port}",
        mappedFileSizeCommitLog=1024 * 1024,
    )
    e1, e2 = EpochEntry(1, 0), EpochEntry(2, 700)
    total = len(log_bytes)
    assert total > 1500
    with brokers(slave):
        first = fake.expect_hello()
        assert first.max_phy_offset == 0
        fake.reply((e1, e2), total, 0)
        # records cut anywhere between frames are appended as a byte stream (#9002)
        cuts = [0, 37, 400, 700, 1100]
        for a, b in itertools.pairwise(cuts):
            fake.data(e1 if a < 700 else e2, a, log_bytes[a:b])
        fake.expect_ack(1100)
        held = 1100

        def refused(send_bad: Any, what: str) -> None:
            send_bad()
            again = fake.expect_hello()  # the slave asks again, from its own max
            assert again.max_phy_offset == held, what
            assert slave.status()["maxPhyOffset"] == held, what
            fake.reply((e1, e2), total, held)

        refused(lambda: fake.data(e2, held + 100, log_bytes[held + 100 : held + 200]), "gap")
        refused(lambda: fake.data(e2, held - 10, log_bytes[held - 10 : held + 90]), "overlap")
        refused(lambda: fake.data(e1, held, log_bytes[held : held + 100]), "epoch backwards")
        refused(
            lambda: fake.data(EpochEntry(2, 600), held, log_bytes[held : held + 100]),
            "wrong epoch start",
        )
        refused(
            lambda: fake.data(EpochEntry(3, 800), held, log_bytes[held : held + 100]),
            "a new epoch not starting at its first frame",
        )

        def truncated() -> None:  # header says 100 bytes, the raw frame has 50
            header = encode_data(fake.session, 2, 700, held, log_bytes[held : held + 100])[0]
            fake.sock.send_multipart([fake.peer, header, log_bytes[held : held + 50]])

        refused(truncated, "truncated frame")
        # the rest, correctly, completes the log; the slave's bytes equal the source
        fake.data(e2, held, log_bytes[held:])
        fake.expect_ack(total)
        seg = 1024 * 1024
        assert commitlog_digest(slave.store_root, 0, total, seg) == commitlog_digest(
            tmp_path / "src", 0, total, seg
        )
        with Consumer([slave.address], retries=0) as c:  # straight to the slave: no master
            fields = {
                "topic": "t",
                "queueId": 0,
                "queueOffset": 0,
                "maxNums": 64,
                "group": "g",
                "suspendMs": 0,
            }

            def all_pulled() -> list[bytes] | None:
                resp = c._transport.call_sync(slave.address, RequestCode.PULL, fields, [], 5000)
                pr = pull_result(resp)
                bodies = [m.body for m in pr.messages]
                return bodies if len(bodies) == 20 else None

            bodies = wait_for(all_pulled, 10, "the slave to serve the 20 replicated messages")
        assert bodies == [f"message-{i}".encode() * 10 for i in range(20)]
        assert "event=ha_client_resync_from_store" not in slave.log_path.read_text()
