"""Which epoch a master term runs in: the epoch file handling around a role change.

Two files under ``<storePathRootDir>``:

| file                  | written by                     | content                               |
|-----------------------|--------------------------------|---------------------------------------|
| ``epochFileCheckpoint`` | masters and slaves (epochs.py) | the (epoch, start_phy_offset) history |
| ``haLearnedEpoch``    | the slave's HA client          | one line: the newest epoch this store |
|                       |                                | learned *from a master* (decimal)     |

The second file answers one question at a master start: did this store open its newest epoch
itself (first term, restart of the same master, ``promote``) or did it copy it from another
master while it was a slave? The slave writes the marker *before* saving a history that holds
the new epoch, so after a crash between the two writes the marker can only be too high, which
errs on the safe side (a new epoch).

Rules applied by ``begin_master_term`` before a master's HA service starts:

1. No history: the store's first master term, epoch 1 from ``min_phy_offset`` (RocketMQ 5
   starts at the log's min offset too).
2. The newest epoch was opened here (newer than the learned marker): a restarted master
   **keeps its epoch**. It does not start a new one, on purpose: a slave that acknowledged bytes
   this master lost in a crash (``ASYNC_FLUSH``) is then *ahead within the same epoch*, and
   ``MasterCore`` refuses it with OFFSET_OUT_OF_RANGE instead of truncating acknowledged data
   (a new epoch would make that tail look divergent and cut it). The operator promotes that
   slave instead. ``Broker.promote`` writes its new epoch before the role starts, so this rule
   also keeps that epoch rather than adding a second one.
3. The newest epoch was learned from another master (a slave's store configured as a master
   without ``promote``): a new epoch at ``max_phy_offset``, so that whatever this term writes can
   never be mistaken for the other master's bytes at the same offsets.
4. The log ends before the newest epoch's start (a crash lost the start of that term): the
   entries past the log are dropped and a new epoch, numbered after every epoch ever recorded,
   starts at ``max_phy_offset``. Epoch numbers are never reused.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from common.core.files import write_atomically
from common.ha import epochs as ep
from common.ha.epochs import EpochHistory

log = logging.getLogger("replog.term")

LEARNED_FILE = "haLearnedEpoch"
_MAX_LEARNED_BYTES = 32


def learned_epoch_path(store_root: str | os.PathLike[str]) -> Path:
    return Path(store_root) / LEARNED_FILE


def learned_epoch(store_root: str | os.PathLike[str]) -> int | None:
    """The newest epoch this store copied from a master; 0 if it never did; None when the file
    is torn or garbled (``begin_master_term`` then assumes the newest epoch was learned: the
    safe side, a new epoch)."""
    try:
        with open(learned_epoch_path(store_root), "rb") as f:
            raw = f.read(_MAX_LEARNED_BYTES + 1)
    except FileNotFoundError:
        return 0
    text = raw.decode("ascii", "replace").strip()
    if len(raw) > _MAX_LEARNED_BYTES or not text.isdigit():
        return None
    return int(text)


def record_learned_epoch(store_root: str | os.PathLike[str], epoch: int) -> None:
    """Durably raise the learned marker to ``epoch`` (never lowers it)."""
    known = learned_epoch(store_root)
    if known is not None and epoch <= known:
        return
    write_atomically(learned_epoch_path(store_root), f"{epoch}\n".encode("ascii"))


def master_term_history(
    history: EpochHistory, learned: int, min_phy_offset: int, max_phy_offset: int,
    broker_id: int = 0,
) -> EpochHistory:
    """The history a master term runs with (pure; rules 1-4 of the module docstring).

    New epochs are numbered with ``epochs.next_epoch``: above every epoch seen, and unique to
    ``broker_id``.
    """
    if not history:
        return (ep.EpochEntry(1, min_phy_offset),)
    newest = ep.last_epoch(history)
    kept = ep.truncate_beyond(history, max_phy_offset)
    if kept != history or not kept or newest <= learned:
        return ep.append_epoch(kept, ep.next_epoch(max(newest, learned), broker_id),
                               max_phy_offset)
    return kept


def begin_master_term(
    store_root: str | os.PathLike[str], min_phy_offset: int, max_phy_offset: int,
    broker_id: int = 0,
) -> EpochHistory:
    """Load, decide (``master_term_history``), save if changed, return the term's history."""
    Path(store_root).mkdir(parents=True, exist_ok=True)
    history = ep.load(store_root)
    learned = learned_epoch(store_root)
    if learned is None:
        learned = ep.last_epoch(history)
    term = master_term_history(history, learned, min_phy_offset, max_phy_offset, broker_id)
    if term != history:
        dropped = [e for e in history if e not in term]
        if dropped:  # the log ends before they start: cut by recovery, or the file is wrong
            log.warning("event=epochs_beyond_log_end_dropped epochs=%s max_phy_offset=%d",
                        ",".join(f"{e.epoch}@{e.start_phy_offset}" for e in dropped),
                        max_phy_offset)
        ep.save(store_root, term)
    return term
