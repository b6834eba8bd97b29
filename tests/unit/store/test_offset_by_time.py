"""Queue offsets by store time (RocketMQ searchOffset, Kafka offsetsForTimes) on a real store."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from common.cli.consumers import parse_time_ms
from common.cli.output import UsageError
from common.core.config import load_config
from common.core.message import Message
from common.store import commit_log
from common.store.message_store import MessageStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def store(tmp_path: Path) -> MessageStore:
    s = MessageStore(load_config(env={}, storePathRootDir=str(tmp_path),
                                 mappedFileSizeCommitLog=4096, mappedFileSizeConsumeQueue=20 * 16))
    s.start()
    yield s
    s.shutdown()


def test_offsets_by_store_time_across_segments(
    store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(1_000_000)
    monkeypatch.setattr(commit_log, "now_ms", clock)
    # queue 0 gets a message every 10 ms, queue 1 one every 20 ms; records span many segments
    for i in range(60):
        clock.ms = 1_000_000 + 10 * i
        assert store.put(Message("t", b"x" * 100), 0).ok
        if i % 2 == 0:
            assert store.put(Message("t", b"y" * 100), 1).ok
    assert store.wait_dispatched(store.max_phy_offset)
    assert len(list(store.commit_log.queue.files)) > 3

    assert store.offset_by_time("t", 0, 0) == 0  # before everything: the min offset
    assert store.offset_by_time("t", 0, 1_000_000) == 0
    assert store.offset_by_time("t", 0, 1_000_001) == 1  # the first stored at or after
    assert store.offset_by_time("t", 0, 1_000_250) == 25
    assert store.offset_by_time("t", 0, 1_000_255) == 26
    assert store.offset_by_time("t", 1, 1_000_250) == 13  # 1_000_260 is queue 1's 14th
    assert store.offset_by_time("t", 0, 1_000_590) == 59  # the last one
    assert store.offset_by_time("t", 0, 1_000_591) == 60  # after everything: the max offset
    assert store.offset_by_time("t", 0, 2**62) == 60
    assert store.offset_by_time("t", 7, 1_000_000) == 0  # no such queue
    assert store.offset_by_time("nope", 0, 1_000_000) == 0


def test_the_search_lands_on_a_stored_message(
    store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Equal timestamps: the first of the run (messages put within one ms share it).
    clock = Clock(5_000)
    monkeypatch.setattr(commit_log, "now_ms", clock)
    for i in range(30):
        clock.ms = 5_000 + (i // 10) * 100  # three runs of ten
        assert store.put(Message("t", b"z"), 0).ok
    assert store.wait_dispatched(store.max_phy_offset)
    assert [store.offset_by_time("t", 0, ts) for ts in (5_000, 5_050, 5_100, 5_200, 5_201)] == [
        0, 10, 10, 20, 30,
    ]
    found = store.get_message("g", "t", 0, store.offset_by_time("t", 0, 5_100), 1).messages()
    assert found[0].store_timestamp == 5_100


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1763812345678", 1763812345678),
        ("2025-11-22T12:32:25.678+00:00", 1763814745678),
        ("2025-11-22T12:32:25.678Z", 1763814745678),
        ("2025-11-22T13:32:25.001+01:00", 1763814745001),
        ("1970-01-01T00:00:00+00:00", 0),
        # where a float timestamp * 1000 lands a ms early
        ("2004-03-15T07:55:47.472+00:00", 1079337347472),
    ],
)
def test_cli_time_parsing_is_exact_to_the_ms(text: str, ms: int) -> None:
    assert parse_time_ms(text) == ms


def test_cli_time_without_a_zone_is_local_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Kolkata")  # +05:30
    time.tzset()
    try:
        assert parse_time_ms("2025-11-22T18:02:25.678") == 1763814745678
    finally:
        monkeypatch.undo()
        time.tzset()


def test_cli_time_refuses_what_it_cannot_read() -> None:
    with pytest.raises(UsageError, match="ISO 8601"):
        parse_time_ms("yesterday")
