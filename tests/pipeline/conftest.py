"""Fixtures for the Spark pipeline tests: one local SparkSession, small generated stores."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from storegen import StoreWriter, Written, fill

SEGMENT_BYTES = 64 * 1024
RECORDS = 1500


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
    """A generated store directory and what was written into it."""

    def __init__(self, root: Path, written: list[Written], segment_bytes: int):
        self.root = root
        self.written = written
        self.segment_bytes = segment_bytes

    @property
    def path(self) -> str:
        return str(self.root)

    def copy(self, dest: Path) -> Store:
        shutil.copytree(self.root, dest)
        return Store(dest, list(self.written), self.segment_bytes)


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """1500 messages over 3 topics x 4 queues in 64 KiB segments (several segment rolls).
    Read-only: tests that damage a store copy it first."""
    root = tmp_path_factory.mktemp("store")
    writer = StoreWriter(root, SEGMENT_BYTES)
    written = fill(writer, RECORDS)
    return Store(root, written, SEGMENT_BYTES)
