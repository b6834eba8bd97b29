"""Shared unit fixtures: brokers on the in-memory store with the real roles."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from common.broker.broker import Broker
from common.cli.bootstrap import make_role
from common.core.config import BrokerConfig, load_config
from common.core.ports import free_port


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[Callable[..., Broker]]:
    """Brokers on ``helpers.fake_store.FakeStore`` with the real roles (``make_role``);
    ``real_store=True``: on a ``MessageStore`` in ``tmp_path`` (4 MiB segments unless given)."""
    from helpers.fake_store import FakeStore

    from common.store.message_store import MessageStore

    brokers: list[Broker] = []

    def start(real_store: bool = False, **fields: Any) -> Broker:
        listen = free_port()
        ha = free_port()
        while ha in (listen, listen + 1):
            ha = free_port()
        defaults: dict[str, Any] = {
            "listenPort": listen,
            "haListenPort": ha,  # listen + 1 is not known to be free
            "storePathRootDir": str(tmp_path / f"b{len(brokers)}"),
        }
        if real_store:
            defaults["mappedFileSizeCommitLog"] = 4 * 1024 * 1024
        cfg: BrokerConfig = load_config(None, (), env={}, **{**defaults, **fields})
        broker = Broker(cfg, MessageStore(cfg) if real_store else FakeStore(), make_role)
        broker.start()
        brokers.append(broker)
        return broker

    yield start
    for b in brokers:
        b.shutdown()
