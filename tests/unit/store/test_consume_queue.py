"""ConsumeQueue and ConsumeQueueStore against an independent reader of the on-disk bytes.

``read_segments`` below parses the files with plain ``open`` + ``struct`` (RocketMQ's layout:
commitlog offset q, size i, tagsCode q, big-endian), never through the production classes.
"""

from __future__ import annotations

import logging
import re
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.core.errors import StoreError
from common.store.consume_queue import ConsumeQueue, ConsumeQueueStore

pytestmark = pytest.mark.unit

UNIT = 20
PER_FILE = 4
FILE_SIZE = UNIT * PER_FILE
BLANK = (0, 0x7FFFFFFF, 0)
TOPIC = "TopicA"


# ---- independent reader ------------------------------------------------------------------------
def queue_dir(root: Path, topic: str = TOPIC, queue_id: int = 0) -> Path:
    return root / "consumequeue" / topic / str(queue_id)


def read_segments(directory: Path) -> dict[int, bytes]:
    """{segment start byte offset: file bytes}; checks names are 20 digits."""
    out = {}
    for path in sorted(directory.iterdir()):
        assert len(path.name) == 20 and path.name.isdigit(), path.name
        out[int(path.name)] = path.read_bytes()
    return out


def disk_entries(directory: Path) -> dict[int, tuple[int, int, int]]:
    """{queue offset: (phy, size, tags)} for every non-zero 20-byte unit on disk."""
    out = {}
    for start, data in read_segments(directory).items():
        assert len(data) == FILE_SIZE
        for i in range(0, len(data), UNIT):
            unit = data[i : i + UNIT]
            if unit != bytes(UNIT):
                out[(start + i) // UNIT] = struct.unpack(">qiq", unit)
    return out


def zeroed_after(directory: Path, queue_end: int) -> bool:
    """Every byte at or after queue offset ``queue_end`` is zero on disk."""
    for start, data in read_segments(directory).items():
        cut = max(0, queue_end * UNIT - start)
        if any(data[cut:]):
            return False
    return True


# ---- helpers ---------------------------------------------------------------------------------------
def entry(i: int) -> tuple[int, int, int]:
    """The i-th message of a synthetic log: records of 100 bytes from offset 1000."""
    return 1000 + 100 * i, 100, i * 7 - 3


def fill(cq: ConsumeQueue, count: int, first: int = 0) -> None:
    for i in range(first, first + count):
        assert cq.put(i, *entry(i))


@pytest.fixture
def cq(tmp_path: Path) -> Iterator[ConsumeQueue]:
    q = ConsumeQueue(tmp_path, TOPIC, 0, FILE_SIZE)
    q.load()
    yield q
    q.shutdown()


def reopen(root: Path, old: ConsumeQueue) -> ConsumeQueue:
    old.shutdown()
    q = ConsumeQueue(root, TOPIC, 0, FILE_SIZE)
    q.load()
    q.recover()
    return q


# ---- puts and reads --------------------------------------------------------------------------------
def test_put_rolls_segments_and_bytes_match(cq: ConsumeQueue, tmp_path: Path) -> None:
    fill(cq, 10)
    segments = read_segments(queue_dir(tmp_path))
    assert sorted(segments) == [0, 80, 160]
    assert disk_entries(queue_dir(tmp_path)) == {i: entry(i) for i in range(10)}
    assert cq.min_queue_offset == 0
    assert cq.max_queue_offset == 10
    assert cq.max_phy_offset == entry(9)[0] + 100
    assert [cq.get(i) for i in range(10)] == [entry(i) for i in range(10)]
    assert cq.get(10) is None and cq.get(-1) is None


def test_entries_cross_segments_and_respect_bounds(cq: ConsumeQueue) -> None:
    fill(cq, 10)
    got = cq.entries(2, 5)
    assert got == [(i, *entry(i)) for i in range(2, 7)]
    assert cq.entries(8, 32) == [(8, *entry(8)), (9, *entry(9))]
    assert cq.entries(10, 32) == []
    assert cq.entries(-1, 32) == []
    assert len(cq.entries(0, 32)) == 10


def test_redispatch_is_idempotent(cq: ConsumeQueue, tmp_path: Path) -> None:
    fill(cq, 6)
    before = read_segments(queue_dir(tmp_path))
    fill(cq, 6)  # the same messages again (abnormal recovery re-dispatch)
    assert cq.put(3, entry(8)[0], 100, 0)  # newer record, queue offset already built
    assert read_segments(queue_dir(tmp_path)) == before
    assert cq.max_queue_offset == 6


def test_late_start_fills_blank_entries(cq: ConsumeQueue, tmp_path: Path) -> None:
    assert cq.put(6, *entry(6))
    assert cq.put(7, *entry(7))
    disk = disk_entries(queue_dir(tmp_path))
    assert sorted(read_segments(queue_dir(tmp_path))) == [80]
    assert disk == {4: BLANK, 5: BLANK, 6: entry(6), 7: entry(7)}
    assert (cq.min_queue_offset, cq.max_queue_offset) == (6, 8)
    assert cq.get(5) is None
    assert cq.entries(4, 8) == []
    assert cq.entries(6, 8) == [(6, *entry(6)), (7, *entry(7))]


def test_gap_is_logged_and_appended_at_the_end(cq: ConsumeQueue,
                                               caplog: pytest.LogCaptureFixture) -> None:
    fill(cq, 2)
    with caplog.at_level(logging.ERROR, logger="replog.store"):
        assert cq.put(5, *entry(5))
    assert "cq_order_wrong" in caplog.text
    assert cq.get(2) == entry(5)
    assert cq.max_queue_offset == 3


# ---- recovery --------------------------------------------------------------------------------------
def test_recover_cuts_torn_tail_and_zeroes_it(cq: ConsumeQueue, tmp_path: Path) -> None:
    fill(cq, 6)
    cq.flush()
    seg = queue_dir(tmp_path) / f"{80:020d}"
    with open(seg, "r+b") as f:  # entry 6 torn: offset written, size still zero
        f.seek(2 * UNIT)
        f.write(struct.pack(">q", entry(6)[0]))
        f.seek(3 * UNIT)  # and stale garbage after it
        f.write(b"\xff" * UNIT)
    q = reopen(tmp_path, cq)
    try:
        assert q.max_queue_offset == 6
        assert q.max_phy_offset == entry(5)[0] + 100
        assert disk_entries(queue_dir(tmp_path)) == {i: entry(i) for i in range(6)}
        assert zeroed_after(queue_dir(tmp_path), 6)
        assert q.put(6, *entry(6))
        assert q.get(6) == entry(6)
    finally:
        q.shutdown()


def test_recover_zeroed_tail_drops_empty_segment(cq: ConsumeQueue, tmp_path: Path) -> None:
    fill(cq, 9)
    cq.flush()
    for start in (80, 160):  # entries 6..8 lost: zero from entry 6 on
        path = queue_dir(tmp_path) / f"{start:020d}"
        data = bytearray(path.read_bytes())
        cut = max(0, 6 * UNIT - start)
        data[cut:] = bytes(len(data) - cut)
        path.write_bytes(data)
    q = reopen(tmp_path, cq)
    try:
        assert sorted(read_segments(queue_dir(tmp_path))) == [0, 80]
        assert (q.min_queue_offset, q.max_queue_offset) == (0, 6)
        assert q.entries(0, 32) == [(i, *entry(i)) for i in range(6)]
    finally:
        q.shutdown()


def test_recover_full_segments_and_restart_keeps_blank_min(cq: ConsumeQueue,
                                                           tmp_path: Path) -> None:
    assert cq.put(2, *entry(2))
    fill(cq, 13, first=3)  # 2..15: exactly four full segments
    q = reopen(tmp_path, cq)
    try:
        assert (q.min_queue_offset, q.max_queue_offset) == (2, 16)
        assert q.max_phy_offset == entry(15)[0] + 100
        assert q.entries(2, 32) == [(i, *entry(i)) for i in range(2, 16)]
    finally:
        q.shutdown()


# ---- truncation and deletion -------------------------------------------------------------------
def test_truncate_dirty_zeroes_on_disk(cq: ConsumeQueue, tmp_path: Path) -> None:
    fill(cq, 10)
    cq.flush()
    cq.truncate_dirty(entry(5)[0] + 50)  # inside record 5: entries 6.. go
    assert cq.max_queue_offset == 6
    assert cq.max_phy_offset == entry(5)[0] + 100
    assert sorted(read_segments(queue_dir(tmp_path))) == [0, 80]
    assert disk_entries(queue_dir(tmp_path)) == {i: entry(i) for i in range(6)}
    assert zeroed_after(queue_dir(tmp_path), 6)
    assert cq.put(6, entry(6)[0], 77, 1)
    assert cq.get(6) == (entry(6)[0], 77, 1)


def test_truncate_dirty_drops_whole_segments(cq: ConsumeQueue, tmp_path: Path) -> None:
    fill(cq, 10)
    cq.truncate_dirty(entry(4)[0])  # first entry of segment 80
    assert sorted(read_segments(queue_dir(tmp_path))) == [0]
    assert cq.max_queue_offset == 4
    cq.truncate_dirty(entry(0)[0])
    assert cq.max_queue_offset == 0 and cq.max_phy_offset == entry(0)[0]
    assert disk_entries(queue_dir(tmp_path)) == {}
    fill(cq, 2)
    assert cq.entries(0, 8) == [(0, *entry(0)), (1, *entry(1))]


def test_truncate_dirty_keeps_blank_prefix(cq: ConsumeQueue, tmp_path: Path) -> None:
    fill(cq, 3, first=2)
    cq.truncate_dirty(entry(2)[0])
    assert disk_entries(queue_dir(tmp_path)) == {0: BLANK, 1: BLANK}
    assert (cq.min_queue_offset, cq.max_queue_offset, cq.max_phy_offset) == (2, 2, entry(2)[0])
    assert cq.put(2, *entry(2))
    assert cq.entries(2, 8) == [(2, *entry(2))]


def test_delete_expired_never_last_and_moves_min(cq: ConsumeQueue, tmp_path: Path) -> None:
    fill(cq, 10)
    assert cq.delete_expired(entry(4)[0]) == 1  # segment 0's last entry (3) is below
    assert sorted(read_segments(queue_dir(tmp_path))) == [80, 160]
    assert cq.min_queue_offset == 4
    assert cq.get(3) is None and cq.get(4) == entry(4)
    assert cq.delete_expired(entry(6)[0]) == 0  # segment 80's last entry (7) is not below
    assert cq.min_queue_offset == 6
    assert cq.delete_expired(10**9) == 1  # the last segment stays
    assert sorted(read_segments(queue_dir(tmp_path))) == [160]
    assert cq.min_queue_offset == cq.max_queue_offset == 10
    assert cq.entries(8, 4) == []


def test_correct_min_offset_skips_blanks(cq: ConsumeQueue) -> None:
    fill(cq, 4, first=1)
    cq.correct_min_offset(0)
    assert cq.min_queue_offset == 1
    cq.correct_min_offset(entry(3)[0] - 1)
    assert cq.min_queue_offset == 3


def test_offset_by_time(cq: ConsumeQueue) -> None:
    fill(cq, 10)
    times = {entry(i)[0]: 10_000 + 1000 * i for i in range(10)}
    times[entry(0)[0]] = None  # type: ignore[assignment]  # record 0 already deleted
    lookup = times.get
    assert cq.offset_by_time(0, lookup) == 1
    assert cq.offset_by_time(13_000, lookup) == 3
    assert cq.offset_by_time(13_001, lookup) == 4
    assert cq.offset_by_time(99_000, lookup) == 10


def test_flush_reports_durable(cq: ConsumeQueue) -> None:
    fill(cq, 5)
    assert cq.flush(least_pages=2) is False  # under two pages: nothing forced
    assert cq.flush(0) is True


def test_bad_file_size_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="multiple of 20"):
        ConsumeQueue(tmp_path, TOPIC, 0, 90)


def test_destroy_removes_directory(cq: ConsumeQueue, tmp_path: Path) -> None:
    fill(cq, 5)
    cq.destroy()
    assert not queue_dir(tmp_path).exists()
    assert cq.max_queue_offset == 0


# ---- the store -------------------------------------------------------------------------------------
def test_store_discovers_queues_and_rebuilds_tables(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, FILE_SIZE)
    for topic, qid, count in (("A", 0, 3), ("A", 3, 5), ("%RETRY%g", 1, 2)):
        fill(store.find_or_create(topic, qid), count)
    store.flush_all()
    store.shutdown()
    again = ConsumeQueueStore(tmp_path, FILE_SIZE)
    try:
        again.load()
        again.recover_all()
        assert again.topic_queue_table() == {("A", 0): 3, ("A", 3): 5, ("%RETRY%g", 1): 2}
        assert again.topics() == {"A": 4, "%RETRY%g": 2}
        assert again.max_phy_offset() == entry(4)[0] + 100
        cq = again.get("A", 3)
        assert cq is not None and cq.get(4) == entry(4)
        assert again.get("A", 1) is None
        again.truncate_dirty(entry(2)[0])
        assert again.topic_queue_table() == {("A", 0): 2, ("A", 3): 2, ("%RETRY%g", 1): 2}
        assert again.max_phy_offset() == entry(1)[0] + 100
    finally:
        again.shutdown()


@pytest.mark.parametrize(("bad", "named"), [
    ("A/abc", "A/abc"), ("A/-1", "A/-1"), ("A/01", "A/01"), ("A/file.txt", "A/file.txt"),
    ("stray_file", "stray_file"), ("bad topic/0", "bad topic"), ("A/0/junk.dat", "A/0"),
])
def test_store_refuses_garbage_names(tmp_path: Path, bad: str, named: str) -> None:
    path = tmp_path / "consumequeue" / bad
    path.parent.mkdir(parents=True, exist_ok=True)
    if bad.endswith((".txt", ".dat", "stray_file")):
        path.write_bytes(b"x")
    else:
        path.mkdir()
    store = ConsumeQueueStore(tmp_path, FILE_SIZE)
    with pytest.raises(StoreError, match=re.escape(str(tmp_path / "consumequeue" / named))):
        store.load()
    store.shutdown()


def test_store_find_or_create_is_one_queue_under_threads(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, FILE_SIZE)
    got: list[ConsumeQueue] = []
    barrier = threading.Barrier(8)

    def create() -> None:
        barrier.wait(timeout=10)
        got.append(store.find_or_create("T", 7))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(got) == 8 and all(q is got[0] for q in got)
    store.shutdown()


def test_store_delete_expired_and_destroy(tmp_path: Path) -> None:
    store = ConsumeQueueStore(tmp_path, FILE_SIZE)
    fill(store.find_or_create("A", 0), 10)
    fill(store.find_or_create("B", 0), 3)
    assert store.delete_expired(entry(9)[0]) == 2
    assert store.topic_queue_table() == {("A", 0): 10, ("B", 0): 3}
    store.destroy()
    assert not (tmp_path / "consumequeue").exists()
    assert store.topic_queue_table() == {}


def test_reads_race_puts_and_deletion(tmp_path: Path) -> None:
    """A reader thread sees only correct entries while the writer appends and deletes."""
    q = ConsumeQueue(tmp_path, TOPIC, 0, FILE_SIZE)
    q.load()
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            while not done.is_set():
                low = q.min_queue_offset
                for qo, phy, size, tags in q.entries(low, 16):
                    assert (phy, size, tags) == entry(qo)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(2000):
            assert q.put(i, *entry(i))
            if i % 50 == 49:
                q.delete_expired(entry(i - 8)[0])
    finally:
        done.set()
        t.join(timeout=10)
        q.shutdown()
    assert not t.is_alive() and errors == []
    assert q.min_queue_offset >= 1990
