"""Small things the in-process broker tests share: a broker's client address, free ports,
waits with deadlines."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from common.broker.broker import Broker
from common.core import ports


def free_port() -> int:
    """Below the kernel's ephemeral range: an outgoing connection cannot take it meanwhile."""
    return ports.free_port()


def addr(broker: Broker) -> str:
    return f"127.0.0.1:{broker.cfg.listenPort}"


def wait_for(cond: Callable[[], Any], what: str, timeout_s: float = 10.0) -> Any:
    """``cond()``'s first true value, polled every 10 ms; AssertionError naming ``what``
    after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (value := cond()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.01)
    return value
