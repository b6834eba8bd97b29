"""Recovery after a crash claims as flushed only what it wrote out (docs/guarantees.md,
"Crashes"): the tail a kill -9 left in the page cache is msync'ed before the checkpoint says it
is on disk. It was recorded as flushed unsynced, so a power loss after the restart made the
next start refuse the store over what was only a torn tail."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from common.core.config import load_config
from common.core.message import Message
from common.store import mapped_file
from common.store.checkpoint import StoreCheckpoint, read_checkpoint
from common.store.message_store import MessageStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def _cfg(root: Path) -> object:
    return load_config(env={}, storePathRootDir=str(root), mappedFileSizeCommitLog=64 * 1024,
                       flushIntervalCommitLog=3_600_000, flushCommitLogThoroughInterval=3_600_000)


def test_a_recovered_tail_is_written_out_before_the_checkpoint_claims_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    running = MessageStore(_cfg(tmp_path / "a"))  # type: ignore[arg-type]
    running.start()
    try:
        for i in range(300):  # over several segments, none of it flushed
            assert running.put(Message("t", b"m%03d" % i * 50), i % 2).ok
        end = running.max_phy_offset
        assert running.flushed_phy_offset < end
        # what a kill -9 leaves: the files as the page cache holds them, and the abort file
        shutil.copytree(tmp_path / "a", tmp_path / "crashed")
    finally:
        running.shutdown()
    synced: list[tuple[str, int, int]] = []
    real_msync = mapped_file.native.msync

    def msync(mm: object, addr: int | None, start: int, length: int) -> None:
        synced.append(("msync", start, length))
        real_msync(mm, addr, start, length)

    claims: list[tuple[int, int]] = []  # (offset claimed flushed, bytes msync'ed by then)
    real_flush = StoreCheckpoint.flush

    def checkpoint_flush(self: StoreCheckpoint) -> None:
        claims.append((self.physic_flushed_offset, sum(length for _, _, length in synced)))
        real_flush(self)

    on_disk = read_checkpoint(tmp_path / "crashed")["physicFlushedOffset"]
    assert on_disk < end - 4096
    monkeypatch.setattr(mapped_file.native, "msync", msync)
    monkeypatch.setattr(StoreCheckpoint, "flush", checkpoint_flush)
    again = MessageStore(_cfg(tmp_path / "crashed"))  # type: ignore[arg-type]
    again.start()
    try:
        assert again.recovery is not None and again.recovery.abnormal
        assert again.max_phy_offset == end
        claimed, synced_by_then = claims[0]
        assert claimed == end
        # the whole tail past what the old checkpoint held was msync'ed before that claim
        assert synced_by_then >= end - on_disk
    finally:
        again.shutdown()
