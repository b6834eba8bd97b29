"""ConsumeQueues: per (topic, queueId) arrays of fixed-size entries pointing into the CommitLog.

Byte-compatible with Apache RocketMQ 4.x ``ConsumeQueue``. A queue lives in
``<root>/consumequeue/<topic>/<queueId>/`` as segments of ``mappedFileSizeConsumeQueue`` bytes
(a multiple of 20), each named by its start *byte* offset in the queue as 20 digits. Entry ``n``
(the queue offset) sits at queue byte offset ``20 * n``:

| off | field          | size | notes                                                  |
|-----|----------------|------|--------------------------------------------------------|
|   0 | commitLogOffset| 8    | PHYSICALOFFSET of the record (signed long, big-endian) |
|   8 | size           | 4    | TOTALSIZE of the record                                |
|  12 | tagsCode       | 8    | Java String.hashCode of TAGS, 0 without tags           |

A queue that starts at a queue offset > 0 (its first segment created for a later offset) is
padded from the start of that segment with BLANK entries ``(0, 0x7FFFFFFF, 0)``, as RocketMQ's
``fillPreBlank`` does; the min queue offset then points past them. Bytes after the last entry
are zero; recovery and truncation erase on disk whatever follows the cut.

Threading: ``put`` comes from the single reput thread, reads from request threads, deletion
from the clean service. Every queue operation takes the queue's own lock, so a reader never
touches a segment that is being destroyed; creating a queue is guarded by the store's lock.
"""

from __future__ import annotations

import logging
import shutil
import struct
import threading
from collections.abc import Callable
from itertools import chain
from pathlib import Path

from common.core.errors import StoreError
from common.store.commit_log import TOPIC_PATTERN
from common.store.mapped_file import MappedFile
from common.store.mapped_file_queue import MappedFileQueue

log = logging.getLogger("replog.store")

CQ_ENTRY = struct.Struct(">qiq")
assert CQ_ENTRY.size == 20
CQ_UNIT = CQ_ENTRY.size
BLANK_SIZE = 0x7FFFFFFF  # size field of a pre-fill entry (Integer.MAX_VALUE)
BLANK_ENTRY = CQ_ENTRY.pack(0, BLANK_SIZE, 0)
_ENTRIES_STRUCTS: dict[int, struct.Struct] = {}


def _entries_struct(count: int) -> struct.Struct:
    """``count`` entries in one pack (one call, not one per entry: a batch's 64 entries)."""
    packer = _ENTRIES_STRUCTS.get(count)
    if packer is None:
        packer = struct.Struct(">" + "qiq" * count)
        if count <= 1024:  # the usual batch sizes; a longer run is packed once and forgotten
            _ENTRIES_STRUCTS[count] = packer
    return packer

Entry = tuple[int, int, int]  # (phy_offset, size, tags_code)


def is_blank(phy_offset: int, size: int) -> bool:
    """A pre-fill entry written before the first real entry of a queue that starts late."""
    return phy_offset == 0 and size == BLANK_SIZE


def is_valid(phy_offset: int, size: int) -> bool:
    """RocketMQ's recovery test for an entry (blank entries pass it too)."""
    return phy_offset >= 0 and size > 0


class ConsumeQueue:
    """One logical queue: ``queue_offset -> (phy_offset, size, tags_code)``."""

    def __init__(self, root: Path, topic: str, queue_id: int, file_size: int):
        if file_size < CQ_UNIT or file_size % CQ_UNIT:
            raise StoreError(f"consume queue file size {file_size} is not a multiple of {CQ_UNIT}")
        self.topic = topic
        self.queue_id = queue_id
        self.file_size = file_size
        self.directory = Path(root) / "consumequeue" / topic / str(queue_id)
        self._mfq = MappedFileQueue(self.directory, file_size)
        self._lock = threading.RLock()
        self._min_logic = 0  # queue *byte* offset of the first live entry (minLogicOffset)
        self._max_phy = 0  # end (offset + size) of the last entry's record
        self.last_error = ""  # why the last put or put_many returned False
        self.cut_since_load = False  # entries were erased by recovery or a truncation

    # ---- offsets --------------------------------------------------------------------------
    @property
    def min_queue_offset(self) -> int:
        with self._lock:
            return self._min_logic // CQ_UNIT

    @property
    def max_queue_offset(self) -> int:
        """The next queue offset to be written."""
        with self._lock:
            return self._mfq.max_offset // CQ_UNIT

    @property
    def max_phy_offset(self) -> int:
        """End of the last entry's CommitLog record: every record of this queue below it is in
        the queue. 0 for an empty queue; after ``truncate_dirty`` left no entry, the cut."""
        with self._lock:
            return self._max_phy

    # ---- loading and recovery ---------------------------------------------------------------
    def load(self) -> None:
        """Map the existing segments (all considered full until ``recover``)."""
        with self._lock:
            self._mfq.load()
            self._min_logic = self._mfq.min_offset

    def recover(self) -> None:
        """Find the last valid entry (from the third-last segment on) and cut after it on disk."""
        with self._lock:
            files = self._mfq.files
            if not files:
                return
            index = max(0, len(files) - 3)
            end = files[index].file_from_offset
            while index < len(files):
                pos = _valid_prefix(files[index])
                end = files[index].file_from_offset + pos
                if pos < self.file_size:
                    break
                index += 1
            self._cut(end, scan_tail=True)
            self._max_phy = self._last_phy_end()
            self._min_logic = self._first_live(0)
            log.debug("event=cq_recovered topic=%s queue=%d min=%d max=%d max_phy=%d",
                     self.topic, self.queue_id, self._min_logic // CQ_UNIT,
                     end // CQ_UNIT, self._max_phy)

    def _cut(self, logic_end: int, scan_tail: bool) -> None:
        """Make ``logic_end`` the end of the queue; erase what follows on disk.

        ``scan_tail`` (recovery): positions are not trusted, so the containing segment's tail is
        scanned for non-zero bytes instead of zeroing up to the wrote position.
        """
        mf = self._mfq.find(logic_end) if scan_tail else None
        if mf is not None:
            pos = logic_end - mf.file_from_offset
            erased = mf.zero_tail_if_dirty(pos)
            if erased:
                log.warning("event=cq_tail_cut path=%s pos=%d bytes=%d", mf.path, pos, erased)
                self.cut_since_load = True
            mf.set_positions(pos)
        if scan_tail:  # positions not trusted: a later segment with an entry is a loss
            dropped = any(f.file_from_offset >= logic_end and f is not mf
                          and bytes(f.buffer[:CQ_UNIT]) != bytes(CQ_UNIT)
                          for f in self._mfq.files)
        else:
            dropped = self._mfq.max_offset > logic_end
        if dropped:
            log.warning("event=cq_cut topic=%s queue=%d queue_offset=%d", self.topic,
                        self.queue_id, logic_end // CQ_UNIT)
            self.cut_since_load = True
        self._mfq.truncate_dirty(logic_end)  # zeroes [cut, wrote) and drops later segments
        if scan_tail:
            self._mfq.flushed_where = logic_end  # what recovery found is on disk
        self._min_logic = min(self._min_logic, logic_end)

    # ---- writes -----------------------------------------------------------------------------
    def put(self, queue_offset: int, phy_offset: int, size: int, tags_code: int) -> bool:
        """Append one entry (RocketMQ ``putMessagePositionInfo``); idempotent on re-dispatch.

        True when the entry is in the queue (written now or before); False when no segment
        could be created or its pages had no space on disk (``last_error`` says which; nothing
        was written and the dispatcher retries).
        """
        with self._lock:
            if phy_offset + size <= self._max_phy:
                return True  # re-dispatch of a message already in the queue
            try:
                return self._put(queue_offset, phy_offset, size, tags_code)
            except (StoreError, OSError) as e:
                self.last_error = str(e)
                return False

    def _put(self, queue_offset: int, phy_offset: int, size: int, tags_code: int) -> bool:
        """``put`` under the lock; StoreError or OSError when the entry could not go in."""
        expected = queue_offset * CQ_UNIT
        mf = self._segment_for(expected)
        current = mf.max_offset
        if expected < current:
            log.warning("event=cq_build_repeatedly topic=%s queue=%d queue_offset=%d "
                        "current=%d", self.topic, self.queue_id, queue_offset,
                        current // CQ_UNIT)
            return True
        if expected != current:
            log.error("event=cq_order_wrong topic=%s queue=%d expected=%d current=%d "
                      "([BUG] logic queue order maybe wrong)", self.topic, self.queue_id,
                      queue_offset, current // CQ_UNIT)
        mf.append(CQ_ENTRY.pack(phy_offset, size, tags_code))
        self._max_phy = phy_offset + size
        return True

    def put_many(self, first_queue_offset: int, entries: list[Entry],
                 packed: bytes = b"") -> bool:
        """Append consecutive entries ``(phy_offset, size, tags_code)`` in one copy;
        ``packed``, when given, is the same entries already as bytes (the record writer's).

        The common case (reput of a batch, or of many puts to one queue): the entries continue
        the queue exactly and fit in the last segment. Anything else goes entry by entry
        through ``put``, which handles re-dispatch, gaps and segment rolls.
        """
        with self._lock:
            skip = 0
            while skip < len(entries) and entries[skip][0] + entries[skip][1] <= self._max_phy:
                skip += 1
            rest = entries[skip:] if skip else entries
            if not rest:
                return True
            queue_offset = first_queue_offset + skip
            expected = queue_offset * CQ_UNIT
            last = self._mfq.last()
            if (last is None or self._is_empty() or last.max_offset != expected
                    or last.remaining() < len(rest) * CQ_UNIT):
                return all(self.put(queue_offset + i, *e) for i, e in enumerate(rest))
            if len(packed) == len(entries) * CQ_UNIT:
                data = packed[skip * CQ_UNIT:] if skip else packed
            else:
                data = _entries_struct(len(rest)).pack(*chain.from_iterable(rest))
            try:
                last.append(data)
            except (StoreError, OSError) as e:
                self.last_error = str(e)
                return False
            phy, size, _ = rest[-1]
            self._max_phy = phy + size
            return True

    def _segment_for(self, expected: int) -> MappedFile:
        """The segment to append to; an empty queue starts at ``expected`` with blank fill."""
        if not self._mfq.files:
            self.directory.mkdir(parents=True, exist_ok=True)
        if self._is_empty() and self._mfq.max_offset != expected:
            self._mfq.reset_empty(expected)
            mf = self._mfq.last_for_write(expected)
            mf.append(BLANK_ENTRY * ((expected - mf.file_from_offset) // CQ_UNIT))
            self._min_logic = expected
            self._mfq.flushed_where = mf.file_from_offset
            return mf
        return self._mfq.last_for_write()

    def _is_empty(self) -> bool:
        files = self._mfq.files
        return not files or (len(files) == 1 and files[0].wrote_position == 0)

    # ---- reads ------------------------------------------------------------------------------
    def get(self, queue_offset: int) -> Entry | None:
        """``(phy_offset, size, tags_code)`` at ``queue_offset``, None outside [min, max)."""
        with self._lock:
            logic = queue_offset * CQ_UNIT
            if queue_offset < 0 or logic < self._min_logic:
                return None
            mf = self._mfq.find(logic)
            if mf is None or logic + CQ_UNIT > mf.max_offset:
                return None
            phy, size, tags = CQ_ENTRY.unpack_from(mf.buffer, logic - mf.file_from_offset)
            return phy, size, tags

    def entries(self, queue_offset: int, max_nums: int) -> list[tuple[int, int, int, int]]:
        """Up to ``max_nums`` ``(queue_offset, phy_offset, size, tags_code)`` from ``queue_offset``.

        Empty when ``queue_offset`` is outside [min, max). Crosses segment boundaries.
        """
        out: list[tuple[int, int, int, int]] = []
        with self._lock:
            logic = queue_offset * CQ_UNIT
            if queue_offset < 0 or logic < self._min_logic:
                return out
            while len(out) < max_nums:
                mf = self._mfq.find(logic)
                if mf is None:
                    break
                pos = logic - mf.file_from_offset
                want = (max_nums - len(out)) * CQ_UNIT
                raw = mf.read(pos, want)
                if not raw:
                    break
                qo = logic // CQ_UNIT
                out.extend((qo + i, *e) for i, e in enumerate(CQ_ENTRY.iter_unpack(raw)))
                logic += len(raw)
                if pos + len(raw) < self.file_size:
                    break
        return out

    def offset_by_time(self, timestamp_ms: int,
                       store_time_of: Callable[[int], int | None]) -> int:
        """First queue offset whose message was stored at or after ``timestamp_ms``.

        Binary search over [min, max) using ``store_time_of(phy_offset)`` (the STORETIMESTAMP of
        the record; None when the record is gone, which counts as older than any time). Returns
        ``max_queue_offset`` when every message is older, ``min_queue_offset`` when none is.
        """
        lo, hi = self.min_queue_offset, self.max_queue_offset
        while lo < hi:
            mid = (lo + hi) // 2
            entry = self.get(mid)
            stored = store_time_of(entry[0]) if entry is not None else None
            if stored is not None and stored >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        return lo

    # ---- truncation and deletion ----------------------------------------------------------
    def truncate_dirty(self, phy_offset: int) -> None:
        """Drop every entry whose CommitLog offset is >= ``phy_offset``, erasing it on disk."""
        with self._lock:
            files = self._mfq.files
            index = len(files) - 1
            while index >= 0 and files[index].wrote_position == 0:
                index -= 1  # an empty last segment has no first entry to look at
            while index >= 0:
                mf = files[index]
                phy, size, _ = CQ_ENTRY.unpack_from(mf.buffer, 0)
                if not (is_valid(phy, size) and phy < phy_offset):
                    index -= 1
                    continue
                keep = _prefix_below(mf, phy_offset)
                self._cut(mf.file_from_offset + keep, scan_tail=False)
                break
            else:
                self._cut(self._mfq.min_offset, scan_tail=False)
            # With no entry left on disk (older segments deleted), the cut bounds what was here.
            self._max_phy = self._last_phy_end() or min(self._max_phy, phy_offset)

    def delete_expired(self, min_commitlog_offset: int) -> int:
        """Delete non-last segments whose last entry points below the CommitLog min offset."""
        with self._lock:
            count = 0
            files = self._mfq.files
            for mf in files[:-1]:
                phy, _, _ = CQ_ENTRY.unpack_from(mf.buffer, self.file_size - CQ_UNIT)
                if phy >= min_commitlog_offset:
                    break
                count += 1
            if count:
                gone = self._mfq.delete_first(count)
                self._mfq.flushed_where = max(self._mfq.flushed_where, self._mfq.min_offset)
                log.info("event=cq_files_deleted topic=%s queue=%d count=%d",
                         self.topic, self.queue_id, len(gone))
            self.correct_min_offset(min_commitlog_offset)
            return count

    def correct_min_offset(self, min_commitlog_offset: int) -> None:
        """Min queue offset := first non-blank entry whose CommitLog offset >= the given one."""
        with self._lock:
            self._min_logic = self._first_live(min_commitlog_offset)

    def _first_live(self, min_phy: int) -> int:
        """Queue byte offset of the first non-blank entry with offset >= ``min_phy`` (binary)."""
        lo = self._mfq.min_offset // CQ_UNIT
        hi = self._mfq.max_offset // CQ_UNIT
        while lo < hi:
            mid = (lo + hi) // 2
            mf = self._mfq.find(mid * CQ_UNIT)
            assert mf is not None
            phy, size, _ = CQ_ENTRY.unpack_from(mf.buffer, mid * CQ_UNIT - mf.file_from_offset)
            if not is_blank(phy, size) and phy >= min_phy:
                hi = mid
            else:
                lo = mid + 1
        return lo * CQ_UNIT

    def _last_phy_end(self) -> int:
        """offset + size of the last non-blank entry, 0 when there is none."""
        for mf in reversed(self._mfq.files):
            pos = mf.wrote_position - CQ_UNIT
            if pos >= 0:
                phy, size, _ = CQ_ENTRY.unpack_from(mf.buffer, pos)
                return 0 if is_blank(phy, size) else phy + size
        return 0

    # ---- durability and lifecycle -----------------------------------------------------------
    def flush(self, least_pages: int = 0) -> bool:
        """Flush dirty pages (at least ``least_pages``); True when everything written is on disk.

        Unlike RocketMQ's "nothing moved" result, the answer says whether the queue is durable.
        """
        with self._lock:
            return self._mfq.flush(least_pages) >= self._mfq.max_offset

    def destroy(self) -> None:
        """Delete every segment and the queue's directory."""
        with self._lock:
            self._mfq.reset_empty(0)
            self._min_logic = 0
            self._max_phy = 0
            shutil.rmtree(self.directory, ignore_errors=True)

    def shutdown(self) -> None:
        with self._lock:
            self._mfq.shutdown()

    def retry_destroy(self) -> int:
        """Deleted segments not destroyed yet (``MappedFileQueue.retry_destroy``)."""
        with self._lock:
            return self._mfq.retry_destroy()

    @property
    def pending_delete(self) -> int:
        return len(self._mfq.pending_delete)

    @property
    def close_failures(self) -> int:
        return self._mfq.close_failures

    def __repr__(self) -> str:
        return (f"ConsumeQueue({self.topic}/{self.queue_id}, min={self.min_queue_offset}, "
                f"max={self.max_queue_offset}, max_phy={self.max_phy_offset})")


def _valid_prefix(mf: MappedFile) -> int:
    """Bytes of ``mf`` from its start that hold valid entries (RocketMQ's recovery scan)."""
    pos = 0
    for phy, size, _ in CQ_ENTRY.iter_unpack(mf.read(0, mf.wrote_position)):
        if not is_valid(phy, size):
            break
        pos += CQ_UNIT
    return pos


def _prefix_below(mf: MappedFile, phy_offset: int) -> int:
    """Bytes of ``mf``'s written entries that point below ``phy_offset`` (a prefix)."""
    pos = 0
    for phy, size, _ in CQ_ENTRY.iter_unpack(mf.read(0, mf.wrote_position)):
        if not is_valid(phy, size) or phy >= phy_offset:
            break
        pos += CQ_UNIT
    return pos


class ConsumeQueueStore:
    """Every ConsumeQueue of a store, under ``<root>/consumequeue/``."""

    def __init__(self, root: Path, file_size: int):
        self.root = Path(root)
        self.directory = self.root / "consumequeue"
        self.file_size = file_size
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.Lock()

    def _all(self) -> list[ConsumeQueue]:
        with self._lock:
            return list(self._queues.values())

    def load(self) -> None:
        """Discover and load every ``<topic>/<queueId>`` directory; StoreError on garbage."""
        if not self.directory.exists():
            return
        for topic_dir in sorted(self.directory.iterdir()):
            if topic_dir.name.startswith("."):
                continue
            if not topic_dir.is_dir() or not TOPIC_PATTERN.match(topic_dir.name):
                raise StoreError(f"unexpected entry in the consume queue directory: {topic_dir}")
            for queue_dir in sorted(topic_dir.iterdir()):
                if queue_dir.name.startswith("."):
                    continue
                if not queue_dir.is_dir() or not _is_queue_id(queue_dir.name):
                    raise StoreError(f"unexpected entry in a topic's consume queues: {queue_dir}")
                cq = ConsumeQueue(self.root, topic_dir.name, int(queue_dir.name), self.file_size)
                try:
                    cq.load()
                except StoreError as e:
                    cq.shutdown()
                    raise StoreError(f"cannot load consume queue {queue_dir}: {e}") from e
                self._queues[(cq.topic, cq.queue_id)] = cq

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self._queues.get(key)
        if cq is not None:
            return cq
        with self._lock:
            cq = self._queues.get(key)
            if cq is None:
                cq = ConsumeQueue(self.root, topic, queue_id, self.file_size)
                self._queues[key] = cq
            return cq

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self._queues.get((topic, queue_id))

    def recover_all(self) -> None:
        for cq in self._all():
            cq.recover()

    def max_phy_offset(self) -> int:
        """The highest CommitLog end any queue points to: where reput resumes (4.x)."""
        return max((cq.max_phy_offset for cq in self._all()), default=0)

    def take_cut_end(self) -> int | None:
        """The least ``max_phy_offset`` among queues cut since they were loaded (None: none
        was), and forget the cuts: reput must resume there, or the records behind the erased
        entries would never reach their queue again (re-dispatch is idempotent)."""
        cut = [cq for cq in self._all() if cq.cut_since_load]
        for cq in cut:
            cq.cut_since_load = False
        return min((cq.max_phy_offset for cq in cut), default=None)

    def truncate_dirty(self, phy_offset: int) -> None:
        for cq in self._all():
            cq.truncate_dirty(phy_offset)

    def delete_expired(self, min_commitlog_offset: int) -> int:
        """Segments deleted over all queues."""
        return sum(cq.delete_expired(min_commitlog_offset) for cq in self._all())

    def correct_min_offset(self, min_commitlog_offset: int) -> None:
        for cq in self._all():
            cq.correct_min_offset(min_commitlog_offset)

    def retry_destroy(self) -> int:
        """Retry the deleted segments not destroyed yet; how many are left over all queues."""
        return sum(cq.retry_destroy() for cq in self._all() if cq.pending_delete)

    def pending_delete(self) -> int:
        return sum(cq.pending_delete for cq in self._all())

    def close_failures(self) -> int:
        return sum(cq.close_failures for cq in self._all())

    def flush_all(self, least_pages: int = 0) -> bool:
        """Flush every queue; True when all of them are wholly on disk."""
        results = [cq.flush(least_pages) for cq in self._all()]
        return all(results)

    def topic_queue_table(self) -> dict[tuple[str, int], int]:
        """Next queue offset of every queue, as rebuilt from the queues after recovery."""
        return {(cq.topic, cq.queue_id): cq.max_queue_offset for cq in self._all()}

    def topics(self) -> dict[str, int]:
        """Queue count per topic: highest queue id seen + 1 (ids are dense in a topic config)."""
        out: dict[str, int] = {}
        for cq in self._all():
            out[cq.topic] = max(out.get(cq.topic, 0), cq.queue_id + 1)
        return out

    def destroy(self) -> None:
        """Delete every queue (a store whose CommitLog is gone)."""
        with self._lock:
            queues, self._queues = list(self._queues.values()), {}
        for cq in queues:
            cq.destroy()
        shutil.rmtree(self.directory, ignore_errors=True)

    def shutdown(self) -> None:
        for cq in self._all():
            cq.shutdown()


def _is_queue_id(name: str) -> bool:
    return name.isascii() and name.isdigit() and str(int(name)) == name and int(name) <= 0x7FFFFFFF
