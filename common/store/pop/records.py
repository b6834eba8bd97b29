"""The revive topic's records: what a POP handed out (``ck``, RocketMQ's checkpoint), what an
ACK resolved (``ack``), a deadline moved (``chg``), a message given up to the DLQ (``dlq``).
Bodies are msgpack maps; the record's CommitLog offset is its identity (the handle of what it
handed out or changed). Every replica applies them in log order to the same state
(``state.py``)."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack

from common.core.message import PROPERTY_TAGS, Message
from common.core.pop import POP_RECORD

CK, ACK, CHANGE, DLQ = "ck", "ack", "chg", "dlq"
KINDS = (CK, ACK, CHANGE, DLQ)

Key = tuple[str, str, int]  # (consumer group, topic, queue id)


class PopRecord(NamedTuple):
    kind: str
    key: Key
    offsets: list[int]
    attempts: list[int]  # ck: times handed out, each
    groups: list[str | None]  # ck: message groups (FIFO)
    handles: list[int]  # ack, dlq, chg: the handle each names
    deadline_ms: int  # ck, chg
    next_after: int  # ck: the queue's next offset after it
    max_attempts: int  # ck: handed out this many times, a message goes to the DLQ

    def message(self, topic: str) -> Message:
        body = msgpack.packb({"k": self.kind, "g": self.key[0], "t": self.key[1],
                              "q": self.key[2], "o": self.offsets, "a": self.attempts,
                              "G": self.groups, "h": self.handles, "d": self.deadline_ms,
                              "n": self.next_after, "m": self.max_attempts})
        return Message(topic, body, tags=self.kind, properties={POP_RECORD: self.kind})


def written_here(rec: PopRecord, props: dict[str, str]) -> bool:
    """Whether a revive record's properties are the ones ``PopRecord.message`` writes (its kind
    as ``__POP`` and as its tag, nothing else): any other record of the revive topic (a
    delayed message once delivered into it, from before deliveries were held to
    ``boundary.delivery_refusal``) is not the POP's, whatever its body says."""
    return props == {POP_RECORD: rec.kind, PROPERTY_TAGS: rec.kind}


def ck(key: Key, offsets: list[int], attempts: list[int], groups: list[str | None],
       deadline_ms: int, next_after: int, max_attempts: int) -> PopRecord:
    return PopRecord(CK, key, offsets, attempts, groups, [], deadline_ms, next_after,
                     max_attempts)


def resolve(kind: str, key: Key, offsets: list[int], handles: list[int]) -> PopRecord:
    return PopRecord(kind, key, offsets, [], [], handles, 0, 0, 0)


def change(key: Key, offset: int, handle: int, deadline_ms: int) -> PopRecord:
    return PopRecord(CHANGE, key, [offset], [], [], [handle], deadline_ms, 0, 0)


def decode(body: bytes) -> PopRecord | None:
    """A revive record's body; None for one that is not (never raises: a replica must not
    stop on a record it cannot read, it skips it and says so)."""
    try:
        d: Any = msgpack.unpackb(body)
        kind = d["k"]
        if kind not in KINDS:
            return None
        offsets = [int(o) for o in d["o"]]
        return PopRecord(kind, (str(d["g"]), str(d["t"]), int(d["q"])), offsets,
                         [int(a) for a in d.get("a") or []],
                         [None if g is None else str(g) for g in d.get("G") or []],
                         [int(h) for h in d.get("h") or []], int(d.get("d") or 0),
                         int(d.get("n") or 0), int(d.get("m") or 0))
    except (ValueError, TypeError, KeyError, msgpack.UnpackException):
        return None
