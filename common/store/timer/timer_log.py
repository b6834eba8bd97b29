"""The TimerLog (``<store>/timerlog/``, ``layout.py``): segments of 52-byte units, each one
timer message's place on the wheel; a tick's units are linked backwards from its slot's
``lastPos`` by ``prevPos``. Appended by the enqueue thread only; read by the dequeue thread.

A segment that cannot take another unit and a blank ends with the blank (RocketMQ 5's
padding), so a unit never crosses a segment. ``recover`` cuts the log at the checkpoint's
flushed position: what was appended past it is enqueued again from the timer topic's queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from common.core.errors import StoreError
from common.store.mapped_file_queue import MappedFileQueue
from common.store.timer.layout import BLANK, BLANK_MAGIC, MIN_BLANK, UNIT, UNIT_SIZE


class Unit(NamedTuple):
    size: int
    prev_pos: int
    magic: int
    write_time_ms: int
    delay: int  # the delivery time minus write_time_ms
    offset_py: int  # the timer message's CommitLog offset
    size_py: int
    real_topic_hash: int
    reserved: int = 0

    @property
    def deliver_ms(self) -> int:
        return self.write_time_ms + self.delay


class TimerLog:
    def __init__(self, directory: Path, file_size: int):
        if file_size < UNIT_SIZE + MIN_BLANK:
            raise ValueError(f"mappedFileSizeTimerLog {file_size} holds no unit")
        self.queue = MappedFileQueue(directory, file_size)
        self.file_size = file_size

    def load(self) -> None:
        self.queue.load()

    def recover(self, end: int) -> None:
        """The log ends at ``end`` (the checkpoint's flushed position): cut what follows."""
        if end > self.queue.max_offset:
            raise StoreError(f"the timer checkpoint names TimerLog position {end}, past the "
                             f"log's end {self.queue.max_offset}: the timerlog is damaged")
        self.queue.truncate_dirty(end)
        mf = self.queue.find(end - 1) if end > 0 else None
        if mf is not None:
            mf.set_positions(end - mf.file_from_offset)

    @property
    def end(self) -> int:
        return self.queue.max_offset

    def append(self, unit: bytes) -> int:
        """Write one unit (``UNIT.pack``); returns its position."""
        mf = self.queue.last_for_write()
        if mf.remaining() < UNIT_SIZE + MIN_BLANK:
            mf.append(BLANK.pack(mf.remaining(), 0, BLANK_MAGIC))
            mf.wrote_position = self.file_size
            mf = self.queue.last_for_write()
        pos = mf.file_from_offset + mf.wrote_position
        mf.append(unit)
        return pos

    def read(self, pos: int) -> Unit | None:
        """The unit at ``pos``, or None when ``pos`` is outside the log or not a unit."""
        mf = self.queue.find(pos)
        if mf is None:
            return None
        at = pos - mf.file_from_offset
        if at + UNIT_SIZE > mf.wrote_position:
            return None
        unit = Unit(*UNIT.unpack_from(mf.buffer, at))
        return unit if unit.size == UNIT_SIZE else None

    def units_back(self, end: int) -> Iterator[tuple[int, Unit]]:
        """The units below position ``end``, newest first, as (position, unit)."""
        for mf in reversed(self.queue.files):
            base = mf.file_from_offset
            if base >= end:
                continue
            top = min(mf.wrote_position, end - base)
            pos = top - top % UNIT_SIZE  # units sit at multiples of their size; a blank ends
            while pos >= UNIT_SIZE:
                pos -= UNIT_SIZE
                unit = self.read(base + pos)
                if unit is not None:
                    yield base + pos, unit

    def flush(self) -> int:
        return self.queue.flush(0)

    def shutdown(self) -> None:
        self.queue.flush(0)
        self.queue.shutdown()
