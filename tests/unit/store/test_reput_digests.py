"""Reput takes a plain write's ConsumeQueue entries from the CommitLog's digest of it; the
result must be exactly what parsing the records gives."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from common.core.config import load_config
from common.core.message import Message
from common.store.message_store import MessageStore

pytestmark = pytest.mark.unit


def open_store(root: Path) -> MessageStore:
    store = MessageStore(load_config(env={}, storePathRootDir=str(root),
                                     mappedFileSizeCommitLog=16 * 1024,
                                     mappedFileSizeConsumeQueue=20 * 64, maxHashSlotNum=97,
                                     maxIndexNum=400))
    store.start()
    return store


def workload(store: MessageStore, seed: int) -> None:
    """Plain puts and batches (digested), tagged and keyed ones (parsed), on three queues,
    across many 16 KiB segments; each step dispatched before the next."""
    rnd = random.Random(seed)
    for i in range(300):
        queue_id = rnd.randrange(3)
        kind = rnd.random()
        body = b"b%d-" % i + b"x" * rnd.randrange(0, 700)
        if kind < 0.4:
            assert store.put(Message("orders", body), queue_id).ok
        elif kind < 0.7:
            msgs = [Message("orders", body + b"%d" % j) for j in range(rnd.randrange(1, 9))]
            assert store.put_batch("orders", queue_id, msgs).ok
        elif kind < 0.85:
            assert store.put(Message("orders", body, tags=f"T{i % 4}"), queue_id).ok
        else:
            assert store.put(Message("orders", body, keys=f"k{i}"), queue_id).ok
        assert store.wait_dispatched(store.max_phy_offset)


def cq_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted((root / "consumequeue").rglob("*")) if p.is_file()}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", [1, 2])
def test_digested_and_parsed_dispatch_build_identical_consume_queues(tmp_path: Path,
                                                                     seed: int) -> None:
    digested, parsed = open_store(tmp_path / "d"), open_store(tmp_path / "p")
    took = []
    original = digested.commit_log.take_digest

    def counting(phy: int, end: int):  # type: ignore[no-untyped-def]
        digest = original(phy, end)
        took.append(digest is not None)
        return digest

    digested.commit_log.take_digest = counting  # type: ignore[method-assign]
    parsed.commit_log.take_digest = lambda phy, end: None  # type: ignore[method-assign]
    try:
        workload(digested, seed)
        workload(parsed, seed)
        assert digested.max_phy_offset == parsed.max_phy_offset > 5 * 16 * 1024
        assert sum(took) > 100, "the digest path was not taken"
        for queue_id in range(3):
            got = digested.get_message("g", "orders", queue_id, 0, 10_000).messages()
            want = parsed.get_message("g", "orders", queue_id, 0, 10_000).messages()
            assert [(m.queue_offset, m.commit_log_offset, m.body) for m in got] == [
                (m.queue_offset, m.commit_log_offset, m.body) for m in want]
        assert len(digested.query_by_key("orders", "k7") or []) == len(
            parsed.query_by_key("orders", "k7") or [])
    finally:
        digested.shutdown()
        parsed.shutdown()
    assert cq_bytes(tmp_path / "d") == cq_bytes(tmp_path / "p")


@pytest.mark.timeout(60)
def test_a_reput_that_fell_behind_parses_and_drops_stale_digests(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        store.reput.shutdown()  # nothing dispatches while the digests pile up past the cap
        log = store.commit_log
        for i in range(log.digests.maxlen + 50):  # type: ignore[operator]
            assert store.commit_log.put(Message("t", b"m%d" % i), 0).ok
        assert log.digests[0].start > 0  # the oldest were dropped
        store.reput.do_reput()
        assert store.dispatched_phy_offset == store.max_phy_offset
        assert not log.digests
        got = []
        while len(got) < log.digests.maxlen + 50:  # type: ignore[operator]
            page = store.get_message("g", "t", 0, len(got), 500).messages()
            assert page, f"queue ends at {len(got)}"
            got += page
        assert [m.body for m in got] == [b"m%d" % i for i in range(len(got))]
    finally:
        store.shutdown()


@pytest.mark.timeout(60)
def test_runs_of_single_puts_merge_into_one_append_per_queue_and_match_parsing(
        tmp_path: Path) -> None:
    """Puts that pile up between two reput passes: each run of plain single puts to one queue
    (contiguous in the log and in the queue) reaches the ConsumeQueue as one merged digest,
    and a change of queue ends the run. The queues built are those parsing gives."""
    digested, parsed = open_store(tmp_path / "d"), open_store(tmp_path / "p")
    runs: list[int] = []
    original = digested.commit_log.take_digest_run

    def recording(phy: int, end: int, max_records: int):  # type: ignore[no-untyped-def]
        digest = original(phy, end, max_records)
        if digest is not None:
            runs.append(len(digest.entries))
        return digest

    digested.commit_log.take_digest_run = recording  # type: ignore[method-assign]
    parsed.commit_log.take_digest = lambda phy, end: None  # type: ignore[method-assign]
    try:
        for store in (digested, parsed):
            store.reput.shutdown()  # nothing dispatches until do_reput below
            for i in range(80):  # runs of 8 to queues 0, 1, 2, 0, ...; all in one segment
                assert store.put(Message("orders", b"r%03d-" % i + b"y" * 40), (i // 8) % 3).ok
            assert len(store.commit_log.queue.files) == 1
            store.reput.do_reput()
            assert store.dispatched_phy_offset == store.max_phy_offset
        assert runs == [8] * 10
        for queue_id in range(3):
            got = digested.get_message("g", "orders", queue_id, 0, 10_000).messages()
            want = parsed.get_message("g", "orders", queue_id, 0, 10_000).messages()
            assert len(got) >= 24
            assert [(m.queue_offset, m.commit_log_offset, m.body) for m in got] == [
                (m.queue_offset, m.commit_log_offset, m.body) for m in want]
    finally:
        digested.shutdown()
        parsed.shutdown()
    assert cq_bytes(tmp_path / "d") == cq_bytes(tmp_path / "p")


@pytest.mark.timeout(60)
def test_truncate_forgets_digests(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        store.reput.shutdown()
        assert store.commit_log.put(Message("t", b"kept"), 0).ok
        cut = store.max_phy_offset
        assert store.commit_log.put(Message("t", b"cut"), 0).ok
        store.commit_log.truncate(cut)
        assert not store.commit_log.digests
    finally:
        store.shutdown()


def test_a_topic_listener_hears_its_topic_only_on_both_dispatch_paths(tmp_path: Path) -> None:
    """Digested writes (no user properties) and parsed ones (with them) both tell the
    listeners of every topic, and a topic's own listeners only of that topic."""
    store = open_store(tmp_path)
    everything: list[tuple[str, int, int]] = []
    timers: list[tuple[str, int, int]] = []
    store.add_arrival_listener(lambda *a: everything.append(a))
    store.add_arrival_listener(lambda *a: timers.append(a), "T")
    try:
        store.put(Message("A", b"plain"), 0)
        store.put(Message("T", b"plain"), 1)
        store.put(Message("A", b"props", properties={"k": "v"}), 0)
        store.put(Message("T", b"props", properties={"k": "v"}), 1)
        store.reput.do_reput()
        assert sorted(everything) == [("A", 0, 1), ("A", 0, 2), ("T", 1, 1), ("T", 1, 2)]
        assert sorted(timers) == [("T", 1, 1), ("T", 1, 2)]
    finally:
        store.shutdown()
