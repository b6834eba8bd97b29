"""The TimerWheel (``<store>/timerwheel``, ``layout.py``): one slot per tick over twice the
wheel's span, each naming the TimerLog units of its tick.

Kept in memory (a bytearray of the file's size: what bounds the timer's memory, whatever the
number of pending messages) and written to its file only by ``write`` at a checkpoint, after
the TimerLog is flushed: the file never names a unit the log may have lost in a crash. ``put``
marks its slot dirty; ``dirty`` takes the dirty slots' bytes at one moment (the checkpoint's
prepare, under the timer's lock), ``write`` writes those and syncs the file.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import NamedTuple

from common.core.errors import StoreError
from common.store.timer.layout import NO_POS, SLOT, SLOT_SIZE

COUNT_CHUNK = 4096  # slots read between two releases of the GIL (about a millisecond)


class Slot(NamedTuple):
    time_ms: int  # the tick (a multiple of the precision); -1: the slot holds another tick
    first_pos: int
    last_pos: int
    num: int
    magic: int = 0


EMPTY = Slot(-1, NO_POS, NO_POS, 0)


class TimerWheel:
    def __init__(self, path: Path, slots: int, precision_ms: int):
        if slots <= 0 or precision_ms <= 0:
            raise ValueError(f"a wheel of {slots} slots at {precision_ms} ms")
        self.path = path
        self.precision_ms = precision_ms
        self.puts = 0  # slots written by ``put`` since the wheel was opened
        self.total = 2 * slots
        self.length = self.total * SLOT_SIZE
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size not in (0, self.length):
                raise StoreError(f"{path} is {size} bytes, a wheel of {slots} x 2 slots is "
                                 f"{self.length}: timerPrecisionMs or the span changed, or the "
                                 "file is damaged")
            if size == 0:
                os.ftruncate(fd, self.length)
                self._mem = bytearray(self.length)
            else:
                self._mem = bytearray(os.pread(fd, self.length, 0))
                if len(self._mem) != self.length:
                    raise StoreError(f"{path}: short read")
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._dirty: set[int] = set()

    def index(self, time_ms: int) -> int:
        return time_ms // self.precision_ms % self.total

    def slot(self, time_ms: int) -> Slot:
        """The slot of ``time_ms``'s tick, or EMPTY when it holds another tick."""
        tick, first, last, num, magic = SLOT.unpack_from(self._mem, self.index(time_ms) * SLOT_SIZE)
        if tick != time_ms // self.precision_ms:
            return EMPTY
        return Slot(tick * self.precision_ms, first, last, num, magic)

    def put(self, time_ms: int, first_pos: int, last_pos: int, num: int) -> None:
        self.puts += 1  # a count of pending units must look again (``TimerService``)
        index = self.index(time_ms)
        SLOT.pack_into(self._mem, index * SLOT_SIZE, time_ms // self.precision_ms, first_pos,
                       last_pos, num, 0)
        self._dirty.add(index)

    def clear(self, time_ms: int) -> None:
        """Forget the tick (its units were delivered, or recovery found none)."""
        index = self.index(time_ms)
        SLOT.pack_into(self._mem, index * SLOT_SIZE, 0, 0, 0, 0, 0)
        self._dirty.add(index)

    def slots_from(self, time_ms: int) -> list[Slot]:
        """Every slot holding a tick at or after ``time_ms``'s, in tick order (status, recovery)."""
        start = time_ms // self.precision_ms
        out = []
        for tick, first, last, num, magic in SLOT.iter_unpack(self._mem):
            if tick >= start and num > 0:
                out.append(Slot(tick * self.precision_ms, first, last, num, magic))
        out.sort()
        return out

    def count(self, from_ms: int, to_ms: int) -> int:
        """Units of the ticks in [from_ms, to_ms) (status: one pass over those slots' bytes,
        at most the whole wheel once)."""
        first = from_ms // self.precision_ms
        last = min(to_ms // self.precision_ms, first + self.total)  # exclusive
        if last <= first:
            return 0
        start = first % self.total
        spans = [(start, min(self.total, start + last - first))]
        if start + last - first > self.total:
            spans.append((0, start + last - first - self.total))
        total = 0
        mem = memoryview(self._mem)
        for lo, hi in spans:
            for at in range(lo, hi, COUNT_CHUNK):  # the GIL is let go between chunks
                end = min(hi, at + COUNT_CHUNK)
                for tick, _f, _l, num, _m in SLOT.iter_unpack(
                        mem[at * SLOT_SIZE:end * SLOT_SIZE]):
                    if first <= tick < last:
                        total += num
                time.sleep(0)
        return total

    # ---- the checkpoint ---------------------------------------------------------------------
    def dirty(self) -> list[tuple[int, bytes]]:
        """The dirty slots' bytes now (call under the timer's lock); they are clean after."""
        taken = [(i, bytes(self._mem[i * SLOT_SIZE:(i + 1) * SLOT_SIZE]))
                 for i in sorted(self._dirty)]
        self._dirty.clear()
        return taken

    def write(self, slots: list[tuple[int, bytes]]) -> None:
        """Write slots taken by ``dirty`` to the file and sync it."""
        fd = self._fd
        run_start, run = -1, bytearray()
        for index, raw in slots:  # adjacent slots in one write
            if run and index * SLOT_SIZE == run_start + len(run):
                run += raw
                continue
            if run:
                os.pwrite(fd, run, run_start)
            run_start, run = index * SLOT_SIZE, bytearray(raw)
        if run:
            os.pwrite(fd, run, run_start)
        os.fsync(fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
