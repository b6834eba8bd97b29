"""The ordered segments of one log (RocketMQ ``MappedFileQueue``).

Segments are contiguous: segment i starts at ``first_start + i * file_size``. Loading refuses a
gap, a wrong size or a bad name. Truncation erases bytes on disk (zero + msync) and deletes whole
segments beyond the cut, so a crash after a truncation cannot resurrect what was cut.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from common.core.errors import StoreError
from common.store.mapped_file import MappedFile, file_name, is_creating_name, parse_file_name

log = logging.getLogger("replog.store")

# Creates the segment starting at the given offset (the allocator, or inline creation).
Creator = Callable[[int], MappedFile]


class MappedFileQueue:
    def __init__(self, directory: Path, file_size: int, creator: Creator | None = None):
        self.directory = Path(directory)
        self.file_size = file_size
        self.files: list[MappedFile] = []
        self._creator = creator
        self._lock = threading.RLock()  # guards the list, not the bytes
        self.flushed_where = 0

    # ---- loading --------------------------------------------------------------------------
    def load(self) -> None:
        """Map every existing segment; every loaded segment starts as full (recovery fixes it)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in self.directory.iterdir():
            if is_creating_name(path.name):
                log.warning("event=segment_removed path=%s reason=creation_interrupted", path)
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
            for mf in self.files:
                if mf.file_from_offset >= offset and not (
                    offset == mf.file_from_offset and mf is self.files[0]
                ):
                    log.info("event=segment_removed path=%s reason=truncate offset=%d",
                             mf.path.name, offset)
                    mf.destroy()
                elif mf.end_offset > offset:
                    mf.zero_from(offset - mf.file_from_offset)
                    keep.append(mf)
                else:
                    keep.append(mf)
            self.files = keep
            self.flushed_where = min(self.flushed_where, offset)

    def delete_first(self, count: int) -> list[MappedFile]:
        """Remove the ``count`` oldest segments (never the last one)."""
        with self._lock:
            count = min(count, len(self.files) - 1)
            gone, self.files = self.files[:count], self.files[count:]
        for mf in gone:
            mf.destroy()
        return gone

    def reset_empty(self, start_offset: int) -> None:
        """Drop every segment (a slave that must start at ``start_offset`` from scratch)."""
        with self._lock:
            for mf in self.files:
                mf.destroy()
            self.files = []
            self.flushed_where = start_offset

    def shutdown(self) -> None:
        with self._lock:
            for mf in self.files:
                mf.close()
