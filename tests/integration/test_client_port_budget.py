"""The client port's budget on a real broker: connections that pipeline PULLs and never read
their answers take a bounded share of its memory (their requests wait unserved, then they are
closed as silent), and an ordinary client is served meanwhile."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from broker_harness import BrokerProcess, brokers
from helpers.memory import anon_rss

from common.client import Admin, Producer
from common.core.errors import SendStatus
from common.format import zmtp
from common.format.protocol import RequestCode, encode_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MIB = 1024 * 1024
NON_READERS = 3
PULLS = 2000  # each answered with 32 records of 32 KiB: about 2 GB asked per connection
GROWTH_LIMIT = 150 * MIB


def non_reader(address: str) -> socket.socket:
    """A ZMTP DEALER that sends pipelined PULLs and reads nothing (a small receive buffer)."""
    host, port = address.rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect((host, int(port)))
    pulls = b"".join(zmtp.encode(encode_request(
        RequestCode.PULL, i, {"topic": "big", "queueId": 0, "queueOffset": 0, "maxNums": 32,
                              "group": "g", "suspendMs": 0}, []))
        for i in range(PULLS))
    sock.sendall(zmtp.GREETING + zmtp.ready(b"DEALER") + pulls)
    return sock


def test_peers_that_never_read_take_a_bounded_share(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "b", mappedFileSizeCommitLog=64 * MIB)
    socks: list[socket.socket] = []
    with brokers(b), Producer([b.address]) as p:
        for _ in range(64):
            body = os.urandom(32 * 1024)  # not compressible: the answers are as large
            assert p.send("big", body, queue_id=0).status == SendStatus.SEND_OK
        before = anon_rss(b.pid)
        try:
            socks = [non_reader(b.address) for _ in range(NON_READERS)]
            peak, served = before, []
            deadline = time.monotonic() + 6  # past the 5 s that closes a silent peer
            while time.monotonic() < deadline:
                peak = max(peak, anon_rss(b.pid))
                started = time.monotonic()
                assert p.send("other", b"y").status == SendStatus.SEND_OK
                served.append(time.monotonic() - started)
                time.sleep(0.05)
            assert peak - before < GROWTH_LIMIT, f"RSS grew {(peak - before) / MIB:.0f} MiB"
            assert max(served) < 2.0  # the ordinary client is answered all along
            with Admin([b.address], timeout_ms=3000) as admin:
                status = admin.status(b.address)
            assert status["clientPeersHeldBack"] >= NON_READERS
            assert status["clientBufferedBytes"] < GROWTH_LIMIT
        finally:
            for s in socks:
                s.close()
