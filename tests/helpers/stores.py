"""Small real stores for tests: tiny segments, a short delay-level table."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.core.config import load_config
from common.store.message_store import MessageStore


def make_store(root: Path, **over: object) -> MessageStore:
    """A started store under ``root``: 8 KiB CommitLog segments, 50-entry ConsumeQueue files,
    levels 1s 2s 5s; ``over`` sets any other key."""
    fields: dict[str, object] = {
        "storePathRootDir": str(root), "mappedFileSizeCommitLog": 8 * 1024,
        "mappedFileSizeConsumeQueue": 20 * 50, "maxHashSlotNum": 997, "maxIndexNum": 4000,
        "messageDelayLevel": "1s 2s 5s",
    }
    fields.update(over)
    store = MessageStore(load_config(**fields))  # type: ignore[arg-type]
    store.start()
    return store


def wait_until(cond: Callable[[], Any], timeout_s: float) -> bool:
    """Poll ``cond`` every 5 ms for up to ``timeout_s``; its last answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return bool(cond())
