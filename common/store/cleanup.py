"""Retention (RocketMQ ``CleanCommitLogService`` / ``CleanConsumeQueueService``).

CommitLog segments whose last write is older than ``fileReservedTime`` hours are deleted at the
``deleteWhen`` hour(s) (``"04"`` or ``"04;05"``), or at once when disk use passes
``diskMaxUsedSpaceRatio``; above ``FORCE_RATIO`` the oldest go whatever their age. Never the
segment being written, at most ``deleteFileBatchMax`` per pass. ConsumeQueue and index files
are then cleaned to the new minimum offset. Above ``FULL_RATIO`` the store stops taking writes
(SERVICE_NOT_AVAILABLE, "disk full") until space is back.

A deleted segment leaves the segment list at once but is unmapped only once no reader holds it
(``common/store/mapped_file.py``); one still held after ``DESTROY_WAIT_S``, or whose mapping
would not close (logged at ERROR, counted in ``segmentCloseFailures``), is retried at the start
of every pass (``MappedFileQueue.retry_destroy``).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from common.store.message_store import MessageStore

log = logging.getLogger("replog.store")

FORCE_RATIO = 85
FULL_RATIO = 90
DISK_FULL_REASON = "disk full"


def delete_hours(delete_when: str) -> set[int]:
    return {int(h) for h in delete_when.replace(",", ";").split(";") if h.strip().isdigit()}


class CleanService:
    def __init__(self, store: MessageStore):
        self._store = store
        cfg = store.cfg
        self.reserved_ms = cfg.fileReservedTime * 3_600_000
        self.hours = delete_hours(cfg.deleteWhen)
        self.max_ratio = cfg.diskMaxUsedSpaceRatio
        self.batch_max = max(1, cfg.deleteFileBatchMax)
        self.interval_s = cfg.cleanResourceInterval / 1000
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.disk_ratio = 0.0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="replog-clean", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_once()
            except Exception:
                log.exception("event=clean_failed")

    def used_ratio(self) -> float:
        usage = shutil.disk_usage(self._store.root)
        return 100.0 * usage.used / usage.total if usage.total else 0.0

    def run_once(self, force: bool = False) -> int:
        """One pass; ``force`` deletes expired segments now, whatever the hour. Segments
        deleted before but still held by a reader (or not closable) are retried first."""
        self._retry_pending()
        self.disk_ratio = ratio = self.used_ratio()
        self._guard_writes(ratio)
        in_window = time.localtime().tm_hour in self.hours
        if not (force or in_window or ratio >= self.max_ratio):
            return 0
        deleted = self._delete_segments(forcibly=ratio >= FORCE_RATIO)
        if deleted:
            self._clean_indexes()
        return deleted

    def _retry_pending(self) -> None:
        store = self._store
        if store.commit_log.queue.pending_delete:
            store.commit_log.queue.retry_destroy()
        store.cq_store.retry_destroy()

    def _guard_writes(self, ratio: float) -> None:
        cl = self._store.commit_log
        if ratio >= FULL_RATIO and cl.writeable:
            cl.writeable = False
            cl.not_writeable_reason = DISK_FULL_REASON
            log.error("event=disk_full ratio=%.1f", ratio)
        elif ratio < FULL_RATIO and not cl.writeable and cl.not_writeable_reason == DISK_FULL_REASON:
            cl.writeable = True
            cl.not_writeable_reason = ""
            log.warning("event=disk_ok ratio=%.1f", ratio)

    def _delete_segments(self, forcibly: bool) -> int:
        store = self._store
        now = time.time() * 1000
        count = 0
        for mf in store.commit_log.queue.files[:-1]:
            if count >= self.batch_max:
                break
            try:
                age_ms = now - mf.path.stat().st_mtime * 1000
            except FileNotFoundError:
                age_ms = self.reserved_ms
            if age_ms < self.reserved_ms and not forcibly:
                break
            if mf.end_offset > store.dispatched_phy_offset:
                break  # never delete what reput has not indexed yet
            count += 1
        if count:
            gone = store.commit_log.queue.delete_first(count)
            store.deleted_segments += len(gone)
            log.info("event=segments_deleted count=%d names=%s min_offset=%d", len(gone),
                     ",".join(mf.path.name for mf in gone), store.min_phy_offset)
        return count

    def _clean_indexes(self) -> None:
        store = self._store
        min_offset = store.min_phy_offset
        store.cq_store.delete_expired(min_offset)
        store.cq_store.correct_min_offset(min_offset)
        if store.index is not None:
            store.index.delete_expired(min_offset)

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=10)
