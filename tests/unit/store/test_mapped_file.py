"""Segments' native calls: msync and page population with the GIL released, pinned mappings.

``MappedFile`` flushes through ``common.store.native`` (msync via ctypes) and populates pages
ahead of the writer; a native call pins the mapping so that ``close`` never unmaps under it.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from common.core.errors import StoreError
from common.core.message import Message
from common.store import native
from common.store.allocate import PREFAULT_AHEAD, AllocateService
from common.store.commit_log import CommitLog
from common.store.mapped_file import MappedFile, file_name

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

SIZE = 1 << 20


def _segment(tmp_path: Path, start: int = 0, size: int = SIZE) -> MappedFile:
    return MappedFile(tmp_path / file_name(start), size)


@pytest.mark.skipif(sys.platform != "linux", reason="libc msync/madvise through ctypes")
def test_a_writable_mapping_has_an_address(tmp_path: Path) -> None:
    mf = _segment(tmp_path)
    try:
        assert isinstance(mf._addr, int) and mf._addr % 4096 == 0
    finally:
        mf.close()


def test_flush_writes_the_bytes_and_the_file_can_still_be_closed(tmp_path: Path) -> None:
    mf = _segment(tmp_path)
    mf.append(b"A" * 5000)
    assert mf.flush() == 5000
    assert mf.flushed_position == 5000
    with open(mf.path, "rb") as f:  # through the page cache: the same bytes
        assert f.read(5000) == b"A" * 5000
    mf.close()  # no BufferError: the address export was released at once
    assert not mf.available


def test_prefault_keeps_contents_and_reports_how_far_it_got(tmp_path: Path) -> None:
    mf = _segment(tmp_path, size=8 << 20)
    try:
        mf.append(b"keep" * 1000)
        got = mf.prefault(6 << 20)
        if got == 0:
            pytest.skip("kernel without MADV_POPULATE_WRITE")
        assert got == 6 << 20
        assert mf.prefault(100 << 20) == 8 << 20  # clipped to the file
        assert bytes(mf.view(0, 4000)) == b"keep" * 1000
        assert bytes(mf.view(4000, 4096)) == bytes(4096)  # populated pages read as zeros
        mf.append(b"more")
        assert bytes(mf.view(4000, 4)) == b"more"
    finally:
        mf.close()


def test_prefault_to_unaligned_positions_keeps_population_working(tmp_path: Path) -> None:
    """The log asks for ``wrote_position + PREFAULT_AHEAD``, which is rarely page-aligned. An
    unaligned end used to become the next call's start: madvise refused it with EINVAL and the
    native layer turned population off for the whole process after the second request."""
    mf = _segment(tmp_path, size=8 << 20)
    try:
        first = mf.prefault(5000)
        if first == 0:
            pytest.skip("kernel without MADV_POPULATE_WRITE")
        assert first == 8192  # whole pages
        assert mf.prefault(100_001) == 102_400
        assert mf.prefault((3 << 20) + 1) == (3 << 20) + 4096
        assert native._populate_supported
        with pytest.raises(ValueError):  # a misaligned start is the caller's bug, said so
            native.populate_write(mf._addr, 100, 4096)
        assert native._populate_supported
    finally:
        mf.close()


def test_close_waits_for_a_native_call_in_progress(tmp_path: Path) -> None:
    mf = _segment(tmp_path)
    inside = threading.Event()
    release = threading.Event()

    def slow_call(addr: int | None) -> str:
        inside.set()
        release.wait(10)
        return "done"

    results: list[object] = []
    caller = threading.Thread(target=lambda: results.append(mf._pinned(slow_call)))
    caller.start()
    assert inside.wait(5)
    closed = threading.Event()
    closer = threading.Thread(target=lambda: (mf.close(), closed.set()))
    closer.start()
    time.sleep(0.05)  # give close every chance to (wrongly) go ahead
    assert not closed.is_set()
    release.set()
    assert closed.wait(5)
    caller.join(5)
    closer.join(5)
    assert results == ["done"]


def test_a_closed_segment_is_not_touched(tmp_path: Path) -> None:
    mf = _segment(tmp_path)
    mf.append(b"x" * 100)
    populated = mf.populated
    mf.close()
    assert mf.flush() == 0  # nothing written after close; no error either
    assert mf.prefault(SIZE) == populated < SIZE
    with pytest.raises(StoreError, match="closed"):
        mf.make_writable(SIZE)


def test_the_allocate_service_keeps_pages_ahead_of_the_writer(tmp_path: Path) -> None:
    if native._libc is None:
        pytest.skip("no libc")
    size = 64 << 20
    (tmp_path / "commitlog").mkdir()
    allocate = AllocateService(tmp_path / "commitlog", size)
    allocate.start()
    log = CommitLog(tmp_path, size, max_message_size=1 << 20, allocate=allocate)
    try:
        log.put(Message("t", b"m" * 1000), 0)
        mf = log.queue.last()
        assert mf is not None
        deadline = time.monotonic() + 10
        while mf.populated < mf.wrote_position + PREFAULT_AHEAD and time.monotonic() < deadline:
            time.sleep(0.01)
        if mf.populated == 0:
            pytest.skip("kernel without MADV_POPULATE_WRITE")
        assert mf.populated >= mf.wrote_position + PREFAULT_AHEAD
    finally:
        allocate.shutdown()
        log.queue.files[-1].close()


def test_prepared_segments_start_populated(tmp_path: Path) -> None:
    size = 32 << 20
    (tmp_path / "commitlog").mkdir()
    allocate = AllocateService(tmp_path / "commitlog", size)
    allocate.start()
    try:
        first = allocate.get(0)  # queues the next two segments
        deadline = time.monotonic() + 10
        while size not in allocate._ready and time.monotonic() < deadline:
            time.sleep(0.01)
        nxt = allocate.get(size)
        if nxt.populated == 0:
            pytest.skip("kernel without MADV_POPULATE_WRITE")
        assert nxt.populated == min(size, PREFAULT_AHEAD)
        first.close()
        nxt.close()
    finally:
        allocate.shutdown()


def test_an_empty_replicated_append_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "commitlog").mkdir()
    allocate = AllocateService(tmp_path / "commitlog", SIZE)
    allocate.start()
    log = CommitLog(tmp_path, SIZE, max_message_size=1 << 16, allocate=allocate)
    try:
        assert log.append_replicated(0, b"") == 0  # no segment written: nothing to prefault
        assert log.append_replicated(0, b"abc") == 3
        assert log.append_replicated(3, b"") == 3
    finally:
        allocate.shutdown()
        log.queue.files[-1].close()


def test_a_segment_appears_only_at_its_full_size(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Creation happens under a hidden name: a failed creation leaves no segment at all, so
    neither a reader of the directory nor a restart sees one of the wrong size."""
    import os

    from common.store import mapped_file

    def full_disk(fd: int, size: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mapped_file.os, "ftruncate", full_disk)
    with pytest.raises(OSError):
        _segment(tmp_path)
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    mf = _segment(tmp_path)
    try:
        assert os.listdir(tmp_path) == [file_name(0)]
        assert os.path.getsize(mf.path) == SIZE
    finally:
        mf.close()


def test_load_removes_a_segment_whose_creation_was_interrupted(tmp_path: Path) -> None:
    from common.store.mapped_file import creating_name
    from common.store.mapped_file_queue import MappedFileQueue

    _segment(tmp_path).close()
    leftover = tmp_path / creating_name(file_name(SIZE))
    leftover.write_bytes(b"")  # a crash between create and rename
    queue = MappedFileQueue(tmp_path, SIZE)
    queue.load()
    try:
        assert [mf.file_from_offset for mf in queue.files] == [0]
        assert not leftover.exists()
    finally:
        for mf in queue.files:
            mf.close()


def test_write_append_is_seen_through_the_mapping_and_closes_its_fd_when_full(
    tmp_path: Path,
) -> None:
    import os

    mf = _segment(tmp_path)
    try:
        assert mf._write_fd == -1  # opened on first use only
        assert mf.write_append(b"abc") == 0
        assert mf.write_append(memoryview(b"defg")) == 3
        assert mf.wrote_position == 7 and mf._write_fd >= 0
        assert mf.read(0, 100) == b"abcdefg"  # the mapping sees what pwrite wrote
        assert bytes(mf.view(0, 7)) == b"abcdefg"
        fd = mf._write_fd
        mf.write_append(b"z" * (SIZE - 7))
        assert mf.is_full() and mf._write_fd == -1  # a full segment is written no more
        with pytest.raises(OSError):
            os.fstat(fd)
        with pytest.raises(StoreError):
            mf.write_append(b"x")
        mf.flush()
        assert mf.flushed_position == SIZE
    finally:
        mf.close()
    with open(mf.path, "rb") as f:
        assert f.read(8) == b"abcdefgz"


def test_close_closes_the_write_fd(tmp_path: Path) -> None:
    import os

    mf = _segment(tmp_path)
    mf.write_append(b"abc")
    fd = mf._write_fd
    mf.close()
    assert mf._write_fd == -1
    with pytest.raises(OSError):
        os.fstat(fd)
    with pytest.raises(StoreError):
        mf.write_append(b"x")  # closed: no new descriptor


def test_a_failed_write_append_keeps_the_wrote_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC part-way: the position stays, the next append overwrites what was half-written."""
    import os

    from common.store import mapped_file

    real_pwrite = os.pwrite
    calls = []

    def short_then_full(fd: int, data: memoryview, offset: int) -> int:
        calls.append(offset)
        if len(calls) == 1:
            return real_pwrite(fd, data[:3], offset)  # a short write, as on a filling disk
        raise OSError(28, "No space left on device")

    mf = _segment(tmp_path)
    try:
        mf.write_append(b"head")
        monkeypatch.setattr(mapped_file.os, "pwrite", short_then_full)
        with pytest.raises(OSError):
            mf.write_append(b"123456")
        assert calls == [4, 7]  # the loop went on after the short write
        assert mf.wrote_position == 4
        monkeypatch.undo()
        mf.write_append(b"XYZ")
        assert mf.read(0, 100) == b"headXYZ"
    finally:
        mf.close()


def test_replicated_appends_leave_new_segments_unfaulted(tmp_path: Path) -> None:
    """pwrite gives new pages large folios; pages faulted in ahead would get 4 KiB ones and
    cost the allocate thread a fault each. A put (a promoted slave) turns prefaulting back on."""
    size = 4 << 20
    (tmp_path / "commitlog").mkdir()
    allocate = AllocateService(tmp_path / "commitlog", size)
    allocate.start()
    log = CommitLog(tmp_path, size, max_message_size=1 << 16, allocate=allocate)
    try:
        assert allocate.mapped_writes
        data = bytes(range(256)) * 4096  # 1 MiB
        for offset in range(0, 2 * size + (1 << 20), len(data)):
            assert log.append_replicated(offset, data) == offset + len(data)
        assert not allocate.mapped_writes
        assert [mf.file_from_offset for mf in log.queue.files] == [0, size, 2 * size]
        assert all(mf.populated == 0 for mf in log.queue.files)
        assert log.read(size - 3, 6) == data[-3:]  # crossed a segment end in one append
        assert log.read(2 * size, 4) == data[:4]
        r = log.put(Message("t", b"after promotion"), 0)
        assert r.status.name == "PUT_OK" and allocate.mapped_writes
    finally:
        allocate.shutdown()
        for mf in log.queue.files:
            mf.close()


@pytest.mark.parametrize("garbage_at", [5000, 4096, 700 * 1024, SIZE - 3])
def test_the_crash_garbage_past_a_cut_is_erased_wherever_it_lies(
        tmp_path: Path, garbage_at: int) -> None:
    """Recovery reads only the file's data regions (a preallocated segment is sparse): garbage
    beyond a hole, or in the last bytes, is found and erased all the same."""
    mf = _segment(tmp_path)
    try:
        mf.append(b"R" * 3000)
        mf.buffer[garbage_at:garbage_at + 3] = b"\x01\x02\x03"  # a crash's half-written tail
        # not flushed: a killed process leaves its pages dirty in the page cache, where the
        # file system's SEEK_DATA sees them too
        erased = mf.zero_tail_if_dirty(3000)
        assert erased == garbage_at + 3 - 3000
        assert bytes(mf.buffer[3000:SIZE]) == bytes(SIZE - 3000)
        assert bytes(mf.buffer[:3000]) == b"R" * 3000
        assert mf.zero_tail_if_dirty(3000) == 0
    finally:
        mf.close()
