"""The ordered segments of one log (RocketMQ ``MappedFileQueue``).

Segments are contiguous: segment i starts at ``first_start + i * file_size``. Loading refuses a
gap, a wrong size or a bad name. Truncation erases bytes on disk (zero + msync) and deletes whole
segments beyond the cut, so a crash after a truncation cannot resurrect what was cut.

Readers find a segment without the lock and ``hold`` it (``MappedFile.hold``, RocketMQ's
ReferenceResource) for as long as they touch its bytes (``find_held``). Deletion (retention,
truncation) takes a segment out of the list, then destroys it: it is unmapped once no reader
holds it. One that cannot be destroyed yet (a reader still holds it past ``DESTROY_WAIT_S``, or
a view of its mapping is still alive) keeps its mapping under a hidden ``.<name>.deleting``
name and waits in ``pending_delete``; ``retry_destroy`` (every clean pass) tries again. A
mapping that would not close is logged at ERROR and counted (``close_failures``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from common.core.errors import StoreError
from common.store.mapped_file import (
    MappedFile,
    file_name,
    is_creating_name,
    is_deleting_name,
    parse_file_name,
)

log = logging.getLogger("replog.store")

# Creates the segment starting at the given offset (the allocator, or inline creation).
Creator = Callable[[int], MappedFile]
DESTROY_WAIT_S = 1.0  # a deleted segment's readers get this long before it is retried later


class MappedFileQueue:
    def __init__(self, directory: Path, file_size: int, creator: Creator | None = None):
        self.directory = Path(directory)
        self.file_size = file_size
        self.files: list[MappedFile] = []
        self._creator = creator
        self._lock = threading.RLock()  # guards the list, not the bytes
        self.flushed_where = 0
        self.pending_delete: list[MappedFile] = []  # out of the list, not destroyed yet (_lock)
        self.close_failures = 0  # mappings that would not close when they were destroyed
        self.held_too_long = 0  # deleted segments still held INTERVAL_FORCIBLY_S later
        self._reported_held: set[MappedFile] = set()

    # ---- loading --------------------------------------------------------------------------
    def load(self) -> None:
        """Map every existing segment; every loaded segment starts as full (recovery fixes it)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in self.directory.iterdir():
            if is_creating_name(path.name):
                log.warning("event=segment_removed path=%s reason=creation_interrupted", path)
                path.unlink()
            elif is_deleting_name(path.name):  # deleted while held, then the process ended
                log.warning("event=segment_removed path=%s reason=deleted_before_restart", path)
                path.unlink()
        entries = sorted(p for p in self.directory.iterdir() if not p.name.startswith("."))
        starts = []
        for path in entries:
            if path.is_dir() or path.suffix == ".tmp":
                raise StoreError(f"unexpected entry in {self.directory}: {path.name}")
            try:
                starts.append((parse_file_name(path.name), path))
            except StoreError as e:
                raise StoreError(f"unexpected entry in {self.directory}: {e}") from None
        starts.sort()
        # A zero-length last file is the remains of a crash during creation.
        if starts and starts[-1][1].stat().st_size == 0:
            log.warning("event=segment_removed path=%s reason=empty_last_file", starts[-1][1])
            starts[-1][1].unlink()
            starts.pop()
        prev = None
        for start, path in starts:
            size = path.stat().st_size
            if size != self.file_size:
                raise StoreError(
                    f"segment {path} has size {size}, expected mappedFileSize {self.file_size}"
                )
            if start % self.file_size:
                raise StoreError(f"segment {path.name} does not start on a segment boundary")
            if prev is not None and start != prev + self.file_size:
                raise StoreError(
                    f"gap in {self.directory}: segment {file_name(prev)} is followed by "
                    f"{path.name}, expected {file_name(prev + self.file_size)}"
                )
            prev = start
        for _, path in starts:
            mf = MappedFile(path, self.file_size, create=False)
            mf.set_positions(self.file_size)
            self.files.append(mf)

    # ---- lookup ---------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        with self._lock:
            return self.files[0].file_from_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        with self._lock:
            return self.files[-1].max_offset if self.files else 0

    def last(self) -> MappedFile | None:
        files = self.files
        return files[-1] if files else None

    def first(self) -> MappedFile | None:
        files = self.files
        return files[0] if files else None

    def find(self, offset: int) -> MappedFile | None:
        """The segment holding ``offset``, or None when it is outside the log."""
        files = self.files
        if not files:
            return None
        index = (offset - files[0].file_from_offset) // self.file_size
        if 0 <= index < len(files):
            mf = files[index]
            if mf.file_from_offset <= offset < mf.end_offset:
                return mf
        return None

    def find_held(self, offset: int) -> MappedFile | None:
        """``find``, held for the caller (who must ``release`` it); None when ``offset`` is
        outside the log or its segment is being deleted."""
        mf = self.find(offset)
        if mf is None or not mf.hold():
            return None
        return mf

    def last_for_write(self, start_offset: int = 0) -> MappedFile:
        """The segment to append to, creating the first or the next one when needed."""
        last = self.last()
        if last is not None and not last.is_full():
            return last
        if last is None:
            start = start_offset - start_offset % self.file_size
        else:
            start = last.end_offset
        return self._create(start)

    def _create(self, start: int) -> MappedFile:
        try:
            if self._creator is not None:
                mf = self._creator(start)
            else:
                mf = MappedFile(self.directory / file_name(start), self.file_size)
        except OSError as e:
            raise StoreError(f"cannot create segment {file_name(start)}: {e}") from e
        with self._lock:
            self.files.append(mf)
        return mf

    # ---- durability -----------------------------------------------------------------------
    def flush(self, least_pages: int = 0) -> int:
        """Flush the segment containing ``flushed_where`` (and roll over full ones)."""
        while True:
            mf = self.find(self.flushed_where)
            if mf is None:
                last = self.last()
                if last is not None and self.flushed_where < last.file_from_offset:
                    mf = self.find(last.file_from_offset)
                if mf is None:
                    return self.flushed_where
            pos = mf.flush(least_pages)
            where = mf.file_from_offset + pos
            self.flushed_where = max(self.flushed_where, where)
            if not mf.is_full() or mf is self.last():
                return self.flushed_where

    # ---- truncation and deletion ----------------------------------------------------------
    def truncate_dirty(self, offset: int) -> None:
        """Make ``offset`` the end of the log: erase bytes at or after it, on disk."""
        with self._lock:
            keep = []
            gone = []
            for mf in self.files:
                if mf.file_from_offset >= offset and not (
                    offset == mf.file_from_offset and mf is self.files[0]
                ):
                    log.info("event=segment_removed path=%s reason=truncate offset=%d",
                             mf.path.name, offset)
                    gone.append(mf)
                elif mf.end_offset > offset:
                    mf.zero_from(offset - mf.file_from_offset)
                    keep.append(mf)
                else:
                    keep.append(mf)
            self.files = keep
            self.flushed_where = min(self.flushed_where, offset)
        for mf in gone:  # outside the lock: a reader may hold one for a moment
            self._retire(mf)

    def delete_first(self, count: int) -> list[MappedFile]:
        """Remove the ``count`` oldest segments (never the last one); each is unmapped and
        deleted once no reader holds it (``pending_delete`` until then)."""
        with self._lock:
            count = min(count, len(self.files) - 1)
            gone, self.files = self.files[:count], self.files[count:]
        for mf in gone:
            self._retire(mf)
        return gone

    def reset_empty(self, start_offset: int) -> None:
        """Drop every segment (a slave that must start at ``start_offset`` from scratch)."""
        with self._lock:
            gone, self.files = self.files, []
            self.flushed_where = start_offset
        for mf in gone:
            self._retire(mf)

    def _retire(self, mf: MappedFile, wait_s: float = DESTROY_WAIT_S) -> None:
        """Destroy a segment already out of the list, or keep it for ``retry_destroy``."""
        if mf.destroy(wait_s):
            return
        mf.hide()  # its name is free now; the mapping stays until it can close
        with self._lock:
            self.pending_delete.append(mf)
        self._report(mf, first=True)

    def _report(self, mf: MappedFile, first: bool) -> None:
        if mf.ref_count <= 0:  # nobody holds it: the mapping itself would not close
            if first:
                self.close_failures += 1
            log.error("event=segment_close_failed path=%s error=%r action=retry_in_cleanup",
                      mf.path, mf.close_error)
        else:
            log.warning("event=segment_delete_deferred path=%s readers=%d action=retry_in_cleanup",
                        mf.path, mf.ref_count)

    def retry_destroy(self) -> int:
        """Destroy what ``pending_delete`` holds where possible; returns how many are left."""
        with self._lock:
            pending = list(self.pending_delete)
        left = []
        for mf in pending:
            if mf.destroy(0.0):
                log.info("event=segment_removed path=%s reason=retried", mf.path)
                continue
            left.append(mf)
            if mf.held_too_long() and mf not in self._reported_held:
                self._reported_held.add(mf)
                self.held_too_long += 1
                log.error("event=segment_held_too_long path=%s readers=%d", mf.path,
                          mf.ref_count)
            elif mf.ref_count <= 0:
                self._report(mf, first=False)
        done = set(pending) - set(left)
        with self._lock:
            self.pending_delete = [m for m in self.pending_delete if m not in done]
            self._reported_held -= done
            return len(self.pending_delete)

    def shutdown(self) -> None:
        with self._lock:
            files = list(self.files)
        for mf in files:
            if not mf.close():
                self.close_failures += 1
                log.error("event=segment_close_failed path=%s error=%r at=shutdown", mf.path,
                          mf.close_error)
        if self.retry_destroy():
            log.error("event=segments_left_pending_delete count=%d (removed at the next start)",
                      len(self.pending_delete))
