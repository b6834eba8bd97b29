"""The CommitLog: every message of every topic, appended in RocketMQ's record layout.

Writes happen under one put lock: each record's pieces (body CRC, topic and properties) are
prepared outside it; under it ``record_writer`` (C where built) writes the records straight into
the last segment with their queue offsets, physical offsets and store timestamp. When a record plus 8 bytes no longer fits, a BLANK record pads the segment and the
record goes to the next one. ``put_batch`` appends many records to one queue in one copy.
Pages the allocate thread has not faulted in ahead are faulted in by the put itself before the
copy: a full file system then refuses the put (SERVICE_NOT_AVAILABLE) instead of killing the
process with SIGBUS on the store.

A slave never puts: it calls ``append_replicated`` with bytes from its master, at exactly the
offset they had there, so its log is byte-identical.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, cast

from common.core import accel
from common.core.errors import CorruptionError, PutStatus, ReplicationFencedError, StoreError
from common.core.message import (
    Message,
    MessageExt,
    encode_msg_id,
    encode_properties,
    host_bytes,
)
from common.format import record, record_writer
from common.store.allocate import PREFAULT_AHEAD, PREFAULT_STEP, AllocateService
from common.store.mapped_file import MappedFile
from common.store.mapped_file_queue import MappedFileQueue

log = logging.getLogger("replog.store")
# A NamedTuple's __new__ is a Python function; tuple.__new__ with every field is not (per put)
_new_tuple = tuple.__new__

assert record.HEADER.size == 88  # _write copies the body at +88
TOPIC_PATTERN = re.compile(r"^(?!\.)[%|a-zA-Z0-9_.\-]+\Z")  # no leading dot: ".", ".." and ".x" are not queue directories
LOCALHOST = b"\x7f\x00\x00\x01"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class PutResult(NamedTuple):
    """A put's outcome. ``phy_offset``/``queue_offset`` are those of the first record."""

    status: PutStatus
    phy_offset: int = -1
    wrote_bytes: int = 0
    queue_id: int = -1
    queue_offset: int = -1
    store_timestamp: int = 0
    msg_count: int = 0
    record_offsets: tuple[int, ...] = ()
    store_ip: bytes = LOCALHOST
    store_port: int = 0
    remark: str = ""

    @property
    def end_phy_offset(self) -> int:
        return self.phy_offset + self.wrote_bytes

    @property
    def msg_id(self) -> str:
        return encode_msg_id(self.store_ip, self.store_port, self.phy_offset) if self.ok else ""

    @property
    def msg_ids(self) -> tuple[str, ...]:
        if not self.ok:
            return ()
        offsets = self.record_offsets or (self.phy_offset,)
        return tuple(encode_msg_id(self.store_ip, self.store_port, o) for o in offsets)

    @property
    def ok(self) -> bool:
        return self.status.stored


def refused(status: PutStatus, remark: str) -> PutResult:
    return PutResult(status=status, remark=remark)


@dataclass
class RecoveryReport:
    """What recovery did: where it started and ended, and what it cut and why."""

    abnormal: bool
    start_offset: int = 0
    end_offset: int = 0
    records: int = 0
    cut_reason: str = ""
    cut_bytes: int = 0
    segments_removed: list[str] = field(default_factory=list)


to_message = record.decode_message  # the store's name for it


class WriteDigest(NamedTuple):
    """What reput needs of one write whose records carry no user properties: their ConsumeQueue
    entries ``(phy, size, tagsCode 0)``, so reput need not parse back what was just encoded."""

    start: int
    end: int
    topic: str
    queue_id: int
    first_queue_offset: int
    entries: list[tuple[int, int, int]]
    store_timestamp: int
    cq: bytes = b""  # the entries as ConsumeQueue bytes (20 each), as the writer made them


DIGESTS_KEPT = 1024  # a reput further behind than this parses the records instead

MergedRun = tuple[list[tuple[int, int, int]], bytes, int, int, int]


def merge_run_py(digests: collections.deque[WriteDigest], first: WriteDigest, end: int,
                 max_records: int) -> MergedRun | None:
    """Take from the left of ``digests`` the writes that continue ``first`` (the digest just
    taken) in the log and in its queue, all ending by ``end``, until about ``max_records``
    entries: None when the next one does not continue it, else (entries, ConsumeQueue bytes,
    end, entry count, store timestamp) of the whole run; the bytes are b"" unless every digest
    had its own. The Python version of ``merge_run`` in ``common/store/_reput_scan.c``."""
    entries: list[tuple[int, int, int]] | None = None
    cqs: list[bytes] = []
    last_end = first.end
    count = len(first.entries)
    key = (first.topic, first.queue_id)
    store_timestamp = first.store_timestamp
    while digests and count < max_records:
        nxt = digests[0]  # the putting thread only appends at the other end
        if (nxt.start != last_end or nxt.end > end or (nxt.topic, nxt.queue_id) != key
                or nxt.first_queue_offset != first.first_queue_offset + count):
            break
        digests.popleft()
        if entries is None:
            entries = list(first.entries)
            cqs.append(first.cq)
        entries.extend(nxt.entries)
        cqs.append(nxt.cq)
        count += len(nxt.entries)
        last_end = nxt.end
        store_timestamp = nxt.store_timestamp
    if entries is None:
        return None
    cq = b"".join(cqs) if all(cqs) else b""  # all or none: put_many packs what has none
    return entries, cq, last_end, count, store_timestamp


# the same loop in C where built (common.core.accel): take_digest_run ~0.10 us a digest with
# it, ~0.34 with merge_run_py (timeit, runs of 64 single puts)
_merge_run = getattr(accel.load("common.store._reput_scan"), "merge_run", None) or merge_run_py


class CommitLog:
    def __init__(
        self,
        root: Path,
        file_size: int,
        *,
        max_message_size: int,
        store_ip: str = "127.0.0.1",
        store_port: int = 0,
        allocate: AllocateService | None = None,
        put_lock_busy_ms: int = 1000,
        append_prop_crc: bool = True,
        require_prop_crc_from: int | None = None,
    ):
        self.file_size = file_size
        self.max_message_size = max_message_size
        self.queue = MappedFileQueue(
            Path(root) / "commitlog", file_size, creator=allocate.get if allocate else None
        )
        self._allocate = allocate
        self._prefault_asked = (-1, 0)  # (segment start, populated-up-to last asked for)
        self.store_ip = host_bytes(store_ip)
        self.store_port = store_port
        self.put_lock = threading.Lock()
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        self.writeable = True
        self.not_writeable_reason = ""
        self.append_listeners: list[Callable[[int], None]] = []
        self._lock_since = 0.0
        self._busy_s = put_lock_busy_ms / 1000
        self.last_store_timestamp = 0
        self._topic_parts: dict[str, bytes] = {}
        self.append_prop_crc = append_prop_crc
        # Records at or after this offset must carry the whole-record CRC (None: none must).
        self.require_prop_crc_from = require_prop_crc_from
        self._crc_len = record.PROP_CRC_LEN if append_prop_crc else 0
        # Appended under the put lock, taken by reput (deque ends are thread-safe).
        self.digests: collections.deque[WriteDigest] = collections.deque(maxlen=DIGESTS_KEPT)
        # The replication fence (under the put lock): replicated writes are refused while it
        # is closed, and those of an HA client holding an older generation always.
        self._replication_generation = 0
        self._replication_open = True

    # ---- offsets ----------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.queue.min_offset

    @property
    def max_offset(self) -> int:
        return self.queue.max_offset

    @property
    def flushed_offset(self) -> int:
        return self.queue.flushed_where

    # ---- puts -----------------------------------------------------------------------------------
    def _topic_part(self, topic: str) -> bytes | PutResult:
        """``len + topic`` bytes of a valid topic (cached), or the refusal."""
        part = self._topic_parts.get(topic)
        if part is not None:
            return part
        topic_b = topic.encode("utf-8")
        if not topic_b or len(topic_b) > record.MAX_TOPIC_BYTES:
            return refused(PutStatus.MESSAGE_ILLEGAL,
                           f"topic must be 1..{record.MAX_TOPIC_BYTES} bytes, got {len(topic_b)}")
        if not TOPIC_PATTERN.match(topic):
            return refused(PutStatus.MESSAGE_ILLEGAL,
                           f"topic {topic!r} has characters outside [%|a-zA-Z0-9_.-]")
        part = bytes([len(topic_b)]) + topic_b
        if len(self._topic_parts) < 100_000:
            self._topic_parts[topic] = part
        return part

    def _check(self, queue_id: int, body_len: int, props_len: int, size: int) -> PutResult | None:
        if not self.writeable:
            return refused(PutStatus.SERVICE_NOT_AVAILABLE,
                           self.not_writeable_reason or "store is not writeable")
        if queue_id < 0 or queue_id > 0x7FFFFFFF:
            return refused(PutStatus.MESSAGE_ILLEGAL, f"queue id {queue_id} out of range")
        if body_len > self.max_message_size:
            return refused(PutStatus.MESSAGE_ILLEGAL,
                           f"body of {body_len} bytes exceeds maxMessageSize {self.max_message_size}")
        if props_len > record.MAX_PROPERTIES_BYTES:
            user = props_len - self._crc_len
            limit = record.MAX_PROPERTIES_BYTES - self._crc_len
            crc_note = " (20 bytes are reserved for the record CRC)" if self._crc_len else ""
            return refused(PutStatus.PROPERTIES_SIZE_EXCEEDED,
                           f"properties of {user} bytes exceed {limit}{crc_note}")
        if size > self.max_message_size + record.RECORD_SLACK_BYTES:
            return refused(PutStatus.MESSAGE_ILLEGAL, f"record of {size} bytes is too large")
        if size + record.END_FILE_MIN_BLANK > self.file_size:
            return refused(PutStatus.MESSAGE_ILLEGAL,
                           f"record of {size} bytes cannot fit in a segment of {self.file_size}")
        return None

    def _prepare(self, msg: Message, topic_part: bytes, queue_id: int) -> tuple | PutResult:
        """(size, crc, flag, body, tail, reconsume times, sysflag) of one record, or the
        refusal."""
        if msg.tags or msg.keys or msg.properties or msg.delay_level:
            try:
                props = encode_properties(msg.all_properties())
            except ValueError as e:
                return refused(PutStatus.MESSAGE_ILLEGAL, str(e))
        else:
            props = b""
        if self._crc_len:
            props += record.PROP_CRC_PLACEHOLDER
        body = msg.body
        size = record.FIXED_BYTES - 1 + len(topic_part) + len(body) + len(props)
        if (len(body) > self.max_message_size or len(props) > record.MAX_PROPERTIES_BYTES
                or size + record.END_FILE_MIN_BLANK > self.file_size or not self.writeable
                or size > self.max_message_size + record.RECORD_SLACK_BYTES
                or not 0 <= queue_id <= 0x7FFFFFFF):
            bad = self._check(queue_id, len(body), len(props), size)
            assert bad is not None
            return bad
        tail = topic_part + len(props).to_bytes(2, "big") + props
        if msg.prepared_transaction_offset:  # a transaction's commit: its half's offset
            return (size, zlib.crc32(body) & 0x7FFFFFFF, msg.flag, body, tail,
                    msg.reconsume_times, msg.sys_flag, msg.prepared_transaction_offset)
        return (size, zlib.crc32(body) & 0x7FFFFFFF, msg.flag, body, tail, msg.reconsume_times,
                msg.sys_flag)

    def put(self, msg: Message, queue_id: int, born_ip: bytes = LOCALHOST, born_port: int = 0,
            born_timestamp: int = 0) -> PutResult:
        topic_part = self._topic_part(msg.topic)
        if isinstance(topic_part, PutResult):
            return topic_part
        item = self._prepare(msg, topic_part, queue_id)
        if isinstance(item, PutResult):
            return item
        born = born_timestamp or time.time_ns() // 1_000_000
        return self._write(msg.topic, topic_part, queue_id, [item], item[0], born, born_ip,
                           born_port)

    def put_batch(self, topic: str, queue_id: int, msgs: Sequence[Message | bytes],
                  born_ip: bytes = LOCALHOST, born_port: int = 0,
                  born_timestamp: int = 0) -> PutResult:
        """Many records to one queue in one write. A ``bytes`` entry is a body without
        properties or flag (the common case, prepared here without a Message per body)."""
        if not msgs:
            return refused(PutStatus.MESSAGE_ILLEGAL, "empty batch")
        topic_part = self._topic_part(topic)
        if isinstance(topic_part, PutResult):
            return topic_part
        crc_len = self._crc_len
        plain_tail = topic_part + crc_len.to_bytes(2, "big") + (
            record.PROP_CRC_PLACEHOLDER if crc_len else b"")
        plain_fixed = record.FIXED_BYTES - 1 + len(topic_part) + crc_len
        plain_max = min(self.max_message_size,
                        self.file_size - record.END_FILE_MIN_BLANK - plain_fixed,
                        self.max_message_size + record.RECORD_SLACK_BYTES - plain_fixed)
        if not self.writeable or not 0 <= queue_id <= 0x7FFFFFFF:
            plain_max = -1  # every body goes through _prepare, which refuses with the reason
        if plain_max >= 0 and all(type(m) is bytes for m in msgs):
            bodies = list(cast("Sequence[bytes]", msgs))
            if max(map(len, bodies)) <= plain_max:  # no record needs _prepare's checks
                total = plain_fixed * len(bodies) + sum(map(len, bodies))
                if total + record.END_FILE_MIN_BLANK > self.file_size:
                    return refused(PutStatus.MESSAGE_ILLEGAL, f"batch of {total} bytes cannot "
                                   f"fit in a segment of {self.file_size}")
                born = born_timestamp or time.time_ns() // 1_000_000
                return self._write(topic, topic_part, queue_id, [], total, born, born_ip,
                                   born_port, (bodies, plain_tail))
        crc32 = zlib.crc32
        items = []
        total = 0
        prepare = self._prepare
        for msg in msgs:
            if type(msg) is bytes and len(msg) <= plain_max:
                size = plain_fixed + len(msg)
                items.append((size, crc32(msg) & 0x7FFFFFFF, 0, msg, plain_tail, 0, 0))
                total += size
                continue
            if not isinstance(msg, Message):
                msg = Message(topic, bytes(msg))
            elif msg.topic != topic:
                return refused(PutStatus.MESSAGE_ILLEGAL, "a batch must hold one topic")
            item = prepare(msg, topic_part, queue_id)
            if isinstance(item, PutResult):
                return item
            items.append(item)
            total += item[0]
        if total + record.END_FILE_MIN_BLANK > self.file_size:
            return refused(PutStatus.MESSAGE_ILLEGAL,
                           f"batch of {total} bytes cannot fit in a segment of {self.file_size}")
        born = born_timestamp or time.time_ns() // 1_000_000
        return self._write(topic, topic_part, queue_id, items, total, born, born_ip, born_port)

    def _write(self, topic: str, topic_part: bytes, queue_id: int, items: list[tuple],
               total: int, born: int, born_ip: bytes, born_port: int,
               plain_bodies: tuple[list[bytes], bytes] | None = None) -> PutResult:
        """Write the records into the last segment under the put lock.

        ``items`` are ``_prepare``'s, or ``plain_bodies`` (bodies, their shared tail) records
        without properties of their own. ``record_writer`` writes them straight into the
        mapping (in C where built) and checks them all before the first byte, so a refusal
        changes nothing. When no record carries user properties, the write also leaves a
        WriteDigest for reput.
        """
        since = self._lock_since
        if since and time.monotonic() - since > self._busy_s:
            return refused(PutStatus.OS_PAGE_CACHE_BUSY, "put lock held too long (disk stalled?)")
        key = (topic, queue_id)
        crc_len = self._crc_len
        with self.put_lock:
            self._lock_since = time.monotonic()
            try:
                mf = self.queue.last_for_write()
                if total + record.END_FILE_MIN_BLANK > mf.remaining():
                    mf.fill_to_end(record.blank(mf.remaining()))
                    mf = self.queue.last_for_write()
            except (StoreError, OSError) as e:
                self._lock_since = 0.0
                log.error("event=create_segment_failed error=%s", e)
                return refused(PutStatus.CREATE_MAPPED_FILE_FAILED, str(e))
            first_queue_offset = self.topic_queue_table.get(key, 0)
            base = mf.file_from_offset
            first_pos = mf.wrote_position
            pos = first_pos + total
            if pos > mf.populated and not mf.fault_in(first_pos, pos):
                self._lock_since = 0.0  # nothing is changed yet: the put is refused whole
                log.error("event=put_refused reason=no_space segment=%s", mf.path.name)
                return refused(PutStatus.SERVICE_NOT_AVAILABLE,
                               "no space on disk for the CommitLog's next pages")
            ts = now_ms()
            try:
                if plain_bodies is not None:
                    entries, cq = record_writer.write_bodies(
                        mf.buffer, first_pos, plain_bodies[0], plain_bodies[1], base, queue_id,
                        first_queue_offset, born, born_ip, born_port, ts, self.store_ip,
                        self.store_port, crc_len)
                    plain = True
                else:
                    entries, plain, cq = record_writer.write_items(
                        mf.buffer, first_pos, items, base, queue_id, first_queue_offset, born,
                        born_ip, born_port, ts, self.store_ip, self.store_port, crc_len,
                        len(topic_part) + 2 + crc_len)
            except BaseException:
                self._lock_since = 0.0  # a writer refuses before its first byte
                raise
            queue_offset = first_queue_offset + len(entries)
            mf.wrote_position = pos
            mf.store_timestamp = ts
            self.topic_queue_table[key] = queue_offset
            self.last_store_timestamp = ts
            if plain:
                self.digests.append(_new_tuple(WriteDigest, (
                    base + first_pos, base + pos, topic, queue_id, first_queue_offset, entries,
                    ts, cq)))
            self._lock_since = 0.0
        phy = base + first_pos
        end = base + pos
        self._prefault(mf)
        for listener in self.append_listeners:
            listener(end)
        count = len(entries)
        offsets: tuple[int, ...] = ()
        if count > 1:
            offsets = tuple([entry[0] for entry in entries])
        return _new_tuple(PutResult, (PutStatus.PUT_OK, phy, end - phy, queue_id,
                                      first_queue_offset, ts, count, offsets, self.store_ip,
                                      self.store_port, ""))

    def take_digest(self, phy: int, end: int) -> WriteDigest | None:
        """The digest of the write that starts at ``phy`` and ends by ``end``, if one was kept;
        digests of writes before ``phy`` (dispatched by parsing) are dropped on the way."""
        digests = self.digests
        while digests:
            digest = digests[0]
            if digest.start > phy:
                return None
            if digest.start == phy:
                if digest.end > end:
                    return None  # not confirmed whole yet: kept for the pass that reaches it
                return digests.popleft()
            digests.popleft()
        return None

    def take_digest_run(self, phy: int, end: int, max_records: int) -> WriteDigest | None:
        """``take_digest``, merged with the digests of the writes that follow it to the same
        queue (contiguous in the log and in the queue, all by ``end``, up to about
        ``max_records`` entries): a run of single puts reaches the ConsumeQueue in one append."""
        first = self.take_digest(phy, end)
        if first is None:
            return None
        merged = _merge_run(self.digests, first, end, max_records)
        if merged is None:
            return first
        entries, cq, last_end, _count, store_timestamp = merged
        return first._replace(end=last_end, entries=entries, store_timestamp=store_timestamp,
                              cq=cq)

    def forget_digests_before(self, phy: int) -> None:
        """Drop the digests of writes that reput dispatched by parsing them."""
        digests = self.digests
        while digests and digests[0].start < phy:
            digests.popleft()

    def _prefault(self, mf: MappedFile) -> None:
        """Keep PREFAULT_AHEAD bytes past the write position faulted in, on the allocate
        thread (asked again after each PREFAULT_STEP written; a miss just faults as before)."""
        if self._allocate is None:
            return
        self._allocate.mapped_writes = True  # e.g. a promoted slave: its puts use the mapping
        upto = mf.wrote_position + PREFAULT_AHEAD
        start, asked = self._prefault_asked
        if start == mf.file_from_offset and upto - asked < PREFAULT_STEP:
            return
        self._prefault_asked = (mf.file_from_offset, upto)
        self._allocate.prefault(mf, upto)

    # ---- replication ------------------------------------------------------------------------
    def open_replication(self) -> int:
        """An HA client starts: open the fence, return its generation (a new one each time)."""
        with self.put_lock:
            self._replication_generation += 1
            self._replication_open = True
            return self._replication_generation

    def fence_replication(self) -> int:
        """Refuse every replicated write from now on (a promotion, before its epoch is
        written); waits for one in progress (the put lock). Returns the closed generation."""
        with self.put_lock:
            self._replication_generation += 1
            self._replication_open = False
            return self._replication_generation

    def check_fence(self, generation: int | None) -> None:
        """Under the put lock: ReplicationFencedError unless replicated writes of
        ``generation`` (None: whoever replicates now) are allowed."""
        if not self._replication_open:
            raise ReplicationFencedError(
                "replication is fenced: this broker was promoted, its log takes no bytes "
                "from a master any more")
        if generation is not None and generation != self._replication_generation:
            raise ReplicationFencedError(
                f"replication generation {generation} is fenced: a newer HA client "
                f"(generation {self._replication_generation}) replicates into this log")

    def append_replicated(self, phy_offset: int, data: bytes | memoryview,
                          generation: int | None = None) -> int:
        """Append bytes a master sent, at exactly ``phy_offset``; returns the new max offset.

        A gap or an overlap with what this log holds is refused with StoreError; nothing is
        written then. Data may cross segment boundaries and need not end on a record boundary.
        The bytes go in with ``pwrite`` (``MappedFile.write_append``), not through the mapping:
        no page is faulted in ahead for them, and a full disk is an OSError (the HA client
        resumes from this log's end later) rather than a SIGBUS. A closed fence, or a
        ``generation`` that is not the current one, is refused (ReplicationFencedError).
        """
        with self.put_lock:
            self.check_fence(generation)
            expected = self.max_offset
            if not self.queue.files:
                expected = phy_offset  # an empty slave starts where its master's log starts
            if phy_offset != expected:
                kind = "gap" if phy_offset > expected else "overlap"
                raise StoreError(
                    f"replicated bytes at {phy_offset} would leave a {kind}: log ends at {expected}"
                )
            if self._allocate is not None:
                self._allocate.mapped_writes = False  # no prefault of new segments for pwrite
            view = memoryview(data)
            cursor = phy_offset
            while view:
                mf = self.queue.last_for_write(cursor)
                n = min(len(view), mf.remaining())
                mf.write_append(view[:n])
                view = view[n:]
                cursor += n
            new_max = cursor
        for listener in self.append_listeners:
            listener(new_max)
        return new_max

    # ---- reads --------------------------------------------------------------------------------
    def read(self, phy_offset: int, size: int) -> bytes:
        """Up to ``size`` bytes from ``phy_offset``, not past the segment end or the log end
        (empty when no live segment holds it: outside the log, or being deleted)."""
        mf = self.queue.find_held(phy_offset)
        if mf is None:
            return b""
        try:
            return mf.read(phy_offset - mf.file_from_offset, size)
        finally:
            mf.release()

    def read_record(self, phy_offset: int, size: int = 0) -> bytes | None:
        """The whole record at ``phy_offset`` (None if there is none or it is not whole)."""
        mf = self.queue.find_held(phy_offset)
        if mf is None:
            return None
        try:
            pos = phy_offset - mf.file_from_offset
            if size <= 0:
                head = mf.read(pos, 4)
                if len(head) < 4:
                    return None
                size = int.from_bytes(head, "big", signed=True)
                if size < record.FIXED_BYTES or size > mf.wrote_position - pos:
                    return None
            raw = mf.read(pos, size)
        finally:
            mf.release()
        return raw if len(raw) == size else None

    def store_timestamp_at(self, phy_offset: int) -> int | None:
        """STORETIMESTAMP of the record at ``phy_offset``; None when no record starts there."""
        if not self.min_offset <= phy_offset < self.max_offset:
            return None
        head = self.read(phy_offset, record.HEADER.size)
        if len(head) < record.HEADER.size:
            return None
        h = record.Header._make(record.HEADER.unpack_from(head))
        if h.magic != record.MAGIC_V1 or h.phy_offset != phy_offset:
            return None
        return h.store_timestamp

    def message_at(self, phy_offset: int, verify: bool = True) -> MessageExt | None:
        raw = self.read_record(phy_offset)
        if raw is None:
            return None
        if verify:
            result = record.check(raw, 0, len(raw), expect_phy_offset=phy_offset)
            if result.size <= 0:
                raise CorruptionError(phy_offset, result.reason)
        return to_message(raw)

    def iter_records(self, start: int, end: int) -> Iterator[tuple[int, memoryview]]:
        """Whole records in ``[start, end)``: (phy_offset, view). Skips BLANK padding.

        Stops early at a record that is not yet whole. The segment is held while a view of it
        is out: release each view (or drop it) before asking for the next one.
        """
        phy = start
        while phy < end:
            mf = self.queue.find_held(phy)
            if mf is None:
                return
            try:
                pos = phy - mf.file_from_offset
                limit = min(mf.wrote_position, end - mf.file_from_offset)
                if limit - pos < record.END_FILE_MIN_BLANK:
                    if mf.is_full() and end >= mf.end_offset:
                        phy = mf.end_offset
                        continue
                    return
                buf = mf.buffer
                total, magic = record.HEAD_PREFIX.unpack_from(buf, pos)
                if magic == record.BLANK_MAGIC:
                    phy = mf.end_offset
                    continue
                if magic != record.MAGIC_V1 or total < record.FIXED_BYTES:
                    raise CorruptionError(phy, f"bad record header (magic 0x{magic:08X}, "
                                               f"size {total})")
                if pos + total > limit:
                    return
                yield phy, buf[pos : pos + total]
                phy += total
            finally:
                mf.release()

    # ---- flushing -----------------------------------------------------------------------------
    def flush(self, least_pages: int = 0) -> int:
        return self.queue.flush(least_pages)

    # ---- recovery -----------------------------------------------------------------------------
    def load(self) -> None:
        self.queue.load()

    def recover(self, abnormal: bool, flushed_checkpoint: int = 0,
                cut_below_flushed: bool = False, boundary: int | None = None) -> RecoveryReport:
        """Find the end of the valid log, cut everything after it on disk, set positions.

        A log whose valid part ends below ``flushed_checkpoint`` is damaged, not torn: a
        CorruptionError, nothing changed; unless ``cut_below_flushed`` (a slave, which fetches
        the rest again from its master), then it is cut there with an ERROR.

        ``boundary``: after a crash of the process alone (the page cache kept every byte the
        broker wrote), where a record dispatched before starts (the checkpoint's
        dispatchedRecordOffset): the records below it need no check, and it starts there when
        that record checks whole (else, as after any crash, at the start of the segment that
        holds the flushed offset)."""
        report = RecoveryReport(abnormal=abnormal)
        files = self.queue.files
        if not files:
            return report
        if abnormal:
            start_mf = self.queue.find(min(flushed_checkpoint, self.max_offset)) or files[0]
            index = files.index(start_mf)
        else:
            index = max(0, len(files) - 3)
        phy = files[index].file_from_offset
        resumed = self._resume_point(boundary) if abnormal and boundary is not None else None
        if resumed is not None and resumed[1] > phy:
            index, phy = resumed
        report.start_offset = phy
        while index < len(files):
            mf = files[index]
            pos = phy - mf.file_from_offset
            view = mf.buffer
            result = record.check(view, pos, self.file_size, expect_phy_offset=phy,
                                  require_prop_crc=self._crc_required(phy))
            if result.size > 0:
                report.records += 1
                mf.store_timestamp = record.PATCH_STORE_TS.unpack_from(
                    view, pos + record.POS_STORE_TIMESTAMP)[0]
                phy += result.size
                if phy == mf.end_offset:
                    index += 1
                continue
            if result.size == 0:
                phy = mf.end_offset
                index += 1
                continue
            if bytes(view[pos : pos + 8]) != bytes(8):
                report.cut_reason = result.reason
            break
        report.end_offset = phy
        if phy < flushed_checkpoint:
            if not cut_below_flushed:
                self._refuse_below_flushed(phy, flushed_checkpoint, report.cut_reason)
            log.error("event=corruption_below_flushed offset=%d flushed=%d reason=%r "
                      "action=cut_and_fetch_again_from_the_master", phy, flushed_checkpoint,
                      report.cut_reason or "missing data")
        self._cut(phy, report, flushed_checkpoint if abnormal else phy)
        return report

    def _resume_point(self, boundary: int) -> tuple[int, int] | None:
        """(segment number, offset) to check from at ``boundary``, if a whole record that
        names this offset starts there (zeros prove nothing: they occur inside records)."""
        mf = self.queue.find(boundary)
        if mf is None:
            return None
        pos = boundary - mf.file_from_offset
        result = record.check(mf.buffer, pos, self.file_size, expect_phy_offset=boundary,
                              require_prop_crc=self._crc_required(boundary))
        if result.size <= 0:
            log.warning("event=recovery_boundary_refused offset=%d reason=%r: checking from "
                        "the segment's start", boundary, result.reason or "no record there")
            return None
        return self.queue.files.index(mf), boundary

    def _refuse_below_flushed(self, phy: int, flushed: int, reason: str) -> None:
        """The valid log ends below what the checkpoint says was on disk: a damaged or missing
        segment, not a torn tail. Cutting there would erase acknowledged, durable records
        (docs/guarantees.md rule 5), so recovery stops with nothing changed."""
        mf = self.queue.find(phy)
        where = (f"segment {mf.path.name} position {phy - mf.file_from_offset}" if mf is not None
                 else f"no segment holds it (the log's segments end at {self.max_offset})")
        log.error("event=corruption_below_flushed offset=%d flushed=%d reason=%r", phy, flushed,
                  reason or "missing data")
        raise CorruptionError(
            phy,
            f"{reason or 'no record here'} ({where}), below the offset {flushed} the checkpoint "
            f"records as flushed: the CommitLog is damaged where it was known to be on disk. "
            f"Nothing was changed. Restore the segment, or remove this store and let the "
            f"broker catch up from its master as a slave; if the checkpoint file itself is "
            f"damaged, remove it to recover from the segments alone (cutting at {phy})",
        )

    def _crc_required(self, phy_offset: int) -> bool:
        since = self.require_prop_crc_from
        return since is not None and phy_offset >= since

    def _cut(self, end: int, report: RecoveryReport, durable: int) -> None:
        """Cut the log at ``end``. Only ``durable`` (the checkpoint's flushed offset after a
        crash) is known to be on disk: the positions say so, so the next flush msyncs the
        rest before anyone records it as flushed (a power loss after a kill -9 must find
        whole records up to what the checkpoint claims, not a torn tail below it)."""
        files = self.queue.files
        first = files[0]
        report.segments_removed = [
            mf.path.name for mf in files
            if mf.file_from_offset > end or (mf.file_from_offset == end and mf is not first)
        ]
        holder = self.queue.find(end)
        if holder is not None and (holder.file_from_offset < end or holder is first):
            pos = end - holder.file_from_offset
            holder.set_positions(pos)
            report.cut_bytes += holder.zero_tail_if_dirty(pos)
        self.queue.truncate_dirty(end)
        durable = min(durable, end)
        for mf in self.queue.files:
            if mf.end_offset > durable:
                mf.flushed_position = min(mf.flushed_position,
                                          max(0, durable - mf.file_from_offset))
        self.queue.flushed_where = durable
        if report.cut_reason or report.cut_bytes:
            log.warning(
                "event=recovery_cut offset=%d reason=%r zeroed_bytes=%d segments_removed=%s",
                end, report.cut_reason or "non-zero bytes after the last whole record",
                report.cut_bytes, ",".join(report.segments_removed) or "-",
            )
        elif report.segments_removed:
            log.info("event=recovery_removed_empty_segments offset=%d segments=%s", end,
                     ",".join(report.segments_removed))

    def truncate(self, phy_offset: int, generation: int | None = None) -> None:
        """Drop every byte at or after ``phy_offset`` (HA divergence), on disk; fenced as
        ``append_replicated`` is."""
        with self.put_lock:
            self.check_fence(generation)
            self.digests.clear()
            self.queue.truncate_dirty(phy_offset)

    def shutdown(self) -> None:
        self.writeable = False
        self.flush(0)
        self.queue.shutdown()
