"""The controller's ZooKeeper client gives up a TCP connect to one server after the session
timeout over the number of servers (the Java client's connectTimeout), not after a whole
session timeout as kazoo does: a server whose address answers nothing (down, no reset sent)
must not hold the reconnect past the master's lease while the other servers serve."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from common.broker.controller import Controller, connect_capped_handler
from common.core.config import load_config

pytestmark = pytest.mark.unit


@pytest.fixture
def silent_address() -> Iterator[tuple[str, int]]:
    """A 127.0.0.1 port that drops SYNs: a listener whose accept queue is full (Linux drops a
    SYN it cannot queue and the client retransmits, as for a host that is gone)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    held = []
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        held.append(c)
    time.sleep(0.1)
    try:
        yield "127.0.0.1", port
    finally:
        for c in held:
            c.close()
        server.close()


def test_a_connect_to_a_silent_server_gives_up_after_the_cap(
        silent_address: tuple[str, int]) -> None:
    handler = connect_capped_handler(0.3)
    started = time.monotonic()
    with pytest.raises(OSError):  # socket.timeout is an OSError
        handler.create_connection(address=silent_address, hostname="zk", timeout=4.0)
    assert time.monotonic() - started < 2.0  # kazoo alone: the 4 s it was given


def test_a_shorter_timeout_asked_for_is_kept(silent_address: tuple[str, int]) -> None:
    handler = connect_capped_handler(3.0)
    started = time.monotonic()
    with pytest.raises(OSError):
        handler.create_connection(address=silent_address, hostname="zk", timeout=0.2)
    assert time.monotonic() - started < 2.0


def test_the_controller_caps_connects_at_the_session_over_the_servers(
        silent_address: tuple[str, int]) -> None:
    made: dict[str, Any] = {}

    class Client:
        def __init__(self, **kwargs: Any):
            made.update(kwargs)

        def add_listener(self, listener: Any) -> None:
            pass

        def start_async(self) -> None:
            pass

    cfg = load_config(env={}, enableControllerMode=True, brokerId=1, brokerRole="SYNC_MASTER",
                      controllerAddr="zk1:2181,zk2:2181,zk3:2181/replog",
                      controllerSessionTimeoutMs=3000)
    controller = Controller(cfg, broker=None, client_factory=Client)  # type: ignore[arg-type]
    controller._run = lambda: None  # type: ignore[method-assign]  # no pass loop: the client only
    controller.start()
    assert made["timeout"] == 3.0
    started = time.monotonic()
    with pytest.raises(OSError):
        made["handler"].create_connection(address=silent_address, hostname="zk", timeout=3.0)
    assert time.monotonic() - started < 2.0  # 3 s / 3 servers = 1 s, not the 3 s kazoo asks
