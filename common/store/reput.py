"""Reput: dispatch CommitLog records to ConsumeQueues and the record dispatchers.

A background thread reads every whole record past ``dispatched_phy_offset`` and appends its
ConsumeQueue entry (offset, size, tagsCode); a record carrying a property some dispatcher
watches also goes to the store's record dispatchers in order, the IndexFile's first
(``common/store/extensions.py``). It is woken by every append
(a put on a master, replicated bytes on a slave), so a message is visible to pulls within
about a millisecond; arrival listeners (long polling) are told per queue. A thread that
dispatches its own appends right after each burst (``dispatch_inline``: the request server's
I/O thread, a slave's HA client thread) wakes nobody.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable
from typing import Protocol

from common.core import accel
from common.core.errors import CorruptionError, StoreError
from common.core.message import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_KEY,
    decode_properties,
    tags_code,
)
from common.format import record
from common.store.commit_log import CommitLog, WriteDigest
from common.store.extensions import DispatchRequest, StoreExtensions

log = logging.getLogger("replog.store")

ArrivalListener = Callable[[str, int, int], None]  # topic, queue_id, max queue offset


# Only the fields reput needs: TOTALSIZE@0 QUEUEID@12 QUEUEOFFSET@20 STORETIMESTAMP@56 BODYLEN@84.
_REPUT_FIELDS = struct.Struct(">i8xi4xq28xq20xi")
assert _REPUT_FIELDS.size == record.HEADER.size
_BODY_LEN = struct.Struct(">i")  # at offset 84

_topics: dict[bytes, str] = {}


def _topic_text(raw: bytes) -> str:
    topic = _topics.get(raw)
    if topic is None:
        topic = raw.decode("utf-8", errors="replace")
        if len(_topics) < 100_000:
            _topics[raw] = topic
    return topic


def dispatch_request(view: memoryview, phy_offset: int,
                     ext: StoreExtensions) -> DispatchRequest:
    """Parse what reput needs from a whole record (no CRC: recovery and reads verify)."""
    size, queue_id, queue_offset, store_ts, body_len = _REPUT_FIELDS.unpack_from(view)
    p = 88 + body_len
    topic_len = view[p]
    topic = _topic_text(bytes(view[p + 1 : p + 1 + topic_len]))
    p += 1 + topic_len
    props_len = (view[p] << 8) | view[p + 1]
    if props_len >= record.PROP_CRC_LEN and record.has_prop_crc(view, 0, size):
        props_len -= record.PROP_CRC_LEN  # the record CRC is not a user property
    if not props_len:
        return DispatchRequest(topic, queue_id, queue_offset, phy_offset, size, 0, store_ts, ())
    raw_props = bytes(view[p + 2 : p + 2 + props_len])
    if not any(marker in raw_props for marker in ext.markers):
        return DispatchRequest(topic, queue_id, queue_offset, phy_offset, size, 0, store_ts, ())
    props = decode_properties(raw_props)
    code = tags_code(props.get(PROPERTY_TAGS))
    found = [k for k in props.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k]
    if PROPERTY_UNIQ_KEY in props:
        found.append(props[PROPERTY_UNIQ_KEY])
    rule = ext.tags_code_rules.get(topic)
    if rule is not None:
        code = rule(props, store_ts, code)
    return DispatchRequest(topic, queue_id, queue_offset, phy_offset, size, code, store_ts,
                           tuple(found), props)


_HEAD = record.HEAD_PREFIX
_scan = accel.load("common.store._reput_scan")  # the common records' loop in C, where built
if _scan is not None:
    _scan.configure(PROPERTY_TAGS, PROPERTY_KEYS, PROPERTY_UNIQ_KEY)
MAX_PASS_RECORDS = 4096  # bounds how long a pass holds the reput lock and delays visibility
RETRY_S = 1.0  # after a pass that could not finish (a bad record, a full disk)


def tail_records(log_: CommitLog, start: int, ext: StoreExtensions) -> list[DispatchRequest]:
    """What every whole record in ``[start, log end)`` would dispatch: the records not
    dispatched yet (past the confirmed offset), which a new master must still count (their
    queue offsets are taken, their delayed deliveries made). Stops at a record that is not
    whole (a slave's partial tail); a bad header raises CorruptionError."""
    found: list[DispatchRequest] = []
    end = log_.max_offset
    phy = start
    while phy < end:
        mf = log_.queue.find(phy)
        if mf is None:
            break
        base, buf = mf.file_from_offset, mf.buffer
        pos, limit = phy - base, min(mf.wrote_position, end - base)
        while pos + record.END_FILE_MIN_BLANK <= limit:
            total, magic = _HEAD.unpack_from(buf, pos)
            if magic == record.BLANK_MAGIC:
                pos = mf.file_size
                break
            if magic != record.MAGIC_V1 or total < record.FIXED_BYTES \
                    or pos + total > mf.file_size:
                raise CorruptionError(base + pos, f"bad record header (magic 0x{magic:08X}, "
                                                  f"size {total})")
            if pos + total > limit:
                return found
            bad = record.layout_error(buf, pos, total, _BODY_LEN.unpack_from(buf, pos + 84)[0])
            if bad is not None:
                raise CorruptionError(base + pos, bad)
            found.append(dispatch_request(buf[pos : pos + total], base + pos, ext))
            pos += total
        if base + pos == phy:
            break
        phy = base + pos
    return found


def tail_queue_offsets(tail: list[DispatchRequest]) -> dict[tuple[str, int], int]:
    """(topic, queue id) -> the queue offset after the last of ``tail``'s records there."""
    found: dict[tuple[str, int], int] = {}
    for req in tail:
        key = (req.topic, req.queue_id)
        found[key] = max(found.get(key, 0), req.queue_offset + 1)
    return found


class ReputService:
    """Dispatches records to the indexes, in a thread woken by appends."""

    IDLE_WAIT_S = 0.05

    def __init__(self, store: DispatchTarget):
        self._store = store
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one dispatcher at a time (thread or catch-up)
        self.arrival_listeners: list[ArrivalListener] = []
        # listeners of one topic each (the timer service's of its own): looked up per dispatch,
        # not called for every other topic's records
        self.topic_arrival_listeners: dict[str, list[ArrivalListener]] = {}
        self.dispatched = 0
        # idents of threads that dispatch their own appends right after each burst (the
        # request server's I/O thread, a slave's HA client thread): their appends wake nobody
        self.inline_threads: set[int] = set()

    def wake(self, _max_offset: int = 0) -> None:
        if threading.get_ident() in self.inline_threads:
            return  # that thread dispatches itself right after its burst of appends
        if not self._wake.is_set():  # Event.set takes a lock; most puts find it set already
            self._wake.set()

    def dispatch_inline(self) -> int:
        """Dispatch now on the calling thread, unless the reput thread is at it already.

        A request loop calls this after each burst of puts: the records become visible without
        waking another thread (and paying its GIL hand-off) for every put.
        A record that fails its checks, or an index that cannot take an entry (a full disk),
        is left to the reput thread, which logs it and retries once a second: the calling
        thread (the broker's I/O thread, a slave's HA client) goes on serving.
        """
        if not self._lock.acquire(blocking=False):
            self._wake.set()  # the thread is mid-pass: make it look again when done
            return 0
        try:
            return self._dispatch_locked()
        except (CorruptionError, StoreError, OSError):
            self._wake.set()
            return 0
        finally:
            self._lock.release()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="replog-reput", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        stalled = ""  # why the last pass could not finish (logged once, until it does)
        while not self._stop.is_set():
            self._wake.wait(self.IDLE_WAIT_S)
            self._wake.clear()
            try:
                self.do_reput()
            except CorruptionError as e:
                if str(e) != stalled:
                    log.error("event=reput_stopped offset=%d reason=%s", e.phy_offset, e.reason)
                    stalled = str(e)
                    self._store.on_dispatch_corruption(e)
                self._stop.wait(RETRY_S)
                continue
            except (StoreError, OSError) as e:
                # An index could not take an entry (a full disk: no block for its next page).
                # Nothing from that record on counts as dispatched, and the indexes skip what
                # they already hold, so the retry picks up exactly where this pass stopped.
                if str(e) != stalled:
                    log.error("event=reput_stalled offset=%d error=%s",
                              self._store.dispatched_phy_offset, e)
                    stalled = str(e)
                self._stop.wait(RETRY_S)
                continue
            if stalled:
                log.warning("event=reput_resumed offset=%d", self._store.dispatched_phy_offset)
                stalled = ""

    def do_reput(self) -> int:
        """Dispatch everything appended so far; returns how many records were dispatched."""
        with self._lock:
            return self._dispatch_locked()

    def _dispatch_locked(self) -> int:
        """Dispatch whole records up to the log's end, at most MAX_PASS_RECORDS per pass.

        Walks each segment's mapping directly; consecutive records of one queue (a batch, or a
        run of puts to one queue) reach the ConsumeQueue in one append.
        """
        store = self._store
        log_ = store.commit_log
        end = store.reput_end()
        count = 0
        while store.dispatched_phy_offset < end:
            digest = log_.take_digest_run(store.dispatched_phy_offset, end, MAX_PASS_RECORDS)
            if digest is not None:
                count += self._dispatch_digest(digest)
                continue
            done = self._dispatch_pass(log_, end)
            log_.forget_digests_before(store.dispatched_phy_offset)
            if done == 0:
                self._skip_blank(end)
                break
            count += done
        self.dispatched += count
        return count

    def _dispatch_digest(self, digest: WriteDigest) -> int:
        """A write the CommitLog described as it made it: its entries go to the ConsumeQueue
        as they are (the same ones parsing the records would give)."""
        store = self._store
        entries = digest.entries
        store.dispatch_cq(digest.topic, digest.queue_id, digest.first_queue_offset, entries,
                          digest.cq)
        store.dispatched_phy_offset = max(store.dispatched_phy_offset, digest.end)
        topic = digest.topic
        for listener in self.arrival_listeners:
            listener(topic, digest.queue_id, digest.first_queue_offset + len(entries))
        for listener in self.topic_arrival_listeners.get(topic, ()):
            listener(topic, digest.queue_id, digest.first_queue_offset + len(entries))
        store.note_dispatched_timestamp(digest.store_timestamp)
        return len(entries)

    def _dispatch_pass(self, log_: CommitLog, end: int) -> int:
        # The segments read here need no hold (MappedFile.hold): retention never deletes one
        # that is not wholly dispatched, and truncation and reset take the reput lock.
        store = self._store
        phy = store.dispatched_phy_offset
        ext = store.extensions
        dispatchers = ext.dispatchers
        # the topics whose tags code a rule gives: their records with properties are Python's
        rule_topics = ext.rule_topics
        runs: dict[tuple[str, int], tuple[int, list[tuple[int, int, int]]]] = {}
        touched: dict[tuple[str, int], int] = {}
        count = 0
        last_raw_topic = b""
        last_topic = ""
        last_store_ts = 0
        while phy < end and count < MAX_PASS_RECORDS:
            mf = log_.queue.find(phy)
            if mf is None:
                break
            base = mf.file_from_offset
            buf = mf.buffer
            pos = phy - base
            limit = min(mf.wrote_position, end - base)
            while pos + record.END_FILE_MIN_BLANK <= limit and count < MAX_PASS_RECORDS:
                if _scan is not None:  # the records up to the next one Python must read
                    found, pos, taken, ts, first = _scan.scan(
                        buf, pos, limit, mf.file_size, MAX_PASS_RECORDS - count, base,
                        ext.markers, rule_topics)
                    if taken:
                        if first is not None:  # its first record, read for the dispatchers
                            raw_topic, queue_id, first_offset, (entry, *_) = found[0]
                            req = DispatchRequest(_topic_text(raw_topic), queue_id,
                                                  first_offset, entry[0], entry[1], *first)
                            for dispatcher in dispatchers:
                                dispatcher.dispatch(req)
                        count += taken
                        last_store_ts = ts
                        self._merge_runs(runs, touched, found)
                        continue
                total, magic = _HEAD.unpack_from(buf, pos)
                if magic == record.BLANK_MAGIC:
                    pos = mf.file_size
                    break
                if magic != record.MAGIC_V1 or total < record.FIXED_BYTES:
                    self._flush_runs(runs, touched, base + pos)
                    raise CorruptionError(base + pos, f"bad record header (magic 0x{magic:08X}, "
                                                      f"size {total})")
                if pos + total > mf.file_size:  # no record crosses its segment's end
                    self._flush_runs(runs, touched, base + pos)
                    raise CorruptionError(base + pos, f"record size {total} runs past the end "
                                                      f"of segment {mf.path.name}")
                if pos + total > limit:
                    break  # not whole yet (a slave may hold a record's first bytes only)
                _, queue_id, queue_offset, store_ts, body_len = _REPUT_FIELDS.unpack_from(buf, pos)
                bad = record.layout_error(buf, pos, total, body_len)
                if bad is not None:  # lengths past the record: nothing after it is read
                    self._flush_runs(runs, touched, base + pos)
                    raise CorruptionError(base + pos, bad)
                p = pos + 88 + body_len
                topic_end = p + 1 + buf[p]
                user_props = (buf[topic_end] << 8 | buf[topic_end + 1])
                if user_props >= record.PROP_CRC_LEN and record.has_prop_crc(buf, pos, total):
                    user_props -= record.PROP_CRC_LEN
                raw_topic = bytes(buf[p + 1 : topic_end])
                if raw_topic == last_raw_topic:
                    topic = last_topic
                else:
                    topic = last_topic = _topic_text(raw_topic)
                    last_raw_topic = raw_topic
                if user_props:  # the rare path: tags, keys, what a feature watches
                    req = dispatch_request(buf[pos : pos + total], base + pos, ext)
                    code = req.tags_code
                    if req.properties:
                        for dispatcher in dispatchers:
                            dispatcher.dispatch(req)
                else:
                    code = 0
                key = (topic, queue_id)
                run = runs.get(key)
                if run is None or run[0] + len(run[1]) != queue_offset:
                    if run is not None:
                        store.dispatch_cq(topic, queue_id, run[0], run[1])
                    run = runs[key] = (queue_offset, [])
                run[1].append((base + pos, total, code))
                touched[key] = queue_offset + 1
                last_store_ts = store_ts
                pos += total
                count += 1
            new_phy = base + pos
            if new_phy == phy:
                break
            phy = new_phy
        self._flush_runs(runs, touched, phy)
        if last_store_ts:
            store.note_dispatched_timestamp(last_store_ts)
        return count

    def _merge_runs(self, runs: dict[tuple[str, int], tuple[int, list[tuple[int, int, int]]]],
                    touched: dict[tuple[str, int], int],
                    found: list[tuple[bytes, int, int, list[tuple[int, int, int]]]]) -> None:
        """Add the C scan's runs to the pass's, as the Python loop adds records one by one."""
        for raw_topic, queue_id, first, entries in found:
            topic = _topic_text(raw_topic)
            key = (topic, queue_id)
            run = runs.get(key)
            if run is not None and run[0] + len(run[1]) == first:
                run[1].extend(entries)
            else:
                if run is not None:
                    self._store.dispatch_cq(topic, queue_id, run[0], run[1])
                runs[key] = (first, entries)
            touched[key] = first + len(entries)

    def _flush_runs(self, runs: dict[tuple[str, int], tuple[int, list[tuple[int, int, int]]]],
                    touched: dict[tuple[str, int], int], phy: int) -> None:
        """Append the pending ConsumeQueue runs, advance the dispatched offset, tell listeners."""
        store = self._store
        for (topic, queue_id), (first, entries) in runs.items():
            store.dispatch_cq(topic, queue_id, first, entries)
        runs.clear()
        store.dispatched_phy_offset = max(store.dispatched_phy_offset, phy)
        by_topic = self.topic_arrival_listeners
        for (topic, queue_id), max_queue_offset in touched.items():
            for listener in self.arrival_listeners:
                listener(topic, queue_id, max_queue_offset)
            for listener in by_topic.get(topic, ()):
                listener(topic, queue_id, max_queue_offset)
        touched.clear()

    def _skip_blank(self, end: int) -> None:
        store = self._store
        mf = store.commit_log.queue.find(store.dispatched_phy_offset)
        if mf is None or not mf.is_full():
            return
        pos = store.dispatched_phy_offset - mf.file_from_offset
        if pos + record.END_FILE_MIN_BLANK <= mf.file_size:
            magic = record.HEAD_PREFIX.unpack_from(mf.buffer, pos)[1]
            if magic == record.BLANK_MAGIC and mf.end_offset <= end:
                store.dispatched_phy_offset = mf.end_offset

    def catch_up(self, deadline_s: float = 600.0) -> None:
        """Dispatch until the log's current end (start-up, before accepting writes)."""
        limit = time.monotonic() + deadline_s
        while self._store.dispatched_phy_offset < self._store.reput_end():
            if self.do_reput() == 0 and not self._advanced():
                break
            if time.monotonic() > limit:
                raise TimeoutError("reput did not catch up with the CommitLog")

    def _advanced(self) -> bool:
        before = self._store.dispatched_phy_offset
        self._skip_blank(self._store.reput_end())
        return self._store.dispatched_phy_offset > before

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=10)


class DispatchTarget(Protocol):
    """What reput needs from the store."""

    dispatched_phy_offset: int
    extensions: StoreExtensions  # the dispatchers after the ConsumeQueue, the tags-code rules
    commit_log: CommitLog

    def reput_end(self) -> int: ...  # the log's end, or the confirmed offset below it

    def dispatch_cq(self, topic: str, queue_id: int, first_queue_offset: int,
                    entries: list[tuple[int, int, int]], packed: bytes = b"") -> None: ...

    def note_dispatched_timestamp(self, store_timestamp: int) -> None: ...

    def on_dispatch_corruption(self, e: CorruptionError) -> None: ...
