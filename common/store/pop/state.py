"""What a consumer group holds of one queue it reads by POP: pure state, no I/O, changed only
by the records of ``records.py`` (so every replica, applying the same records in log order,
holds the same state), and read by the choice of what a POP hands out next.

``next``: every queue offset below it was handed out at least once. ``out``: the offsets
handed out and not resolved (acked, or gone to the DLQ), each with its deadline (in flight
until then, then *due*: handed out again by the next POP), how many times it was handed out,
the handle (the CommitLog offset of the record that last handed it out or changed its
deadline: an ACK must name the newest), and its message group (FIFO). Every offset of
``[floor, next)`` not in ``out`` is resolved; ``floor`` is the lowest one that is not.

A POP hands out, in queue order, the due offsets, then new ones from ``next``. In FIFO order a
message group whose earlier message is out (in flight, or due) gives nothing more: a due one
goes out again first, and a group's next message only after the one before it was resolved.
New messages are taken in queue order up to the first of a group that waits (RocketMQ 5 holds
the whole queue of a FIFO group): groups in other queues interleave freely, groups sharing a
queue in the order they were stored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Out:
    deadline_ms: int
    attempts: int  # times handed out (1: the first time)
    handle: int
    group: str | None = None  # the message group (FIFO); None: none


@dataclass
class QueueState:
    next: int = 0
    out: dict[int, Out] = field(default_factory=dict)

    @property
    def floor(self) -> int:
        return min(self.out) if self.out else self.next

    def in_flight(self, now_ms: int) -> int:
        return sum(1 for o in self.out.values() if o.deadline_ms > now_ms)

    def due(self, now_ms: int) -> list[int]:
        """The offsets whose deadline passed, lowest first."""
        return sorted(off for off, o in self.out.items() if o.deadline_ms <= now_ms)


@dataclass(frozen=True)
class Candidate:
    """A message a POP may hand out: its offset and message group (FIFO)."""

    offset: int
    group: str | None = None


def choose(state: QueueState, now_ms: int, max_nums: int, fresh: Iterable[Candidate],
           fifo: bool, max_attempts: int | None = None) -> tuple[list[int], list[Candidate]]:
    """What a POP hands out: (due offsets again, new candidates), at most ``max_nums`` in
    all. ``fresh``: the queue's messages from ``state.next`` on that match the subscription,
    in order (the caller stops reading them when this is full). A due offset handed out
    ``max_attempts`` times already is not handed out again (it waits for the DLQ)."""
    again: list[int] = []
    new: list[Candidate] = []
    blocked: set[str] = set()  # FIFO: groups with an earlier message out
    ordered = fifo  # a message without a group is ordered with nothing
    for off in sorted(state.out):
        o = state.out[off]
        if ordered and o.group is not None and o.group in blocked:
            continue
        if o.deadline_ms <= now_ms and (max_attempts is None or o.attempts < max_attempts) \
                and len(again) < max_nums:
            again.append(off)
        if ordered and o.group is not None:
            blocked.add(o.group)  # handed out now or still out: its later messages wait
    for c in fresh:
        if len(again) + len(new) >= max_nums:
            break
        if ordered and c.group is not None:
            if c.group in blocked:
                break  # the queue waits here: its order is the groups' order
            blocked.add(c.group)  # one message of a group at a time
        new.append(c)
    return again, new


# ---- the changes, as the records say them ----------------------------------------------
def apply_checkpoint(state: QueueState, handle: int, offsets: Iterable[int],
                     attempts: Iterable[int], groups: Iterable[str | None], deadline_ms: int,
                     next_after: int) -> None:
    """A POP handed these offsets out (each its ``attempts``-th time) until ``deadline_ms``."""
    for off, n, group in zip(offsets, attempts, groups, strict=True):
        state.out[off] = Out(deadline_ms, n, handle, group)
    state.next = max(state.next, next_after)


def apply_resolve(state: QueueState, offsets: Iterable[int], handles: Iterable[int]) -> list[int]:
    """ACK (or DLQ): each offset whose newest handle is the one named is resolved; the
    offsets resolved."""
    done = []
    for off, handle in zip(offsets, handles, strict=True):
        o = state.out.get(off)
        if o is not None and o.handle == handle:
            del state.out[off]
            done.append(off)
    return done


def apply_change(state: QueueState, offset: int, old_handle: int, new_handle: int,
                 deadline_ms: int) -> bool:
    """CHANGE_INVISIBLE_TIME: the offset's deadline moves, its handle becomes the change's."""
    o = state.out.get(offset)
    if o is None or o.handle != old_handle:
        return False
    o.deadline_ms = deadline_ms
    o.handle = new_handle
    return True
