"""Pre-allocation of CommitLog segments (RocketMQ ``AllocateMappedFileService``).

When the log asks for the segment starting at ``start``, the service hands over the one it
prepared (or creates it inline on a miss) and queues ``start + size`` and ``start + 2*size`` for
a background thread, so that rolling to a new segment never waits for file creation and, with
``warmMapedFileEnable``, for the page faults of a fresh mapping.

Without warm-up the same thread keeps the pages just ahead of the writer faulted in: the log asks
``prefault(segment, upto)`` every PREFAULT_STEP bytes written, and a prepared segment gets its
first PREFAULT_AHEAD bytes, while the log's writes go through the mapping (``mapped_writes``; a
slave's replicated bytes go in with pwrite, for which pages faulted in ahead only cost: they get
one 4 KiB page each where a write gets large folios). Each 4 KiB page faulted by the writer
itself costs it ~9 us on this VM (``MappedFile.prefault`` does it with one madvise per 4 MiB,
GIL released); the zero pages it dirties ahead are at most PREFAULT_AHEAD per segment.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from common.store.mapped_file import MappedFile, file_name

log = logging.getLogger("replog.store")

AHEAD = 2  # segments prepared ahead of the one in use
MAX_QUEUED = 4
PREFAULT_AHEAD = 16 << 20  # bytes kept faulted in past the write position
PREFAULT_STEP = 4 << 20  # written bytes between two requests


class AllocateService:
    def __init__(self, directory: Path, file_size: int, warm: bool = False, sync_warm: bool = False):
        self.directory = Path(directory)
        self.file_size = file_size
        self.warm = warm
        self.sync_warm = sync_warm
        self._ready: dict[int, MappedFile] = {}
        self._wanted: list[int] = []
        self._creating = -1
        self._prefault: tuple[MappedFile, int] | None = None  # the newest request only
        self.mapped_writes = True  # False while the log appends with pwrite (a slave)
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="replog-allocate", daemon=True)
        self.hits = 0
        self.misses = 0

    def start(self) -> None:
        self._thread.start()

    def get(self, start: int) -> MappedFile:
        """The segment at ``start``: prepared if available, otherwise created now."""
        with self._cond:
            while start == self._creating:
                self._cond.wait()  # the thread is mapping this very file: take its result
            mf = self._ready.pop(start, None)
            for s in [s for s in self._ready if s < start]:
                self._ready.pop(s).close()  # behind the log's end: in use or cut, never unlink
            if start in self._wanted:
                self._wanted.remove(start)
            for k in range(1, AHEAD + 1):
                nxt = start + k * self.file_size
                if nxt not in self._ready and nxt not in self._wanted and nxt != self._creating:
                    self._wanted.append(nxt)
            del self._wanted[:-MAX_QUEUED]
            self._cond.notify_all()
        if mf is not None:
            self.hits += 1
            return mf
        self.misses += 1
        return self._make(start)

    def prefault(self, mf: MappedFile, upto: int) -> None:
        """Putting thread: have ``mf`` faulted in up to ``upto`` soon (replaces an older ask)."""
        with self._cond:
            self._prefault = (mf, upto)
            self._cond.notify_all()

    def _make(self, start: int, ahead: int = 0) -> MappedFile:
        mf = MappedFile(self.directory / file_name(start), self.file_size)
        if self.warm:
            mf.warm(self.sync_warm)
        elif ahead and self.mapped_writes:
            mf.prefault(ahead)
        return mf

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and not self._wanted and self._prefault is None:
                    self._cond.wait()
                if self._stopped:
                    return
                ask, self._prefault = self._prefault, None
            if ask is not None:
                try:
                    ask[0].prefault(ask[1])
                except OSError as e:  # not fatal: the writer faults the pages itself
                    log.warning("event=prefault_failed segment=%s error=%s", ask[0].path.name, e)
            with self._cond:
                if self._stopped or not self._wanted:
                    continue
                start = self._wanted.pop(0)
                if start in self._ready:
                    continue
                self._creating = start
            mf = None
            try:
                mf = self._make(start, PREFAULT_AHEAD)
            except OSError as e:
                log.error("event=preallocate_failed segment=%s error=%s", file_name(start), e)
            with self._cond:
                self._creating = -1
                if mf is not None:
                    self._ready[start] = mf
                self._cond.notify_all()

    def discard(self) -> None:
        """Delete every prepared, unused segment (shutdown, truncation)."""
        with self._cond:
            ready, self._ready = self._ready, {}
            self._wanted.clear()
        for mf in ready.values():
            mf.destroy()

    def shutdown(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.discard()
