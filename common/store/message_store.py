"""The store facade (RocketMQ ``DefaultMessageStore``): load, recover, start, put, get, shutdown.

Start-up order: take the lock; load CommitLog segments, ConsumeQueues, checkpoint and index;
recover ConsumeQueues, then the CommitLog (normal: trust all but the last three segments;
after a crash, i.e. when ``abort`` exists: verify every record from the segment holding the
checkpoint's flushed offset); cut ConsumeQueue entries past the log's end; re-dispatch what the
indexes miss; rebuild the queue offset table; only then accept writes and create ``abort``.
See docs/store-api.md for how the broker uses this class.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from common.core.config import BrokerConfig, parse_delay_levels
from common.core.errors import CorruptionError, GetStatus, PutStatus, StoreError
from common.core.files import write_atomically
from common.core.message import (
    PROPERTY_WAIT,
    Message,
    MessageExt,
    decode_msg_id,
    host_bytes,
)
from common.core.sql92 import Selector
from common.format import record
from common.store.allocate import AllocateService
from common.store.checkpoint import AbortFile, StoreCheckpoint, StoreLock
from common.store.cleanup import CleanService
from common.store.commit_log import CommitLog, PutResult, RecoveryReport, to_message
from common.store.consume_queue import ConsumeQueueStore
from common.store.extensions import MasterService, StoreExtensions
from common.store.flush import (
    FLUSHED,
    FlushWatcher,
    GroupCommitService,
    PeriodicFlushService,
    done_future,
)
from common.store.index import IndexDispatcher, IndexService
from common.store.pop.service import PopStore
from common.store.reput import (
    ArrivalListener,
    DispatchRequest,
    ReputService,
    tail_queue_offsets,
    tail_records,
)
from common.store.schedule import DelayLevels, ScheduleService
from common.store.timer.service import TimerStore
from common.store.transaction.service import TransactionStore

log = logging.getLogger("replog.store")
_new_tuple = tuple.__new__  # a NamedTuple's __new__ is a Python function


def store_identity(path: Path) -> str:
    """The store's id, from ``config/storeId``; a new random one when the file is missing
    (a new store, or one whose disk was wiped or replaced)."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        text = ""
    except (OSError, UnicodeDecodeError) as e:
        raise StoreError(f"{path} is unreadable ({e}): it holds this store's id") from None
    if text:
        if len(text) > 64 or not text.isalnum():
            raise StoreError(f"{path} holds {text[:80]!r}, not a store id")
        return text
    made = uuid.uuid4().hex
    write_atomically(path, made.encode())
    return made

AppendListener = Callable[[int], None]

MAX_GET_BYTES = 4 * 1024 * 1024
# entries a filtered read looks at, at least: RocketMQ's 16,000 bytes of ConsumeQueue (20 each)
FILTER_SCAN_ENTRIES = 800
MAX_QUERY = 64 * 1024


class PendingPut(NamedTuple):
    """A put as appended, and a future for its disk flush."""

    result: PutResult
    flushed: Future[PutStatus]


_cached_host = functools.lru_cache(maxsize=4096)(host_bytes)
CHECKSUM_READ_BYTES = 1024 * 1024  # log_checksum copies and hashes this much at a time


# TOTALSIZE, MAGICCODE, then (past BODYCRC, QUEUEID, FLAG, QUEUEOFFSET) PHYSICALOFFSET
_PLACE = struct.Struct(">iI20xq")
assert _PLACE.size == record.POS_PHY_OFFSET + 8


def _misplaced(raw: bytes, phy: int, size: int) -> str:
    """Why the bytes a ConsumeQueue entry leads to are not its record ("" when they are):
    the record's own size, magic and offset fields, a few struct reads per message. The CRC
    is the client's to check (``common.format.protocol.decode_record``)."""
    if len(raw) < record.FIXED_BYTES:
        return f"the queue entry says {size} bytes, less than any record"
    total, magic, stored_phy = _PLACE.unpack_from(raw, 0)
    if magic != record.MAGIC_V1:
        return f"bad magic 0x{magic:08X}"
    if total != size:
        return f"record size {total}, the queue entry says {size}"
    if stored_phy != phy:
        return f"the record says it is at {stored_phy}"
    return ""


@dataclass(frozen=True)
class GetResult:
    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    records: list[bytes] = field(default_factory=list)
    corrupt: tuple[int, int, str] | None = None  # CORRUPT_RECORD: (queue offset, phy, why)

    def messages(self) -> list[MessageExt]:
        return [to_message(raw) for raw in self.records]


@dataclass(frozen=True)
class StoreStats:
    """A frozen snapshot of the store's figures (status, metrics and tests read it)."""

    min_phy_offset: int
    max_phy_offset: int
    flushed_phy_offset: int
    dispatched_phy_offset: int
    confirm_phy_offset: int  # what consumers may be served up to (the max without a bound)
    flush_lag_bytes: int
    reput_lag_bytes: int
    segments: int
    consume_queues: int
    puts: int
    put_failures: int
    dispatched_records: int
    deleted_segments: int
    segments_pending_delete: int  # deleted, still held or not closable yet (retried)
    segment_close_failures: int  # mappings that would not close when deleted (logged)
    segments_held_too_long: int  # deleted segments a reader still held 120 s later
    writeable: bool
    last_recovery: str


class MessageStore:
    def __init__(self, cfg: BrokerConfig, *, repair_from_master: bool | None = None,
                 start_master_services: bool | None = None):
        """``repair_from_master`` is a fact about the broker's role that the store cannot
        know: whether, at start-up, damage below the flushed offset may be cut because a
        master holds those bytes and will send them again (a replicating slave), or must
        refuse the start (a master, or a slave whose promotion record makes it one again:
        the broker decides, ``common/broker/broker.py``). None: the configured role says.

        ``start_master_services``: whether ``start`` runs the services only a master runs
        (delay-level delivery: it writes to the log). The broker passes False and turns them
        on with ``become_master`` once it knows its role; None: the configured role says.

        Features register on ``extensions`` (put hooks, record dispatchers, tags-code rules,
        master services: ``common/store/extensions.py``) before ``start``."""
        self.cfg = cfg
        self.repair_from_master = cfg.is_slave if repair_from_master is None \
            else repair_from_master
        self._start_master_services = not cfg.is_slave if start_master_services is None \
            else start_master_services
        # a master's store (takes puts), until become_slave; the configured role at first
        self.is_master = not cfg.is_slave
        self.root = cfg.store_root
        self.delay_levels_ms = parse_delay_levels(cfg.messageDelayLevel)
        self._lock_file = StoreLock(self.root)
        self._abort = AbortFile(self.root)
        self.allocate = AllocateService(
            self.root / "commitlog", cfg.mappedFileSizeCommitLog,
            warm=cfg.warmMapedFileEnable, sync_warm=cfg.sync_flush,
        )
        self.commit_log = CommitLog(
            self.root, cfg.mappedFileSizeCommitLog, max_message_size=cfg.maxMessageSize,
            store_ip=cfg.store_host_ip(), store_port=cfg.listenPort, allocate=self.allocate,
            put_lock_busy_ms=cfg.putLockWarnMs, append_prop_crc=cfg.enabledAppendPropCRC,
        )
        self._crc_marker = self.root / "config" / "recordCrc.json"
        self.cq_store = ConsumeQueueStore(self.root, cfg.mappedFileSizeConsumeQueue)
        self.index: IndexService | None = (
            IndexService(self.root, cfg.maxHashSlotNum, cfg.maxIndexNum)
            if cfg.messageIndexEnable else None
        )
        self.extensions = StoreExtensions()
        self.index_dispatcher: IndexDispatcher | None = None
        if self.index is not None:
            self.index_dispatcher = IndexDispatcher(self.index, self.extensions)
            self.extensions.add_dispatcher(self.index_dispatcher)
        self.checkpoint: StoreCheckpoint | None = None
        self.reput = ReputService(self)
        self.dispatched_phy_offset = 0
        # RocketMQ 5's confirmOffset: consumers are served nothing past it (reput dispatches
        # only up to it, so no ConsumeQueue entry, index key or delayed delivery exists
        # beyond it). None: every appended byte counts (no controller). In controller mode a
        # master sets it to what every SyncStateSet member holds, a slave to what its master
        # says; a record past it may not survive a failover, so no consumer may see it.
        self.confirm_phy_offset: int | None = None
        # this store's identity, made when its directory is (a wiped or replaced disk gets a
        # new one): the controller tells a SyncStateSet member from a stranger with its id
        self.store_id = ""
        self.recovery: RecoveryReport | None = None
        self.page_cache_kept = False  # the last start followed a crash of the process alone
        # where the newest record dispatched starts: a record boundary for the checkpoint
        self.dispatched_record_offset = 0
        self.running = False
        self.puts = 0
        self.put_failures = 0
        self.deleted_segments = 0
        self._group_commit: GroupCommitService | None = None
        self._watcher: FlushWatcher | None = None
        self._flusher: PeriodicFlushService | None = None
        self._cq_flusher: PeriodicFlushService | None = None
        self._services: list[object] = []
        # "" while this broker may write, else why not (the broker's write_refusal): delayed
        # deliveries are writes, and a fenced or stand-by master makes none
        self.delivery_gate: Callable[[], str] | None = None
        # first of the put hooks: a half message is neither delayed nor timed
        self.transactions = TransactionStore(self)
        self.transactions.install(self.extensions, self.index_dispatcher)
        self.delay = DelayLevels(self, self.delay_levels_ms)
        self.delay.install(self.extensions, self.index_dispatcher)
        self.timer = TimerStore(self, cfg)  # after delay levels: a delay level wins
        self.timer.install(self.extensions, self.index_dispatcher)
        self.pop = PopStore(self)  # POP consumption's state, from the revive topic's records
        self.pop.install(self.extensions)
        self.cleaner = CleanService(self)
        self._master_services: dict[str, MasterService] = {}  # running, by name

    @property
    def schedule(self) -> ScheduleService:
        """Delay-level delivery: running on a master, idle (its offsets only) on a slave."""
        return self.delay.service

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_file.acquire()
        try:
            self._load_and_recover()
            self._start_services()
        except BaseException:
            self._lock_file.release()
            raise
        self._abort.create()
        self.running = True
        log.info("event=store_started root=%s min=%d max=%d abnormal=%s", self.root,
                 self.min_phy_offset, self.max_phy_offset, self.recovery and self.recovery.abnormal)

    def _load_and_recover(self) -> None:
        crash = self._abort.crash()
        abnormal = crash is not None
        # a crash of the process alone: the page cache kept every byte written into the
        # mappings, torn only where a write was under way (the log's last record, the
        # index's last key): what was dispatched before need not be checked or built again
        kept = crash == AbortFile.PROCESS
        (self.root / "config").mkdir(exist_ok=True)
        self.store_id = store_identity(self.root / "config" / "storeId")
        self.checkpoint = StoreCheckpoint(self.root / "checkpoint")
        self.commit_log.load()
        # the CommitLog first: a log damaged below its flushed offset stops the start before
        # any other file is touched
        self.commit_log.require_prop_crc_from = self._crc_required_from()
        # a slave repairs from its master; a master (or a slave about to resume a promotion)
        # must not: those bytes may exist nowhere else
        self.recovery = self.commit_log.recover(
            abnormal, self.checkpoint.physic_flushed_offset,
            cut_below_flushed=self.repair_from_master,
            boundary=(self.checkpoint.dispatched_record_offset or None) if kept else None)
        self.page_cache_kept = kept
        self.cq_store.load()
        if self.index is not None:
            self.index.load(not abnormal, self.checkpoint.index_msg_timestamp,
                            page_cache_kept=kept)
        self.cq_store.recover_all()
        self._note_crc_start()
        log_end = self.commit_log.max_offset
        self.cq_store.truncate_dirty(log_end)
        self.cq_store.correct_min_offset(self.commit_log.min_offset)
        if self.index is not None:
            self.index.truncate(log_end)
        self.dispatched_phy_offset = self._dispatch_start(abnormal)
        if self.checkpoint.dispatched_record_offset < min(self.dispatched_phy_offset, log_end):
            self.dispatched_record_offset = self.checkpoint.dispatched_record_offset
        if self.cfg.enableControllerMode:
            # what was visible before (dispatched, hence confirmed then) and no more: the
            # rest waits until the controller's master confirms it, or this broker is elected
            self.confirm_phy_offset = max(self.dispatched_phy_offset, min(
                self.checkpoint.confirm_phy_offset, self.commit_log.max_offset))
        self.reput.catch_up()
        self._rebuild_queue_table()
        # what recovery kept of an unflushed tail is written out before it is claimed
        self.checkpoint.physic_flushed_offset = self.commit_log.flush(0)
        self.checkpoint.flush()

    # ---- the whole-record CRC: from where every record carries it ---------------------------
    def _crc_since(self) -> int | None:
        """From which offset every record carries the whole-record CRC (None: no marker).
        An unreadable marker refuses the start: taking it as absent would quietly stop
        requiring the CRC of every record already written."""
        try:
            since = json.loads(self._crc_marker.read_bytes())["since"]
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as e:
            raise StoreError(f"{self._crc_marker} is unreadable ({e!r}); it should read "
                             '{"since": <offset>}, the offset from which this store writes '
                             "the whole-record CRC") from None
        if isinstance(since, bool) or not isinstance(since, int) or since < 0:
            raise StoreError(f"{self._crc_marker}: since must be an offset >= 0, not {since!r}")
        return since

    def _crc_required_from(self) -> int | None:
        """Recovery requires the record CRC only where this store is known to have written it:
        from the offset at which it started writing CRCs (never for a store written by RocketMQ
        4.x or with ``enabledAppendPropCRC`` off, whose records would all be cut)."""
        if not (self.cfg.forceVerifyPropCRC and self.cfg.enabledAppendPropCRC):
            return None
        return self._crc_since()

    def _note_crc_start(self) -> None:
        """Record (or forget) from which offset this store writes the record CRC."""
        since = self._crc_since()
        if not self.cfg.enabledAppendPropCRC:
            if since is not None:
                self._crc_marker.unlink()
            return
        end = self.commit_log.max_offset
        if since is None or since > end:
            write_atomically(self._crc_marker, json.dumps({"since": end}).encode())

    def _dispatch_start(self, abnormal: bool) -> int:
        """Where reput resumes: the ConsumeQueues' end; after a crash also what the index and
        the unverified tail need, and no later than the last checkpoint's dispatched offset
        (re-dispatch is idempotent for all three).

        The ConsumeQueues' end is the highest end any queue points to, and it is only where
        reput stopped if it stopped between passes: a pass writes its entries queue by queue,
        so a crash within one can leave a queue pointing past records of another whose run
        was not written yet. ``dispatched_phy_offset`` moves only once a pass is whole, and
        the checkpoint keeps it (``confirm_phy_offset``, written at each flush of the
        indexes): below it no queue lacks an entry."""
        log_min = self.commit_log.min_offset
        start = min(self.cq_store.max_phy_offset(), self.commit_log.max_offset)
        cut = self.cq_store.take_cut_end()
        if cut is not None:  # a damaged or torn queue: its erased entries are built again
            start = min(start, cut)
        if abnormal:
            if self.checkpoint is not None:
                start = min(start, self.checkpoint.confirm_phy_offset)
            if self.index is not None:
                files = self.index.files
                start = min(start, files[-1].end_phy_offset if files else log_min)
            if self.recovery is not None and not self.page_cache_kept:
                start = min(start, self.recovery.start_offset)
        return max(start, log_min)

    def _rebuild_queue_table(self) -> None:
        """The next queue offset of every queue: what the ConsumeQueues hold, and past that
        what the records not dispatched yet (beyond the confirmed offset) took already."""
        table = dict(self.cq_store.topic_queue_table())
        for key, next_offset in tail_queue_offsets(self.undispatched_records()).items():
            table[key] = max(table.get(key, 0), next_offset)
        self.commit_log.topic_queue_table = table

    def undispatched_records(self) -> list[DispatchRequest]:
        """The whole records past what reput dispatched (past the confirmed offset, or not
        reached yet), as reput would dispatch them."""
        if self.dispatched_phy_offset >= self.commit_log.max_offset:
            return []
        return tail_records(self.commit_log, self.dispatched_phy_offset, self.extensions)

    # ---- the confirmed offset (RocketMQ 5's confirmOffset) ----------------------------------
    def reput_end(self) -> int:
        """Where reput stops: the log's end, or the confirmed offset when that is lower."""
        end = self.commit_log.max_offset
        confirm = self.confirm_phy_offset
        return end if confirm is None or confirm >= end else confirm

    def set_confirm_offset(self, confirm_phy_offset: int | None) -> None:
        """Consumers may now be served up to ``confirm_phy_offset`` (None: everything). It
        never goes back below what is dispatched already (served once, a record stays served);
        the caller dispatches what it uncovers (``dispatch_inline``) or reput's thread does."""
        if confirm_phy_offset is not None:
            confirm_phy_offset = max(confirm_phy_offset, self.dispatched_phy_offset)
        before = self.confirm_phy_offset
        self.confirm_phy_offset = confirm_phy_offset
        if before is not None and (confirm_phy_offset is None or confirm_phy_offset > before):
            self.reput.wake()

    def bound_confirm_offset(self) -> int:
        """Consumers see no more than the log holds now, until a caller raises the bound
        (a master's HA service, as acks arrive); returns that end. Under the put lock: no
        record appended meanwhile is visible before its acks."""
        with self.commit_log.put_lock:
            end = self.commit_log.max_offset
            if self.confirm_phy_offset is None:
                self.set_confirm_offset(end)
        return end

    def confirmed(self, phy_offset: int) -> bool:
        """Whether the record at ``phy_offset`` may be shown to a client (look-ups by
        offset, msgId or key read the CommitLog itself, past the ConsumeQueues)."""
        confirm = self.confirm_phy_offset
        return confirm is None or phy_offset < self.dispatched_phy_offset

    def _start_services(self) -> None:
        cfg = self.cfg
        self.allocate.start()
        self.commit_log.append_listeners.append(self.reput.wake)
        if cfg.sync_flush:
            self._group_commit = GroupCommitService(self._flush_commit_log, cfg.syncFlushTimeout)
            self._watcher = FlushWatcher(self._group_commit)
            self._services += [self._group_commit, self._watcher]
        self._flusher = PeriodicFlushService(
            self._flush_commit_log, cfg.flushIntervalCommitLog, cfg.flushCommitLogLeastPages,
            cfg.flushCommitLogThoroughInterval, name="replog-flush-commitlog",
        )
        self._cq_flusher = PeriodicFlushService(
            self._flush_indexes, cfg.flushIntervalConsumeQueue, cfg.flushConsumeQueueLeastPages,
            cfg.flushConsumeQueueThoroughInterval, name="replog-flush-cq",
        )
        self._services += [self._flusher, self._cq_flusher, self.reput, self.cleaner]
        for service in self._services:
            service.start()  # type: ignore[attr-defined]
        for name, extra in self.extensions.services.items():
            extra.start()
            log.info("event=store_service_started name=%s", name)
        self.set_master_services(self._start_master_services)

    def set_master_services(self, enabled: bool) -> None:
        """Start (each made anew) or stop the services only a master runs, in the order they
        were registered (stopped in reverse)."""
        if enabled:
            for name, factory in self.extensions.master_services.items():
                if name not in self._master_services:
                    service = factory()
                    service.start()
                    self._master_services[name] = service
        else:
            for name in reversed(list(self._master_services)):
                self._master_services.pop(name).shutdown()

    @property
    def master_services_running(self) -> list[str]:
        return list(self._master_services)

    def become_master(self) -> None:
        """A promoted slave: index what replication appended, then continue its queue offsets.

        A slave never puts, so its queue offset table is only what start-up rebuilt; without
        this a promoted slave would hand out queue offsets that its ConsumeQueues already hold.
        Call after replication into this store has stopped.
        """
        if not self.cfg.enableControllerMode:
            self.confirm_phy_offset = None
        # in controller mode the confirmed offset stays until the master's HA service knows
        # the SyncStateSet (master/ha_service.py): the other members may lack the tail
        self.reput.catch_up()
        with self.commit_log.put_lock:
            self._rebuild_queue_table()
        self.is_master = True
        self.set_master_services(True)

    def on_dispatch_corruption(self, e: CorruptionError) -> None:
        """Reput met a record it cannot read: nothing after it can reach a ConsumeQueue, so a
        master stops taking writes (a SEND_OK would promise a message no pull can return);
        a slave's writes are refused by its role already, and it cannot be promoted (its
        ``become_master`` dispatches first and meets the same record)."""
        if not self.is_master or not self.commit_log.writeable:
            return
        self.commit_log.not_writeable_reason = (
            f"the CommitLog is corrupt at offset {e.phy_offset} ({e.reason}): records after "
            f"it cannot be indexed, so this master takes no writes; see its log")
        self.commit_log.writeable = False
        log.error("event=store_not_writeable offset=%d reason=%s", e.phy_offset, e.reason)

    def become_slave(self) -> None:
        """Stop what only a master runs (delay delivery); writes are refused by the role. In
        controller mode what is visible stays as it is until the master says more."""
        self.is_master = False
        self.set_master_services(False)
        if self.cfg.enableControllerMode:
            self.confirm_phy_offset = self.dispatched_phy_offset

    def clean_now(self) -> int:
        """Delete expired segments now, whatever the hour (operators, tests)."""
        return self.cleaner.run_once(force=True)

    def shutdown(self) -> None:
        """Stop services, flush everything, checkpoint, remove abort, release the lock."""
        if not self.running:
            return
        self.running = False
        self.commit_log.writeable = False
        self.commit_log.not_writeable_reason = "store is shutting down"
        self.set_master_services(False)
        for extra in reversed(list(self.extensions.services.values())):
            extra.shutdown()
        for service in reversed(self._services):
            service.shutdown()  # type: ignore[attr-defined]
        self._services.clear()
        try:
            self.reput.catch_up()
        except CorruptionError as e:  # still flush and release: the abort file stays, so the
            # next start recovers (and cuts the log at this record)
            log.error("event=shutdown_undispatched offset=%d reason=%s", e.phy_offset, e.reason)
        self.allocate.shutdown()
        self._flush_commit_log(0)
        self._flush_indexes(0)
        clean = self.dispatched_phy_offset >= self.reput_end()
        self.commit_log.shutdown()
        self.cq_store.shutdown()
        if self.index is not None:
            self.index.shutdown()
        assert self.checkpoint is not None
        self.checkpoint.close()
        if clean:
            self._abort.remove()
        self._lock_file.release()
        log.info("event=store_stopped clean=%s", clean)

    # ---- flushing -------------------------------------------------------------------------
    def _flush_commit_log(self, least_pages: int) -> int:
        flushed = self.commit_log.flush(least_pages)
        if self.checkpoint is not None:
            mf = self.commit_log.queue.find(max(flushed - 1, 0))
            if mf is not None and mf.store_timestamp:
                self.checkpoint.physic_msg_timestamp = mf.store_timestamp
            self.checkpoint.physic_flushed_offset = flushed
        return flushed

    def _flush_indexes(self, least_pages: int) -> int:
        self.cq_store.flush_all(least_pages)
        if self.checkpoint is not None:
            self.checkpoint.logics_msg_timestamp = self._last_dispatch_ts
            # everything dispatched was confirmed: a restart in controller mode shows that
            self.checkpoint.confirm_phy_offset = self.dispatched_phy_offset
            self.checkpoint.dispatched_record_offset = self.dispatched_record_offset
            if self.index is not None:
                self.index.flush()
                self.checkpoint.index_msg_timestamp = self.index.flushed_end_timestamp
            self.checkpoint.flush()
        return 0

    _last_dispatch_ts = 0

    # ---- dispatch (called by reput) -----------------------------------------------------------
    def dispatch_cq(self, topic: str, queue_id: int, first_queue_offset: int,
                    entries: list[tuple[int, int, int]], packed: bytes = b"") -> None:
        cq = self.cq_store.find_or_create(topic, queue_id)
        if not cq.put_many(first_queue_offset, entries, packed):
            raise StoreError(f"cannot append to consume queue {topic}/{queue_id}: "
                             f"{cq.last_error}")
        if entries and entries[-1][0] > self.dispatched_record_offset:
            self.dispatched_record_offset = entries[-1][0]

    def note_dispatched_timestamp(self, store_timestamp: int) -> None:
        """Store time of the last dispatched record (checkpoint logicsMsgTimestamp)."""
        self._last_dispatch_ts = store_timestamp

    def dispatch_inline(self) -> int:
        """Make what this thread appended visible now (request loops, after each burst).

        From the first call on, this thread's appends no longer wake the reput thread: it
        promises to call this after each of its bursts until ``end_inline_dispatch``."""
        self.reput.inline_threads.add(threading.get_ident())
        return self.reput.dispatch_inline()

    def dispatching_inline(self) -> AbstractContextManager[None]:
        """Appends made inside wake nobody, and are dispatched on this thread on the way out:
        ``dispatch_inline``'s promise for one stretch (the request server's local calls, served
        on their caller's thread), so that a thread which ends leaves no ident behind."""
        return _InlineStretch(self.reput)

    def end_inline_dispatch(self) -> None:
        """The calling thread ends: a later thread with its (recycled) ident wakes reput."""
        self.reput.inline_threads.discard(threading.get_ident())

    def add_arrival_listener(self, listener: ArrivalListener, topic: str | None = None) -> None:
        """Called on the dispatching thread with (topic, queue id, max queue offset) after
        records are dispatched; with ``topic``, for that topic's records only."""
        if topic is None:
            self.reput.arrival_listeners.append(listener)
        else:
            self.reput.topic_arrival_listeners.setdefault(topic, []).append(listener)

    def add_append_listener(self, listener: AppendListener) -> None:
        self.commit_log.append_listeners.append(listener)

    # ---- puts -----------------------------------------------------------------------------------
    def _run_put_hooks(self, msg: Message, queue_id: int) -> tuple[Message, int] | PutResult:
        """The message and queue the put hooks say to store, or the refusal one of them made.
        Called for a message with a delay level or a property some hook triggers on (a put
        carrying neither is stored as it is, without a call per hook)."""
        for hook in self.extensions.put_hooks:
            out = hook.before_put(msg, queue_id)
            if out is None:
                continue
            if isinstance(out, PutResult):
                if out.status is PutStatus.PUT_OK:
                    raise StoreError(f"put hook {hook.name} returned PUT_OK for a put it stopped")
                return out
            msg, queue_id = out
        return msg, queue_id

    def put_nowait(self, msg: Message, queue_id: int, born_host: tuple[str, int] = ("127.0.0.1", 0),
                   born_timestamp: int = 0) -> PendingPut:
        screen = self.extensions.put_hook_triggers
        if screen is None or msg.delay_level or not screen.isdisjoint(msg.properties):
            hooked = self._run_put_hooks(msg, queue_id)
            if isinstance(hooked, PutResult):
                return self._pending(hooked, False)
            msg, queue_id = hooked
        result = self.commit_log.put(msg, queue_id, _cached_host(born_host[0]), born_host[1],
                                     born_timestamp)
        return self._pending(result, msg.properties.get(PROPERTY_WAIT) != "false")

    def put_batch_nowait(self, topic: str, queue_id: int, msgs: Sequence[Message | bytes],
                         born_host: tuple[str, int] = ("127.0.0.1", 0),
                         born_timestamp: int = 0) -> PendingPut:
        result = self.commit_log.put_batch(topic, queue_id, msgs, _cached_host(born_host[0]),
                                           born_host[1], born_timestamp)
        return self._pending(result, True)

    def _pending(self, result: PutResult, wait: bool) -> PendingPut:
        if result.status is not PutStatus.PUT_OK:
            self.put_failures += 1
            return PendingPut(result, done_future(result.status))
        self.puts += result.msg_count
        if self._group_commit is not None and wait:
            return PendingPut(result, self._group_commit.request(result.end_phy_offset))
        return _new_tuple(PendingPut, (result, FLUSHED))  # no Python-level __new__ (per put)

    def wait_flushed(self, pending: PendingPut) -> PutResult:
        if pending.flushed is FLUSHED:
            return pending.result
        if pending.flushed.done():
            status = pending.flushed.result()
        else:
            try:
                status = pending.flushed.result(timeout=self.cfg.syncFlushTimeout / 1000 + 1)
            except FutureTimeout:
                status = PutStatus.FLUSH_DISK_TIMEOUT
        if status is pending.result.status:
            return pending.result
        return pending.result._replace(status=status)

    def put(self, msg: Message, queue_id: int, born_host: tuple[str, int] = ("127.0.0.1", 0),
            born_timestamp: int = 0) -> PutResult:
        if self._group_commit is None:
            # ASYNC_FLUSH: nothing to wait for, so no PendingPut to build and unwrap (what
            # put_nowait + wait_flushed return here, at ~10% less per put)
            screen = self.extensions.put_hook_triggers
            if screen is None or msg.delay_level or not screen.isdisjoint(msg.properties):
                hooked = self._run_put_hooks(msg, queue_id)
                if isinstance(hooked, PutResult):
                    self.put_failures += 1
                    return hooked
                msg, queue_id = hooked
            result = self.commit_log.put(msg, queue_id, _cached_host(born_host[0]),
                                         born_host[1], born_timestamp)
            if result.status is PutStatus.PUT_OK:
                self.puts += result.msg_count
            else:
                self.put_failures += 1
            return result
        return self.wait_flushed(self.put_nowait(msg, queue_id, born_host, born_timestamp))

    def put_batch(self, topic: str, queue_id: int, msgs: Sequence[Message | bytes],
                  born_host: tuple[str, int] = ("127.0.0.1", 0), born_timestamp: int = 0) -> PutResult:
        return self.wait_flushed(self.put_batch_nowait(topic, queue_id, msgs, born_host,
                                                       born_timestamp))

    # ---- reads ----------------------------------------------------------------------------------
    def get_message(self, group: str, topic: str, queue_id: int, queue_offset: int, max_nums: int,
                    tags_codes: set[int] | None = None, max_bytes: int = MAX_GET_BYTES,
                    tags: frozenset[str] | None = None,
                    selector: Selector | None = None) -> GetResult:
        """Up to ``max_nums`` records from ``queue_offset``. ``tags_codes``: only entries
        whose tag hash is one of these; ``tags``: and whose TAGS property is one of these
        (two tags can share a hash: the record itself says which it has); ``selector``: and
        whose properties it matches (SQL92). A filtered read looks at up to
        ``FILTER_SCAN_ENTRIES`` entries (RocketMQ's 16,000 bytes of ConsumeQueue) or
        ``max_nums``, whichever is more, and answers NO_MATCHED_MESSAGE past them when none
        matched: the reader goes on from ``next_begin_offset``."""
        del group  # consumer groups matter for offsets, not for reading
        cq = self.cq_store.get(topic, queue_id)
        if cq is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        min_q, max_q = cq.min_queue_offset, cq.max_queue_offset
        if max_q == 0 or max_q <= min_q:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, min_q, min_q, max_q)
        if queue_offset < min_q:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, min_q, min_q, max_q)
        if queue_offset == max_q:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, queue_offset, min_q, max_q)
        if queue_offset > max_q:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, max_q, min_q, max_q)
        return self._read_entries(cq, queue_offset, max(1, min(max_nums, 1024)), tags_codes,
                                  max_bytes, min_q, max_q, tags, selector)

    def _read_entries(self, cq: object, queue_offset: int, max_nums: int,
                      tags_codes: set[int] | None, max_bytes: int, min_q: int,
                      max_q: int, tags: frozenset[str] | None = None,
                      selector: Selector | None = None) -> GetResult:
        records: list[bytes] = []
        next_offset = queue_offset
        total = 0
        log_min = self.commit_log.min_offset
        removed = 0
        filtered = tags_codes is not None or selector is not None
        scanned_limit = max(FILTER_SCAN_ENTRIES, max_nums) if filtered else max_nums
        for q_off, phy, size, code in cq.entries(queue_offset, scanned_limit):  # type: ignore[attr-defined]
            if records and (len(records) >= max_nums or total + size > max_bytes):
                break
            next_offset = q_off + 1
            if phy < log_min:
                removed += 1
                continue
            if tags_codes is not None and code not in tags_codes:
                continue
            raw = self.commit_log.read_record(phy, size)
            if raw is None:
                break
            why = _misplaced(raw, phy, size)
            if why:  # the entry does not lead to its record: serve what came before it
                log.error("event=read_corrupt queue_offset=%d offset=%d reason=%s", q_off, phy,
                          why)
                if records:
                    next_offset = q_off
                    break
                return GetResult(GetStatus.CORRUPT_RECORD, q_off, min_q, max_q,
                                 corrupt=(q_off, phy, why))
            if tags is not None and record.record_tags(raw) not in tags:
                continue  # another tag with the same hash code
            if selector is not None and not selector.matches(record.record_properties(raw)):
                continue
            records.append(raw)
            total += size
        if records:
            status = GetStatus.FOUND
        elif removed:
            status = GetStatus.MESSAGE_WAS_REMOVING
        elif filtered:
            status = GetStatus.NO_MATCHED_MESSAGE
        else:
            status = GetStatus.OFFSET_FOUND_NULL
        return GetResult(status, next_offset, min_q, max_q, records)

    def min_queue_offset(self, topic: str, queue_id: int) -> int:
        cq = self.cq_store.get(topic, queue_id)
        return cq.min_queue_offset if cq is not None else 0

    def max_queue_offset(self, topic: str, queue_id: int) -> int:
        cq = self.cq_store.get(topic, queue_id)
        return cq.max_queue_offset if cq is not None else 0

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose message was stored at or after ``timestamp_ms``
        (RocketMQ's getOffsetInQueueByTime, Kafka's offsetsForTimes): the queue's max offset
        when every message is older, its min offset when none is, 0 for an unknown queue.

        A binary search over the queue by STORETIMESTAMP: exact while store times grow along
        the queue, as they do under one clock; after a failover to a broker whose clock is
        behind, it lands on some offset whose neighbours straddle the time.
        """
        cq = self.cq_store.get(topic, queue_id)
        if cq is None:
            return 0
        return cq.offset_by_time(timestamp_ms, self.commit_log.store_timestamp_at)

    def store_timestamp_of(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        """STORETIMESTAMP of the message at a queue offset (None if the queue has none there)."""
        cq = self.cq_store.get(topic, queue_id)
        entry = cq.get(queue_offset) if cq is not None else None
        return self.commit_log.store_timestamp_at(entry[0]) if entry is not None else None

    def topic_queues(self) -> dict[str, int]:
        """Queue count per topic over what this store holds: its ConsumeQueues, and the
        queues records past the confirmed offset were put to (not dispatched yet)."""
        out = self.cq_store.topics()
        for topic, queue_id in list(self.commit_log.topic_queue_table):
            out[topic] = max(out.get(topic, 0), queue_id + 1)
        return out

    def message_by_offset(self, phy_offset: int) -> MessageExt | None:
        return self.entry_message(phy_offset) if self.confirmed(phy_offset) else None

    def entry_message(self, phy_offset: int) -> MessageExt | None:
        """The message a ConsumeQueue entry or an index hit names, for the store's own
        services (the timer, delayed delivery); ``entry_record``: its bytes.

        Not ``message_by_offset``: reput writes a pass's entries before it moves
        ``dispatched_phy_offset`` past their records, so a thread that read an entry could
        find the client's gate (``confirmed``) still shut for a moment, and take a message
        for unreadable. An entry exists only for a dispatched record, and reput dispatches
        nothing past the confirmed offset: the record an entry names is confirmed."""
        if not self.commit_log.min_offset <= phy_offset < self.commit_log.max_offset:
            return None
        try:
            return self.commit_log.message_at(phy_offset)
        except CorruptionError as e:
            log.error("event=read_corrupt offset=%d reason=%s", e.phy_offset, e.reason)
            return None

    def entry_record(self, phy_offset: int) -> bytes | None:
        if not self.commit_log.min_offset <= phy_offset < self.commit_log.max_offset:
            return None
        return self.commit_log.read_record(phy_offset)

    def find_message(self, phy_offset: int) -> MessageExt:
        """The message whose record starts at ``phy_offset``, for a client that names one;
        LookupError saying why not (no record starts there, or it fails its checks)."""
        log_ = self.commit_log
        if not log_.min_offset <= phy_offset < log_.max_offset:
            raise LookupError(f"commitLogOffset {phy_offset} is outside the CommitLog "
                              f"[{log_.min_offset}, {log_.max_offset})")
        try:
            found = log_.message_at(phy_offset)
        except CorruptionError as e:
            raise LookupError(f"no message starts at commitLogOffset {phy_offset}: "
                              f"{e.reason}") from None
        if found is None:
            raise LookupError(f"no message starts at commitLogOffset {phy_offset}")
        if not self.confirmed(phy_offset):
            raise LookupError(f"the message at commitLogOffset {phy_offset} is not confirmed "
                              "by the SyncStateSet yet")
        return found

    def record_at(self, phy_offset: int) -> bytes | None:
        """The stored bytes of the whole record at ``phy_offset`` (query answers)."""
        if not self.commit_log.min_offset <= phy_offset < self.commit_log.max_offset:
            return None
        if not self.confirmed(phy_offset):
            return None
        return self.commit_log.read_record(phy_offset)

    def message_by_msg_id(self, msg_id: str) -> MessageExt | None:
        """The message ``msg_id`` names: the record at its CommitLog offset, and only if that
        record carries the msgId's STOREHOST (IPv4 address and port). The offset alone names
        nothing: another broker's msgId points at an offset where any record of ours may
        start. A slave's records are its master's bytes (the master's STOREHOST), and a record
        keeps the host of the master that stored it after a failover, so every replica of the
        group finds it, and no other broker does."""
        try:
            _, _, phy_offset = decode_msg_id(msg_id)
        except ValueError:
            return None
        found = self.message_by_offset(phy_offset)
        if found is None or found.msg_id != msg_id.upper():
            return None
        return found

    def query_by_key(self, topic: str, key: str, max_nums: int = 32, begin_ms: int = 0,
                     end_ms: int = 2**62) -> list[MessageExt]:
        """Messages of ``topic`` with ``key`` (KEYS or unique key), newest first."""
        if self.index is None:
            return []
        max_nums = max(1, min(max_nums, MAX_QUERY))
        found = []
        for phy in self.index.query(topic, key, max_nums * 2, begin_ms, end_ms):
            msg = self.message_by_offset(phy)
            if msg is None or msg.topic != topic:
                continue  # hash collision or removed
            if key in msg.key_list() or msg.properties.get("UNIQ_CLIENT_MESSAGE_ID_KEYIDX") == key:
                found.append(msg)
                if len(found) >= max_nums:
                    break
        return found

    # ---- offsets --------------------------------------------------------------------------------
    @property
    def min_phy_offset(self) -> int:
        return self.commit_log.min_offset

    @property
    def max_phy_offset(self) -> int:
        return self.commit_log.max_offset

    @property
    def flushed_phy_offset(self) -> int:
        return self.commit_log.flushed_offset

    # ---- replication hooks --------------------------------------------------------------------
    def read_committed(self, phy_offset: int, max_bytes: int) -> bytes:
        return self.commit_log.read(phy_offset, max_bytes)

    def log_checksum(self, from_offset: int, to_offset: int, max_bytes: int) -> str:
        """sha256 (hex) of the CommitLog bytes ``[from_offset, to_offset)``, segment padding
        included: what a replica must hold byte for byte. LookupError naming the log's range
        when the range is not all in the log (before or after the read: a truncation or a
        retention run meanwhile); ValueError when it is reversed or longer than
        ``max_bytes``."""
        if to_offset < from_offset or to_offset - from_offset > max_bytes:
            raise ValueError(f"[{from_offset}, {to_offset}) is not a range of at most "
                             f"{max_bytes} bytes")
        self._check_in_log(from_offset, to_offset)
        digest = hashlib.sha256()
        pos = from_offset
        try:
            while pos < to_offset:
                chunk = self.commit_log.read(pos, min(CHECKSUM_READ_BYTES, to_offset - pos))
                if not chunk:
                    raise LookupError(f"no byte at CommitLog offset {pos}")
                digest.update(chunk)
                pos += len(chunk)
        except ValueError:  # a segment unmapped under the read (retention, truncation)
            raise LookupError(f"the CommitLog changed under the read at offset {pos}") from None
        self._check_in_log(from_offset, to_offset)
        return digest.hexdigest()

    def _check_in_log(self, from_offset: int, to_offset: int) -> None:
        low, high = self.commit_log.min_offset, self.commit_log.max_offset
        if not low <= from_offset <= to_offset <= high:
            raise LookupError(f"[{from_offset}, {to_offset}) is not inside the CommitLog "
                              f"[{low}, {high})")

    # The replication fence: an HA client takes a generation when it starts and hands it to
    # every replicated write; a promotion closes the fence under the put lock before it
    # writes its epoch, so a client that did not stop in time cannot write after that.
    def open_replication(self) -> int:
        return self.commit_log.open_replication()

    def fence_replication(self) -> int:
        return self.commit_log.fence_replication()

    @contextlib.contextmanager
    def replication_guard(self, generation: int | None) -> Iterator[None]:
        """Hold the put lock with the fence checked (an HA client saving the epoch file)."""
        with self.commit_log.put_lock:
            self.commit_log.check_fence(generation)
            yield

    def append_replicated(self, phy_offset: int, data: bytes | memoryview,
                          generation: int | None = None) -> int:
        return self.commit_log.append_replicated(phy_offset, data, generation)

    def truncate_to(self, phy_offset: int, generation: int | None = None) -> None:
        """Drop every byte at or after ``phy_offset``: log, ConsumeQueues and index, on disk."""
        with self.reput._lock:
            with self.commit_log.put_lock:
                self.commit_log.check_fence(generation)  # before anything changes
            self.allocate.discard()
            self.commit_log.truncate(phy_offset, generation)
            self.cq_store.truncate_dirty(phy_offset)
            if self.index is not None:
                self.index.truncate(phy_offset)
            self.dispatched_phy_offset = min(self.dispatched_phy_offset, phy_offset)
            if self.confirm_phy_offset is not None:
                self.confirm_phy_offset = min(self.confirm_phy_offset, phy_offset)
            self._rebuild_queue_table()
            if self.checkpoint is not None:
                self.checkpoint.physic_flushed_offset = min(
                    self.checkpoint.physic_flushed_offset, phy_offset)
                self.checkpoint.confirm_phy_offset = min(
                    self.checkpoint.confirm_phy_offset, phy_offset)
                if self.checkpoint.dispatched_record_offset >= phy_offset:
                    self.checkpoint.dispatched_record_offset = 0
                self.checkpoint.flush()
            if self.dispatched_record_offset >= phy_offset:
                self.dispatched_record_offset = 0
            for listener in self.extensions.cut_listeners:
                listener.on_truncate(phy_offset)
        log.warning("event=store_truncated offset=%d", phy_offset)

    def reset_to(self, phy_offset: int, generation: int | None = None) -> None:
        """Empty the store so that the log starts at ``phy_offset`` (slave far behind)."""
        with self.reput._lock:
            with self.commit_log.put_lock:
                self.commit_log.check_fence(generation)  # before anything changes
            self.allocate.discard()
            with self.commit_log.put_lock:
                self.commit_log.check_fence(generation)
                self.commit_log.queue.reset_empty(phy_offset)
            self.cq_store.truncate_dirty(0)
            if self.index is not None:
                self.index.truncate(0)
            self.dispatched_phy_offset = phy_offset
            if self.confirm_phy_offset is not None:
                self.confirm_phy_offset = phy_offset
            self._rebuild_queue_table()
            if self.checkpoint is not None:
                self.checkpoint.physic_flushed_offset = phy_offset
                self.checkpoint.confirm_phy_offset = phy_offset
                self.checkpoint.dispatched_record_offset = 0
                self.checkpoint.flush()
            self.dispatched_record_offset = 0
            for listener in self.extensions.cut_listeners:
                listener.on_reset(phy_offset)

    # ---- figures --------------------------------------------------------------------------------
    def timer_status(self) -> dict[str, Any]:
        return self.timer.status()

    def snapshot(self) -> StoreStats:
        cl = self.commit_log
        rec = self.recovery
        return StoreStats(
            min_phy_offset=cl.min_offset,
            max_phy_offset=cl.max_offset,
            flushed_phy_offset=cl.flushed_offset,
            dispatched_phy_offset=self.dispatched_phy_offset,
            confirm_phy_offset=self.reput_end(),
            flush_lag_bytes=max(0, cl.max_offset - cl.flushed_offset),
            reput_lag_bytes=max(0, cl.max_offset - self.dispatched_phy_offset),
            segments=len(cl.queue.files),
            consume_queues=sum(self.cq_store.topics().values()),
            puts=self.puts,
            put_failures=self.put_failures,
            dispatched_records=self.reput.dispatched,
            deleted_segments=self.deleted_segments,
            segments_pending_delete=len(cl.queue.pending_delete) + self.cq_store.pending_delete(),
            segment_close_failures=cl.queue.close_failures + self.cq_store.close_failures(),
            segments_held_too_long=cl.queue.held_too_long,
            writeable=cl.writeable,
            last_recovery=(f"{'abnormal' if rec.abnormal else 'normal'} end={rec.end_offset} "
                           f"cut={rec.cut_bytes} {rec.cut_reason}".strip() if rec else ""),
        )

    def wait_dispatched(self, phy_offset: int, timeout_s: float = 5.0) -> bool:
        """Block until reput has dispatched up to ``phy_offset`` (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while self.dispatched_phy_offset < phy_offset:
            if time.monotonic() > deadline:
                return False
            self.reput.wake()
            time.sleep(0.001)
        return True


class _InlineStretch:
    """``MessageStore.dispatching_inline``'s stretch (a class, not a generator: it wraps every
    local call the gRPC front end makes)."""

    __slots__ = ("_ident", "_reput")

    def __init__(self, reput: ReputService):
        self._reput = reput
        self._ident = 0  # this thread's, when the stretch added it

    def __enter__(self) -> None:
        ident = threading.get_ident()
        threads = self._reput.inline_threads
        if ident not in threads:
            threads.add(ident)
            self._ident = ident

    def __exit__(self, *_exc: object) -> None:
        if self._ident:
            self._reput.inline_threads.discard(self._ident)
        self._reput.dispatch_inline()
