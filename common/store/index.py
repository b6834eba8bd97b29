"""The IndexFile: a hash index from ``topic#key`` to CommitLog offsets (RocketMQ 4.x layout).

Files live in ``<root>/index/`` named by creation time ``yyyyMMddHHmmssSSS`` (local time, like
RocketMQ; names strictly increase). A file has ``40 + 4*slots + 20*maxIndexNum`` bytes (sparse
until written), all integers big-endian:

Header (40 bytes):

| off | field          | size | notes                                              |
|-----|----------------|------|----------------------------------------------------|
|   0 | beginTimestamp | 8    | store time (ms) of the first entry                 |
|   8 | endTimestamp   | 8    | store time (ms) of the last entry                  |
|  16 | beginPhyOffset | 8    | CommitLog offset of the first entry's message      |
|  24 | endPhyOffset   | 8    | CommitLog offset of the last entry's message       |
|  32 | hashSlotCount  | 4    | slots in use                                       |
|  36 | indexCount     | 4    | next index number; starts at 1 (0 = never written) |

Slot table at 40: ``maxHashSlotNum`` ints, the 1-based index number of the newest entry whose
hash falls in the slot (0 = empty). slot = hash % maxHashSlotNum.

Entries at ``40 + 4*slots + 20*n`` for index number n = 1 .. maxIndexNum-1 (n = 0 is never
used, so a file holds maxIndexNum - 1 keys):

| off | field     | size | notes                                                        |
|-----|-----------|------|--------------------------------------------------------------|
|   0 | keyHash   | 4    | abs(Java String.hashCode(topic#key)); Integer.MIN_VALUE -> 0 |
|   4 | phyOffset | 8    | CommitLog offset of the message                              |
|  12 | timeDiff  | 4    | (storeTimestamp - beginTimestamp) / 1000, clamped >= 0       |
|  16 | prevIndex | 4    | index number of the previous entry in this slot's chain, 0   |

Only hashes are stored: a query returns every offset whose key *hash* matches, so the caller
must read each record and compare its topic and keys (hash collisions are filtered there).
Times in a query window match to the second (timeDiff precision), as in RocketMQ.

Differences from RocketMQ that keep the format: the first entry of a file always has
timeDiff 0 (RocketMQ computes it against the seeded begin time, then overwrites that time);
re-dispatch of the message at ``endPhyOffset`` adds only the keys not already indexed (RocketMQ
indexes it twice); duplicate keys within one message are indexed once.
"""

from __future__ import annotations

import datetime as dt
import errno
import functools
import logging
import mmap
import os
import shutil
import sys
import threading
from collections.abc import Callable
from operator import mul
from pathlib import Path
from struct import Struct

from common.core.errors import StoreError
from common.core.message import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, java_hash
from common.store import native
from common.store.extensions import DispatchRequest, StoreExtensions
from common.store.mapped_file import CREATING_SUFFIX

log = logging.getLogger("replog.store")

HEADER = Struct(">qqqqii")
assert HEADER.size == 40
SLOT = Struct(">i")
assert SLOT.size == 4
ENTRY = Struct(">iqii")
assert ENTRY.size == 20
HEADER_SIZE = HEADER.size
MAX_INT = 0x7FFFFFFF
PAGE_SIZE = mmap.PAGESIZE
ENTRIES_AHEAD = 64 << 10  # entry pages made writable past the next key (one call per 3 276 keys)
NAME_LENGTH = 17  # yyyyMMddHHmmssSSS
ZERO_ENTRY = bytes(ENTRY.size)

_POWERS: dict[int, tuple[int, ...]] = {}
_FAST_HASH_MAX_UNITS = 1024
_UTF16_NATIVE = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"
_SHIFTS = tuple(pow(31, n, 1 << 32) for n in range(_FAST_HASH_MAX_UNITS + 1))


def index_file_size(max_hash_slot_num: int, max_index_num: int) -> int:
    return HEADER_SIZE + SLOT.size * max_hash_slot_num + ENTRY.size * max_index_num


def _powers(n: int) -> tuple[int, ...]:
    """31**(n-1), ..., 31**0 modulo 2**32: String.hashCode as a dot product."""
    pows = _POWERS.get(n)
    if pows is None:
        pows = tuple(pow(31, n - 1 - i, 1 << 32) for i in range(n))
        _POWERS[n] = pows
    return pows


def _units(text: str) -> bytes | memoryview:
    """The UTF-16 code units of ``text`` as a sequence of ints (bytes when it is ASCII)."""
    if text.isascii():
        return text.encode("ascii")
    return memoryview(text.encode(_UTF16_NATIVE)).cast("H")


def _unsigned_hash(units: bytes | memoryview) -> int:
    return sum(map(mul, units, _powers(len(units)))) & 0xFFFFFFFF


def _signed(h: int) -> int:
    return h - (1 << 32) if h & 0x80000000 else h


def _positive(h: int) -> int:
    """Math.abs of a signed int, 0 for Integer.MIN_VALUE (RocketMQ ``indexKeyHashMethod``)."""
    return 0 if h == -(1 << 31) else abs(h)


def string_hash(text: str) -> int:
    """Java ``String.hashCode()``: same result as ``common.core.message.java_hash``, faster."""
    units = _units(text)
    if len(units) > _FAST_HASH_MAX_UNITS:
        return java_hash(text)
    return _signed(_unsigned_hash(units))


def index_hash(key: str) -> int:
    """RocketMQ ``indexKeyHashMethod``: Math.abs(hashCode), and 0 when that is negative."""
    return _positive(string_hash(key))


@functools.lru_cache(maxsize=4096)
def _prefix_hash(topic: str) -> int:
    return string_hash(f"{topic}#") & 0xFFFFFFFF


def key_hash(topic: str, key: str) -> int:
    """``index_hash(topic + "#" + key)``, reusing the hash of the topic prefix.

    hashCode(a + b) = hashCode(a) * 31**len(b) + hashCode(b) (mod 2**32, len in UTF-16 units).
    Inlined: this runs for every key the reput thread indexes.
    """
    units = key.encode("ascii") if key.isascii() else _units(key)
    n = len(units)
    if n > _FAST_HASH_MAX_UNITS:
        return index_hash(f"{topic}#{key}")
    pows = _POWERS.get(n) or _powers(n)
    h = (_prefix_hash(topic) * _SHIFTS[n] + sum(map(mul, units, pows))) & 0xFFFFFFFF
    # abs() of the signed value; Integer.MIN_VALUE (0x80000000) gives 0 as in RocketMQ.
    return (0x100000000 - h) & 0x7FFFFFFF if h & 0x80000000 else h


def index_keys(properties: dict[str, str]) -> list[str]:
    """The keys a message is indexed under: UNIQ_KEY, then each space-separated KEYS entry."""
    keys = []
    uniq = properties.get(PROPERTY_UNIQ_KEY)
    if uniq:
        keys.append(uniq)
    raw = properties.get(PROPERTY_KEYS)
    if raw:
        keys.extend(k for k in raw.split(KEY_SEPARATOR) if k)
    return keys


def name_time(name: str) -> dt.datetime:
    """The creation time in an index file name; StoreError unless it is yyyyMMddHHmmssSSS."""
    if len(name) != NAME_LENGTH or not name.isascii() or not name.isdigit():
        raise StoreError(f"index file name {name!r} is not yyyyMMddHHmmssSSS")
    try:
        return dt.datetime.strptime(name, "%Y%m%d%H%M%S%f")
    except ValueError as e:
        raise StoreError(f"index file name {name!r} is not a valid time: {e}") from None


def time_name(when: dt.datetime) -> str:
    return when.strftime("%Y%m%d%H%M%S") + f"{when.microsecond // 1000:03d}"


class IndexHeaderError(StoreError):
    """An index file whose header cannot be right."""


class IndexFile:
    """One index file, mmap'd. Header fields are kept as attributes and written on every put."""

    def __init__(self, path: Path, max_hash_slot_num: int, max_index_num: int, *,
                 create: bool, end_phy_offset: int = 0, end_timestamp: int = 0):
        self.path = Path(path)
        self.slots = max_hash_slot_num
        self.max_index_num = max_index_num
        self.file_size = index_file_size(max_hash_slot_num, max_index_num)
        self._entries_at = HEADER_SIZE + SLOT.size * max_hash_slot_num
        self._mm = _map(self.path, self.file_size, create)
        self._addr = native.address_of(self._mm)
        self._lock = threading.Lock()  # flush vs close
        self._slots_ready = False  # header and hash slots faulted in writable (_make_writable)
        self._entries_ready = self._entries_at  # entry pages faulted in writable below this
        self.dirty = create
        if create:
            self.begin_timestamp = self.end_timestamp = max(0, end_timestamp)
            self.begin_phy_offset = self.end_phy_offset = max(0, end_phy_offset)
            self.hash_slot_count = 0
            self.index_count = 1
            try:
                self._make_writable(self._entries_at + ENTRY.size)
            except OSError:
                self.destroy()
                raise
            self._write_header()
        else:
            self._read_header()

    def _read_header(self) -> None:
        (self.begin_timestamp, self.end_timestamp, self.begin_phy_offset, self.end_phy_offset,
         self.hash_slot_count, count) = HEADER.unpack_from(self._mm, 0)
        if count > self.max_index_num:
            self.close()
            raise IndexHeaderError(f"{self.path}: indexCount {count} exceeds maxIndexNum "
                                   f"{self.max_index_num}")
        problem = self._header_problem(count)
        if problem:
            self.close()
            raise IndexHeaderError(f"{self.path}: damaged header: {problem}. Nothing was changed; "
                             "remove the file to start without it (queries by key then miss "
                             "the keys it held)")
        self.index_count = max(1, count)

    def _header_problem(self, count: int) -> str:
        """What makes the header impossible ("" if nothing): its fields against each other
        and against its last entry (a file 0..1 entries long was never written: all zero)."""
        if count < 0:
            return f"indexCount {count} is negative"
        if not 0 <= self.hash_slot_count <= min(self.slots, max(count - 1, 0)):
            return f"hashSlotCount {self.hash_slot_count} for {max(count - 1, 0)} keys"
        if min(self.begin_timestamp, self.end_timestamp, self.begin_phy_offset,
               self.end_phy_offset) < 0:
            return "a negative timestamp or offset"
        if count > 1:
            if self.begin_phy_offset > self.end_phy_offset:
                return (f"beginPhyOffset {self.begin_phy_offset} > endPhyOffset "
                        f"{self.end_phy_offset}")
            last_phy = self.entry(count - 1)[1]
            if last_phy != self.end_phy_offset:
                return f"endPhyOffset {self.end_phy_offset}, but its last entry is at {last_phy}"
        return ""

    def _write_header(self) -> None:
        HEADER.pack_into(self._mm, 0, self.begin_timestamp, self.end_timestamp,
                         self.begin_phy_offset, self.end_phy_offset, self.hash_slot_count,
                         self.index_count)

    # ---- state ------------------------------------------------------------------------------
    def is_full(self) -> bool:
        return self.index_count >= self.max_index_num

    @property
    def key_count(self) -> int:
        return self.index_count - 1

    def is_blank(self) -> bool:
        """Never written and not seeded by a previous file."""
        return self.index_count <= 1 and self.end_phy_offset == 0 and self.end_timestamp == 0

    def time_matched(self, begin_ms: int, end_ms: int) -> bool:
        """RocketMQ ``isTimeMatched``: the window overlaps [beginTimestamp, endTimestamp]."""
        b, e = self.begin_timestamp, self.end_timestamp
        return (begin_ms < b and end_ms > e) or b <= begin_ms <= e or b <= end_ms <= e

    def entry(self, index: int) -> tuple[int, int, int, int]:
        """(keyHash, phyOffset, timeDiff, prevIndex) of index number ``index``."""
        h, phy, diff, prev = ENTRY.unpack_from(self._mm, self._entries_at + ENTRY.size * index)
        return h, phy, diff, prev

    # ---- writes -----------------------------------------------------------------------------
    def _make_writable(self, entries_end: int) -> None:
        """Before a store into the mapping: fault in writable the header and slots (once) and
        the entry pages below ``entries_end`` (and ENTRIES_AHEAD more while they can be had),
        so the file system gives them blocks now. The file is sparse: on a full file system a
        store into a page without a block is a SIGBUS; this is OSError(ENOSPC) instead, with
        nothing written. Where the kernel cannot populate, the stores fault as without it."""
        if not self._slots_ready:
            self._populate(0, self._entries_at, self._entries_at)
            self._slots_ready = True
        if entries_end > self._entries_ready:
            ahead = min(entries_end + ENTRIES_AHEAD, self.file_size)
            self._entries_ready = self._populate(self._entries_ready, entries_end, ahead)

    def _populate(self, start: int, need: int, want: int) -> int:
        """Populate ``[start, want)`` or at least ``[start, need)``; returns how far it got."""
        first = start // PAGE_SIZE * PAGE_SIZE
        for end in dict.fromkeys((want, need)):
            last = min(-(-end // PAGE_SIZE) * PAGE_SIZE, self.file_size)
            with self._lock:  # not unmapped meanwhile (close takes it too)
                if self._mm.closed:
                    raise StoreError(f"{self.path}: closed")
                result = native.populate_write_checked(self._addr, first, last - first)
            if result == 0:
                return last
            if result == native.UNSUPPORTED:
                return self.file_size
        raise OSError(errno.ENOSPC, f"{self.path}: no space for its pages below {need}")

    def put_key(self, key_hash: int, phy_offset: int, store_timestamp: int) -> bool:
        """Add one key; False when the file is full. OSError(ENOSPC), with nothing written,
        when the file system has no block for a page the key needs."""
        count = self.index_count
        if count >= self.max_index_num:
            return False
        entry_end = self._entries_at + ENTRY.size * (count + 1)
        if entry_end > self._entries_ready or not self._slots_ready:
            self._make_writable(entry_end)
        mm = self._mm
        slot_pos = HEADER_SIZE + SLOT.size * (key_hash % self.slots)
        head = SLOT.unpack_from(mm, slot_pos)[0]
        if head <= 0 or head > count:
            head = 0
        if count <= 1:
            self.begin_phy_offset = phy_offset
            self.begin_timestamp = store_timestamp
        diff = (store_timestamp - self.begin_timestamp) // 1000
        diff = 0 if diff < 0 or self.begin_timestamp <= 0 else min(diff, MAX_INT)
        ENTRY.pack_into(mm, self._entries_at + ENTRY.size * count, key_hash, phy_offset, diff,
                        head)
        SLOT.pack_into(mm, slot_pos, count)
        if head == 0:
            self.hash_slot_count += 1
        self.index_count = count + 1
        self.end_phy_offset = phy_offset
        self.end_timestamp = store_timestamp
        self._write_header()
        self.dirty = True
        return True

    def undo_torn_put(self) -> bool:
        """After a crash of the process alone: a put writes its entry, then its slot, then
        the header's count, so a kill between leaves an entry past the count and perhaps its
        slot naming it; the next put would take that number again and link the key's chain
        to itself. The slot goes back to the entry's prevIndex and the entry is erased.
        True when there was one."""
        count = self.index_count
        if count >= self.max_index_num:
            return False
        at = self._entries_at + ENTRY.size * count
        if at + ENTRY.size > self.file_size or self._mm[at : at + ENTRY.size] == ZERO_ENTRY:
            return False
        key_hash, phy, _, prev = self.entry(count)
        slot_pos = HEADER_SIZE + SLOT.size * (key_hash % self.slots)
        if SLOT.unpack_from(self._mm, slot_pos)[0] >= count:
            SLOT.pack_into(self._mm, slot_pos, prev if 0 < prev < count else 0)
        self._mm[at : at + ENTRY.size] = ZERO_ENTRY
        self.dirty = True
        log.warning("event=index_torn_put_undone path=%s index=%d offset=%d", self.path,
                    count, phy)
        return True

    def truncate(self, phy_offset: int) -> int:
        """Undo, newest first, every entry whose phyOffset >= ``phy_offset``; erased on disk.

        Entries are in phyOffset order, so they form a suffix. Undoing puts in reverse restores
        each slot to the head it had before. Returns the number of entries removed. The new
        endTimestamp is the last kept entry's time at second precision.
        """
        count = self.index_count
        n = count
        while n > 1:
            key_hash, phy, _, prev = self.entry(n - 1)
            if phy < phy_offset:
                break
            SLOT.pack_into(self._mm, HEADER_SIZE + SLOT.size * (key_hash % self.slots), prev)
            if prev == 0:
                self.hash_slot_count -= 1
            at = self._entries_at + ENTRY.size * (n - 1)
            self._mm[at : at + ENTRY.size] = ZERO_ENTRY
            n -= 1
        if n == count:
            return 0
        self.index_count = n
        if n > 1:
            _, phy, diff, _ = self.entry(n - 1)
            self.end_phy_offset = phy
            self.end_timestamp = self.begin_timestamp + diff * 1000
        else:
            self.end_phy_offset = self.begin_phy_offset
            self.end_timestamp = self.begin_timestamp
        self._write_header()
        self.dirty = True
        self.flush()
        return count - n

    # ---- reads ------------------------------------------------------------------------------
    def select(self, key_hash: int, max_nums: int, begin_ms: int, end_ms: int,
               out: list[int]) -> None:
        """Append to ``out`` (newest first) the offsets of entries with ``key_hash`` in the window."""
        count = self.index_count
        if count <= 1:
            return
        mm = self._mm
        index = SLOT.unpack_from(mm, HEADER_SIZE + SLOT.size * (key_hash % self.slots))[0]
        if index <= 0 or index > count:
            return
        base, size, begin = self._entries_at, ENTRY.size, self.begin_timestamp
        for _ in range(count):  # a chain never has more links than entries
            if len(out) >= max_nums:
                return
            h, phy, diff, prev = ENTRY.unpack_from(mm, base + size * index)
            if diff < 0:
                return
            stored = begin + diff * 1000
            if h == key_hash and begin_ms <= stored <= end_ms:
                out.append(phy)
            if prev <= 0 or prev > count or prev == index or stored < begin_ms:
                return
            index = prev

    def hashes_at(self, phy_offset: int) -> tuple[set[int], bool]:
        """Hashes of the newest entries whose phyOffset == ``phy_offset``, and whether the walk
        reached the first entry (so the previous file may hold more of them)."""
        found: set[int] = set()
        n = self.index_count - 1
        while n >= 1:
            key_hash, phy, _, _ = self.entry(n)
            if phy != phy_offset:
                return found, False
            found.add(key_hash)
            n -= 1
        return found, True

    # ---- lifecycle --------------------------------------------------------------------------
    def flush(self) -> None:
        with self._lock:
            if self._mm.closed:
                return
            self.dirty = False
            native.msync(self._mm, self._addr, 0, self.file_size)  # GIL released (under _lock)

    def close(self) -> None:
        with self._lock:
            if not self._mm.closed:
                self._mm.close()

    def destroy(self) -> None:
        self.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        return (f"IndexFile({self.path.name}, keys={self.key_count}, "
                f"phy=[{self.begin_phy_offset}, {self.end_phy_offset}], "
                f"time=[{self.begin_timestamp}, {self.end_timestamp}])")


def _map(path: Path, size: int, create: bool) -> mmap.mmap:
    """mmap ``path`` read-write; StoreError on a size mismatch. A new file is sparse at ``size``
    and made under a hidden name, then renamed: no reader and no restart after a crash sees
    one of the wrong size (``IndexService.load`` removes what a crash left)."""
    try:
        fd = _create_file(path, size) if create else os.open(path, os.O_RDWR)
    except OSError as e:
        raise StoreError(f"cannot open index file {path}: {e}") from e
    try:
        actual = os.fstat(fd).st_size
        if actual != size:
            raise StoreError(f"index file {path} has size {actual}, expected {size} "
                             f"(maxHashSlotNum/maxIndexNum changed?)")
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def _create_file(path: Path, size: int) -> int:
    if path.exists():
        raise FileExistsError(errno.EEXIST, "exists", str(path))
    tmp = path.with_name(f".{path.name}{CREATING_SUFFIX}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        os.rename(tmp, path)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return fd


class IndexService:
    """All index files, oldest first; builds from the reput thread, queries from any thread.

    HA truncation (``truncate``) is exact: whole files beginning at or after the cut are
    deleted and, in the file straddling it, the newer entries are undone (slots restored,
    bytes zeroed on disk), so a query never returns an offset at or beyond the cut and the
    caller re-dispatches from the cut as usual.
    """

    def __init__(self, root: Path, max_hash_slot_num: int, max_index_num: int):
        if max_hash_slot_num <= 0 or max_index_num <= 1:
            raise StoreError("maxHashSlotNum must be > 0 and maxIndexNum > 1")
        self.directory = Path(root) / "index"
        self.slots = max_hash_slot_num
        self.max_index_num = max_index_num
        self.files: list[IndexFile] = []
        self._lock = threading.RLock()
        self._flushed_end_timestamp = 0

    # ---- loading ----------------------------------------------------------------------------
    def load(self, last_exit_ok: bool, index_msg_timestamp: int,
             page_cache_kept: bool = False) -> None:
        """Map every file; after a crash drop those with data newer than the checkpoint,
        unless the crash was the process's alone (``page_cache_kept``: every key written is
        there): then only the last file's last put may be torn, and is undone."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock:
            for leftover in self.directory.glob(f".*{CREATING_SUFFIX}"):
                log.warning("event=index_file_creation_unfinished path=%s", leftover)
                leftover.unlink()
            for path in sorted(p for p in self.directory.iterdir() if not p.name.startswith(".")):
                try:
                    name_time(path.name)
                except StoreError as e:
                    raise StoreError(f"unexpected entry in the index directory: {path} ({e})") \
                        from None
                if not path.is_file():
                    raise StoreError(f"unexpected entry in the index directory: {path}")
                try:
                    f = IndexFile(path, self.slots, self.max_index_num, create=False)
                except IndexHeaderError as e:
                    if last_exit_ok:
                        raise
                    # after a crash its header may be torn like any unflushed page; reput
                    # resumes at the last kept file's end and indexes the keys again
                    log.warning("event=index_file_dropped path=%s reason=%r after=abnormal_exit",
                                path, str(e))
                    path.unlink()
                    continue
                if not last_exit_ok and f.end_timestamp > index_msg_timestamp \
                        and not page_cache_kept:
                    log.warning("event=index_file_dropped path=%s end_timestamp=%d "
                                "checkpoint=%d reason=abnormal_exit", path, f.end_timestamp,
                                index_msg_timestamp)
                    f.destroy()
                    continue
                self.files.append(f)
            if page_cache_kept and not last_exit_ok and self.files:
                self.files[-1].undo_torn_put()
            self._flushed_end_timestamp = self._durable_end_timestamp()

    def _durable_end_timestamp(self) -> int:
        """endTimestamp of the newest full file that is on disk (0 if none)."""
        return max((f.end_timestamp for f in self.files if f.is_full() and not f.dirty),
                   default=0)

    # ---- building ---------------------------------------------------------------------------
    def build(self, topic: str, keys: list[str], phy_offset: int, store_timestamp: int) -> int:
        """Index the message at ``phy_offset`` under ``topic#key`` for each key.

        Messages below the last file's endPhyOffset were indexed already and are skipped; for
        the message at endPhyOffset only the keys not yet there are added. Returns keys added.
        """
        if not keys:
            return 0
        with self._lock:
            f = self._writable()
            done = self._indexed_hashes(f, phy_offset)
            if done is None:
                return 0
            added = 0
            for key in dict.fromkeys(keys):
                if not key:
                    continue
                h = key_hash(topic, key)
                if h in done:
                    continue
                if not f.put_key(h, phy_offset, store_timestamp):
                    f = self._roll(f)
                    if not f.put_key(h, phy_offset, store_timestamp):
                        raise StoreError(f"new index file {f.path} refused a key")
                added += 1
            return added

    def _indexed_hashes(self, f: IndexFile, phy_offset: int) -> set[int] | None:
        """None: the message is wholly indexed already; else hashes of its keys already there."""
        if f.is_blank() or phy_offset > f.end_phy_offset:
            return set()
        if phy_offset < f.end_phy_offset:
            return None
        found, reached_start = f.hashes_at(phy_offset)
        if reached_start and len(self.files) > 1 and self.files[-1] is f:
            more, _ = self.files[-2].hashes_at(phy_offset)
            found |= more
        return found

    def _writable(self) -> IndexFile:
        if not self.files:
            return self._create(0, 0)
        last = self.files[-1]
        return self._roll(last) if last.is_full() else last

    def _roll(self, full: IndexFile) -> IndexFile:
        log.info("event=index_file_full path=%s keys=%d", full.path.name, full.key_count)
        return self._create(full.end_phy_offset, full.end_timestamp)

    def _create(self, end_phy_offset: int, end_timestamp: int) -> IndexFile:
        path = self.directory / self._new_name()
        self.directory.mkdir(parents=True, exist_ok=True)
        f = IndexFile(path, self.slots, self.max_index_num, create=True,
                      end_phy_offset=end_phy_offset, end_timestamp=end_timestamp)
        self.files.append(f)
        return f

    def _new_name(self) -> str:
        """Now as yyyyMMddHHmmssSSS, moved past the newest existing name (same ms, clock skew)."""
        now = dt.datetime.now()
        when = now.replace(microsecond=now.microsecond // 1000 * 1000)
        if self.files:
            when = max(when, name_time(self.files[-1].path.name) + dt.timedelta(milliseconds=1))
        for _ in range(1000):
            name = time_name(when)
            if not (self.directory / name).exists():
                return name
            when += dt.timedelta(milliseconds=1)
        raise StoreError(f"no free index file name near {time_name(when)} in {self.directory}")

    # ---- queries ----------------------------------------------------------------------------
    def query(self, topic: str, key: str, max_nums: int, begin_ms: int, end_ms: int) -> list[int]:
        """CommitLog offsets of messages indexed under ``topic#key`` stored in [begin, end].

        Newest first, across files newest first; at most ``max_nums``. Offsets whose key merely
        shares the hash are included: the caller must check the record's topic and keys.
        """
        h = key_hash(topic, key)
        out: list[int] = []
        with self._lock:
            for f in reversed(self.files):
                if f.time_matched(begin_ms, end_ms):
                    f.select(h, max_nums, begin_ms, end_ms, out)
                if f.begin_timestamp < begin_ms or len(out) >= max_nums:
                    break
        return out

    def find(self, topic: str, key: str, accept: Callable[[int], bool], begin_ms: int = 0,
             end_ms: int = 2**62) -> int | None:
        """The newest offset indexed under ``topic#key`` that ``accept`` takes, or None.

        Reads past any number of offsets it refuses, a file at a time: only hashes are stored,
        and a Java hash collides at will (``"Aa"`` and ``"BB"``), so anyone who may send to
        ``topic`` can put as many entries as they like on the hash of any key. A look-up that
        stops after a fixed number of hits misses the record it looks for behind them.
        """
        h = key_hash(topic, key)
        with self._lock:
            files = list(reversed(self.files))
        for f in files:
            out: list[int] = []
            with self._lock:
                if f not in self.files:  # deleted meanwhile: older files went with it
                    return None
                if f.time_matched(begin_ms, end_ms):
                    f.select(h, sys.maxsize, begin_ms, end_ms, out)
            found = next(filter(accept, out), None)
            if found is not None:
                return found
            if f.begin_timestamp < begin_ms:
                return None
        return None

    # ---- durability -------------------------------------------------------------------------
    def flush(self) -> int:
        """msync every dirty file; returns ``flushed_end_timestamp`` for the checkpoint."""
        with self._lock:
            files = list(self.files)
        for f in files:
            if f.dirty:
                full = f.is_full()
                f.flush()
                if full:
                    with self._lock:
                        self._flushed_end_timestamp = max(self._flushed_end_timestamp,
                                                          f.end_timestamp)
        return self._flushed_end_timestamp

    @property
    def flushed_end_timestamp(self) -> int:
        """Store time up to which the index is complete on disk: the endTimestamp of the newest
        full file flushed (RocketMQ ``indexMsgTimestamp``). The file being written is never
        counted, so after a crash it is dropped by ``load`` and must be rebuilt by re-dispatching
        from a message stored at or before this time."""
        return self._flushed_end_timestamp

    # ---- deletion and truncation ------------------------------------------------------------
    def delete_expired(self, min_commitlog_offset: int) -> int:
        """Delete the oldest files (never the last) whose endPhyOffset < the CommitLog min."""
        with self._lock:
            count = 0
            for f in self.files[:-1]:
                if f.end_phy_offset >= min_commitlog_offset:
                    break
                count += 1
            gone, self.files = self.files[:count], self.files[count:]
        for f in gone:
            log.info("event=index_file_deleted path=%s end_phy_offset=%d min=%d",
                     f.path.name, f.end_phy_offset, min_commitlog_offset)
            f.destroy()
        return count

    def truncate(self, phy_offset: int) -> None:
        """Forget every key of messages at or after ``phy_offset`` (HA truncation), on disk."""
        with self._lock:
            while self.files and self.files[-1].begin_phy_offset >= phy_offset:
                f = self.files.pop()
                log.info("event=index_file_deleted path=%s reason=truncate offset=%d",
                         f.path.name, phy_offset)
                f.destroy()
            if self.files:
                removed = self.files[-1].truncate(phy_offset)
                log.info("event=index_truncated path=%s offset=%d entries_removed=%d",
                         self.files[-1].path.name, phy_offset, removed)
            self._flushed_end_timestamp = min(self._flushed_end_timestamp,
                                              self._durable_end_timestamp())

    # ---- lifecycle --------------------------------------------------------------------------
    def destroy(self) -> None:
        with self._lock:
            for f in self.files:
                f.destroy()
            self.files = []
            self._flushed_end_timestamp = 0
            shutil.rmtree(self.directory, ignore_errors=True)

    def shutdown(self) -> None:
        """Flush and unmap every file."""
        self.flush()
        with self._lock:
            for f in self.files:
                f.close()


class IndexDispatcher:
    """The IndexFile as reput's first record dispatcher (RocketMQ's BuildIndex): a record's
    KEYS and UNIQ_KEY, and ``name + value`` of each property a feature indexes (``index``)."""

    name = "index"

    def __init__(self, index: IndexService, extensions: StoreExtensions):
        self._index = index
        self._extensions = extensions
        self._properties: list[str] = []
        self.watches: tuple[str, ...] = ()

    def index_property(self, name: str) -> None:
        """Index ``name + value`` of every record carrying property ``name`` (the schedule's
        source offset on a delivered message: where its exactly-once check looks)."""
        if name not in self._properties:
            self._properties.append(name)
        self.watches = tuple(self._properties)
        self._extensions.watch(name)

    def dispatch(self, req: DispatchRequest) -> None:
        keys = list(req.keys)
        props = req.properties
        for name in self._properties:
            value = props.get(name)
            if value is not None:
                keys.append(name + value)
        if keys:
            self._index.build(req.topic, keys, req.phy_offset, req.store_timestamp)
