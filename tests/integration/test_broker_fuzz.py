"""docs/drills.md row 9 against a live broker: malformed frames over one client socket.

Replays the fixed corpus of ``tests/property/test_protocol_fuzz.py`` plus 2 500 seeded random bad
frames (random bytes, random msgpack values, mutations of a valid request). Every frame must get
a typed error answer, except a first frame over ``maxFrameBytes``, which is dropped as it
arrives with nothing to answer. Afterwards: the same PID, RSS growth < 16 MB, and the next valid
send succeeds.

Then the bounds on a whole message (``common/broker/tcp_port.py``): a message of 160 frames of
4 MiB leaves the broker's memory as it was and is answered; a peer that is not ZMTP, or that
never finishes its greeting, is disconnected.
"""

from __future__ import annotations

import importlib.util
import os
import random
import socket
import time
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest
import zmq
from broker_harness import BrokerProcess, brokers
from helpers.memory import anon_rss
from helpers.zmq_sockets import bounded_socket

from common.client import Producer
from common.core.errors import ResponseCode, SendStatus
from common.format.protocol import (
    PROTOCOL_VERSION,
    Limits,
    RequestCode,
    decode_response,
    encode_request,
)

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("REPLOG_FUZZ_SEED", "20260421"))
RANDOM_FRAMES = 2500
RSS_GROWTH_LIMIT = 16 * 1024 * 1024
ERROR_CODES = {
    ResponseCode.BAD_REQUEST,
    ResponseCode.MESSAGE_ILLEGAL,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
    ResponseCode.VERSION_NOT_SUPPORTED,
}


def _corpus() -> list[tuple[str, list[bytes]]]:
    path = Path(__file__).resolve().parents[1] / "property" / "test_protocol_fuzz.py"
    spec = importlib.util.spec_from_file_location("replog_protocol_fuzz", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    limits = Limits(max_frame_bytes=1024 * 1024, max_body_bytes=256 * 1024, max_batch_count=64)
    return [(label, frames) for label, frames in module.fixed_corpus(limits) if frames]


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rng.randrange(-(1 << 63), 1 << 64)
    if kind == 1:
        return rng.choice([None, True, False, 1.5, float("nan")])
    if kind == 2:
        return "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randrange(20)))
    if kind == 3:
        return rng.randbytes(rng.randrange(20))
    if kind == 4:
        return rng.choice(["topic", "queueId", "queueOffset", "maxNums", "meta", "msgId"])
    if kind in (5, 6):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {
        str(_random_value(rng, depth + 1))[:10]: _random_value(rng, depth + 1)
        for _ in range(rng.randrange(5))
    }


def random_frames(rng: random.Random) -> list[bytes]:
    valid = encode_request(RequestCode.SEND, 1, {"topic": "fuzz", "queueId": 0}, [b"body"])
    choice = rng.randrange(4)
    if choice == 0:
        return [rng.randbytes(rng.randrange(1, 200)) for _ in range(rng.randrange(1, 4))]
    if choice == 1:
        return [msgpack.packb(_random_value(rng))]
    if choice == 2:
        code = rng.choice([int(c) for c in RequestCode] + [0, 7777])
        fields = {
            rng.choice(["topic", "queueId", "queueOffset", "group", "x"]): _random_value(rng)
            for _ in range(rng.randrange(4))
        }
        return [msgpack.packb([PROTOCOL_VERSION, code, rng.randrange(1 << 20), fields])]
    header = bytearray(valid[0])
    for _ in range(rng.randrange(1, 4)):
        pos = rng.randrange(len(header))
        header[pos] ^= 1 << rng.randrange(8)
    return [bytes(header), b"body"]


class RawClient:
    def __init__(self, address: str):
        self.ctx = zmq.Context()
        self.sock = bounded_socket(self.ctx, zmq.DEALER)
        self.sock.connect(f"tcp://{address}")
        self.limits = Limits().for_responses()

    def ask(self, frames: list[bytes], timeout_ms: int = 5000) -> Any:
        self.sock.send_multipart(frames)
        if not self.sock.poll(timeout_ms):
            return None
        return decode_response(self.sock.recv_multipart(), self.limits)

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


@pytest.mark.timeout(240)
def test_fuzz_live_broker(tmp_path: Path) -> None:
    b = BrokerProcess(
        tmp_path / "b", maxFrameBytes=1024 * 1024, maxMessageSize=256 * 1024, maxBatchCount=64
    )
    rng = random.Random(SEED)
    with brokers(b):
        with Producer([b.address]) as p:  # warm up: topic, segment, code paths
            for _ in range(200):
                assert p.send("fuzz", b"warm", queue_id=0).status == SendStatus.SEND_OK
        proc = psutil.Process(b.pid)
        rss_before = anon_rss(b.pid)
        client = RawClient(b.address)
        try:
            unanswered = []
            for label, frames in _corpus():
                resp = client.ask(frames)
                if resp is None:
                    unanswered.append(label)
                elif resp.code not in ERROR_CODES:
                    pytest.fail(f"corpus case {label!r} answered {resp.code.name}: {resp.remark}")
            assert not unanswered, f"unanswered corpus frames: {unanswered}"
            codes: dict[str, int] = {}
            for i in range(RANDOM_FRAMES):
                frames = random_frames(rng)
                resp = client.ask(frames)
                assert resp is not None, f"seed {SEED} frame {i} got no answer: {frames!r:.200}"
                codes[resp.code.name] = codes.get(resp.code.name, 0) + 1
            assert codes.get("BAD_REQUEST", 0) > RANDOM_FRAMES // 2, codes
            # a lone frame over maxFrameBytes: dropped as it arrives, nothing to answer; a
            # request whose body is over it: answered; the connection serves on
            assert client.ask([b"\x00" * (2 * 1024 * 1024)], timeout_ms=1000) is None
            resp = client.ask(encode_request(RequestCode.SEND, 77, {"topic": "fuzz"},
                                             [b"\x00" * (2 * 1024 * 1024)]))
            assert resp is not None and resp.code == ResponseCode.BAD_REQUEST, resp
            assert resp.opaque == 77 and "more than 1048576 bytes" in resp.remark
        finally:
            client.close()
        with Producer([b.address]) as p:
            assert p.send("fuzz", b"after", queue_id=0).status == SendStatus.SEND_OK
        assert proc.is_running() and proc.pid == b.pid == b.status()["pid"]
        rss_after = anon_rss(b.pid)
        growth = rss_after - rss_before
        assert growth < RSS_GROWTH_LIMIT, f"RSS grew {growth / 1e6:.1f} MB"


@pytest.mark.timeout(120)
def test_a_huge_multipart_message_is_bounded_before_it_is_kept(tmp_path: Path) -> None:
    """Issue 36 item 11: libzmq keeps a whole multipart message before anyone can read its
    first frame, so through a ROUTER 160 frames of 4 MiB took a plain broker from 40 MiB to a
    680 MiB peak. The plain port reads ZMTP itself and drops a message past the bounds as it
    arrives; the request is answered and the connection serves on."""
    b = BrokerProcess(tmp_path / "b")
    with brokers(b):
        with Producer([b.address]) as p:  # warm up
            assert p.send("big", b"warm", queue_id=0).status == SendStatus.SEND_OK
        before = anon_rss(b.pid)
        client = RawClient(b.address)
        try:
            client.sock.setsockopt(zmq.SNDTIMEO, 30_000)
            header = encode_request(RequestCode.SEND, 42, {"topic": "big", "queueId": 0},
                                    [b""])[0]
            frame = b"x" * (4 * 1024 * 1024)
            client.sock.send(header, zmq.SNDMORE)
            peak = before
            for i in range(160):
                client.sock.send(frame, zmq.SNDMORE if i < 159 else 0)
                if i % 8 == 0:
                    peak = max(peak, anon_rss(b.pid))
            resp = None
            deadline = time.monotonic() + 60
            while resp is None and time.monotonic() < deadline:  # watched while it drains
                peak = max(peak, anon_rss(b.pid))
                if client.sock.poll(20):
                    resp = decode_response(client.sock.recv_multipart(), client.limits)
            assert peak - before < 64 * 1024 * 1024, (before, peak)
            assert resp is not None, "no answer to the oversized request"
            assert resp.code == ResponseCode.BAD_REQUEST and resp.opaque == 42, resp
            assert "frames" in resp.remark and "more than" in resp.remark, resp.remark
            status = client.ask(encode_request(RequestCode.STATUS, 43, {}, []))
            assert status is not None and status.code == ResponseCode.SUCCESS
        finally:
            client.close()
        assert b.status()["pid"] == b.pid


@pytest.mark.timeout(60)
def test_a_peer_that_does_not_speak_zmtp_is_disconnected(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "b")
    with brokers(b):
        host, port = b.address.split(":")
        with socket.create_connection((host, int(port)), timeout=10) as garbage:
            garbage.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _read_until_closed(garbage, 10) is not None
        started = time.monotonic()
        with socket.create_connection((host, int(port)), timeout=20) as silent:
            silent.sendall(b"\xff")  # a greeting begun, never finished
            greeting = _read_until_closed(silent, 20)
        assert greeting is not None and greeting[:1] == b"\xff"  # greeted, then cut off
        assert 3 <= time.monotonic() - started < 15
        with Producer([b.address]) as p:
            assert p.send("after", b"ok", queue_id=0).status == SendStatus.SEND_OK


def _read_until_closed(sock: socket.socket, timeout_s: float) -> bytes | None:
    """What the broker sent before it closed the connection; None if it did not close."""
    got = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            return None
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk
    return None
