"""Long polling: requests parked by a key until something for that key arrives, or their wait
ends (RocketMQ's PullRequestHoldService).

A processor parks a ``LongPoll`` (``Context.park``) with the key it waits on (a queue today;
a group's topic for POP tomorrow), whether a new max offset lets it be answered (``ready``), and
how to answer it (``answer``: the read done again). The front end that owns the connection
drives ``LongPolls``: arrivals (reput's listener, per key) and the clock release them, and it
sends each released poll's answer. One thread only (the request server's I/O thread).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Hashable

from common.format.protocol import Request, Response


@dataclasses.dataclass(eq=False)
class LongPoll:
    key: Hashable
    identity: bytes
    req: Request
    deadline: float  # monotonic: answered at the latest then (with nothing new)
    started: float
    ready: Callable[[int], bool]  # the key's new max offset lets it be answered
    answer: Callable[[], Response]  # the read, done again
    current: Callable[[], int]  # the key's max offset now (a message may beat the parking)


class LongPolls:
    """Parked polls by key, with their deadlines in a heap."""

    def __init__(self) -> None:
        self._by_key: dict[Hashable, list[LongPoll]] = {}
        # (deadline, seq, key), a heap never replaced: the loop reads it to skip ``expire``
        self.deadlines: list[tuple[float, int, Hashable]] = []
        self._seq = 0
        self.keys: frozenset[Hashable] = frozenset()  # read from any thread (arrival filter)

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_key.values())

    def park(self, poll: LongPoll) -> bool:
        """Park ``poll``; True when something for its key arrived already (between its read
        and now: that arrival told nobody), so the caller wakes the key at once."""
        self._by_key.setdefault(poll.key, []).append(poll)
        self.keys = frozenset(self._by_key)
        self._seq += 1
        heapq.heappush(self.deadlines, (poll.deadline, self._seq, poll.key))
        return poll.ready(poll.current())

    def wake(self, key: Hashable, max_offset: int) -> list[LongPoll]:
        """The polls of ``key`` that ``max_offset`` lets be answered (taken out)."""
        waiting = self._by_key.get(key)
        if not waiting:
            return []
        done = [p for p in waiting if p.ready(max_offset)]
        if done:
            self._set(key, [p for p in waiting if not p.ready(max_offset)])
        return done

    def expire(self, now: float) -> list[LongPoll]:
        """The polls whose wait ended by ``now`` (taken out)."""
        out: list[LongPoll] = []
        while self.deadlines and self.deadlines[0][0] <= now:
            _, _, key = heapq.heappop(self.deadlines)
            waiting = self._by_key.get(key, [])
            out.extend(p for p in waiting if p.deadline <= now)
            self._set(key, [p for p in waiting if p.deadline > now])
        return out

    def take_all(self) -> list[LongPoll]:
        out = [p for waiting in self._by_key.values() for p in waiting]
        self._by_key.clear()
        self.keys = frozenset()
        self.deadlines.clear()
        return out

    def _set(self, key: Hashable, waiting: list[LongPoll]) -> None:
        if waiting:
            self._by_key[key] = waiting
        else:
            self._by_key.pop(key, None)
            self.keys = frozenset(self._by_key)
