"""Segments' lifecycle (RocketMQ ``ReferenceResource``): readers hold a segment, retention
unmaps it only once no reader holds it, and a segment that cannot be closed is logged, counted
and retried instead of leaking its mapping and descriptor (issue 21, items 2 and 3)."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.core.config import load_config
from common.core.errors import GetStatus
from common.core.message import Message
from common.store.mapped_file import MappedFile, file_name
from common.store.message_store import MessageStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

SEGMENT = 8 * 1024


def make_store(root: Path, **over: object) -> MessageStore:
    fields: dict[str, object] = {
        "storePathRootDir": str(root), "mappedFileSizeCommitLog": SEGMENT,
        "mappedFileSizeConsumeQueue": 20 * 50, "fileReservedTime": 0,
        "deleteFileBatchMax": 1000,
    }
    fields.update(over)
    store = MessageStore(load_config(**fields))
    store.start()
    return store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = make_store(tmp_path)
    yield s
    s.shutdown()


def fill(store: MessageStore, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        assert store.put(Message("t", b"%06d" % i + b"x" * 200), 0).ok
    assert store.wait_dispatched(store.max_phy_offset, 10)


def fds_on(path: Path) -> list[str]:
    """This process's descriptors open on ``path`` (also once it is unlinked: "(deleted)")."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.removesuffix(" (deleted)") == str(path):
            out.append(target)
    return out


def maps_of(path: Path) -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if str(path) in line)


def test_pulls_racing_a_forced_cleanup_never_read_a_closed_segment(store: MessageStore) -> None:
    """A pull loop reads the oldest messages while retention deletes their segments: every read
    returns whole records or reports them removed, never an error from a closed mapping."""
    errors: list[str] = []
    stop = threading.Event()
    reads = [0]

    def pull_loop() -> None:
        while not stop.is_set():
            try:
                lo = store.min_queue_offset("t", 0)
                got = store.get_message("g", "t", 0, lo, 32)
                for m in got.messages():
                    assert m.body[6:] == b"x" * 200
                store.message_by_offset(store.min_phy_offset)
                store.commit_log.read(store.min_phy_offset, 4096)
                reads[0] += 1
            except Exception as e:  # noqa: BLE001 - the test reports any
                errors.append(repr(e))
                return

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: shake the race out
    readers = [threading.Thread(target=pull_loop, daemon=True) for _ in range(2)]
    try:
        for t in readers:
            t.start()
        written = 0
        for _ in range(40):
            fill(store, 120, written)
            written += 120
            store.clean_now()
            if errors:
                break
    finally:
        stop.set()
        for t in readers:
            t.join(10)
        sys.setswitchinterval(switch)
    assert not errors, errors[:3]
    assert reads[0] > 0
    assert store.snapshot().deleted_segments > 30


def test_a_held_segment_is_unmapped_only_after_its_reader_releases_it(
        store: MessageStore) -> None:
    fill(store, 200)
    oldest: MappedFile = store.commit_log.queue.files[0]
    assert oldest.hold()
    try:
        assert store.clean_now() > 0
        assert store.min_phy_offset > oldest.file_from_offset
        assert not oldest.hold()  # no new reader gets it
        # the reader that held it before still reads its bytes
        assert len(oldest.read(0, 100)) == 100
        assert maps_of(oldest.path) == 1
        assert store.snapshot().segments_pending_delete == 1
    finally:
        oldest.release()
    assert maps_of(oldest.path) == 0 and not fds_on(oldest.path)
    store.clean_now()  # the retry removes the file
    assert store.snapshot().segments_pending_delete == 0
    assert not oldest.path.exists()
    assert not (store.root / "commitlog" / file_name(0)).exists()


def test_a_segment_that_cannot_be_closed_is_logged_counted_and_retried(
        store: MessageStore, caplog: pytest.LogCaptureFixture) -> None:
    fill(store, 200)
    oldest = store.commit_log.queue.files[0]
    path = oldest.path
    leaked = oldest.buffer[0:16]  # a view someone forgot to release: the mapping cannot close
    caplog.set_level(logging.ERROR, "replog.store")
    store.clean_now()
    assert any("segment_close_failed" in r.getMessage() and r.levelno == logging.ERROR
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    stats = store.snapshot()
    assert stats.segment_close_failures >= 1
    assert stats.segments_pending_delete == 1
    assert store.min_phy_offset > 0  # retention went on with the others
    leaked.release()
    store.clean_now()  # retried: closed and removed now
    assert store.snapshot().segments_pending_delete == 0
    assert not fds_on(path) and maps_of(path) == 0
    assert not any(p.name.startswith(".") for p in (store.root / "commitlog").iterdir()
                   if p.name.endswith(".deleting"))


def test_a_restart_removes_a_segment_left_pending_delete(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    fill(store, 200)
    oldest = store.commit_log.queue.files[0]
    leaked = oldest.buffer[0:16]
    store.clean_now()
    assert store.snapshot().segments_pending_delete == 1
    store.shutdown()  # still held: shutdown reports it and leaves it
    leaked.release()
    store = make_store(tmp_path)
    try:
        names = [p.name for p in (tmp_path / "commitlog").iterdir()]
        assert not [n for n in names if n.endswith(".deleting")], names
        got = store.get_message("g", "t", 0, store.min_queue_offset("t", 0), 1)
        assert got.status is GetStatus.FOUND
    finally:
        store.shutdown()
