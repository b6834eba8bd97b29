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

import heapq
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
    # (deadline, offset, handle) of every hand-out and change, a heap: what is due is found
    # without looking at what is not (an entry whose offset was resolved or handed out again
    # since is stale, skipped, and dropped when the heap is rebuilt)
    deadlines: list[tuple[int, int, int]] = field(default_factory=list, compare=False,
                                                  repr=False)
    # offsets out that were handed out as often as allowed: the DLQ's candidates, kept apart
    # so that finding them never walks everything out
    maxed: set[int] = field(default_factory=set, compare=False, repr=False)

    def put(self, offset: int, o: Out) -> None:
        self.out[offset] = o
        self.noted(offset, o)

    def noted(self, offset: int, o: Out) -> None:
        heap = self.deadlines
        if len(heap) > 2 * len(self.out) + 64:  # mostly stale: rebuild
            heap[:] = [(x.deadline_ms, off, x.handle) for off, x in self.out.items()]
            heapq.heapify(heap)
        else:
            heapq.heappush(heap, (o.deadline_ms, offset, o.handle))

    def next_deadline(self) -> int | None:
        """The earliest deadline of what is out (None: nothing is); drops stale entries."""
        heap, out = self.deadlines, self.out
        while heap:
            deadline, off, handle = heap[0]
            o = out.get(off)
            if o is not None and o.handle == handle and o.deadline_ms == deadline:
                return deadline
            heapq.heappop(heap)
        return None

    @property
    def floor(self) -> int:
        return min(self.out) if self.out else self.next

    def in_flight(self, now_ms: int) -> int:
        return len(self.out) - len(self.due(now_ms))

    def due(self, now_ms: int, limit: int | None = None) -> list[int]:
        """The offsets whose deadline passed, lowest first. With ``limit``, at most that many,
        the earliest deadlines first, taken off the heap's top (stale entries met there are
        dropped for good, the others put back): each stale entry costs once, not at every
        POP. Without, every one: the heap's entries at or below ``now_ms`` (a subtree whose
        root is later holds none), the stale ones skipped."""
        heap, out, found = self.deadlines, self.out, []
        if limit is not None:
            taken: list[tuple[int, int, int]] = []
            while heap and len(taken) < limit and heap[0][0] <= now_ms:
                entry = heapq.heappop(heap)
                deadline, off, handle = entry
                o = out.get(off)
                if o is not None and o.handle == handle and o.deadline_ms == deadline:
                    taken.append(entry)
            for entry in taken:
                heapq.heappush(heap, entry)
            return sorted(off for _, off, _ in taken)
        stack = [0] if heap else []
        while stack:
            i = stack.pop()
            deadline, off, handle = heap[i]
            if deadline > now_ms:
                continue
            o = out.get(off)
            if o is not None and o.handle == handle and o.deadline_ms == deadline:
                found.append(off)
            stack.extend(j for j in (2 * i + 1, 2 * i + 2) if j < len(heap))
        return sorted(found)


@dataclass(frozen=True)
class Candidate:
    """A message a POP may hand out: its offset, message group (FIFO) and record."""

    offset: int
    group: str | None = None
    raw: bytes = b""


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
    # unordered: the due ones, a few more than fit (some may wait for the DLQ instead)
    for off in sorted(state.out) if ordered else state.due(now_ms, 2 * max_nums + 16):
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
                     next_after: int, max_attempts: int = 0) -> None:
    """A POP handed these offsets out (each its ``attempts``-th time) until ``deadline_ms``;
    one handed out ``max_attempts`` times goes to the DLQ if it comes due again."""
    for off, n, group in zip(offsets, attempts, groups, strict=True):
        state.put(off, Out(deadline_ms, n, handle, group))
        if max_attempts and n >= max_attempts:
            state.maxed.add(off)
    state.next = max(state.next, next_after)


def apply_resolve(state: QueueState, offsets: Iterable[int], handles: Iterable[int]) -> list[int]:
    """ACK (or DLQ): each offset whose newest handle is the one named is resolved; the
    offsets resolved."""
    done = []
    for off, handle in zip(offsets, handles, strict=True):
        o = state.out.get(off)
        if o is not None and o.handle == handle:
            del state.out[off]
            state.maxed.discard(off)
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
    state.noted(offset, o)
    return True
