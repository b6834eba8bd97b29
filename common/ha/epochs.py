"""The epoch history: which master term wrote which part of the CommitLog.

A history is a tuple of ``EpochEntry(epoch, start_phy_offset)``, epochs strictly increasing and
start offsets non-decreasing; entry *i* covers ``[start_i, start_{i+1})`` and the last one runs to
the log's max offset. A new master term appends ``(last_epoch + 1, max_phy_offset)``; a slave
records the epoch of each DATA frame the first time it sees it. Functions here are pure; only
``load`` and ``save`` touch the disk.

On disk, ``<storePathRootDir>/epochFileCheckpoint`` in RocketMQ 5's ``CheckpointFile`` layout
(text, one item per line)::

    <entry count>
    <crc32 of the entry lines, & 0x7FFFFFFF>
    <epoch>-<start_phy_offset>          one line per entry, oldest first

``save`` writes ``epochFileCheckpoint.tmp``, fsyncs it, renames the current file to
``epochFileCheckpoint.bak`` and the temp file into place, then fsyncs the directory: after a crash
at any point one of the two files holds a complete history. ``load`` reads the main file and
falls back to the ``.bak`` when the main one is missing or fails its count or CRC.
"""

from __future__ import annotations

import logging
import os
import zlib
from pathlib import Path
from typing import NamedTuple, TypeAlias

from common.core.errors import StoreError

log = logging.getLogger("replog.epochs")

FILE_NAME = "epochFileCheckpoint"
BACKUP_SUFFIX = ".bak"
TEMP_SUFFIX = ".tmp"
MAX_FILE_BYTES = 1024 * 1024  # a history of ~40 000 entries; never read more than this


class EpochEntry(NamedTuple):
    """One master term: ``epoch`` began writing at ``start_phy_offset``."""

    epoch: int
    start_phy_offset: int


EpochHistory: TypeAlias = tuple[EpochEntry, ...]


class EpochFileError(StoreError):
    """Neither the epoch file nor its backup holds a valid history."""


# ---- pure functions over histories -----------------------------------------------------------
def validate(history: EpochHistory) -> None:
    """Raise ValueError unless epochs strictly increase (>= 1) and starts never decrease."""
    previous: EpochEntry | None = None
    for entry in history:
        if entry.epoch < 1 or entry.start_phy_offset < 0:
            raise ValueError(f"invalid epoch entry {entry}")
        if previous is not None and (
            entry.epoch <= previous.epoch or entry.start_phy_offset < previous.start_phy_offset
        ):
            raise ValueError(f"epoch entry {entry} does not follow {previous}")
        previous = entry


def last_epoch(history: EpochHistory) -> int:
    """The newest epoch, 0 for an empty history."""
    return history[-1].epoch if history else 0


def append_epoch(history: EpochHistory, epoch: int, start_phy_offset: int) -> EpochHistory:
    """``history`` plus ``(epoch, start_phy_offset)``.

    The epoch must be newer than the last one and may not start before it. An entry that starts
    where the last one starts replaces it: that term wrote no bytes, and one entry per start
    offset keeps "which epoch wrote byte X" unambiguous.
    """
    if epoch <= last_epoch(history):
        raise ValueError(f"epoch {epoch} is not newer than {last_epoch(history)}")
    if history and start_phy_offset < history[-1].start_phy_offset:
        raise ValueError(f"epoch {epoch} at {start_phy_offset} starts before {history[-1]}")
    if start_phy_offset < 0:
        raise ValueError(f"negative start offset {start_phy_offset}")
    kept = history[:-1] if history and history[-1].start_phy_offset == start_phy_offset else history
    return (*kept, EpochEntry(epoch, start_phy_offset))


BROKER_ID_BITS = 8
MAX_BROKER_ID = (1 << BROKER_ID_BITS) - 1


def next_epoch(newest: int, broker_id: int) -> int:
    """An epoch above ``newest`` that only ``broker_id`` can open.

    The high bits count terms, the low 8 bits name the broker that opened the term. Two
    brokers promoted from the same history without hearing of each other (no controller
    decides) therefore never open the same ``(epoch, start offset)`` entry, and the
    divergence check always sees that their histories differ.
    """
    if not 0 <= broker_id <= MAX_BROKER_ID:
        raise ValueError(f"broker id {broker_id} outside 0..{MAX_BROKER_ID}")
    return (((newest >> BROKER_ID_BITS) + 1) << BROKER_ID_BITS) | broker_id


def new_epoch(history: EpochHistory, start_phy_offset: int) -> EpochHistory:
    """A new master term starting at ``start_phy_offset`` (the new master's max offset)."""
    return append_epoch(history, last_epoch(history) + 1, start_phy_offset)


def entry_index_at(history: EpochHistory, phy_offset: int) -> int:
    """Index of the entry that wrote byte ``phy_offset``; -1 when it precedes the history."""
    low, high = 0, len(history)
    while low < high:
        mid = (low + high) // 2
        if history[mid].start_phy_offset <= phy_offset:
            low = mid + 1
        else:
            high = mid
    return low - 1


def entry_end(history: EpochHistory, index: int, max_phy_offset: int) -> int:
    """Where entry ``index`` stops: the next entry's start, or ``max_phy_offset`` for the last."""
    if index + 1 < len(history):
        return min(history[index + 1].start_phy_offset, max_phy_offset)
    return max_phy_offset


def find_divergence(
    local_history: EpochHistory,
    local_max_offset: int,
    remote_history: EpochHistory,
    remote_max_offset: int,
) -> int:
    """The largest offset up to which both logs hold the same bytes (RocketMQ 5
    ``EpochFileCache.findConsistentPoint``): walk the local entries from the newest; the first
    one the remote history holds with the same start offset bounds the consistent prefix at the
    smaller of the two ends of that epoch. No common entry: 0 (nothing can be proven equal)."""
    remote_index = {entry.epoch: i for i, entry in enumerate(remote_history)}
    for i in range(len(local_history) - 1, -1, -1):
        entry = local_history[i]
        j = remote_index.get(entry.epoch)
        if j is None or remote_history[j].start_phy_offset != entry.start_phy_offset:
            continue
        local_end = entry_end(local_history, i, local_max_offset)
        remote_end = entry_end(remote_history, j, remote_max_offset)
        return max(0, min(local_end, remote_end, local_max_offset, remote_max_offset))
    return 0


def truncate_from(history: EpochHistory, phy_offset: int) -> EpochHistory:
    """Drop the entries starting at or after ``phy_offset`` (the log is cut there; RocketMQ
    ``truncateSuffixByOffset``). The epoch that wrote the bytes just before stays."""
    return tuple(e for e in history if e.start_phy_offset < phy_offset)


def truncate_beyond(history: EpochHistory, phy_offset: int) -> EpochHistory:
    """Drop the entries starting after ``phy_offset``; an entry starting exactly there is kept
    (a master term that has not written yet). Used after recovery to match the log's max."""
    return tuple(e for e in history if e.start_phy_offset <= phy_offset)


# ---- the file --------------------------------------------------------------------------------
def epoch_file_path(store_root: str | os.PathLike[str]) -> Path:
    return Path(store_root) / FILE_NAME


def _crc(lines: str) -> int:
    return zlib.crc32(lines.encode("ascii")) & 0x7FFFFFFF


def encode_file(history: EpochHistory) -> bytes:
    """The file's bytes for ``history``."""
    validate(history)
    lines = "".join(f"{e.epoch}-{e.start_phy_offset}\n" for e in history)
    return f"{len(history)}\n{_crc(lines)}\n{lines}".encode("ascii")


def decode_file(raw: bytes) -> EpochHistory:
    """Parse the file's bytes; ValueError on any inconsistency (count, CRC, syntax, order)."""
    text = raw.decode("ascii")
    head, _, rest = text.partition("\n")
    crc_text, _, lines = rest.partition("\n")
    if not head.isdigit() or not crc_text.isdigit():
        raise ValueError("bad count or CRC line")
    entries = lines.split("\n")
    if entries.pop() != "":
        raise ValueError("last entry line is incomplete")
    if int(head) != len(entries):
        raise ValueError(f"entry count {head} but {len(entries)} entry lines")
    crc = int(crc_text)
    if crc != 0 and crc != _crc(lines):
        raise ValueError("CRC mismatch")
    history = tuple(_parse_entry(line) for line in entries)
    validate(history)
    return history


def _parse_entry(line: str) -> EpochEntry:
    epoch, sep, start = line.partition("-")
    if not sep or not epoch.isdigit() or not start.isdigit():
        raise ValueError(f"bad entry line {line!r}")
    return EpochEntry(int(epoch), int(start))


def _read(path: Path) -> EpochHistory:
    with open(path, "rb") as f:
        raw = f.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
    return decode_file(raw)


def load(store_root: str | os.PathLike[str]) -> EpochHistory:
    """The saved history; empty when neither file exists. EpochFileError when the main file is
    unusable and so is (or there is no) backup."""
    path = epoch_file_path(store_root)
    backup = path.with_name(FILE_NAME + BACKUP_SUFFIX)
    problems = []
    for candidate in (path, backup):
        try:
            history = _read(candidate)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            problems.append(f"{candidate}: {e}")
            continue
        if problems:  # the main file is damaged: say so, the backup is one save older
            log.warning("event=epoch_file_from_backup path=%s problem=%r", candidate,
                        problems[0])
        return history
    if problems:
        raise EpochFileError("no valid epoch file: " + "; ".join(problems))
    return ()


def save(store_root: str | os.PathLike[str], history: EpochHistory) -> None:
    """Write ``history`` durably (temp + fsync + rename; the previous file becomes ``.bak``)."""
    path = epoch_file_path(store_root)
    temp = path.with_name(FILE_NAME + TEMP_SUFFIX)
    backup = path.with_name(FILE_NAME + BACKUP_SUFFIX)
    data = encode_file(history)
    with open(temp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if path.exists():
        os.replace(path, backup)
    os.replace(temp, path)
    _fsync_dir(path.parent)


def restore(store_root: str | os.PathLike[str], history: EpochHistory) -> None:
    """Put back a history read earlier with ``load`` (an undone promotion): no file when it
    was empty, else ``history`` in both the main file and its backup, so neither holds what
    was undone."""
    path = epoch_file_path(store_root)
    backup = path.with_name(FILE_NAME + BACKUP_SUFFIX)
    if not history:
        path.unlink(missing_ok=True)
        backup.unlink(missing_ok=True)
        _fsync_dir(path.parent)
        return
    save(store_root, history)
    save(store_root, history)  # the first save moved the undone history into the backup


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
