"""Read marks: how far a timer's read time may be trusted after its CommitLog is cut back.

The read time says that every tick before it is delivered, and the deliveries are records of
this store's CommitLog. When the log is cut (a member rejoining its group drops what only it
held; a crash loses an unflushed tail), the deliveries past the cut are gone, and so is the
read time's warrant. Each mark ``(end, read time)`` says that every delivery (and roll) of a
tick before ``read time`` lies below CommitLog offset ``end``: a master notes one as it leaves
a tick (``end``: the log's end then), a slave as reput shows it a delivery of a newer tick
(``end``: that record's end). A cut at ``P`` goes back to the newest mark with ``end <= P``.

Kept in memory (the newest ``KEPT``), and at each checkpoint those noted since the last join
the newest ``MAX_SAVED_MARKS`` the checkpoint page carries, so a member that restarts and then
rejoins its group still knows.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

KEPT = 16_384  # 27 minutes of ticks at 100 ms with a delivery in each, 4.5 hours at 1 s


class ReadMarks:
    def __init__(self, marks: Iterable[tuple[int, int]] = (), kept: int = KEPT):
        self._marks: collections.deque[tuple[int, int]] = collections.deque(maxlen=kept)
        for end, read_time in marks:
            self.note(end, read_time)

    def note(self, end: int, read_time: int) -> None:
        """Every delivery of a tick before ``read_time`` lies below ``end``."""
        marks = self._marks
        if marks:
            last_end, last_read = marks[-1]
            if end <= last_end:  # a mark for an earlier end: true of the later one as well
                if read_time > last_read:
                    marks[-1] = (last_end, read_time)
                return
            if read_time <= last_read:  # a later end, no later read time: says nothing new
                return
        marks.append((end, read_time))

    def cut(self, end: int) -> tuple[int | None, int | None]:
        """Forget the marks past ``end``. Returns the read time the log up to ``end`` holds the
        deliveries of (None: no mark is that old) and the oldest read time forgotten."""
        marks = self._marks
        forgotten = None
        while marks and marks[-1][0] > end:
            forgotten = marks.pop()[1]
        return (marks[-1][1] if marks else None), forgotten

    def since(self, mark: tuple[int, int] | None) -> list[tuple[int, int]]:
        """The marks after ``mark`` (all of them if it is None or no longer kept), oldest
        first; a mark merged since into the one at its end counts as after it."""
        out: list[tuple[int, int]] = []
        for kept in reversed(self._marks):
            if mark is not None and kept[0] <= mark[0] and kept[1] <= mark[1]:
                break
            out.append(kept)
        out.reverse()
        return out

    def __len__(self) -> int:
        return len(self._marks)
