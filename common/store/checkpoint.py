"""The checkpoint, abort and lock files of a store directory.

``checkpoint`` (4096 bytes, RocketMQ ``StoreCheckpoint``; longs, big-endian):

| off | field                 | meaning                                                  |
|-----|-----------------------|----------------------------------------------------------|
|   0 | physicMsgTimestamp    | store time of the last flushed CommitLog record          |
|   8 | logicsMsgTimestamp    | store time of the last record dispatched to ConsumeQueues |
|  16 | indexMsgTimestamp     | store time covered by flushed index files                |
|  24 | physicFlushedOffset   | CommitLog offset known to be on disk (RocketMQ 5: masterFlushedOffset) |
|  32 | confirmPhyOffset      | replicated/confirmed offset (HA)                         |
|  40 | dispatchedRecordOffset | replog's own: where the newest record dispatched starts (a crash of the process alone checks the log from there) |

``abort`` exists while a store runs (holds the pid); its presence at start-up means the last
exit was a crash. ``lock`` is held with an exclusive flock: a second store on the same
directory, in this process or another, refuses to start.
"""

from __future__ import annotations

import fcntl
import os
import struct
from pathlib import Path

from common.core.errors import StoreError

CHECKPOINT = struct.Struct(">qqqqq")
assert CHECKPOINT.size == 40
EXTRA = struct.Struct(">q")  # after RocketMQ's five fields, which its reader takes alone
CHECKPOINT_FILE_SIZE = 4096


class StoreCheckpoint:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        self.physic_flushed_offset = 0
        self.confirm_phy_offset = 0
        self.dispatched_record_offset = 0
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._fd = fd
        raw = os.pread(fd, CHECKPOINT.size + EXTRA.size, 0)
        if len(raw) >= CHECKPOINT.size:
            (
                self.physic_msg_timestamp,
                self.logics_msg_timestamp,
                self.index_msg_timestamp,
                self.physic_flushed_offset,
                self.confirm_phy_offset,
            ) = CHECKPOINT.unpack_from(raw)
            if len(raw) == CHECKPOINT.size + EXTRA.size:
                self.dispatched_record_offset = max(0, EXTRA.unpack_from(raw, CHECKPOINT.size)[0])
        if len(raw) < CHECKPOINT.size:
            os.ftruncate(fd, CHECKPOINT_FILE_SIZE)

    def min_timestamp(self) -> int:
        """RocketMQ getMinTimestamp: the earliest time both log and queues are known good."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    def flush(self) -> None:
        data = CHECKPOINT.pack(
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.physic_flushed_offset,
            self.confirm_phy_offset,
        ) + EXTRA.pack(self.dispatched_record_offset)
        os.pwrite(self._fd, data, 0)
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_checkpoint(root: Path) -> dict[str, int]:
    """The checkpoint's fields without opening it for writing (readers such as Spark)."""
    raw = (Path(root) / "checkpoint").read_bytes()[: CHECKPOINT.size]
    if len(raw) < CHECKPOINT.size:
        return {}
    names = ("physicMsgTimestamp", "logicsMsgTimestamp", "indexMsgTimestamp",
             "physicFlushedOffset", "confirmPhyOffset")
    return dict(zip(names, CHECKPOINT.unpack(raw), strict=True))


class StoreLock:
    """Exclusive lock on ``<root>/lock``; StoreError if another store holds it."""

    def __init__(self, root: Path):
        self.path = Path(root) / "lock"
        self._fd = -1

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise StoreError(
                f"store {self.path.parent} is already in use (lock held by pid {holder or '?'})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """This kernel boot's id ("" where there is none to read)."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


class AbortFile:
    """``<root>/abort``: present while running; its presence at start means a crash.

    It holds ``<pid> <boot id>``. A crash of the process alone (kill -9, an abort) leaves
    the kernel's page cache, so every byte the broker wrote into its mappings is still
    there, torn only where a write was under way; a crash of the system (same file, another
    boot id, or none recorded) may have lost any page not flushed. ``crash`` tells which."""

    PROCESS = "process"
    SYSTEM = "system"

    def __init__(self, root: Path):
        self.path = Path(root) / "abort"

    def exists(self) -> bool:
        return self.path.exists()

    def crash(self) -> str | None:
        """None (a clean stop), PROCESS (same boot: the page cache was kept) or SYSTEM."""
        try:
            words = self.path.read_text(errors="replace").split()
        except FileNotFoundError:
            return None
        current = boot_id()
        if len(words) == 2 and current and words[1] == current:
            return self.PROCESS
        return self.SYSTEM

    def create(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, f"{os.getpid()} {boot_id()}".strip().encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def remove(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
