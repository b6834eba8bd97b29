"""POP in one store (common/store/pop/): what a POP hands out, again once its invisible time
passed with its count raised; an ACK by the newest handle only; a change of invisible time;
FIFO order per message group; and the state rebuilt the same from the revive records after a
restart (from the checkpoint, and without it)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.stores import make_store

from common.core.message import PROPERTY_SHARDING_KEY, Message
from common.core.subscription import subscription
from common.format.record import parse
from common.store.message_store import MessageStore
from common.store.pop.service import PopStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

KEY = ("g", "t", 0)
T0 = 1_000_000


def open_store(root: Path, **over: object) -> MessageStore:
    return make_store(root, enablePropertyFilter=True, **over)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = open_store(tmp_path / "s")
    yield s
    s.shutdown()


def put(store: MessageStore, n: int, group: str | None = None, start: int = 0,
        **props: str) -> None:
    for i in range(start, start + n):
        properties = dict(props)
        if group is not None:
            properties[PROPERTY_SHARDING_KEY] = group
        assert store.put(Message("t", b"m%d" % i, properties=properties), 0).ok
    store.reput.catch_up()


def bodies(raws: list[bytes]) -> list[bytes]:
    return [bytes(parse(r).body) for r in raws]


def pop(ps: PopStore, now: int, n: int = 32, invisible: int = 10_000, **kw: object):  # type: ignore[no-untyped-def]
    return ps.pop(KEY, lambda: 0, n, invisible, now, **kw)  # type: ignore[arg-type]


def test_a_message_comes_back_after_its_invisible_time_until_acked(store: MessageStore) -> None:
    put(store, 3)
    ps = store.pop
    first = pop(ps, T0)
    assert bodies(first.records) == [b"m0", b"m1", b"m2"] and first.attempts == [1, 1, 1]
    assert pop(ps, T0 + 9_999).records == []  # all in flight
    assert ps.ack(KEY, 1, first.handle, T0 + 10).error == ""
    again = pop(ps, T0 + 10_000)
    assert again.offsets == [0, 2] and again.attempts == [2, 2]
    # the first handle is not the newest any more: refused, nothing written
    stale = ps.ack(KEY, 0, first.handle, T0 + 10_001)
    assert "newest" in stale.error and stale.pending is None
    assert ps.ack(KEY, 0, again.handle, T0 + 10_002).error == ""
    assert ps.ack(KEY, 0, again.handle, T0 + 10_003) == ("", None, 0)  # acked already
    assert "never handed out" in ps.ack(KEY, 7, again.handle, T0).error
    state = ps.state(KEY)
    assert state is not None and sorted(state.out) == [2] and state.floor == 2


def test_changing_the_invisible_time_moves_the_deadline_and_the_handle(
        store: MessageStore) -> None:
    put(store, 1)
    ps = store.pop
    first = pop(ps, T0)
    changed = ps.change(KEY, 0, first.handle, 60_000, T0 + 5_000)
    assert changed.error == "" and changed.handle > first.handle
    assert pop(ps, T0 + 20_000).records == []  # would have been due without the change
    assert ps.change(KEY, 0, first.handle, 1_000, T0).error  # the old handle is spent
    assert pop(ps, T0 + 65_000).attempts == [2]


def test_fifo_hands_a_groups_next_message_only_after_the_previous_is_resolved(
        store: MessageStore) -> None:
    put(store, 2, group="A")  # offsets 0, 1
    put(store, 2, group="B", start=2)  # offsets 2, 3
    ps = store.pop
    first = pop(ps, T0, fifo=True)
    assert first.offsets == [0]  # A's first; A's second waits, and the queue behind it
    assert pop(ps, T0 + 1, fifo=True).offsets == []
    ps.ack(KEY, 0, first.handle, T0 + 2)
    second = pop(ps, T0 + 3, fifo=True)
    assert second.offsets == [1, 2]  # A's second, B's first; B's second waits for it
    assert pop(ps, T0 + 4, fifo=True).offsets == []
    # not acked: both come back, again before anything after them
    third = pop(ps, T0 + 3 + 10_000, fifo=True)
    assert third.offsets == [1, 2] and third.attempts == [2, 2]
    ps.ack(KEY, 2, third.handle, T0 + 10_010)
    assert pop(ps, T0 + 10_011, fifo=True).offsets == [3]


def test_without_fifo_every_message_goes_out_at_once(store: MessageStore) -> None:
    put(store, 2, group="A")
    assert pop(store.pop, T0).offsets == [0, 1]


def test_a_filtered_pop_hands_out_only_what_matches(store: MessageStore) -> None:
    put(store, 3, kind="no")
    put(store, 2, start=3, kind="yes")
    got = pop(store.pop, T0, sub=subscription("SQL92", "kind = 'yes'"))
    assert got.offsets == [3, 4]


def test_the_state_is_rebuilt_from_the_records_after_a_restart(tmp_path: Path) -> None:
    root = tmp_path / "s"
    store = open_store(root)
    put(store, 4)
    ps = store.pop
    first = pop(ps, T0, n=3)
    ps.ack(KEY, 1, first.handle, T0 + 1)
    moved = ps.change(KEY, 2, first.handle, 60_000, T0 + 2)
    want = ps.state(KEY)
    assert want is not None
    want_out = {off: (o.deadline_ms, o.attempts, o.handle) for off, o in want.out.items()}
    store.shutdown()
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    (copy / "config" / "popcheck").unlink()  # rebuilt from the revive topic's first record
    for where in (root, copy):
        store = open_store(where)
        try:
            got = store.pop.state(KEY)
            assert got is not None and got.next == want.next == 3, where
            assert {off: (o.deadline_ms, o.attempts, o.handle)
                    for off, o in got.out.items()} == want_out, where
            assert got.out[2].handle == moved.handle
            again = pop(store.pop, T0 + 10_000)  # 0 is due, 2 is not, 3 is new
            assert again.offsets == [0, 3] and again.attempts == [2, 1]
        finally:
            store.shutdown()


def test_a_checkpoint_ahead_of_the_log_is_not_trusted(tmp_path: Path) -> None:
    """The checkpoint is written every second from the state, which a master changes as it
    appends, before the bytes are flushed: a power loss can leave a checkpoint covering records
    the recovered log no longer holds. The state is then rebuilt from the log, not taken from
    the checkpoint (which would hand out nothing the lost records named, ever again)."""
    root, flushed = tmp_path / "s", tmp_path / "flushed"
    store = open_store(root)
    put(store, 4)
    assert pop(store.pop, T0, n=2).offsets == [0, 1]
    store.shutdown()
    shutil.copytree(root, flushed)  # the log as a power loss would leave it
    store = open_store(root)
    later = pop(store.pop, T0 + 1, n=2)
    assert later.offsets == [2, 3]
    store.pop.ack(KEY, 2, later.handle, T0 + 2)
    store.shutdown()  # writes the checkpoint of all that
    shutil.copy(root / "config" / "popcheck", flushed / "config" / "popcheck")
    store = open_store(flushed)
    try:
        state = store.pop.state(KEY)
        assert state is not None and state.next == 2 and sorted(state.out) == [0, 1]
        assert pop(store.pop, T0 + 3).offsets == [2, 3]  # never handed out, as the log says
    finally:
        store.shutdown()


def test_a_replica_applying_the_records_holds_the_same_state(tmp_path: Path) -> None:
    """What a slave does: its dispatcher applies the revive records its log receives. Here a
    second store is given the master's revive records through the same dispatch."""
    master = open_store(tmp_path / "m")
    try:
        put(master, 3)
        first = pop(master.pop, T0)
        master.pop.ack(KEY, 0, first.handle, T0 + 1)
        master.reput.catch_up()
        replica = PopStore(master)
        replica.ready = True
        cq = master.cq_store.get(replica.topic, 0)
        assert cq is not None
        for q_off, phy, size, _ in cq.entries(0, 100):
            replica._apply_at(phy, size, q_off)
        mine, theirs = master.pop.state(KEY), replica.state(KEY)
        assert mine is not None and theirs is not None
        assert (mine.next, mine.out) == (theirs.next, theirs.out)
    finally:
        master.shutdown()


@pytest.mark.parametrize("fifo", [True, False])
def test_an_offset_out_that_retention_deleted_holds_no_slot_and_no_group(
        tmp_path: Path, fifo: bool) -> None:
    """Handed out, then its segment deleted before an ack: the next POP once it is due
    resolves it (an ack record a replica applies too) and hands out what the queue still
    holds, from its min offset; it never takes a slot, nor (FIFO) holds its group, again."""
    store = open_store(tmp_path / "s", fileReservedTime=0, deleteFileBatchMax=100)
    try:
        for i in range(120):
            assert store.put(Message("t", b"m%03d" % i + b"x" * 200,
                                     properties={PROPERTY_SHARDING_KEY: "A"}), 0).ok
        store.reput.catch_up()
        ps = store.pop
        first = pop(ps, T0, n=2, fifo=fifo)
        assert first.offsets == ([0] if fifo else [0, 1])
        store.reput.catch_up()
        replica = PopStore(store)  # what a slave applies, record by record
        replica.ready = True
        cq = store.cq_store.get(replica.topic, 0)
        assert cq is not None

        def follow() -> None:
            store.reput.catch_up()
            for q_off, phy, size, _ in cq.entries(replica.applied_cq, 100):
                replica._apply_at(phy, size, q_off)

        follow()
        assert store.clean_now() > 0
        low = store.min_queue_offset("t", 0)
        assert low > 2
        got = pop(ps, T0 + 20_000, n=2, fifo=fifo)  # what was out is due now, and gone
        assert got.offsets == ([low] if fifo else [low, low + 1])
        assert bodies(got.records)[0].startswith(b"m%03d" % low)
        assert ps.stats["expired"] == len(first.offsets)
        state = ps.state(KEY)
        assert state is not None and min(state.out) == low
        follow()  # the resolving record too: the same state
        theirs = replica.state(KEY)
        assert theirs is not None and theirs.out == state.out
    finally:
        store.shutdown()
