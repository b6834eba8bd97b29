"""docs/drills.md row 9 against a live broker: malformed frames over one client socket.

Replays the fixed corpus of ``tests/property/test_protocol_fuzz.py`` plus 2 500 seeded random bad
frames (random bytes, random msgpack values, mutations of a valid request). Every frame must get
a typed error answer, except a frame over ``maxFrameBytes``, which ZeroMQ answers by
disconnecting. Afterwards: the same PID, RSS growth < 16 MB, and the next valid send succeeds.
"""

from __future__ import annotations

import importlib.util
import os
import random
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest
import zmq
from broker_harness import BrokerProcess, brokers

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
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
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
        rss_before = proc.memory_info().rss
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
            # one frame over maxFrameBytes: ZeroMQ drops the connection, the broker lives on
            assert client.ask([b"\x00" * (2 * 1024 * 1024)], timeout_ms=1000) is None
        finally:
            client.close()
        with Producer([b.address]) as p:
            assert p.send("fuzz", b"after", queue_id=0).status == SendStatus.SEND_OK
        assert proc.is_running() and proc.pid == b.pid == b.status()["pid"]
        rss_after = proc.memory_info().rss
        growth = rss_after - rss_before
        assert growth < RSS_GROWTH_LIMIT, f"RSS grew {growth / 1e6:.1f} MB"
