"""Fixtures for the Spark pipeline tests: one local SparkSession and stores written by the
real ``MessageStore`` (put, then shutdown: flushed, checkpointed, ConsumeQueues dispatched)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from stores import Store, write_store

RECORDS = 1500


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """local[2], UI off, 2 shuffle partitions. The format is not registered here: Spark finds
    it through ``pyspark_replog`` (the jobs register it again; test_source checks discovery)."""
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


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """1500 messages in 64 KiB segments (several rolls). Read-only: copy it to damage it."""
    written = write_store(tmp_path_factory.mktemp("store") / "store", RECORDS)
    assert len(written.written) == RECORDS
    return written
