"""A ConsumeQueue driven by random operations against a list model (hypothesis state machine).

Operations: append the next message, re-dispatch an old one, truncate at a record boundary
(HA), delete expired segments as the CommitLog min offset rises, and restart (shutdown, load,
recover, correct_min_offset as the store does). After every step the queue's answers and the
bytes on disk (read with plain struct, segment by segment) must equal the model.
"""

from __future__ import annotations

import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from common.store.consume_queue import ConsumeQueue

pytestmark = pytest.mark.property

UNIT = 20
PER_FILE = 5
FILE_SIZE = UNIT * PER_FILE
BLANK = (0, 0x7FFFFFFF, 0)
FIRST_PHY = 4096


class ConsumeQueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="cqprop-"))
        self.cq = ConsumeQueue(self.root, "T", 3, FILE_SIZE)
        self.cq.load()
        self.model: list[tuple[int, int, int]] = []  # index = queue offset
        self.min_q = 0
        self.first_seg = 0
        self.next_phy = FIRST_PHY
        self.max_phy = 0
        self.min_phy = 0

    @initialize(start=st.integers(0, 12))
    def start_at(self, start: int) -> None:
        """A queue whose first message has queue offset ``start`` (blank pre-fill)."""
        self.first_seg = start // PER_FILE
        self.model = [BLANK] * start
        self.min_q = start
        self.append(1, 0)

    # ---- model helpers ---------------------------------------------------------------------
    def real(self) -> list[tuple[int, int, int, int]]:
        return [(q, *e) for q, e in enumerate(self.model) if e != BLANK]

    def end_on_disk(self) -> int:
        """End of the last real entry whose segment still exists, 0 if none."""
        held = self.model[self.first_seg * PER_FILE :]
        last = next((e for e in reversed(held) if e != BLANK), None)
        return last[0] + last[1] if last else 0

    def last_seg(self) -> int:
        return max(self.first_seg, (len(self.model) - 1) // PER_FILE)

    # ---- rules ---------------------------------------------------------------------------------
    @rule(size=st.integers(1, 300), tags=st.integers(-(2**63), 2**63 - 1))
    def append(self, size: int, tags: int) -> None:
        q = len(self.model)
        assert self.cq.put(q, self.next_phy, size, tags)
        self.model.append((self.next_phy, size, tags))
        self.next_phy += size
        self.max_phy = self.next_phy

    @precondition(lambda self: any(e != BLANK for e in self.model[self.min_q :]))
    @rule(data=st.data())
    def redispatch(self, data: st.DataObject) -> None:
        live = [r for r in self.real() if r[0] >= self.min_q]
        q, phy, size, tags = data.draw(st.sampled_from(live))
        assert self.cq.put(q, phy, size, tags)

    @precondition(lambda self: any(e != BLANK for e in self.model[self.min_q :]))
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        """HA truncation at a record boundary at or above the CommitLog min offset."""
        cuts = [phy for q, phy, _, _ in self.real() if q >= self.min_q] + [self.next_phy]
        cut = data.draw(st.sampled_from(cuts))
        self.cq.truncate_dirty(cut)
        while self.model and self.model[-1] != BLANK and self.model[-1][0] >= cut:
            self.model.pop()
        self.next_phy = cut
        self.max_phy = self.end_on_disk() or min(self.max_phy, cut)

    @precondition(lambda self: any(e != BLANK for e in self.model[self.min_q :]))
    @rule(data=st.data())
    def delete_expired(self, data: st.DataObject) -> None:
        """The CommitLog min offset rises to the start of some live record (never falls)."""
        live = [phy for q, phy, _, _ in self.real() if q >= self.min_q]
        self.min_phy = max(self.min_phy, data.draw(st.sampled_from(live)))
        deleted = 0
        while self.first_seg < self.last_seg():
            last_of_seg = self.model[(self.first_seg + 1) * PER_FILE - 1]
            if last_of_seg[0] >= self.min_phy:
                break
            self.first_seg += 1
            deleted += 1
        assert self.cq.delete_expired(self.min_phy) == deleted
        self.min_q = next((q for q, phy, _, _ in self.real() if phy >= self.min_phy),
                          len(self.model))

    @rule()
    def restart(self) -> None:
        self.cq.flush()
        self.cq.shutdown()
        self.cq = ConsumeQueue(self.root, "T", 3, FILE_SIZE)
        self.cq.load()
        self.cq.recover()
        self.cq.correct_min_offset(self.min_phy)
        self.max_phy = self.end_on_disk()

    # ---- checks ------------------------------------------------------------------------------
    @invariant()
    def answers_match_model(self) -> None:
        cq, n = self.cq, len(self.model)
        assert (cq.min_queue_offset, cq.max_queue_offset) == (self.min_q, n)
        assert cq.max_phy_offset == self.max_phy
        expected = [(q, *e) for q, e in enumerate(self.model) if q >= self.min_q]
        assert cq.entries(self.min_q, n + 1) == expected
        for q in (self.min_q - 1, self.min_q, n - 1, n):
            want = self.model[q] if self.min_q <= q < n else None
            assert cq.get(q) == want

    @invariant()
    def disk_matches_model(self) -> None:
        directory = self.root / "consumequeue" / "T" / "3"
        names = sorted(p.name for p in directory.iterdir())
        segs = range(self.first_seg, self.last_seg() + 1)
        assert names == [f"{s * FILE_SIZE:020d}" for s in segs]
        for s in segs:
            data = (directory / f"{s * FILE_SIZE:020d}").read_bytes()
            held = self.model[s * PER_FILE : (s + 1) * PER_FILE]
            want = b"".join(struct.pack(">qiq", *e) for e in held)
            assert data == want + bytes(FILE_SIZE - len(want))

    def teardown(self) -> None:
        self.cq.shutdown()
        shutil.rmtree(self.root, ignore_errors=True)


ConsumeQueueMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                                 deadline=None)
TestConsumeQueueModel = ConsumeQueueMachine.TestCase
