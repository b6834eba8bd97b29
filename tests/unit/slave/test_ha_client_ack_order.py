"""slave/ha_client.py: a burst's ack goes out before its appends are dispatched (reput's work).

The test plays the master (a ROUTER) and the store (records the order of appends and
``dispatch_inline`` calls, with how many acks the client had sent by then).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers.replica_store import MemoryReplicaStore
from helpers.zmq_sockets import bounded_socket

from common.core.config import load_config
from common.ha.epochs import EpochEntry
from common.ha.protocol import Ack, Hello, HelloReply, Limits, decode, encode, encode_data
from slave.ha_client import HaClient

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class RecordingStore(MemoryReplicaStore):
    def __init__(self) -> None:
        super().__init__(generation=7)
        self.events: list[tuple[str, int]] = []
        self.client: HaClient | None = None

    @contextlib.contextmanager
    def replication_guard(self, generation: int | None) -> Iterator[None]:
        assert generation == 7
        with super().replication_guard(generation):
            yield

    def append_replicated(self, phy_offset: int, data: bytes | memoryview,
                          generation: int | None = None) -> int:
        assert phy_offset == self.max_phy_offset and generation == 7
        end = super().append_replicated(phy_offset, data, generation)
        self.events.append(("append", end))
        return end

    def dispatch_inline(self) -> int:
        assert self.client is not None
        self.events.append(("dispatch", self.client.stats.acks_sent))
        return 0

    def end_inline_dispatch(self) -> None:
        self.events.append(("end", 0))


def test_ack_is_sent_before_the_appended_bytes_are_dispatched(tmp_path: Path) -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    master = bounded_socket(ctx, zmq.ROUTER)
    master.setsockopt(zmq.RCVTIMEO, 5000)
    port = master.bind_to_random_port("tcp://127.0.0.1")
    cfg = load_config(
        None,
        (),
        env={},
        brokerRole="SLAVE",
        brokerId=1,
        haMasterAddress=f"127.0.0.1:{port}",
        storePathRootDir=str(tmp_path),
    )
    limits = Limits.from_config(cfg)
    store = RecordingStore()
    client = HaClient(cfg, store)
    store.client = client
    client.start()
    try:
        peer, *frames = master.recv_multipart()
        hello = decode(frames, limits)
        assert isinstance(hello, Hello)
        s = hello.session
        reply = HelloReply(s, 1, 0, 300, 0, (EpochEntry(1, 0),))
        master.send_multipart([peer, *encode(reply)])
        assert isinstance(decode(master.recv_multipart()[1:], limits), Ack)  # the handshake ack
        for offset in (0, 100, 200):
            master.send_multipart([peer, *encode_data(s, 1, 0, offset, b"x" * 100)])
            while True:
                ack = decode(master.recv_multipart()[1:], limits)
                assert isinstance(ack, Ack)
                if ack.ack_offset == offset + 100:
                    break
        deadline = time.monotonic() + 5
        while sum(1 for e in store.events if e[0] == "dispatch") < 1 or (
            store.events[-1][0] == "append"
        ):
            assert time.monotonic() < deadline, store.events
            time.sleep(0.001)
    finally:
        client.stop()
        master.close(0)
        ctx.term()
    acks = 1  # the handshake's
    for i, (kind, value) in enumerate(store.events[:-1]):
        if kind == "append":
            acks += 1
            assert store.events[i + 1] == ("dispatch", acks)  # ack sent, then dispatched
    assert [e for e in store.events if e[0] == "append"] == [
        ("append", 100),
        ("append", 200),
        ("append", 300),
    ]
    assert store.events[-1] == ("end", 0)  # the thread gives up inline dispatch as it ends
