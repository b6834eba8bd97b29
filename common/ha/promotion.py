"""A promotion outlives a restart: ``<storePathRootDir>/config/promotion.json``.

``replog promote`` turns a running slave into its group's master, but the broker's YAML still
says ``brokerRole: SLAVE`` and names the old master. Restarted from that file alone, the new
master would come back as a slave of a broker that is now its own slave (or is gone): a group
with no master. So ``Broker._promote`` records the promotion, and a start-up reads it back:

    {"brokerRole": "ASYNC_MASTER", "epoch": 7, "configuredRole": "SLAVE",
     "configuredHaMasterAddress": "10.0.0.1:10912", "promotedAtMs": 1795000000000}

It holds (``resumed_role``) while all of these are true:

* the broker can ask its group (``groupServers`` is set): the record alone cannot tell a
  restart of the current master from a restart of a master that another promotion has since
  replaced (the YAML of a broker put back as a slave of the broker it once replaced reads the
  same as at its promotion); the start-up probe can, and a resumed master follows a master of
  a newer epoch it finds (docs/contract.md §6). Without ``groupServers`` the broker starts as
  its YAML says and logs ``promotion_not_resumed``;
* the YAML still says what it said at the promotion (``brokerRole`` and ``haMasterAddress``):
  an operator who edits either has decided the role, and the file wins (delete
  ``promotion.json`` to demote with an unchanged file);
* the store's newest epoch is still the one the promotion opened: once the broker has
  followed a newer master (``groupServers``, docs/contract.md §6) and copied its epoch, the
  record is spent.

A record that cannot be read is reported and ignored:
the broker starts as its YAML says (a slave), never as a second master by accident.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from common.core.files import write_atomically

PROMOTION_FILE = "promotion.json"
MASTER_ROLES = ("SYNC_MASTER", "ASYNC_MASTER")
_MAX_BYTES = 4096


class PromotionRecordError(ValueError):
    """``promotion.json`` exists but is not a promotion record (torn, garbled, edited)."""


@dataclasses.dataclass(frozen=True)
class Promotion:
    role: str  # the master role the broker was promoted to
    epoch: int  # the epoch the promotion opened
    configured_role: str  # the YAML's brokerRole at the promotion
    configured_master: str  # the YAML's haMasterAddress at the promotion
    promoted_at_ms: int = 0

    def to_json(self) -> bytes:
        doc = {
            "brokerRole": self.role,
            "epoch": self.epoch,
            "configuredRole": self.configured_role,
            "configuredHaMasterAddress": self.configured_master,
            "promotedAtMs": self.promoted_at_ms,
        }
        return (json.dumps(doc, indent=2) + "\n").encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Promotion:
        try:
            doc: Any = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as e:
            raise PromotionRecordError(f"not JSON: {e}") from None
        if not isinstance(doc, dict):
            raise PromotionRecordError("not a JSON object")
        role, epoch = doc.get("brokerRole"), doc.get("epoch")
        configured_role = doc.get("configuredRole")
        configured_master = doc.get("configuredHaMasterAddress")
        promoted_at = doc.get("promotedAtMs", 0)
        if role not in MASTER_ROLES:
            raise PromotionRecordError(f"brokerRole {role!r} is not one of {MASTER_ROLES}")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch <= 0:
            raise PromotionRecordError(f"epoch {epoch!r} is not a positive integer")
        if not isinstance(configured_role, str) or not isinstance(configured_master, str):
            raise PromotionRecordError("configuredRole / configuredHaMasterAddress missing")
        if not isinstance(promoted_at, int) or isinstance(promoted_at, bool):
            raise PromotionRecordError(f"promotedAtMs {promoted_at!r} is not an integer")
        return cls(role, epoch, configured_role, configured_master, promoted_at)


def path_of(store_root: str | os.PathLike[str]) -> Path:
    return Path(store_root) / "config" / PROMOTION_FILE


def repairs_from_master(is_slave: bool, store_root: str | os.PathLike[str]) -> bool:
    """Whether a store may cut damage below its flushed offset at start-up, to fetch those
    bytes from its master again: a replicating slave may; a master may not, nor a slave whose
    promotion record makes it a master again at this start (the bytes may be nowhere else).
    The broker hands the answer to the store (``MessageStore(repair_from_master=...)``)."""
    return is_slave and not path_of(store_root).exists()


def record(
    store_root: str | os.PathLike[str], role: str, epoch: int, configured_role: str,
    configured_master: str,
) -> Promotion:
    """Durably record a promotion (before the new master role starts)."""
    promotion = Promotion(role, epoch, configured_role, configured_master,
                          int(time.time() * 1000))
    path = path_of(store_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, promotion.to_json())
    return promotion


def load(store_root: str | os.PathLike[str]) -> Promotion | None:
    """The recorded promotion, None without one; PromotionRecordError when it is unreadable."""
    try:
        with open(path_of(store_root), "rb") as f:
            raw = f.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(raw) > _MAX_BYTES:
        raise PromotionRecordError(f"over {_MAX_BYTES} bytes")
    return Promotion.from_json(raw)


def forget(store_root: str | os.PathLike[str]) -> None:
    """Remove the record (a failed promotion's undo; a promoted broker that follows a newer
    master). Durable: the directory is synced."""
    path = path_of(store_root)
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def resumed_role(
    promotion: Promotion | None, configured_role: str, configured_master: str, newest_epoch: int,
    can_probe: bool = True,
) -> str | None:
    """The master role a restart resumes, or None: start as the YAML says (pure).
    ``can_probe``: the broker will ask its group (``groupServers``) before it serves."""
    if promotion is None or not can_probe:
        return None
    if (configured_role, configured_master) != (
        promotion.configured_role, promotion.configured_master
    ):
        return None  # the operator changed the role configuration since: it decides
    if newest_epoch != promotion.epoch:
        return None  # a newer master's epoch was copied since (or the history lost this one)
    return promotion.role
