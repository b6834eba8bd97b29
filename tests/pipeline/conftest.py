"""Fixtures for the Spark pipeline tests: one local SparkSession and stores written by the
real ``MessageStore`` (put, then shutdown: flushed, checkpointed, ConsumeQueues dispatched)."""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from reference import expected_rows
from storegen import Written

from common.config import load_config
from common.message import Message
from common.store.message_store import MessageStore

SEGMENT_BYTES = 64 * 1024
CQ_ENTRIES_PER_FILE = 100
RECORDS = 1500
TOPICS = ("orders", "audit", "clicks")
QUEUES = 4


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """local[2], UI off, 2 shuffle partitions; the format is found by Spark's discovery of
    ``pyspark_replog`` (no ``register`` call), which the tests therefore exercise."""
    from common.pipeline.session import build_session

    session = build_session(
        "local[2]",
        app_name="replog-tests",
        extra_conf={"spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse"))},
        register_source=False,
    )
    try:
        yield session
    finally:
        session.stop()


class Store:
    """A store directory and its records as the store's own reader decodes them."""

    def __init__(self, root: Path, segment_bytes: int, cq_file_bytes: int):
        self.root = root
        self.segment_bytes = segment_bytes
        self.cq_file_bytes = cq_file_bytes
        self.written = [
            Written(r["topic"], r["queueId"], r["queueOffset"], r["commitLogOffset"],
                    r["storeSize"], r["body"], r["properties"], r["bornTimestamp"],
                    r["storeTimestamp"])
            for r in expected_rows(root)
        ]

    @property
    def path(self) -> str:
        return str(self.root)

    def copy(self, dest: Path) -> Store:
        shutil.copytree(self.root, dest)
        return Store(dest, self.segment_bytes, self.cq_file_bytes)


def write_store(root: Path, count: int, segment_bytes: int = SEGMENT_BYTES,
                cq_entries: int = CQ_ENTRIES_PER_FILE, seed: int = 7) -> Store:
    """``count`` messages over 3 topics x 4 queues put through a real MessageStore: bodies of
    0-400 B, some UTF-8 properties, some messages without tags or keys."""
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
                rnd.randbytes(rnd.choice([0, 5, 12, 13, 60, 200, 400])),
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


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """1500 messages in 64 KiB segments (several rolls). Read-only: copy it to damage it."""
    written = write_store(tmp_path_factory.mktemp("store") / "store", RECORDS)
    assert len(written.written) == RECORDS
    return written
