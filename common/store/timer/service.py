"""The timer of one store (RocketMQ 5's ``TimerMessageStore``): enqueue, dequeue, checkpoint.

* **Enqueue** (every broker, master or slave: ``replog-timer-enqueue``): reads the timer
  topic's ConsumeQueue from where it stands (so only what reput dispatched, i.e. confirmed
  records), reads each record's properties and appends its unit to the TimerLog, linked into
  its tick's slot. A tick already delivered (or being delivered) takes the unit on the next
  one. A delivery time past the roll window puts the unit on the window's last tick, marked
  *roll*. A recall marker (``TIMER_DEL_UNIQKEY``) is a *delete* unit in the tick it names.
* **Dequeue** (a master only, a master service: ``replog-timer-dequeue``): from the start of
  a tick, reads its units as they are enqueued and delivers each once its own time
  (``TIMER_DELIVER_MS``, kept exact in the unit's delay) has passed, so lateness is the
  dequeue's work, not the precision; drops the ones a delete names, re-puts the roll ones to
  the timer topic (``TIMER_ROLL_TIMES`` + 1), and delivers the others to their real topic and
  queue with ``TIMER_ENQUEUE_MS``, ``TIMER_DEQUEUE_MS`` and ``__TIMER_SRC`` (the timer record's
  offset, indexed on every broker). Once the tick has wholly passed it takes the rest under the
  lock (later enqueues go to the next tick), delivers it, and moves on. A put that fails is
  tried again (the tick is not left); a fenced master (``store.delivery_gate``) delivers
  nothing.
* **Exactly once**: a master delivers its ticks in order, so what one log holds delivered is a
  prefix of the ticks. A dequeue that starts (a start after a crash, a promotion, an election)
  does not know where the last master stopped: until it meets a tick with units none of which
  its own log holds a delivery of, it looks each one up (the index, and the records past the
  confirmed offset that reput has not indexed yet) and skips what was delivered. A delivery
  lost with its master (never replicated) is delivered again by the next one.
* **Checkpoint** (every broker, ``replog-timer-flush``, every ``timerFlushIntervalMs``), in
  RocketMQ's order: prepare (under the lock: the TimerLog's end, the queue offset enqueued, the
  next tick, the dirty wheel slots), flush the TimerLog, write the wheel's slots, write
  ``timercheck``. A crash anywhere leaves ``timercheck`` claiming no more than the files hold;
  recovery cuts the TimerLog there, mends the slots that name a unit past it (walking back by
  ``prevPos``) and enqueues again from the checkpoint's queue offset.
"""

from __future__ import annotations

import collections
import heapq
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from common.core.config import TIMER_WHEEL_TICKS, BrokerConfig
from common.core.errors import PutStatus
from common.core.message import (
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_KEY,
    Message,
    MessageExt,
    decode_properties,
    java_hash,
)
from common.core.timer import (
    REQUESTED,
    TIMER_DEL_UNIQKEY,
    TIMER_DELIVER_MS,
    TIMER_DEQUEUE_MS,
    TIMER_ENQUEUE_MS,
    TIMER_OUT_MS,
    TIMER_ROLL_TIMES,
    TIMER_SOURCE,
    TIMER_TICK,
    TIMER_TOPIC,
)
from common.format import boundary, record
from common.store.timer.checkpoint import TimerCheckpoint
from common.store.timer.layout import (
    MAGIC_DEFAULT,
    MAGIC_DELETE,
    MAGIC_ROLL,
    MAX_SAVED_MARKS,
    NO_POS,
    UNIT,
    UNIT_SIZE,
)
from common.store.timer.marks import ReadMarks
from common.store.timer.messages import TimerHook
from common.store.timer.timer_log import TimerLog, Unit
from common.store.timer.wheel import TimerWheel

if TYPE_CHECKING:
    from common.store.extensions import StoreExtensions
    from common.store.index import IndexDispatcher
    from common.store.message_store import MessageStore

log = logging.getLogger("replog.timer")

ENQUEUE_BATCH = 1024  # queue entries read per pass
IDLE_WAIT_S = 0.1
PENDING_EVERY_S = 1.0  # how often the flush thread counts what is pending (status figures)
ACTIVE_WAIT_S = 0.005  # a tick under way: new units and due times are looked at this often
RETRY_WAIT_S = 0.2  # a tick whose deliveries failed is tried again after this
# refusals of a delivery or roll that no retry undoes: the record itself is one the store
# does not take (the marks a delivery adds put a producer's properties at their limit past it)
UNDELIVERABLE = frozenset((PutStatus.PROPERTIES_SIZE_EXCEEDED, PutStatus.MESSAGE_ILLEGAL))
MAX_WALK = 10_000_000  # units followed in one tick's chain before it is declared broken
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


class TimerStore:
    def __init__(self, store: MessageStore, cfg: BrokerConfig,
                 clock: Callable[[], float] = time.time):
        self.store = store
        self._clock = clock
        self.enabled = cfg.timerWheelEnable
        self.precision_ms = cfg.timerPrecisionMs
        self.roll_window_ms = cfg.timerRollWindowSlot * cfg.timerPrecisionMs
        self.flush_interval_s = cfg.timerFlushIntervalMs / 1000.0
        self.congest_num = cfg.timerCongestNumEachSlot
        self.stop_enqueue = cfg.timerStopEnqueue
        self.stop_dequeue = cfg.timerStopDequeue
        root = store.root
        self.wheel_path = root / "timerwheel"
        self.log_dir = root / "timerlog"
        self.checkpoint_path = root / "config" / "timercheck"
        self._file_size = cfg.mappedFileSizeTimerLog
        self.wheel: TimerWheel | None = None
        self.log: TimerLog | None = None
        self.checkpoint = TimerCheckpoint(self.checkpoint_path)
        self.lock = threading.Lock()  # the wheel, the log's appends, the two positions
        self.enqueued_offset = 0  # the timer topic's next queue offset to put on the wheel
        self.read_time_ms = 0  # the next tick to deliver
        # the newest tick this store's log holds a delivery (or a roll) of: a master delivers
        # its ticks in order, so every tick before it is done (reput's dispatcher tells it)
        self.delivered_tick = 0
        self.dequeuing = False  # a master's dequeue runs (a slave's read time follows its log)
        # the tick whose units the dequeue took (under the lock): an enqueue must not add to it
        self.delivering_tick = -1
        self._marks = ReadMarks()  # what a cut of the CommitLog takes the read time back to
        self._saved_marks: collections.deque[tuple[int, int]] = collections.deque(
            maxlen=MAX_SAVED_MARKS)  # the newest mark of each checkpoint
        self._cuts = 0  # truncations so far: an enqueue pass that saw one drops what it read
        retention_ms = cfg.fileReservedTime * 3_600_000
        if self.enabled and self.roll_window_ms >= retention_ms:
            # a message waits at most a roll window before it is re-put (a new record): a
            # window longer than the CommitLog's retention could see its record deleted first
            log.warning("event=timer_roll_window_past_retention roll_window_ms=%d "
                        "file_reserved_ms=%d: timer messages due later than fileReservedTime "
                        "may lose their record before they are delivered; keep "
                        "timerRollWindowSlot x timerPrecisionMs below fileReservedTime",
                        self.roll_window_ms, retention_ms)
        self.hook = TimerHook(self.enabled, self.precision_ms, cfg.timerMaxDelaySec,
                              self._congested, clock)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._dequeue: TimerDequeue | None = None
        self.stats: collections.Counter[str] = collections.Counter()
        self.lateness_ms: collections.deque[int] = collections.deque(maxlen=10_000)
        self.recover_ms = 0  # the last start's recovery (wheel, log cut, slots mended)
        # (pending, pending within 1m/1h/1d, when counted): counted every PENDING_EVERY_S
        self._pending: tuple[int, dict[str, int], int] = (0, {"1m": 0, "1h": 0, "1d": 0}, 0)
        self._pending_at = 0.0
        self._pending_puts = -1  # the wheel's ``puts`` when last counted (-1: never)

    def set_clock(self, clock: Callable[[], float]) -> None:
        """Tests: the time the hook, the enqueue and the dequeue go by (before ``start``)."""
        self._clock = clock
        self.hook._clock = clock

    # ---- registration (before the store starts) ------------------------------------------------
    def install(self, ext: StoreExtensions, index: IndexDispatcher | None) -> None:
        ext.add_put_hook(self.hook)
        ext.watch(TIMER_SOURCE)  # the dequeue reads it in the records not dispatched yet
        ext.add_dispatcher(self)
        ext.add_cut_listener(self)
        if index is not None:
            index.index_property(TIMER_SOURCE)
        ext.add_service("timer", self)
        ext.add_master_service("timer-dequeue", self.new_dequeue)

    # ---- a record dispatcher: deliveries seen in the log --------------------------------------------
    name = "timer"
    watches: tuple[str, ...] = (TIMER_TICK,)

    def dispatch(self, req: Any) -> None:
        tick = req.properties.get(TIMER_TICK)
        if tick is not None and tick.isdigit() and int(tick) > self.delivered_tick:
            trusted = self.trusted_tick(req.topic, req.phy_offset, req.properties)
            if trusted is None:
                return
            self.delivered_tick = trusted
            self._marks.note(req.phy_offset + req.size, self.delivered_tick)

    def trusted_tick(self, topic: str, phy_offset: int, props: Mapping[str, str]) -> int | None:
        """The tick a record of the timer's own was written for, or None for a record carrying
        the marks that the timer did not write (a forged tick would move the read time past
        every message due before it): a roll is of the timer topic; a delivery, ``_held_for``."""
        tick = props.get(TIMER_TICK, "")
        if not (tick.isascii() and tick.isdigit()):
            return None
        if topic == TIMER_TOPIC or self._held_for(topic, phy_offset,
                                                  props.get(TIMER_SOURCE, ""), int(tick)):
            return int(tick)
        self.stats["untrusted_marks"] += 1
        if self.stats["untrusted_marks"] == 1:  # once: an old log may hold many
            log.warning("event=timer_mark_ignored offset=%d topic=%s: a timer tick on a "
                        "record the timer did not write", phy_offset, topic)
        return None

    def _held_for(self, topic: str, phy_offset: int, source: str, tick: int) -> bool:
        """Whether ``source`` names a timer record before ``phy_offset``, held for ``topic``
        and due no earlier than ``tick``."""
        if not (source.isascii() and source.isdigit()) or int(source) >= phy_offset:
            return False
        held = self.store.entry_message(int(source))
        if held is None or held.topic != TIMER_TOPIC \
                or held.properties.get(PROPERTY_REAL_TOPIC) != topic:
            return False
        due = [int(d) for d in (held.properties.get(name, "") for name in
                                (TIMER_DELIVER_MS, TIMER_OUT_MS)) if d.isascii() and d.isdigit()]
        return bool(due) and tick <= max(due)

    # ---- the store's service: recovery, enqueue, checkpoint ---------------------------------------
    def start(self) -> None:
        if not self.enabled:
            return
        self._recover()
        self.store.add_arrival_listener(self._on_arrival, TIMER_TOPIC)  # its records only
        self._stop.clear()
        for target, name in ((self._enqueue_loop, "replog-timer-enqueue"),
                             (self._flush_loop, "replog-timer-flush")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def shutdown(self) -> None:
        if not self.enabled or self.wheel is None:
            return
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(10)
        self._threads.clear()
        self.flush()
        assert self.log is not None
        self.log.shutdown()
        self.wheel.close()

    def _recover(self) -> None:
        started = time.monotonic()
        cp = TimerCheckpoint.load(self.checkpoint_path)
        self.checkpoint = cp
        self.wheel = TimerWheel(self.wheel_path, TIMER_WHEEL_TICKS, self.precision_ms)
        self.log = TimerLog(self.log_dir, self._file_size)
        self.log.load()
        past_checkpoint = self.log.end > cp.last_timer_log_flush_pos
        self.log.recover(cp.last_timer_log_flush_pos)
        # a slot can name a unit past the cut only if the log held units past it (the wheel's
        # file names only units that were flushed): otherwise no scan of 1.2M slots at start
        mended = self._mend_slots(cp.last_timer_log_flush_pos) if past_checkpoint else 0
        self.enqueued_offset = cp.last_timer_queue_offset
        now_tick = self._tick(self.now_ms())
        self.read_time_ms = cp.last_read_time_ms or now_tick
        # a new timer, or a checkpoint of before the marks: its read time holds from the start
        self._marks = ReadMarks(cp.marks or [(0, self.read_time_ms)])
        self._saved_marks.clear()
        self._saved_marks.extend(cp.marks)
        with self.lock:  # a crash that lost the CommitLog's tail took units' records with it
            self._forget_past(self.store.commit_log.max_offset, "log_shorter")
        self.recover_ms = round((time.monotonic() - started) * 1000)
        log.info("event=timer_recovered log_end=%d queue_offset=%d read_time_ms=%d "
                 "slots_mended=%d took_ms=%d", self.log.end, self.enqueued_offset,
                 self.read_time_ms, mended, self.recover_ms)

    def _mend_slots(self, end: int, ticks: set[int] | None = None) -> int:
        """Slots written after the TimerLog was cut (a crash between the wheel's write and
        the checkpoint's, a truncation of the CommitLog) may name units past ``end``: those of
        ``ticks``, or of any tick (a scan of every slot). A tick's units sit at increasing
        positions, so what it keeps is the newest of its units below ``end`` and the chain
        back from there: one scan back from ``end`` finds each such tick's newest unit."""
        assert self.wheel is not None and self.log is not None
        wheel = self.wheel
        if ticks is None:
            broken = [slot for slot in wheel.slots_from(0) if slot.last_pos >= end]
        else:
            broken = [slot for slot in map(wheel.slot, sorted(ticks)) if slot.last_pos >= end]
        if not broken:
            return 0
        wanted = {slot.time_ms: slot for slot in broken if slot.first_pos < end}
        for slot in broken:
            if slot.time_ms not in wanted:
                wheel.clear(slot.time_ms)  # every unit of the tick was past the cut
        newest: dict[int, int] = {}
        lowest = min((slot.first_pos for slot in wanted.values()), default=end)
        if wanted:
            for pos, unit in self.log.units_back(end):
                if pos < lowest:
                    break
                if unit.write_time_ms in wanted and unit.write_time_ms not in newest:
                    newest[unit.write_time_ms] = pos
                    if len(newest) == len(wanted):
                        break
        for tick, slot in wanted.items():
            last = newest.get(tick)
            if last is None:
                wheel.clear(tick)
                continue
            count, pos = 0, last
            while pos != NO_POS and count < MAX_WALK:
                linked = self.log.read(pos)
                if linked is None:
                    break
                count += 1
                if pos == slot.first_pos:
                    break
                pos = linked.prev_pos
            wheel.put(tick, slot.first_pos, last, count)
        return len(broken)

    # ---- truncation: the CommitLog cut back ---------------------------------------------------
    def on_truncate(self, phy_offset: int) -> None:
        """The CommitLog now ends at ``phy_offset`` (a member rejoining its group drops what
        only it held; the store calls this under reput's lock). What the timer took from the
        records past it goes: their units leave the TimerLog and the wheel, the enqueue goes
        back to the timer queue's new end (the new master's records take those queue
        offsets), and the read time goes back to what the log still holds the deliveries of
        (``marks.py``): a read time left ahead would skip, once this member is master again,
        ticks whose deliveries were cut."""
        if not self.enabled or self.wheel is None:
            return
        with self.lock:
            self._cuts += 1  # an enqueue pass under way drops what it read before the cut
            cq = self.store.cq_store.get(TIMER_TOPIC, 0)
            self._forget_past(phy_offset, "truncated", cq.max_queue_offset if cq else 0)
        self.flush()

    def on_reset(self, phy_offset: int) -> None:
        """The store was emptied to start at ``phy_offset`` (a slave far behind): every unit
        named a record that is gone; the read time stands (nothing below it is held now)."""
        if not self.enabled or self.wheel is None:
            return
        with self.lock:
            self._cuts += 1
            assert self.log is not None
            self._save_cut(0, 0)
            self.stats["units_cut"] += self.log.end // UNIT_SIZE
            self.log.recover(0)
            for slot in self.wheel.slots_from(0):
                self.wheel.clear(slot.time_ms)
            self.enqueued_offset = 0
            log.warning("event=timer_reset offset=%d", phy_offset)
        self.flush()

    def _save_cut(self, log_end: int, queue_offset: int, read_time: int | None = None) -> None:
        """Before the TimerLog is cut: a checkpoint that claims no more than will be left, so
        that a crash during the cut recovers from a checkpoint the files bear out."""
        cp = self.checkpoint
        cp.last_timer_log_flush_pos = min(cp.last_timer_log_flush_pos, log_end)
        cp.last_timer_queue_offset = min(cp.last_timer_queue_offset, queue_offset)
        if read_time is not None:
            cp.last_read_time_ms = min(cp.last_read_time_ms, read_time)
        cp.marks = list(self._saved_marks)
        cp.flush()

    def _forget_past(self, phy_end: int, why: str, queue_end: int | None = None) -> None:
        """Under the lock: drop the units of records at or past ``phy_end``, go back in the
        timer queue and in read time to what the CommitLog below ``phy_end`` holds.
        ``queue_end``: the timer queue's end once cut there (a truncation: exact), or None (a
        start: the queue may not be dispatched that far yet)."""
        assert self.wheel is not None and self.log is not None
        cut, ticks, kept_unit = self.log.end, set(), None
        for pos, unit in self.log.units_back(self.log.end):
            if unit.offset_py < phy_end:  # units are appended in CommitLog order
                kept_unit = unit
                break
            cut = pos
            ticks.add(unit.write_time_ms)
        queue_offset = self.enqueued_offset
        if queue_end is not None:
            queue_offset = min(queue_offset, queue_end)
        if cut < self.log.end:  # the queue entry after the newest unit kept is read again
            held = self.store.entry_message(kept_unit.offset_py) if kept_unit else None
            if held is not None:
                queue_offset = min(queue_offset, held.queue_offset + 1)
            elif kept_unit is None:
                queue_offset = 0
            else:
                log.warning("event=timer_cut_unplaced offset=%d: the record of the newest unit "
                            "kept is unreadable; the enqueue stays at queue offset %d",
                            kept_unit.offset_py, queue_offset)
        saved = [m for m in self._saved_marks if m[0] <= phy_end]
        if len(saved) < len(self._saved_marks):
            self._saved_marks.clear()
            self._saved_marks.extend(saved)
        kept, forgotten = self._marks.cut(phy_end)
        if kept is None:
            # no mark is that old: the oldest read time forgotten is the best left (too late,
            # perhaps: a dequeue here may skip what the cut took)
            kept = forgotten if forgotten is not None else self.read_time_ms
            log.warning("event=timer_read_time_unknown offset=%d read_time_ms=%d: no read "
                        "mark below the cut", phy_end, kept)
        read_time = min(self.read_time_ms, kept)
        self.delivered_tick = min(self.delivered_tick, kept)
        if cut == self.log.end and queue_offset == self.enqueued_offset \
                and read_time == self.read_time_ms:
            return  # nothing past the cut
        self._save_cut(cut, queue_offset, read_time)
        log_end = self.log.end
        self.log.recover(cut)
        mended = self._mend_slots(cut, ticks)
        log.warning("event=timer_%s offset=%d timerlog_end=%d->%d ticks_mended=%d "
                    "queue_offset=%d->%d read_time_ms=%d->%d", why, phy_end, log_end, cut,
                    mended, self.enqueued_offset, queue_offset, self.read_time_ms, read_time)
        self.stats["units_cut"] += (log_end - cut) // UNIT_SIZE
        self.enqueued_offset = queue_offset
        self.read_time_ms = read_time

    def _on_arrival(self, _topic: str, _queue_id: int, _max_offset: int) -> None:
        self._wake.set()  # registered for TIMER_TOPIC's records only (start)

    def _enqueue_loop(self) -> None:
        while not self._stop.is_set():
            moved = 0
            if not self.stop_enqueue:
                try:
                    moved = self.enqueue_available()
                except Exception:
                    log.exception("event=timer_enqueue_failed offset=%d", self.enqueued_offset)
                    self._stop.wait(RETRY_WAIT_S)
            if not moved:
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()

    def enqueue_available(self) -> int:
        """Put every dispatched timer message past the enqueued offset on the wheel."""
        store = self.store
        cq = store.cq_store.get(TIMER_TOPIC, 0)
        if cq is None:
            return 0
        if not self.dequeuing and self.delivered_tick > self.read_time_ms:
            with self.lock:  # a slave: its master delivered up to there (its log says)
                self.read_time_ms = max(self.read_time_ms, self.delivered_tick)
        cuts = self._cuts
        start = max(self.enqueued_offset, cq.min_queue_offset)
        entries = cq.entries(start, ENQUEUE_BATCH)
        done = 0
        for q_off, phy, size, _code in entries:
            raw = store.entry_record(phy)
            props = _properties(raw) if raw is not None else None
            with self.lock:
                if self._cuts != cuts:
                    return done  # the log was cut under this pass: read again
                if props is not None:
                    self._enqueue(phy, size, props)
                else:
                    self.stats["unreadable"] += 1  # gone (retention) or damaged: skipped
                self.enqueued_offset = q_off + 1
            done += 1
        if start > self.enqueued_offset:
            with self.lock:
                if self._cuts == cuts:
                    self.enqueued_offset = max(self.enqueued_offset, start)
        return done

    def _enqueue(self, phy: int, size: int, props: dict[str, str]) -> None:
        """Under the lock: one unit on the wheel."""
        assert self.wheel is not None and self.log is not None
        try:
            out = int(props[TIMER_OUT_MS])
            deliver = int(props.get(TIMER_DELIVER_MS) or out)  # RocketMQ's records: the tick
        except (KeyError, ValueError):
            self.stats["illegal"] += 1
            log.warning("event=timer_message_illegal offset=%d reason=no TIMER_OUT_MS", phy)
            return
        magic = MAGIC_DEFAULT
        if TIMER_DEL_UNIQKEY in props:
            magic |= MAGIC_DELETE
        floor = self.read_time_ms
        if self.delivering_tick == floor:  # its units are being delivered: the next tick
            floor += self.precision_ms
        tick = max(self._tick_for(out), floor)
        horizon = self.read_time_ms + self.roll_window_ms
        if tick >= horizon:  # past the roll window: it waits on the window's last tick
            tick = horizon - self.precision_ms
            magic |= MAGIC_ROLL
        slot = self.wheel.slot(tick)
        prev = slot.last_pos
        delay = max(INT32_MIN, min(INT32_MAX, deliver - tick))  # lateness figures only
        unit = UNIT.pack(UNIT_SIZE, prev, magic, tick, delay, phy, size,
                         java_hash(props.get(PROPERTY_REAL_TOPIC, "")), 0)
        pos = self.log.append(unit)
        first = slot.first_pos if slot.num else pos
        self.wheel.put(tick, first, pos, slot.num + 1)
        self.stats["enqueued"] += 1
        if magic & MAGIC_ROLL:
            self.stats["rolled_in"] += 1
        elif deliver < tick:
            self.stats["enqueued_late"] += 1  # its own tick was read already

    def _tick_for(self, deliver_ms: int) -> int:
        """The tick of a TIMER_OUT_MS (a tick already, or a time a roll left as it was)."""
        return deliver_ms // self.precision_ms * self.precision_ms

    # ---- the checkpoint ----------------------------------------------------------------------------
    def _flush_loop(self) -> None:
        self._count_pending()
        while not self._stop.wait(self.flush_interval_s):
            try:
                self.flush()
            except Exception:
                log.exception("event=timer_flush_failed")
            if time.monotonic() - self._pending_at >= PENDING_EVERY_S:
                self._count_pending()

    def _count_pending(self) -> None:
        """What is pending, in all and within each window: a pass over up to two days of slots
        (~40 ms at 1 s precision), made here in chunks that let the GIL go, never on the
        thread that answers STATUS (its request loop would stall for it)."""
        wheel = self.wheel
        if wheel is None:
            return
        if self._pending[0] == 0 and wheel.puts == self._pending_puts:
            # nothing was pending and nothing was put since: still nothing (the scan costs
            # ~0.1 s of a core a second, and most brokers hold no timer message at all)
            self._pending = (0, self._pending[1], self.now_ms())
            self._pending_at = time.monotonic()
            return
        puts = wheel.puts
        now = self.now_ms()
        read_time = self.read_time_ms
        horizon = read_time + self.roll_window_ms + self.precision_ms  # nothing waits past it
        within = {name: wheel.count(read_time, max(read_time, now + span))
                  for name, span in (("1m", 60_000), ("1h", 3_600_000), ("1d", 86_400_000))}
        self._pending = (wheel.count(read_time, horizon), within, now)
        self._pending_at = time.monotonic()
        self._pending_puts = puts

    def flush(self) -> None:
        """Prepare, flush the TimerLog, write the wheel, write the checkpoint: in that order."""
        assert self.wheel is not None and self.log is not None
        with self.lock:
            log_end = self.log.end
            queue_offset = self.enqueued_offset
            read_time = self.read_time_ms if self.dequeuing else \
                max(self.read_time_ms, self.delivered_tick)
            slots = self.wheel.dirty()
            saved = self._saved_marks  # the marks noted since the last checkpoint join it
            for mark in self._marks.since(saved[-1] if saved else None):
                saved.append(mark)
            marks = list(saved)
        self.log.flush()
        self.wheel.write(slots)
        cp = self.checkpoint
        cp.last_timer_log_flush_pos = log_end
        cp.last_timer_queue_offset = queue_offset
        cp.last_read_time_ms = read_time
        cp.marks = marks
        cp.flush()

    # ---- the dequeue (a master service) ------------------------------------------------------------
    def new_dequeue(self) -> TimerDequeue:
        self._dequeue = TimerDequeue(self)
        return self._dequeue

    def units_after(self, tick: int, after: int) -> list[tuple[int, Unit]]:
        """Under the lock: the tick's units at positions past ``after`` (NO_POS: all), oldest
        first, as (position, unit). A tick's units sit at increasing positions, linked
        backwards from its slot's last one, so only the new ones are read."""
        assert self.wheel is not None and self.log is not None
        slot = self.wheel.slot(tick)
        out: list[tuple[int, Unit]] = []
        pos = slot.last_pos
        while pos != NO_POS and pos > after and slot.num and len(out) < MAX_WALK:
            unit = self.log.read(pos)
            if unit is None or unit.write_time_ms != tick:
                log.error("event=timer_chain_broken tick=%d pos=%d", tick, pos)
                break
            out.append((pos, unit))
            if pos == slot.first_pos:
                break
            pos = unit.prev_pos
        out.reverse()
        return out

    def advance(self, tick: int) -> None:
        """The tick is done: the next one is read (under the lock, so no enqueue lands in a
        tick being delivered)."""
        with self.lock:
            if self.read_time_ms == tick:
                self.read_time_ms = tick + self.precision_ms
                self._marks.note(self.store.commit_log.max_offset, self.read_time_ms)

    def _congested(self, tick: int) -> bool:
        wheel = self.wheel
        return wheel is not None and wheel.slot(tick).num >= self.congest_num

    def _tick(self, time_ms: int) -> int:
        return time_ms // self.precision_ms * self.precision_ms

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    # ---- status ----------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Figures for ``replog timer status``, STATUS and the metrics: what is pending (all,
        and due within a minute, an hour, a day), where delivery stands, lateness (ms after
        the delivery time, of the last 10,000 deliveries), and the counters."""
        if not self.enabled or self.wheel is None:
            return {"enabled": self.enabled}
        now = self.now_ms()
        with self.lock:
            read_time = self.read_time_ms
            enqueued = self.enqueued_offset
        pending, within, counted_at = self._pending
        cq = self.store.cq_store.get(TIMER_TOPIC, 0)
        late = sorted(self.lateness_ms)
        return {
            "enabled": True, "precisionMs": self.precision_ms, "readTimeMs": read_time,
            "delivering": self.dequeuing,
            "behindMs": max(0, now - read_time - self.precision_ms),
            "enqueuedOffset": enqueued,
            "enqueueLag": max(0, (cq.max_queue_offset if cq else 0) - enqueued),
            "pending": pending, "pendingWithin": within, "pendingCountedAtMs": counted_at,
            "latenessP50Ms": late[len(late) // 2] if late else 0,
            "latenessP99Ms": late[int(len(late) * 0.99)] if late else 0,
            "latenessMaxMs": late[-1] if late else 0,
            "refused": self.hook.refused, "recoverMs": self.recover_ms,
            **{k: v for k, v in sorted(self.stats.items())},
        }


class TimerDequeue:
    """The delivering thread of a master (made anew at each start: a master service)."""

    def __init__(self, timer: TimerStore):
        self._timer = timer
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.checking = True  # where the last master stopped is not known yet (exactly once)
        self._pending: set[int] = set()
        self._current: _Tick | None = None

    def start(self) -> None:
        timer = self._timer
        if not timer.enabled or timer.stop_dequeue:
            return
        store = timer.store
        ticks = [(req.properties, timer.trusted_tick(req.topic, req.phy_offset, req.properties))
                 for req in store.undispatched_records() if TIMER_SOURCE in req.properties]
        self._pending = {int(props[TIMER_SOURCE]) for props, tick in ticks if tick is not None}
        newest = max((tick for _props, tick in ticks if tick is not None), default=0)
        with timer.lock:
            timer.read_time_ms = max(timer.read_time_ms, timer.delivered_tick, newest)
            timer.dequeuing = True
        log.info("event=timer_dequeue_started read_time_ms=%d", timer.read_time_ms)
        self._thread = threading.Thread(target=self._run, name="replog-timer-dequeue",
                                        daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(10)
        self._timer.dequeuing = False

    def _run(self) -> None:
        timer = self._timer
        while not self._stop.is_set():
            try:
                wait_s = self.deliver_due(timer.now_ms())
            except Exception:
                log.exception("event=timer_dequeue_failed tick=%d", timer.read_time_ms)
                wait_s = RETRY_WAIT_S
            if wait_s > 0:
                self._stop.wait(wait_s)

    def deliver_due(self, now_ms: int) -> float:
        """Deliver what is due at ``now_ms``: each unit of the current tick once its own time
        has passed, then the tick is left once it has wholly passed and all its units are
        done, and the next one is taken up. Returns how long to wait before the next pass (0:
        at once, more is due)."""
        timer = self._timer
        precision = timer.precision_ms
        while not self._stop.is_set():
            tick = timer.read_time_ms
            if now_ms < tick:
                return min(IDLE_WAIT_S, (tick - now_ms) / 1000)
            gate = timer.store.delivery_gate
            if gate is not None and gate():
                timer.stats["gated"] += 1
                return IDLE_WAIT_S
            current = self._current
            if current is None or current.tick != tick:
                current = self._current = _Tick(tick)
            passed = now_ms >= tick + precision
            with timer.lock:  # the units enqueued since the last pass (all of them, once passed)
                fresh = timer.units_after(tick, current.seen_last)
                if passed:
                    timer.delivering_tick = tick  # later enqueues go to the next tick
            if fresh:
                current.seen_last = fresh[-1][0]
                self._take(current, fresh)
            if not self._deliver_ready(current, now_ms):
                return RETRY_WAIT_S  # a put failed: tried again, the tick is not left
            if not passed or current.heap:
                next_due = current.heap[0][0] if current.heap else tick + precision
                return max(0.001, min(ACTIVE_WAIT_S, (next_due - now_ms) / 1000))
            if self.checking and current.normal and not current.found_delivered:
                self.checking = False  # past where the last master stopped: no more look-ups
            timer.advance(tick)
            self._current = None
        return 0.0

    def _take(self, current: _Tick, fresh: list[tuple[int, Unit]]) -> None:
        """Sort new units: markers name what not to deliver, the others wait for their time
        (a roll for its tick: it is re-put then)."""
        timer = self._timer
        store = timer.store
        for pos, unit in fresh:
            held = store.entry_message(unit.offset_py)
            if held is None or PROPERTY_REAL_TOPIC not in held.properties:
                timer.stats["unreadable"] += 1
                log.error("event=timer_skip offset=%d reason=unreadable_or_not_a_timer_record",
                          unit.offset_py)
                continue
            why = boundary.delivery_refusal(held.properties[PROPERTY_REAL_TOPIC],
                                            held.properties.get(PROPERTY_REAL_QID, "0"))
            if why is not None:  # not a record this broker held: skipped, never retried
                timer.stats["refused_targets"] += 1
                log.error("event=timer_skip offset=%d reason=refused_target (%s)",
                          unit.offset_py, why)
                continue
            target = held.properties.get(TIMER_DEL_UNIQKEY)
            if unit.magic & MAGIC_DELETE and not unit.magic & MAGIC_ROLL:
                # a marker deletes in its own topic only (a send to A recalls nothing of B)
                if target is not None and \
                        target.startswith(held.properties[PROPERTY_REAL_TOPIC] + "+"):
                    current.deleted.add(target)
                continue
            current.normal = True  # a rolled marker rolls on to meet its message
            due = unit.write_time_ms if unit.magic & MAGIC_ROLL else unit.deliver_ms
            heapq.heappush(current.heap, (due, pos, unit, held))

    def _deliver_ready(self, current: _Tick, now_ms: int) -> bool:
        """Deliver the units whose time has come; False when a put failed (it stays)."""
        timer = self._timer
        heap = current.heap
        while heap and heap[0][0] <= now_ms and not self._stop.is_set():
            _due, _pos, unit, held = heap[0]
            real = held.properties[PROPERTY_REAL_TOPIC]
            uniq = held.properties.get(PROPERTY_UNIQ_KEY, "")
            roll = bool(unit.magic & MAGIC_ROLL)
            if uniq and f"{real}+{uniq}" in current.deleted \
                    and TIMER_DEL_UNIQKEY not in held.properties:
                timer.stats["recalled"] += 1
            # a unit enqueued after its own tick was read (a lagging enqueue, a slave's) may
            # have been delivered by another master already: always looked up
            elif (self.checking or unit.delay < 0) and (
                    unit.offset_py in self._pending or self._was_done(held, roll)):
                current.found_delivered = True
                timer.stats["skipped_delivered"] += 1
            elif not self._put(held, unit, roll, now_ms, current.tick):
                return False
            heapq.heappop(heap)
        return True

    def _was_done(self, held: MessageExt, roll: bool) -> bool:
        """This store's log holds the delivery (or the roll) of ``held`` already."""
        store = self._timer.store
        index = store.index
        if index is None:
            return False
        topic = TIMER_TOPIC if roll else held.properties[PROPERTY_REAL_TOPIC]
        key = TIMER_SOURCE + str(held.commit_log_offset)

        def delivers(found: int) -> bool:
            msg = store.entry_message(found)
            return msg is not None and msg.properties.get(TIMER_SOURCE) == \
                str(held.commit_log_offset) and \
                self._timer.trusted_tick(msg.topic, found, msg.properties) is not None

        # every hit read: a client's keys may share the key's hash, as many as it likes
        return index.find(topic, key, delivers) is not None

    def _put(self, held: MessageExt, unit: Unit, roll: bool, now_ms: int, tick: int) -> bool:
        timer = self._timer
        store = timer.store
        msg, queue_id = _rolled(held, tick) if roll else _delivered(held, unit, now_ms)
        ip, _, port = held.born_host.rpartition(":")
        result = store.put(msg, queue_id, (ip, int(port or 0)), held.born_timestamp)
        if result.status is PutStatus.PUT_OK or result.status.stored:
            if roll:
                timer.stats["rolled"] += 1
            else:
                timer.stats["delivered"] += 1
                timer.lateness_ms.append(max(0, now_ms - unit.deliver_ms))
            return True
        if result.status in UNDELIVERABLE:  # no retry can succeed: skipped, as a bad target
            timer.stats["refused_targets"] += 1
            log.error("event=timer_skip offset=%d reason=refused_put status=%s (%s)",
                      unit.offset_py, result.status.name, result.remark)
            return True
        timer.stats["put_failures"] += 1
        log.warning("event=timer_put_failed offset=%d status=%s tick=%d", unit.offset_py,
                    result.status.name, tick)
        return False


def _properties(raw: bytes) -> dict[str, str] | None:
    try:
        return decode_properties(bytes(record.parse(raw).props))
    except (ValueError, IndexError):
        return None


def _delivered(held: MessageExt, unit: Unit, now_ms: int) -> tuple[Message, int]:
    """The timer record as its real topic gets it."""
    props = {k: v for k, v in held.properties.items()
             if k not in REQUESTED and k not in (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID, "TAGS",
                                                  "KEYS", TIMER_ROLL_TIMES)}
    props[TIMER_ENQUEUE_MS] = str(unit.write_time_ms)
    props[TIMER_DEQUEUE_MS] = str(now_ms)
    props[TIMER_SOURCE] = str(held.commit_log_offset)
    props[TIMER_TICK] = str(unit.write_time_ms)
    topic = held.properties[PROPERTY_REAL_TOPIC]
    queue_id = int(held.properties.get(PROPERTY_REAL_QID, "0"))
    return Message(topic, held.body, tags=held.tags, keys=held.keys or None, properties=props,
                   flag=held.flag, reconsume_times=held.reconsume_times,
                   sys_flag=held.sys_flag), queue_id


def _rolled(held: MessageExt, tick: int) -> tuple[Message, int]:
    """The timer record put back on the timer topic, a roll more (its TIMER_OUT_MS kept)."""
    props = {k: v for k, v in held.properties.items() if k not in ("TAGS", "KEYS")}
    props[TIMER_ROLL_TIMES] = str(int(props.get(TIMER_ROLL_TIMES, "0")) + 1)
    props[TIMER_SOURCE] = str(held.commit_log_offset)
    props[TIMER_TICK] = str(tick)
    return Message(TIMER_TOPIC, held.body, tags=held.tags, keys=held.keys or None,
                   properties=props, flag=held.flag, reconsume_times=held.reconsume_times,
                   sys_flag=held.sys_flag), 0


class _Tick:
    """The tick a master is delivering: what it has read of it, and what waits for its time."""

    __slots__ = ("deleted", "found_delivered", "heap", "normal", "seen_last", "tick")

    def __init__(self, tick: int):
        self.tick = tick
        self.seen_last = NO_POS  # the newest unit position read
        self.heap: list[tuple[int, int, Unit, MessageExt]] = []  # (due, position, ...)
        self.deleted: set[str] = set()  # "<topic>+<key>" its markers name
        self.normal = False  # it held a unit to deliver or roll
        self.found_delivered = False  # one of them was delivered already (checking)
