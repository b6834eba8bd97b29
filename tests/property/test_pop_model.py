"""POP against a model (issue 40's acceptance): any interleaving of receive (plain or FIFO),
ack (by a handle that may be stale), change of invisible time, the clock passing deadlines,
and failover (the state rebuilt by a replica from the revive records alone) hands each message
out until it is acked, never one that was acked or is still in flight, counts each hand-out
exactly, and in FIFO mode hands out a message group's messages one at a time, in order."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from common.core.config import load_config
from common.core.message import PROPERTY_SHARDING_KEY, Message
from common.store.message_store import MessageStore
from common.store.pop.service import PopStore

pytestmark = [pytest.mark.property, pytest.mark.timeout(600)]

KEY = ("g", "t", 0)
MESSAGES = 12
GROUPS = ("A", "B", "C")
INVISIBLE = 1_000


class PopModel(RuleBasedStateMachine):
    """The model: for each message, acked or not, its hand-outs, and its newest handle with
    that handle's deadline."""

    @initialize(fifo=st.booleans())
    def start(self, fifo: bool) -> None:
        self.dir = tempfile.TemporaryDirectory()
        cfg = load_config(env={}, storePathRootDir=str(Path(self.dir.name) / "s"),
                          mappedFileSizeCommitLog=1024 * 1024)
        self.store = MessageStore(cfg)
        self.store.start()
        self.group_of = [GROUPS[i % len(GROUPS)] for i in range(MESSAGES)]
        for i, group in enumerate(self.group_of):
            assert self.store.put(Message("t", b"%d" % i,
                                          properties={PROPERTY_SHARDING_KEY: group}), 0).ok
        self.store.reput.catch_up()
        self.pop = self.store.pop
        self.fifo = fifo
        self.now = 1_000_000
        self.acked: set[int] = set()
        self.count = [0] * MESSAGES
        self.newest: dict[int, tuple[int, int]] = {}  # offset -> (handle, deadline)
        self.handles: list[tuple[int, int]] = []  # every (offset, handle) handed out

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.shutdown()
            self.dir.cleanup()

    def _out(self, off: int) -> bool:
        return off not in self.acked and off in self.newest

    @rule(n=st.integers(1, 5))
    def receive(self, n: int) -> None:
        got = self.pop.pop(KEY, lambda: 0, n, INVISIBLE, self.now, fifo=self.fifo)
        assert len(got.offsets) <= n
        for off, attempts in zip(got.offsets, got.attempts, strict=True):
            assert off not in self.acked, f"acked {off} handed out again"
            if off in self.newest:
                assert self.newest[off][1] <= self.now, f"{off} handed out while in flight"
            self.count[off] += 1
            assert attempts == self.count[off], (off, attempts, self.count[off])
            self.newest[off] = (got.handle, got.deadline_ms)
            self.handles.append((off, got.handle))
        if self.fifo:
            groups = [self.group_of[off] for off in got.offsets]
            assert len(groups) == len(set(groups)), "two messages of one group at once"
            for off in got.offsets:  # everything before it in its group is resolved
                earlier = [o for o in range(off) if self.group_of[o] == self.group_of[off]]
                assert all(o in self.acked for o in earlier), (off, earlier, self.acked)
        if not got.offsets:  # nothing to hand out: then nothing is due or new
            due = [o for o in range(MESSAGES) if o not in self.acked and (
                o not in self.newest or self.newest[o][1] <= self.now)]
            if not self.fifo:
                assert due == [], due

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def ack(self, data: Any) -> None:
        off, handle = data.draw(st.sampled_from(self.handles))
        done = self.pop.ack(KEY, off, handle, self.now)
        if off in self.acked:
            assert done.error == "" and done.pending is None
        elif self.newest[off][0] == handle:
            assert done.error == "", done.error
            self.acked.add(off)
        else:
            assert "newest" in done.error

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), extra=st.integers(1, 3))
    def change(self, data: Any, extra: int) -> None:
        off, handle = data.draw(st.sampled_from(self.handles))
        done = self.pop.change(KEY, off, handle, extra * INVISIBLE, self.now)
        if off not in self.acked and self.newest[off][0] == handle:
            assert done.error == "", done.error
            self.newest[off] = (done.handle, self.now + extra * INVISIBLE)
            self.handles.append((off, done.handle))
        else:
            assert done.error

    @rule(ms=st.sampled_from([1, 500, 1_000, 2_500]))
    def tick(self, ms: int) -> None:
        self.now += ms

    @rule()
    def failover(self) -> None:
        """A replica that applied every revive record takes over."""
        self.store.reput.catch_up()
        replica = PopStore(self.store)
        replica.ready = True
        replica._start_of_topic()
        replica._catch_up(replica.applied_end)
        mine, theirs = self.pop.state(KEY), replica.state(KEY)
        if mine is not None:
            assert theirs is not None and (mine.next, mine.out) == (theirs.next, theirs.out)
        self.pop = replica

    @invariant()
    def counts_match(self) -> None:
        if not hasattr(self, "pop"):
            return
        state = self.pop.state(KEY)
        if state is None:
            return
        for off, o in state.out.items():
            assert off not in self.acked
            assert o.attempts == self.count[off]
            assert (o.handle, o.deadline_ms) == self.newest[off]

    @rule()
    def drain(self) -> None:
        """Everything not acked is handed out again once due, until acked."""
        for _ in range(MESSAGES * 3):
            self.now += 10 * INVISIBLE
            got = self.pop.pop(KEY, lambda: 0, 32, INVISIBLE, self.now, fifo=self.fifo)
            for off, attempts in zip(got.offsets, got.attempts, strict=True):
                self.count[off] += 1
                assert attempts == self.count[off]
                assert self.pop.ack(KEY, off, got.handle, self.now).error == ""
                self.acked.add(off)
                self.newest[off] = (got.handle, got.deadline_ms)
            if len(self.acked) == MESSAGES:
                break
        assert self.acked == set(range(MESSAGES))


PopModel.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_pop_against_the_model = PopModel.TestCase
