"""``config/timercheck`` (``layout.py``): where the timer stands, written last at each
checkpoint (after the TimerLog and the wheel), so it never claims more than they hold.

``last_read_time_ms``: the next tick to deliver (a master's progress; a slave keeps what its
master's table said). ``last_timer_log_flush_pos``: the TimerLog holds every unit up to here.
``last_timer_queue_offset``: every timer-topic message below this queue offset is on the wheel.
``marks`` (replog's, after RocketMQ's fields): the read times of the last checkpoints, each with
the CommitLog's end then, oldest first: a member that restarts, then rejoins its group and cuts
its log back, goes back to the read time its log still holds the deliveries of.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from common.core.errors import StoreError
from common.core.files import write_atomically
from common.store.timer.layout import (
    CHECKPOINT,
    CHECKPOINT_SIZE,
    MARK,
    MARKS_COUNT,
    MAX_SAVED_MARKS,
)


@dataclasses.dataclass
class TimerCheckpoint:
    path: Path
    last_read_time_ms: int = 0
    last_timer_log_flush_pos: int = 0
    last_timer_queue_offset: int = 0
    master_timer_queue_offset: int = 0
    state_version: int = 0
    timestamp: int = 0
    counter: int = 0
    marks: list[tuple[int, int]] = dataclasses.field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> TimerCheckpoint:
        """The file's values (zeros for a new one); a file of another size is refused. An
        empty file is a new one: a first checkpoint that never got its page (stores written
        before the first page was made whole by a rename: a kill between the file's creation
        and its write left 0 bytes); it claims nothing, as zeros do."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls(path)
        if not raw:
            return cls(path)
        if len(raw) != CHECKPOINT_SIZE:
            raise StoreError(f"{path} is {len(raw)} bytes, a timer checkpoint is "
                             f"{CHECKPOINT_SIZE}")
        values = CHECKPOINT.unpack_from(raw)
        if min(values[:4]) < 0:
            raise StoreError(f"{path} holds a negative position {values[:4]}: it is damaged")
        (count,) = MARKS_COUNT.unpack_from(raw, CHECKPOINT.size)
        if not 0 <= count <= MAX_SAVED_MARKS:
            raise StoreError(f"{path} names {count} read marks (at most {MAX_SAVED_MARKS}): "
                             f"it is damaged")
        base = CHECKPOINT.size + MARKS_COUNT.size
        marks = [MARK.unpack_from(raw, base + i * MARK.size) for i in range(count)]
        read, flush_pos, queue, master_queue, version, stamp, counter = values
        return cls(path, read, flush_pos, queue, master_queue, version, stamp, counter, marks)

    def encode(self) -> bytes:
        page = bytearray(CHECKPOINT_SIZE)
        CHECKPOINT.pack_into(page, 0, self.last_read_time_ms, self.last_timer_log_flush_pos,
                             self.last_timer_queue_offset, self.master_timer_queue_offset,
                             self.state_version, self.timestamp, self.counter)
        marks = self.marks[-MAX_SAVED_MARKS:]
        MARKS_COUNT.pack_into(page, CHECKPOINT.size, len(marks))
        base = CHECKPOINT.size + MARKS_COUNT.size
        for i, (end, read_time) in enumerate(marks):
            MARK.pack_into(page, base + i * MARK.size, end, read_time)
        return bytes(page)

    def flush(self) -> None:
        """Write the page in place and sync it (one 4 KiB page: written whole or not). The
        first page is written to a new file renamed into place: a crash leaves no file, or a
        whole page, never an empty one."""
        self.counter += 1
        self.timestamp = int(time.time() * 1000)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            write_atomically(self.path, self.encode())
            return
        fd = os.open(self.path, os.O_RDWR, 0o644)
        try:
            os.pwrite(fd, self.encode(), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
