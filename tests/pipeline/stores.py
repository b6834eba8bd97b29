"""Stores written by the real ``MessageStore`` for the pipeline tests (put, then shutdown:
flushed, checkpointed, ConsumeQueues dispatched), with their records as the store decodes them."""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

from reference import expected_rows
from storegen import Written

from common.core.config import load_config
from common.core.message import Message
from common.store.message_store import MessageStore

SEGMENT_BYTES = 64 * 1024
CQ_ENTRIES_PER_FILE = 100
TOPICS = ("orders", "audit", "clicks")
QUEUES = 4


class Store:
    """A store directory and its records as the store's own reader decodes them."""

    def __init__(self, root: Path, segment_bytes: int, cq_file_bytes: int):
        self.root = root
        self.segment_bytes = segment_bytes
        self.cq_file_bytes = cq_file_bytes
        self.written = [
            Written(r["topic"], r["queueId"], r["queueOffset"], r["commitLogOffset"],
                    r["storeSize"], r["bodyBytes"], r["properties"], r["bornTimestamp"],
                    r["storeTimestamp"])
            for r in expected_rows(root)
        ]

    @property
    def path(self) -> str:
        return str(self.root)

    def copy(self, dest: Path) -> Store:
        shutil.copytree(self.root, dest)
        return Store(dest, self.segment_bytes, self.cq_file_bytes)


def _body(rnd: random.Random, i: int) -> bytes:
    size = rnd.choice([0, 5, 12, 13, 60, 200, 400])
    if i % 2:
        return rnd.randbytes(size)
    return (f"text {i} héllo wörld ✓ " * 30).encode()[:size].decode("utf-8", "ignore").encode()


def write_store(root: Path, count: int, segment_bytes: int = SEGMENT_BYTES,
                cq_entries: int = CQ_ENTRIES_PER_FILE, seed: int = 7) -> Store:
    """``count`` messages over 3 topics x 4 queues put through a real MessageStore: bodies of
    0-400 B, half random bytes (rarely valid UTF-8) and half UTF-8 text, some UTF-8 properties,
    some messages without tags or keys."""
    cfg = load_config(None, (), env={}, storePathRootDir=str(root),
                      mappedFileSizeCommitLog=segment_bytes,
                      mappedFileSizeConsumeQueue=cq_entries * 20)
    rnd = random.Random(seed)
    store = MessageStore(cfg)
    store.start()
    try:
        for i in range(count):
            msg = Message(
                rnd.choice(TOPICS),
                _body(rnd, i),
                tags=rnd.choice([None, "TagA", "TagB", "Täg"]),
                keys=rnd.choice([None, f"k{rnd.randrange(20)}", f"k{rnd.randrange(20)} k{i}"]),
                properties={"n": str(i), "ünï": "çödé"} if i % 3 == 0 else {},
            )
            born = int(time.time() * 1000) - rnd.randrange(0, 50)
            result = store.put(msg, rnd.randrange(QUEUES), ("10.0.0.7", 5555), born)
            assert result.status.value == "PUT_OK", result
    finally:
        store.shutdown()
    return Store(root, segment_bytes, cq_entries * 20)
