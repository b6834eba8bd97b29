"""One fixed-size log segment, mmap'd read-write (RocketMQ ``DefaultMappedFile``).

The file is named by its start offset as 20 decimal digits and always has its full size on
disk (sparse until written). Positions are relative to the file start:

- ``wrote_position``: bytes appended into the mapping;
- ``flushed_position``: bytes known to be on disk (msync'd).

There is no transient store pool, so RocketMQ's committed position always equals the wrote
position (``committed_position`` is kept as an alias for readers of the reference).

A mapped file is never shrunk with ftruncate while mapped (touching a page past EOF raises
SIGBUS); truncation zeroes the bytes and msyncs them instead, so truncated data is gone on disk.

Lifetime (RocketMQ ``ReferenceResource``): the segment starts with one reference, its owner's
(the ``MappedFileQueue``). A reader calls ``hold()`` (False once the segment is shut down: it
is gone for that reader) and ``release()`` when done; native calls (msync, page population,
with the GIL released) hold it the same way. ``shutdown()`` marks it unavailable and drops the
owner's reference; the mapping and the descriptors are closed by whichever ``release`` drops
the last reference, so nothing is unmapped under a reader. ``destroy(wait_s)`` shuts down, waits
up to ``wait_s`` for the readers, then closes and unlinks; it returns False when readers still
hold the segment or the mapping cannot be closed (a memoryview of it is still alive), and the
caller retries later (``MappedFileQueue.retry_destroy``). Unlike RocketMQ's ``intervalForcibly``
nothing is ever unmapped by force: a native call runs on the raw address, and an unmap under it
is a SIGSEGV. A segment still held ``interval_forcibly_s`` after its shutdown is reported
(``held_too_long``) instead. ``prefault(upto)`` populates pages ahead of the writer (the allocate
service calls it off the put path), ``populated`` is how far that has got.

Bulk appends (a slave's replicated bytes) go through ``write_append``: ``pwrite(2)`` on the file,
not a copy into the mapping. The page cache is one, so the mapping sees the bytes at once and
msync flushes them like any others. A write lets the kernel allocate large folios for the new
pages in one go where a copy into the mapping takes a page fault per 4 KiB (on this VM ~1.3x
the catch-up rate; see README), and a full disk is an ENOSPC OSError there, where a store into
a mapping whose page cannot get a block is a SIGBUS that kills the process.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from common.core.errors import StoreError
from common.store import native

OS_PAGE_SIZE = 4096
WARM_CHUNK = 1 << 20
POPULATE_CHUNK = 4 << 20  # pages faulted in per native call (the mapping is pinned meanwhile)
WRITABLE_AHEAD = 64 << 10  # make_writable: pages made ready past the append (one call per 64 KiB)
CLOSE_WAIT_S = 10.0
INTERVAL_FORCIBLY_S = 120.0  # held this long after its shutdown: reported (RocketMQ's 120 s)
_CLOSED = object()  # what a pinned call returns once the file is closed
NAME_DIGITS = 20


def file_name(start_offset: int) -> str:
    return f"{start_offset:0{NAME_DIGITS}d}"


CREATING_SUFFIX = ".new"
DELETING_SUFFIX = ".deleting"


def creating_name(name: str) -> str:
    """The hidden name a segment has while it is created (``load`` removes leftovers)."""
    return f".{name}{CREATING_SUFFIX}"


def is_creating_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(CREATING_SUFFIX)


def deleting_name(name: str) -> str:
    """The hidden name a deleted segment has while a reader still holds it (``load`` removes
    leftovers): its own name is free at once for a segment made again at that offset."""
    return f".{name}{DELETING_SUFFIX}"


def is_deleting_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(DELETING_SUFFIX)


def parse_file_name(name: str) -> int:
    """Start offset from a segment name; StoreError unless it is exactly 20 digits."""
    if len(name) != NAME_DIGITS or not name.isdigit():
        raise StoreError(f"segment name {name!r} is not a 20-digit offset")
    return int(name)


class MappedFile:
    """A segment of ``file_size`` bytes starting at log offset ``file_from_offset``."""

    def __init__(self, path: Path, file_size: int, create: bool = True):
        self.path = Path(path)
        self.file_size = file_size
        self.file_from_offset = parse_file_name(self.path.name)
        fd = self._open(create)
        try:
            actual = os.fstat(fd).st_size
            if actual == 0 and create:  # the remains of a creation before atomic creation
                os.ftruncate(fd, file_size)
            elif actual != file_size:
                raise StoreError(f"{self.path}: size {actual} != configured {file_size}")
            self._mm = mmap.mmap(fd, file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._view = memoryview(self._mm)
        self._addr = native.address_of(self._mm)
        self.wrote_position = 0
        self.flushed_position = 0
        self.populated = 0  # pages below this were faulted in ahead of the writer
        self.store_timestamp = 0  # store time of the last record appended (checkpoint)
        self._flush_lock = threading.Lock()
        # guards available, _refs, _cleaned and _write_fd; the hot hold/release take the lock
        # itself (C), not the Condition's Python-level __enter__/__exit__ (a read each)
        self._life_lock = threading.RLock()
        self._life = threading.Condition(self._life_lock)
        self._refs = 1  # the owner's reference, plus one per hold (readers, native calls)
        self._write_fd = -1  # write_append's descriptor: opened on its first use, closed when full
        self._cleaned = False  # the mapping and every descriptor are closed
        self._shutdown_at = 0.0  # monotonic time of shutdown()
        self.available = True
        self.close_error = ""  # why the last attempt to close the mapping failed

    def _open(self, create: bool) -> int:
        """The segment's descriptor. A new segment is made under a hidden name and renamed once
        it has its full size, so no reader of the directory, and no restart after a crash,
        ever sees a segment file of the wrong size."""
        try:
            return os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            if not create:
                raise
        tmp = self.path.with_name(creating_name(self.path.name))
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, self.file_size)
            os.rename(tmp, self.path)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return fd

    # ---- positions ------------------------------------------------------------------------
    @property
    def committed_position(self) -> int:
        return self.wrote_position

    @property
    def end_offset(self) -> int:
        return self.file_from_offset + self.file_size

    @property
    def max_offset(self) -> int:
        return self.file_from_offset + self.wrote_position

    def is_full(self) -> bool:
        return self.wrote_position == self.file_size

    def remaining(self) -> int:
        return self.file_size - self.wrote_position

    def set_positions(self, position: int) -> None:
        """After recovery or truncation: wrote = flushed = position."""
        self.wrote_position = position
        self.flushed_position = position

    # ---- writes ---------------------------------------------------------------------------
    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Copy ``data`` at the wrote position; returns the position it was written at.

        Pages are made writable first (``make_writable``): on a full file system this raises
        OSError(ENOSPC) and nothing changes, where the copy would have been a SIGBUS."""
        pos = self.wrote_position
        end = pos + len(data)
        if end > self.file_size:
            raise StoreError(f"{self.path}: append of {len(data)} bytes past the end ({pos})")
        if end > self.populated:
            self.make_writable(end)
        self._view[pos:end] = data
        self.wrote_position = end
        return pos

    def write_append(self, data: bytes | bytearray | memoryview) -> int:
        """``append`` through the file descriptor (``pwrite``) instead of the mapping; returns
        the position written at. On an OSError (ENOSPC, EIO) the wrote position stays where it
        was: bytes the failed call may have left past it are overwritten by the next append."""
        view = memoryview(data).cast("B")
        pos = self.wrote_position
        end = pos + len(view)
        if end > self.file_size:
            raise StoreError(f"{self.path}: append of {len(view)} bytes past the end ({pos})")
        fd = self._write_fd
        if fd < 0:
            fd = self._open_write_fd()
        at = pos
        while at < end:
            at += os.pwrite(fd, view[at - pos :], at)
        self.wrote_position = end
        if end == self.file_size:
            self._close_write_fd()
        return pos

    def _open_write_fd(self) -> int:
        with self._life:
            if not self.available or self._cleaned:
                raise StoreError(f"{self.path}: closed")
            if self._write_fd < 0:
                self._write_fd = os.open(self.path, os.O_WRONLY)
            return self._write_fd

    def _close_write_fd(self) -> None:
        with self._life:
            fd, self._write_fd = self._write_fd, -1
        if fd >= 0:
            os.close(fd)

    def fault_in(self, start: int, end: int) -> bool:
        """Before a store into the mapping at ``[start, end)`` past ``populated``: fault those
        pages in writable on this thread. False when that is refused (EFAULT: no block for a
        page, i.e. the file system is full; ENOMEM) or the file is closed, where the store
        would have been a SIGBUS; True when done, or when it cannot be asked (the store then
        faults as it would without this)."""
        first = start // OS_PAGE_SIZE * OS_PAGE_SIZE
        last = min(-(-end // OS_PAGE_SIZE) * OS_PAGE_SIZE, self.file_size)
        result = self._pinned(native.populate_write_checked, first, last - first)
        return result is not _CLOSED and result in (0, native.UNSUPPORTED)

    def make_writable(self, end: int, ahead: int = WRITABLE_AHEAD) -> None:
        """Fault in writable, on this thread, the pages from ``populated`` up to ``end`` (and
        ``ahead`` bytes more while they can be had): the file system gives them their blocks
        now. OSError(ENOSPC) if it has none, StoreError once the file is closed; unchanged
        where the kernel cannot populate (the store then faults as it would without this)."""
        if end <= self.populated:
            return
        first = self.populated // OS_PAGE_SIZE * OS_PAGE_SIZE
        need = min(-(-end // OS_PAGE_SIZE) * OS_PAGE_SIZE, self.file_size)
        for last in dict.fromkeys((min(need + ahead, self.file_size), need)):  # then just enough
            result = self._pinned(native.populate_write_checked, first, last - first)
            if result is _CLOSED:
                raise StoreError(f"{self.path}: closed")
            if result == 0:
                self.populated = max(self.populated, last)
                return
            if result == native.UNSUPPORTED:
                return
        raise OSError(errno.ENOSPC, f"{self.path}: no space for pages up to {need}")

    def fill_to_end(self, marker: bytes) -> None:
        """Write ``marker`` (the BLANK record) and mark the rest of the segment as used."""
        end = self.wrote_position + len(marker)
        if end > self.populated and not self.fault_in(self.wrote_position, end):
            raise OSError(errno.ENOSPC, f"{self.path}: no space for the end-of-segment marker")
        self._view[self.wrote_position : self.wrote_position + len(marker)] = marker
        self.wrote_position = self.file_size

    def write_at(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        """Write without moving positions (the caller advances them)."""
        self._view[pos : pos + len(data)] = data

    @property
    def buffer(self) -> memoryview:
        """The whole mapping, for in-place encoding under the put lock."""
        return self._view

    # ---- reads ----------------------------------------------------------------------------
    def view(self, pos: int, size: int) -> memoryview:
        """Zero-copy view of ``[pos, pos+size)``; release it before the file is destroyed."""
        return self._view[pos : pos + size]

    def read(self, pos: int, size: int) -> bytes:
        """A copy of ``[pos, pos+size)`` clipped to the wrote position."""
        end = min(pos + size, self.wrote_position)
        return self._mm[pos:end] if end > pos else b""

    # ---- durability -----------------------------------------------------------------------
    def dirty_pages(self) -> int:
        return self.wrote_position // OS_PAGE_SIZE - self.flushed_position // OS_PAGE_SIZE

    def flush(self, least_pages: int = 0) -> int:
        """msync the dirty range when ``least_pages`` pages wait (0: any byte); new flushed pos."""
        with self._flush_lock:
            target = self.wrote_position
            if target <= self.flushed_position:
                return self.flushed_position
            if least_pages > 0 and not self.is_full() and self.dirty_pages() < least_pages:
                return self.flushed_position
            start = (self.flushed_position // OS_PAGE_SIZE) * OS_PAGE_SIZE
            if not self._sync(start, target - start):
                return self.flushed_position  # closed meanwhile: nothing left to write
            self.flushed_position = target
            return target

    def _sync(self, start: int, length: int) -> bool:
        """msync ``[start, start+length)`` with the GIL released; False if already closed."""
        return self._pinned(self._msync, start, length) is not _CLOSED

    def _msync(self, addr: int | None, start: int, length: int) -> None:
        native.msync(self._mm, addr, start, length)

    def _pinned(self, call: Callable[..., object], *args: int) -> object:
        """``call(address, *args)`` with the segment held (nothing unmaps it meanwhile), or
        ``_CLOSED`` without calling once it is shut down."""
        if not self.hold():
            return _CLOSED
        try:
            return call(self._addr, *args)
        finally:
            self.release()

    def prefault(self, upto: int) -> int:
        """Fault pages in up to ``upto`` (one thread at a time: the allocate service); returns
        the new ``populated``, unchanged where the kernel cannot populate."""
        # Whole pages only: madvise needs a page-aligned start, and the next call starts where
        # this one ended (an unaligned end made that call fail with EINVAL, which the native
        # layer took for an old kernel and turned population off for the whole process).
        upto = min(-(-upto // OS_PAGE_SIZE) * OS_PAGE_SIZE, self.file_size)
        while self.populated < upto:
            start = self.populated
            length = min(POPULATE_CHUNK, upto - start)
            if self._pinned(native.populate_write, start, length) is not True:
                break
            self.populated = start + length
        return self.populated

    def warm(self, sync: bool) -> None:
        """Touch every page (RocketMQ warmMapedFile) so first writes do not fault."""
        if self.prefault(self.file_size) >= self.file_size:  # one native call per 4 MiB
            if sync:
                self._sync(0, self.file_size)
            return
        # No MADV_POPULATE_WRITE: 1 MiB of zeros at a time: the page faults happen in C, and
        # the GIL is free between chunks (a per-page Python loop held it through thousands).
        view = self._view
        chunk = bytes(WARM_CHUNK)
        for pos in range(0, self.file_size, WARM_CHUNK):
            end = min(pos + WARM_CHUNK, self.file_size)
            view[pos:end] = chunk[: end - pos]
            if sync and (pos // WARM_CHUNK) % 16 == 15:
                self._sync(pos + WARM_CHUNK - 16 * WARM_CHUNK, 16 * WARM_CHUNK)
        if sync:
            self._sync(0, self.file_size)
        if hasattr(mmap, "MADV_WILLNEED"):
            self._mm.madvise(mmap.MADV_WILLNEED)

    def zero_from(self, pos: int) -> None:
        """Physically erase ``[pos, max(wrote, flushed))`` on disk and set positions to ``pos``."""
        end = max(self.wrote_position, self.flushed_position, pos)
        if end > pos:
            self._view[pos:end] = bytes(end - pos)
        # Also make durable what was kept below the cut but not yet flushed.
        start = (min(self.flushed_position, pos) // OS_PAGE_SIZE) * OS_PAGE_SIZE
        if end > start:
            self._sync(start, end - start)
        self.set_positions(pos)

    def zero_tail_if_dirty(self, pos: int) -> int:
        """Erase any non-zero bytes at or after ``pos`` up to the file end (crash garbage)."""
        view = self._view
        size = self.file_size
        if pos >= size:
            return 0
        chunk = 1 << 20
        last_dirty = -1
        for lo, hi in self._data_regions(pos, size):  # holes hold zeros: not read
            p = lo
            while p < hi:
                end = min(p + chunk, hi)
                kept = len(self._mm[p:end].rstrip(b"\x00"))
                if kept:
                    last_dirty = p + kept
                p = end
        if last_dirty < 0:
            return 0
        view[pos:last_dirty] = bytes(last_dirty - pos)
        start = (pos // OS_PAGE_SIZE) * OS_PAGE_SIZE
        self._sync(start, last_dirty - start)
        return last_dirty - pos

    def _data_regions(self, pos: int, size: int) -> list[tuple[int, int]]:
        """The parts of ``[pos, size)`` the file system holds data for (SEEK_DATA/SEEK_HOLE):
        a preallocated segment is sparse, and reading a gigabyte of its holes page by page is
        seconds of a recovery. Where the calls are not supported, the whole range."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return [(pos, size)]
        regions: list[tuple[int, int]] = []
        try:
            p = pos
            while p < size:
                try:
                    start = os.lseek(fd, p, os.SEEK_DATA)
                except OSError as e:  # ENXIO: no data past p
                    if e.errno == errno.ENXIO:
                        break
                    return [(pos, size)]
                if start >= size:
                    break
                end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
                regions.append((start, end))
                p = end
        except (AttributeError, OSError):
            return [(pos, size)]
        finally:
            os.close(fd)
        return regions

    # ---- lifecycle (RocketMQ ReferenceResource) ------------------------------------------
    def hold(self) -> bool:
        """Take a reference for a read; False once the segment is shut down (it is gone)."""
        with self._life_lock:
            if not self.available:
                return False
            self._refs += 1
            return True

    def release(self) -> None:
        """Drop a reference; the last one closes the mapping (on the releasing thread)."""
        with self._life_lock:
            self._refs -= 1
            last = self._refs == 0
            if last:
                self._life.notify_all()
        if last:
            self._cleanup()

    @property
    def ref_count(self) -> int:
        return self._refs

    @property
    def cleanup_over(self) -> bool:
        """No reference is left and the mapping and descriptors are closed."""
        return self._refs <= 0 and self._cleaned

    def held_too_long(self, interval_forcibly_s: float = INTERVAL_FORCIBLY_S) -> bool:
        """Shut down at least ``interval_forcibly_s`` ago and still held by a reader."""
        return (not self.available and self._refs > 0
                and time.monotonic() - self._shutdown_at >= interval_forcibly_s)

    def shutdown(self) -> None:
        """No new reader gets the segment; the owner's reference is dropped (once)."""
        with self._life:
            if not self.available:
                return
            self.available = False
            self._shutdown_at = time.monotonic()
        self.release()

    def _cleanup(self) -> bool:
        """Close the mapping and the descriptors (no reference is left); False, with
        ``close_error`` set, when a memoryview of the mapping is still alive."""
        with self._life:
            if self._cleaned:
                return True
            fd, self._write_fd = self._write_fd, -1
            try:
                self._view.release()
                self._mm.close()
            except BufferError as e:
                self.close_error = f"the mapping is still exported: {e}"
                self._write_fd = fd  # kept with the mapping: closed by the retry
                return False
            self._cleaned = True
            self.close_error = ""
        if fd >= 0:
            os.close(fd)
        return True

    def close(self, wait_s: float = CLOSE_WAIT_S) -> bool:
        """Shut down, wait up to ``wait_s`` for the readers, close; True once closed. False
        when a reader (or a native call stuck on the disk) still holds it, or a view of the
        mapping is alive (``close_error``): nothing is unmapped under either."""
        self.shutdown()
        with self._life:
            if not self._life.wait_for(lambda: self._refs <= 0, wait_s):
                self.close_error = f"still held by {self._refs} reader(s)"
                return False
        return self._cleanup()

    def destroy(self, wait_s: float = CLOSE_WAIT_S) -> bool:
        """Close and delete the file; False (file kept, retry later) when it cannot close."""
        if not self.close(wait_s):
            return False
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        return True

    def hide(self) -> None:
        """Rename the file to its hidden deleting name (``deleting_name``), keeping the
        mapping: a segment that must wait for its readers frees its name at once."""
        hidden = self.path.with_name(deleting_name(self.path.name))
        try:
            os.rename(self.path, hidden)
        except FileNotFoundError:
            return
        self.path = hidden

    def __repr__(self) -> str:
        return (
            f"MappedFile({self.path.name}, wrote={self.wrote_position}, "
            f"flushed={self.flushed_position})"
        )
